"""Group builds (docs/semantics.md #group-builds): one build per SWA KV-cache group of a step, from one
launch on the Triton backends, bit-exact with separate builds."""

from __future__ import annotations

import contextlib
import dataclasses
import random

import pytest
import torch
from helpers import BACKEND_PLATFORMS, TRITON_BACKENDS, make_builder, rotated, swept

from swa_hal import SWAConfig
from swa_hal import errors as E
from swa_hal.compare import compare_with_reference
from swa_hal.kernels.launch import TritonLaunch
from swa_hal.ragged import RaggedDecodeRows
from swa_hal.testing.batches import random_batch
from swa_hal.testing.groups import other_groups as group_inputs
from swa_hal.testing.interpreter import address_strict

BACKENDS = list(BACKEND_PLATFORMS)
CONFIGS = {
    "w4b4_mtp": SWAConfig(window_size=4, block_size=4, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=8,
                          num_speculative_tokens=1, speculative_method="mtp", num_kv_groups=3),
    "w5b2_vision": SWAConfig(window_size=5, block_size=2, max_model_len=128, max_num_batched_tokens=64,
                             max_num_seqs=8, max_image_tokens=4, num_kv_groups=4),
    "w7b3_dspark": SWAConfig(window_size=7, block_size=3, max_model_len=300, max_num_batched_tokens=96,
                             max_num_seqs=10, num_speculative_tokens=5, speculative_method="dspark", num_kv_groups=2),
}


@pytest.mark.parametrize("config_name, backend", rotated(CONFIGS, BACKENDS))
def test_group_builds_equal_separate_builds(config_name, backend):
    config = CONFIGS[config_name]
    rng = random.Random(f"groups-{config_name}-{backend}")
    grouped = make_builder(config, backend)
    single = make_builder(config, backend)
    kinds = ["decode", "mtp", "mixed", "padded", "invalid"] + (["dspark"] if config.is_dspark else [])
    for i, kind in enumerate(kinds * 2):
        batch = random_batch(config, rng, kind, extra_pages=2, spans=1.0, departures=True)
        groups = 1 + i % config.num_kv_groups
        tables, slots = group_inputs(config, batch, groups, rng)
        strict = address_strict(extra=tables + slots) if backend == "sm12x" else contextlib.nullcontext()
        with strict:
            mds = grouped.build_groups(batch, tables, slots)
        assert len(mds) == groups
        for g, md in enumerate(mds):
            group_batch = dataclasses.replace(batch, block_table=tables[g], slot_mapping=slots[g])
            assert compare_with_reference(config, group_batch, md) == [], (kind, g)
            alone = single.build(group_batch)
            for field in ("decode_swa_indices", "decode_swa_lens", "prefill_swa_indices", "prefill_swa_lens",
                          "is_valid_token", "token_to_req_indices", "prefill_gather_lens"):
                a, b = getattr(md, field), getattr(alone, field)
                assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), (kind, g, field)
            ragged = md.extra(RaggedDecodeRows)
            if ragged is not None:
                n = int(ragged.indptr[-1])
                assert torch.equal(ragged.indices[:n], alone.extra(RaggedDecodeRows).indices[:n])
        # Group g's outputs are views of group g's fixed buffers.
        assert len({md.decode_swa_lens.data_ptr() for md in mds}) == groups
        if mds[0].num_decode_tokens and mds[0].num_prefills == 0:
            for _ in range(2):  # draft steps, all groups updated together
                batch.seq_lens.add_(1)
                batch.seq_lens_cpu.add_(1)
                with address_strict(extra=tables + slots) if backend == "sm12x" else contextlib.nullcontext():
                    grouped.update_draft_decode_metadata(mds)
                for g, md in enumerate(mds):
                    group_batch = dataclasses.replace(batch, block_table=tables[g], slot_mapping=slots[g])
                    assert compare_with_reference(config, group_batch, md) == [], (kind, g, "update")


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_group_build_is_one_launch(backend, monkeypatch):
    config = CONFIGS["w4b4_mtp"]
    builder = make_builder(config, backend)
    batch = random_batch(config, random.Random(1), "mixed")
    tables, slots = group_inputs(config, batch, 3, random.Random(2))
    launches = []
    real = TritonLaunch.__call__
    monkeypatch.setattr(TritonLaunch, "__call__", lambda self, *a, **k: (launches.append(a[0]), real(self, *a, **k))[1])
    builder.build_groups(batch, tables, slots)
    rows = [k for k in launches if type(k).__name__ == "RowsKey"]
    assert len(rows) == 1 and rows[0].GROUPED


def test_group_build_limits():
    config = CONFIGS["w4b4_mtp"]
    builder = make_builder(config, "torch")
    batch = random_batch(config, random.Random(3), "decode")
    with pytest.raises(E.BatchCapacityError, match="4 groups; the config's num_kv_groups is 3"):
        builder.build_groups(batch, [batch.block_table] * 4, [batch.slot_mapping] * 4)
    with pytest.raises(E.BatchShapeError, match="1 slot mappings for 2 block tables"):
        builder.build_groups(batch, [batch.block_table] * 2, [batch.slot_mapping])
    with pytest.raises(E.BatchDtypeError, match=r"block_tables\[1\] has dtype torch.int64"):
        builder.build_groups(batch, [batch.block_table, batch.block_table.long()], [batch.slot_mapping] * 2)


def stack(tables, slots, extra_rows: int = 3, extra_tokens: int = 5):
    """The groups' tables and slot mappings in one persistent buffer each ([G, R + extra, P] padded with
    -1, [G, T + extra]), as an engine that keeps them stacked holds them; returns the step's slices."""
    groups, rows, width = len(tables), tables[0].shape[0], max(t.shape[1] for t in tables)
    t3 = torch.full((groups, rows + extra_rows, width), -1, dtype=torch.int32)
    s2 = torch.full((groups, slots[0].shape[0] + extra_tokens), -1, dtype=torch.int64)
    for g in range(groups):
        t3[g, :rows, : tables[g].shape[1]] = tables[g]
        s2[g, : slots[g].shape[0]] = slots[g]
    return t3, s2, t3[:, :rows], s2[:, : slots[0].shape[0]]


def own_slots(batch, table: torch.Tensor, slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """Each scheduled token's own slot by ``table`` where ``slots`` gives it one (-1 where the table holds none)."""
    qsl, seq = batch.query_start_loc_cpu.long(), batch.seq_lens_cpu.long()
    real = int(qsl[-1])
    req = torch.repeat_interleave(torch.arange(seq.shape[0]), qsl[1:] - qsl[:-1])
    pos = seq[req] - qsl[1:][req] + torch.arange(real)
    own = table.long()[req, pos // block_size] * block_size + pos % block_size
    out = slots.clone()
    out[:real] = torch.where((slots[:real] >= 0) & (own >= 0), own, -1)
    return out


@pytest.mark.parametrize("config_name, backend", rotated(CONFIGS, BACKENDS))
def test_stacked_group_inputs_equal_listed_ones(config_name, backend):
    """docs/semantics.md #group-builds: group inputs stacked in one tensor each build what the same
    tables as lists build, and follow the buffers' contents from step to step."""
    config = CONFIGS[config_name]
    rng = random.Random(f"stacked-{config_name}-{backend}")
    stacked_builder, listed_builder = make_builder(config, backend), make_builder(config, backend)
    kinds = ["decode", "mtp", "mixed", "padded", "invalid"] + (["dspark"] if config.is_dspark else [])
    for i, kind in enumerate(kinds):
        batch = random_batch(config, rng, kind, extra_pages=2, spans=1.0, departures=True)
        groups = 1 + i % config.num_kv_groups
        tables, slots = group_inputs(config, batch, groups, rng)
        t3, s2, t_step, s_step = stack(tables, slots)
        padded = [t_step[g] for g in range(groups)]  # the same tables, -1 past each one's own width
        for step in range(2):
            strict = address_strict(extra=[t3, s2]) if backend == "sm12x" else contextlib.nullcontext()
            with strict:
                stacked = stacked_builder.build_groups(batch, t_step, s_step)
            listed = listed_builder.build_groups(batch, padded, slots)
            assert len(stacked) == groups
            for g, (a, b) in enumerate(zip(stacked, listed)):
                assert torch.equal(a.block_table, padded[g]) and torch.equal(a.slot_mapping, slots[g])
                group_batch = dataclasses.replace(batch, block_table=padded[g], slot_mapping=slots[g])
                assert compare_with_reference(config, group_batch, a) == [], (kind, g, step)
                for field in ("decode_swa_indices", "decode_swa_lens", "prefill_swa_indices", "prefill_swa_lens",
                              "is_valid_token", "token_to_req_indices"):
                    x, y = getattr(a, field), getattr(b, field)
                    assert (x is None) == (y is None) and (x is None or torch.equal(x, y)), (kind, g, field)
            # The engine rewrites its buffers in place for the next step: the build reads the new pages, and
            # each group's slot mapping the slots its new table gives (docs/semantics.md #guarded-builds, rule 17).
            t_step[:, :, :].copy_(torch.where(t_step >= 0, t_step.flip(0), t_step))
            for g in range(groups):
                s_step[g].copy_(own_slots(batch, t_step[g], s_step[g], config.block_size))
            slots = [s_step[g].clone() for g in range(groups)]
            padded = [t_step[g].clone() for g in range(groups)]


def test_stacked_group_inputs_may_share_one_table():
    """A stacked input with a group stride of 0 (``expand``): every group reads the same table."""
    config = CONFIGS["w4b4_mtp"]
    builder = make_builder(config, "cuda")
    batch = random_batch(config, random.Random(5), "mixed")
    t3 = batch.block_table.unsqueeze(0).expand(3, -1, -1)
    s2 = batch.slot_mapping.unsqueeze(0).expand(3, -1)
    mds = builder.build_groups(batch, t3, s2)
    alone = make_builder(config, "cuda").build(batch)
    for md in mds:
        assert compare_with_reference(config, batch, md) == []
        assert torch.equal(md.decode_swa_indices, alone.decode_swa_indices)


def _two_decode_groups(seed: int):
    """A torch builder, a random decode batch (seeded ``seed``), and two groups' listed block tables and slot
    mappings for it with their stacked forms (seeded ``seed + 1``)."""
    config = CONFIGS["w4b4_mtp"]
    batch = random_batch(config, random.Random(seed), "decode")
    tables, slots = group_inputs(config, batch, 2, random.Random(seed + 1))
    return make_builder(config, "torch"), batch, tables, stack(tables, slots)


def test_stacked_group_input_errors_name_the_field():
    builder, batch, _, (_, _, t, s) = _two_decode_groups(6)
    with pytest.raises(E.BatchDtypeError, match="block_tables has dtype torch.int64"):
        builder.build_groups(batch, t.long(), s)
    with pytest.raises(E.BatchDtypeError, match="slot_mappings has dtype torch.int32"):
        builder.build_groups(batch, t, s.int())
    with pytest.raises(E.BatchShapeError, match="block_tables has 2 dimensions"):
        builder.build_groups(batch, t[0], s)
    with pytest.raises(E.BatchShapeError, match="3 slot mappings for 2 block tables"):
        builder.build_groups(batch, t, torch.cat([s, s[:1]]))
    with pytest.raises(E.BatchShapeError, match="slot_mappings has .* entries; num_tokens is"):
        builder.build_groups(batch, t, s[:, :-1])
    with pytest.raises(E.BatchShapeError, match="block_tables must be contiguous"):
        builder.build_groups(batch, t[:, :, ::2] if t.shape[2] > 1 else t.repeat(1, 1, 2)[:, :, ::2], s)
    with pytest.raises(E.BatchShapeError, match=r"block_tables \(2, 1, "):
        builder.build_groups(batch, t[:, :1], s)
    with pytest.raises(E.BatchCapacityError, match="4 groups; the config's num_kv_groups is 3"):
        builder.build_groups(batch, t[:1].expand(4, -1, -1), s[:1].expand(4, -1))
    with pytest.raises(E.BatchShapeError, match="must both be tensors"):
        builder.build_groups(batch, t, list(s))


@pytest.mark.parametrize("backend", swept(BACKENDS))
def test_listed_tables_with_stacked_slot_mappings_equal_listed_inputs(backend):
    """docs/semantics.md #group-builds: vLLM's layout, a table of its own width per group and the slot
    mappings of every group in one [G, T] buffer (a strided view of it too), builds what the lists build."""
    config = CONFIGS["w4b4_mtp"]
    rng = random.Random(f"mixed-{backend}")
    mixed_builder, listed_builder = make_builder(config, backend), make_builder(config, backend)
    for i, kind in enumerate(["decode", "mtp", "mixed", "padded"]):
        batch = random_batch(config, rng, kind, extra_pages=2)
        groups = 2 + i % 2
        tables, slots = group_inputs(config, batch, groups, rng)
        _, s2, _, s_step = stack(tables, slots)
        every_other = torch.full((2 * groups, s_step.shape[1]), -1, dtype=torch.int64)
        every_other[::2] = s_step
        for step_slots in (s_step, every_other[::2]):
            strict = address_strict(extra=[s2, every_other, *tables]) if backend == "sm12x" else contextlib.nullcontext()
            with strict:
                mixed = mixed_builder.build_groups(batch, tuple(tables), step_slots)
            listed = listed_builder.build_groups(batch, tables, slots)
            for g, (a, b) in enumerate(zip(mixed, listed)):
                assert a.block_table is tables[g] and torch.equal(a.slot_mapping, slots[g])
                assert a.slot_mapping.data_ptr() == step_slots[g].data_ptr()
                group_batch = dataclasses.replace(batch, block_table=tables[g], slot_mapping=slots[g])
                assert compare_with_reference(config, group_batch, a) == [], (kind, g)
                for field in ("decode_swa_indices", "decode_swa_lens", "prefill_swa_indices", "prefill_swa_lens",
                              "is_valid_token", "token_to_req_indices"):
                    x, y = getattr(a, field), getattr(b, field)
                    assert (x is None) == (y is None) and (x is None or torch.equal(x, y)), (kind, g, field)


def test_listed_tables_with_stacked_slot_mapping_errors_name_the_field():
    builder, batch, tables, (_, _, _, s) = _two_decode_groups(8)
    with pytest.raises(E.BatchDtypeError, match="slot_mappings has dtype torch.int32"):
        builder.build_groups(batch, tables, s.int())
    with pytest.raises(E.BatchShapeError, match="3 slot mappings for 2 block tables"):
        builder.build_groups(batch, tables, torch.cat([s, s[:1]]))
    with pytest.raises(E.BatchShapeError, match="slot_mappings has .* entries per group; num_tokens is"):
        builder.build_groups(batch, tables, s[:, :-1])
    with pytest.raises(E.BatchDtypeError, match=r"block_tables\[1\] has dtype torch.int64"):
        builder.build_groups(batch, [tables[0], tables[1].long()], s)
    with pytest.raises(E.BatchShapeError, match=r"block_tables\[0\] .* too few rows"):
        builder.build_groups(batch, [tables[0][:0], tables[1]], s)

