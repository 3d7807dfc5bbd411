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

.PHONY: run test test-slow test-sweep lint bench install clean matrix dist check-dist plugin-template

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml $(EXAMPLE)/pyproject.toml
	@echo "installing $(TORCH), swa_hal (editable) and its test and lint tools into $(VENV) (about a minute, once)"
	@echo "[1/3] $(TORCH)"
	$(PIP) install "$(TORCH)"
	@echo "[2/3] swa_hal (editable) with its test, benchmark and lint tools"
	$(PIP) install -e ".[test,bench,lint]"
	@echo "[3/3] the example backend plugin ($(EXAMPLE))"
	$(PIP) install ./$(EXAMPLE)
	touch $@

install: $(STAMP)

run: $(STAMP)
	$(BIN)/swa-hal info
	$(BIN)/swa-hal build --config configs/deepseek_v4_flash.yaml --batch configs/batches/mixed.yaml

# One pytest-xdist worker per core (TEST_WORKERS=0: in this process), work-stealing so the long property
# tests do not end up queued behind each other; each worker runs torch on one thread (tests/conftest.py).
# `make test` is what a change can break, each check once: it leaves out the tests marked `slow` (the release
# wheel installed into a fresh environment with torch, then the kit there: 3-4 minutes of one core; the
# benchmarks that run on a CPU, two minutes; the plugin `swa-hal new-backend` writes, pip-installed, running its
# own tests), which `make test-slow` runs, and those marked `sweep` (the rest of the grids whose covering cases
# make test runs: the conformance kit's configs x batch kinds on the Triton backends, other tests' configs x
# backends; and the costly checks of every backend on xpu and rocm, which on a CPU run the cuda backend's
# kernels again: tests/helpers.py), which `make test-sweep` runs. CI runs all three.
TEST_WORKERS ?= auto
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not gpu and not slow and not sweep"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m "slow and not gpu"

test-sweep: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m "sweep and not gpu"

# The per-platform CI recipe for every row of `swa-hal matrix`, on this CPU (.ci/matrix says what it runs):
# `swa-hal info --assume ROW --expect NAME` per row, and the kit's selection and worked-vector topics per
# backend. `make matrix MATRIX_KIT=` runs the whole kit for each backend (make test already runs it).
MATRIX_KIT ?= spec_ or availability or selected or probing or factory
matrix: $(STAMP)
	MATRIX_KIT="$(MATRIX_KIT)" bash .ci/matrix $(BIN)

# Lint, formatting and types over the package, the built-in backends and the example plugin; then the
# calls that the GPU suite and the benchmarks make into swa_hal. Those run on no CI machine, so a call
# that a changed signature broke would wait for the next GPU run: mypy checks their calls' arguments
# (arg-type, call-arg) and nothing else of their typing.
GPU_ONLY_MYPY = --check-untyped-defs --ignore-missing-imports --follow-imports=silent --no-warn-unused-ignores \
	$(foreach code,union-attr misc var-annotated attr-defined call-overload assignment operator index return-value,--disable-error-code $(code))
lint: $(STAMP)
	$(BIN)/ruff check swa_hal backends examples
	$(BIN)/ruff format --check swa_hal backends examples
	$(BIN)/mypy swa_hal backends examples
	MYPYPATH=tests $(BIN)/mypy $(GPU_ONLY_MYPY) tests/gpu benchmarks

# The benchmark writes its table, JSON and chart to $(RESULTS), untracked by default; `make bench
# RESULTS=benchmarks/results` replaces the recorded figures (benchmarks/results/README.md lists them).
RESULTS ?= benchmarks/out
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_build.py --out $(RESULTS)

# `swa-hal new-backend` writes a plugin from swa_hal/plugin_template/, a copy of the example plugin's tracked
# files (each with .tmpl appended) packaged inside swa_hal so the command works from a wheel. After changing the
# example, refresh the copy with this (tests/test_plugin_template.py fails while they differ).
plugin-template:
	rm -rf swa_hal/plugin_template
	git -C $(EXAMPLE) ls-files | while read -r f; do \
		mkdir -p "swa_hal/plugin_template/$$(dirname "$$f")" && cp "$(EXAMPLE)/$$f" "swa_hal/plugin_template/$$f.tmpl"; done

# The release build: `make dist` builds the sdist and, from it, the wheel into dist/ (python -m build, in an
# isolated environment with the build requirements of pyproject.toml); `make check-dist` checks them with
# .ci/check_dist.py, the check of the release workflow (.github/workflows/release.yml) and tests/test_dist.py:
# their contents against pyproject.toml, then the wheel installed into a fresh environment with $(TORCH), where
# `swa-hal info` and the conformance kit (torch backend) run. CI runs `make check-dist`, and the release workflow
# the same with RELEASE_TAG=vX.Y.Z, the tag it runs for (the version built must be the tag's).
RELEASE_TAG ?=
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist

check-dist: dist
	$(BIN)/python .ci/check_dist.py --install --torch "$(TORCH)"$(if $(RELEASE_TAG), --tag "$(RELEASE_TAG)") dist

# swa_hal inside vLLM (tests/engines/test_vllm.py), one environment per vLLM release so switching never rebuilds
# the other: `make test-vllm` runs against vLLM 0.34.0 in .venv-vllm-0.34.0, `make test-vllm VLLM=vllm==0.33.0`
# against 0.33.0 in .venv-vllm-0.33.0. Each holds vLLM's wheel without its dependencies (they pin a CUDA torch
# 2.14) and the pure-Python part of the import chain of vLLM's DeepSeek-V4 SWA builders, pinned to versions that
# import together. vLLM runs on its CPU platform with its Triton kernels (and swa_hal's) in the interpreter.
# The torch and Triton under each: 0.34 gets the engines' own pair (torch 2.14, which pins triton 3.8; 2.14.1 is
# the build on this project's machines, a CUDA build that runs on the CPU), 0.33 the CPU torch and triton 3.6
# of `make test`, so the engine parity suite runs on both Triton releases. Besides the engine tests, each
# environment runs the backend parity tests (VLLM_CORE_TESTS) on its Triton. pip's warnings about vLLM's other
# (uninstalled, CUDA) dependencies are silenced: leaving them out is the point. Each step of the set-up says what
# it installs, and pip shows what it downloads (minutes, once).
VLLM ?= vllm==0.34.0
VLLM_VERSION := $(lastword $(subst ==, ,$(VLLM)))
VLLM_VENV := .venv-vllm-$(VLLM_VERSION)
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_PIP := $(VLLM_BIN)/python -m pip
VLLM_STAMP := $(VLLM_VENV)/.swa-hal-vllm-installed
VLLM_TORCH ?= $(if $(filter 0.33.%,$(VLLM_VERSION)),"$(TORCH)" triton==3.6.0,torch==2.14.1 triton==3.8.0)
VLLM_CORE_TESTS ?= tests/test_parity.py tests/test_address_strict.py tests/test_groups.py tests/test_slot_rows.py \
	tests/test_slot_ring.py tests/test_request_window.py tests/test_guard.py tests/test_int32_edges.py tests/test_triton_versions.py \
	tests/test_padded_requests.py
VLLM_DEPS := transformers==5.20.2 einops==0.8.2 cbor2==6.3.0 msgspec==0.23.0 cloudpickle==3.1.3 \
	pyzmq==27.3.0 psutil==7.2.2 requests==2.34.2 aiohttp==3.14.5 openai==3.57.0 openai-harmony==0.0.8 \
	pillow==13.0.0 pybase64==1.5.1 cachetools==8.0.2 uvloop==0.23.0 py-cpuinfo==9.0.0 \
	prometheus_client==0.26.0 fastapi==0.165.0 partial-json-parser==0.2.1.1.post7 xgrammar==0.2.8 \
	llguidance==1.7.6

.PHONY: test-vllm

$(VLLM_BIN)/python:
	$(PYTHON) -m venv $(VLLM_VENV)

$(VLLM_STAMP): $(VLLM_BIN)/python pyproject.toml
	@echo "make test-vllm: installing $(VLLM) with $(VLLM_TORCH) into $(VLLM_VENV) (a few minutes, once)"
	@echo "make test-vllm: [1/5] $(VLLM_TORCH) and numpy (the largest download)"
	$(VLLM_PIP) install $(VLLM_TORCH) "numpy<2.4"
	@echo "make test-vllm: [2/5] $(VLLM), without its dependencies"
	$(VLLM_PIP) install --no-deps "$(VLLM)"
	@echo "make test-vllm: [3/5] the pure-Python part of vLLM's import chain, pinned"
	$(VLLM_PIP) install --no-warn-conflicts $(VLLM_DEPS)
	@echo "make test-vllm: [4/5] swa_hal (editable)"
	$(VLLM_PIP) install --no-warn-conflicts --no-deps -e .
	@echo "make test-vllm: [5/5] swa_hal's dependencies and test tools"
	$(VLLM_PIP) install --no-warn-conflicts pluggy pyyaml packaging "pytest>=8" "pytest-xdist>=3.5" "hypothesis>=6.100" tqdm
	touch $@
	@echo "make test-vllm: $(VLLM_VENV) is ready"

# The engine tests in one process (their coverage counts are per process), the backend tests on every core. Then
# vLLM's own unit tests of the SWA metadata builder swa_hal replaces (tests/engines/vllm_upstream, copied from vLLM's
# repository), twice: against vLLM's own builders (swa_hal's switch off) and with swa_hal's plugin registered by
# vLLM's plugin loader.
VLLM_UPSTREAM := tests/engines/vllm_upstream

test-vllm: $(VLLM_STAMP)
	TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= VLLM_TARGET_DEVICE=cpu $(VLLM_BIN)/python -m pytest \
		-p no:cacheprovider tests/engines/test_vllm*.py
	TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= $(VLLM_BIN)/python -m pytest -p no:cacheprovider \
		-n $(TEST_WORKERS) --dist worksteal $(VLLM_CORE_TESTS)
	TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= VLLM_TARGET_DEVICE=cpu SWA_HAL_VLLM=0 $(VLLM_BIN)/python -m pytest \
		-p no:cacheprovider $(VLLM_UPSTREAM)
	TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= VLLM_TARGET_DEVICE=cpu $(VLLM_BIN)/python -m pytest \
		-p no:cacheprovider $(VLLM_UPSTREAM)

# `make test`'s suite and `make test-sweep`'s (VLLM_CORE_TESTS among them; `make test-slow`'s release wheel and
# benchmarks run once, on the main environment) on the pair the engines' next releases move to: torch 2.15.0
# with triton 3.9.0 (and numpy 2.4, which 3.9's interpreter runs), in .venv-torch-2.15.0.
# torch 2.15.0 on the registry is a CUDA build that runs on the CPU, but it does not import without its CUDA
# libraries (libtorch_python links libtorch_cuda, which links cuDNN, cuBLAS, NCCL, ...): they come with it,
# about 2.9 GB of wheels (a minute or two to fetch). pip keeps no cache of them (PIP_NO_CACHE_DIR): the
# environment is made once, and a small disk has no room for 3 GB more. No vLLM there: vLLM 0.34
# pins torch 2.14, and VLLM_CORE_TESTS import none of it. The test tools come by name (the `test` extra pins
# `make test`'s triton 3.6). A machine's pip configuration may cap torch below 2.15 (this project's machines
# cap it at the builds on their disk): the pins here are exact, so these installs read no pip configuration.
# Measured on a 2-core machine shared with other work: the install 4 min 15 s (~3 GB to fetch on a fresh
# machine; 5.4 GB on disk), the suite 3298 tests in 19 min of wall time, 8 min of CPU.
NEXT_TORCH ?= 2.15.0
NEXT_TRITON ?= 3.9.0
NEXT_VENV := .venv-torch-$(NEXT_TORCH)
NEXT_BIN := $(NEXT_VENV)/bin
NEXT_PIP := PIP_CONFIG_FILE=/dev/null PIP_CONSTRAINT= PIP_NO_CACHE_DIR=1 $(NEXT_BIN)/python -m pip
NEXT_STAMP := $(NEXT_VENV)/.swa-hal-installed

.PHONY: test-torch-next

$(NEXT_BIN)/python:
	$(PYTHON) -m venv $(NEXT_VENV)

$(NEXT_STAMP): $(NEXT_BIN)/python pyproject.toml $(EXAMPLE)/pyproject.toml
	@echo "make test-torch-next: installing torch $(NEXT_TORCH) (a CUDA build, with its CUDA libraries) and triton $(NEXT_TRITON) into $(NEXT_VENV) (a few minutes, once)"
	@echo "make test-torch-next: [1/4] torch $(NEXT_TORCH), its CUDA libraries, triton $(NEXT_TRITON) and numpy (about 3 GB)"
	$(NEXT_PIP) install torch==$(NEXT_TORCH) triton==$(NEXT_TRITON) "numpy>=2.4,<2.5"
	@echo "make test-torch-next: [2/4] swa_hal (editable)"
	$(NEXT_PIP) install -q --no-deps -e .
	@echo "make test-torch-next: [3/4] swa_hal's dependencies and test tools"
	$(NEXT_PIP) install -q pluggy pyyaml packaging "pytest>=8" "pytest-xdist>=3.5" "hypothesis>=6.100" "tqdm>=4.60" "setuptools>=77" "build>=1.2"
	@echo "make test-torch-next: [4/4] the example plugin"
	$(NEXT_PIP) install -q --no-deps ./$(EXAMPLE)
	touch $@

test-torch-next: $(NEXT_STAMP)
	$(NEXT_BIN)/python -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
	$(NEXT_BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not gpu and not slow"

# swa_hal inside SGLang 0.5.23 (tests/engines/test_sglang.py), in its own environment: the CPU torch above,
# SGLang's wheel without its dependencies (they pin a CUDA torch 2.14), and what the import chain of its
# plugin framework and DeepSeek-V4 metadata ops needs, pinned to versions that import together (msgspec is
# the ops' own; the rest comes in through sglang.srt.utils and the dsv4 package). The ops run their torch
# references on the CPU; swa_hal's Triton backends run in the interpreter. pip's warnings about SGLang's other
# (uninstalled, CUDA) dependencies are silenced, as for vLLM.
SGLANG ?= sglang==0.5.23
SGLANG_VENV := .venv-sglang
SGLANG_BIN := $(SGLANG_VENV)/bin
SGLANG_PIP := $(SGLANG_BIN)/python -m pip
SGLANG_STAMP := $(SGLANG_VENV)/.swa-hal-sglang-installed
# What the import chain of SGLang's DeepSeek-V4 attention backend classes (CUDA and ROCm) adds: its configs
# (transformers, sentencepiece, dill), quantization (compressed-tensors, gguf), einops, and the OpenAI
# protocol modules (openai, partial-json-parser). torchvision, which its vision configs import, has no wheel
# that imports beside the CPU torch 2.13.0: tests/engines/torchvision_stub.py stands in for the names bound.
SGLANG_BACKEND_DEPS := transformers==5.20.2 sentencepiece==0.2.3 dill==0.4.1 compressed-tensors==0.20.1 \
	gguf==0.19.0 einops==0.8.2 openai==3.60.0 partial-json-parser==0.2.1.1.post7
SGLANG_DEPS := msgspec==0.23.0 orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 requests==2.34.2 pillow==13.0.0 \
	starlette==1.10.0 pydantic==2.14.4 pyzmq==27.3.0 tqdm==4.70.1 ipython==9.18.1 aiohttp==3.14.5 \
	apache-tvm-ffi==0.1.11 $(SGLANG_BACKEND_DEPS)

.PHONY: test-sglang

$(SGLANG_BIN)/python:
	$(PYTHON) -m venv $(SGLANG_VENV)

$(SGLANG_STAMP): $(SGLANG_BIN)/python pyproject.toml
	@echo "make test-sglang: installing $(SGLANG) into $(SGLANG_VENV) (a few minutes, once)"
	@echo "make test-sglang: [1/4] $(TORCH), triton 3.6.0 and numpy (the largest download)"
	$(SGLANG_PIP) install "$(TORCH)" triton==3.6.0 "numpy<2.4"
	@echo "make test-sglang: [2/4] $(SGLANG), without its dependencies"
	$(SGLANG_PIP) install --no-deps "$(SGLANG)"
	@echo "make test-sglang: [3/4] the pure-Python part of SGLang's import chain, pinned"
	$(SGLANG_PIP) install --no-warn-conflicts $(SGLANG_DEPS) "$(TORCH)" triton==3.6.0 "numpy<2.4"
	@echo "make test-sglang: [4/4] swa_hal (editable) with its test tools"
	$(SGLANG_PIP) install --no-warn-conflicts -e ".[test]"
	touch $@
	@echo "make test-sglang: $(SGLANG_VENV) is ready"

# Then SGLang's own unit tests of the ops swa_hal replaces (tests/engines/sglang_upstream, copied from SGLang's
# repository), twice: against SGLang's own ops (swa_hal's switch off) and with swa_hal's hooks applied by SGLang's
# plugin loader. CUDA_VISIBLE_DEVICES stays unset there: SGLang's test utilities read its first character.
SGLANG_UPSTREAM := tests/engines/sglang_upstream

test-sglang: $(SGLANG_STAMP)
	TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= SGLANG_PLUGINS=swa_hal $(SGLANG_BIN)/python -m pytest tests/engines/test_sglang.py \
		tests/engines/test_sglang_drift.py tests/engines/test_sglang_backend.py tests/engines/test_sglang_traffic.py \
		tests/engines/test_sglang_cp.py
	TRITON_INTERPRET=1 SWA_HAL_SGLANG=0 SGLANG_PLUGINS=swa_hal $(SGLANG_BIN)/python -m pytest -p no:cacheprovider \
		$(SGLANG_UPSTREAM)
	TRITON_INTERPRET=1 SGLANG_PLUGINS=swa_hal $(SGLANG_BIN)/python -m pytest -p no:cacheprovider $(SGLANG_UPSTREAM)

# Also what installing the example plugin leaves in it (a stale build/lib would ship inside its next wheel).
clean:
	rm -rf $(VENV) .venv-vllm-* .venv-torch-* .venv-sglang .pytest_cache .hypothesis build dist *.egg-info \
		$(EXAMPLE)/build $(EXAMPLE)/dist $(EXAMPLE)/src/*.egg-info
