"""The fixed-address output buffers of a builder (docs/semantics.md #fixed-buffers).

Allocated once per builder with capacity ``max_num_batched_tokens`` rows; every build returns views of
them, so a CUDA graph that captured a build keeps reading the right memory on replay.
"""

from __future__ import annotations

import torch

from .config import SWAConfig


class MetadataBuffers:
    def __init__(self, config: SWAConfig, device: torch.device):
        cap = config.max_num_batched_tokens
        w = config.window_size
        i32 = dict(dtype=torch.int32, device=device)
        self.config = config
        self.device = device
        self.capacity = cap
        self.token_to_req = torch.zeros(cap, **i32)
        self.is_valid = torch.zeros(cap, dtype=torch.bool, device=device)
        self.decode_indices = torch.full((cap, 1, w), -1, **i32)
        self.decode_lens = torch.zeros(cap, **i32)
        self.prefill_indices = torch.full((cap, 1, w), -1, **i32)
        self.prefill_lens = torch.zeros(cap, **i32)
        self.gather_lens = torch.zeros(max(1, min(config.max_num_seqs, cap)), **i32)
        # DSpark rows are wider than W; allocated on first use (most configs never need them).
        self._noncausal_indices: torch.Tensor | None = None
        # Backends may park their own fixed buffers here (ROCm's ragged form, scratch space).
        self.extra: dict[str, torch.Tensor | object] = {}

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
