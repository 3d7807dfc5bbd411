# Copied from SGLang (https://github.com/sgl-project/sglang), file
# test/registered/spec/dspark/test_dspark_hip_backend_metadata.py at commit a5d37af8af4b6715f952af6a4088c729a63de3a8.
# Copyright the SGLang authors. Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License. You may obtain a copy of the License at
# http://www.apache.org/licenses/LICENSE-2.0 (the repository's LICENSE file holds it).
#
# Changes from the upstream file, nothing else (no assertion edited):
# - only the class that tests the DSpark draft block window (``TestDsparkDraftBlockWindowHip``, with the helpers it
#   uses) is copied: the file's other classes (``TestAiterSparseLengthFoldPerStep``,
#   ``TestLowRatioTargetVerifyHip``) test the AITER length fold and the low-ratio indexer, which swa_hal does not
#   replace;
# - the class runs on the CPU: its ``skipUnless(is_hip())`` is dropped (with the ``is_hip`` import) and its device
#   is ``cpu``, not ``cuda``
#   (the methods under test are torch code that runs on any device; upstream runs the class on ROCm only);
# - the tests that fail on SGLang 0.5.23 are marked strict xfail with the reason: the copy predates 0.5.23's
#   backend, whose methods read attributes the copy's ``_make_backend`` does not set (``OLDER_BACKEND``: with and
#   without swa_hal; ``NO_RING_ATTRIBUTE``: on SGLang's own ops only, see there); ``enabled`` (swa_hal's switch,
#   which tells the two runs apart) and ``pytest`` are imported for that.
#
# Which tests exercise swa_hal (run with SGLANG_PLUGINS=swa_hal):
# ``test_block_window_differs_from_the_causal_verify_window`` calls the backend's ``get_swa_page_indices`` and
# ``get_dspark_swa_page_indices``, both served by swa_hal's hooks (conftest.py checks that they reach it).
"""DSpark metadata on the HIP DeepSeek-V4 backend: the draft block window and the target-verify indexer rows."""

import unittest
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.test.ci.ci_register import register_amd_ci
from sglang.test.test_utils import CustomTestCase

from swa_hal.integrations._common import enabled

register_amd_ci(est_time=40, suite="stage-b-test-1-gpu-small-amd-mi35x")

SWA_WINDOW = 128
PAGE_SIZE = 256
NUM_REQ_SLOTS = 6
MAX_CONTEXT = 512
# Block slots (out_cache_loc) live past every req_to_token slot.
OUT_LOC_BASE = NUM_REQ_SLOTS * MAX_CONTEXT + 1
NUM_FULL_SLOTS = OUT_LOC_BASE + 4096

# SGLang's CustomTestCase retries a failing test and then raises its own exception, so no ``raises=`` here.
OLDER_BACKEND = pytest.mark.xfail(
    strict=True,
    reason="copy older than SGLang 0.5.23: its backend stub lacks attributes 0.5.23's backend reads "
    "(token_to_kv_pool.request_window in make_core_attn_metadata, max_context_len in init_cuda_graph_state)",
)
# On SGLang's own ops only: 0.5.23's get_dspark_swa_page_indices reads token_to_kv_pool.swa_req_ring_size (its
# per-request SWA ring, newer than the copy), which the stub pool lacks; swa_hal's hook takes a pool without it
# for the paged pool it is, so the test runs, and passes, with swa_hal swapped in.
NO_RING_ATTRIBUTE = pytest.mark.xfail(
    not enabled("SWA_HAL_SGLANG"),
    strict=True,
    reason="copy older than SGLang 0.5.23: its stub pool lacks token_to_kv_pool.swa_req_ring_size, which 0.5.23's "
    "get_dspark_swa_page_indices reads",
)


def _make_backend(*, block_size, device, is_dspark_draft=True, low_ratios=()):
    from sglang.srt.layers.attention.deepseek_v4_backend_hip_radix import (
        DeepseekV4HipRadixBackend,
    )

    backend = object.__new__(DeepseekV4HipRadixBackend)
    backend.device = device
    backend.cuda_int32_kwargs = {"device": device, "dtype": torch.int32}
    backend.swa_page_size = SWA_WINDOW
    backend.page_size = PAGE_SIZE
    g = torch.Generator().manual_seed(0)
    # Distinct full slots per (request slot, position); slot 0 stays the dummy.
    req_to_token = (
        torch.randperm(NUM_REQ_SLOTS * MAX_CONTEXT, generator=g).view(
            NUM_REQ_SLOTS, MAX_CONTEXT
        )
        + 1
    )
    backend.req_to_token = req_to_token.to(device=device, dtype=torch.int32)
    backend.req_to_token_pool = SimpleNamespace(req_to_token=backend.req_to_token)
    backend.MAX_SEQ_LEN_FOR_CAPTURE = MAX_CONTEXT
    # full -> swa: injective and not the identity, so a wrong source shows.
    full_to_swa = (torch.arange(NUM_FULL_SLOTS) * 3 + 7).to(
        device=device, dtype=torch.int64
    )
    backend.token_to_kv_pool = SimpleNamespace(
        full_to_swa_index_mapping=full_to_swa,
        translate_loc_from_full_to_swa=lambda idx: full_to_swa[idx.to(torch.int64)],
        unified_swa_pages=0,
    )
    backend.index_topk = 512
    backend.present_ratios = tuple(sorted(low_ratios))
    backend.low_ratios = tuple(low_ratios)
    backend.has_c4 = False
    backend.has_c128 = False
    backend.candidate_masks = None
    backend.low_ratio_identity_skip = False
    backend.low_ratio_candidate_span = None
    backend.enable_deepseek_v4_fp4_indexer = False
    backend.topk = 1
    backend.mtp_enabled = True
    backend.speculative_num_steps = 0
    backend.speculative_step_id = 0
    backend.speculative_num_draft_tokens = block_size + 1
    backend.is_draft_worker = is_dspark_draft
    backend.is_dspark_draft = is_dspark_draft
    # The draft verifies gamma rows, the target gamma + 1 (bonus included).
    backend.target_verify_num_draft_tokens = (
        block_size if is_dspark_draft else block_size + 1
    )
    backend.forward_metadata = None
    return backend


def _expected_block_row(backend, *, req_slot, prefix, out_loc_block, width):
    """Reference window row: the last min(prefix, SWA_WINDOW) committed tokens,
    then the block's slots, -1 padded; all through the full -> swa map."""
    full_to_swa = backend.token_to_kv_pool.full_to_swa_index_mapping
    ctx = min(prefix, SWA_WINDOW)
    row = torch.full((width,), -1, dtype=torch.int32, device=full_to_swa.device)
    if ctx:
        ctx_full = backend.req_to_token[req_slot, prefix - ctx : prefix].to(torch.int64)
        row[:ctx] = full_to_swa[ctx_full].to(torch.int32)
    row[ctx : ctx + out_loc_block.numel()] = full_to_swa[out_loc_block].to(torch.int32)
    return row, ctx


class TestDsparkDraftBlockWindowHip(CustomTestCase):
    def setUp(self):
        self.device = torch.device("cpu")

    @OLDER_BACKEND
    def test_every_block_row_sees_context_plus_whole_block(self):
        block = 5
        backend = _make_backend(block_size=block, device=self.device)
        prefix = torch.tensor(
            [0, 1, 37, 128, 300], dtype=torch.int32, device=self.device
        )
        req_pool = torch.tensor([5, 2, 0, 4, 1], dtype=torch.int32, device=self.device)
        bs = prefix.numel()
        out_loc = (
            torch.arange(bs * block, device=self.device, dtype=torch.int64) * 2
            + OUT_LOC_BASE
        )

        metadata = backend.init_forward_metadata_dspark_draft_block(
            max_seq_len=int(prefix.max()),
            req_pool_indices=req_pool,
            seq_lens=prefix,
            out_cache_loc=out_loc,
            block_size=block,
        )
        core = metadata.core_attn_metadata

        width = core.swa_page_indices.shape[1]
        self.assertEqual(core.swa_page_indices.shape[0], bs * block)
        self.assertEqual(width % 64, 0)
        self.assertGreaterEqual(width, SWA_WINDOW + block)
        for b in range(bs):
            p = int(prefix[b])
            row, ctx = _expected_block_row(
                backend,
                req_slot=int(req_pool[b]),
                prefix=p,
                out_loc_block=out_loc[b * block : (b + 1) * block],
                width=width,
            )
            for j in range(block):
                r = b * block + j
                self.assertTrue(torch.equal(core.swa_page_indices[r], row), (b, j))
                self.assertEqual(int(core.swa_topk_lengths[r]), ctx + block, (b, j))
                self.assertEqual(int(core.seq_lens_casual[r]), p + 1 + j, (b, j))
                self.assertEqual(int(core.positions_casual[r]), p + j, (b, j))
        # SWA-only draft: no compression / indexer metadata is built.
        self.assertIs(core.raw_out_loc, out_loc)
        self.assertIsNone(metadata.indexer_metadata)
        self.assertIsNone(core.c4_sparse_page_indices)
        self.assertEqual(metadata.low_ratio_indexer_metadata_by_ratio(), {})

    @NO_RING_ATTRIBUTE
    def test_block_window_differs_from_the_causal_verify_window(self):
        """The draft block window must differ from the causal target-side verify window."""
        block = 4
        backend = _make_backend(block_size=block, device=self.device)
        prefix = torch.tensor([200], dtype=torch.int32, device=self.device)
        req_pool = torch.tensor([3], dtype=torch.int32, device=self.device)
        out_loc = (
            torch.arange(block, device=self.device, dtype=torch.int64) + OUT_LOC_BASE
        )
        seq_lens_casual, req_rep = backend.expand_extend_with_same_length(
            bs=1, qo_len=block, seq_lens=prefix + block, req_pool_indices=req_pool
        )
        causal = backend.get_swa_page_indices(
            seq_lens_casual=seq_lens_casual, req_pool_indices_repeated=req_rep
        )
        dspark, lens = backend.get_dspark_swa_page_indices(
            seq_lens_casual=seq_lens_casual,
            req_pool_indices_repeated=req_rep,
            out_loc=out_loc,
            block_size=block,
        )
        # causal rows differ (one more position each); block rows are identical and read out_loc
        self.assertFalse(torch.equal(causal[0], causal[1]))
        self.assertTrue(torch.equal(dspark[0], dspark[block - 1]))
        self.assertTrue(torch.equal(lens, torch.full_like(lens, SWA_WINDOW + block)))
        block_swa = backend.token_to_kv_pool.full_to_swa_index_mapping[out_loc]
        self.assertTrue(
            torch.equal(
                dspark[0, SWA_WINDOW : SWA_WINDOW + block], block_swa.to(torch.int32)
            )
        )

    @OLDER_BACKEND
    def test_block_window_is_refused_off_the_dspark_draft(self):
        block = 4
        backend = _make_backend(
            block_size=block, device=self.device, is_dspark_draft=False
        )
        prefix = torch.tensor([10], dtype=torch.int32, device=self.device)
        req_pool = torch.tensor([1], dtype=torch.int32, device=self.device)
        seq_lens_casual, req_rep = backend.expand_extend_with_same_length(
            bs=1, qo_len=block, seq_lens=prefix + block, req_pool_indices=req_pool
        )
        with self.assertRaises(AssertionError):
            backend.make_core_attn_metadata(
                req_to_token=backend.req_to_token,
                req_pool_indices_repeated=req_rep,
                seq_lens_casual=seq_lens_casual,
                max_seq_len=64,
                out_loc=torch.zeros(block, dtype=torch.int64, device=self.device),
                need_compress=False,
                dspark_block_size=block,
            )

    @OLDER_BACKEND
    def test_graph_capture_and_replay_route_the_draft_through_the_block_window(self):
        """A TARGET_VERIFY capture on the DSpark draft must build the block window, and
        a replay must refresh it in place for new lengths and slots."""
        block = 3
        bs = 2
        backend = _make_backend(block_size=block, device=self.device)
        backend.init_cuda_graph_state(max_bs=bs, max_num_tokens=bs * block)

        def make_batch(prefix_list, out_base, cpu_extended):
            prefix = torch.tensor(prefix_list, dtype=torch.int32, device=self.device)
            out_loc = (
                torch.arange(bs * block, device=self.device, dtype=torch.int64)
                + out_base
            )
            seq_lens_cpu = torch.tensor(prefix_list, dtype=torch.int64)
            if cpu_extended:
                # The worker hands the draft a seq_lens_cpu already + block.
                seq_lens_cpu = seq_lens_cpu + block
            return SimpleNamespace(
                forward_mode=ForwardMode.TARGET_VERIFY,
                batch_size=bs,
                req_pool_indices=torch.tensor(
                    [4, 1], dtype=torch.int32, device=self.device
                ),
                seq_lens=prefix,
                seq_lens_cpu=seq_lens_cpu,
                seq_lens_sum=int(seq_lens_cpu.sum()),
                positions=torch.zeros(
                    bs * block, dtype=torch.int64, device=self.device
                ),
                out_cache_loc=out_loc,
                spec_info=SimpleNamespace(draft_token_num=block),
            )

        capture_batch = make_batch([1, 1], OUT_LOC_BASE, cpu_extended=False)
        backend.init_forward_metadata_out_graph(capture_batch, in_capture=True)
        captured = backend.forward_metadata
        core = captured.core_attn_metadata
        width = core.swa_page_indices.shape[1]

        replay_batch = make_batch([150, 7], OUT_LOC_BASE + 100, cpu_extended=True)
        backend.init_forward_metadata_out_graph(replay_batch)
        self.assertIs(backend.forward_metadata, captured)
        for b, p in enumerate([150, 7]):
            row, ctx = _expected_block_row(
                backend,
                req_slot=int(replay_batch.req_pool_indices[b]),
                prefix=p,
                out_loc_block=replay_batch.out_cache_loc[b * block : (b + 1) * block],
                width=width,
            )
            for j in range(block):
                r = b * block + j
                self.assertTrue(torch.equal(core.swa_page_indices[r], row), (b, j))
                self.assertEqual(int(core.swa_topk_lengths[r]), ctx + block)
                # Derived from the device prefix, not the pre-extended CPU copy.
                self.assertEqual(int(core.positions_casual[r]), p + j)


if __name__ == "__main__":
    unittest.main()
