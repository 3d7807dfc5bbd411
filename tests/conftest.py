"""Shared fixtures. Triton kernels run on the CPU through the interpreter unless the caller set
TRITON_INTERPRET explicitly (the GPU suite runs with TRITON_INTERPRET=0)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import CONFIGS  # noqa: E402
from swa_hal import SWAConfig  # noqa: E402
from swa_hal.envs import env_flag  # noqa: E402
from swa_hal.plugins import reset_registry  # noqa: E402

# Under pytest-xdist (make test runs one worker per core) each worker keeps to one torch thread: workers'
# OpenMP threads would otherwise share the cores and wait for one another.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

# In the interpreter, patch triton.language once per launch rather than once per helper call (about a
# fifth of the interpreter's time; tests/interpreter_patch.py says why this changes no result).
if env_flag("TRITON_INTERPRET"):
    import interpreter_patch  # noqa: E402

    interpreter_patch.install()


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch):
    for var in ("SWA_HAL_BACKEND", "SWA_HAL_PLUGINS", "SWA_HAL_DISABLE_PLUGINS", "SWA_HAL_STRICT", "SWA_HAL_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    reset_registry()
    yield
    reset_registry()


@pytest.fixture
def tiny_config() -> SWAConfig:
    return SWAConfig.from_yaml(CONFIGS / "tiny.yaml")
