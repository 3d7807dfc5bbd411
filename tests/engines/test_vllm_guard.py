"""Diagnostics of vLLM step builds: what a step build records or refuses reaches the builders vLLM holds.

Under a model-runner step every SWA group's rows come from the step's own ``SWAMetadataBuilder``
(``swa_hal.integrations.vllm_step``). These tests hold that build to what each group's own build gives
the engine: a guard violation reaches ``check()`` and the poll of the swa_hal builder vLLM constructed
for a group, an error names the KV-cache group as vLLM numbers it and is raised in that group's call,
and a view that is not the step's input (another stride, dtype) builds alone and is refused by name.

Run with ``make test-vllm`` (the fixtures and the step rig are ``test_vllm.py``'s).
"""

from __future__ import annotations

import dataclasses
import logging
import random

import pytest
import test_vllm as T
import torch
import vllm_harness as H
from vllm.models.deepseek_v41.nvidia import flashmla as v41_flashmla

from swa_hal import AttentionBatch
from swa_hal.errors import (
    BatchConsistencyError,
    BatchDtypeError,
    BatchRangeError,
    BatchShapeError,
    BatchValidationError,
)
from swa_hal.integrations import vllm_step

VARIANT = "v41_mtp1_w7b16"
# Three SWA groups among four KV-cache groups: the step's list of SWA groups (0, 1, 2) is not vLLM's
# numbering (0, 1, 3), so an error naming a position in it would name the wrong group.
LAYOUT = H.StepLayout(4, (0, 1, 3))
SEED, Calls, StepRig, chunk_args = T.SEED, T.Calls, T.StepRig, T.chunk_args
# test_vllm.py's fixtures: FlashMLA's planner stub, vLLM's plugin loader, the variants' vLLM configs.
planner_stub, plugin_log, vllm_configs = T.planner_stub, T.plugin_log, T.vllm_configs


@pytest.fixture
def rig(plugin_log, vllm_configs):
    """The layout's builders as vLLM constructs them (torch backend) and a mixed step's inputs."""
    rig = StepRig(VARIANT, vllm_configs, v41_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder, LAYOUT, backend="torch")
    rng = random.Random(f"{SEED}-step-guard")
    rig.step = rig.draw(rng, "mixed")
    return rig


def bad_block_ids(tables, kv_group):
    """The step's tables with every block id of KV-cache group ``kv_group``'s request 0 at -3: its window
    reads a block id outside the cache, which a guarded build records (kind 6) and hands out empty."""
    tables = list(tables)
    table = tables[kv_group].clone()
    table[0] = -3
    tables[kv_group] = table
    return tuple(tables)


def prepare(rig, tables=None, slots=None):
    batch, step_tables, step_slots, ib, state = rig.step
    tables = step_tables if tables is None else tables
    slots = step_slots if slots is None else slots
    return rig.build(rig.our_groups, batch, tables, slots, ib, state)


def group_call(rig, j, tables, slots, **changes):
    """Group ``j``'s build as vLLM's loop calls it inside a step: the step's objects for its group."""
    batch = rig.step[0]
    i = LAYOUT.swa[j]
    step = dataclasses.replace(batch, **{"block_table": tables[i], "slot_mapping": slots[i], **changes})
    return rig.ours[j].build(0, H.common_metadata(step), replay_start=batch.replay_start)


# -- 1. a step build's violations reach the builders vLLM holds ---------------------------------------


def test_check_of_a_group_builder_raises_what_its_step_build_recorded(rig):
    """The engine checks the swa_hal builder it holds for a group (``builder.swa_hal.check()``): the
    violation the step build recorded for KV-cache group 3 is raised there, once, as its own build's
    would be, naming vLLM's KV-cache group 3 (the step's third SWA group); the record is then clear for
    every builder of the step."""
    batch, tables, slots, ib, state = rig.step
    prepare(rig, tables=bad_block_ids(tables, 3))
    plan = rig.ours[0].swa_hal_step[0]
    assert plan.builder is not None
    with pytest.raises(BatchRangeError, match=r"^KV-cache group 3: block_table: .*block id -3") as info:
        rig.ours[0].swa_hal.check()
    assert info.value.field == "block_table" and info.value.index == 0
    for ours in rig.ours:  # raised once: nothing left for another check
        ours.swa_hal.check()
    plan.builder.check()
    # The same step built group by group (no step open) records in the group's own builder.
    ours = rig.ours[2]
    bad = bad_block_ids(tables, 3)
    group_call(rig, 2, bad, slots)
    with pytest.raises(BatchRangeError, match=r"^block_table: .*block id -3"):  # its own build: no group
        ours.swa_hal.check()


def test_check_raises_a_step_violation_after_the_poll_took_it_off(rig, monkeypatch):
    """A poll that logged the violation took it off the step builder's record; ``check()`` of the group's
    builder still raises it (as a lone builder's does)."""
    monkeypatch.setenv("SWA_HAL_STRICT", "0")
    batch, tables, slots, ib, state = rig.step
    prepare(rig, tables=bad_block_ids(tables, 3))
    prepare(rig)  # a clean step: its builds' polls take the violation off and log it
    with pytest.raises(BatchRangeError, match="block id -3"):
        rig.ours[1].swa_hal.check()


def test_poll_of_a_group_builder_surfaces_a_step_violation(rig, monkeypatch):
    """``SWA_HAL_STRICT=1``: the violation a step build recorded is raised by the poll of a builder vLLM
    holds, a build later, also when that build is not a step build (the group builds alone)."""
    monkeypatch.setenv("SWA_HAL_STRICT", "1")
    batch, tables, slots, ib, state = rig.step
    bad = bad_block_ids(tables, 3)
    with vllm_step.open_step(bad, slots, rig.our_groups, 0):
        group_call(rig, 0, bad, slots)  # the step build, which records; its poll sees the record
    with pytest.raises(BatchRangeError, match=r"^KV-cache group 3: .*block id -3") as info:
        group_call(rig, 1, tables, slots)  # outside any step: builds alone, then polls
    assert info.value.field == "block_table" and info.value.index == 0
    for j in range(len(LAYOUT.swa)):  # raised once
        group_call(rig, j, tables, slots)
        rig.ours[j].swa_hal.check()
    # Through vLLM's prepare_attn: the step's next builder's poll raises it, in the same step.
    with pytest.raises(BatchRangeError, match="block id -3"):
        prepare(rig, tables=bad)
    prepare(rig)


def test_a_step_violation_is_logged_through_vllms_logger(rig, monkeypatch):
    """Without strict mode the violation is one warning through the plugin's logger, a build later."""
    monkeypatch.delenv("SWA_HAL_STRICT", raising=False)
    logger = logging.getLogger("vllm.plugins.swa_hal")
    seen = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = seen.append
    logger.addHandler(handler)
    try:
        batch, tables, slots, ib, state = rig.step
        prepare(rig, tables=bad_block_ids(tables, 3))
        for j in range(len(LAYOUT.swa)):
            rig.ours[j].swa_hal.poll_violations()
    finally:
        logger.removeHandler(handler)
    lines = [r.getMessage() for r in seen]
    assert len(lines) == 1 and "[field=block_table request=0 value=-3]" in lines[0], lines


def test_a_padding_request_the_device_gives_tokens_is_emptied_and_recorded_by_the_step(rig):
    """docs/semantics.md #bounded-replay: a step padded to a captured request count brings two replay bounds for
    three requests (the host offsets make request 2 padding, so it goes without a bound), while the device offsets
    give request 2 a token with its own slot in every group. The step build empties that row in every group, gives
    the prefill gather length 0, hands out the step's three bounds, and records rule 14 (query_start_loc, request
    2), which the check of a builder vLLM holds raises, naming a KV-cache group as vLLM numbers it."""
    device = AttentionBatch.from_lists([20, 30, 9], [1, 5, 1], [[1, 2], [3, 4], [5, 6]], block_size=16, num_tokens=8)
    tables, slots = H.step_inputs(device, LAYOUT, 16, random.Random(f"{SEED}-padding"))
    host = torch.tensor([0, 1, 6, 6], dtype=torch.int32)
    bounds = torch.tensor([0, 3], dtype=torch.int32)
    got = []
    with vllm_step.open_step(tables, slots, rig.our_groups, 0):
        for j, i in enumerate(LAYOUT.swa):
            step = dataclasses.replace(device, query_start_loc_cpu=host, block_table=tables[i], slot_mapping=slots[i])
            got.append(rig.ours[j].build(0, H.common_metadata(step), replay_start=bounds))
    assert rig.ours[0].swa_hal_step is not None and rig.ours[0].swa_hal_step[0].builder is not None
    for md in got:
        assert md.num_prefills == 2 and md.prefill_swa_lens[:6].tolist()[5] == 0
        assert md.prefill_swa_lens[:5].tolist() == [7, 7, 7, 7, 7]
        assert md.prefill_gather_lens.tolist() == [11, 0] and md.replay_start.tolist() == [0, 3, 0]
    with pytest.raises(BatchConsistencyError, match=r"^KV-cache group [013]: request 2: its 1 query tokens") as info:
        rig.ours[0].swa_hal.check()
    assert info.value.field == "query_start_loc" and info.value.index == 2


def test_per_request_buffers_longer_than_the_step_give_its_requests_only(rig):
    """vLLM keeps seq_lens and the replay bounds in persistent max_num_seqs buffers: handed in whole, the metadata
    of every group of a step build holds the step's R entries of each per-request output, views of those buffers."""
    batch, tables, slots, ib, state = rig.step
    num_reqs = batch.inputs.num_reqs
    persistent = torch.full((num_reqs + 3,), 77, dtype=torch.int32)
    persistent[:num_reqs] = batch.seq_lens
    bounds = torch.zeros(num_reqs + 3, dtype=torch.int32)
    with vllm_step.open_step(tables, slots, rig.our_groups, 0):
        for j, i in enumerate(LAYOUT.swa):
            step = dataclasses.replace(batch, block_table=tables[i], slot_mapping=slots[i])
            md = rig.ours[j].build(0, H.common_metadata(step, seq_lens=persistent), replay_start=bounds)
            assert md.seq_lens.tolist() == batch.seq_lens.tolist()
            assert md.replay_start.shape == (num_reqs,) and md.replay_start.data_ptr() == bounds.data_ptr()
            if md.num_prefills:
                assert md.prefill_seq_lens.tolist() == batch.seq_lens[md.num_decodes :].tolist()
                assert md.prefill_seq_lens_cpu.tolist() == batch.seq_lens[md.num_decodes :].tolist()
    rig.ours[0].swa_hal.check()


# -- 2. a step build's errors name vLLM's KV-cache group and surface in its call ----------------------


def test_a_bad_table_raises_in_its_groups_call_naming_its_kv_cache_group(rig):
    """KV-cache group 3's table is int64: the groups before it build (each alone: the step build was
    refused) and equal vLLM's own builds; group 3's own call raises, naming KV-cache group 3."""
    batch, tables, slots, ib, state = rig.step
    bad = list(tables)
    bad[3] = tables[3].to(torch.int64)
    bad = tuple(bad)
    with vllm_step.open_step(bad, slots, rig.our_groups, 0):
        for j in (0, 1):
            i = LAYOUT.swa[j]
            step = dataclasses.replace(batch, block_table=bad[i], slot_mapping=slots[i])
            want = rig.natives[j].build(0, H.common_metadata(step), replay_start=batch.replay_start)
            got = group_call(rig, j, bad, slots)
            diffs = H.compare(want, got, step, **chunk_args(VARIANT))
            assert not diffs, "\n".join(diffs)
        with pytest.raises(BatchDtypeError, match=r"KV-cache group 3\b") as info:
            group_call(rig, 2, bad, slots)
    assert info.value.field == "block_table"
    assert "block_tables[2]" not in str(info.value) and "int32" in str(info.value)


def test_a_bad_table_through_prepare_attn_names_its_kv_cache_group(rig):
    """Through vLLM's ``prepare_attn``: a table with too few rows for KV-cache group 3 stops the step with
    an error that names group 3 (vLLM's number), raised from group 3's build."""
    batch, tables, slots, ib, state = rig.step
    bad = list(tables)
    bad[3] = tables[3][:0]
    seen = []
    original = type(rig.ours[2]).build

    def build(self, *args, **kwargs):
        seen.append(self)
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(rig.ours[2]), "build", build)
        with pytest.raises(BatchShapeError, match=r"KV-cache group 3\b") as info:
            prepare(rig, tables=tuple(bad))
    assert seen[-1] is rig.ours[2]
    assert "block_tables[2]" not in str(info.value)


def test_validation_errors_of_a_step_name_the_kv_cache_group(plugin_log, vllm_configs):
    """With full validation (``SWA_HAL_DEBUG``'s ``validate``), a block id past the cache in KV-cache group
    3's table raises in group 3's call, naming group 3, not its place among the step's SWA groups."""
    rig = StepRig(
        VARIANT,
        vllm_configs,
        v41_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder,
        LAYOUT,
        backend="torch",
        validate=True,
    )
    rig.step = rig.draw(random.Random(f"{SEED}-step-guard"), "mixed")
    batch, tables, slots, ib, state = rig.step
    bad = bad_block_ids(tables, 3)
    with vllm_step.open_step(bad, slots, rig.our_groups, 0):
        group_call(rig, 0, bad, slots)
        group_call(rig, 1, bad, slots)
        with pytest.raises(BatchValidationError, match=r"KV-cache group 3\b") as info:
            group_call(rig, 2, bad, slots)
    assert "group 2" not in str(info.value) and info.value.field == "block_table"


@pytest.mark.parametrize("cut", ["tables", "both"])
def test_fewer_tables_than_the_plans_groups_is_a_typed_error(rig, cut):
    """The plan's SWA groups reach KV-cache group 3; a call with three block tables (and, ``both``, three
    slot-mapping rows) raises a typed error naming ``block_tables`` and group 3, never an IndexError."""
    batch, tables, slots, ib, state = rig.step
    prepare(rig)  # the plan exists
    short = tables[:3]
    rows = slots[:3] if cut == "both" else slots
    with pytest.raises(BatchShapeError, match=r"block_tables") as info:
        with vllm_step.open_step(short, rows, rig.our_groups, 0):
            group_call(rig, 0, short, rows)
    assert info.value.field == "block_tables" and info.value.index == 3
    assert "KV-cache group 3" in str(info.value)


def test_the_drafters_call_without_a_step_keyword_is_vllms_own(plugin_log):
    """The drafter wrapper reads the step's keywords; a call without one of them is vLLM's own call (its
    own TypeError), never a KeyError of the wrapper."""
    from vllm.v1.worker.gpu.spec_decode import speculator

    with pytest.raises(TypeError):
        speculator.build_attn_metadata(attn_groups=[], num_reqs=0)


# -- 3. the step's inputs are compared by their whole identity -----------------------------------------


def strided_like(t):
    """A view at ``t``'s address with ``t``'s shape and another stride (the same memory, read otherwise)."""
    base = torch.empty(2 * t.numel(), dtype=t.dtype)
    base[: t.numel()] = t
    return base, base.as_strided(t.shape, (2,))


def builds_alone(rig, monkeypatch, tables, slots, error, field, **override):
    """Group 1's call with ``override`` inside a step: it is not the step's input, so it builds alone (one
    build of its own) and that build refuses it, naming ``field``."""
    calls = Calls(monkeypatch)
    with vllm_step.open_step(tables, slots, rig.our_groups, 0):
        group_call(rig, 0, tables, slots)
        calls.take()
        with pytest.raises(error, match=field):
            group_call(rig, 1, tables, slots, **override)
    assert calls.take().get("build") == 1


def test_a_strided_view_of_the_steps_seq_lens_builds_alone(rig, monkeypatch):
    """A ``seq_lens`` view at the step's address, of the step's shape, with stride 2: not the step's input.
    It builds alone and its own build refuses it by name, as it would without step builds."""
    batch, tables, slots, ib, state = rig.step
    base, same = strided_like(batch.seq_lens)
    steps = dataclasses.replace(batch, seq_lens=base[: batch.seq_lens.numel()])
    # The step's seq_lens is ``base``'s head; the group's view starts at the same address.
    rig.step = (steps, tables, slots, ib, state)
    builds_alone(rig, monkeypatch, tables, slots, BatchValidationError, "seq_lens", seq_lens=same)


def test_a_strided_slot_row_at_the_steps_address_builds_alone(rig, monkeypatch):
    """A slot mapping at the address of the group's row of the step's ``[G, T]`` buffer, of its length,
    with stride 2: not the step's row; its own build refuses it by name."""
    batch, tables, slots, ib, state = rig.step
    i = LAYOUT.swa[1]
    row = slots[i]
    view = torch.as_strided(slots, row.shape, (2,), slots.storage_offset() + i * slots.stride(0))
    assert view.data_ptr() == row.data_ptr() and view.shape == row.shape and view.stride() != row.stride()
    builds_alone(rig, monkeypatch, tables, slots, BatchValidationError, "slot_mapping", slot_mapping=view)


def test_a_view_of_another_dtype_at_the_steps_address_builds_alone(rig, monkeypatch):
    """``query_start_loc`` seen as float32 at the same address and shape: not the step's input."""
    batch, tables, slots, ib, state = rig.step
    view = batch.query_start_loc.view(torch.float32)
    builds_alone(rig, monkeypatch, tables, slots, BatchDtypeError, "query_start_loc", query_start_loc=view)
