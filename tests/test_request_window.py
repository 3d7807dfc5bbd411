"""Request-window layouts (docs/semantics.md #request-window-layouts): the worked vectors of the section on
every backend, the Triton backends' kernel (``kernels/request_window.py``, through the interpreter,
address-strict) against the torch build on random calls, the host preflight's typed errors, and the
syncing validation's rules. Equality with
SGLang's own ``window_layout`` (its torch path and its Triton op) is tests/engines/test_sglang.py's."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import BACKEND_PLATFORMS, TRITON_BACKENDS, make_builder, swept

from swa_hal import RequestWindowRows, SWAConfig
from swa_hal.torch_backend.request_window import build_request_window
from swa_hal.testing import address_strict
from swa_hal.errors import BatchCapacityError, BatchConsistencyError, BatchDtypeError, BatchRangeError, BatchShapeError

T, F = True, False


def config(window: int) -> SWAConfig:
    return SWAConfig(window_size=window, block_size=64, max_model_len=4096, max_num_batched_tokens=16, max_num_seqs=16)


def t(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


def check(got, want: dict) -> None:
    for name, value in want.items():
        have = getattr(got, name)
        if isinstance(value, int):
            assert have == value, name
            continue
        assert torch.equal(have, torch.tensor(value, dtype=have.dtype)), (name, have, value)


@pytest.mark.parametrize("backend", tuple(BACKEND_PLATFORMS))
@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
def test_worked_vector_1(backend, dtype):
    builder = make_builder(config(4), backend)
    rows = RequestWindowRows(
        t([3, 3, 3, 5], dtype), t([4, 5, 6, 0], dtype), zero_row=99, capacity=8, num_groups=3, padded_rows=6
    )
    got = builder.build_request_window(rows)
    check(
        got,
        dict(
            req=[3, 3, 3, 5, 0, 0],
            pos=[4, 5, 6, 0, 0, 0],
            write_loc=[12, 13, 14, 15, 16, 17],
            indices=[[12, 3, 2, 1], [13, 12, 3, 2], [14, 13, 12, 3], [15, -1, -1, -1], [-1] * 4, [-1] * 4],
            lengths=[4, 4, 4, 1, 0, 0],
            commit_mask=[T, T, T, T, F, F],
            history_req=[3] * 4 + [5] * 4 + [0] * 4,
            history_pos=[0, 1, 2, 3] + [-4, -3, -2, -1] * 2,
            history_loc=list(range(12)),
            history_valid=[T] * 4 + [F] * 8,
            history_src=[24, 25, 26, 27] + [99] * 8,
            size=18,
            runs=[2],
        ),
    )
    assert got.req.dtype == got.pos.dtype == got.history_src.dtype == torch.int64
    assert got.write_loc.dtype == got.indices.dtype == got.lengths.dtype == torch.int32


@pytest.mark.parametrize("backend", tuple(BACKEND_PLATFORMS))
def test_worked_vector_2(backend):
    builder = make_builder(config(4), backend)
    rows = RequestWindowRows(
        t([7, 7, 7, 7, 7, 2]), t([9, 10, 11, 12, 13, 3]), zero_row=50, capacity=4, floors=t([8, 8, 8, 8, 8, 2])
    )
    got = builder.build_request_window(rows)
    check(
        got,
        dict(
            write_loc=[24, 25, 26, 27, 28, 29],
            indices=[
                [24, 3, -1, -1],
                [25, 24, 3, -1],
                [26, 25, 24, 3],
                [27, 26, 25, 24],
                [28, 27, 26, 25],
                [29, 7, -1, -1],
            ],
            lengths=[2, 3, 4, 4, 4, 2],
            commit_mask=[F, T, T, T, T, T],
            history_req=[7] * 4 + [2] * 4 + [0] * 16,
            history_pos=[5, 6, 7, 8, -1, 0, 1, 2] + [-4, -3, -2, -1] * 4,
            history_valid=[F, F, F, T, F, F, F, T] + [F] * 16,
            history_src=[50, 50, 50, 28, 50, 50, 50, 10] + [50] * 16,
            size=30,
            runs=[2],
        ),
    )


def test_outputs_never_alias_the_inputs():
    builder = make_builder(config(4), "torch")
    req, pos = t([1, 1]), t([5, 6])
    got = builder.build_request_window(RequestWindowRows(req, pos, zero_row=0))
    got.req.fill_(9)
    got.pos.fill_(9)
    assert req.tolist() == [1, 1] and pos.tolist() == [5, 6]


@pytest.mark.parametrize("backend", ("torch", "cuda"))
@pytest.mark.parametrize("window, padded", ((4, 6), (5, 7), (3, 1)))
def test_each_field_is_its_own_memory(backend, window, padded):
    """The twelve fields are new per call (the Triton backends cut them from one allocation): each has its
    dtype and shape, is contiguous, and writing one changes no other. Odd windows and row counts leave
    the int32 and bool parts ending mid-word."""
    builder = make_builder(config(window), backend)
    rows = RequestWindowRows(t([3, 3, 5]), t([4, 5, 0]), zero_row=99, capacity=8, num_groups=3, padded_rows=padded)
    got = builder.build_request_window(rows)
    n, history = max(3, padded), 3 * window
    shapes = dict(
        req=(n,),
        pos=(n,),
        write_loc=(n,),
        indices=(n, window),
        lengths=(n,),
        commit_mask=(n,),
        history_req=(history,),
        history_pos=(history,),
        history_loc=(history,),
        history_valid=(history,),
        history_src=(history,),
        runs=(1,),
    )
    for name, shape in shapes.items():
        field = getattr(got, name)
        assert tuple(field.shape) == shape and field.is_contiguous(), (name, tuple(field.shape), shape)
    before = {name: getattr(got, name).clone() for name in shapes}
    for name in shapes:
        field = getattr(got, name)
        field.fill_(True) if field.dtype == torch.bool else field.fill_(-7)
        for other in shapes:
            if other != name:
                assert torch.equal(getattr(got, other), before[other]), f"writing {name} changed {other}"
        field.copy_(before[name])


# Every shape a layout takes, as (req, pos, num_groups, padded_rows): one group holding one row (a
# decode of one request, the shape whose history rows once came out as a stride-0 view), one decode row
# of several groups, one group of several rows, several groups and runs, spare groups, and padding.
LAYOUT_SHAPES = {
    "one_group_one_row": ([1], [20], None, None),
    "one_decode_row_spare_groups": ([1], [20], 3, None),
    "one_group_several_rows": ([2] * 5, [9, 10, 11, 12, 13], 1, None),
    "several_groups": ([1, 1, 2, 3], [5, 6, 0, 7], None, None),
    "several_runs_fewer_groups": ([1, 1, 2, 3], [5, 6, 0, 7], 3, None),
    "one_group_padded": ([4], [2], 1, 3),
    "several_groups_padded": ([1, 2], [8, 3], 2, 5),
}


@pytest.mark.parametrize("backend", swept(BACKEND_PLATFORMS))
@pytest.mark.parametrize("shape", tuple(LAYOUT_SHAPES))
def test_a_layout_is_refreshed_in_place(backend, shape):
    """A captured CUDA graph reads a layout's tensors by address, so SGLang refreshes the captured layout
    with ``WindowLayout.copy_`` from a new one of the same geometry. Every field of every layout shape, on
    every backend, takes that copy in place: the same address afterwards, the new values in it (a field
    whose elements share memory, an expanded view, refuses the copy)."""
    req, pos, groups, padded = LAYOUT_SHAPES[shape]
    builder = make_builder(config(3), backend)

    def layout(shift: int):
        rows = RequestWindowRows(
            t([r + shift for r in req]), t([p + shift for p in pos]), zero_row=70 + shift, capacity=12,
            num_groups=groups, padded_rows=padded,
        )
        return builder.build_request_window(rows)

    captured, fresh = layout(0), layout(2)
    assert captured.size == fresh.size
    names = [name for name in (*captured.FIELDS, "runs") if isinstance(getattr(captured, name), torch.Tensor)]
    assert len(names) == 12
    addresses = {name: getattr(captured, name).data_ptr() for name in names}
    for name in names:
        getattr(captured, name).copy_(getattr(fresh, name))
    for name in names:
        assert getattr(captured, name).data_ptr() == addresses[name], name
        assert torch.equal(getattr(captured, name), getattr(fresh, name)), name
    # The copy changed something: the two layouts differ in their requests, so the history rows' requests
    # (and the ring rows they copy from) are new values, not the captured ones left in place.
    assert not torch.equal(layout(0).history_req, captured.history_req)


def test_runs_past_the_groups_get_no_history():
    # Three runs, two groups: the third run's row reads its own query row (H + 2 = 10) and nothing before
    # it (SGLang's op points those entries at 2 * 4 + 3, 2 * 4 + 2, 2 * 4 + 1: rows that are not its history),
    # and no history group is its.
    builder = make_builder(config(4), "torch")
    got = builder.build_request_window(RequestWindowRows(t([1, 2, 3]), t([5, 5, 5]), zero_row=0, num_groups=2))
    assert got.runs.tolist() == [3]
    assert got.indices[2].tolist() == [10, -1, -1, -1] and got.lengths.tolist() == [4, 4, 1]
    assert got.history_req.tolist() == [1] * 4 + [2] * 4


@pytest.mark.parametrize(
    ("change", "error", "field"),
    [
        (dict(pos=t([], torch.int64), req=t([], torch.int64)), BatchShapeError, "pos"),
        (dict(req=t([1])), BatchShapeError, "req"),
        (dict(pos=t([1, 2], torch.int16)), BatchDtypeError, "pos"),
        (dict(req=t([[1, 1]])), BatchShapeError, "req"),
        (dict(floors=t([0])), BatchShapeError, "floors"),
        (dict(zero_row=-1), BatchRangeError, "zero_row"),
        (dict(capacity=0), BatchRangeError, "capacity"),
        (dict(capacity=True), BatchRangeError, "capacity"),
        (dict(num_groups=0), BatchRangeError, "num_groups"),
        (dict(padded_rows=-2), BatchRangeError, "padded_rows"),
        (dict(num_groups=2**30), BatchCapacityError, "num_groups"),
    ],
)
def test_preflight_names_the_field(change, error, field):
    builder = make_builder(config(4), "torch")
    base = dict(req=t([1, 1]), pos=t([3, 4]), zero_row=0)
    with pytest.raises(error) as info:
        builder.build_request_window(RequestWindowRows(**{**base, **change}))
    assert info.value.field == field


def test_validation_names_the_row():
    builder = make_builder(config(4), "torch", validate=True)
    with pytest.raises(BatchCapacityError) as info:
        builder.build_request_window(RequestWindowRows(t([1, 2, 1]), t([0, 0, 1]), zero_row=0, num_groups=2))
    assert (info.value.field, info.value.index) == ("req", 2)
    with pytest.raises(BatchConsistencyError) as info:
        builder.build_request_window(RequestWindowRows(t([1, 1, 1, 2]), t([3, 4, 6, 0]), zero_row=0))
    assert (info.value.field, info.value.index) == ("pos", 2)
    # Unvalidated builds read no value: the same rows build.
    plain = make_builder(config(4), "torch")
    assert plain.build_request_window(RequestWindowRows(t([1, 1, 1, 2]), t([3, 4, 6, 0]), zero_row=0)).size == 20


def random_rows(rng: random.Random, window: int = 1) -> RequestWindowRows:
    """Runs of one to a ring and more rows (so some rows do not commit), floors anywhere, the groups
    exact, spare, missing (fewer than the runs) or absent, padding or none, int32 or int64. The ring holds
    at least the window (a shorter one is refused)."""
    req, pos = [], []
    for _ in range(rng.randint(1, 5)):
        slot, first = rng.randint(0, 9), rng.randint(0, 500)
        count = rng.choice((1, rng.randint(1, 30), rng.randint(250, 300)))
        req += [slot] * count
        pos += range(first, first + count)
    n = len(req)
    dtype = rng.choice((torch.int32, torch.int64))
    runs = 1 + sum(req[k] != req[k - 1] for k in range(1, n))
    floors = torch.tensor([rng.randint(0, 600) for _ in range(n)], dtype=dtype) if rng.random() < 0.5 else None
    return RequestWindowRows(
        torch.tensor(req, dtype=dtype),
        torch.tensor(pos, dtype=dtype),
        zero_row=rng.randint(0, 5000),
        capacity=max(rng.choice((4, 16, 256)), window),
        floors=floors,
        num_groups=rng.choice((None, runs, max(1, runs - 1), runs + 3)),
        padded_rows=rng.choice((None, n + rng.randint(0, 7))),
    )


@pytest.mark.parametrize("backend", swept(TRITON_BACKENDS))
def test_kernel_equals_the_torch_build(backend):
    rng = random.Random(f"request-window-{backend}")
    for _ in range(12):
        window = rng.choice((4, 8, 16, 128))
        builder = make_builder(config(window), backend)
        rows = random_rows(rng, window)
        want = build_request_window(rows, window)
        # SM12x keeps every lane's address in bounds; the others every lane the mask leaves on.
        with address_strict(active_only=backend != "sm12x"):
            got = builder.build_request_window(rows)
        for name in (*want.FIELDS, "runs"):
            have, expected = getattr(got, name), getattr(want, name)
            if name == "size":
                assert have == expected
                continue
            assert have.dtype == expected.dtype and torch.equal(have, expected), (backend, name, rows)
