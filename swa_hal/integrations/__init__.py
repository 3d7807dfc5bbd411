"""Adapters for inference engines: build swa_hal inputs from an engine's own step metadata."""

from .engine import CudaGraphSupport, EngineSWABuilder, batch_from_common_metadata, step_image_spans

__all__ = ["CudaGraphSupport", "EngineSWABuilder", "batch_from_common_metadata", "step_image_spans"]
