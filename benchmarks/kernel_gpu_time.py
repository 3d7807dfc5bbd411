#!/usr/bin/env python
"""GPU time of one build's kernel for batch shapes that separate the factors (token rows, requests,
query length, context length), two ways: each build captured in a CUDA graph and timed with CUDA
events over back-to-back replays ("GPU", which includes the graph launch's own latency: the first
lines time a graph of one empty kernel), and the kernel's duration from the profiler's device
timestamps ("kernel"); after keeping the GPU busy so its clock is up."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import quiet_kineto  # noqa: F401 - before torch: the profiler's log lines silenced
import torch
import triton

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import kernel_us, run_info, sm_clock_mhz, warm_gpu  # noqa: E402

from swa_hal import SWAConfig, SWAMetadataBuilder  # noqa: E402
from swa_hal.scenarios import synthesize_batch  # noqa: E402

SHAPES = [  # (label, requests, query length, context range)
    ("decode 256 x 1, ctx 1..32768", 256, 1, (1, 32768)),
    ("decode 384 x 1, ctx 1..32768", 384, 1, (1, 32768)),
    ("decode 128 x 1, ctx 1..32768", 128, 1, (1, 32768)),
    ("mtp 128 x 3, ctx 3..32768", 128, 3, (3, 32768)),
    ("mtp 128 x 3, ctx 4096", 128, 3, (4096, 4096)),
    ("decode 256 x 1, ctx 4096", 256, 1, (4096, 4096)),
    ("prefill 8 x 2048, ctx 2048..16384", 8, 2048, (2048, 16384)),
]


def main() -> int:
    # The tile (elements per program) decides how many programs a build launches: time each shape
    # under several tiles to choose the defaults, decode rows (DECODE_TILES) and prefill rows (TILES)
    # separately.
    print(f"device: {torch.cuda.get_device_name()}; {run_info()}", flush=True)
    graph_floor(torch.device("cuda"))
    for tile in os.environ.get("DECODE_TILES", "256,512,1024").split(","):
        os.environ["SWA_HAL_DECODE_TILE_ELEMS"] = tile
        print(f"decode tile {tile} elements per program", flush=True)
        shapes(prefill=False)
    os.environ.pop("SWA_HAL_DECODE_TILE_ELEMS")
    for tile in os.environ.get("TILES", "2048,4096").split(","):
        os.environ["SWA_HAL_TILE_ELEMS"] = tile
        print(f"prefill tile {tile} elements per program", flush=True)
        shapes(prefill=True)
    os.environ.pop("SWA_HAL_TILE_ELEMS")
    return 0


@triton.jit
def _empty(x_ptr):
    pass


def replay_us(fn, dev: torch.device) -> tuple[float, float]:
    """``fn`` captured in a CUDA graph: GPU time per replay (median and min of 5 x 200 replays, CUDA
    events), after keeping the GPU busy so its clock is up."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    warm_gpu(dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(200):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / 200)
    times.sort()
    return times[2], times[0]


def graph_floor(dev: torch.device) -> None:
    """GPU time per replay of a graph holding one empty kernel: the floor under every figure here."""
    x = torch.zeros(1, device=dev)
    for programs in (1, 64, 512):
        med, low = replay_us(lambda n=programs: _empty[(n,)](x), dev)
        kernel = kernel_us(lambda n=programs: _empty[(n,)](x), dev)
        print(f"{'empty kernel, ' + str(programs) + ' programs':<36} GPU {med:6.2f} us/replay (min {low:.2f})  "
              f"kernel {kernel:5.2f} us")


def shapes(prefill: bool) -> int:
    dev = torch.device("cuda")
    config = SWAConfig.from_yaml(ROOT / "configs" / "deepseek_v4_flash_mtp.yaml")
    config = SWAConfig(**{**config.to_dict(), "max_num_seqs": 512, "compress_ratios": config.compress_ratios})
    rng = random.Random(0)
    for label, reqs, q, (lo, hi) in SHAPES:
        if label.startswith("prefill") != prefill:
            continue
        builder = SWAMetadataBuilder(config, device=dev)
        builder.warmup()
        batch = synthesize_batch(config, [rng.randint(lo, hi) for _ in range(reqs)], [q] * reqs, rng=rng, device=dev)
        med, low = replay_us(lambda b=builder, x=batch: b.build(x), dev)
        kernel = kernel_us(lambda b=builder, x=batch: b.build(x), dev)
        key = builder.backend.kernel_key()
        block = key.BLOCK_TP if prefill else key.BLOCK_T
        print(f"{label:<36} rows {batch.num_tokens:>6}  programs {-(-batch.num_tokens // block):>5}  "
              f"GPU {med:6.2f} us/build (min {low:.2f})  kernel {kernel:5.2f} us  sm clock {sm_clock_mhz(dev)} MHz",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
