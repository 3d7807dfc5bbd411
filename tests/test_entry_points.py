"""The entry points beside build (draft-step updates, group builds, check, image spans) are as safe as
build: an update writes only the group its metadata is from, refuses metadata that is not of one
build or claims more rows than its build made, and every method that touches the builder's buffers
holds its lock (docs/semantics.md #draft-updates, #group-builds, #guarded-builds)."""

from __future__ import annotations

import dataclasses
import random
import threading

import pytest
import torch
from helpers import make_builder

from swa_hal import errors as E
from swa_hal.compare import compare_with_reference
from swa_hal.testing.batches import random_batch
from swa_hal.testing.groups import other_groups

from test_cache import CONFIG

BACKENDS = ["torch", "cuda", "rocm"]


def _decode_step(config, seed):
    rng = random.Random(seed)
    batch = random_batch(config, rng, "mtp")
    tables, slots = other_groups(config, batch, config.num_kv_groups, rng)
    return batch, tables, slots


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_single_update_of_group_g_updates_group_g(backend):
    """A group's metadata updated alone rewrites that group's rows, not group 0's."""
    builder = make_builder(CONFIG, backend)
    batch, tables, slots = _decode_step(CONFIG, 1)
    mds = builder.build_groups(batch, tables, slots)
    before = [m.decode_swa_indices.clone() for m in mds]
    batch.seq_lens[: mds[0].num_decodes] += 1
    builder.update_draft_decode_metadata(mds[2])
    assert torch.equal(mds[0].decode_swa_indices, before[0]), "group 0 was rewritten"
    group = dataclasses.replace(batch, block_table=tables[2], slot_mapping=slots[2])
    assert compare_with_reference(CONFIG, group, mds[2]) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_grouped_update_of_two_builds_is_refused(backend):
    builder = make_builder(CONFIG, backend)
    batch, tables, slots = _decode_step(CONFIG, 2)
    first = builder.build_groups(batch, tables[:2], slots[:2])
    other_batch, other_tables, other_slots = _decode_step(CONFIG, 3)
    second = builder.build_groups(other_batch, other_tables, other_slots)
    mixed = [second[0], first[1]]
    with pytest.raises(E.BatchShapeError, match="metadata 1") as info:
        builder.update_draft_decode_metadata(mixed)
    assert info.value.index == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_update_claiming_more_decode_tokens_is_refused(backend):
    """An engine that rebuilt the metadata with a larger num_decode_tokens gets a typed error, not writes
    past the rows its build made."""
    builder = make_builder(CONFIG, backend)
    batch = random_batch(CONFIG, random.Random(4), "decode")
    md = builder.build(batch)
    for ndt in (md.num_decode_tokens + 1, CONFIG.max_num_batched_tokens + 1, -1):
        bad = dataclasses.replace(md, num_decode_tokens=ndt)
        with pytest.raises((E.BatchShapeError, E.BatchCapacityError), match="num_decode_tokens"):
            builder.update_draft_decode_metadata(bad)
    with pytest.raises(E.BatchDtypeError, match="num_decodes"):
        builder.update_draft_decode_metadata(dataclasses.replace(md, num_decodes=1.0))
    with pytest.raises(ValueError, match="not built by this builder"):
        make_builder(CONFIG, backend).update_draft_decode_metadata(md)


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_validated_group_builds_name_the_group(backend):
    builder = make_builder(CONFIG, backend, validate=True)
    batch, tables, slots = _decode_step(CONFIG, 5)
    bad = tables[1].clone()
    bad[0, :] = -7  # every page of the first request
    with pytest.raises(E.BatchValidationError, match="^.*group 1: "):
        builder.build_groups(batch, [tables[0], bad, tables[2]], slots)


def test_check_and_image_spans_hold_the_builder_lock():
    builder = make_builder(CONFIG, "torch")
    assert builder._lock.lock.acquire(blocking=False)  # another thread is inside a build
    try:
        with pytest.raises(E.ConcurrentBuildError, match="check"):
            builder.check()
        with pytest.raises(E.ConcurrentBuildError, match="image_spans_from_ranges"):
            builder.image_spans_from_ranges({0: [(0, 1)]}, 1)
    finally:
        builder._lock.lock.release()
    builder.check()  # free again: nothing recorded, nothing raised
    spans = builder.image_spans_from_ranges({0: [(0, 1)]}, 1)
    assert spans.starts.tolist() == [0]


def test_check_is_safe_beside_builds_in_other_threads():
    """One thread builds while another checks: each call either runs or raises ConcurrentBuildError."""
    builder = make_builder(CONFIG, "torch")
    batch = random_batch(CONFIG, random.Random(6), "decode")
    errors: list[BaseException] = []

    def builds():
        for _ in range(30):
            try:
                builder.build(batch)
            except E.ConcurrentBuildError:
                pass
            except BaseException as exc:  # pragma: no cover - the failure this test looks for
                errors.append(exc)

    thread = threading.Thread(target=builds)
    thread.start()
    for _ in range(200):
        try:
            builder.check()
        except E.ConcurrentBuildError:
            pass
    thread.join()
    assert errors == []
