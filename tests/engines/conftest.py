"""Engine tests run against the real engines, each in its own environment (``make test-vllm``,
``make test-sglang``). A test module whose engine is not installed is not collected (the main suite
ignores the folder altogether).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

collect_ignore = [] if importlib.util.find_spec("vllm") is not None else ["test_vllm.py", "vllm_harness.py"]

if importlib.util.find_spec("sglang") is not None:
    # SGLang's DeepSeek-V4 backends import torchvision names at import time (torchvision_stub.py says why a
    # stand-in, and what it holds); before any test imports SGLang.
    import torchvision_stub

    torchvision_stub.install()


def pytest_terminal_summary(terminalreporter):
    harness = sys.modules.get("vllm_harness")
    counts = getattr(harness, "COUNTS", None)
    if counts:
        terminalreporter.write_line(
            "swa_hal vs vLLM parity: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        )
