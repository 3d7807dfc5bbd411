"""Conformance topic: CUDA graphs. A decode-only build is captured once and replays correctly on new
inputs; collected for backends that claim ``cuda_graphs``, run on a GPU with ``-m gpu``."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from ..builder import SWAMetadataBuilder
from ..compare import compare_with_reference
from ..scenarios import synthesize_batch
from .fixtures import CONFORMANCE_CONFIGS, BackendFixtures, Target, requires


def check_graph_replay(builder: SWAMetadataBuilder, *, rng: random.Random, num_reqs: int = 64, replays: int = 5) -> int:
    """Capture ``builder.build`` of a uniform decode batch, then change seq_lens, the block table and
    the slot mapping in place and replay; every replay must equal the reference. Returns replays."""
    config = builder.config
    device = builder.device

    def lengths() -> list[int]:
        return [rng.randint(1, min(config.max_model_len, 40 * config.window_size)) for _ in range(num_reqs)]

    widest = -(-min(config.max_model_len, 40 * config.window_size) // config.block_size)
    static = synthesize_batch(config, lengths(), [1] * num_reqs, rng=rng, device=device, extra_pages=0)
    table = torch.full((num_reqs, widest), -1, dtype=torch.int32, device=device)
    table[:, : static.block_table.shape[1]] = static.block_table
    static.block_table = table
    builder.warmup()
    builder.build(static)  # everything allocated and compiled before capture
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        md = builder.build(static)
    for _ in range(replays):
        fresh = synthesize_batch(config, lengths(), [1] * num_reqs, rng=rng, device=device)
        static.seq_lens.copy_(fresh.seq_lens)
        assert static.seq_lens_cpu is not None and fresh.seq_lens_cpu is not None, (
            "synthesized batches carry seq_lens_cpu"
        )
        static.seq_lens_cpu.copy_(fresh.seq_lens_cpu)
        static.block_table.fill_(-1)
        static.block_table[:, : fresh.block_table.shape[1]].copy_(fresh.block_table)
        static.slot_mapping.copy_(fresh.slot_mapping)
        md.decode_swa_indices.fill_(-7)  # poison: every row must be rewritten by the replay
        graph.replay()
        torch.cuda.synchronize(device)
        problems = compare_with_reference(config, static, md)
        assert not problems, "graph replay: " + "; ".join(problems)
    return replays


class GraphTests(BackendFixtures):
    """Capture a decode build of the V4 config in a CUDA graph and replay it on new inputs."""

    @requires("cuda_graphs")
    @pytest.mark.gpu
    def test_decode_build_replays_in_a_cuda_graph(
        self, target: Target, make_builder: Callable[..., SWAMetadataBuilder]
    ) -> None:
        if target.device.type != "cuda":
            pytest.fail("the CUDA-graph claim is checked on a CUDA device; run this suite there with -m gpu")
        check_graph_replay(make_builder(CONFORMANCE_CONFIGS["v4"]), rng=random.Random(0))
