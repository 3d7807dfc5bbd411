#!/usr/bin/env python
"""The host-time floor of two calls: what no host path can skip, against the targets set for the whole call.

A call's host time has parts any implementation pays whatever its Python: the kernel launch (the
driver call and Triton's C launcher), the outputs' allocation (the caching allocator), and reading the
facts of the inputs any check must read. This script times those parts alone, in the same run and
interleaved with the whole calls and what they are compared with, and prints how much of each target
is left for everything else (checks, plan, launch record, metadata objects, lock, poll).

* SGLang's decode-256 causal rows (``benchmarks/sglang_rows.py``): the adapter's call
  (``SGLangSWAIndices.causal``), SGLang 0.5.23's own ops (where ``sglang`` imports), the slot-rows
  launch alone (the backend's launch object, with the call's record as the last call left it), and the
  outputs' allocation alone (``new_slot_rows_outputs``). Target: SGLang's ops / 2.
* A plain decode-256 build (``SWAMetadataBuilder.build``, one group, the plugin's options), against its launch
  alone, the facts of its inputs (the four device tensors and the host copy of query_start_loc) and one
  metadata object; the adapter's call above is compared with it too (the same rows, another entry point).
* The vLLM step of 8 SWA groups x decode-256 (``benchmarks/vllm_step.py``): the plugin step (the step
  build and its hand-out to the 8 groups' builders), the 8 per-group builds, the grouped rows launch
  alone, the five facts of each of the 8 block tables any check reads (dtype, device, shape, strides,
  address), and 8 metadata objects (``SWAMetadata.for_group``). All with the plugin's builders (no planner
  objects: vLLM's builders make their own). Targets:
  25 us, and the 8 per-group builds / 5.

The launch objects are reached through the backends' private attributes: a measuring tool, not an API.

    python benchmarks/host_floor.py [--reps 5] [--iters 2000]
    TRITON_INTERPRET=1 python benchmarks/host_floor.py --device cpu --backend cuda \
        --assume vendor=cuda,capability=9.0 --reps 1 --iters 20     # a dry run on a CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "backends"), str(ROOT / "benchmarks")]


def sglang_parts(device, hal: dict) -> dict[str, Callable[[], object]]:
    from sglang_rows import scenarios, sglang_runner

    from swa_hal.integrations.sglang import SGLangSWAIndices
    from swa_hal.slot_rows import new_slot_rows_outputs

    case = scenarios(device)["decode 256"]
    kw = case["kw"]
    adapter = SGLangSWAIndices(device=device, **hal)
    out, _ = adapter.causal(**kw)  # compiles, and leaves the call's record in the backend
    backend = adapter.builder.backend
    # A copy: later calls refill the backend's record with their own outputs, freed after them; this one
    # keeps writing into ``out`` (kept alive here, with the lens beside it in the same allocation).
    launch, record = backend._slot_rows, dataclasses.replace(backend._slot_record)
    (key,) = backend._slot_rows.keys.values()
    grid = launch.programs(key, record)
    n, width = out.shape

    def launch_alone(kept: object = out) -> None:  # ``kept``: the outputs stay allocated while this part runs
        launch(key, grid, record)

    parts = {
        "sglang: adapter call": lambda: adapter.causal(**kw),
        "sglang: launch alone": launch_alone,
        "sglang: outputs alone": lambda: new_slot_rows_outputs(n, width, device),
    }
    theirs = sglang_runner(case)
    if theirs is not None:
        parts["sglang: SGLang's ops"] = theirs
    return parts


def vllm_parts(device, hal: dict) -> dict[str, Callable[[], object]]:
    from common import vllm_group_builds, vllm_plugin_options, vllm_plugin_step, vllm_step_inputs

    from swa_hal import SWAMetadataBuilder
    from swa_hal.integrations.engine import batch_from_common_metadata

    groups = 8
    inputs = vllm_step_inputs(groups, 256, device)
    tables, slots = inputs.tables, inputs.slot_mappings
    hal = {**hal, **vllm_plugin_options()}  # the plugin's builders: no planner objects (vLLM makes its own)
    step_builder = SWAMetadataBuilder(inputs.config, device=device, **hal)
    plugin_step = vllm_plugin_step(inputs, step_builder)
    plugin_step()  # compiles, and leaves the grouped launch's record in the backend
    backend = step_builder.backend
    key, record = backend.kernel_key(True, True), dataclasses.replace(backend._records[True])
    grid = record.programs()
    md = step_builder.build_groups(batch_from_common_metadata(inputs.common(tables[0], slots[0])), tables, slots)[0]
    rows = list(zip(tables, slots.unbind(0)))
    make = step_builder._make_schedulers
    per_group = vllm_group_builds(inputs, device, **hal)

    def table_facts() -> None:
        for t in tables:
            t.dtype, t.get_device(), t.shape, t.stride(), t.data_ptr()  # noqa: B018 - the reads timed

    def metadata_objects() -> None:
        for t, s in rows:
            md.for_group({}, block_table=t, slot_mapping=s, tile_sched=make(256))

    # A plain decode-256 build (one group, the step's batch), against its own floor: its launch, the facts of its
    # inputs any check reads (the four device tensors and the host copy of query_start_loc), one metadata object.
    plain_config = dataclasses.replace(inputs.config, num_kv_groups=1)
    plain_builder = SWAMetadataBuilder(plain_config, device=device, **hal)
    batch = inputs.batch
    plain_md = plain_builder.build(batch)
    plain_backend = plain_builder.backend
    plain_key, plain_record = plain_backend.kernel_key(True, False), dataclasses.replace(plain_backend._records[True])
    plain_grid = plain_record.programs()
    batch_tensors = (batch.seq_lens, batch.query_start_loc, batch.block_table, batch.slot_mapping, batch.query_start_loc_cpu)

    def batch_facts() -> None:
        for t in batch_tensors:
            t.dtype, t.get_device(), t.shape, t.stride(), t.data_ptr()  # noqa: B018 - the reads timed

    plain_make = plain_builder._make_schedulers

    def plain_metadata_object() -> None:
        plain_md.for_group({}, block_table=batch.block_table, slot_mapping=batch.slot_mapping, tile_sched=plain_make(256))

    return {
        "plain: build": lambda: plain_builder.build(batch),
        "plain: launch alone": lambda: plain_backend._rows(plain_key, plain_grid, plain_record),
        "plain: inputs' facts": batch_facts,
        "plain: 1 metadata object": plain_metadata_object,
        "vllm: plugin step": plugin_step,
        "vllm: 8 group builds": per_group,
        "vllm: launch alone": lambda: backend._rows(key, grid, record),
        "vllm: 8 tables' facts": table_facts,
        "vllm: 8 metadata objects": metadata_objects,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    ap.add_argument("--iters", type=int, default=2000, help="calls timed per repetition and part (default 2000)")
    ap.add_argument("--device", default="cuda", help="torch device (default cuda; cpu: a dry run)")
    ap.add_argument("--backend", help="swa_hal backend (default: auto-selected)")
    ap.add_argument("--assume", help="platform to assume, as for the CLI (a CPU dry run of a Triton backend)")
    args = ap.parse_args(argv)
    from swa_hal import PlatformInfo

    hal = {"backend": args.backend, "platform": PlatformInfo.from_assume(args.assume) if args.assume else None}

    import torch
    from common import host_us, run_info, warm_gpu

    device = torch.device(args.device)
    parts = {**sglang_parts(device, hal), **vllm_parts(device, hal)}
    print(run_info())
    times: dict[str, list[float]] = {name: [] for name in parts}
    for rep in range(args.reps):
        if device.type == "cuda":
            warm_gpu(device)
        for name, fn in parts.items():
            for _ in range(min(50, args.iters)):
                fn()
            times[name].append(host_us(fn, args.iters, device))
        print(f"  repetition {rep + 1}/{args.reps} done", flush=True)
    print(f"\n{'part':<28} {'host us, median (min-max)':>28}")
    for name, v in times.items():
        print(f"{name:<28} {statistics.median(v):>12.2f} ({min(v):.2f}-{max(v):.2f})")

    def left(target: list[float], floor_parts: tuple[str, ...], whole: str) -> None:
        """Per repetition: the target, the floor (the parts' sum), and what the target leaves the rest."""
        floor = [sum(times[p][r] for p in floor_parts) for r in range(args.reps)]
        rest = [t - f for t, f in zip(target, floor)]
        now = [w - f for w, f in zip(times[whole], floor)]
        print(
            f"  target {statistics.median(target):.1f} us; floor ({' + '.join(floor_parts)}) "
            f"{statistics.median(floor):.1f} us; left for the rest {statistics.median(rest):.1f} us "
            f"({min(rest):.1f}-{max(rest):.1f}); the call's rest now {statistics.median(now):.1f} us"
        )

    print("\nSGLang decode 256, target SGLang's ops / 2:")
    if "sglang: SGLang's ops" in times:
        left([t / 2 for t in times["sglang: SGLang's ops"]], ("sglang: launch alone", "sglang: outputs alone"),
             "sglang: adapter call")  # fmt: skip
    else:
        print("  SGLang's ops do not import here: no target")
    def ratio(whole: str, over: tuple[str, ...], what: str) -> None:
        """Per repetition: ``whole`` over the sum of the parts ``over``."""
        r = [times[whole][k] / sum(times[p][k] for p in over) for k in range(args.reps)]
        print(f"  {whole} / {what}: {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})")

    print("Ratios, per repetition (targets: plugin step <= 2x its floor, plain build <= 2x its floor, adapter call <= 1.2x")
    print("a plain build of the same rows):")
    floor = ("vllm: launch alone", "vllm: 8 tables' facts", "vllm: 8 metadata objects")
    ratio("vllm: plugin step", floor, "its floor")
    ratio("plain: build", ("plain: launch alone", "plain: inputs' facts", "plain: 1 metadata object"), "its floor")
    ratio("sglang: adapter call", ("plain: build",), "plain: build")
    print("vLLM step of 8 groups, target 25 us:")
    left([25.0] * args.reps, floor, "vllm: plugin step")
    print("vLLM step of 8 groups, target the 8 group builds / 5:")
    left([t / 5 for t in times["vllm: 8 group builds"]], floor, "vllm: plugin step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
