"""Conformance topic: the worked vectors of docs/semantics.md, on the backend's target."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..batch import AttentionBatch
from ..builder import SWAMetadataBuilder
from .fixtures import MTP1, BackendFixtures, expect_equal, swa_config


class VectorTests(BackendFixtures):
    """The worked vectors: causal decode and prefill rows (W=4, B=4), a DSpark row, and a prefill beside DSpark rows."""

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

    def test_dspark_step_prefill_vector(self, make_builder: Callable[..., SWAMetadataBuilder]) -> None:
        """docs/semantics.md #dspark-rows, vectors S2 and S3: a prefill beside DSpark rows is a causal row, though
        its q + W is past the DSpark width (rule 7 is a DSpark row's); nothing is recorded."""
        config = swa_config(
            61, 64, 4096, 160, 12, num_speculative_tokens=3, speculative_method="dspark", parallel_drafting=True
        )
        builder = make_builder(config)
        batch = AttentionBatch.from_lists([63, 200], [7, 10], [[3], [4, 5, 6, 7]], causal=False, block_size=64)
        md = builder.build(batch.to(builder.device))
        where = "DSpark worked vectors S2 and S3 (W=61, B=64, a 7-token DSpark decode and a 10-token prefill)"
        builder.check()
        expect_equal(md.decode_swa_lens.tolist(), [63] * 7, f"{where}: decode_swa_lens")
        expect_equal(md.decode_swa_indices[0, 0, :64].tolist(), list(range(192, 255)) + [-1], f"{where}: decode row 0")
        assert md.prefill_swa_indices is not None and md.prefill_swa_lens is not None, (
            f"{where}: the build has a prefill but prefill_swa_indices / prefill_swa_lens are None"
        )
        expect_equal(md.prefill_swa_lens.tolist(), [61] * 10, f"{where}: prefill_swa_lens")
        expect_equal(md.prefill_swa_indices[0, 0].tolist(), list(range(386, 447)), f"{where}: prefill row 0")
        expect_equal(md.prefill_swa_indices[9, 0].tolist(), list(range(395, 456)), f"{where}: prefill row 9")
        assert md.prefill_gather_lens is not None, f"{where}: prefill_gather_lens is None"
        expect_equal(md.prefill_gather_lens.tolist(), [70], f"{where}: prefill_gather_lens")
