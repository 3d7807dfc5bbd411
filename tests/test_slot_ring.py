"""Ring rows (docs/semantics.md #ring-rows): every backend against a slow per-entry model written from the
definition (torch, and the Triton backends through the interpreter, SM12x address-strict), hand-derived
vectors (wrapping, floors, positions past int32), the guard's rule 12 by name and the host checks. The
section's worked vectors and the guarded-output comparison are the conformance kit's
(``SlotRowTests``, ``GuardedOutputTests``; test_conformance_builtin.py runs them for every backend)."""

from __future__ import annotations

import contextlib
import random

import pytest
import torch
from helpers import BACKEND_PLATFORMS, fuzz_settings, make_builder, strictness, swept
from hypothesis import given, note
from hypothesis import strategies as st
from slot_row_models import assert_random_rows_equal_the_slow_model, slow_window

from swa_hal import SlotRing, SlotRows
from swa_hal.errors import BatchCapacityError, BatchRangeError, BatchShapeError
from swa_hal.testing import random_ring_rows
from swa_hal.testing.slot_rows import slot_rows_config as config

BACKENDS = tuple(BACKEND_PLATFORMS)


def t(values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype)


def slow_ring_rows(ends, pools, size, window, width, floors=None, block=0):
    """The rows written out entry by entry, straight from the definition: the positions of each row's
    window, each at ring row ``slot * size + position % size``."""
    rows, lens = [], []
    for i in range(len(ends)):
        slot, positions, head = slow_window(ends, pools, window, i, floors, block)
        if head is not None:  # the block's own positions, after its context
            positions += range(ends[head] - 1, ends[head] - 1 + block)
        entries = [slot * size + q % size for q in positions]
        rows.append(entries + [-1] * (width - len(entries)))
        lens.append(len(entries))
    return rows, lens


def slow(rows: SlotRows, window: int):
    return slow_ring_rows(
        rows.row_ends.tolist(),
        rows.pools.tolist(),
        rows.ring.size,
        window,
        rows.row_width(window),
        None if rows.floors is None else rows.floors.tolist(),
        rows.block,
    )


def random_ring_call(rng: random.Random, window: int, row_dtype: torch.dtype):
    """The kit's random ring call and the slow model's rows for it."""
    rows = random_ring_rows(rng, window, row_dtype)
    return rows, slow(rows, window)


@pytest.mark.parametrize("backend", swept(BACKENDS))
def test_random_ring_rows_equal_the_slow_model(backend):
    assert_random_rows_equal_the_slow_model(backend, f"ring-rows-{backend}", random_ring_call)


# Hand-derived (W = 4, ring 3 slots x 6 rows; row r of slot s is s * 6 + q % 6).
HAND = [
    (
        "a full window that wraps past the ring's end: positions 7, 6, 5, 4 of slot 2",
        dict(row_ends=t([8]), pools=t([2])),
        [[12 + 1, 12 + 0, 12 + 5, 12 + 4]],
        [4],
    ),
    (
        "a short row, a padding row at position -1, a floor inside the window and one past the position",
        dict(row_ends=t([3, 0, 11, 5]), pools=t([0, 1, 1, 2]), floors=t([0, 0, 9, 7])),
        [[2, 1, 0, -1], [-1] * 4, [6 + 4, 6 + 3, -1, -1], [-1] * 4],
        [3, 0, 2, 0],
    ),
    (
        # 2^40 = 4 (mod 6), so position 2^40 + 2 sits at ring row 0 of its slot: int32 positions would not.
        "an int64 position past int32 keeps its exact ring row",
        dict(row_ends=t([2**40 + 3], torch.int64), pools=t([1], torch.int64)),
        [[6 + 0, 6 + 5, 6 + 4, 6 + 3]],
        [4],
    ),
    (
        "DSpark blocks of 2: the context then the block's own positions, the block wrapping (P = 11, "
        "valid_from 9: context 9, 10; block 11, 12); a block at prefix 0 has only its own positions",
        dict(row_ends=t([12, 13, 1, 2]), pools=t([0, 0, 2, 2]), floors=t([9, 0, 0], torch.int64), block=2),
        [[3, 4, 5, 0, -1, -1]] * 2 + [[12, 13, -1, -1, -1, -1]] * 2,
        [4, 4, 2, 2],
    ),
    (
        "DSpark: valid_from past the prefix leaves the block alone (the ring restarted at the block)",
        dict(row_ends=t([20, 21]), pools=t([1, 1]), floors=t([0, 50, 0], torch.int64), block=2),
        [[6 + 1, 6 + 2, -1, -1, -1, -1]] * 2,
        [2, 2],
    ),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", HAND, ids=[c[0][:40] for c in HAND])
def test_hand_derived_ring_rows(backend, case):
    _, fields, want_rows, want_lens = case
    block = fields.get("block", 0)
    rows = SlotRows(**fields, width=4 + block, ring=SlotRing(size=6, slots=3))
    with strictness(backend):
        out, lens = make_builder(config(4), backend).build_slot_rows(rows)
    assert lens.tolist() == want_lens
    assert out.tolist() == want_rows


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dspark_block_whose_last_position_is_past_int64_keeps_its_exact_rows(backend):
    """W = 4, N = 3, a ring of 7 rows: a block whose first row ends at INT64_MAX has prefix P = 2^63 - 2,
    context 4 and positions P - 4 ... P + 2 = 2^63 - 6 ... 2^63, the last one past int64. Worked by hand:
    2^3 = 1 (mod 7), so 2^63 = 1 and 2^63 - 6 = 2 (mod 7): ring rows 2, 3, 4, 5, 6, 0, 1. (The torch build
    once formed P + 2 in int64, which wraps; the native fuzz found it.)"""
    rows = SlotRows(
        row_ends=t([2**63 - 1, 5, 6], torch.int64), pools=t([0, 0, 0]), block=3, width=7, ring=SlotRing(size=7, slots=1)
    )
    with strictness(backend):
        out, lens = make_builder(config(4), backend).build_slot_rows(rows)
    assert lens.tolist() == [7, 7, 7]
    assert out.tolist() == [[2, 3, 4, 5, 6, 0, 1]] * 3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [3, -1, 2**40])
def test_guard_empties_a_row_outside_the_ring_and_check_names_it(backend, bad):
    """Rule 12: row 1's request slot is not one of the ring's 3; its neighbours are untouched, a row at a
    negative position with a bad slot reads nothing and breaks nothing."""
    rows = SlotRows(
        row_ends=t([10, 12, 14, 0], torch.int64),
        pools=t([0, bad, 2, 7], torch.int64),
        width=8,
        ring=SlotRing(size=8, slots=3),
    )
    builder = make_builder(config(8), backend)
    with strictness(backend):
        out, lens = builder.build_slot_rows(rows)
    assert lens.tolist() == [8, 0, 8, 0]
    assert out[1].tolist() == [-1] * 8 and out[3].tolist() == [-1] * 8
    assert out[0].tolist() == [(9 - c) % 8 for c in range(8)]
    assert out[2].tolist() == [16 + (13 - c) % 8 for c in range(8)]
    shown = min(bad, 2**31 - 1)  # the record is int32: values past it are saturated
    with pytest.raises(BatchRangeError, match=rf"pools\[1\]={shown} is not a request slot of the ring") as err:
        builder.check()
    assert err.value.field == "pools" and err.value.index == 1
    builder.check()  # the record was cleared


@pytest.mark.parametrize("backend", BACKENDS)
def test_unguarded_ring_rows_trust_the_input(backend):
    rows = SlotRows(row_ends=t([3]), pools=t([5]), width=4, ring=SlotRing(size=6, slots=3))
    builder = make_builder(config(4), backend, guard=False)
    out, lens = builder.build_slot_rows(rows)
    assert lens.tolist() == [3] and out.tolist() == [[32, 31, 30, -1]]  # slot 5 of a 3-slot ring, as asked
    builder.check()


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_into_caller_tensors(backend):
    rows = SlotRows(row_ends=t([8, 2]), pools=t([2, 0]), width=4, ring=SlotRing(size=6, slots=3))
    out = torch.full((2, 4), 7, dtype=torch.int32)
    lens = torch.full((2,), 7, dtype=torch.int32)
    got = make_builder(config(4), backend).build_slot_rows(rows, out=out, lens=lens)
    assert got[0] is out and got[1] is lens
    assert out.tolist() == [[13, 12, 17, 16], [1, 0, -1, -1]] and lens.tolist() == [4, 2]


def test_host_checks_name_the_field():
    builder = make_builder(config(8, num_kv_blocks=2), "torch")  # a cache of 128 slots
    good = dict(row_ends=t([3, 4]), pools=t([0, 0]), ring=SlotRing(size=8, slots=4))
    builder.build_slot_rows(SlotRows(**good))
    with pytest.raises(BatchCapacityError, match=r"ring.size=7 is shorter than a row's positions \(8: window 8"):
        builder.build_slot_rows(SlotRows(**{**good, "ring": SlotRing(size=7, slots=4)}))
    with pytest.raises(BatchCapacityError, match=r"ring.size=9 is shorter than a row's positions \(10: window 8 \+ block 2"):
        builder.build_slot_rows(SlotRows(**{**good, "ring": SlotRing(size=9, slots=4)}, block=2))
    with pytest.raises(BatchCapacityError, match=r"the ring's 17 slots x 8 rows reach past the cache's slots \[0, 128\)"):
        builder.build_slot_rows(SlotRows(**{**good, "ring": SlotRing(size=8, slots=17)}))
    with pytest.raises(BatchShapeError, match="ring.slots=0 must be a positive integer"):
        builder.build_slot_rows(SlotRows(**{**good, "ring": SlotRing(size=8, slots=0)}))
    with pytest.raises(BatchShapeError, match="ring.size=True must be a positive integer"):
        builder.build_slot_rows(SlotRows(**{**good, "ring": SlotRing(size=True, slots=1)}))
    with pytest.raises(BatchShapeError, match="ring must be a SlotRing, got int"):
        builder.build_slot_rows(SlotRows(**{**good, "ring": 8}))
    with pytest.raises(BatchShapeError, match="ring rows read no req_to_token"):
        builder.build_slot_rows(SlotRows(**good, req_to_token=torch.zeros((1, 8), dtype=torch.int32)))
    dspark = {**good, "ring": SlotRing(size=9, slots=4), "block": 1}
    builder.build_slot_rows(SlotRows(**dspark))
    with pytest.raises(BatchShapeError, match="ring rows read no block_slots"):
        builder.build_slot_rows(SlotRows(**dspark, block_slots=torch.zeros(2, dtype=torch.int64)))
    with pytest.raises(BatchShapeError, match=r"DSpark floors are per ring slot \(the ring has 4 slots\)"):
        builder.build_slot_rows(SlotRows(**dspark, floors=t([0, 0, 0])))
    with pytest.raises(BatchShapeError, match="req_to_token is required for token-slot rows without a ring"):
        builder.build_slot_rows(SlotRows(row_ends=t([3]), pools=t([0])))
    with pytest.raises(BatchShapeError, match="slot_map is required"):
        builder.build_slot_rows(SlotRows(row_ends=t([3]), pools=t([0]), req_to_token=torch.zeros((1, 8), dtype=torch.int32)))


# -- fuzzing the default path ------------------------------------------------------------------------------

FUZZ_WINDOW = 6


@st.composite
def malformed_ring_rows(draw):
    """Calls that pass the host preflight with garbage values: request slots outside the ring, row ends
    and floors anywhere in int64 (past int32 included), DSpark blocks of 1-3, rings of 1-4 slots."""
    block = draw(st.sampled_from((0, 0, 1, 2, 3)))
    n = draw(st.integers(1, 6)) * max(block, 1)
    slots = draw(st.integers(1, 4))
    size = FUZZ_WINDOW + block + draw(st.integers(0, 5))
    wide = st.one_of(st.integers(-4, 40), st.integers(-(2**63), 2**63 - 1))

    def ints(values, count):
        return torch.tensor(draw(st.lists(values, min_size=count, max_size=count)), dtype=torch.int64)

    return SlotRows(
        row_ends=ints(wide, n),
        pools=ints(st.integers(-2, slots + 1), n),
        floors=ints(wide, max(n, slots)) if draw(st.booleans()) else None,
        block=block,
        width=FUZZ_WINDOW + block + draw(st.integers(0, 3)),
        ring=SlotRing(size=size, slots=slots),
    )


RING_BUILDERS: dict[str, object] = {}


@fuzz_settings()
@given(rows=malformed_ring_rows(), backend=st.sampled_from(BACKENDS))
def test_fuzz_malformed_ring_rows_on_the_default_path(rows, backend):
    """Guarded (the default): whatever the values, every entry is -1 or a row of the ring, lens stay in
    [0, W + N] with -1 past them, the rows equal the slow model wherever the slot is inside the ring, and
    every lane stays inside its tensor (all lanes on SM12x)."""
    builder = RING_BUILDERS.get(backend) or RING_BUILDERS.setdefault(
        backend, make_builder(config(FUZZ_WINDOW), backend)
    )
    note(f"backend={backend} rows={rows}")
    with strictness(backend):
        out, lens = builder.build_slot_rows(rows)
    assert bool(((out == -1) | ((out >= 0) & (out < rows.ring.rows))).all())
    assert bool(((lens >= 0) & (lens <= FUZZ_WINDOW + rows.block)).all())
    past = torch.arange(out.shape[1])[None, :] >= lens[:, None]
    assert bool((out[past] == -1).all())
    want_rows, want_lens = slow(rows, FUZZ_WINDOW)
    heads = [i - i % rows.block if rows.block else i for i in range(rows.num_rows)]
    for i, head in enumerate(heads):
        if 0 <= rows.pools[head] < rows.ring.slots:
            assert (out[i].tolist(), lens[i].item()) == (want_rows[i], want_lens[i]), i
    with contextlib.suppress(BatchRangeError):
        builder.check()
