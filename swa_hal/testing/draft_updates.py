"""Conformance topic: repeated in-place draft-step updates (docs/semantics.md #draft-updates) equal fresh
builds. Collected for backends that support the update."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from ..builder import SWAMetadataBuilder
from ..ragged import RaggedDecodeRows
from .batches import advance_decodes
from .fixtures import BackendFixtures, requires


class DraftUpdateTests(BackendFixtures):
    """Each config of ``draft_update_configs``: seven draft steps of decode, MTP, mixed and invalid-token
    batches, each update compared with a fresh build of the advanced batch."""

    @requires("draft_update")
    def test_draft_update_matches_a_fresh_build(
        self, name: str, make_builder: Callable[..., SWAMetadataBuilder], make_batch: Callable, draft_config: str
    ) -> None:
        config = self.configs[draft_config]
        live = make_builder(config)
        fresh = make_builder(config)
        rng = random.Random(f"draft-{name}-{draft_config}")
        for kind in ("decode", "mtp", "mixed", "invalid"):
            # Room to grow: contexts leave 8 positions and every request holds 2 spare pages.
            batch = make_batch(config, rng, kind, max_context=config.max_model_len - 8, extra_pages=2)
            md = live.build(batch)
            for step in range(1, 8):
                advance_decodes(batch, md.num_decodes, config.block_size)  # the engine's step, in place
                live.update_draft_decode_metadata(md)
                want = fresh.build(batch)
                rows = md.num_decode_tokens
                where = f"{kind} batch, draft step {step}"
                assert torch.equal(md.decode_swa_indices.cpu(), want.decode_swa_indices[:rows].cpu()), (
                    f"{where}: decode_swa_indices after the in-place update differ from a fresh build"
                )
                assert torch.equal(md.decode_swa_lens.cpu(), want.decode_swa_lens.cpu()), (
                    f"{where}: decode_swa_lens after the in-place update differ from a fresh build "
                    f"({md.decode_swa_lens.tolist()} vs {want.decode_swa_lens.tolist()})"
                )
                ragged, ragged_want = md.extra(RaggedDecodeRows), want.extra(RaggedDecodeRows)
                if ragged is not None and ragged_want is not None:  # a ragged form must be refreshed too
                    assert torch.equal(ragged.indptr.cpu(), ragged_want.indptr.cpu()), (
                        f"{where}: the ragged rows' indptr was not refreshed by the update"
                    )
                    n = int(ragged_want.indptr[-1])
                    assert torch.equal(ragged.indices[:n].cpu(), ragged_want.indices[:n].cpu()), (
                        f"{where}: the ragged rows' indices were not refreshed by the update"
                    )
