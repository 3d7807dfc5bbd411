#!/usr/bin/env python
"""The host path of a Triton build on the CPU: a decode-256 build of the ``cuda`` backend (an SM90 platform
assumed, the Triton interpreter on) with the kernel launch replaced by a no-op, so what is timed is the
builder's and the backend's Python alone (preflight, plan, launch record, metadata objects), guarded and not.
No GPU needed; on a GPU machine ``host_overhead.py`` measures the same path with real launches.

Runs on any tree (its ``swa_hal`` first on PYTHONPATH), so two trees compare with the same script, in turn:

    for r in 1 2 3; do for t in BEFORE .; do PYTHONPATH=$t:$t/backends python benchmarks/host_path_cpu.py; done; done
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

import swa_hal  # noqa: E402
from swa_hal import PlatformInfo, SWAConfig, SWAMetadataBuilder  # noqa: E402
from swa_hal.kernels import launch  # noqa: E402
from swa_hal.scenarios import synthesize_batch  # noqa: E402

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "deepseek_v4_flash.yaml"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=2000, help="builds per timing (default 2000)")
    p.add_argument("--rounds", type=int, default=7, help="timings per variant; the median is printed (default 7)")
    args = p.parse_args()
    launch.KeyedLaunch.__call__ = lambda self, key, grid, record: None  # type: ignore[method-assign]
    torch.set_num_threads(1)
    config = SWAConfig.from_yaml(CONFIG)
    rng = random.Random(0)
    seqs = [rng.randint(1, 32768) for _ in range(256)]
    batch = synthesize_batch(config, seqs, [1] * 256, rng=rng, device=torch.device("cpu"))
    platform = PlatformInfo.from_assume("vendor=cuda,capability=9.0")
    out = []
    for guard in (False, True):
        builder = SWAMetadataBuilder(config, device="cpu", backend="cuda", guard=guard, platform=platform)
        for _ in range(200):
            builder.build(batch)
        times = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for _ in range(args.iters):
                builder.build(batch)
            times.append((time.perf_counter() - t0) / args.iters * 1e6)
        out.append(f"{'guarded' if guard else 'unguarded'} {statistics.median(times):.2f} us")
    print(
        f"swa_hal from {Path(swa_hal.__file__).parent.parent}: decode-256 host path, launch a no-op: " + "; ".join(out)
    )


if __name__ == "__main__":
    main()
