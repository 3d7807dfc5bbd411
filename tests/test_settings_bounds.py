"""Every setting is bounded on both sides where the kernels need it, by a typed error naming it at
construction or in the O(1) preflight, before any launch: the config's row widths and buffer offsets, the
request-window scalars (docs/semantics.md #request-window-layouts), the ring's size (#ring-rows), the
token-slot rows' block and width (#token-slot-rows), and the SGLang adapter's settings. Values at each
bound still build, alike on every backend. Devices no build can run on (meta tensors, host copies that are
not in host memory) are refused by name, and a setting's type is checked before any comparison with it."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from helpers import BACKEND_PLATFORMS, TRITON_BACKENDS, common_metadata, make_builder

from swa_hal import ConfigError, RequestWindowRows, SWAConfig, SWAMetadataBuilder
from swa_hal import errors as E
from swa_hal.integrations import EngineSWABuilder
from swa_hal.integrations import sglang as S
from swa_hal.scenarios import synthesize_batch
from swa_hal.slot_ring import SlotRing
from swa_hal.slot_rows import SlotRows
from swa_hal.torch_backend.request_window import build_request_window

BACKENDS = tuple(BACKEND_PLATFORMS)
MAX_ROW = 2**20
INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1


def small(**kw) -> SWAConfig:
    return SWAConfig(**{**dict(block_size=64, max_model_len=4096, max_num_batched_tokens=16, max_num_seqs=16), **kw})


def t(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


# -- SWAConfig ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        # A Triton program holds a whole row: past 2^20 entries every Triton backend failed inside the compiler.
        (dict(window_size=MAX_ROW + 1, max_num_batched_tokens=1), "window_size"),
        (dict(window_size=128, max_image_tokens=MAX_ROW, max_num_batched_tokens=1), "max_image_tokens"),
        (
            dict(
                window_size=MAX_ROW - 8,
                num_speculative_tokens=16,
                speculative_method="dspark",
                max_num_batched_tokens=1,
            ),
            "num_speculative_tokens",
        ),
        # The buffers' rows are stored at t * width in int32.
        (dict(window_size=128, max_num_batched_tokens=2**24 + 1), "max_num_batched_tokens"),
        (dict(window_size=64, max_image_tokens=64, max_num_batched_tokens=2**24 + 1), "max_num_batched_tokens"),
    ],
)
def test_config_row_widths_are_bounded_by_name(settings, field):
    with pytest.raises(ConfigError) as info:
        small(**settings)
    assert info.value.field == field


def test_config_at_the_bounds_is_accepted():
    assert small(window_size=MAX_ROW, max_num_batched_tokens=1).window_size == MAX_ROW
    assert small(window_size=128, max_num_batched_tokens=2**24).max_num_batched_tokens == 2**24
    assert small(window_size=64, max_image_tokens=MAX_ROW - 64, max_num_batched_tokens=1).prefill_index_width == MAX_ROW


# -- request-window layouts -----------------------------------------------------------------------------------

BASE = dict(req=t([1, 1, 1, 2]), pos=t([5, 6, 7, 0]), zero_row=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("change", "error", "field"),
    [
        # Past int64 the torch build raised an untyped error and the Triton backends wrapped the value.
        (dict(zero_row=2**63), E.BatchRangeError, "zero_row"),
        (dict(zero_row=2**64), E.BatchRangeError, "zero_row"),
        # Near 2^63 the kernel's commit test (row + capacity) wrapped: the backends disagreed.
        (dict(capacity=INT64_MAX), E.BatchRangeError, "capacity"),
        (dict(capacity=2**31), E.BatchRangeError, "capacity"),
        # A ring shorter than the window aliased a run's history positions.
        (dict(capacity=3), E.BatchCapacityError, "capacity"),
        (dict(num_groups=2**31), E.BatchRangeError, "num_groups"),
        (dict(num_groups=2**29), E.BatchCapacityError, "num_groups"),
        # The padding made the workspace too large: named, not num_groups.
        (dict(padded_rows=2**63), E.BatchRangeError, "padded_rows"),
        (dict(padded_rows=INT32_MAX), E.BatchCapacityError, "padded_rows"),
        # Types before values: numpy scalars passed the torch build and failed inside the Triton launch.
        (dict(zero_row=np.int64(5)), E.BatchRangeError, "zero_row"),
        (dict(capacity=np.int64(8)), E.BatchRangeError, "capacity"),
        (dict(capacity=8.0), E.BatchRangeError, "capacity"),
        (dict(num_groups=np.int32(2)), E.BatchRangeError, "num_groups"),
        (dict(padded_rows=6.0), E.BatchRangeError, "padded_rows"),
        (dict(zero_row=False), E.BatchRangeError, "zero_row"),
    ],
)
def test_request_window_settings_are_bounded_by_name(backend, change, error, field):
    builder = make_builder(small(window_size=4), backend)
    with pytest.raises(error) as info:
        builder.build_request_window(RequestWindowRows(**{**BASE, **change}))
    assert info.value.field == field
    assert field in str(info.value)


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_request_window_at_the_bounds_equals_the_torch_build(backend):
    builder = make_builder(small(window_size=4), backend)
    for change in (dict(zero_row=INT64_MAX), dict(capacity=INT32_MAX), dict(capacity=4)):
        rows = RequestWindowRows(**{**BASE, **change})
        got, want = builder.build_request_window(rows), build_request_window(rows, 4)
        for name in (*want.FIELDS, "runs"):
            have, expected = getattr(got, name), getattr(want, name)
            assert have == expected if name == "size" else torch.equal(have, expected), (change, name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_runs_past_the_groups_never_point_past_the_workspace(backend):
    # Out of contract (docs/semantics.md #request-window-layouts): three single-row runs, one group (H = 4,
    # size 7). SGLang's op gives run 2 the history indices g * W + W + (s - F) = 8 + 3, 8 + 2, ...: past the
    # workspace. swa_hal's runs past the groups read their own query rows only, on every backend. A
    # validated build refuses the call, naming the row that starts run 2.
    rows = RequestWindowRows(t([1, 2, 3]), t([5, 5, 5]), zero_row=0, num_groups=1)
    got = make_builder(small(window_size=4), backend).build_request_window(rows)
    assert got.size == 7 and got.runs.tolist() == [3]
    assert got.indices[1:].tolist() == [[5, -1, -1, -1], [6, -1, -1, -1]]
    assert got.lengths.tolist() == [4, 1, 1] and int(got.indices.max()) < got.size
    with pytest.raises(E.BatchCapacityError) as info:
        make_builder(small(window_size=4), backend, validate=True).build_request_window(rows)
    assert (info.value.field, info.value.index) == ("req", 1)


# -- ring rows ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_size_past_2_30_is_refused(backend):
    # The kernels step ring offsets in int32 up to 2 * size - 1: at 2^30 + 5 rows the Triton backends' causal
    # rows wrapped (negative ring rows) where the torch build's did not.
    builder = make_builder(small(window_size=4), backend)
    rows = SlotRows(t([2**30 + 4]), t([0]), ring=SlotRing(size=2**30 + 5, slots=1))
    with pytest.raises(E.BatchShapeError) as info:
        builder.build_slot_rows(rows)
    assert info.value.field == "ring" and "ring.size" in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_at_2_30_rows_builds_alike(backend):
    builder = make_builder(small(window_size=4), backend)
    size = 2**30
    out, lens = builder.build_slot_rows(
        SlotRows(t([size - 1, 2 * size + 1]), t([0, 1]), ring=SlotRing(size=size, slots=2))
    )
    # Row 0: positions size - 2 .. size - 5 of slot 0; row 1: position 2 * size (ring row 0 of slot 1), then
    # 2 * size - 1 .. 2 * size - 3 (rows size - 1 .. size - 3 of slot 1).
    assert out[0, :4].tolist() == [size - 2, size - 3, size - 4, size - 5]
    assert out[1, :4].tolist() == [size, 2 * size - 1, 2 * size - 2, 2 * size - 3]
    assert lens.tolist() == [4, 4]


# -- token-slot rows ------------------------------------------------------------------------------------------


def paged(**kw) -> SlotRows:
    return SlotRows(
        **{
            **dict(row_ends=t([3]), pools=t([0]), req_to_token=torch.arange(8).view(1, 8), slot_map=torch.arange(8)),
            **kw,
        }
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("change", "error", "field"),
    [
        # A row wider than a kernel's tensor failed inside the Triton compiler.
        (dict(width=MAX_ROW + 1), E.BatchCapacityError, "width"),
        (dict(width=np.int64(8)), E.BatchCapacityError, "width"),
        # Accepted before whenever no row was given (an n = 0 call), whatever the block.
        (dict(row_ends=t([]), pools=t([]), block=MAX_ROW, block_slots=t([])), E.BatchShapeError, "block"),
        (dict(block=np.int64(1), block_slots=t([0])), E.BatchShapeError, "block"),
    ],
)
def test_slot_rows_block_and_width_are_bounded_by_name(backend, change, error, field):
    builder = make_builder(small(window_size=4), backend)
    with pytest.raises(error) as info:
        builder.build_slot_rows(paged(**change))
    assert info.value.field == field


# -- the SGLang adapter ---------------------------------------------------------------------------------------


def causal_inputs(**kw):
    return (
        dict(
            req_to_token=torch.arange(8, dtype=torch.int32).view(1, 8),
            full_to_swa_mapping=torch.arange(8),
            req_pool_indices_repeated=t([0]),
            seq_lens_casual=t([3], torch.int32),
            swa_window=4,
            page_index_aligned_size=8,
        )
        | kw
    )


@pytest.mark.parametrize("value", (64.0, np.float64(64)), ids=repr)
def test_sglang_alignment_type_is_checked_before_the_fast_path(value):
    # 64.0 compared equal to SGLang's default alignment and took its width without a type check.
    with pytest.raises(ConfigError) as info:
        S.SGLangSWAIndices(4).causal_rows(
            req_to_token=torch.zeros((1, 8), dtype=torch.int32),
            full_to_swa=torch.arange(8),
            req_pool_indices_repeated=t([0]),
            seq_lens_casual=t([3]),
            page_index_aligned_size=value,
        )
    assert info.value.field == "page_index_aligned_size"


def test_sglang_alignment_as_a_numpy_integer_is_the_integer():
    rows = S.SGLangSWAIndices(4).causal_rows(
        req_to_token=torch.zeros((1, 8), dtype=torch.int32),
        full_to_swa=torch.arange(8),
        req_pool_indices_repeated=t([0]),
        seq_lens_casual=t([3]),
        page_index_aligned_size=np.int64(64),
    )
    assert rows.width == 64 and type(rows.width) is int


@pytest.mark.parametrize(
    ("name", "value", "bound"),
    [
        ("ring_size", 2**30 + 1, 2**30),
        ("num_slots", 2**31 + 1, 2**31),
        ("block_size", MAX_ROW + 1, MAX_ROW),
        ("page_index_aligned_size", MAX_ROW + 1, MAX_ROW),
    ],
)
def test_sglang_ring_settings_are_bounded_above(name, value, bound):
    inputs = dict(
        seq_lens_casual=t([6, 7], torch.int32),
        req_pool_indices_repeated=t([1, 1]),
        valid_from=t([0, 0]),
        ring_size=6,
        block_size=2,
        page_index_aligned_size=8,
    )
    with pytest.raises(ConfigError) as info:
        S.SGLangSWAIndices(4).dspark_ring_rows(**{**inputs, name: value})
    assert str(info.value) == f"{name}: must be at most {bound}, got {value!r}"


def test_sglang_hooks_refuse_meta_tensors_by_name():
    # A meta tensor made the adapter a builder on the meta device, which failed without naming the tensor. The
    # hooks' first two arguments, SGLang's own function and the op's class, are not read before it.
    meta = torch.empty(1, dtype=torch.int32, device="meta")
    with pytest.raises(E.BatchDeviceError) as info:
        S.causal_execute(None, None, **causal_inputs(seq_lens_casual=meta))
    assert info.value.field == "seq_lens_casual"
    with pytest.raises(E.BatchDeviceError) as info:
        S.dspark_ring_execute(
            None,
            None,
            seq_lens_casual=meta.expand(2),
            req_pool_indices_repeated=t([0, 0]),
            valid_from=t([0]),
            ring_size=8,
            block_size=2,
            swa_window=4,
            page_index_aligned_size=64,
        )
    assert info.value.field == "seq_lens_casual"
    with pytest.raises(E.BatchDeviceError) as info:
        S.window_layout_around(None, meta.long(), meta.long(), zero_row=0, window=4)
    assert info.value.field == "pos"
    with pytest.raises(E.BatchDtypeError) as info:
        S.causal_execute(None, None, **causal_inputs(seq_lens_casual=[3]))
    assert info.value.field == "seq_lens_casual"


@pytest.mark.parametrize("device", ("meta", "no-such-device"))
def test_sglang_adapter_refuses_an_unusable_device_where_it_is_made(device):
    with pytest.raises(E.DeviceError, match="device"):
        S.SGLangSWAIndices(4, device)


# -- builders and engine metadata -----------------------------------------------------------------------------


def test_builders_on_the_meta_device_are_refused():
    for make in (
        lambda: SWAMetadataBuilder(small(window_size=4), device="meta"),
        lambda: EngineSWABuilder(small(window_size=4), device="meta"),
    ):
        with pytest.raises(E.DeviceError, match="device 'meta'"):
            make()


def engine_step():
    cfg = small(window_size=4, block_size=4)
    return cfg, synthesize_batch(cfg, [5, 9], [1, 5], rng=random.Random(0))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ("query_start_loc_cpu", "seq_lens_cpu"))
def test_host_copies_off_the_host_are_refused_by_name(backend, name):
    # A meta host copy failed inside the plan's numpy conversion (query_start_loc_cpu: a TypeError), or was
    # never looked at (seq_lens_cpu).
    cfg, batch = engine_step()
    builder = make_builder(cfg, backend)
    field = "seq_lens_cpu_upper_bound" if name == "seq_lens_cpu" else name
    cm = common_metadata(batch, **{field: getattr(batch, name).to("meta")})
    engine = EngineSWABuilder.__new__(EngineSWABuilder)
    engine.builder = builder
    with pytest.raises(E.BatchDeviceError) as info:
        engine.build(0, cm)
    assert info.value.field == name


@pytest.mark.parametrize(
    ("override", "error", "field"),
    [
        (dict(max_query_len=5.5), E.BatchDtypeError, "max_query_len"),  # was truncated to 5
        (dict(max_query_len=True), E.BatchDtypeError, "max_query_len"),
        (dict(max_query_len=torch.tensor(5, device="meta")), E.BatchDeviceError, "max_query_len"),
        (dict(causal="no"), E.BatchDtypeError, "causal"),  # bool("no") is True
        (dict(causal=torch.tensor(True, device="meta")), E.BatchDtypeError, "causal"),
        (dict(num_actual_tokens=6.0), E.BatchDtypeError, "num_actual_tokens"),
    ],
)
def test_engine_step_settings_are_type_checked(override, error, field):
    cfg, batch = engine_step()
    engine = EngineSWABuilder(cfg, "cpu", backend="torch")
    with pytest.raises(error) as info:
        engine.build(0, common_metadata(batch, **override))
    assert info.value.field == field


def test_engine_step_settings_of_integer_types_build():
    cfg, batch = engine_step()
    engine = EngineSWABuilder(cfg, "cpu", backend="torch")
    want = engine.build(0, common_metadata(batch)).decode_swa_indices.clone()
    got = engine.build(
        0, common_metadata(batch, max_query_len=np.int64(5), causal=np.bool_(True), num_actual_tokens=torch.tensor(6))
    )
    assert torch.equal(got.decode_swa_indices, want)


@pytest.mark.parametrize(
    ("name", "value"), [("guard", "no"), ("guard", 0), ("validate", "yes"), ("tile_schedulers", None)]
)
def test_builder_switches_are_bools(name, value):
    # A truthy string used to turn the guard on ("no" included); 0 and 1 are ints, not switches.
    from swa_hal import SWAMetadataBuilder
    from swa_hal.errors import ConfigError

    config = SWAConfig(window_size=4, block_size=4, max_num_batched_tokens=16, max_num_seqs=4, max_model_len=64)
    with pytest.raises(ConfigError, match=rf"^{name}: must be a bool"):
        SWAMetadataBuilder(config, device="cpu", backend="torch", **{name: value})
