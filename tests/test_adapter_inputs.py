"""Malformed inputs of the engine adapters are typed swa_hal errors naming the request, the range or the
setting: image ranges of an engine's metadata (BatchValidationError) and the SGLang adapter's settings
(ConfigError)."""

from __future__ import annotations


import pytest
import torch

from helpers import common_metadata
from swa_hal import AttentionBatch, ConfigError, SWAConfig, SWAMetadataBuilder
from swa_hal import errors as E
from swa_hal.integrations import EngineSWABuilder
from swa_hal.integrations.sglang import SGLangSWAIndices, adapter_for

VISION = SWAConfig(
    window_size=8, block_size=4, max_model_len=512, max_num_batched_tokens=96, max_num_seqs=12, max_image_tokens=4
)


def vision_step():
    """One decode, then a prefill of positions 8..15 (S = 16, q = 8): two requests."""
    return AttentionBatch.from_lists([5, 16], [1, 8], [[1, 2], [3, 4, 5, 6]], block_size=4)


# (ranges, error type, the message's start): each class of malformed image range.
BAD_RANGES = {
    "not a mapping": (
        [(9, 12)],
        E.BatchShapeError,
        "mm_req_doc_ranges must be a mapping {request: [(start, end), ...]}, got list",
    ),
    "spans not a list": ({1: 5}, E.BatchShapeError, "mm_req_doc_ranges[1]=5 is not a list of (start, end) pairs"),
    "a single number": ({1: [9]}, E.BatchShapeError, "mm_req_doc_ranges[1][0]=9 is not a (start, end) pair"),
    "one value": ({1: [(9,)]}, E.BatchShapeError, "mm_req_doc_ranges[1][0]=(9,) is not a (start, end) pair"),
    "three values": (
        {1: [(9, 10, 11)]},
        E.BatchShapeError,
        "mm_req_doc_ranges[1][0]=(9, 10, 11) is not a (start, end) pair",
    ),
    "a string": ({1: ["9-12"]}, E.BatchShapeError, "mm_req_doc_ranges[1][0]='9-12' is not a (start, end) pair"),
    "inverted": (
        {1: [(9, 12), (12, 9)]},
        E.BatchRangeError,
        "mm_req_doc_ranges[1][1]=(12, 9) is inverted: start 12 > end 9",
    ),
    "negative": ({1: [(-1, 9)]}, E.BatchRangeError, "mm_req_doc_ranges[1][0]=(-1, 9) starts at a negative position"),
    "string end": ({1: [(9, "12")]}, E.BatchDtypeError, "mm_req_doc_ranges[1][0]='12' is not an integer"),
    "fractional start": ({1: [(9.5, 12)]}, E.BatchDtypeError, "mm_req_doc_ranges[1][0]=9.5 is not an integer"),
    "bool end": ({1: [(9, True)]}, E.BatchDtypeError, "mm_req_doc_ranges[1][0]=True is not an integer"),
    "request past the batch": ({2: [(9, 12)]}, E.BatchRangeError, "mm_req_doc_ranges names request 2; the batch has 2"),
    "negative request": ({-1: [(9, 12)]}, E.BatchRangeError, "mm_req_doc_ranges names request -1; the batch has 2"),
    "string request": ({"1": [(9, 12)]}, E.BatchRangeError, "mm_req_doc_ranges names request '1'; the batch has 2"),
}


@pytest.mark.parametrize("ranges, error, message", list(BAD_RANGES.values()), ids=list(BAD_RANGES))
def test_malformed_image_ranges_of_an_engine_step_name_the_request_and_the_range(ranges, error, message):
    engine = EngineSWABuilder(VISION, "cpu", backend="torch")
    with pytest.raises(error) as info:
        engine.build(0, common_metadata(vision_step(), mm_req_doc_ranges=ranges))
    assert isinstance(info.value, E.BatchValidationError)
    assert str(info.value).startswith(message), str(info.value)


def test_well_formed_image_ranges_still_build():
    # The control for the cases above: the same step with a range over its new tokens builds.
    engine = EngineSWABuilder(VISION, "cpu", backend="torch")
    md = engine.build(0, common_metadata(vision_step(), mm_req_doc_ranges={1: [(9, 12)], 0: []}))
    assert md.prefill_left_visible.tolist()[1:] == [0, 0, 1, 2, 3, 0, 0, 0]


@pytest.mark.parametrize(
    "ranges, error, message",
    [
        ({0: [(3, 2)]}, E.BatchRangeError, "image_spans[0][0]=(3, 2) is inverted: start 3 > end 2"),
        ({0: [(-2, 2)]}, E.BatchRangeError, "image_spans[0][0]=(-2, 2) starts at a negative position"),
        ({0: [(1, 2, 3)]}, E.BatchShapeError, "image_spans[0][0]=(1, 2, 3) is not a (start, end) pair"),
        ({0: 7}, E.BatchShapeError, "image_spans[0]=7 is not a list of (start, end) pairs"),
        ([(1, 2)], E.BatchShapeError, "image_spans must be a mapping"),
    ],
    ids=["inverted", "negative", "three values", "spans not a list", "not a mapping"],
)
def test_the_builders_image_spans_from_ranges_checks_the_same(ranges, error, message):
    builder = SWAMetadataBuilder(VISION, backend="torch")
    with pytest.raises(error) as info:
        builder.image_spans_from_ranges(ranges, num_reqs=2)
    assert str(info.value).startswith(message), str(info.value)


# -- the SGLang adapter's settings -------------------------------------------------------------------------

BAD_SETTINGS = [0, -64, True, 1.5, "64", None]


def slot_inputs():
    """Two rows of pool row 0 at positions 4 and 5; slot p holds position p."""
    return dict(
        req_to_token=torch.arange(16, dtype=torch.int32).view(1, 16),
        full_to_swa=torch.arange(16, dtype=torch.int64),
        req_pool_indices_repeated=torch.zeros(2, dtype=torch.int32),
        seq_lens_casual=torch.tensor([5, 6], dtype=torch.int32),
    )


def test_the_sglang_adapter_builds_with_valid_settings():
    # The control for the cases below: window 4, rows aligned to 8.
    indices, lens = SGLangSWAIndices(4).causal(**slot_inputs(), page_index_aligned_size=8)
    assert indices.tolist() == [[4, 3, 2, 1, -1, -1, -1, -1], [5, 4, 3, 2, -1, -1, -1, -1]]
    assert lens.tolist() == [4, 4]


@pytest.mark.parametrize("value", BAD_SETTINGS, ids=repr)
def test_sglang_window_size(value):
    for make in (lambda: SGLangSWAIndices(value), lambda: adapter_for(torch.device("cpu"), value)):
        with pytest.raises(ConfigError) as info:
            make()
        assert str(info.value) == f"window_size: must be a positive integer, got {value!r}"


@pytest.mark.parametrize("value", BAD_SETTINGS, ids=repr)
@pytest.mark.parametrize("call", ["causal", "dspark"])
def test_sglang_page_index_aligned_size(value, call):
    adapter = SGLangSWAIndices(4)
    kw = slot_inputs()
    if call == "dspark":
        kw.update(out_loc=torch.tensor([6, 7], dtype=torch.int64), block_size=2)
    with pytest.raises(ConfigError) as info:
        getattr(adapter, call)(**kw, page_index_aligned_size=value)
    assert info.value.field == "page_index_aligned_size"
    assert str(info.value) == f"page_index_aligned_size: must be a positive integer, got {value!r}"


@pytest.mark.parametrize("value", BAD_SETTINGS, ids=repr)
def test_sglang_dspark_block_size(value):
    # 0 used to give causal rows silently: DSpark rows need a block.
    adapter = SGLangSWAIndices(4)
    with pytest.raises(ConfigError) as info:
        adapter.dspark(**slot_inputs(), out_loc=torch.tensor([6, 7], dtype=torch.int64), block_size=value)
    assert str(info.value) == f"block_size: must be a positive integer, got {value!r}"


def test_sglang_window_past_the_widest_row_is_refused_where_the_adapter_is_made():
    # A window no kernel row can hold is a ConfigError naming it up front, not at the first call.
    with pytest.raises(ConfigError, match=r"window_size: must be at most 1048576, got 2147483648"):
        SGLangSWAIndices(2**31)


def ring_inputs(**kw):
    """One DSpark block of 2 at prefix 5 in slot 1 of a 2-slot ring of 6 rows (window 4)."""
    return (
        dict(
            seq_lens_casual=torch.tensor([6, 7], dtype=torch.int32),
            req_pool_indices_repeated=torch.ones(2, dtype=torch.int64),
            valid_from=torch.zeros(2, dtype=torch.int64),
            ring_size=6,
            block_size=2,
            page_index_aligned_size=8,
        )
        | kw
    )


def test_the_sglang_ring_adapter_builds_with_valid_settings():
    # Context 1..4, then the block's 5 and 6 (6 % 6 = 0): slot 1's rows are 6 + q % 6.
    indices, lens = SGLangSWAIndices(4).dspark_ring(**ring_inputs())
    assert indices.tolist() == [[7, 8, 9, 10, 11, 6, -1, -1]] * 2 and lens.tolist() == [6, 6]
    indices, lens = SGLangSWAIndices(4).dspark_ring(**ring_inputs(valid_from=None, num_slots=2))
    assert lens.tolist() == [6, 6]


# num_slots=None is its default (valid_from's length), not a bad value.
RING_SETTINGS = [
    (name, value)
    for name in ("ring_size", "block_size", "num_slots", "page_index_aligned_size")
    for value in BAD_SETTINGS
    if (name, value) != ("num_slots", None)
]


@pytest.mark.parametrize("name, value", RING_SETTINGS, ids=repr)
def test_sglang_ring_settings(name, value):
    with pytest.raises(ConfigError) as info:
        SGLangSWAIndices(4).dspark_ring(**ring_inputs(**{name: value}))
    assert str(info.value) == f"{name}: must be a positive integer, got {value!r}"


def test_sglang_ring_needs_its_slot_count():
    with pytest.raises(ConfigError, match="num_slots: the ring's request slots are unknown"):
        SGLangSWAIndices(4).dspark_ring(**ring_inputs(valid_from=None))
