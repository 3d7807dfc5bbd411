#!/usr/bin/env python
"""Why bench_build.py's mtp_decode graph time differs from kernel_gpu_time.py's for the same shape.

Times the captured build of configs/batches/mtp_decode.yaml (128 x 3 tokens) in CUDA-graph replays under
the conditions that differ between the two scripts, interleaved over three repetitions: a fresh builder
with the scenario's config, the same after 2000 host-timed builds, a builder of the config with
max_num_seqs 512 (kernel_gpu_time.py's), and the batch kernel_gpu_time.py synthesises for that shape.

    python3 benchmarks/mtp_graph_probe.py
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import run_info, warm_gpu  # noqa: E402
from kernel_gpu_time import replay_us  # noqa: E402

from swa_hal import SWAConfig, SWAMetadataBuilder  # noqa: E402
from swa_hal.scenarios import Scenario, synthesize_batch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()}; {run_info()}")
    config = SWAConfig.from_yaml(ROOT / "configs" / "deepseek_v4_flash_mtp.yaml")
    wide = SWAConfig(**{**config.to_dict(), "max_num_seqs": 512, "compress_ratios": config.compress_ratios})
    scenario = Scenario.from_yaml(ROOT / "configs" / "batches" / "mtp_decode.yaml").make_batch(config, dev)
    rng = random.Random(0)
    synthetic = synthesize_batch(wide, [rng.randint(3, 32768) for _ in range(128)], [3] * 128, rng=rng, device=dev)

    def builder(cfg: SWAConfig) -> SWAMetadataBuilder:
        b = SWAMetadataBuilder(cfg, device=dev, validate=False)
        b.warmup()
        return b

    used = builder(config)
    for _ in range(2000):
        used.build(scenario)
    torch.cuda.synchronize()
    variants = {
        "scenario batch, fresh builder": (builder(config), scenario),
        "scenario batch, after 2000 builds": (used, scenario),
        "scenario batch, max_num_seqs 512": (builder(wide), scenario),
        "synthesised batch, max_num_seqs 512": (builder(wide), synthetic),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(3):
        for name, (b, batch) in variants.items():
            warm_gpu(dev)
            times[name].append(replay_us(lambda b=b, x=batch: b.build(x), dev)[0])
    for name, values in times.items():
        print(f"{name:<40} GPU {statistics.median(values):6.2f} us/replay ({min(values):.2f}-{max(values):.2f})")
    q = scenario.query_start_loc_cpu
    print(f"scenario: {scenario.num_tokens} tokens, query lengths {sorted(set((q[1:] - q[:-1]).tolist()))}, "
          f"max_query_len {scenario.max_query_len}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
