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
