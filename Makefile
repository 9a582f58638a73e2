# Quick start: `make demo` (set up + main job) and `make test` (set up + whole suite).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

# On the project's CPU machines pip takes torch from local disk only for exactly this pin.
TORCH_PIN  := torch==2.13.0
TRITON_PIN := triton==3.7.1

.PHONY: demo test venv venv-sim venv-test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# What the main job needs: the simulator alone (no torch).
$(VENV)/.sim-installed: pyproject.toml | $(PY)
	$(PIP) install -q -e .
	touch $@

# The test environment: simulator + dev tools + the CPU build of torch and triton.
$(VENV)/.test-installed: pyproject.toml $(VENV)/.sim-installed
	$(PIP) install -q $(TORCH_PIN) $(TRITON_PIN)
	$(PIP) install -q -e '.[dev]'
	touch $@

venv-sim: $(VENV)/.sim-installed
venv-test: $(VENV)/.test-installed

demo: $(VENV)/.sim-installed
	$(VENV)/bin/granisim demo

test: $(VENV)/.test-installed
	$(PY) -m pytest -q -n 2 --dist loadfile

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
