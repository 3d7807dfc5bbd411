"""Group builds (docs/semantics.md #group-builds): one build per SWA KV-cache group of a step, from one
launch on the Triton backends, bit-exact with separate builds."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from helpers import BACKEND_PLATFORMS, TRITON_BACKENDS, make_builder
from swa_hal import SWAConfig
from swa_hal import errors as E
from swa_hal.compare import compare_with_reference
from swa_hal.kernels.launcher import KernelLauncher
from swa_hal.ragged import RaggedDecodeRows
from swa_hal.scenarios import synthesize_batch
from swa_hal.testing.batches import random_batch
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


def group_inputs(config: SWAConfig, batch, groups: int, rng: random.Random):
    """Each group's own block table (other pages, another width) and the slot mapping that follows it."""
    tables, slots = [batch.block_table], [batch.slot_mapping]
    seqs = batch.seq_lens_cpu.tolist()
    queries = (batch.query_start_loc_cpu[1:] - batch.query_start_loc_cpu[:-1]).tolist()
    for _ in range(groups - 1):
        other = synthesize_batch(config, seqs, queries, rng=rng, padding_rows=batch.num_tokens - sum(queries),
                                 extra_pages=rng.choice((1, 2)))  # room for the draft steps
        # Keep the invalid tokens of the step: validity is the slot mapping's, group by group.
        s = torch.where(batch.slot_mapping >= 0, other.slot_mapping, -1)
        tables.append(other.block_table)
        slots.append(s)
    return tables, slots


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_group_builds_equal_separate_builds(config_name, backend):
    config = CONFIGS[config_name]
    rng = random.Random(f"groups-{config_name}-{backend}")
    grouped = make_builder(config, backend)
    single = make_builder(config, backend)
    kinds = ["decode", "mtp", "mixed", "padded", "invalid"] + (["dspark"] if config.is_dspark else [])
    for i, kind in enumerate(kinds * 2):
        batch = random_batch(config, rng, kind, extra_pages=2, spans=1.0)
        groups = 1 + i % config.num_kv_groups
        tables, slots = group_inputs(config, batch, groups, rng)
        strict = address_strict(extra=tables + slots) if backend == "sm12x" else _null()
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
                with address_strict(extra=tables + slots) if backend == "sm12x" else _null():
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
    real = KernelLauncher.__call__
    monkeypatch.setattr(KernelLauncher, "__call__", lambda self, *a: (launches.append(a[0]), real(self, *a))[1])
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


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
