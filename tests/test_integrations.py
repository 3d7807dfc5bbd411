"""The engine adapter, driven by a duck-typed stand-in for an engine's common attention metadata."""

from __future__ import annotations

import random

import pytest

from helpers import common_metadata
from swa_hal import PlatformInfo, SWAConfig
from swa_hal.integrations import CudaGraphSupport, EngineSWABuilder, batch_from_common_metadata
from swa_hal.testing import compare_with_reference, random_batch

CFG = SWAConfig(window_size=8, block_size=4, max_model_len=512, max_num_batched_tokens=96, max_num_seqs=12,
                num_speculative_tokens=2, speculative_method="mtp", compress_ratios=(0, 4))


def test_adapter_shares_the_engine_tensors():
    batch = random_batch(CFG, random.Random(0), "padded")
    cm = common_metadata(batch)
    adapted = batch_from_common_metadata(cm)
    assert adapted.seq_lens is cm.seq_lens and adapted.block_table is cm.block_table_tensor
    assert adapted.slot_mapping is cm.slot_mapping and adapted.query_start_loc_cpu is cm.query_start_loc_cpu
    assert adapted.num_tokens == cm.slot_mapping.shape[0] and adapted.causal is True


def test_adapter_falls_back_to_seq_lens_cpu_and_checks_actual_tokens():
    batch = random_batch(CFG, random.Random(1), "decode")
    cm = common_metadata(batch)
    del cm.seq_lens_cpu_upper_bound
    cm.seq_lens_cpu = batch.seq_lens_cpu
    assert batch_from_common_metadata(cm).seq_lens_cpu is batch.seq_lens_cpu
    cm.num_actual_tokens = batch.num_tokens + 1
    with pytest.raises(ValueError, match="num_actual_tokens"):
        batch_from_common_metadata(cm)


@pytest.mark.parametrize("backend, assume", [("torch", "vendor=cpu"), ("cuda", "vendor=cuda,capability=9.0"),
                                             ("rocm", "vendor=rocm")])
def test_engine_builder_surface(backend, assume):
    engine = EngineSWABuilder(CFG, "cpu", backend=backend, platform=PlatformInfo.from_assume(assume))
    assert engine.reorder_batch_threshold is None
    assert engine.cudagraph_support == CudaGraphSupport.UNIFORM_BATCH
    assert engine.decode_threshold == 3 and engine.supports_draft_decode_metadata_update
    rng = random.Random(backend)
    for kind in ("decode", "mtp", "mixed", "padded", "invalid"):
        batch = random_batch(CFG, rng, kind)
        md = engine.build(0, common_metadata(batch), fast_build=True, replay_start=batch.replay_start)
        assert not compare_with_reference(CFG, batch, md)
        assert md.max_decode_query_len == min(batch.max_query_len, 3)
    batch = random_batch(CFG, rng, "mtp", extra_pages=1, max_context=500, replay=0.0)  # captures pass no bound
    md = engine.build_for_cudagraph_capture(common_metadata(batch))
    batch.seq_lens[: md.num_decodes] += 1
    batch.seq_lens_cpu[: md.num_decodes] += 1
    engine.update_draft_decode_metadata(md)
    want = engine.builder.build(batch)
    assert md.decode_swa_indices.tolist() == want.decode_swa_indices.tolist()


def test_from_hf_config():
    engine = EngineSWABuilder.from_hf_config({"sliding_window": 16, "compress_ratios": [0, 128]}, "cpu",
                                             block_size=8, max_num_batched_tokens=32, max_num_seqs=4, max_model_len=256)
    assert engine.builder.config.window_size == 16 and engine.backend_name == "torch"


def test_parallel_drafting_threshold_drives_the_split():
    cfg = SWAConfig(window_size=4, block_size=4, max_model_len=128, max_num_batched_tokens=64, max_num_seqs=8,
                    num_speculative_tokens=2, parallel_drafting=True, speculative_method="mtp")
    engine = EngineSWABuilder(cfg, "cpu")
    from swa_hal import AttentionBatch

    # threshold 1 + 2 * 2 = 5: queries of 5 are decodes, 6 is the first prefill.
    batch = AttentionBatch.from_lists([9, 9, 9], [5, 6, 5], [[0, 1, 2], [3, 4, 5], [6, 7, 8]], block_size=4)
    md = engine.build(0, common_metadata(batch))
    assert (md.num_decodes, md.num_prefills, md.num_decode_tokens, md.num_prefill_tokens) == (1, 2, 5, 11)
    assert md.max_decode_query_len == 5


def test_engine_builder_keeps_only_the_images_of_this_step():
    # Engines list every image of a request (earlier chunks', later ones'); only spans over this step's
    # new tokens are spans of the batch (docs/semantics.md #vision-spans), so the guard sees no violation.
    import dataclasses

    from swa_hal import AttentionBatch

    config = dataclasses.replace(CFG, num_speculative_tokens=0, speculative_method=None, max_image_tokens=4)
    engine = EngineSWABuilder(config, "cpu", backend="torch")
    # One decode, then a prefill of positions 8..15 (S = 16, q = 8).
    batch = AttentionBatch.from_lists([5, 16], [1, 8], [[1, 2], [3, 4, 5, 6]], block_size=4)
    ranges = {1: [(2, 5), (9, 12), (20, 23)], 0: [(0, 1)]}  # before, inside and after the step; a decode's
    md = engine.build(0, common_metadata(batch, mm_req_doc_ranges=ranges))
    want = AttentionBatch.from_lists([5, 16], [1, 8], [[1, 2], [3, 4, 5, 6]], block_size=4, image_spans={1: [(9, 12)]})
    assert not compare_with_reference(config, want, md)
    assert md.prefill_left_visible.tolist()[1:] == [0, 0, 1, 2, 3, 0, 0, 0]
    engine.builder.check()  # nothing recorded


# -- padding rows: one rule (batch_from_common_metadata, docs/semantics.md #inputs, #split, #per-token-helpers) --

C2 = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=4,
               num_speculative_tokens=1, speculative_method="mtp")


def vector_c2(num_tokens=7):
    """Vector C1 with T=7 (vector C2): a decode of 2 tokens, a prefill of 3, two padding rows."""
    from swa_hal import AttentionBatch

    return AttentionBatch.from_lists([6, 3], [2, 3], [[7, 3], [5, -1]], block_size=4, num_tokens=num_tokens)


@pytest.mark.parametrize("actual", ["scheduled", "all rows", "absent"])
def test_padding_rows_are_every_slot_row_past_the_scheduled_tokens(actual):
    # Engines differ on what num_actual_tokens counts (vLLM's counts the padding); it decides no row.
    batch = vector_c2()
    overrides = {"scheduled": {}, "all rows": {"num_actual_tokens": 7}, "absent": {}}[actual]
    cm = common_metadata(batch, **overrides)
    if actual == "absent":
        del cm.num_actual_tokens
    adapted = batch_from_common_metadata(cm)
    assert adapted.num_tokens == 7 and adapted.slot_mapping is batch.slot_mapping
    engine = EngineSWABuilder(C2, "cpu", backend="torch")
    md = engine.build(0, cm)
    assert not compare_with_reference(C2, batch, md)
    assert (md.num_decodes, md.num_prefills, md.num_decode_tokens, md.num_prefill_tokens) == (1, 1, 2, 5)
    # Vector C2: the padding rows are prefill rows 3 and 4, request 0, invalid, lens 0, all -1.
    assert md.token_to_req_indices.tolist() == [0, 0, 1, 1, 1, 0, 0]
    assert md.is_valid_token.tolist() == [True] * 5 + [False] * 2
    assert md.prefill_swa_lens.tolist() == [1, 2, 3, 0, 0]
    assert (md.prefill_swa_indices[3:] == -1).all()
    assert md.prefill_swa_indices[:3, 0].tolist() == [[20, -1, -1, -1], [20, 21, -1, -1], [20, 21, 22, -1]]
    assert md.decode_swa_indices[:, 0].tolist() == [[29, 30, 31, 12], [30, 31, 12, 13]]


@pytest.mark.parametrize("backend, assume", [("torch", "vendor=cpu"), ("cuda", "vendor=cuda,capability=9.0")])
def test_padding_rows_of_random_batches_equal_the_reference(backend, assume):
    """Padding rows (and zero-length padding requests) in decode-only, MTP and mixed batches: the
    adapter's batch has every slot row, and the build equals the reference on all of them."""
    from swa_hal.scenarios import synthesize_batch

    engine = EngineSWABuilder(CFG, "cpu", backend=backend, platform=PlatformInfo.from_assume(assume))
    rng = random.Random(f"padding-{backend}")
    for i in range(6):
        batch = random_batch(CFG, rng, "padded")
        queries = ([1] * rng.randint(1, 3)) if i % 2 else [rng.randint(1, 3), rng.randint(4, 9), 2]
        seqs = [q + rng.randint(0, 20) for q in queries] + [0]
        mixed = synthesize_batch(CFG, seqs, queries + [0], rng=rng, padding_rows=rng.randint(1, 6))
        for b in (batch, mixed):
            assert b.num_tokens > int(b.query_start_loc_cpu[-1])
            md = engine.build(0, common_metadata(b), replay_start=b.replay_start)
            assert not compare_with_reference(CFG, b, md)
            pad = slice(int(b.query_start_loc_cpu[-1]), b.num_tokens)
            assert not md.is_valid_token[pad].any() and (md.token_to_req_indices[pad] == 0).all()
