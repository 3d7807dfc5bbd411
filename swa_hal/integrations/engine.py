"""The engine-facing surface of an engine's own SWA metadata builder, over swa_hal.

An engine keeps its per-step ``CommonAttentionMetadata``-like object; ``batch_from_common_metadata``
reads it by field name (no copies, no host syncs) and ``EngineSWABuilder`` offers the methods the
engine already calls: ``build(common_prefix_len, common_attn_metadata, fast_build=False, replay_start=None)``,
``update_draft_decode_metadata``, ``reorder_batch_threshold`` and its CUDA-graph support level.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import torch

from ..batch import AttentionBatch, ImageSpans, ranges_in_step
from ..builder import SWAMetadataBuilder
from ..config import SWAConfig
from ..errors import BatchShapeError
from ..metadata import SWAMetadata
from ..platform import PlatformInfo


class CudaGraphSupport(enum.IntEnum):
    """How much of a batch may be captured in a CUDA graph (the engines' usual levels)."""

    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    UNIFORM_BATCH = 2  # decode-only batches with one query length, MTP included
    ALWAYS = 3


def batch_from_common_metadata(
    cm: Any, *, replay_start: torch.Tensor | None = None, image_spans: ImageSpans | None = None
) -> AttentionBatch:
    """An AttentionBatch that shares the engine's tensors (nothing is copied or synchronised).

    Reads ``seq_lens``, ``seq_lens_cpu_upper_bound`` (or ``seq_lens_cpu``), ``query_start_loc``,
    ``query_start_loc_cpu``, ``block_table_tensor``, ``slot_mapping``, ``max_query_len``,
    ``num_actual_tokens`` and ``causal`` (default True). The token rows T are the slot mapping's
    length: padding rows past ``num_actual_tokens`` included. ``replay_start`` and ``image_spans``
    pass through (docs/semantics.md #bounded-replay, #vision-spans).
    """
    seq_cpu = getattr(cm, "seq_lens_cpu_upper_bound", None)
    if seq_cpu is None:
        seq_cpu = getattr(cm, "seq_lens_cpu", None)
    slot_mapping = cm.slot_mapping
    num_tokens = slot_mapping.shape[0]
    actual = getattr(cm, "num_actual_tokens", None)
    if actual is not None and actual > num_tokens:
        raise BatchShapeError(
            "num_actual_tokens", f"num_actual_tokens={actual} exceeds the slot_mapping's {num_tokens} rows"
        )
    return AttentionBatch(
        seq_lens=cm.seq_lens,
        query_start_loc=cm.query_start_loc,
        query_start_loc_cpu=cm.query_start_loc_cpu,
        seq_lens_cpu=seq_cpu,
        block_table=cm.block_table_tensor,
        slot_mapping=slot_mapping,
        max_query_len=int(cm.max_query_len),
        num_tokens=num_tokens,
        causal=bool(getattr(cm, "causal", True)),
        replay_start=replay_start,
        image_spans=image_spans,
    )


class EngineSWABuilder:
    """An engine's SWA metadata builder surface, delegating to SWAMetadataBuilder."""

    cudagraph_support = CudaGraphSupport.UNIFORM_BATCH
    # The builder needs decodes first and nothing more: it asks for no reordering.
    reorder_batch_threshold: int | None = None

    def __init__(
        self,
        config: SWAConfig,
        device: str | torch.device,
        *,
        backend: str | None = None,
        platform: PlatformInfo | None = None,
        validate: bool | None = None,
    ):
        self.builder = SWAMetadataBuilder(config, device=device, backend=backend, platform=platform, validate=validate)

    @classmethod
    def from_hf_config(cls, hf_config: Mapping[str, Any] | str, device: str | torch.device, **engine_settings: Any):
        backend = engine_settings.pop("backend", None)
        return cls(SWAConfig.from_hf_config(hf_config, **engine_settings), device, backend=backend)

    @property
    def decode_threshold(self) -> int:
        return self.builder.decode_threshold

    @property
    def supports_draft_decode_metadata_update(self) -> bool:
        return self.builder.supports_draft_decode_metadata_update

    @property
    def backend_name(self) -> str:
        return self.builder.backend_name

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: Any,
        fast_build: bool = False,
        replay_start: torch.Tensor | None = None,
    ) -> SWAMetadata:
        """Build this step's metadata. ``common_prefix_len`` and ``fast_build`` are accepted for the
        engine's interface; sliding-window rows have no cascade prefix and one build path.
        ``replay_start``: each request's lower bound on the window (None: none). Image spans are read
        from ``common_attn_metadata.mm_req_doc_ranges`` (``{request: [(start, end), ...]}``) when the
        model is the vision variant and the step has prefill tokens."""
        spans = None
        ranges = getattr(common_attn_metadata, "mm_req_doc_ranges", None)
        if ranges and self.builder.config.max_image_tokens > 0 and any(ranges.values()):
            cm = common_attn_metadata
            num_reqs = cm.query_start_loc_cpu.shape[0] - 1
            seq_cpu = getattr(cm, "seq_lens_cpu_upper_bound", None)
            if seq_cpu is None:
                seq_cpu = getattr(cm, "seq_lens_cpu", None)
            if seq_cpu is None:
                seq_cpu = cm.seq_lens.cpu()  # only in steps with images, and only without a host copy
            # Engines list every image of a request; only those over this step's tokens are spans here.
            step = ranges_in_step(ranges, cm.query_start_loc_cpu, seq_cpu, num_reqs)
            if step:
                spans = self.builder.image_spans_from_ranges(step, num_reqs)
        batch = batch_from_common_metadata(common_attn_metadata, replay_start=replay_start, image_spans=spans)
        return self.builder.build(batch)

    def build_for_cudagraph_capture(self, common_attn_metadata: Any) -> SWAMetadata:
        return self.build(0, common_attn_metadata)

    def update_draft_decode_metadata(self, metadata: SWAMetadata) -> None:
        self.builder.update_draft_decode_metadata(metadata)

    def warmup(self) -> int:
        return self.builder.warmup()
