"""Every worked vector of docs/semantics.md, through the reference and through every backend."""

from __future__ import annotations

import pytest
import torch

from helpers import BACKEND_PLATFORMS, make_builder
from swa_hal import AttentionBatch, SWAConfig
from swa_hal import reference as ref
from swa_hal.metadata import prefill_chunk_plan
from swa_hal.split import split_decodes_and_prefills


def qsl_of(query_lens):
    out = [0]
    for q in query_lens:
        out.append(out[-1] + q)
    return torch.tensor(out, dtype=torch.int32)


@pytest.mark.parametrize(
    "query_lens, threshold, expected",
    [
        ([1, 1, 1], 1, (3, 0, 3, 0)),
        ([1, 2, 1, 3, 2, 1, 2], 3, (7, 0, 12, 0)),
        ([4, 5, 6, 7], 3, (0, 4, 0, 22)),
        ([2, 1, 3, 4, 5, 6, 7, 8], 4, (4, 4, 10, 26)),
    ],
)
def test_split_vectors(query_lens, threshold, expected):
    qsl = qsl_of(query_lens)
    got = split_decodes_and_prefills(qsl, max(query_lens), int(qsl[-1]), threshold)
    assert tuple(got) == expected


def test_split_counts_padding_rows_with_the_last_group():
    qsl = qsl_of([1, 1])
    assert tuple(split_decodes_and_prefills(qsl, 1, 5, 1)) == (2, 0, 5, 0)
    qsl = qsl_of([1, 4])
    assert tuple(split_decodes_and_prefills(qsl, 4, 8, 1)) == (1, 1, 1, 7)


SPEC5_CONFIG = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=32,
                         max_num_seqs=4, num_speculative_tokens=1, speculative_method="mtp")


def spec5_batch():
    return AttentionBatch.from_lists([6, 3], [2, 3], [[7, 3], [5]], block_size=4)


def test_decode_threshold_of_spec5_config():
    assert SPEC5_CONFIG.decode_threshold == 2


@pytest.mark.parametrize("backend", list(BACKEND_PLATFORMS))
def test_causal_vector(backend):
    md = make_builder(SPEC5_CONFIG, backend).build(spec5_batch())
    assert (md.num_decodes, md.num_prefills, md.num_decode_tokens, md.num_prefill_tokens) == (1, 1, 2, 3)
    assert md.decode_swa_indices.shape == (2, 1, 4)
    assert md.decode_swa_indices.view(2, 4).tolist() == [[29, 30, 31, 12], [30, 31, 12, 13]]
    assert md.decode_swa_lens.tolist() == [4, 4]
    assert md.prefill_swa_indices.view(3, 4).tolist() == [[20, -1, -1, -1], [20, 21, -1, -1], [20, 21, 22, -1]]
    assert md.prefill_swa_lens.tolist() == [1, 2, 3]
    # gather_len = q + min(P, W - 1) = 3 + min(0, 3)
    assert md.prefill_gather_lens.tolist() == [3]
    assert md.token_to_req_indices.tolist() == [0, 0, 1, 1, 1]


def test_causal_vector_reference_functions():
    b = spec5_batch()
    t2r = ref.token_to_req(b.query_start_loc, 5)
    valid = ref.valid_tokens(b.slot_mapping)
    idx, lens = ref.causal_window_rows(b.query_start_loc, b.seq_lens, b.block_table, t2r, valid,
                                       token_offset=0, num_rows=2, window_size=4, block_size=4)
    assert idx.view(2, 4).tolist() == [[29, 30, 31, 12], [30, 31, 12, 13]]
    assert lens.tolist() == [4, 4]


DSPARK_CONFIG = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=16,
                          max_num_seqs=4, num_speculative_tokens=2, speculative_method="dspark")


def test_dspark_width_rule():
    assert SWAConfig(window_size=128, num_speculative_tokens=7, speculative_method="dspark").noncausal_index_width == 192
    assert DSPARK_CONFIG.noncausal_index_width == 64


@pytest.mark.parametrize("backend", list(BACKEND_PLATFORMS))
def test_dspark_vector(backend):
    batch = AttentionBatch.from_lists([10], [3], [[2, 9, 6]], causal=False, block_size=4)
    md = make_builder(DSPARK_CONFIG, backend).build(batch)
    assert md.decode_swa_width == 64
    expected = [11, 36, 37, 38, 39, 24, 25] + [-1] * 57
    assert md.decode_swa_indices.shape == (3, 1, 64)
    assert md.decode_swa_indices.view(3, 64).tolist() == [expected] * 3
    assert md.decode_swa_lens.tolist() == [7, 7, 7]


def test_chunk_plan_vector():
    plan = prefill_chunk_plan([80, 96, 112, 128, 144], [4] * 5, window_size=64, max_model_len=1024,
                                  max_num_batched_tokens=128, compress_ratio=4, chunk_size=4)
    assert plan == [(0, 5, 36, 103)]


def test_chunk_plan_splits_when_the_area_is_exceeded():
    # area_max = 1 * (0 + 4 + 8) = 12; g = q + min(P, 3): [4+3, 2+3, 2+0] -> [7, 5, 2]
    plan = prefill_chunk_plan([10, 5, 2], [4, 2, 2], window_size=4, max_model_len=64,
                                  max_num_batched_tokens=8, compress_ratio=1, chunk_size=1)
    # 2 * 7 = 14 > 12 -> (0,1); then [5,2]: 2 * 5 = 10 <= 12 -> (1,3)
    assert plan == [(0, 1, 0, 7), (1, 3, 0, 5)]


def test_chunk_plan_from_metadata():
    cfg = SWAConfig(window_size=64, block_size=16, max_model_len=1024, max_num_batched_tokens=128, max_num_seqs=8)
    seqs = [80, 96, 112, 128, 144]
    table = [list(range(i * 10, i * 10 + 10)) for i in range(5)]
    md = make_builder(cfg, "torch").build(AttentionBatch.from_lists(seqs, [4] * 5, table, block_size=16))
    assert md.num_prefills == 5
    assert md.get_prefill_chunk_plan(4, 4) == [(0, 5, 36, 103)]


# -- docs/semantics.md #vision-spans: images that straddle the chunk, run past it, or are longer than M --------

def _vision(window, max_image_tokens):
    return SWAConfig(window_size=window, block_size=4, max_model_len=64, max_num_batched_tokens=32, max_num_seqs=4,
                     max_image_tokens=max_image_tokens)


# name: (config, seq_lens, query_lens, block table, spans, rows of every prefill token (entries before the -1
# padding), left_visible, right_visible, gather lens), copied from the vectors' tables.
SPAN_VECTORS = {
    "V7 prefix-cache hit inside an image": (
        _vision(4, 4), [16], [8], [[3, 1, 2, 5]], {0: [(7, 10)]},
        [[5, 6, 7, 8, 9, 10], [6, 7, 8, 9, 10], [7, 8, 9, 10], [8, 9, 10, 11], [9, 10, 11, 20], [10, 11, 20, 21],
         [11, 20, 21, 22], [20, 21, 22, 23]],
        [1, 2, 3, 0, 0, 0, 0, 0], [2, 1, 0, 0, 0, 0, 0, 0], [11],
    ),
    "V8 image began more than W - 1 before the chunk": (
        _vision(4, 8), [16], [6], [[3, 1, 2, 5]], {0: [(4, 11)]},
        [[4, 5, 6, 7, 8, 9, 10, 11], [4, 5, 6, 7, 8, 9, 10, 11], [9, 10, 11, 20], [10, 11, 20, 21],
         [11, 20, 21, 22], [20, 21, 22, 23]],
        [6, 7, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [9],
    ),
    "V9 two prefills, one straddling": (
        _vision(4, 4), [10, 9], [4, 3], [[3, 1, 2], [5, 6, 7]], {0: [(6, 8)], 1: [(4, 7)]},
        [[15, 4, 5, 6, 7, 8], [4, 5, 6, 7, 8], [5, 6, 7, 8], [6, 7, 8, 9], [23, 24, 25, 26, 27], [24, 25, 26, 27],
         [25, 26, 27, 28]],
        [0, 1, 2, 0, 2, 3, 0], [2, 1, 0, 0, 1, 0, 0], [7, 6],
    ),
    "V10 span longer than M": (
        _vision(4, 4), [12], [8], [[3, 1, 2]], {0: [(5, 10)]},
        [[13, 14, 15, 4], [14, 15, 4, 5, 6, 7, 8, 9], [15, 4, 5, 6, 7, 8, 9, 10], [4, 5, 6, 7, 8, 9, 10],
         [5, 6, 7, 8, 9, 10], [6, 7, 8, 9, 10], [7, 8, 9, 10], [8, 9, 10, 11]],
        [0, 0, 1, 2, 3, 3, 3, 0], [0, 4, 4, 3, 2, 1, 0, 0], [11],
    ),
    "V11 image goes on past the step": (
        _vision(4, 4), [12], [8], [[3, 1, 2]], {0: [(9, 14)]},
        [[13, 14, 15, 4], [14, 15, 4, 5], [15, 4, 5, 6], [4, 5, 6, 7], [5, 6, 7, 8], [6, 7, 8, 9, 10, 11],
         [7, 8, 9, 10, 11], [8, 9, 10, 11]],
        [0, 0, 0, 0, 0, 0, 1, 2], [0, 0, 0, 0, 0, 2, 1, 0], [11],
    ),
    "V12 row longer than its width": (
        _vision(2, 3), [8], [8], [[3, 1]], {0: [(0, 7)]},
        [[12, 13, 14, 15], [12, 13, 14, 15, 4], [12, 13, 14, 15, 4], [13, 14, 15, 4, 5], [14, 15, 4, 5, 6],
         [15, 4, 5, 6, 7], [4, 5, 6, 7], [5, 6, 7]],
        [0, 1, 2, 2, 2, 2, 2, 2], [3, 3, 3, 3, 3, 2, 1, 0], [8],
    ),
}


def _span_batch(name):
    config, seqs, queries, table, spans = SPAN_VECTORS[name][:5]
    return config, AttentionBatch.from_lists(seqs, queries, table, block_size=4, image_spans=spans)


@pytest.mark.parametrize("backend", ["reference", "slow model", *BACKEND_PLATFORMS])
@pytest.mark.parametrize("name", list(SPAN_VECTORS))
def test_span_vectors(name, backend):
    from swa_hal.testing.plain_model import model
    from swa_hal.validation import validate_batch

    config, batch = _span_batch(name)
    want_rows, left, right, gather = SPAN_VECTORS[name][5:]
    width = config.window_size + config.max_image_tokens
    validate_batch(batch, config)  # a valid batch: the span's bounds are the image's, whatever they are
    if backend == "reference":
        got = ref.build_reference(config, batch)
        out = (got.prefill_indices, got.prefill_lens, got.prefill_left_visible, got.prefill_right_visible,
               got.prefill_gather_lens)
        rows = out[0].reshape(-1, width).tolist()
        lens, got_left, got_right, got_gather = (t.tolist() for t in out[1:])
    elif backend == "slow model":
        got = model(config, batch)
        rows, lens = got["prefill_indices"], got["prefill_lens"]
        got_left, got_right, got_gather = got["left_visible"], got["right_visible"], got["gather_lens"]
    else:
        builder = make_builder(config, backend)
        md = builder.build(batch, validate=True)
        rows = md.prefill_swa_indices.reshape(-1, width).tolist()
        lens, got_left, got_right, got_gather = (
            t.tolist() for t in (md.prefill_swa_lens, md.prefill_left_visible, md.prefill_right_visible,
                                 md.prefill_gather_lens))
        builder.check()  # a guarded build records nothing: none of these spans is malformed
    assert rows == [r + [-1] * (width - len(r)) for r in want_rows]
    assert lens == [len(r) for r in want_rows]
    assert (got_left, got_right, got_gather) == (left, right, gather)


def test_v8_rows_reach_below_the_gather_and_clipping_the_span_would_differ():
    # docs/semantics.md #vision-spans, vector V8: the gather covers positions S - gather_len = 7..15; the rows of
    # positions 10 and 11 start at 4, the image's start. The span clipped to the chunk gives other rows.
    config, batch = _span_batch("V8 image began more than W - 1 before the chunk")
    got = ref.build_reference(config, batch)
    gather_first = 16 - int(got.prefill_gather_lens[0])
    assert gather_first == 7 and got.prefill_indices[:2, 0, 0].tolist() == [4, 4]
    clipped = AttentionBatch.from_lists([16], [6], [[3, 1, 2, 5]], block_size=4, image_spans={0: [(10, 11)]})
    rows = ref.build_reference(config, clipped).prefill_indices.reshape(6, 12)[:2].tolist()
    assert rows == [[7, 8, 9, 10, 11] + [-1] * 7, [8, 9, 10, 11] + [-1] * 8]
