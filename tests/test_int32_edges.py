"""Builds at the int32 edges (docs/semantics.md #guarded-builds, "int32 edges"): lengths at INT32_MIN and
INT32_MAX, query lengths past int32, int64 token-slot inputs past int32, and valid windows on the last int32
page of a cache with large pages. Every quantity is a wrapped int32 somewhere in a kernel; the expected
values below follow from the rules (derived by hand in the comments), never from the code under test, and
every Triton backend is also compared with the torch backend bit for bit. Lanes are address-checked:
every lane on SM12x, every active lane elsewhere."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from helpers import BACKEND_PLATFORMS, TRITON_BACKENDS, assert_check_names, make_builder, swept
from test_guard import CFG as GUARD_CFG

from swa_hal import AttentionBatch, SWAConfig
from swa_hal import errors as E
from swa_hal.slot_rows import SlotRows
from swa_hal.testing.guarded import metadata_differences, recorded
from swa_hal.testing.interpreter import address_strict
from swa_hal.validation import validate_batch

BACKENDS = tuple(BACKEND_PLATFORMS)
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


_BUILDERS: dict[tuple[int, str, bool], object] = {}


def builder_for(config: SWAConfig, backend: str, guard: bool = True):
    """One builder per config, backend and guard, reused across the cases (a builder costs as much as a build
    through the interpreter); its record is cleared first (every case reads and clears it)."""
    found = _BUILDERS.get((id(config), backend, guard))
    if found is None:
        found = _BUILDERS.setdefault((id(config), backend, guard), make_builder(config, backend, guard=guard))
    recorded(found)
    return found


def strictness(backend: str):
    if backend == "torch":
        return contextlib.nullcontext()
    return address_strict(active_only=backend != "sm12x")


# -- lengths at the int32 edges ----------------------------------------------------------------------------

# test_guard's geometry: W=4, B=4, M=4 (prefill rows 8 wide), 16 pages in the cache.
CFG = GUARD_CFG
# Request 0: a decode, S=6, q=1, BT [1, 2]: p = 5, window 2..5, slots 1*4+2, 1*4+3, 2*4+0, 2*4+1.
DECODE_ROW = [6, 7, 8, 9]
# Request 1: a prefill, S=9, q=5, BT [3, 4, 5]: p = 4..8, each window p-3..p; slot(p) = BT[p // 4] * 4 + p % 4
# (positions 1..3 -> 13..15, 4..7 -> 16..19, 8 -> 20), each row padded to W + M = 8.
PREFILL_ROWS = [[13 + i + j for j in range(4)] + [-1] * 4 for i in range(5)]
# q + min(P, W - 1) = 5 + min(4, 3)
GATHER = 8
EMPTY_DECODE = [-1] * 4
EMPTY_PREFILL = [-1] * 8


def base(**kw) -> AttentionBatch:
    return AttentionBatch.from_lists([6, 9], [1, 5], [[1, 2], [3, 4, 5]], block_size=4, **kw)


def with_seq(seqs: list[int]) -> AttentionBatch:
    t = torch.tensor(seqs, dtype=torch.int32)
    return dataclasses.replace(base(), seq_lens=t, seq_lens_cpu=t.clone())


def with_device_qsl(qsl: list[int]) -> AttentionBatch:
    # The split reads the host copy (docs/semantics.md #split); the kernels and the guard read the device one.
    return dataclasses.replace(base(), query_start_loc=torch.tensor(qsl, dtype=torch.int32))


# name, batch, (decode rows, prefill rows, gather), the error check() raises (type, field)
LENGTH_EDGES = [
    # S - q = INT32_MIN - 1: below int32 (it wrapped to INT32_MAX): rule 2, S_r < q_r.
    ("decode seq_len INT32_MIN", lambda: with_seq([INT32_MIN, 9]), (False, True, GATHER), E.BatchRangeError, "seq_lens"),
    # A prefill: S - q = INT32_MIN - 2 (it wrapped to INT32_MAX - 1, a prefix with 5 rows inside int32).
    ("prefill seq_len INT32_MIN + 3", lambda: with_seq([6, INT32_MIN + 3]), (True, False, 0), E.BatchRangeError, "seq_lens"),
    # S = INT32_MAX is past max_model_len: rule 16, recorded before rule 5's page past the table's 2 pages (the
    # window's first page, (INT32_MAX - 4) // 4); a request rule that leaves the intact prefill's gather length.
    ("decode seq_len INT32_MAX", lambda: with_seq([INT32_MAX, 9]), (False, True, GATHER), E.BatchCapacityError, "seq_lens"),
    # q_0 = 1 - INT32_MIN = 2^31 + 1 > S_0 = 6: rule 2 (not rule 1: query_start_loc does not decrease).
    ("decode query past int32", lambda: with_device_qsl([INT32_MIN, 1, 6]), (False, True, GATHER), E.BatchRangeError, "seq_lens"),
    # rho = INT32_MAX is past P_r (rho - P_r is not computed): rule 3; the broken prefill gets gather length 0.
    ("prefill replay_start INT32_MAX", lambda: base(replay_start=[0, INT32_MAX]), (True, False, 0), E.BatchRangeError, "replay_start"),
]


@pytest.mark.parametrize("backend", swept(BACKENDS))
@pytest.mark.parametrize("name, make, want, exc, field", LENGTH_EDGES, ids=[e[0] for e in LENGTH_EDGES])
def test_a_length_at_an_int32_edge_is_recorded_and_its_rows_emptied(backend, name, make, want, exc, field):
    decode_ok, prefill_ok, gather = want
    batch = make()
    builder = builder_for(CFG, backend)
    with strictness(backend):
        md = builder.build(batch, validate=False)
    assert md.decode_swa_lens.tolist() == ([4] if decode_ok else [0])
    assert md.decode_swa_indices.view(1, -1).tolist() == [DECODE_ROW if decode_ok else EMPTY_DECODE]
    assert md.prefill_swa_lens.tolist() == ([4] * 5 if prefill_ok else [0] * 5)
    assert md.prefill_swa_indices.view(5, -1).tolist() == (PREFILL_ROWS if prefill_ok else [EMPTY_PREFILL] * 5)
    assert md.prefill_gather_lens.tolist() == [gather]
    with pytest.raises(exc) as checked:
        builder.check()
    assert checked.value.field == field
    if backend != "torch":
        ref = builder_for(CFG, "torch")
        assert metadata_differences(md, ref.build(batch, validate=False)) == []
        assert recorded(ref)


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_a_prefill_query_past_int32_gets_gather_length_0(backend):
    # One prefill, query_start_loc [INT32_MIN, 5] on the device: q = 5 - INT32_MIN = 2^31 + 5 > S = 9, rule 2.
    batch = AttentionBatch.from_lists([9], [5], [[3, 4, 5]], block_size=4)
    batch = dataclasses.replace(batch, query_start_loc=torch.tensor([INT32_MIN, 5], dtype=torch.int32))
    builder, ref = builder_for(CFG, backend), builder_for(CFG, "torch")
    with strictness(backend):
        md = builder.build(batch, validate=False)
    assert md.prefill_gather_lens.tolist() == [0] and md.prefill_swa_lens.tolist() == [0] * 5
    assert metadata_differences(md, ref.build(batch, validate=False)) == []
    assert_check_names("seq_lens", builder, ref)


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_image_visibility_of_a_wrapped_position_equals_the_reference(backend):
    """A broken prefill (S = INT32_MIN + 2: rule 2) whose positions wrap to near INT32_MAX, inside a span
    [INT32_MIN, INT32_MAX]: its rows are empty, and its visibility arrays (handed out for every row) are
    the reference's: p - a is past int32 there, so left = M - 1, never a wrapped negative."""
    batch = base(image_spans={1: [(0, 0)]})
    spans = dataclasses.replace(
        batch.image_spans,
        starts=torch.tensor([INT32_MIN], dtype=torch.int32),
        ends=torch.tensor([INT32_MAX], dtype=torch.int32),
    )
    t = torch.tensor([6, INT32_MIN + 2], dtype=torch.int32)
    batch = dataclasses.replace(batch, seq_lens=t, seq_lens_cpu=t.clone(), image_spans=spans)
    builder, ref = builder_for(CFG, backend), builder_for(CFG, "torch")
    with strictness(backend):
        md = builder.build(batch, validate=False)
    want = ref.build(batch, validate=False)
    assert md.prefill_swa_lens.tolist() == [0] * 5 and md.decode_swa_lens.tolist() == [4]
    # Token t of the prefill (1..5) has p = S - qsl[2] + t = INT32_MIN - 4 + t: tokens 1-3 wrapped to
    # INT32_MAX - 2 .. INT32_MAX, whose p - a is past int32 (left M - 1 = 3); tokens 4, 5 are at a, a + 1.
    assert want.prefill_left_visible.tolist() == [0, 3, 3, 3, 0, 1]
    assert metadata_differences(md, want) == []
    assert recorded(builder) and recorded(ref)


# -- the last int32 page ------------------------------------------------------------------------------------

B = 1 << 16
PAGES = (INT32_MAX + 1) // B  # 32768 pages of int32 positions; the last, 32767, holds [2^31 - B, 2^31 - 1]
# No num_kv_blocks: block ids in [0, 2^31 / B) (every slot fits int32); the longest sequence the config admits.
LARGE = SWAConfig(
    window_size=4,
    block_size=B,
    max_model_len=INT32_MAX - 5,  # + W + N = INT32_MAX
    max_num_batched_tokens=8,
    max_num_seqs=4,
    num_speculative_tokens=1,
    speculative_method="mtp",
)
S_EDGE = INT32_MAX - 5


def last_page_batch() -> AttentionBatch:
    """Three requests, valid (validate_batch passes):

    0, a decode, S = 2^31 - 6 on the identity table (BT[0, i] = i, slot = position): p = 2^31 - 7, window
       2^31 - 10 .. 2^31 - 7, all on page 32767, the last int32 page; no later page is read.
    1, a decode, S = 65537: p = 65536, window 65533 .. 65536 across pages 0 and 1, BT [32767, 5]: slots
       32767 * B + 65533 .. 32767 * B + 65535 (the last int32 slot, 2^31 - 1), then 5 * B.
    2, a prefill, S = 2^31 - 6, q = 3 (p = 2^31 - 9 .. 2^31 - 7, all on page 32767), BT[2, 32767] = 7, the
       table's last row (a read of page 32768 would leave the table).
    """
    identity = torch.arange(PAGES, dtype=torch.int32)
    table = torch.zeros((3, PAGES), dtype=torch.int32)
    table[0] = identity
    table[1, :2] = torch.tensor([PAGES - 1, 5])
    table[2, PAGES - 1] = 7
    return AttentionBatch.from_lists([S_EDGE, B + 1, S_EDGE], [1, 1, 3], table, block_size=B)


# Hand-derived: decode 0's slots are its positions; decode 1 as above.
LAST_PAGE_DECODE = [
    [INT32_MAX - 9 + j for j in range(4)],
    [INT32_MAX - 2, INT32_MAX - 1, INT32_MAX, 5 * B],
]
# Prefill row i: positions p - 3 .. p with p = 2^31 - 9 + i, offsets p % B = B - 9 + i - 3 + j on block 7.
LAST_PAGE_PREFILL = [[7 * B + B - 12 + i + j for j in range(4)] for i in range(3)]


@pytest.mark.parametrize("guard", [True, False], ids=["guarded", "unguarded"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_windows_on_the_last_int32_page_of_large_pages(backend, guard):
    batch = last_page_batch()
    validate_batch(batch, LARGE)
    builder = builder_for(LARGE, backend, guard)
    with strictness(backend):
        md = builder.build(batch, validate=False)
    assert md.decode_swa_lens.tolist() == [4, 4]
    assert md.decode_swa_indices.view(2, -1).tolist() == LAST_PAGE_DECODE
    assert md.prefill_swa_lens.tolist() == [4, 4, 4]
    assert md.prefill_swa_indices.view(3, -1).tolist() == LAST_PAGE_PREFILL
    # q + min(P, W - 1) = 3 + 3
    assert md.prefill_gather_lens.tolist() == [6]
    builder.check()  # nothing recorded
    assert builder.buffers.violation.tolist() == [0, 0, 0, 0, 0]


# -- int64 token-slot inputs past int32 ------------------------------------------------------------------------

SLOT_CFG = SWAConfig(
    window_size=4, block_size=64, max_model_len=4096, max_num_batched_tokens=16, max_num_seqs=16, num_kv_blocks=4
)
I64 = torch.int64
# Two pools of 10 positions: req_to_token[r, q] = 10 r + q, slot_map[s] = 100 + s.
RT = torch.arange(20, dtype=I64).view(2, 10)
SLOT_MAP = torch.arange(20, dtype=I64) + 100
# Row 1 of every causal call: ends 3 (p = 2) in pool 1: positions 2, 1, 0 -> token slots 12, 11, 10.
ROW1 = ([112, 111, 110, -1], 3)


def causal(end0, floor0=None, dtype=I64) -> SlotRows:
    floors = None if floor0 is None else torch.tensor([floor0, 0], dtype=I64)
    return SlotRows(torch.tensor([end0, 3], dtype=dtype), torch.tensor([0, 1], dtype=I64), RT, SLOT_MAP, floors)


def dspark(ends, floor0=None) -> SlotRows:
    floors = None if floor0 is None else torch.tensor([floor0, 0], dtype=I64)
    return SlotRows(
        torch.tensor(ends, dtype=I64),
        torch.tensor([0, 0], dtype=I64),
        RT,
        SLOT_MAP,
        floors,
        block=2,
        block_slots=torch.tensor([1, 2], dtype=I64),
    )


# name, call, (rows, lens), recorded: the error check() raises (None: nothing recorded)
SLOT_EDGES = [
    # p = 2^32 + 2 (truncated to int32 it is 2): the window reads position p past req_to_token's 10: rule 9.
    ("causal end 2^32 + 3", causal(2**32 + 3), ([-1] * 4, 0), E.BatchCapacityError),
    # p = 2^31 + 2 (truncated: negative, and p - W + 1 wraps): rule 9.
    ("causal end 2^31 + 3", causal(2**31 + 3), ([-1] * 4, 0), E.BatchCapacityError),
    # p = INT32_MIN - 1 < 0, in an int32 tensor: a row without entries, no rule broken.
    ("causal end INT32_MIN", causal(INT32_MIN, dtype=torch.int32), ([-1] * 4, 0), None),
    ("causal end INT32_MIN + 1", causal(INT32_MIN + 1, dtype=torch.int32), ([-1] * 4, 0), None),
    # p = 2 - 2^32 < 0 (truncated it is 2): no entries.
    ("causal end 3 - 2^32", causal(3 - 2**32), ([-1] * 4, 0), None),
    # p = 4, floor 2^32 + 1 > p: no entries (truncated the floor is 1: 4 entries).
    ("causal floor 2^32 + 1", causal(5, 2**32 + 1), ([-1] * 4, 0), None),
    # p = 7, floor 6 - 2^32 < p - 3: positions 7..4 of pool 0 -> slots 107..104 (truncated the floor is 6).
    ("causal floor 6 - 2^32", causal(8, 6 - 2**32), ([107, 106, 105, 104], 4), None),
]
DSPARK_EDGES = [
    # Prefix P = 2^31 - 2, floor INT32_MIN: ctx = min(P, W, P - floor) = 4 (P - floor is past int32), and
    # the context reads positions up to P - 1, past req_to_token's width: rule 9.
    ("dspark floor INT32_MIN", dspark([INT32_MAX, INT32_MAX], INT32_MIN), ([-1] * 6, 0), E.BatchCapacityError),
    # P = 2^32 + 2: ctx = 4, positions up to P - 1: rule 9.
    ("dspark end 2^32 + 3", dspark([2**32 + 3, 2**32 + 4]), ([-1] * 6, 0), E.BatchCapacityError),
    # P = 7, floor 2^32 + 1: ctx = max(P - floor, 0) = 0, only the block's own slots 1, 2 -> 101, 102.
    ("dspark floor 2^32 + 1", dspark([8, 9], 2**32 + 1), ([101, 102, -1, -1, -1, -1], 2), None),
    # P = 7, floor INT32_MIN (inside int32: a valid call): ctx = min(P, W, P - floor) = 4 although P - floor
    # is past int32: positions 3..6 of pool 0 -> 103..106, then the block's own 101, 102.
    ("dspark floor INT32_MIN, P = 7", dspark([8, 9], INT32_MIN), ([103, 104, 105, 106, 101, 102], 6), None),
]


def inside_int32(rows: SlotRows) -> bool:
    """Whether every row end, pool and floor is an int32 value (what an unguarded call takes)."""
    values = [rows.row_ends, rows.pools] + ([] if rows.floors is None else [rows.floors])
    return all(INT32_MIN <= int(v.min()) and int(v.max()) <= INT32_MAX for v in values)


# Calls with every value inside int32 that break no rule: valid, so an unguarded call gives the same rows.
UNGUARDED_EDGES = [(name, rows, [want, ROW1]) for name, rows, want, exc in SLOT_EDGES if exc is None]
UNGUARDED_EDGES += [(name, rows, [want, want]) for name, rows, want, exc in DSPARK_EDGES if exc is None]
UNGUARDED_EDGES = [e for e in UNGUARDED_EDGES if inside_int32(e[1])]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, rows, want, exc", SLOT_EDGES, ids=[e[0] for e in SLOT_EDGES])
def test_causal_token_slot_inputs_past_int32(backend, name, rows, want, exc):
    _check_slot_rows(backend, rows, [want, ROW1], exc)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, rows, want, exc", DSPARK_EDGES, ids=[e[0] for e in DSPARK_EDGES])
def test_dspark_token_slot_inputs_past_int32(backend, name, rows, want, exc):
    _check_slot_rows(backend, rows, [want, want], exc)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, rows, want", UNGUARDED_EDGES, ids=[e[0] for e in UNGUARDED_EDGES])
def test_unguarded_token_slot_rows_at_the_int32_edges(backend, name, rows, want):
    assert len(UNGUARDED_EDGES) == 3  # INT32_MIN and INT32_MIN + 1 row ends, the INT32_MIN DSpark floor
    _check_slot_rows(backend, rows, want, None, guard=False)


def _check_slot_rows(backend: str, rows: SlotRows, want: list[tuple[list[int], int]], exc, guard=True) -> None:
    builder = builder_for(SLOT_CFG, backend, guard)
    with strictness(backend):
        out, lens = builder.build_slot_rows(rows)
    assert out.tolist() == [r for r, _ in want]
    assert lens.tolist() == [n for _, n in want]
    if exc is None:
        assert builder.buffers.violation.tolist() == [0, 0, 0, 0, 0]
    else:
        with pytest.raises(exc) as checked:
            builder.check()
        assert checked.value.field == "req_to_token"


def test_a_req_to_token_too_wide_for_int32_positions_is_refused_before_any_launch():
    # 2^31 - 1 positions per pool row (never touched: the preflight reads the shape only, and the
    # allocation is virtual memory). The kernels' row ends are int32: one past the last position must fit.
    wide = torch.empty((1, INT32_MAX), dtype=torch.int32)
    rows = SlotRows(torch.tensor([3], dtype=I64), torch.tensor([0], dtype=I64), wide, SLOT_MAP)
    for backend in ("torch", "cuda"):
        with pytest.raises(E.BatchCapacityError, match=r"req_to_token has 2147483647 positions per pool row"):
            make_builder(SLOT_CFG, backend).build_slot_rows(rows)
    narrow = SlotRows(rows.row_ends, rows.pools, wide[:, : INT32_MAX - 1], SLOT_MAP)
    out, lens = make_builder(SLOT_CFG, "cuda", guard=False).build_slot_rows(
        dataclasses.replace(narrow, row_ends=torch.tensor([0], dtype=I64))
    )
    assert lens.tolist() == [0] and out.tolist() == [[-1] * 4]


# docs/semantics.md #guarded-builds, int32 edges: the kernels address block-table entries with int32
# offsets (req * row stride + page), so a table whose last request's row ends 2^31 entries or more from
# its start is refused before any launch, on every entry point that takes block tables. The tables here
# are meta tensors: their shapes and strides without the 12 GiB of memory (the preflight reads no value).
_FAR: list[torch.Tensor] = []


def _far_table(groups: int | None = None) -> torch.Tensor:
    """Rows 2^30 entries apart, the first 4 entries of each: 12 GiB of address space that is never
    touched (the host allocates pages on first write), made once; stacked groups share it (stride 0).
    Not meta tensors: a CPU builder refuses those before it looks at the reach."""
    if not _FAR:
        _FAR.append(torch.empty((3, 2**30), dtype=torch.int32))
    table = _FAR[0]
    if groups is not None:
        table = table.view(1, 3, 2**30).expand(groups, 3, 2**30)
    return table[..., :4]


def _three_requests() -> AttentionBatch:
    return AttentionBatch.from_lists([6, 7, 5], [1, 1, 1], [[1, 2], [3, 4], [5, 6]], block_size=4)


@pytest.mark.parametrize("backend", ("torch", "cuda"))
def test_a_block_table_reaching_past_int32_offsets_is_refused(backend):
    config = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=4,
                       num_kv_groups=2)
    builder = make_builder(config, backend)
    batch = _three_requests()
    # (3 - 1) * 2^30 + 4 entries: past 2^31 - 1.
    with pytest.raises(E.BatchCapacityError, match="reach past 2") as info:
        builder.build(dataclasses.replace(batch, block_table=_far_table()), validate=False)
    assert info.value.field == "block_table"
    tables, slots = [batch.block_table, _far_table()], [batch.slot_mapping, batch.slot_mapping.clone()]
    with pytest.raises(E.BatchCapacityError, match="reach past 2") as info:
        builder.build_groups(batch, tables, slots, validate=False)
    assert info.value.field == "block_tables[1]"
    with pytest.raises(E.BatchCapacityError, match="reach past 2") as info:
        builder.build_groups(batch, tables, torch.stack(slots), validate=False)
    assert info.value.field == "block_tables[1]"
    with pytest.raises(E.BatchCapacityError, match="reach past 2") as info:
        builder.build_groups(batch, _far_table(2), torch.stack(slots), validate=False)
    assert info.value.field == "block_tables"
    # One row less reaches 2^30 + 4 entries: built as usual (a table of real memory, the same rows).
    md = builder.build(batch, validate=False)
    assert md.num_decode_tokens == 3
