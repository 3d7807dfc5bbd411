"""Prefill context parallelism over real ranks (docs/semantics.md #context-parallel-ranks): 2 and 4 CPU
processes in a gloo group, each building its own rank-local batch of the same global steps and checking it
against the reference over that batch; the positions and slot-mapping parts they all-gather over the group
must give back the global step's own positions and slot mapping."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from collections import Counter

import pytest
import torch

from swa_hal import SWAConfig
from swa_hal.testing.batches import random_batch
from swa_hal.testing.pcp import RankJob, draw_steps, partition, run_rank

V41 = SWAConfig(
    window_size=4,
    block_size=4,
    compress_ratios=(0, 1, 2, 1, 2),
    max_model_len=256,
    max_num_batched_tokens=64,
    max_num_seqs=8,
    model_version="deepseek_v41",
)
V41_DSPARK = dataclasses.replace(V41, speculative_method="dspark", num_speculative_tokens=2)
KINDS = ("mixed", "prefill", "decode", "mtp", "invalid", "short_context")
JOIN_TIMEOUT_S = 120
# The Triton backend runs in the interpreter on the host, selected through an assumed CUDA platform.
INTERPRETED = (("cuda", "vendor=cuda,capability=9.0"),)


def launch(job: RankJob, world: int, tmp_path) -> list[dict]:
    """Run ``run_rank`` in ``world`` spawned processes and return their results, failing the test with a
    rank's own message if it raised, and killing every rank still alive at the deadline (never hanging)."""
    ctx = multiprocessing.get_context("spawn")
    paths = [tmp_path / f"rank{r}.pt" for r in range(world)]
    procs = [ctx.Process(target=run_rank, args=(r, world, job, str(p))) for r, p in enumerate(paths)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(JOIN_TIMEOUT_S)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    assert not hung, f"ranks {hung} still running after {JOIN_TIMEOUT_S}s"
    results = []
    for r, (p, path) in enumerate(zip(procs, paths)):
        assert path.exists(), f"rank {r} exited with code {p.exitcode} and no result"
        res = torch.load(path, weights_only=False)
        assert "error" not in res, res.get("error")
        assert p.exitcode == 0, f"rank {r} exit code {p.exitcode}"
        results.append(res)
    return results


def own_positions(batch) -> list[int]:
    """The global step's positions, row by row: request r's i-th new token sits at S_r - q_r + i."""
    qsl = batch.query_start_loc_cpu.tolist()
    seq = batch.seq_lens_cpu.tolist()
    out = []
    for r in range(len(qsl) - 1):
        q = qsl[r + 1] - qsl[r]
        out += [seq[r] - q + i for i in range(q)]
    return out


def check_gathered(job: RankJob, world: int, results: list[dict]) -> int:
    """Every rank's reference comparison is clean and, per step, the all-gathered positions and slot parts
    (the engine's cache_positions / cache_slot_mapping) agree with the global step: each written row is one
    of the step's tokens with its own position and slot, every token with a slot is written exactly once,
    and the held rows' positions are the step's own (decodes once per rank that runs them)."""
    for r, res in enumerate(results):
        assert res["diffs"] == [], f"rank {r}:\n" + "\n".join(res["diffs"][:20])
    steps = draw_steps(job)
    prefill_rows = 0
    for i, batch in enumerate(steps):
        held = [res["steps"][i][0] for res in results]
        positions, slots = results[0]["steps"][i][1], results[0]["steps"][i][2]
        for r, res in enumerate(results[1:], 1):
            assert torch.equal(res["steps"][i][1], positions), (i, r, "cache_positions differ between ranks")
            assert torch.equal(res["steps"][i][2], slots), (i, r, "cache_slot_mapping differs between ranks")
        assert positions.shape == slots.shape and slots.shape[0] % world == 0, (i, slots.shape)
        t = slots.shape[0] // world
        n = int(batch.query_start_loc_cpu[-1])
        pos = own_positions(batch)
        glob = batch.slot_mapping[:n].tolist()
        want = Counter((p, s) for p, s in zip(pos, glob) if s >= 0)
        got = Counter((int(p), int(s)) for p, s in zip(positions, slots) if s >= 0)
        assert got == want, (i, "written rows are not the step's tokens, each once", got - want, want - got)
        # Held rows: the rank's first `held` rows of its part; padding rows write nothing.
        held_pos = Counter(int(p) for k in range(world) for p in positions[k * t : k * t + held[k]])
        pad_slots = [int(s) for k in range(world) for s in slots[k * t + held[k] : (k + 1) * t]]
        assert all(s == -1 for s in pad_slots), (i, "a padding row writes", pad_slots)
        qsl = batch.query_start_loc_cpu.tolist()
        qlens = [b - a for a, b in zip(qsl, qsl[1:])]
        first = next((r for r, q in enumerate(qlens) if q > job.config.decode_threshold), len(qlens))
        copies = 1 if job.shard_decodes else world
        want_pos = Counter(pos[qsl[first] :]) + Counter({p: copies * c for p, c in Counter(pos[: qsl[first]]).items()})
        assert held_pos == want_pos, (i, "held rows' positions", held_pos - want_pos, want_pos - held_pos)
        assert max(held) == t or n == 0, (i, held, t)
        prefill_rows += n - qsl[first]
    return prefill_rows


@pytest.mark.parametrize(
    "world, config, kinds, shard, backends",
    [
        (2, V41, KINDS, True, ("torch", "cuda")),
        (2, V41_DSPARK, KINDS + ("dspark",), False, ("torch",)),
        # A sweep: world 4, V4.1 and replicated decodes are each held in make test by another case.
        pytest.param(4, V41, KINDS, False, ("torch",), marks=pytest.mark.sweep),
        (4, V41_DSPARK, ("dspark", "mixed", "decode", "prefill"), True, ("torch",)),
    ],
    ids=["pcp2-v41-sharded", "pcp2-dspark-replicated", "pcp4-v41-replicated", "pcp4-dspark-sharded"],
)
def test_ranks_build_their_own_batches(tmp_path, world, config, kinds, shard, backends):
    steps = 2 * len(kinds)
    job = RankJob(
        config=config,
        seed=f"pcp-{world}-{config.speculative_method}-{shard}",
        kinds=kinds,
        steps=steps,
        backends=backends,
        shard_decodes=shard,
        dist_backend="gloo",
        init_method=(tmp_path / "store").as_uri(),
        platforms=INTERPRETED,
    )
    # The spawned ranks inherit this environment: the Triton backend must run in the interpreter there.
    assert os.environ.get("TRITON_INTERPRET") == "1" or backends == ("torch",)
    prefill_rows = check_gathered(job, world, launch(job, world, tmp_path))
    assert prefill_rows > 0, "no step had prefills to cut"


def test_partition_cuts_prefills_dual_chunk_swap():
    """A prefill of 10 tokens at positions 5..14 over 2 ranks: chunks of ceil(10 / 4) = 3, rank 0 holds
    chunks 0 and 3 (positions 5-7, 14), rank 1 chunks 1 and 2 (8-13); a decode before it goes to rank 0
    when sharded; the gathered slot mapping is rank-major with T = 6 rows per rank."""
    cfg = V41
    batch = random_batch(cfg, __import__("random").Random(1), "decode")
    one = dataclasses.replace(
        batch,
        seq_lens=torch.tensor([9, 15], dtype=torch.int32),
        seq_lens_cpu=torch.tensor([9, 15], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 1, 11], dtype=torch.int32),
        query_start_loc_cpu=torch.tensor([0, 1, 11], dtype=torch.int32),
        block_table=torch.arange(8, dtype=torch.int32).view(2, 4),
        slot_mapping=torch.arange(100, 111, dtype=torch.int64),
        max_query_len=10,
        num_tokens=11,
        replay_start=None,
    )
    r0, r1 = partition(one, 2, decode_threshold=cfg.decode_threshold)
    assert r0.segments == [(0, 8, 1), (1, 5, 3), (1, 14, 1)]
    assert r1.segments == [(1, 8, 3), (1, 11, 3)]
    assert r0.positions.tolist() == [8, 5, 6, 7, 14, 0]
    assert r1.positions.tolist() == [8, 9, 10, 11, 12, 13]
    assert r0.gathered_slots.tolist() == [100, 101, 102, 103, 110, -1, 104, 105, 106, 107, 108, 109]
    assert r0.batch.seq_lens.tolist() == [9, 8, 15] and r1.batch.seq_lens.tolist() == [11, 14]
    assert r0.batch.block_table[:, 0].tolist() == [0, 4, 4]
    replicated = partition(one, 2, decode_threshold=cfg.decode_threshold, shard_decodes=False)
    assert replicated[1].segments[0] == (0, 8, 1) and replicated[1].batch.slot_mapping[0] == -1
    assert replicated[0].batch.slot_mapping[0] == 100
