#!/usr/bin/env python
"""One build of each shape that matters, for a kernel profiler to look at (Nsight Compute):

    ncu --kernel-name swa_metadata_kernel --launch-skip 8 --launch-count 4 --section SpeedOfLight \\
        --section WarpStateStats --section MemoryWorkloadAnalysis python3 benchmarks/profile_kernel.py

The first eight launches are the warmups (two variants for each of the four builders); then decode-256, 8 x 2048 prefill
(16k rows), 64 + 4 x 2048 mixed, and an 8-group decode-256 build, each once, guarded (the default).
``--guard off`` profiles unguarded builds instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
from pathlib import Path

import quiet_kineto  # noqa: F401 - before torch: the profiler's log lines silenced
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swa_hal import SWAConfig, SWAMetadataBuilder  # noqa: E402
from swa_hal.scenarios import Scenario, synthesize_batch  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--guard", choices=("on", "off"), default="on")
    args = parser.parse_args()
    dev = torch.device("cuda")
    config = dataclasses.replace(SWAConfig.from_yaml(ROOT / "configs" / "deepseek_v4_flash.yaml"), num_kv_groups=8)
    builders = [SWAMetadataBuilder(config, device=dev, guard=args.guard == "on") for _ in range(4)]
    for b in builders:
        b.warmup()
    batches = [Scenario.from_yaml(ROOT / "configs" / "batches" / f"{n}.yaml").make_batch(config, dev)
               for n in ("decode_only", "long_prefill", "mixed")]
    rng = random.Random(0)
    seqs = [rng.randint(1, 32768) for _ in range(256)]
    groups = [synthesize_batch(config, seqs, [1] * 256, rng=rng, device=dev) for _ in range(8)]
    torch.cuda.synchronize()
    for b, batch in zip(builders, batches):
        b.build(batch)
    builders[3].build_groups(groups[0], [g.block_table for g in groups], [g.slot_mapping for g in groups])
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
