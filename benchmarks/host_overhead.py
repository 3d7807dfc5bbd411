#!/usr/bin/env python
"""Where the host time of a build goes, on the machine it runs on (a GPU machine).

Prints medians (us) of: a small torch op, an empty Triton kernel through Triton's launch path and
through the compiled kernel's launch function (tensor vs raw-address arguments), swa_hal's builder with the
kernel launch replaced by a no-op (its pure Python cost), the launch alone, and whole builds with
tensor and raw-address launches. Compare the first lines with the reference figures
(an empty Triton launch ~12 us, one small torch op ~10 us) to see how fast this host is.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import triton

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swa_hal import AttentionBatch, SWAConfig, SWAMetadataBuilder  # noqa: E402
from swa_hal.scenarios import Scenario  # noqa: E402


@triton.jit
def empty_kernel(x_ptr):
    pass


def med(fn, reps=3000) -> float:
    for _ in range(200):
        fn()
    samples = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
        if i % 500 == 499:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(samples) * 1e6


def main() -> int:
    dev = torch.device("cuda")
    x = torch.zeros(256, dtype=torch.int32, device=dev)
    out: dict[str, float] = {}
    out["torch op x.add_(1)"] = med(lambda: x.add_(1))
    out["empty Triton kernel, Triton launch path"] = med(lambda: empty_kernel[(1,)](x))
    compiled = empty_kernel[(1,)](x)
    from triton.runtime.driver import driver

    stream = driver.active.get_current_stream
    ptr = x.data_ptr()
    out["empty kernel, compiled launcher, tensor arg"] = med(
        lambda: compiled.run(1, 1, 1, stream(0), compiled.function, compiled.packed_metadata, None, None, None, x))
    out["empty kernel, compiled launcher, address arg"] = med(
        lambda: compiled.run(1, 1, 1, stream(0), compiled.function, compiled.packed_metadata, None, None, None, ptr))

    config = SWAConfig.from_yaml(ROOT / "configs" / "deepseek_v4_flash.yaml")
    batch = Scenario.from_yaml(ROOT / "configs" / "batches" / "decode_only.yaml").make_batch(config, dev)
    builder = SWAMetadataBuilder(config, device=dev, validate=False)
    builder.warmup()
    launcher = builder.backend._rows
    out["build"] = med(lambda: builder.build(batch))
    out["backend.compute only"] = med(lambda: builder.backend.compute(
        _plan(builder, batch), batch, builder.buffers))
    out["make_tile_schedulers (3 FlashMLA objects)"] = med(lambda: builder.backend.make_tile_schedulers(256))
    real_call = type(launcher).__call__
    type(launcher).__call__ = lambda self, key, grid, args: None
    out["build without the launch (Python only)"] = med(lambda: builder.build(batch))
    # The same pieces for the mixed step (64 decodes + 4 x 2048 prefill).
    mixed = Scenario.from_yaml(ROOT / "configs" / "batches" / "mixed.yaml").make_batch(config, dev)
    out["mixed: build without the launch"] = med(lambda: builder.build(mixed))
    out["mixed: StepInputs.preflight"] = med(lambda: mixed.inputs.preflight(config, 16384, 0))
    out["mixed: _plan (split)"] = med(lambda: _plan(builder, mixed, whole=True))
    plan, query = _plan(builder, mixed, whole=True)
    out["mixed: _metadatas"] = med(
        lambda: builder._metadatas(plan, query, (mixed.block_table,), (mixed.slot_mapping,)))
    type(launcher).__call__ = real_call
    out["mixed: backend.compute (the launch)"] = med(lambda: builder.backend.compute(plan, mixed, builder.buffers))
    plan_d = _plan(builder, batch)
    out["decode: backend.compute (the launch)"] = med(lambda: builder.backend.compute(plan_d, batch, builder.buffers))
    # The mixed step's launch alone, with its own arguments and other grid sizes: does the host pay for
    # the grid? (Extra programs past the work find nothing to do; fewer leave rows unwritten, harmless here.)
    captured: dict = {}

    def record(self, key, grid, args):
        captured.update(key=key, grid=grid, args=args)

    type(launcher).__call__ = record
    builder.backend.compute(plan, mixed, builder.buffers)
    type(launcher).__call__ = real_call
    for grid in (16, captured["grid"], 2048):
        out[f"mixed: the launch alone, grid {grid}"] = med(
            lambda g=grid: launcher(captured["key"], g, captured["args"]))
    # Single pieces, to compare this host with others.
    from swa_hal.split import split_decodes_and_prefills

    qsl_cpu = batch.query_start_loc_cpu
    out["StepInputs.preflight"] = med(lambda: batch.inputs.preflight(config, 16384, 0))
    out["split (decode-only)"] = med(lambda: split_decodes_and_prefills(qsl_cpu.numpy(), 1, 256, 1))
    out["tensor.data_ptr()"] = med(lambda: x.data_ptr())
    out["tensor.get_device()"] = med(lambda: x.get_device())
    out["cuda tensor slice x[3:]"] = med(lambda: x[3:])
    out["cpu tensor slice"] = med(lambda: qsl_cpu[3:])
    out["torch.from_numpy"] = med(lambda: torch.from_numpy(qsl_cpu.numpy()))
    out["pure Python: sum(range(200))"] = med(lambda: sum(range(200)))
    import os
    import platform

    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"host: {model}; {os.cpu_count()} cpus; load {os.getloadavg()}; python {platform.python_version()}; "
          f"torch threads {torch.get_num_threads()}")
    width = max(len(k) for k in out)
    for key, value in out.items():
        print(f"{key:<{width}}  {value:8.2f} us")
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(out, indent=2))
    return 0


def _plan(builder: SWAMetadataBuilder, batch: AttentionBatch, whole: bool = False) -> Any:
    """The builder's plan of a single build of ``batch`` (``whole``: with the split's query lengths)."""
    found = builder._plan(batch.inputs, batch.inputs.num_reqs, 1)
    return found if whole else found[0]


if __name__ == "__main__":
    sys.exit(main())
