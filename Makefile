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
# CPU-runnable check of the benchmarks behind docs/results.md (tiny models, Triton's interpreter; the
# times it prints mean nothing). The GPU commands that produced each figure are in docs/results.md.
bench:
	python3 bench/route_kernel_bench.py --smoke --no-v1
	python3 bench/matrix.py --pair tiny --policy bern0.35 --run tokenrouter:4 --run llm-only:4 --run eager:4 \
		--rounds 1 --output-len 64 --out out/bench-smoke
