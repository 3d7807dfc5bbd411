"""The fixed-address output buffers of a builder (docs/semantics.md #fixed-buffers).

Allocated once per builder, sized for everything the config admits (``max_num_batched_tokens`` token
rows, ``max_num_seqs`` requests); every build returns views of them, so a CUDA graph that captured a
build keeps reading the right memory on replay, and no build can write past them.
"""

from __future__ import annotations

import torch

from .config import SWAConfig


class MetadataBuffers:
    def __init__(self, config: SWAConfig, device: torch.device):
        cap = config.max_num_batched_tokens
        seqs = config.max_num_seqs
        w = config.window_size
        i32 = dict(dtype=torch.int32, device=device)
        self.config = config
        self.device = device
        self.capacity = cap
        self.token_to_req = torch.zeros(cap, **i32)
        self.is_valid = torch.zeros(cap, dtype=torch.bool, device=device)
        self.decode_indices = torch.full((cap, 1, w), -1, **i32)
        self.decode_lens = torch.zeros(cap, **i32)
        self.prefill_indices = torch.full((cap, 1, config.prefill_index_width), -1, **i32)
        self.prefill_lens = torch.zeros(cap, **i32)
        # Every request may be a prefill (short requests after the first long one are), so one
        # gather length per admitted request, not per token.
        self.gather_lens = torch.zeros(seqs, **i32)
        # The replay bound of a batch that has none: no lower bound (a graph captured without one
        # keeps reading zeros).
        self.no_replay_start = torch.zeros(seqs, **i32)
        # Vision variant: per-token visibility, and the span CSR of a batch (image_spans_from_ranges).
        # Without spans the kernels read an all-zero indptr: no request has a span.
        images = config.max_image_tokens > 0
        self.left_visible = torch.zeros(cap if images else 1, **i32)
        self.right_visible = torch.zeros(cap if images else 1, **i32)
        self.span_indptr = torch.zeros(seqs + 1, **i32)
        self.span_starts = torch.zeros(cap if images else 1, **i32)
        self.span_ends = torch.zeros(cap if images else 1, **i32)
        self.no_span_indptr = torch.zeros(seqs + 1, **i32)
        # Guarded builds record their first violation here: count, kind, request, value (swa_hal/guard.py).
        self.violation = torch.zeros(4, **i32)
        # DSpark rows are wider than W; allocated on first use (most configs never need them).
        self._noncausal_indices: torch.Tensor | None = None

    @property
    def noncausal_indices(self) -> torch.Tensor:
        if self._noncausal_indices is None:
            width = self.config.noncausal_index_width
            self._noncausal_indices = torch.full(
                (self.capacity, 1, width), -1, dtype=torch.int32, device=self.device
            )
        return self._noncausal_indices

    def decode_rows(self, causal: bool) -> torch.Tensor:
        return self.decode_indices if causal else self.noncausal_indices
