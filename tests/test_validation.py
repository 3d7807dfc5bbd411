"""The bad-input catalogue: each kind raises its own exception type, naming field, index and constraint."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers import BACKEND_PLATFORMS, make_builder
from swa_hal import AttentionBatch, SWAConfig
from swa_hal import errors as E
from swa_hal.validation import validate_batch

CFG = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=32, max_num_seqs=4,
                num_speculative_tokens=1, speculative_method="mtp", num_kv_blocks=40)
DSPARK = dataclasses.replace(CFG, window_size=60, speculative_method="dspark", num_speculative_tokens=4,
                             max_model_len=256, num_kv_blocks=None)


def base() -> AttentionBatch:
    """Decode r0 (q=2), decode r1 (q=1), prefill r2 (q=5), then 2 padding rows: 10 token rows."""
    return AttentionBatch.from_lists([6, 3, 9], [2, 1, 5], [[7, 3, -1], [5, -1, -1], [10, 11, 12]],
                                     num_tokens=10, block_size=4)


def with_(batch: AttentionBatch, **changes) -> AttentionBatch:
    return dataclasses.replace(batch, **changes)


def setv(t: torch.Tensor, i, value) -> torch.Tensor:
    t = t.clone()
    t[i] = value
    return t


def meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


B = base()
CATALOGUE = [
    # kind, make the bad batch, config, exception type, message (regex)
    ("seq_lens dtype", lambda b: with_(b, seq_lens=b.seq_lens.long()), CFG, E.BatchDtypeError,
     r"^seq_lens has dtype torch.int64; expected torch.int32"),
    ("query_start_loc dtype", lambda b: with_(b, query_start_loc=b.query_start_loc.long()), CFG, E.BatchDtypeError,
     r"^query_start_loc has dtype torch.int64"),
    ("block_table dtype", lambda b: with_(b, block_table=b.block_table.long()), CFG, E.BatchDtypeError,
     r"^block_table has dtype torch.int64"),
    ("slot_mapping dtype", lambda b: with_(b, slot_mapping=b.slot_mapping.int()), CFG, E.BatchDtypeError,
     r"^slot_mapping has dtype torch.int32; expected torch.int64"),
    ("not a tensor", lambda b: with_(b, seq_lens=[6, 3, 9]), CFG, E.BatchDtypeError,
     r"^seq_lens must be a torch.Tensor, got list"),
    ("host copy on a device", lambda b: with_(b, query_start_loc_cpu=meta(b.query_start_loc_cpu)), CFG,
     E.BatchDeviceError, r"^query_start_loc_cpu is on meta; it is the host copy and must be on the CPU"),
    ("tensors on different devices", lambda b: with_(b, block_table=meta(b.block_table)), CFG, E.BatchDeviceError,
     r"^block_table is on meta but seq_lens is on cpu"),
    ("wrong rank", lambda b: with_(b, seq_lens=b.seq_lens[None, :]), CFG, E.BatchShapeError,
     r"^seq_lens has 2 dimensions \(1, 3\); expected 1"),
    ("query_start_loc length", lambda b: with_(b, query_start_loc=b.query_start_loc[:3]), CFG, E.BatchShapeError,
     r"^query_start_loc has 3 entries; query_start_loc_cpu has 4"),
    # R is the host offsets' request count, as on the default path (the preflight's message).
    ("host query_start_loc length", lambda b: with_(b, query_start_loc_cpu=b.query_start_loc_cpu[:2]), CFG,
     E.BatchShapeError, r"^query_start_loc has 4 entries; query_start_loc_cpu has 2"),
    ("seq_lens_cpu length", lambda b: with_(b, seq_lens_cpu=b.seq_lens_cpu[:2]), CFG, E.BatchShapeError,
     r"^seq_lens_cpu has 2 entries for 3 requests"),
    ("block_table rows", lambda b: with_(b, block_table=b.block_table[:2]), CFG, E.BatchShapeError,
     r"^block_table has 2 rows for 3 requests"),
    ("block_table strided pages", lambda b: with_(b, block_table=torch.zeros(3, 6, dtype=torch.int32)[:, ::2]), CFG,
     E.BatchShapeError, r"^block_table must be contiguous along its pages"),
    ("slot_mapping length", lambda b: with_(b, slot_mapping=b.slot_mapping[:9]), CFG, E.BatchShapeError,
     r"^slot_mapping has 9 entries; num_tokens is 10"),
    ("empty batch", lambda b: with_(b, seq_lens=b.seq_lens[:0], query_start_loc=b.query_start_loc[:1],
                                    query_start_loc_cpu=b.query_start_loc_cpu[:1], seq_lens_cpu=b.seq_lens_cpu[:0]),
     CFG, E.BatchShapeError, r"^query_start_loc_cpu has no request: the batch is empty"),
    ("no token rows", lambda b: with_(b, num_tokens=0, slot_mapping=b.slot_mapping[:0]), CFG, E.BatchShapeError,
     r"^num_tokens=0: the batch has no token rows"),
    ("more tokens than the buffers hold", lambda b: with_(b, num_tokens=40, slot_mapping=torch.full((40,), -1)), CFG,
     E.BatchCapacityError, r"^num_tokens=40 exceeds the builder's capacity \(max_num_batched_tokens=32\)"),
    ("more requests than max_num_seqs", lambda b: AttentionBatch.from_lists([1] * 5, [1] * 5, [[0]] * 5, block_size=4),
     CFG, E.BatchCapacityError, r"^seq_lens has 5 requests; max_num_seqs is 4"),
    ("max_query_len type", lambda b: with_(b, max_query_len=-1), CFG, E.BatchDtypeError,
     r"^max_query_len must be a non-negative int, got -1"),
    ("causal type", lambda b: with_(b, causal="no"), CFG, E.BatchDtypeError, r"^causal must be a bool, got 'no'"),
    ("host and device query_start_loc differ", lambda b: with_(b, query_start_loc=setv(b.query_start_loc, 2, 4)), CFG,
     E.BatchConsistencyError, r"^query_start_loc\[2\]=4 differs from its host copy query_start_loc_cpu\[2\]=3"),
    ("query_start_loc not starting at 0", lambda b: _qsl(b, [1, 2, 3, 8]), CFG, E.BatchOrderError,
     r"^query_start_loc\[0\]=1; it must start at 0"),
    ("query_start_loc decreasing", lambda b: _qsl(b, [0, 2, 1, 8]), CFG, E.BatchOrderError,
     r"^query_start_loc\[2\]=1 is smaller than query_start_loc\[1\]=2: it must be non-decreasing"),
    ("fewer rows than scheduled tokens", lambda b: with_(b, num_tokens=7, slot_mapping=b.slot_mapping[:7]), CFG,
     E.BatchRangeError, r"^num_tokens=7 is smaller than the 8 scheduled tokens"),
    ("max_query_len understated", lambda b: with_(b, max_query_len=2), CFG, E.BatchConsistencyError,
     r"^max_query_len=2 but request 2 has 5 query tokens"),
    ("negative seq_lens", lambda b: _seq(b, 1, -3), CFG, E.BatchRangeError, r"^seq_lens\[1\]=-3 is negative"),
    ("seq_lens shorter than the query", lambda b: _seq(b, 2, 4), CFG, E.BatchRangeError,
     r"^seq_lens\[2\]=4 is shorter than its query length 5"),
    ("seq_lens past max_model_len", lambda b: _seq(b, 0, 65), CFG, E.BatchCapacityError,
     r"^seq_lens\[0\]=65 exceeds max_model_len=64"),
    ("host seq_lens below the device's", lambda b: with_(b, seq_lens_cpu=setv(b.seq_lens_cpu, 0, 5)), CFG,
     E.BatchConsistencyError, r"^seq_lens_cpu\[0\]=5 is below seq_lens\[0\]=6; the host copy must be an upper bound"),
    ("host seq_lens inexact for a prefill", lambda b: with_(b, seq_lens_cpu=setv(b.seq_lens_cpu, 2, 10)), CFG,
     E.BatchConsistencyError, r"^seq_lens_cpu\[2\]=10 differs from seq_lens\[2\]=9; prefill rows must be exact"),
    ("causal=False without DSpark", lambda b: with_(b, causal=False), CFG, E.SpeculativeModeError,
     r"^causal=False is only legal with DSpark drafting; speculative_method='mtp'"),
    ("DSpark row wider than its width", lambda b: AttentionBatch.from_lists([70], [5], [list(range(18))],
                                                                             causal=False, block_size=4),
     DSPARK, E.SpeculativeModeError, r"seq_lens\[0\]=70: its DSpark row needs 65 entries, wider than the non-causal width 64"),
    ("block table too narrow", lambda b: with_(b, block_table=b.block_table[:, :2].contiguous()), CFG,
     E.BatchCapacityError, r"^block_table has 2 pages per row but request 2 \(seq_lens=9, block_size=4\) needs 3"),
    ("negative block id the window reads", lambda b: with_(b, block_table=setv(b.block_table, (0, 1), -1)), CFG,
     E.BatchRangeError, r"^block_table\[0, 1\]=-1 is negative but the window reads page 1"),
    ("block id past the cache", lambda b: with_(b, block_table=setv(b.block_table, (2, 0), 40)), CFG,
     E.BatchRangeError, r"^block_table\[2, 0\]=40 is past the cache's 40 pages"),
    ("int32 overflow of slot ids", lambda b: with_(b, block_table=setv(b.block_table, (2, 0), 2**30)),
     dataclasses.replace(CFG, num_kv_blocks=None), E.BatchRangeError,
     r"^block_table\[2, 0\]=1073741824 x block_size 4 overflows the int32 slot ids"),
    ("slot below -1", lambda b: with_(b, slot_mapping=setv(b.slot_mapping, 1, -5)), CFG, E.BatchRangeError,
     r"^slot_mapping\[1\]=-5; a slot is >= 0, or -1 for a padding token"),
    ("padding row with a slot", lambda b: with_(b, slot_mapping=setv(b.slot_mapping, 9, 3)), CFG,
     E.BatchConsistencyError, r"^slot_mapping\[9\]=3 but row 9 is past the 8 scheduled tokens; padding rows must be -1"),
    ("slot_mapping disagrees with the block table", lambda b: with_(b, slot_mapping=setv(b.slot_mapping, 0, 99)), CFG,
     E.BatchConsistencyError, r"^slot_mapping\[0\]=99 but block_table puts request 0 position 4 in slot 12"),
]


def _qsl(b, values):
    t = torch.tensor(values, dtype=torch.int32)
    return with_(b, query_start_loc=t, query_start_loc_cpu=t.clone(), max_query_len=8)


def _seq(b, r, value):
    return with_(b, seq_lens=setv(b.seq_lens, r, value), seq_lens_cpu=setv(b.seq_lens_cpu, r, value))


def test_the_catalogue_is_large_enough_and_the_base_batch_is_valid():
    assert len(CATALOGUE) >= 25 and len({c[0] for c in CATALOGUE}) == len(CATALOGUE)
    validate_batch(base(), CFG)
    md = make_builder(CFG, "torch").build(base(), validate=True)
    assert (md.num_decodes, md.num_prefills, md.num_prefill_tokens) == (2, 1, 7)


@pytest.mark.parametrize("kind, make, config, exc, message", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_bad_input_kind(kind, make, config, exc, message):
    bad = make(base())
    with pytest.raises(exc, match=message) as info:
        validate_batch(bad, config)
    assert type(info.value) is exc
    assert isinstance(info.value, E.BatchValidationError) and isinstance(info.value, ValueError)
    assert info.value.field and info.value.field.split("[")[0] in str(info.value)


@pytest.mark.parametrize("backend", list(BACKEND_PLATFORMS))
def test_builders_validate_on_request(backend):
    builder = make_builder(CFG, backend)
    for kind, make, config, exc, message in CATALOGUE:
        if config is not CFG or kind in ("host copy on a device", "tensors on different devices"):
            continue
        with pytest.raises(exc):
            builder.build(make(base()), validate=True)


def test_config_kinds_are_config_errors():
    for field, value in (("window_size", 0), ("block_size", -1), ("compress_ratios", (0, 3))):
        with pytest.raises(E.ConfigError, match=field):
            SWAConfig(**{field: value})
