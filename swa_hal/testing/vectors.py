"""Conformance topic: the worked vectors of docs/semantics.md, on the backend's target."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..batch import AttentionBatch
from ..builder import SWAMetadataBuilder
from .fixtures import MTP1, BackendFixtures, expect_equal, swa_config


class VectorTests(BackendFixtures):
    """The worked vectors (W=4, B=4): causal decode and prefill rows, and a DSpark row."""

    def test_spec_vectors(self, make_builder: Callable[..., SWAMetadataBuilder]) -> None:
        config = swa_config(4, 4, 64, 32, 4, **MTP1)
        builder = make_builder(config)
        batch = AttentionBatch.from_lists([6, 3], [2, 3], [[7, 3], [5]], block_size=4).to(builder.device)
        md = builder.build(batch)
        where = "worked vector (W=4, B=4, a 2-token MTP decode and a 3-token prefill)"
        expect_equal(
            md.decode_swa_indices.view(2, 4).tolist(),
            [[29, 30, 31, 12], [30, 31, 12, 13]],
            f"{where}: decode_swa_indices",
        )
        expect_equal(md.decode_swa_lens.tolist(), [4, 4], f"{where}: decode_swa_lens")
        assert md.prefill_swa_indices is not None and md.prefill_swa_lens is not None, (
            f"{where}: the build has a prefill but prefill_swa_indices / prefill_swa_lens are None"
        )
        expect_equal(
            md.prefill_swa_indices.view(3, 4).tolist(),
            [[20, -1, -1, -1], [20, 21, -1, -1], [20, 21, 22, -1]],
            f"{where}: prefill_swa_indices",
        )
        expect_equal(md.prefill_swa_lens.tolist(), [1, 2, 3], f"{where}: prefill_swa_lens")
        dspark = dataclasses.replace(config, speculative_method="dspark", num_speculative_tokens=2)
        builder = make_builder(dspark)
        batch = AttentionBatch.from_lists([10], [3], [[2, 9, 6]], causal=False, block_size=4).to(builder.device)
        md = builder.build(batch)
        where = "DSpark worked vector (W=4, B=4, a non-causal block of 3)"
        expect_equal(
            md.decode_swa_indices.view(3, 64).tolist(),
            [[11, 36, 37, 38, 39, 24, 25] + [-1] * 57] * 3,
            f"{where}: decode_swa_indices",
        )
        expect_equal(md.decode_swa_lens.tolist(), [7, 7, 7], f"{where}: decode_swa_lens")
