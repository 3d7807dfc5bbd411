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

# swa_hal inside vLLM 0.33.0 (tests/engines/test_vllm.py), in its own environment: the CPU torch above,
# vLLM's wheel without its dependencies (they pin a CUDA torch 2.14), and the pure-Python part of the
# import chain of vLLM's DeepSeek-V4 SWA builders, pinned to versions that import together. vLLM runs
# on its CPU platform with its Triton kernels (and swa_hal's) in the interpreter.
VLLM ?= vllm==0.33.0
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_PIP := $(VLLM_BIN)/python -m pip
VLLM_STAMP := $(VLLM_VENV)/.swa-hal-vllm-installed
VLLM_DEPS := transformers==5.20.2 einops==0.8.2 cbor2==6.3.0 msgspec==0.23.0 cloudpickle==3.1.3 \
	pyzmq==27.3.0 psutil==7.2.2 requests==2.34.2 aiohttp==3.14.5 openai==3.57.0 openai-harmony==0.0.8 \
	pillow==13.0.0 pybase64==1.5.1 cachetools==8.0.2 uvloop==0.23.0 py-cpuinfo==9.0.0 \
	prometheus_client==0.26.0 fastapi==0.165.0 partial-json-parser==0.2.1.1.post7 xgrammar==0.2.8 \
	llguidance==1.7.6

.PHONY: test-vllm

$(VLLM_BIN)/python:
	$(PYTHON) -m venv $(VLLM_VENV)

$(VLLM_STAMP): $(VLLM_BIN)/python pyproject.toml
	$(VLLM_PIP) install -q "$(TORCH)" triton==3.6.0 "numpy<2.4"
	$(VLLM_PIP) install -q --no-deps "$(VLLM)"
	$(VLLM_PIP) install -q $(VLLM_DEPS)
	$(VLLM_PIP) install -q -e ".[test]"
	touch $@

test-vllm: $(VLLM_STAMP)
	TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= VLLM_TARGET_DEVICE=cpu $(VLLM_BIN)/python -m pytest tests/engines/test_vllm.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
