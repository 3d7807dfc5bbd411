"""GPU tests: collected everywhere, run only on a CUDA device with the interpreter off.

    TRITON_INTERPRET=0 python -m pytest -m gpu tests/gpu

Each test prints a one-line result; the H200 runs are recorded in benchmarks/results/.
"""

from __future__ import annotations

import os

import pytest
import torch

from swa_hal.envs import env_flag


def _why_not() -> str | None:
    if env_flag("TRITON_INTERPRET"):
        return "TRITON_INTERPRET is on; GPU tests run with TRITON_INTERPRET=0"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _why_not()
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.gpu)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def report(request):
    """Print a result line that survives -q (the H200 logs are read from it)."""
    lines = []

    def emit(text: str) -> None:
        lines.append(text)
        print(f"\nRESULT {request.node.name}: {text}", flush=True)

    return emit
