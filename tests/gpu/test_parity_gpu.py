"""On the GPU: bounded replay, vision spans, V4.1, DSpark draft updates, group builds and guarded builds on
every Triton backend, bit-exact with the reference; graph replays with inputs changed in place; one
launch per build and no host sync (docs/semantics.md #bounded-replay, #vision-spans, #group-builds,
#guarded-builds)."""

from __future__ import annotations

import dataclasses
import random
import threading

import pytest
import torch

from swa_hal import SWAConfig
from swa_hal import errors as E
from swa_hal.compare import compare_with_reference
from swa_hal.scenarios import synthesize_batch
from swa_hal.testing.batches import KINDS, hold_own_slots, random_batch
from swa_hal.testing.groups import other_groups, stacked

pytestmark = pytest.mark.gpu

from helpers import GPU_FORCED, gpu_builder  # noqa: E402

FORCED = GPU_FORCED
CONFIGS = {
    "v4_vision_mtp": SWAConfig(window_size=128, block_size=64, compress_ratios=(0, 4, 128), max_model_len=65536,
                               max_num_batched_tokens=8192, max_num_seqs=256, num_speculative_tokens=1,
                               speculative_method="mtp", max_image_tokens=576, num_kv_groups=4),
    "v41": SWAConfig(window_size=128, block_size=64, compress_ratios=(0, 1, 2), model_version="deepseek_v41",
                     max_model_len=65536, max_num_batched_tokens=8192, max_num_seqs=256, num_kv_groups=8),
    "v4_dspark": SWAConfig(window_size=128, block_size=64, max_model_len=65536, max_num_batched_tokens=4096,
                           max_num_seqs=256, num_speculative_tokens=7, speculative_method="dspark", num_kv_groups=2),
}


builder_for = gpu_builder


@pytest.mark.parametrize("name", list(FORCED))
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_random_batches_with_replay_spans_and_groups(name, config_name, report):
    config = CONFIGS[config_name]
    builder = builder_for(name, config)
    builder.warmup()
    rng = random.Random(f"{name}-{config_name}")
    kinds = [k for k in KINDS if k != "dspark" or config.is_dspark]
    checked = grouped = 0
    for i in range(3 * len(kinds)):
        kind = kinds[i % len(kinds)]
        batch = random_batch(config, rng, kind, max_tokens=4096, extra_pages=1, device="cuda", replay=0.7, spans=1.0,
                             departures=True)
        md = builder.build(batch)
        assert compare_with_reference(config, batch, md) == [], (kind, i)
        checked += 1
        groups = 1 + i % config.num_kv_groups
        tables, slots = other_groups(config, batch, groups, rng)
        if i % 2:  # every other step the groups come stacked in one tensor each
            t3, slots = stacked(tables, slots)
            mds = builder.build_groups(batch, t3, slots)
            tables = list(t3.unbind(0))
        else:
            mds = builder.build_groups(batch, tables, slots)
        for g, gmd in enumerate(mds):
            gb = dataclasses.replace(batch, block_table=tables[g], slot_mapping=slots[g])
            assert compare_with_reference(config, gb, gmd) == [], (kind, i, g)
            grouped += 1
    builder.check()  # valid batches: a guarded build recorded nothing
    report(f"{name} {config_name}: {checked} builds and {grouped} group members bit-exact (replay, spans, V4.1)")


@pytest.mark.parametrize("name", list(FORCED))
def test_graph_replay_with_replay_start_changed_in_place(name, report):
    config = SWAConfig.from_yaml(__import__("helpers").CONFIGS / "deepseek_v4_flash_mtp.yaml")
    builder = builder_for(name, config)
    builder.warmup()
    rng = random.Random(name)
    reqs = 256
    seqs = [rng.randint(200, 20000) for _ in range(reqs)]
    batch = synthesize_batch(config, seqs, [1] * reqs, rng=rng, device="cuda",
                             replay_start=[0] * reqs)
    md = builder.build(batch)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        builder.build(batch)
    for trial in range(6):
        bounds = [rng.choice((0, s - 1, max(0, s - 64), rng.randint(0, s - 1))) for s in seqs]
        batch.replay_start.copy_(torch.tensor(bounds, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert compare_with_reference(config, batch, md) == [], trial
    report(f"{name}: a captured decode build replayed 6 times with replay_start changed in place, bit-exact")


@pytest.mark.parametrize("form", ["listed", "stacked"])
@pytest.mark.parametrize("name", ["cuda", "sm12x"])
def test_group_build_captured_in_a_graph(name, form, report):
    config = CONFIGS["v41"]
    builder = builder_for(name, config)
    builder.warmup()
    rng = random.Random(f"graph-groups-{name}")
    reqs = 256
    seqs = [rng.randint(10, 20000) for _ in range(reqs)]
    batch = synthesize_batch(config, seqs, [1] * reqs, rng=rng, extra_pages=1, device="cuda")
    tables, slots = other_groups(config, batch, 8, rng)
    if form == "stacked":
        t3, slots = stacked(tables, slots)
        tables = t3
    mds = builder.build_groups(batch, tables, slots)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        builder.build_groups(batch, tables, slots)
    for step in range(1, 5):
        batch.seq_lens.add_(1)
        batch.seq_lens_cpu.add_(1)
        for g in range(len(mds)):  # the engine writes the new positions' slots (rule 17)
            hold_own_slots(batch, config.block_size, block_table=tables[g], slot_mapping=slots[g])
        graph.replay()
        torch.cuda.synchronize()
        for g, md in enumerate(mds):
            gb = dataclasses.replace(batch, block_table=tables[g], slot_mapping=slots[g])
            assert compare_with_reference(config, gb, md) == [], (step, g)
    report(f"{name}: 8-group build of 256 decodes ({form}) replayed from one graph 4 times, every group bit-exact")


def test_no_host_sync_on_the_default_path(report):
    config = CONFIGS["v41"]
    builder = builder_for("cuda", config)
    builder.warmup()
    rng = random.Random(5)
    batch = random_batch(config, rng, "mtp", max_tokens=2048, extra_pages=1, device="cuda", replay=1.0)
    tables, slots = other_groups(config, batch, 8, rng)
    builder.build(batch)
    mds = builder.build_groups(batch, tables, slots)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        builder.build(batch)
        builder.build_groups(batch, tables, slots)
        builder.update_draft_decode_metadata(mds)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    report("guarded builds, group builds and group draft updates ran with sync debug mode 'error'")


@pytest.mark.parametrize("name", list(FORCED))
def test_guarded_build_on_malformed_input(name, report):
    config = dataclasses.replace(CONFIGS["v41"], num_kv_blocks=4096)
    builder = builder_for(name, config)
    rng = random.Random(9)
    batch = random_batch(config, rng, "mixed", max_tokens=4096, device="cuda", replay=0.0)
    table = batch.block_table.clone()
    table[0, 0] = 10**6  # past the cache
    table[-1, 0] = -5
    bad = batch.replace(block_table=table, seq_lens=batch.seq_lens.clone())
    bad.seq_lens[1] = 0  # shorter than its query, if it has one
    md = builder.build(bad)
    torch.cuda.synchronize()
    slots = config.num_kv_blocks * config.block_size
    for rows in (md.decode_swa_indices, md.prefill_swa_indices):
        if rows is not None:
            assert bool(((rows == -1) | ((rows >= 0) & (rows < slots))).all())
    with pytest.raises(E.BatchValidationError) as info:
        builder.check()
    report(f"{name}: malformed batch built without a fault, every index -1 or in the cache; check() raised "
           f"{type(info.value).__name__}: {str(info.value)[:80]}")


def test_one_builder_per_thread(report):
    config = CONFIGS["v41"]
    errors = []
    results = {}

    def work(i):
        try:
            builder = builder_for("cuda", config)
            rng = random.Random(i)
            for _ in range(10):
                batch = random_batch(config, rng, "mixed", max_tokens=2048, device="cuda")
                md = builder.build(batch)
                torch.cuda.synchronize()
                results.setdefault(i, []).append(compare_with_reference(config, batch, md))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(p == [] for r in results.values() for p in r) and len(results) == 4
    shared = builder_for("cuda", config)
    batch = random_batch(config, random.Random(1), "decode", device="cuda")
    shared._lock.lock.acquire()
    try:
        with pytest.raises(E.ConcurrentBuildError):
            shared.build(batch)
    finally:
        shared._lock.lock.release()
    report("4 threads, one builder each: 40 builds bit-exact; a shared builder entered twice raised")
