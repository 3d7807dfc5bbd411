"""Padding requests without a replay bound (docs/semantics.md #bounded-replay, vector R3): a CUDA-graph step
padded to a captured request count hands in fewer bounds than requests; the requests past them have no query
tokens and no bound. Every backend, on the plain, validated and group builds; a real request past the bounds
is refused by name on every path. A padding request that only the device offsets give tokens is held to its
host copy on the device (rule 14): emptied and recorded by builds, group builds, engine builds and draft
updates alike."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers import BACKEND_PLATFORMS, common_metadata, make_builder
from swa_hal import AttentionBatch, PlatformInfo, SWAConfig
from swa_hal.errors import BatchConsistencyError, BatchShapeError
from swa_hal.integrations import EngineSWABuilder
from swa_hal.reference import build_reference
from swa_hal.testing.guarded import metadata_differences, reference_builder
from swa_hal.testing.plain_model import plain_differences

CONFIG = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=4)


def vector_r3(bounds: list[int]) -> AttentionBatch:
    """Vector R1's two requests, padded to 4 requests and 6 token rows as a captured graph's step is."""
    return AttentionBatch.from_lists(
        [10, 9, 0, 0],
        [1, 3, 0, 0],
        [[7, 3, 2], [5, 6, 1], [0, 0, 0], [0, 0, 0]],
        block_size=4,
        num_tokens=6,
        replay_start=None,
    ).replace(replay_start=torch.tensor(bounds, dtype=torch.int32))


# docs/semantics.md vector R3 (the rows of R1, then empty padding rows).
DECODE_ROWS, DECODE_LENS = [[8, 9, -1, -1]], [2]
PREFILL_ROWS = [[25, 26, -1, -1], [25, 26, 27, -1], [25, 26, 27, 4], [-1] * 4, [-1] * 4]
PREFILL_LENS = [2, 3, 4, 0, 0]


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("backend", sorted(BACKEND_PLATFORMS))
def test_padding_requests_have_no_bound(backend, validate):
    builder = make_builder(CONFIG, backend)
    md = builder.build(vector_r3([8, 5]), validate=validate)
    builder.check()
    assert md.decode_swa_indices[:, 0].tolist() == DECODE_ROWS and md.decode_swa_lens.tolist() == DECODE_LENS
    assert md.prefill_swa_indices[:, 0].tolist() == PREFILL_ROWS and md.prefill_swa_lens.tolist() == PREFILL_LENS
    assert md.prefill_gather_lens.tolist() == [4, 0, 0]
    assert md.replay_start.tolist() == [8, 5, 0, 0]
    ref = build_reference(CONFIG, vector_r3([8, 5]))
    assert ref.prefill_lens.tolist() == PREFILL_LENS and ref.decode_lens.tolist() == DECODE_LENS
    assert ref.replay_start.tolist() == [8, 5, 0, 0]
    assert not plain_differences(CONFIG, vector_r3([8, 5]), md)  # the plain model gives padding no bound too


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_the_padded_bounds_are_rewritten_by_every_build(backend):
    """The builder's padded copy is rewritten by each build that pads: a later build never reads an earlier
    one's bounds."""
    builder = make_builder(CONFIG, backend)
    builder.build(vector_r3([8, 5]))
    decode = AttentionBatch.from_lists(
        [10, 0, 0], [1, 0, 0], [[7, 3, 2], [0, 0, 0], [0, 0, 0]], block_size=4, num_tokens=3
    )
    md = builder.build(decode.replace(replay_start=torch.tensor([7], dtype=torch.int32)))
    builder.check()
    assert md.replay_start.tolist() == [7, 0, 0]
    # Positions 7, 8, 9: pages 1, 2, 2 of [7, 3, 2], slots 3 * 4 + 3, 2 * 4 + 0, 2 * 4 + 1.
    assert md.decode_swa_indices[:1, 0].tolist() == [[15, 8, 9, -1]] and md.decode_swa_lens.tolist() == [3, 0, 0]


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_a_request_with_tokens_past_the_bounds_is_refused(backend, validate):
    builder = make_builder(CONFIG, backend)
    with pytest.raises(
        BatchShapeError,
        match=r"^replay_start has 1 entries for 4 requests, and request 1 past them "
        r"has 3 query tokens",
    ) as info:
        builder.build(vector_r3([8]), validate=validate)
    assert info.value.field == "replay_start" and info.value.index == 1


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_group_builds_take_padded_bounds(backend):
    builder = make_builder(dataclasses.replace(CONFIG, num_kv_groups=2), backend)
    batch = vector_r3([8, 5])
    tables = torch.stack([batch.block_table, batch.block_table + 1])
    slots = torch.stack([batch.slot_mapping, torch.where(batch.slot_mapping >= 0, batch.slot_mapping + 4, -1)])
    mds = builder.build_groups(batch, tables, slots)
    builder.check()
    assert mds[0].prefill_swa_lens.tolist() == PREFILL_LENS and mds[1].prefill_swa_lens.tolist() == PREFILL_LENS
    assert mds[0].prefill_swa_indices[:, 0].tolist() == PREFILL_ROWS
    # Group 1's pages are one further on: position p sits at slot(p) + 4.
    shifted = [[v + 4 if v >= 0 else -1 for v in row] for row in PREFILL_ROWS]
    assert mds[1].prefill_swa_indices[:, 0].tolist() == shifted
    with pytest.raises(BatchShapeError, match="request 1 past them"):
        builder.build_groups(vector_r3([8]), tables, slots)


@pytest.mark.parametrize("groups", [False, True])
@pytest.mark.parametrize("backend", sorted(BACKEND_PLATFORMS))
def test_a_write_into_the_default_bounds_bounds_no_later_build(backend, groups):
    """A build without bounds hands out zeros as ``md.replay_start``, a buffer the kernels read: a caller that
    writes into it must not bound the next build (docs/semantics.md #fixed-buffers)."""
    builder = make_builder(CONFIG, backend)
    decode = AttentionBatch.from_lists([10, 9], [1, 1], [[7, 3, 2], [5, 6, 1]], block_size=4)
    ref = build_reference(CONFIG, decode)
    build = (
        (lambda: builder.build_groups(decode, [decode.block_table], [decode.slot_mapping])[0])
        if groups
        else (lambda: builder.build(decode))
    )
    md = build()
    assert md.replay_start.tolist() == [0, 0] and md.decode_swa_lens.tolist() == ref.decode_lens.tolist() == [4, 4]
    md.replay_start[0] = 9  # would leave request 0 one visible position
    md = build()
    builder.check()
    assert md.replay_start.tolist() == [0, 0]
    assert md.decode_swa_lens.tolist() == [4, 4]
    assert md.decode_swa_indices[:, 0].tolist() == ref.decode_indices[:, 0].tolist()


# -- a padding request the device offsets contradict (rule 14, docs/semantics.md #guarded-builds) ------------


def contradicted() -> AttentionBatch:
    """Vector R3, but the device ``query_start_loc`` gives padding request 2 (no query tokens in the host copy,
    so no bound) a token of its own, row 4, with its own slot (position 4 of a request of S = 5 on block 0):
    it would be built without a bound."""
    batch = AttentionBatch.from_lists(
        [10, 9, 5, 0], [1, 3, 1, 0], [[7, 3, 2], [5, 6, 1], [0, 0, 0], [0, 0, 0]], block_size=4, num_tokens=6
    )
    host = torch.tensor([0, 1, 4, 4, 4], dtype=torch.int32)
    return batch.replace(query_start_loc_cpu=host, max_query_len=3, replay_start=torch.tensor([8, 5], dtype=torch.int32))


def assert_contradiction_recorded(builder, mds) -> None:
    """Requests 0 and 1 keep vector R1's rows; padding request 2's row (prefill row 3) is emptied with its
    gather length, and the record names the device offsets and request 2."""
    for md in mds:
        assert md.decode_swa_indices[:, 0].tolist() == DECODE_ROWS and md.decode_swa_lens.tolist() == DECODE_LENS
        assert md.prefill_swa_indices[:, 0].tolist() == PREFILL_ROWS and md.prefill_swa_lens.tolist() == PREFILL_LENS
        assert md.prefill_gather_lens.tolist() == [4, 0, 0]
        assert md.replay_start.tolist() == [8, 5, 0, 0]
    with pytest.raises(BatchConsistencyError, match=r"^(group \d: )?request 2: its 1 query tokens on the device") as info:
        builder.check()
    assert info.value.field == "query_start_loc" and info.value.index == 2


@pytest.mark.parametrize("backend", sorted(BACKEND_PLATFORMS))
def test_a_padding_request_the_device_gives_tokens_is_emptied_and_recorded(backend):
    builder = make_builder(CONFIG, backend)
    batch = contradicted()
    md = builder.build(batch)
    assert_contradiction_recorded(builder, [md])
    assert metadata_differences(md, reference_builder(CONFIG).build(batch)) == []
    # Full validation compares the two copies entry by entry.
    with pytest.raises(BatchConsistencyError, match=r"^query_start_loc\[3\]=5 differs from its host copy"):
        builder.build(batch, validate=True)


@pytest.mark.parametrize("backend", sorted(BACKEND_PLATFORMS))
def test_a_group_build_records_the_contradicted_padding_request(backend):
    builder = make_builder(dataclasses.replace(CONFIG, num_kv_groups=2), backend)
    batch = contradicted()
    mds = builder.build_groups(batch, [batch.block_table] * 2, torch.stack([batch.slot_mapping] * 2))
    assert_contradiction_recorded(builder, mds)


@pytest.mark.parametrize("backend", sorted(BACKEND_PLATFORMS))
def test_an_engine_builder_records_the_contradicted_padding_request(backend):
    engine = EngineSWABuilder(CONFIG, "cpu", backend=backend, platform=PlatformInfo.from_assume(BACKEND_PLATFORMS[backend]))
    batch = contradicted()
    cm = common_metadata(batch, num_reqs=4, num_actual_tokens=6)
    md = engine.build(0, cm, replay_start=batch.replay_start)
    assert_contradiction_recorded(engine.builder, [md])


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("backend", sorted(BACKEND_PLATFORMS))
def test_a_draft_update_records_a_padding_decode_the_device_gives_tokens(backend, groups):
    """A decode-only CUDA-graph step padded to 3 requests, one bound: after the build the engine's device offsets
    give padding request 1 a token (row 1, with a slot): the update empties its row and records rule 14."""
    config = dataclasses.replace(CONFIG, num_kv_groups=2)
    builder = make_builder(config, backend)
    batch = AttentionBatch.from_lists([10, 0, 0], [1, 0, 0], [[7, 3, 2], [4, 5, 6], [0, 0, 0]], block_size=4, num_tokens=3)
    batch = batch.replace(replay_start=torch.tensor([8], dtype=torch.int32))
    if groups == 1:
        built = [builder.build(batch)]
    else:
        built = builder.build_groups(batch, [batch.block_table] * 2, [batch.slot_mapping, batch.slot_mapping.clone()])
    builder.check()
    assert built[0].decode_swa_lens.tolist() == [2, 0, 0]
    batch.query_start_loc[2:] = 2  # request 1 takes row 1 on the device; its host copy still has none
    batch.seq_lens[:2] += torch.tensor([1, 2], dtype=torch.int32)  # the draft step: S = 11 and 2
    for md in built:
        md.slot_mapping[:2] = torch.tensor([13, 17])  # position 10 of request 0 (block 3), position 1 of request 1
    builder.update_draft_decode_metadata(built if groups > 1 else built[0])
    for md in built:
        assert md.decode_swa_lens.tolist() == [3, 0, 0]  # positions 8..10 of request 0; request 1's row emptied
        assert md.decode_swa_indices[1, 0].tolist() == [-1] * 4
    with pytest.raises(BatchConsistencyError, match=r"^(group \d: )?request 1: its 1 query tokens on the device"):
        builder.check()
