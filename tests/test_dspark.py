"""DSpark non-causal draft rows (docs/semantics.md #dspark-rows) on every backend, and their errors."""

from __future__ import annotations

import random

import pytest

from helpers import BACKEND_PLATFORMS, make_builder, swept
from swa_hal import AttentionBatch, SWAConfig
from swa_hal.errors import SpeculativeModeError
from swa_hal.scenarios import synthesize_batch
from swa_hal.testing import address_strict, compare_with_reference, random_batch


def dspark(window, drafts, **kw):
    kw.setdefault("block_size", 16 if window >= 64 else 4)
    return SWAConfig(window_size=window, max_model_len=4096, max_num_batched_tokens=160, max_num_seqs=12,
                     num_speculative_tokens=drafts, speculative_method="dspark", **kw)


@pytest.mark.parametrize("backend", swept(BACKEND_PLATFORMS))
@pytest.mark.parametrize("window, drafts", [(4, 0), (4, 1), (4, 5), (4, 7), (128, 1), (128, 5), (128, 7)])
def test_dspark_batches_match_reference(backend, window, drafts):
    config = dspark(window, drafts)
    builder = make_builder(config, backend)
    rng = random.Random(f"{backend}-{window}-{drafts}")
    strict = address_strict() if backend == "sm12x" else _null()
    with strict:
        for _ in range(3):
            batch = random_batch(config, rng, "dspark")
            md = builder.build(batch)
            assert md.decode_swa_width == config.noncausal_index_width
            assert md.decode_swa_indices.shape[-1] == config.noncausal_index_width
            assert not compare_with_reference(config, batch, md)


@pytest.mark.parametrize("backend", list(BACKEND_PLATFORMS))
def test_w128_without_drafts_fits_only_short_contexts(backend):
    # width = ceil(128 / 64) * 64 = 128, but a row holds the W context tokens plus the token itself.
    config = dspark(128, 0)
    builder = make_builder(config, backend)
    ok = synthesize_batch(config, [128, 40], [1, 1], rng=random.Random(0), causal=False)
    assert not compare_with_reference(config, ok, builder.build(ok))
    too_long = synthesize_batch(config, [129], [1], rng=random.Random(0), causal=False)
    # A decode's seq_lens_cpu is only an upper bound, so the row's width is the device's to check (rule 7):
    # emptied and recorded, never cut.
    md = builder.build(too_long)
    assert md.decode_swa_lens.tolist() == [0] and (md.decode_swa_indices == -1).all()
    with pytest.raises(SpeculativeModeError, match="needs 129 entries, wider than the row; refusing to truncate"):
        builder.check()


@pytest.mark.parametrize("backend", list(BACKEND_PLATFORMS))
def test_row_wider_than_the_width_is_recorded_or_refused_when_validated(backend):
    # W + N = 64 is already a whole tile, so a full draft block (N + 1 = 5 tokens) after 60 context
    # tokens needs 65 entries: an error, never a truncated row (a guarded build's record, a validated
    # build's refusal).
    config = dspark(60, 4, block_size=4)
    assert (config.noncausal_index_width, config.decode_threshold) == (64, 5)
    builder = make_builder(config, backend)
    batch = AttentionBatch.from_lists([70], [5], [list(range(18))], causal=False, block_size=4)
    md = builder.build(batch)
    assert md.decode_swa_lens.tolist() == [0] * 5
    with pytest.raises(SpeculativeModeError, match="^request 0: its row needs 65 entries, wider than the row"):
        builder.check()
    with pytest.raises(SpeculativeModeError, match="wider than the non-causal width 64"):
        builder.build(batch, validate=True)


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("backend", list(BACKEND_PLATFORMS))
def test_a_host_upper_bound_past_the_width_refuses_no_valid_step(backend, validate):
    # docs/semantics.md #dspark-rows, vector S2: W = 61, three parallel drafts, width 64; a 7-token decode at S = 63 needs
    # min(7 + 61, 63) = 63 entries and fits. Async scheduling hands in seq_lens_cpu = 66, an upper bound (whose
    # row would need 66): the step is valid and builds the rows of its device length.
    config = dspark(61, 3, block_size=64, parallel_drafting=True)
    assert (config.noncausal_index_width, config.decode_threshold) == (64, 7)
    batch = AttentionBatch.from_lists([63], [7], [[3]], causal=False, block_size=64)
    batch = batch.replace(seq_lens_cpu=batch.seq_lens_cpu + 3)
    builder = make_builder(config, backend)
    md = builder.build(batch, validate=validate)
    builder.check()
    assert md.decode_swa_lens.tolist() == [63] * 7
    assert md.decode_swa_indices[0, 0, :63].tolist() == list(range(192, 255))
    assert not compare_with_reference(config, batch, md)


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("backend", list(BACKEND_PLATFORMS))
def test_a_prefill_of_a_dspark_step_is_a_causal_row(backend, validate):
    # docs/semantics.md #dspark-rows, vector S3: rule 7 is a DSpark row's. S2's decode beside a prefill S=200, q=10
    # (P=190), BT [4, 5, 6, 7]: its rows are causal, 61 entries each, though q + W = 71 is past the DSpark width 64.
    # The torch backend's guarded build once held the prefill to the DSpark width: rows and gather length emptied,
    # rule 7 recorded, on a valid step.
    config = dspark(61, 3, block_size=64, parallel_drafting=True)
    batch = AttentionBatch.from_lists([63, 200], [7, 10], [[3], [4, 5, 6, 7]], causal=False, block_size=64)
    builder = make_builder(config, backend)
    md = builder.build(batch, validate=validate)
    builder.check()
    assert (md.num_decodes, md.num_prefills) == (1, 1)
    assert md.decode_swa_lens.tolist() == [63] * 7
    assert md.prefill_gather_lens.tolist() == [70]
    assert md.prefill_swa_lens.tolist() == [61] * 10
    assert md.prefill_swa_indices[0, 0].tolist() == list(range(386, 447))  # positions 130..190
    assert md.prefill_swa_indices[9, 0].tolist() == list(range(395, 456))  # positions 139..199
    assert not compare_with_reference(config, batch, md)


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_causal_false_needs_dspark(backend):
    config = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=16,
                       num_speculative_tokens=2, speculative_method="mtp")
    batch = AttentionBatch.from_lists([6], [3], [[0, 1]], causal=False, block_size=4)
    builder = make_builder(config, backend)
    for validate in (False, True):
        with pytest.raises(SpeculativeModeError, match="causal=False is only legal with DSpark"):
            builder.build(batch, validate=validate)


def test_noncausal_buffer_is_allocated_once_on_first_use():
    config = dspark(4, 2)
    builder = make_builder(config, "torch")
    assert builder.buffers._noncausal_indices is None
    causal = AttentionBatch.from_lists([6], [1], [[0, 1]], block_size=4)
    builder.build(causal)
    assert builder.buffers._noncausal_indices is None
    md = builder.build(AttentionBatch.from_lists([6], [3], [[0, 1]], causal=False, block_size=4))
    first = builder.buffers._noncausal_indices.data_ptr()
    assert md.decode_swa_indices.data_ptr() == first
    md = builder.build(AttentionBatch.from_lists([9], [2], [[0, 1, 2]], causal=False, block_size=4))
    assert md.decode_swa_indices.data_ptr() == first


@pytest.mark.parametrize("backend", ["torch", "cuda", "sm12x", "rocm"])
def test_draft_update_recomputes_dspark_rows(backend):
    # docs/semantics.md #draft-updates: DSpark metadata is updated as DSpark rows (no replay bound).
    config = dspark(4, 2)
    builder = make_builder(config, backend)
    batch = AttentionBatch.from_lists([6], [3], [[0, 1, 2]], causal=False, block_size=4, replay_start=[3])
    md = builder.build(batch)
    assert md.decode_swa_lens.tolist() == [6, 6, 6]  # positions 0..5: the replay bound is ignored
    batch.seq_lens.add_(1)
    builder.update_draft_decode_metadata(md)
    assert not md.causal and md.decode_swa_lens.tolist() == [7, 7, 7]
    assert md.decode_swa_indices[0, 0, :8].tolist() == [0, 1, 2, 3, 4, 5, 6, -1]


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
