"""Token-slot rows (docs/semantics.md #token-slot-rows): every backend against a slow per-entry model on
random inputs (torch, and the Triton backends through the interpreter, SM12x address-strict), the guard's
rules by name, and the host checks. The worked vectors and guarded garbage are the conformance kit's
(``swa_hal/testing/slot_rows.py``, run for every built-in backend by test_conformance_builtin.py)."""

from __future__ import annotations

import contextlib
import random

import pytest
import torch
from helpers import BACKEND_PLATFORMS, fuzz_settings, make_builder, strictness, swept
from hypothesis import given, note
from hypothesis import strategies as st
from slot_row_models import assert_random_rows_equal_the_slow_model, slow_window

from swa_hal.errors import BatchCapacityError, BatchDtypeError, BatchRangeError, BatchShapeError, BlockGeometryError
from swa_hal.slot_ring import SlotRing
from swa_hal.slot_rows import SlotRows
from swa_hal.testing import random_slot_rows
from swa_hal.testing.slot_rows import slot_rows_config as config

BACKENDS = tuple(BACKEND_PLATFORMS)


def slow_rows(
    ends: list[int], pools: list[int], req_to_token: list[list[int]], slot_map: list[int], window: int, width: int,
    floors: list[int] | None = None, block: int = 0, block_slots: list[int] | None = None,
) -> tuple[list[list[int]], list[int]]:
    """The rows written out entry by entry, straight from the definition."""

    def cache_slot(token: int) -> int:
        return -1 if token == -1 else slot_map[token]

    rows, lens = [], []
    for i in range(len(ends)):
        pool, positions, head = slow_window(ends, pools, window, i, floors, block)
        entries = [cache_slot(req_to_token[pool][q]) for q in positions]
        if head is not None:  # the block's own slots, after its context
            assert block_slots is not None
            entries += [cache_slot(t) for t in block_slots[head : head + block]]
        rows.append(entries + [-1] * (width - len(entries)))
        lens.append(len(entries))
    return rows, lens


def random_call(rng: random.Random, window: int, dtype_rows: torch.dtype):
    """The kit's random call and the slow model's rows for it."""
    rows = random_slot_rows(rng, window, dtype_rows)

    def listed(t):
        return None if t is None else t.tolist()

    want = slow_rows(
        rows.row_ends.tolist(),
        rows.pools.tolist(),
        rows.req_to_token.tolist(),
        rows.slot_map.tolist(),
        window,
        rows.row_width(window),
        listed(rows.floors),
        rows.block,
        listed(rows.block_slots),
    )
    return rows, want


@pytest.mark.parametrize("backend", swept(BACKENDS))
def test_random_rows_equal_the_slow_model(backend):
    assert_random_rows_equal_the_slow_model(backend, f"slot-rows-{backend}", random_call)


@pytest.mark.parametrize("backend", BACKENDS)
def test_into_caller_tensors(backend):
    rng = random.Random(7)
    rows, (want_rows, want_lens) = random_call(rng, 20, torch.int32)
    n, width = rows.num_rows, rows.row_width(20)
    out = torch.full((n, width), 7, dtype=torch.int32)
    lens = torch.full((n,), 7, dtype=torch.int32)
    got = make_builder(config(20), backend).build_slot_rows(rows, out=out, lens=lens)
    assert got[0] is out and got[1] is lens
    assert out.tolist() == want_rows and lens.tolist() == want_lens


@pytest.mark.parametrize("backend", ("torch", "cuda"))
def test_new_outputs_are_separate_contiguous_tensors(backend):
    """Without ``out``/``lens`` a call returns new int32 [n, width] rows and [n] lens (one allocation on
    the Triton backends): contiguous, and writing one leaves the other as it was."""
    rows, (want_rows, want_lens) = random_call(random.Random(11), 20, torch.int64)
    n, width = rows.num_rows, rows.row_width(20)
    out, lens = make_builder(config(20), backend).build_slot_rows(rows)
    assert tuple(out.shape) == (n, width) and tuple(lens.shape) == (n,)
    assert out.dtype == lens.dtype == torch.int32 and out.is_contiguous() and lens.is_contiguous()
    lens.fill_(-9)
    assert out.tolist() == want_rows
    out.fill_(-9)
    assert lens.tolist() == [-9] * n


def _one_pool(window: int = 8):
    rt = torch.arange(32, dtype=torch.int32)[None, :]
    slot_map = torch.cat([torch.arange(1000, 1032), torch.tensor([-1])])
    return rt, slot_map


# One broken row among good ones: (what breaks it, the error type, a phrase of its message).
BROKEN = {
    "pool": (dict(pool=3), BatchRangeError, r"pools\[1\]=3 is not a row of req_to_token"),
    "position": (dict(end=40), BatchCapacityError, r"row 1's window reads position 39, past the table's width"),
    "token_slot": (dict(token=77), BatchRangeError, r"row 1's window reads token slot 77, outside \[-1, len"),
    "cache_slot": (dict(slot=-5), BatchRangeError, r"row 1's window reads cache slot -5, outside the cache"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_guard_empties_the_broken_row_and_check_names_it(backend, rule):
    change, error, message = BROKEN[rule]
    rt, slot_map = _one_pool()
    rt = rt.clone()
    slot_map = slot_map.clone()
    ends = torch.tensor([10, change.get("end", 12), 14], dtype=torch.int32)
    pools = torch.tensor([0, change.get("pool", 0), 0], dtype=torch.int64)
    if "token" in change:
        rt[0, 11] = change["token"]  # read by row 1 only (rows 0 and 2 see positions <= 9 and >= 6 ...)
        ends[2] = 11  # row 2 reads positions 3..10: not 11
    if "slot" in change:
        slot_map[11] = change["slot"]
        ends[2] = 11
    rows = SlotRows(row_ends=ends, pools=pools, req_to_token=rt, slot_map=slot_map, width=8)
    builder = make_builder(config(8), backend)
    with strictness(backend):
        out, lens = builder.build_slot_rows(rows)
    assert lens[1].item() == 0 and out[1].tolist() == [-1] * 8
    assert lens[0].item() == 8 and lens[2].item() == 8
    assert out[0].tolist() == [1009 - c for c in range(8)]
    with pytest.raises(error, match=message):
        builder.check()
    builder.check()  # the record was cleared


@pytest.mark.parametrize("backend", BACKENDS)
def test_unguarded_rows_trust_the_input(backend):
    rt, slot_map = _one_pool()
    rows = SlotRows(
        row_ends=torch.tensor([10], dtype=torch.int32),
        pools=torch.tensor([0], dtype=torch.int64),
        req_to_token=rt,
        slot_map=torch.where(slot_map >= 0, -5, slot_map),
        width=8,
    )
    builder = make_builder(config(8), backend, guard=False)
    out, lens = builder.build_slot_rows(rows)
    assert lens.tolist() == [8] and out[0].tolist() == [-5] * 8
    builder.check()


@pytest.mark.parametrize("backend", tuple(BACKEND_PLATFORMS))
@pytest.mark.parametrize("ring", (False, True))
def test_dspark_rows_not_a_multiple_of_the_block_raise_an_assertion_error_naming_the_field(backend, ring):
    """Five DSpark rows in blocks of 4: SGLang's own ops assert this geometry (``num_q % block_size == 0``),
    so its callers catch an ``AssertionError``; swa_hal's error is one too, and still names the field."""
    builder = make_builder(config(8), backend)
    ends = torch.arange(3, 8, dtype=torch.int32)
    pools = torch.zeros(5, dtype=torch.int64)
    if ring:
        rows = SlotRows(row_ends=ends, pools=pools, block=4, width=12, ring=SlotRing(size=12, slots=1))
    else:
        rt, slot_map = _one_pool()
        rows = SlotRows(
            row_ends=ends, pools=pools, req_to_token=rt, slot_map=slot_map, block=4,
            block_slots=torch.zeros(5, dtype=torch.int64),
        )
    with pytest.raises(AssertionError, match="row_ends has 5 rows, not a multiple of the DSpark block size 4") as err:
        builder.build_slot_rows(rows)
    assert isinstance(err.value, BlockGeometryError) and isinstance(err.value, BatchShapeError)
    assert err.value.field == "row_ends"


def test_host_checks_name_the_field():
    builder = make_builder(config(8), "torch")
    rt, slot_map = _one_pool()
    good = dict(
        row_ends=torch.tensor([3, 4], dtype=torch.int32),
        pools=torch.tensor([0, 0], dtype=torch.int64),
        req_to_token=rt,
        slot_map=slot_map,
    )
    with pytest.raises(BatchDtypeError, match="row_ends has dtype torch.float32"):
        builder.build_slot_rows(SlotRows(**{**good, "row_ends": torch.tensor([3.0, 4.0])}))
    with pytest.raises(BatchShapeError, match="pools has 1 rows; row_ends has 2"):
        builder.build_slot_rows(SlotRows(**{**good, "pools": torch.tensor([0])}))
    with pytest.raises(BatchShapeError, match="not a multiple of the DSpark block size 3"):
        builder.build_slot_rows(SlotRows(**good, block=3, block_slots=torch.zeros(2, dtype=torch.int64)))
    with pytest.raises(BatchShapeError, match="block_slots is required"):
        builder.build_slot_rows(SlotRows(**good, block=2))
    with pytest.raises(BatchCapacityError, match="width=9 is narrower than a row can be \\(10"):
        builder.build_slot_rows(SlotRows(**good, block=2, block_slots=torch.zeros(2, dtype=torch.int64), width=9))
    with pytest.raises(BatchShapeError, match="req_to_token must have unit stride"):
        builder.build_slot_rows(SlotRows(**{**good, "req_to_token": torch.zeros((2, 8), dtype=torch.int32)[:, ::2]}))
    with pytest.raises(BatchShapeError, match="DSpark floors are per pool row"):
        builder.build_slot_rows(
            SlotRows(**good, block=2, block_slots=torch.zeros(2, dtype=torch.int64), floors=torch.zeros(0, dtype=torch.int64))
        )
    with pytest.raises(BatchShapeError, match=r"out must be contiguous with shape \(2, 8\)"):
        builder.build_slot_rows(SlotRows(**good), out=torch.zeros((2, 9), dtype=torch.int32))


# -- fuzzing the default path ------------------------------------------------------------------------------

FUZZ_WINDOW = 6
FUZZ_BLOCKS = 40  # the cache of the fuzz config: slots [0, 40 * 64)


@st.composite
def malformed_slot_rows(draw):
    """Calls that pass the host preflight (shapes, dtypes) with garbage values: positions past the table and
    below 0, pool rows outside it, token slots outside the map, cache slots outside the cache, floors
    anywhere, DSpark blocks of 1-3."""
    block = draw(st.sampled_from((0, 0, 1, 2, 3)))
    n = draw(st.integers(1, 6)) * max(block, 1)
    pools, positions = draw(st.integers(1, 3)), draw(st.integers(1, 20))
    map_len = draw(st.integers(1, 40))
    limit = FUZZ_BLOCKS * 64

    def ints(lo, hi, size):
        return draw(st.lists(st.integers(lo, hi), min_size=size, max_size=size))

    return SlotRows(
        row_ends=torch.tensor(ints(-4, positions + 4, n), dtype=torch.int32),
        pools=torch.tensor(ints(-2, pools + 1, n), dtype=torch.int64),
        req_to_token=torch.tensor([ints(-3, map_len + 3, positions) for _ in range(pools)], dtype=torch.int32),
        slot_map=torch.tensor(ints(-3, limit + 50, map_len), dtype=torch.int64),
        floors=torch.tensor(ints(-3, positions + 3, max(n, pools)), dtype=torch.int32) if draw(st.booleans()) else None,
        block=block,
        block_slots=torch.tensor(ints(-3, map_len + 3, n), dtype=torch.int64) if block else None,
        width=FUZZ_WINDOW + block + draw(st.integers(0, 3)),
    )


SLOT_BUILDERS: dict[str, object] = {}


@fuzz_settings()
@given(rows=malformed_slot_rows(), backend=st.sampled_from(BACKENDS))
def test_fuzz_malformed_slot_rows_on_the_default_path(rows, backend):
    """Guarded (the default): whatever the values, every entry is -1 or a slot of the cache, lens stay in
    [0, W + N] with -1 past them, and every lane stays inside its tensor (all lanes on SM12x)."""
    builder = SLOT_BUILDERS.get(backend) or SLOT_BUILDERS.setdefault(
        backend, make_builder(config(FUZZ_WINDOW, num_kv_blocks=FUZZ_BLOCKS), backend)
    )
    note(f"backend={backend} rows={rows}")
    with strictness(backend):
        out, lens = builder.build_slot_rows(rows)
    assert bool(((out == -1) | ((out >= 0) & (out < FUZZ_BLOCKS * 64))).all())
    assert bool(((lens >= 0) & (lens <= FUZZ_WINDOW + rows.block)).all())
    past = torch.arange(out.shape[1])[None, :] >= lens[:, None]
    assert bool((out[past] == -1).all())
    with contextlib.suppress(BatchRangeError, BatchCapacityError):
        builder.check()
