.PHONY: setup test lint fmt bench
setup:
	python3 -m pip install torch==2.13.0
	python3 -m pip install -c constraints.txt -e '.[dev]'
test:
	python3 -m pytest
lint:
	ruff check .
fmt:
	ruff format tokenrouter tests bench
# CPU-runnable forms of the benchmarks behind docs/results.md, on the tiny models (route kernel under Triton's
# interpreter; the figures they print mean nothing on a CPU, the run checks that each command still works):
# R1 --smoke, C1 --quick, P1 --quick, one short matrix row (S1-S7's script). About 10 minutes on 2 cores.
# The GPU commands that produced each figure are in docs/results.md. Results under out/bench-smoke/.
BENCH_OUT := out/bench-smoke
BENCH_PY := PYTHONPATH=$(CURDIR) python3
bench:
	mkdir -p $(BENCH_OUT)
	$(BENCH_PY) bench/route_kernel_bench.py --smoke --no-v1 --json $(BENCH_OUT)/route.json --md $(BENCH_OUT)/route.md
	$(BENCH_PY) bench/concurrency.py --quick --work $(BENCH_OUT)/concurrency --json $(BENCH_OUT)/concurrency.json
	$(BENCH_PY) bench/prefix_bench.py --quick --out $(BENCH_OUT)/prefix
	$(BENCH_PY) bench/matrix.py --pair tiny --policy bern0.35 --run tokenrouter:4 --run llm-only:4 --run eager:4 \
		--rounds 1 --output-len 64 --out $(BENCH_OUT)/matrix
