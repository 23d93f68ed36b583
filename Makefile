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
