"""On the GPU: draft-step updates captured in a CUDA graph replay correctly."""

from __future__ import annotations

import random

import pytest
import torch

from swa_hal import SWAConfig
from swa_hal.ragged import RaggedDecodeRows
from swa_hal.scenarios import synthesize_batch
from swa_hal.testing.batches import hold_own_slots

from helpers import CONFIGS, gpu_builder, graph_backends

pytestmark = pytest.mark.gpu

@pytest.mark.parametrize("name", graph_backends())
def test_draft_updates_inside_a_cuda_graph(name, report):
    config = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash_mtp.yaml")
    live = gpu_builder(name, config)
    fresh = gpu_builder(name, config)
    rng = random.Random(name)
    reqs = 128
    batch = synthesize_batch(config, [rng.randint(3, 20000) for _ in range(reqs)], [3] * reqs, rng=rng,
                             extra_pages=1, device="cuda")
    live.warmup()
    md = live.build(batch)
    live.update_draft_decode_metadata(md)  # compile and allocate outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        batch.seq_lens.add_(1)  # the engine's in-place advance, captured with the update
        live.update_draft_decode_metadata(md)
    checked = 0
    for _ in range(5):
        start = [rng.randint(3, 20000) for _ in range(reqs)]
        batch.seq_lens.copy_(torch.tensor(start, dtype=torch.int32))
        for step in range(1, 8):
            graph.replay()
            torch.cuda.synchronize()
            current = [s + step for s in start]
            batch.seq_lens_cpu.copy_(torch.tensor(current, dtype=torch.int32))
            assert batch.seq_lens.cpu().tolist() == current
            hold_own_slots(batch, config.block_size)  # the engine writes the new positions' slots (rule 17)
            want = fresh.build(batch)
            assert torch.equal(md.decode_swa_indices, want.decode_swa_indices)
            assert torch.equal(md.decode_swa_lens, want.decode_swa_lens)
            ragged, want_ragged = md.extra(RaggedDecodeRows), want.extra(RaggedDecodeRows)
            if ragged is not None:
                assert torch.equal(ragged.indptr, want_ragged.indptr)
                n = int(ragged.indptr[-1])
                assert torch.equal(ragged.indices[:n], want_ragged.indices[:n])
            checked += 1
    report(f"{name}: {checked} draft steps replayed from one captured graph, each equal to a fresh build")
