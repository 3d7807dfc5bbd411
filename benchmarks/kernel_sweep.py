#!/usr/bin/env python
"""Kernel duration (profiler device timestamps) of decode-256, the 16k-row prefill and a mixed batch, guarded and not,
under several warps per program and tile sizes: one process per setting, since both are read when a
kernel compiles. ``WARPS=4,8 TILES=4096,8192 python3 benchmarks/kernel_sweep.py``.

``KERNELS=path/a.py,path/b.py`` also times other versions of ``kernels/swa_metadata.py`` (same
signature) against the current one, each in its own process: A/B comparisons in one run. ``SWEEP_CONFIG=path.yaml``
times another model config (default ``configs/deepseek_v4_flash.yaml``; a vision config compiles the image paths).
``REPS=2`` repeats the whole sweep, the kernels alternated."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def variant_kernel(source: str):
    """The ``swa_metadata_kernel`` of another version of ``kernels/swa_metadata.py``."""
    import importlib.util

    import swa_hal.kernels

    # A module of swa_hal.kernels, so that its relative imports resolve as the current kernel's do.
    spec = importlib.util.spec_from_file_location("swa_hal.kernels._sweep_variant", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = swa_hal.kernels.__name__
    spec.loader.exec_module(module)
    return module.swa_metadata_kernel


def one() -> None:
    import quiet_kineto  # noqa: F401 - before torch: the profiler's log lines silenced
    import torch

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import kernel_us, warm_gpu

    from swa_hal import SWAConfig, SWAMetadataBuilder
    from swa_hal.scenarios import synthesize_batch

    source = os.environ.get("_SWEEP_KERNEL")
    if source:
        import swa_hal.kernels.swa_metadata as current

        current.swa_metadata_kernel = variant_kernel(source)

    dev = torch.device("cuda")
    config = SWAConfig.from_yaml(os.environ.get("SWEEP_CONFIG") or ROOT / "configs" / "deepseek_v4_flash.yaml")
    rng = random.Random(0)
    shapes = {
        "decode 256": ([rng.randint(1, 32768) for _ in range(256)], [1] * 256),
        "prefill 8 x 2048": ([rng.randint(2048, 16384) for _ in range(8)], [2048] * 8),
        "mixed 64 + 4 x 2048": (
            [rng.randint(1, 32768) for _ in range(64)] + [rng.randint(2048, 16384) for _ in range(4)],
            [1] * 64 + [2048] * 4,
        ),
    }
    out = []
    for label, (seqs, queries) in shapes.items():
        batch = synthesize_batch(config, seqs, queries, rng=rng, device=dev)
        for guard in (True, False):
            b = SWAMetadataBuilder(config, device=dev, guard=guard)
            b.warmup()
            warm_gpu(dev)
            k = b.backend._rows.kernels.get(b.backend.kernel_key())
            out.append(
                f"{label} {'guard' if guard else 'no guard'} {kernel_us(lambda: b.build(batch), dev):5.2f} us"
                f" (regs {getattr(k, 'n_regs', '?')})"
            )
    print(
        f"kernel {os.environ.get('_SWEEP_KERNEL') or 'current'} "
        f"warps {os.environ.get('SWA_HAL_NUM_WARPS', '4')} tile {os.environ.get('SWA_HAL_TILE_ELEMS', 'default')}"
        f" decode tile {os.environ.get('SWA_HAL_DECODE_TILE_ELEMS', 'default')}: " + "; ".join(out),
        flush=True,
    )


def main() -> int:
    if os.environ.get("_SWEEP_CHILD"):
        one()
        return 0
    kernels = [""] + [k for k in os.environ.get("KERNELS", "").split(",") if k]
    for rep in range(int(os.environ.get("REPS", "1"))):
        for kernel in kernels:
            for warps in os.environ.get("WARPS", "4,8").split(","):
                for tile in os.environ.get("TILES", "4096,8192").split(","):
                    env = {
                        **os.environ,
                        "_SWEEP_CHILD": "1",
                        "SWA_HAL_NUM_WARPS": warps,
                        "SWA_HAL_TILE_ELEMS": tile,
                        "_SWEEP_KERNEL": kernel,
                    }
                    subprocess.run([sys.executable, __file__], env=env, timeout=120, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
