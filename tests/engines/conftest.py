"""Engine tests run against the real engine in its own environment (``make test-vllm``).

vLLM is set up for the CPU before anything imports it: its CPU platform (``VLLM_TARGET_DEVICE=cpu``),
no CUDA device (without ``CUDA_VISIBLE_DEVICES=""`` vLLM swaps Triton for a placeholder), and Triton
kernels in the interpreter. Without vLLM the folder is skipped (the main suite also ignores it).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, str(Path(__file__).parent))

collect_ignore = [] if importlib.util.find_spec("vllm") is not None else ["test_vllm.py", "vllm_harness.py"]


def pytest_terminal_summary(terminalreporter):
    harness = sys.modules.get("vllm_harness")
    counts = getattr(harness, "COUNTS", None)
    if counts:
        terminalreporter.write_line(
            "swa_hal vs vLLM parity: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        )
