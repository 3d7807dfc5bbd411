#!/usr/bin/env python
"""Pieces of one swa_hal kernel launch on a GPU host: argument preparation, the stream query, the
compiled launch function with prepared addresses, and the kernel's GPU time (to rule out back-pressure)."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swa_hal import SWAConfig, SWAMetadataBuilder  # noqa: E402
from swa_hal.scenarios import Scenario  # noqa: E402


def med(fn, reps=2000):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    s = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        s.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(s) * 1e6


def main():
    from triton.runtime.driver import driver

    config = SWAConfig.from_yaml(ROOT / "configs" / "deepseek_v4_flash.yaml")
    batch = Scenario.from_yaml(ROOT / "configs" / "batches" / "decode_only.yaml").make_batch(config, "cuda")
    b = SWAMetadataBuilder(config, device="cuda", validate=False)
    b.warmup()
    b.build(batch)
    launcher = b.backend._rows
    launch, head, constexprs = next(iter(launcher._compiled.values()))
    kernel = next(iter(launcher.kernels.values()))
    md = kernel.metadata
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; torch threads {torch.get_num_threads()}")
    print("metadata:", {k: getattr(md, k, None) for k in ("num_warps", "shared", "global_scratch_size",
                                                          "profile_scratch_size", "launch_pdl", "launch_cooperative_grid")},
          "n_regs", kernel.n_regs, "n_spills", kernel.n_spills)
    captured = {}

    def grab(self, key, grid, args):
        captured["key"], captured["grid"], captured["args"] = key, grid, args

    real = type(launcher).__call__
    type(launcher).__call__ = grab
    b.build(batch)
    type(launcher).__call__ = real
    key, grid, args = captured["key"], captured["grid"], captured["args"]
    ints = list(launcher._values(args))  # the record's values in signature order (addresses already)
    stream = driver.active.get_current_stream(0)
    run = kernel.run
    fn, pm = kernel.function, kernel.packed_metadata
    res = {}
    res["stream query"] = med(lambda: driver.active.get_current_stream(0))
    res["knobs hook read"] = med(lambda: triton.knobs.runtime.launch_enter_hook)
    res["compiled run, prepared addresses"] = med(lambda: run(grid, 1, 1, stream, fn, pm, None, None, None, *ints, *constexprs))
    res["record values (attrgetter)"] = med(lambda: launcher._values(args))
    res["direct C launch, prepared addresses"] = med(lambda: launch(grid, 1, 1, stream, *head, *ints, *constexprs))
    res["launch object call"] = med(lambda: launcher(key, grid, args))
    res["kernel.run attribute"] = med(lambda: kernel.run)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(500):
        run(grid, 1, 1, stream, fn, pm, None, None, None, *ints, *constexprs)
    end.record()
    torch.cuda.synchronize()
    res["GPU time per kernel (500 back-to-back)"] = start.elapsed_time(end) * 1e3 / 500
    for k, v in res.items():
        print(f"{k:<42} {v:8.2f} us")


if __name__ == "__main__":
    main()
