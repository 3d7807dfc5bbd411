"""Shared fixtures. Triton kernels run on the CPU through the interpreter unless the caller set
TRITON_INTERPRET explicitly (the GPU suite runs with TRITON_INTERPRET=0)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402

pytest_plugins = ["swa_hal.testing.plugin"]

from swa_hal import PlatformInfo, SWAConfig, SWAMetadataBuilder  # noqa: E402
from swa_hal.plugins import reset_registry  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
SCENARIOS = sorted((CONFIGS / "batches").glob("*.yaml"))

# Each built-in backend and a platform on which it is the one selected.
BACKEND_PLATFORMS = {
    "torch": "vendor=cpu",
    "cuda": "vendor=cuda,capability=9.0",
    "sm12x": "vendor=cuda,capability=12.0",
    "rocm": "vendor=rocm,arch=gfx942,capability=9.4",
    "xpu": "vendor=xpu",
}
TRITON_BACKENDS = ("cuda", "sm12x", "rocm", "xpu")


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch):
    for var in ("SWA_HAL_BACKEND", "SWA_HAL_PLUGINS", "SWA_HAL_DISABLE_PLUGINS", "SWA_HAL_STRICT", "SWA_HAL_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    reset_registry()
    yield
    reset_registry()


def make_builder(config: SWAConfig, backend: str, **kwargs) -> SWAMetadataBuilder:
    platform = PlatformInfo.from_assume(BACKEND_PLATFORMS[backend])
    return SWAMetadataBuilder(config, device="cpu", backend=backend, platform=platform, **kwargs)


@pytest.fixture
def tiny_config() -> SWAConfig:
    return SWAConfig.from_yaml(CONFIGS / "tiny.yaml")
