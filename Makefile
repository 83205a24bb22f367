# dstk: two commands do everything on a fresh machine — `make demo` and `make test`.
# Both create .venv when it is missing. Override TORCH_SPEC for a CUDA build, e.g.
#   make test TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128'
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dstk-installed
# JIT-built DeepSpeed ops (shm_comm, cpu_adam) are cached inside the venv so CI and users share nothing by hand.
export TORCH_EXTENSIONS_DIR ?= $(abspath $(VENV))/torch_extensions
export OMP_NUM_THREADS ?= 1
export WANDB_MODE ?= offline
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: install demo test test-fast lint format bench docs clean gpu-wheels gpu-check

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, always: resolving deepspeed with no torch present pulls a multi-GB CUDA build.
$(STAMP): setup.cfg pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m toolkit.run.jit  # DeepSpeed's CPU communication op, built now (~50 s) instead of at the first job
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m toolkit.demo

# Two pytest workers: two 2-rank launches side by side fill 2 cores better than one, more do worse (measured
# in tests/conftest.py). Each test module stays on one worker, in the order tests/conftest.py gives.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: $(STAMP)
	$(PY) -m pytest -q -ra --durations=25 $(XDIST) tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -ra $(XDIST) -m "not multiprocess and not slow" tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# docs/cli.md: every verb's help as the parsers render it (tests/test_readme.py checks it is current)
docs: $(STAMP)
	$(PY) -m toolkit.cli --reference > docs/cli.md

bench: $(STAMP)
	$(PY) benchmarks/plan_speed.py
	$(PY) benchmarks/published_runs.py

# The one prepared GPU check (#32): `make gpu-wheels` here, then `bash benchmarks/gpu_check.sh` on the GPU node
# (the device tool carries .whl); `make gpu-check` runs it where deepspeed is importable (a CUDA venv).
gpu-wheels: $(STAMP)
	bash benchmarks/gpu_wheels.sh

gpu-check:
	bash benchmarks/gpu_check.sh

clean:
	rm -rf $(VENV) build dist *.egg-info
