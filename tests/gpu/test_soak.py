"""On the GPU: 10,000 builds over random batch shapes, eager builds mixed with graph replays,
every one compared with the reference; allocated memory must not grow after warm-up."""

from __future__ import annotations

import os
import random
import time

import pytest
import torch

from swa_hal import SWAConfig, SWAMetadataBuilder
from swa_hal.reference import build_reference
from swa_hal.scenarios import synthesize_batch
from swa_hal.testing.batches import KINDS, random_batch

from helpers import CONFIGS

pytestmark = pytest.mark.gpu

BUILDS = int(os.environ.get("SWA_HAL_SOAK_BUILDS", "10000"))
POOL = 400
GRAPH_SIZES = (64, 128, 256)


def outputs(md):
    return [md.token_to_req_indices, md.is_valid_token, md.decode_swa_indices, md.decode_swa_lens,
            md.prefill_swa_indices, md.prefill_swa_lens, md.prefill_gather_lens]


def expected(config, batch):
    r = build_reference(config, batch)
    pre = r.split.num_prefill_tokens > 0
    return [r.token_to_req, r.is_valid, r.decode_indices, r.decode_lens,
            r.prefill_indices if pre else None, r.prefill_lens if pre else None, r.prefill_gather_lens]


def same(got, want):
    return all((g is None and w is None) or (g is not None and w is not None and torch.equal(g, w))
               for g, w in zip(got, want))


def test_soak(report):
    config = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash_mtp.yaml")
    builder = SWAMetadataBuilder(config, device="cuda")
    rng = random.Random(7)
    pool = []
    for i in range(POOL):
        kind = KINDS[i % (len(KINDS) - 1)]  # every kind but dspark (a DSpark config is not MTP)
        batch = random_batch(config, rng, kind, max_context=65536, device="cuda")
        pool.append((batch, expected(config, batch)))

    graphs = []
    builder.warmup()
    for size in GRAPH_SIZES:
        lens = [rng.randint(1, 100000) for _ in range(size)]
        static = synthesize_batch(config, lens, [1] * size, rng=rng, device="cuda")
        width = -(-100000 // config.block_size)
        table = torch.full((size, width), -1, dtype=torch.int32, device="cuda")
        table[:, : static.block_table.shape[1]] = static.block_table
        static.block_table = table
        builder.build(static)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            md = builder.build(static)
        variants = []
        for _ in range(8):
            b = synthesize_batch(config, [rng.randint(1, 100000) for _ in range(size)], [1] * size, rng=rng, device="cuda")
            variants.append((b, expected(config, b)))
        graphs.append((static, graph, md, variants))

    def step(i):
        if i % 4 == 3:  # a graph replay
            static, graph, md, variants = graphs[rng.randrange(len(graphs))]
            b, want = variants[rng.randrange(len(variants))]
            static.seq_lens.copy_(b.seq_lens)
            static.block_table.fill_(-1)
            static.block_table[:, : b.block_table.shape[1]].copy_(b.block_table)
            static.slot_mapping.copy_(b.slot_mapping)
            graph.replay()
            return same(outputs(md), want), "graph"
        batch, want = pool[rng.randrange(len(pool))]
        return same(outputs(builder.build(batch)), want), "eager"

    for i in range(200):  # warm-up: every allocation the steady state needs
        assert step(i)[0]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    counts = {"eager": 0, "graph": 0}
    t0 = time.perf_counter()
    for i in range(BUILDS):
        ok, how = step(i)
        assert ok, f"build {i} ({how}) differs from the reference"
        counts[how] += 1
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    grown = torch.cuda.memory_allocated() - base
    assert grown == 0, f"allocated memory grew by {grown} bytes over {BUILDS} builds"
    report(f"{BUILDS} builds ({counts['eager']} eager over {POOL} random shapes, {counts['graph']} graph replays "
           f"of {len(GRAPH_SIZES)} captured sizes) all equal to the reference; allocated memory growth after "
           f"warm-up: {grown} bytes; {elapsed:.1f} s")
