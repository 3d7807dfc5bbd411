"""Adapters for inference engines: build swa_hal inputs from an engine's own step metadata; what the engine
plugins did in this process (``stepped_aside``: calls handed to the engine's own code, docs/engines.md #drift;
``shadow_reports``: what shadow mode compared, docs/engines.md #shadow-mode)."""

from typing import Any

from .aside import EngineDriftError, stepped_aside
from .engine import CudaGraphSupport, EngineSWABuilder, batch_from_common_metadata, step_image_spans


def shadow_reports() -> dict[str, Any]:
    """Each engine plugin's shadow in this process (``Shadow.report``: mode, calls, comparisons, the first
    difference), by engine; an engine whose plugin is not shadowing is left out. Imports no engine."""
    from . import sglang, vllm_shadow

    reports = {"vLLM": vllm_shadow.report(), "SGLang": sglang.shadow_report()}
    return {engine: report for engine, report in reports.items() if report is not None}


__all__ = [
    "CudaGraphSupport",
    "EngineDriftError",
    "EngineSWABuilder",
    "batch_from_common_metadata",
    "shadow_reports",
    "step_image_spans",
    "stepped_aside",
]
