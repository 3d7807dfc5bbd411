"""Conformance topic: the worked vectors of docs/semantics.md, on the backend's target."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..batch import AttentionBatch
from ..builder import SWAMetadataBuilder
from ..config import SWAConfig
from .fixtures import BackendFixtures


class VectorTests(BackendFixtures):
    """The worked vectors (W=4, B=4): causal decode and prefill rows, and a DSpark row."""

    def test_spec_vectors(self, make_builder: Callable[..., SWAMetadataBuilder]) -> None:
        config = SWAConfig(
            window_size=4,
            block_size=4,
            max_model_len=64,
            max_num_batched_tokens=32,
            max_num_seqs=4,
            num_speculative_tokens=1,
            speculative_method="mtp",
        )
        builder = make_builder(config)
        batch = AttentionBatch.from_lists([6, 3], [2, 3], [[7, 3], [5]], block_size=4).to(builder.device)
        md = builder.build(batch)
        assert md.decode_swa_indices.view(2, 4).tolist() == [[29, 30, 31, 12], [30, 31, 12, 13]]
        assert md.decode_swa_lens.tolist() == [4, 4]
        assert md.prefill_swa_indices is not None and md.prefill_swa_lens is not None
        assert md.prefill_swa_indices.view(3, 4).tolist() == [[20, -1, -1, -1], [20, 21, -1, -1], [20, 21, 22, -1]]
        assert md.prefill_swa_lens.tolist() == [1, 2, 3]
        dspark = dataclasses.replace(config, speculative_method="dspark", num_speculative_tokens=2)
        builder = make_builder(dspark)
        batch = AttentionBatch.from_lists([10], [3], [[2, 9, 6]], causal=False, block_size=4).to(builder.device)
        md = builder.build(batch)
        assert md.decode_swa_indices.view(3, 64).tolist() == [[11, 36, 37, 38, 39, 24, 25] + [-1] * 57] * 3
        assert md.decode_swa_lens.tolist() == [7, 7, 7]
