# Every target creates .venv and installs what it needs, so each works on a fresh clone.
# TORCH pins the build: on this project's machines `torch==2.13.0` is the CPU wheel on local disk;
# a plain `torch` from the registry would pull a multi-GB CUDA build. Override on other machines.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
STAMP := $(VENV)/.swa-hal-installed
EXAMPLE := examples/swa-hal-example-backend

.PHONY: run test lint bench install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml $(EXAMPLE)/pyproject.toml
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[test,bench,lint]"
	$(PIP) install -q ./$(EXAMPLE)
	touch $@

install: $(STAMP)

run: $(STAMP)
	$(BIN)/swa-hal info
	$(BIN)/swa-hal build --config configs/deepseek_v4_flash.yaml --batch configs/batches/mixed.yaml

test: $(STAMP)
	$(BIN)/python -m pytest

# Lint, formatting and types over the package, the built-in backends and the example plugin.
lint: $(STAMP)
	$(BIN)/ruff check swa_hal backends examples
	$(BIN)/ruff format --check swa_hal backends examples
	$(BIN)/mypy swa_hal backends examples

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_build.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
