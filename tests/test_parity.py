"""Bounded replay, DeepSeek-V4.1, vision spans and DSpark draft updates (docs/semantics.md #bounded-replay,
#vision-spans, #layer-types-and-schedulers, #draft-updates): hand-written vectors through the reference and
every backend, random batches that mix all of it, and the documented safe behaviour where engines are unsafe."""

from __future__ import annotations

import contextlib
import dataclasses
import random

import pytest
import torch

from helpers import BACKEND_PLATFORMS, make_builder, rotated
from swa_hal.testing.plain_model import model
from swa_hal import AttentionBatch, ImageSpans, SWAConfig
from swa_hal import errors as E
from swa_hal.metadata import prefill_chunk_plan
from swa_hal.reference import build_reference
from swa_hal.testing import compare_with_reference
from swa_hal.testing.batches import KINDS, random_batch
from swa_hal.testing.fixtures import cases
from swa_hal.testing.interpreter import address_strict
from swa_hal.validation import validate_batch

BACKENDS = list(BACKEND_PLATFORMS)

W4 = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=32, max_num_seqs=8)
W4_MTP = dataclasses.replace(W4, num_speculative_tokens=1, speculative_method="mtp")


def rows(t: torch.Tensor) -> list[list[int]]:
    return t.reshape(t.shape[0], t.shape[-1]).tolist()


def padded(values: list[int], width: int) -> list[int]:
    return values + [-1] * (width - len(values))


# -- worked vectors ---------------------------------------------------------------------------------

REPLAY_VECTOR = (
    # docs/semantics.md #bounded-replay: replay inside the window (decode), replay at the prefix (prefill)
    W4_MTP,
    lambda: AttentionBatch.from_lists([10, 9], [1, 3], [[7, 3, 2], [5, 6, 1]], block_size=4, replay_start=[8, 5]),
    {"decode": [[8, 9, -1, -1]], "decode_lens": [2],
     "prefill": [[25, 26, -1, -1], [25, 26, 27, -1], [25, 26, 27, 4]], "prefill_lens": [2, 3, 4], "gather": [4]},
)
REPLAY_AT_PREFIX = (
    # replay_start == prefix: the window starts at the first new token.
    W4,
    lambda: AttentionBatch.from_lists([7, 5], [1, 3], [[2, 5], [9, 4]], block_size=4, replay_start=[6, 2]),
    {"decode": [[22, -1, -1, -1]], "decode_lens": [1],
     "prefill": [[38, -1, -1, -1], [38, 39, -1, -1], [38, 39, 16, -1]], "prefill_lens": [1, 2, 3], "gather": [3]},
)


@pytest.mark.parametrize("backend", ["reference", *BACKENDS])
@pytest.mark.parametrize("vector", [REPLAY_VECTOR, REPLAY_AT_PREFIX], ids=["inside-window", "at-prefix"])
def test_replay_vectors(vector, backend):
    config, make, want = vector
    batch = make()
    if backend == "reference":
        got = build_reference(config, batch)
        dec, dec_lens, pre, pre_lens, gather = (got.decode_indices, got.decode_lens, got.prefill_indices,
                                                got.prefill_lens, got.prefill_gather_lens)
    else:
        md = make_builder(config, backend).build(batch, validate=True)
        dec, dec_lens, pre, pre_lens, gather = (md.decode_swa_indices, md.decode_swa_lens, md.prefill_swa_indices,
                                                md.prefill_swa_lens, md.prefill_gather_lens)
        assert md.replay_start.tolist() == batch.replay_start.tolist()
    assert rows(dec) == want["decode"] and dec_lens.tolist() == want["decode_lens"]
    assert rows(pre) == want["prefill"] and pre_lens.tolist() == want["prefill_lens"]
    assert gather.tolist() == want["gather"]


VISION = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=32, max_num_seqs=8,
                   max_image_tokens=4)
# docs/semantics.md #vision-spans: one prefill of 8 tokens (positions 4..11), pages [3, 1, 2].
VISION_VECTORS = {
    "span-6-9": (
        VISION, {0: [(6, 9)]},
        [0, 0, 0, 1, 2, 3, 0, 0], [0, 0, 3, 2, 1, 0, 0, 0],
        [[13, 14, 15, 4], [14, 15, 4, 5], [15, 4, 5, 6, 7, 8, 9], [4, 5, 6, 7, 8, 9], [5, 6, 7, 8, 9],
         [6, 7, 8, 9], [7, 8, 9, 10], [8, 9, 10, 11]],
    ),
    # Overlapping spans: position 7 lies in both; the last one listed wins.
    "overlapping": (
        VISION, {0: [(5, 7), (7, 10)]},
        [0, 0, 1, 0, 1, 2, 3, 0], [0, 2, 1, 3, 2, 1, 0, 0],
        [[13, 14, 15, 4], [14, 15, 4, 5, 6, 7], [15, 4, 5, 6, 7], [4, 5, 6, 7, 8, 9, 10], [5, 6, 7, 8, 9, 10],
         [6, 7, 8, 9, 10], [7, 8, 9, 10], [8, 9, 10, 11]],
    ),
}


def vision_batch(spans):
    return AttentionBatch.from_lists([12], [8], [[3, 1, 2]], block_size=4, image_spans=spans)


@pytest.mark.parametrize("backend", ["reference", *BACKENDS])
@pytest.mark.parametrize("name", list(VISION_VECTORS))
def test_vision_vectors(name, backend):
    config, spans, left, right, want = VISION_VECTORS[name]
    batch = vision_batch(spans)
    width = config.window_size + config.max_image_tokens
    if backend == "reference":
        got = build_reference(config, batch)
        got_left, got_right, idx, lens = (got.prefill_left_visible, got.prefill_right_visible,
                                          got.prefill_indices, got.prefill_lens)
    else:
        md = make_builder(config, backend).build(batch, validate=True)
        got_left, got_right, idx, lens = (md.prefill_left_visible, md.prefill_right_visible,
                                          md.prefill_swa_indices, md.prefill_swa_lens)
    assert got_left.tolist() == left and got_right.tolist() == right
    assert rows(idx) == [padded(r, width) for r in want]
    assert lens.tolist() == [len(r) for r in want]


def test_span_longer_than_the_window_reaches_past_the_window_edge():
    # M = 5 > W = 2: a token deep inside its image sees back to the image's start (left > W - 1).
    config = SWAConfig(window_size=2, block_size=4, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=2,
                       max_image_tokens=5)
    batch = AttentionBatch.from_lists([8], [6], [[1, 3]], block_size=4, image_spans={0: [(2, 6)]})
    want = [[5, 6, 7, 12, 13, 14], [6, 7, 12, 13, 14], [6, 7, 12, 13, 14], [6, 7, 12, 13, 14], [6, 7, 12, 13, 14],
            [14, 15]]
    for backend in ["reference", *BACKENDS]:
        if backend == "reference":
            got = build_reference(config, batch)
            idx, lens = got.prefill_indices, got.prefill_lens
        else:
            md = make_builder(config, backend).build(batch, validate=True)
            idx, lens = md.prefill_swa_indices, md.prefill_swa_lens
        assert rows(idx) == [padded(r, 7) for r in want], backend
        assert lens.tolist() == [len(r) for r in want], backend


def test_prefill_rows_are_wide_without_spans_and_visibility_is_absent():
    md = make_builder(VISION, "torch").build(vision_batch(None))
    assert md.prefill_swa_indices.shape == (8, 1, 8)
    assert md.prefill_left_visible is None and md.prefill_right_visible is None
    # Decode rows stay W wide.
    assert make_builder(VISION, "torch").build(AttentionBatch.from_lists([5], [1], [[1, 2]], block_size=4)) \
        .decode_swa_indices.shape == (1, 1, 4)


def test_v41_ratio_one_chunk_plans():
    # docs/semantics.md #prefill-metadata: V4.1 ratio-1 layers have a full-length compressed cache.
    args = dict(window_size=64, max_model_len=1024, max_num_batched_tokens=128, compress_ratio=1, chunk_size=4)
    seqs, queries = [80, 96, 112, 128, 144], [4] * 5
    assert prefill_chunk_plan(seqs, queries, has_compressed=True, **args) == [(0, 5, 144, 211)]
    assert prefill_chunk_plan(seqs, queries, **args) == [(0, 5, 0, 67)]
    config = SWAConfig(window_size=64, block_size=16, max_model_len=1024, max_num_batched_tokens=128, max_num_seqs=8,
                       model_version="deepseek_v41", compress_ratios=(0, 1, 2))
    table = [[r * 10 + i for i in range(10)] for r in range(5)]
    md = make_builder(config, "torch").build(AttentionBatch.from_lists(seqs, queries, table, block_size=16))
    assert md.get_prefill_chunk_plan(1, 4, has_compressed=True) == [(0, 5, 144, 211)]
    assert md.get_prefill_chunk_plan(1, 4) == [(0, 5, 0, 67)]


@pytest.mark.parametrize("kwargs, field", [
    (dict(compress_ratio=0, chunk_size=4, has_compressed=True), "compress_ratio"),
    (dict(compress_ratio=4, chunk_size=0), "chunk_size"),
    (dict(compress_ratio=4, chunk_size=2.5), "chunk_size"),
])
def test_chunk_plan_arguments_are_checked(kwargs, field):
    with pytest.raises(E.ConfigError, match=f"^{field}: "):
        prefill_chunk_plan([8], [4], window_size=4, max_model_len=64, max_num_batched_tokens=16, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_scheduler_key_is_present_for_v41(backend):
    config = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=32, max_num_seqs=4,
                       model_version="deepseek_v41", compress_ratios=(0, 1, 2))
    md = make_builder(config, backend).build(AttentionBatch.from_lists([6], [1], [[1, 2]], block_size=4))
    assert set(md.tile_sched) == {"swaonly", "c4a", "c128a", "c1a", "c2a"}
    assert (md.tile_sched_c1a, md.tile_sched_c2a) == (None, None)  # no planner objects off CUDA


def test_max_decode_query_len_is_capped_by_the_threshold():
    config = dataclasses.replace(W4, num_speculative_tokens=2, speculative_method="mtp")
    md = make_builder(config, "torch").build(AttentionBatch.from_lists([9, 20], [2, 9], [[1, 2, 3], [4, 5, 6, 7, 8]],
                                                                       block_size=4))
    assert (md.max_decode_query_len, config.decode_threshold) == (3, 3)


# -- random batches mixing everything, every backend ------------------------------------------------------

PARITY_CONFIGS = {
    "v4_vision_mtp": SWAConfig(window_size=8, block_size=4, compress_ratios=(0, 4, 128), max_model_len=256,
                               max_num_batched_tokens=96, max_num_seqs=10, num_speculative_tokens=1,
                               speculative_method="mtp", max_image_tokens=12),
    "v41": SWAConfig(window_size=6, block_size=2, compress_ratios=(0, 1, 2), model_version="deepseek_v41",
                     max_model_len=200, max_num_batched_tokens=80, max_num_seqs=9),
    "v4_dspark": SWAConfig(window_size=7, block_size=3, max_model_len=300, max_num_batched_tokens=96, max_num_seqs=10,
                           num_speculative_tokens=5, speculative_method="dspark", max_image_tokens=3),
}


@pytest.mark.parametrize("config_name, kind", cases(PARITY_CONFIGS))
def test_reference_matches_the_slow_model_with_replay_and_spans(config_name, kind):
    config = PARITY_CONFIGS[config_name]
    rng = random.Random(f"parity-{config_name}-{kind}")
    for _ in range(4):
        batch = random_batch(config, rng, kind, replay=0.8, spans=1.0, departures=True)
        got, want = build_reference(config, batch), model(config, batch)
        assert rows(got.decode_indices) == want["decode_indices"]
        assert got.decode_lens.tolist() == want["decode_lens"]
        assert rows(got.prefill_indices) == want["prefill_indices"]
        assert got.prefill_lens.tolist() == want["prefill_lens"]
        gather = got.prefill_gather_lens.tolist() if got.prefill_gather_lens is not None else []
        assert gather == want["gather_lens"]
        left = got.prefill_left_visible.tolist() if got.prefill_left_visible is not None else None
        assert left == want["left_visible"]


@pytest.mark.parametrize("config_name, backend", rotated(PARITY_CONFIGS, BACKENDS))
def test_backends_equal_the_reference_with_replay_spans_and_draft_updates(config_name, backend):
    config = PARITY_CONFIGS[config_name]
    builder = make_builder(config, backend)
    rng = random.Random(f"{config_name}-{backend}")
    strict = address_strict() if backend == "sm12x" else None
    kinds = [k for k in KINDS if k != "dspark" or config.is_dspark]
    with strict if strict is not None else contextlib.nullcontext():
        for i in range(2 * len(kinds)):
            kind = kinds[i % len(kinds)]
            batch = random_batch(config, rng, kind, replay=0.7, spans=1.0, extra_pages=2, departures=True)
            validate_batch(batch, config)
            md = builder.build(batch)
            assert compare_with_reference(config, batch, md) == [], (kind, i)
            if md.num_decode_tokens and md.num_prefills == 0:
                # Three draft steps: the engine advances seq_lens in place; rows follow (replay kept).
                for step in range(3):
                    batch.seq_lens.add_(1)
                    batch.seq_lens_cpu.add_(1)
                    builder.update_draft_decode_metadata(md)
                    fresh = build_reference(config, batch)
                    assert torch.equal(md.decode_swa_lens, fresh.decode_lens), (kind, i, step)
                    assert torch.equal(md.decode_swa_indices, fresh.decode_indices), (kind, i, step)
                    assert torch.equal(md.token_to_req_indices[: md.num_decode_tokens],
                                       fresh.token_to_req[: md.num_decode_tokens])



@pytest.mark.parametrize("backend", BACKENDS)
def test_draft_update_recomputes_validity_and_owners_from_the_buffers(backend):
    # A replayed graph's padding differs from the batch it was captured with: the update rereads
    # slot_mapping and query_start_loc in place.
    builder = make_builder(W4_MTP, backend)
    batch = AttentionBatch.from_lists([5, 6], [1, 1], [[1, 2], [3, 4]], num_tokens=4, block_size=4)
    md = builder.build(batch)
    assert md.is_valid_token.tolist() == [True, True, False, False]
    batch.slot_mapping[2] = 9  # a third request now occupies row 2
    batch.query_start_loc[2] = 2
    builder.update_draft_decode_metadata(md)
    assert md.is_valid_token.tolist() == [True, True, True, False]
    assert md.token_to_req_indices.tolist() == [0, 1, 0, 0]


# -- safe behaviour where engines are unsafe ----------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_replay_past_a_position_never_gives_a_negative_length(backend):
    # Engines compute lens = p + 1 - replay_start, negative when the bound is past p. Validation
    # refuses such a bound; without validation every backend hands out an empty row instead.
    batch = AttentionBatch.from_lists([6, 9], [1, 4], [[1, 2], [3, 4, 5]], block_size=4, replay_start=[9, 8])
    with pytest.raises(E.BatchRangeError, match=r"^replay_start\[0\]=9 is past the prefix"):
        validate_batch(batch, W4)
    # Unguarded (guarded builds would empty the whole request and record it: tests/test_guard.py).
    md = make_builder(W4, backend, guard=False).build(batch, validate=False)
    assert md.decode_swa_lens.tolist() == [0]
    assert md.prefill_swa_lens.tolist() == [0, 0, 0, 1]
    assert rows(md.decode_swa_indices) == [[-1] * 4]
    assert md.prefill_gather_lens.tolist() == [4]


@pytest.mark.parametrize("backend", BACKENDS)
def test_dspark_rows_are_never_cut_silently(backend):
    # Engines truncate a DSpark row wider than the non-causal width; swa_hal empties it and records the error
    # (its width decided by the device seq_lens, docs/semantics.md #dspark-rows), or raises it when validating.
    config = SWAConfig(window_size=60, block_size=4, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=4,
                       num_speculative_tokens=4, speculative_method="dspark")
    batch = AttentionBatch.from_lists([100], [5], [list(range(25))], causal=False, block_size=4)
    builder = make_builder(config, backend)
    md = builder.build(batch, validate=False)
    assert md.decode_swa_lens.tolist() == [0] * 5 and (md.decode_swa_indices == -1).all()
    with pytest.raises(E.SpeculativeModeError, match="refusing to truncate"):
        builder.check()
    with pytest.raises(E.SpeculativeModeError, match="wider than the non-causal width"):
        builder.build(batch, validate=True)


def test_image_spans_csr_from_ranges_matches_from_lists():
    builder = make_builder(VISION, "torch")
    spans = builder.image_spans_from_ranges({1: [(3, 5), (6, 6)]}, num_reqs=3)
    assert spans.indptr.tolist() == [0, 0, 2, 2]
    assert spans.starts.tolist() == [3, 6] and spans.ends.tolist() == [5, 6]
    assert spans.indptr.data_ptr() == builder.buffers.span_indptr.data_ptr()  # fixed buffers
    direct = ImageSpans.from_ranges({1: [(3, 5), (6, 6)]}, 3)
    assert direct.starts.tolist() == spans.starts.tolist()


# -- the validation catalogue for the new fields ----------------------------------------------------------

def _replay(values):
    return lambda b: dataclasses.replace(b, replay_start=torch.tensor(values, dtype=torch.int32))


def _spans(indptr, starts, ends):
    t = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    return lambda b: dataclasses.replace(b, image_spans=ImageSpans(t(indptr), t(starts), t(ends)))


def base():
    """A decode (S=6, q=1) and a prefill (S=9, q=5, new positions 4..8)."""
    return AttentionBatch.from_lists([6, 9], [1, 5], [[1, 2], [3, 4, 5]], block_size=4)


NEW_CATALOGUE = [
    ("replay_start negative", _replay([-1, 0]), E.BatchRangeError, r"^replay_start\[0\]=-1 is negative"),
    ("replay_start past the prefix", _replay([0, 5]), E.BatchRangeError,
     r"^replay_start\[1\]=5 is past the prefix seq_lens\[1\] - query_len = 4"),
    ("replay_start dtype", lambda b: dataclasses.replace(b, replay_start=torch.zeros(2, dtype=torch.int64)),
     E.BatchDtypeError, r"^replay_start has dtype torch.int64"),
    ("replay_start too short", _replay([0]), E.BatchShapeError, r"^replay_start has 1 entries for 2 requests"),
    ("image span inverted", _spans([0, 0, 1], [7], [5]), E.BatchRangeError,
     r"^image_spans\[1\]: span 0 is inverted: start 7 > end 5"),
    ("image span at a negative position", _spans([0, 0, 1], [-2], [5]), E.BatchRangeError,
     r"^image_spans\[1\]: span 0 \[-2, 5\] starts at a negative position"),
    ("image span indptr decreasing", _spans([0, 1, 0], [4], [5]), E.BatchOrderError,
     r"^image_spans.indptr\[2\]=0 is smaller than image_spans.indptr\[1\]=1"),
    ("image span indptr past the spans", _spans([0, 0, 3], [4], [5]), E.BatchShapeError,
     r"^image_spans.indptr\[2\]=3 but there are 1 spans"),
]


@pytest.mark.parametrize("kind, make, exc, message", NEW_CATALOGUE, ids=[c[0] for c in NEW_CATALOGUE])
def test_bad_replay_and_span_input(kind, make, exc, message):
    validate_batch(base(), VISION)
    with pytest.raises(exc, match=message) as info:
        validate_batch(make(base()), VISION)
    assert type(info.value) is exc and info.value.field.split("[")[0].split(".")[0] in str(info.value)


# docs/semantics.md #vision-spans: a span is the engine's image, whole. Starting before the new tokens 4..8 (a
# prefix-cache hit inside the image), ending after them (a chunk that ends inside it) or longer than M = 4 is valid.
WELL_FORMED_SPANS = {
    "starts before the new tokens": ([2], [5]),
    "starts at position 0, long before the window": ([0], [6]),
    "ends after the new tokens": ([7], [12]),
    "longer than max_image_tokens": ([4], [8]),
    "all three": ([1], [20]),
    "outside the new tokens": ([0], [2]),
}


@pytest.mark.parametrize("name", list(WELL_FORMED_SPANS))
def test_spans_past_the_new_tokens_or_longer_than_m_are_valid(name):
    starts, ends = WELL_FORMED_SPANS[name]
    batch = _spans([0, 0, 1], starts, ends)(base())
    validate_batch(batch, VISION)
    builder = make_builder(VISION, "torch")
    md = builder.build(batch, validate=True)
    builder.check()  # nothing recorded: a guarded build empties no row
    assert int(md.prefill_swa_lens.min()) > 0
    # No row reaches past the request's last position, 8 (slot 20, page 5 of its table [3, 4, 5]).
    assert int(md.prefill_swa_indices.max()) <= 20


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_straddling_images_rows_read_pages_below_the_window_and_those_pages_are_checked(backend):
    # W=2, M=6, B=4; positions 8..12 of a 13-token request whose image 2..9 began before them. Position 8
    # (left = min(6, M - 1) = 5) reads back to position 3, on page 0, below its plain window (7..8, page 1).
    config = SWAConfig(window_size=2, block_size=4, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=2,
                       max_image_tokens=6)
    good = AttentionBatch.from_lists([13], [5], [[7, 4, 5, 6]], block_size=4, image_spans={0: [(2, 9)]})
    validate_batch(good, config)
    md = make_builder(config, backend).build(good, validate=True)
    assert rows(md.prefill_swa_indices)[0][:6] == [31, 16, 17, 18, 19, 20]  # positions 3..8
    # Page 0 holding a negative block id: validation names it, a guarded build empties the request's rows.
    bad = dataclasses.replace(good, block_table=torch.tensor([[-1, 4, 5, 6]], dtype=torch.int32))
    with pytest.raises(E.BatchRangeError, match=r"^block_table\[0, 0\]=-1 is negative but the window reads page 0"):
        validate_batch(bad, config)
    builder = make_builder(config, backend)
    md = builder.build(bad, validate=False)
    assert md.prefill_swa_lens.tolist()[0] == 0
    with pytest.raises(E.BatchRangeError, match="block id -1"):
        builder.check()


@pytest.mark.parametrize("values, field", [
    (dict(seq_lens=[6.9]), r"seq_lens\[0\]=6.9 is not an integer"),
    (dict(replay_start=[1.5]), r"replay_start\[0\]=1.5 is not an integer"),
    (dict(image_spans={0: [(4, "5")]}), r"image_spans\[0\]\[0\]='5' is not an integer"),
    (dict(image_spans={3: [(4, 5)]}), r"image_spans names request 3; the batch has 1"),
])
def test_from_lists_refuses_non_integral_numbers(values, field):
    kwargs = dict(seq_lens=[6], query_lens=[2], block_table=[[1, 2]], block_size=4)
    kwargs.update(values)
    with pytest.raises(E.BatchValidationError, match=field):
        AttentionBatch.from_lists(**kwargs)
    # Integral floats are integers.
    assert AttentionBatch.from_lists([6.0], [2], [[1, 2]], block_size=4).seq_lens.tolist() == [6]
