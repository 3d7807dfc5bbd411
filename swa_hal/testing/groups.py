"""Conformance topic: group builds (docs/semantics.md #group-builds). One ``build_groups`` of a step with
three KV-cache groups, their tables listed and stacked, equals the reference of each group's own batch bit
for bit; so do the groups after in-place draft steps, for backends that update in place. Every backend has
group builds: one launch on the Triton backends, the default loop over ``compute`` otherwise.

A backend's typed extras are each group's own: where one group's extras share memory with another's, group
g's hold what a builder of one group gives for group g's own batch, after the group build and after each draft
step (a backend that keeps one set of extra buffers for every group hands each group the last group's)."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from ..batch import AttentionBatch
from ..builder import SWAMetadataBuilder
from ..compare import compare_with_reference
from ..config import SWAConfig
from ..metadata import SWAMetadata
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


def extra_values(metadata: SWAMetadata) -> dict[str, Any]:
    """A build's typed extras, field by field (``Kind.field`` -> value): the tensors and the plain values
    (numbers, strings, None) two builders of the same backend give alike; other objects are not compared."""
    out: dict[str, Any] = {}
    for extra in metadata.extras:
        kind = type(extra).__name__
        fields = (
            {f.name: getattr(extra, f.name) for f in dataclasses.fields(extra)}
            if dataclasses.is_dataclass(extra)
            else {"": extra}
        )
        for field, value in fields.items():
            if isinstance(value, (torch.Tensor, int, float, str, type(None))):
                out[f"{kind}.{field}" if field else kind] = value
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.cpu(), b.cpu())
        )
    return bool(a == b)


def _memory(value: torch.Tensor) -> tuple[int, int] | None:
    """The bytes a tensor reads, [start, end), or None when it reads none."""
    if value.numel() == 0:
        return None
    span = sum((n - 1) * s for n, s in zip(value.shape, value.stride())) + 1
    return value.data_ptr(), value.data_ptr() + span * value.element_size()


def shares_extras(groups: Sequence[SWAMetadata]) -> bool:
    """Whether a tensor of one group's extras overlaps a tensor of another group's in memory."""
    spans = [
        [m for v in extra_values(md).values() if isinstance(v, torch.Tensor) and (m := _memory(v)) is not None]
        for md in groups
    ]
    return any(a < d and c < b for g, h in itertools.combinations(spans, 2) for a, b in g for c, d in h)


def check_own_extras(groups: Sequence[SWAMetadata], singles: Sequence[SWAMetadata], what: str) -> None:
    """Fail unless each group's extras equal those of ``singles[g]``, a build of group g's own batch by a
    builder of one group (fresh, and stepped alike), naming the extra and, where it holds another group's,
    which one."""
    want = [extra_values(md) for md in singles]
    for g, md in enumerate(groups):
        got = extra_values(md)
        if sorted(got) != sorted(want[g]):
            pytest.fail(
                f"{what}: group {g}'s extras are {sorted(got)}, a build of its own batch gives {sorted(want[g])}",
                pytrace=False,
            )
        for field, value in got.items():
            if _same(value, want[g][field]):
                continue
            others = [h for h in range(len(groups)) if h != g and _same(value, want[h][field])]
            held = f"it holds group {others[0]}'s" if others else "it holds no group's"
            pytest.fail(
                f"{what}: group {g}'s extra {field} is not what a build of group {g}'s own batch gives; {held}. "
                f"Each group's extras must live in buffers of their own: allocate one set per group in "
                f"allocate(buffers) (buffers.num_groups) and fill buffers.group_index's set in extras(metadata, "
                f"buffers) (docs/backends.md #extra-outputs)",
                pytrace=False,
            )


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
        singles: list[SWAMetadata] = []
        single_builders: list[SWAMetadataBuilder] = []
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
            if not singles and shares_extras(mds):
                # Extras in shared memory are right only where they are alike for every group: each group's are
                # held to a build of its own batch by a fresh builder of one group (stepped alike below).
                single_builders = [make_builder(self.configs[config_name]) for _ in range(GROUPS)]
                singles = [
                    b.build(dataclasses.replace(batch, block_table=tables[g], slot_mapping=slots[g]))
                    for g, b in enumerate(single_builders)
                ]
            if singles:
                check_own_extras(mds, singles, f"build_groups with {form} tables of a {kind} batch")
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
            if singles:
                for builder, md in zip(single_builders, singles):
                    builder.update_draft_decode_metadata(md)
                check_own_extras(mds, singles, f"the groups after draft step {step + 1}")
