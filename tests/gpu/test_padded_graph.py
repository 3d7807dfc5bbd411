"""On the GPU: a step padded to a captured request count, with fewer replay bounds than requests
(docs/semantics.md #bounded-replay, vector R3), captured in a CUDA graph and replayed after the engine's
in-place updates of its persistent inputs, equals the CPU reference at every replay (plain and group builds)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from swa_hal import AttentionBatch, SWAConfig
from swa_hal.reference import build_reference

from helpers import CONFIGS, gpu_builder, graph_backends

pytestmark = pytest.mark.gpu

REAL, PADDED = 45, 64  # a uniform decode step of 45 requests in the 64-request graph


class Step:
    """The engine's persistent inputs of a padded uniform decode step (vLLM's FULL graph): the padding
    requests have no query token, sequence length 0 and table rows of block 0; the replay bounds are a
    slice of the real requests' (``REAL`` entries for ``PADDED`` requests)."""

    def __init__(self, config: SWAConfig, groups: int, rng: random.Random) -> None:
        self.config, self.groups, self.rng = config, groups, rng
        pages = config.max_model_len // config.block_size
        self.width = pages
        qsl = list(range(REAL + 1)) + [REAL] * (PADDED - REAL)
        self.qsl_cpu = torch.tensor(qsl, dtype=torch.int32)
        self.seq_cpu = torch.zeros(PADDED, dtype=torch.int32)
        self.qsl = self.qsl_cpu.cuda()
        self.seq = torch.zeros(PADDED, dtype=torch.int32, device="cuda")
        self.tables = torch.zeros(groups, PADDED, pages, dtype=torch.int32, device="cuda")
        self.slots = torch.full((groups, PADDED), -1, dtype=torch.int64, device="cuda")
        self.bounds = torch.zeros(PADDED, dtype=torch.int32, device="cuda")  # the engine's buffer
        self.fill()

    def fill(self) -> None:
        """New values in place: sequence lengths, pages, slots and bounds of the real requests."""
        cfg, rng, b = self.config, self.rng, self.config.block_size
        seqs = [rng.randint(1, cfg.max_model_len - 1) for _ in range(REAL)]
        self.seq_cpu[:REAL] = torch.tensor(seqs, dtype=torch.int32)
        self.seq.copy_(self.seq_cpu.cuda())
        num_blocks = cfg.num_kv_blocks
        assert num_blocks is not None  # the test's config sets it
        tables = torch.zeros(self.groups, PADDED, self.width, dtype=torch.int32)
        tables[:, :REAL] = torch.randint(1, num_blocks, (self.groups, REAL, self.width), dtype=torch.int32)
        self.tables.copy_(tables.cuda())
        slots = torch.full((self.groups, PADDED), -1, dtype=torch.int64)
        for r, s in enumerate(seqs):
            pos = s - 1
            slots[:, r] = tables[:, r, pos // b].to(torch.int64) * b + pos % b
        self.slots.copy_(slots.cuda())
        bounds = [rng.choice([0, rng.randint(0, s - 1)]) for s in seqs]  # 0 <= rho <= P = S - 1
        self.bounds[:REAL].copy_(torch.tensor(bounds, dtype=torch.int32))
        self.bounds[REAL:].fill_(12345)  # never read: past the slice handed to the builder

    def batch(self, g: int = 0) -> AttentionBatch:
        return AttentionBatch(
            seq_lens=self.seq,
            query_start_loc=self.qsl,
            query_start_loc_cpu=self.qsl_cpu,
            seq_lens_cpu=self.seq_cpu,
            block_table=self.tables[g],
            slot_mapping=self.slots[g],
            max_query_len=1,
            num_tokens=PADDED,
            replay_start=self.bounds[:REAL],
        )


def check(config: SWAConfig, step: Step, md, g: int) -> None:
    ref = build_reference(config, step.batch(g).to("cpu"))
    assert torch.equal(md.decode_swa_lens.cpu(), ref.decode_lens)
    assert torch.equal(md.decode_swa_indices.cpu(), ref.decode_indices)
    want = torch.cat([step.bounds[:REAL].cpu(), torch.zeros(PADDED - REAL, dtype=torch.int32)])
    assert torch.equal(md.replay_start.cpu(), want)


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("name", graph_backends())
def test_padded_step_with_short_bounds_replays_in_a_cuda_graph(name, groups, report):
    config = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash.yaml")
    config = dataclasses.replace(config, num_kv_groups=groups, num_kv_blocks=4096)
    builder = gpu_builder(name, config)
    step = Step(config, groups, random.Random(f"{name}-{groups}"))

    def build():
        if groups == 1:
            return [builder.build(step.batch())]
        return builder.build_groups(step.batch(), step.tables, step.slots)

    builder.warmup()
    build()  # compile and allocate outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mds = build()
    replays = 0
    for _ in range(6):
        step.fill()
        graph.replay()
        torch.cuda.synchronize()
        builder.check()
        for g, md in enumerate(mds):
            check(config, step, md, g)
        replays += 1
    report(
        f"{name}, {groups} group(s): {replays} replays of a {REAL}-of-{PADDED}-request step with {REAL} bounds, "
        "each equal to the reference"
    )
