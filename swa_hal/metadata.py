"""SWAMetadata: what one build hands the attention layers (field names follow the engine seed)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .reference import PrefillChunk, prefill_chunk_plan


@dataclasses.dataclass(eq=False, slots=True)
class SWAMetadata:
    # The step's inputs, passed through for the consumers.
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    # docs/semantics.md #split
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int
    # docs/semantics.md #per-token-helpers
    token_to_req_indices: torch.Tensor
    is_valid_token: torch.Tensor
    # docs/semantics.md #causal-rows, #dspark-rows decode rows: [num_decode_tokens, 1, decode_swa_width] int32 and lens
    decode_swa_indices: torch.Tensor
    decode_swa_lens: torch.Tensor
    decode_swa_width: int
    causal: bool
    max_decode_query_len: int
    # docs/semantics.md #causal-rows prefill rows (None without prefill tokens)
    prefill_swa_indices: torch.Tensor | None
    prefill_swa_lens: torch.Tensor | None
    # docs/semantics.md #prefill-metadata (None without prefills)
    prefill_gather_lens: torch.Tensor | None
    prefill_seq_lens: torch.Tensor | None
    prefill_seq_lens_cpu: torch.Tensor | None
    prefill_query_lens_cpu: torch.Tensor | None
    # Static facts
    block_size: int
    window_size: int
    max_model_len: int
    max_num_batched_tokens: int
    # docs/semantics.md #layer-types-and-schedulers: layer type -> fresh FlashMLA scheduler object, or None
    tile_sched: dict[str, Any]
    backend: str
    # ROCm's ragged (CSR) form of the decode rows; None on other backends.
    decode_swa_ragged_indices: torch.Tensor | None = None
    decode_swa_indptr: torch.Tensor | None = None

    def get_prefill_chunk_plan(self, compress_ratio: int, chunk_size: int) -> list[PrefillChunk]:
        """docs/semantics.md #prefill-metadata chunk plan over this step's prefills, from host copies only (no sync)."""
        if self.num_prefills == 0:
            return []
        return prefill_chunk_plan(
            self.prefill_seq_lens_cpu.tolist(),
            self.prefill_query_lens_cpu.tolist(),
            window_size=self.window_size,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=self.max_num_batched_tokens,
            compress_ratio=compress_ratio,
            chunk_size=chunk_size,
        )

    # Aliases under the seed's names, for engines ported from it.
    @property
    def prefill_window_size(self) -> int:
        return self.window_size

    @property
    def prefill_max_model_len(self) -> int:
        return self.max_model_len

    @property
    def prefill_max_num_batched_tokens(self) -> int:
        return self.max_num_batched_tokens

    @property
    def tile_sched_swaonly(self) -> Any:
        return self.tile_sched.get("swaonly")

    @property
    def tile_sched_c4a(self) -> Any:
        return self.tile_sched.get("c4a")

    @property
    def tile_sched_c128a(self) -> Any:
        return self.tile_sched.get("c128a")
