#!/usr/bin/env python
"""A vLLM step of 8 SWA KV-cache groups x decode-256, fed as vLLM's model runner V2 feeds the plugin's
step builds (swa_hal/integrations/vllm_step.py): the step's common metadata, a tuple of 8 per-group
block tables and the slot mappings as one int64 [G, T] view of a persistent [G, max_num_batched_tokens]
buffer. Against, in the same run and interleaved: the 8 per-group swa_hal builds the plugin does
without step builds, and 8 builds of the engine's original launch sequence (``seed_baseline``).

Each step path is what the plugin's swa_hal side does per step: the batch from the common metadata
(``batch_from_common_metadata``), the build (one ``build_groups``, or one ``build`` per group) and the
violation poll; the "plugin step" adds what the step builds' hand-out costs: a ``Step`` per
``prepare_attn`` call and every group's builder asking it for its metadata (each ask checks that the
builder's inputs are the step's). vLLM's own per-group loop and its metadata objects cost the same on
both paths and are left out (this machine has no vLLM; tests/engines/test_vllm.py runs the real hook).

    python benchmarks/vllm_step.py [--reps 5] [--iters 1000]

Prints host time (median wall time without a sync), kernel time (CUPTI) and launches per step, each
repetition's ratios, then the medians with min-max; "step, no poll" is the step build without its
violation poll (what the poll's non-blocking copy and event cost).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "backends"), str(ROOT / "benchmarks")]

GROUPS = 8
REQS = 256


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    p.add_argument("--iters", type=int, default=1000, help="steps timed per repetition and path (default 1000)")
    p.add_argument("--device", default="cuda", help="torch device (default cuda; cpu: a dry run, no kernel times)")
    args = p.parse_args()

    import quiet_kineto  # noqa: F401 - before torch: the profiler's log lines silenced
    import torch
    from common import (
        count_launches,
        host_mean_us,
        host_us,
        kernel_us,
        run_info,
        vllm_group_builds,
        vllm_plugin_options,
        vllm_plugin_step,
        vllm_step_inputs,
        warm_gpu,
    )
    from seed_baseline import SeedSequenceBuilder

    from swa_hal import SWAMetadataBuilder
    from swa_hal.integrations.engine import batch_from_common_metadata

    device = torch.device(args.device)
    inputs = vllm_step_inputs(GROUPS, REQS, device)
    config, batch, tables, rows, common = inputs.config, inputs.batch, inputs.tables, inputs.rows, inputs.common
    slot_mappings, block_tables = inputs.slot_mappings, tables

    step_cm = common(block_tables[0], slot_mappings[0])
    # Both swa_hal paths with the plugin's builders (no planner objects: vLLM makes its own).
    step_builder = SWAMetadataBuilder(config, device=device, **vllm_plugin_options())
    seed = SeedSequenceBuilder(config, device)
    seed_batches = [dataclasses.replace(batch, block_table=t, slot_mapping=s) for t, s in zip(tables, rows)]

    plugin_step = vllm_plugin_step(inputs, step_builder)  # the step with its hand-out, as the plugin runs it

    def step() -> None:
        b = batch_from_common_metadata(step_cm)
        step_builder.build_groups(b, block_tables, slot_mappings)
        step_builder.poll_violations()

    def step_unpolled() -> None:  # what the poll costs: the same step without it
        step_builder.build_groups(batch_from_common_metadata(step_cm), block_tables, slot_mappings)

    per_group = vllm_group_builds(inputs, device, **vllm_plugin_options())

    def seed_sequence() -> None:
        for b in seed_batches:
            seed.build(b)

    paths = {
        "plugin step": plugin_step,
        "step build": step,
        "8 group builds": per_group,
        "8 engine sequences": seed_sequence,
        "step, no poll": step_unpolled,
    }
    print(run_info())
    print(f"backend {step_builder.backend_name}; {GROUPS} groups x decode-{REQS}; {args.reps} interleaved repetitions")
    # Device work per step (kernels, memsets and copies: the poll's copy of the violation record is one),
    # and of it the kernels, whose summed duration is the kernel time.
    launches = {name: count_launches(fn, device) for name, fn in paths.items()}
    gpu = device.type == "cuda"
    launched = {name: kernels_of(fn, device) if gpu else 0 for name, fn in paths.items()}
    kernels = {
        name: kernel_us(fn, device, per_build=launched[name]) if gpu else float("nan") for name, fn in paths.items()
    }
    host: dict[str, list[float]] = {name: [] for name in paths}
    mean: dict[str, list[float]] = {name: [] for name in paths}
    for rep in range(args.reps):
        if gpu:
            warm_gpu(device)
        for name, fn in paths.items():
            iters = args.iters if "step" in name else max(1, args.iters // 4)
            host[name].append(host_us(fn, iters, device))
            # The mean includes the polls that look (every SWA_HAL_POLL_EVERY-th build), the median not.
            mean[name].append(host_mean_us(fn, iters, device))
        p, s, g, e = (host[n][-1] for n in list(paths)[:4])
        print(
            f"  rep {rep + 1}: plugin step {p:.1f} us, step build {s:.1f} us, 8 groups {g:.1f} us ({g / p:.2f}x, "
            f"{g / s:.2f}x), 8 engine sequences {e:.1f} us ({e / p:.1f}x, {e / s:.1f}x)"
        )
    print(f"{'path':<20} {'host us (min-max)':>24} {'mean':>7} {'kernel us':>10} {'kernels':>8} {'device ops':>11}")
    for name in paths:
        v = host[name]
        print(
            f"{name:<20} {statistics.median(v):>10.1f} ({min(v):.1f}-{max(v):.1f}) {statistics.median(mean[name]):>7.1f} "
            f"{kernels[name]:>10.2f} {launched[name]:>8} {launches[name]:>11}"
        )
    for step_path in ("plugin step", "step build"):
        for other in ("8 group builds", "8 engine sequences"):
            ratios = [a / b for a, b in zip(host[other], host[step_path])]
            print(
                f"host ratio {other} / {step_path}: {statistics.median(ratios):.2f}x "
                f"({min(ratios):.2f}-{max(ratios):.2f})"
            )
    med = statistics.median(host["plugin step"])
    print(
        f"targets (the plugin step): host <= 25 us: {'met' if med <= 25 else 'MISSED'} ({med:.1f}); "
        f"1 launch: {'met' if launched['plugin step'] == 1 else 'MISSED'} ({launched['plugin step']} kernels)"
    )
    return 0


def kernels_of(fn, device) -> int:
    """Kernels one ``fn()`` launches (the profiler's device events less memsets and copies)."""
    from common import sync
    from torch.profiler import DeviceType, ProfilerActivity, profile

    fn()
    sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        sync(device)
    return sum(
        1 for e in prof.events() if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
    )


if __name__ == "__main__":
    sys.exit(main())
