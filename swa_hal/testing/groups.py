"""Conformance topic: group builds (docs/semantics.md #group-builds). One ``build_groups`` of a step with
three KV-cache groups, their tables listed and stacked, equals the reference of each group's own batch bit
for bit; so do the groups after in-place draft steps, for backends that update in place. Every backend has
group builds: one launch on the Triton backends, the default loop over ``compute`` otherwise."""

from __future__ import annotations

import dataclasses
import random

import torch

from ..batch import AttentionBatch
from ..compare import compare_with_reference
from ..config import SWAConfig
from ..scenarios import synthesize_batch
from .fixtures import BackendFixtures, MakeBatch, MakeBuilder

GROUPS = 3


def other_groups(
    config: SWAConfig, batch: AttentionBatch, groups: int, rng: random.Random
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The step's block table and slot mapping, then ``groups - 1`` other groups' for the same step:
    other pages (and table widths) for every request, the same invalid and padding tokens."""
    assert batch.seq_lens_cpu is not None, "a group build's batch needs seq_lens_cpu (the host copy of seq_lens)"
    tables, slots = [batch.block_table], [batch.slot_mapping]
    seqs = batch.seq_lens_cpu.tolist()
    qsl = batch.query_start_loc_cpu.tolist()
    queries = [b - a for a, b in zip(qsl, qsl[1:])]
    for _ in range(groups - 1):
        other = synthesize_batch(
            config,
            seqs,
            queries,
            rng=rng,
            padding_rows=batch.num_tokens - qsl[-1],
            extra_pages=rng.choice((2, 3)),  # room for the draft steps
            device=batch.slot_mapping.device,
        )
        tables.append(other.block_table)
        slots.append(torch.where(batch.slot_mapping >= 0, other.slot_mapping, -1))
    return tables, slots


def stacked(tables: list[torch.Tensor], slots: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The same groups in one tensor each: tables padded with -1 to one width ([G, R, P]), [G, T] slots."""
    width = max(t.shape[1] for t in tables)
    t3 = torch.full((len(tables), tables[0].shape[0], width), -1, dtype=torch.int32, device=tables[0].device)
    for g, table in enumerate(tables):
        t3[g, :, : table.shape[1]] = table
    return t3, torch.stack(slots)


class GroupBuildTests(BackendFixtures):
    """Every config of ``configs`` with every batch kind it allows, as a step of three KV-cache groups."""

    def test_group_builds_match_each_groups_reference(
        self, name: str, make_builder: MakeBuilder, make_batch: MakeBatch, config_name: str, kind: str
    ) -> None:
        config = dataclasses.replace(self.configs[config_name], num_kv_groups=GROUPS)
        listed_builder, stacked_builder = make_builder(config), make_builder(config)
        rng = random.Random(f"groups-{name}-{config_name}-{kind}")
        batch = make_batch(config, rng, kind, extra_pages=2)
        tables, slots = other_groups(config, batch, GROUPS, rng)
        t3, s2 = stacked(tables, slots)
        padded = list(t3.unbind(0))
        for form, mds, group_tables in (
            ("listed", listed_builder.build_groups(batch, tables, slots), tables),
            ("stacked", stacked_builder.build_groups(batch, t3, s2), padded),
        ):
            assert len(mds) == GROUPS, f"build_groups with {form} tables returned {len(mds)} metadata, not {GROUPS}"
            for g, md in enumerate(mds):
                own = dataclasses.replace(batch, block_table=group_tables[g], slot_mapping=slots[g])
                problems = compare_with_reference(config, own, md)
                assert not problems, f"{form} group {g} of a {kind} batch: " + "; ".join(problems)
            assert len({md.is_valid_token.data_ptr() for md in mds}) == GROUPS, f"{form}: groups share buffers"
        if (
            not mds[0].num_decode_tokens
            or mds[0].num_prefills
            or not stacked_builder.supports_draft_decode_metadata_update
        ):
            return
        for step in range(2):  # draft steps: every group updated at once
            batch.seq_lens.add_(1)
            assert batch.seq_lens_cpu is not None, "a group build's batch needs seq_lens_cpu"
            batch.seq_lens_cpu.add_(1)
            stacked_builder.update_draft_decode_metadata(mds)
            for g, md in enumerate(mds):
                own = dataclasses.replace(batch, block_table=padded[g], slot_mapping=slots[g])
                problems = compare_with_reference(config, own, md)
                assert not problems, f"group {g} after draft step {step + 1}: " + "; ".join(problems)
