#!/usr/bin/env python
"""Side-by-side timing of swa_hal builds and the seed's launch sequence, in one run.

For each scenario of configs/batches/ (decode-only 256, MTP 128x3, 64 decodes + 4x2048 prefill,
8x2048 prefill) and each runner (swa_hal backends runnable here, and the baseline: the seed's launch
sequence on a GPU, a straightforward vectorized PyTorch build on the CPU) it prints

  host us      median wall time of build() without synchronising (what the engine's CPU pays)
  e2e us       median wall time of sync; build(); sync
  graph us     a decode-only build captured in a CUDA graph: GPU time per replay (CUDA events over
               200 back-to-back replays; the wall time per replay is kept in the JSON as graph_wall_us)
  launches     GPU kernels (and memsets/copies) per build, from torch.profiler; on the CPU, aten ops

with the baseline/swa_hal ratios and the performance targets, checks every runner's output against the
reference, and writes a table, JSON and a PNG chart to ``--out`` (default benchmarks/out/, which git ignores;
benchmarks/results/ holds the figures docs/performance.md reads). On a GPU it first measures the targets
(targets.py) unless ``--targets no``. ``make bench`` runs it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as host_platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import quiet_kineto  # noqa: F401 - before torch: the profiler's log lines silenced
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import count_launches, e2e_us, host_us, median_us, run_info, sm_clock_mhz, sync, warm_gpu  # noqa: E402
from seed_baseline import NaiveTorchBuilder, SeedSequenceBuilder  # noqa: E402

from swa_hal import PlatformInfo, SWAConfig, SWAMetadataBuilder  # noqa: E402
from swa_hal.reference import build_reference  # noqa: E402
from swa_hal.scenarios import Scenario  # noqa: E402

SCENARIOS = [
    ("decode_only", "deepseek_v4_flash.yaml"),
    ("mtp_decode", "deepseek_v4_flash_mtp.yaml"),
    ("mixed", "deepseek_v4_flash.yaml"),
    ("long_prefill", "deepseek_v4_flash.yaml"),
]
GRAPH_SCENARIOS = ("decode_only", "mtp_decode")
# The performance targets on an H200 (us) and on the 2-core CPU (us).
GPU_TARGETS = {
    "decode_only": {"host": 30, "e2e": 40, "graph": 6, "launches": 1, "speedup": 4.5},
    "mtp_decode": {"host": 30, "e2e": 40, "graph": 6, "launches": 1},
    "mixed": {"host": 40, "e2e": 50, "launches": 1},
    "long_prefill": {"host": 40, "e2e": 50, "launches": 1},
}
CPU_TARGETS = {"decode_only": {"host": 250}, "long_prefill": {"host": 15000}}


def time_graph(fn, device: torch.device, replays: int = 200) -> tuple[float, float] | None:
    """A build captured in a CUDA graph: (GPU time per replay from CUDA events, wall time per replay),
    medians of 7 runs of back-to-back replays. The event time is the device's; the wall time also
    carries the host's replay cost and its jitter."""
    if device.type != "cuda":
        return None
    fn()
    sync(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(20):
        graph.replay()
    events, walls = [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(7):
        sync(device)
        t0 = time.perf_counter()
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        sync(device)
        walls.append((time.perf_counter() - t0) / replays)
        events.append(start.elapsed_time(end) / 1e3 / replays)
    return median_us(events), median_us(walls)


def time_validation(builder, batch, device: torch.device, pairs: int = 40) -> float:
    """Median over interleaved pairs of (validated build - plain build), end to end: the cost of
    ``validate=True`` with the machine's drift cancelled out."""
    diffs = []
    for _ in range(pairs):
        sync(device)
        t0 = time.perf_counter()
        builder.build(batch, validate=True)
        sync(device)
        t1 = time.perf_counter()
        builder.build(batch, validate=False)
        sync(device)
        diffs.append((t1 - t0) - (time.perf_counter() - t1))
    return median_us(diffs)


def check(config, batch, out) -> bool:
    ref = build_reference(config, batch)
    pairs = [(out["decode_indices"], ref.decode_indices), (out["decode_lens"], ref.decode_lens)]
    if ref.split.num_prefill_tokens:
        pairs += [(out["prefill_indices"], ref.prefill_indices), (out["prefill_lens"], ref.prefill_lens)]
    return tuple(out["split"]) == tuple(ref.split) and all(torch.equal(a.cpu(), b.cpu()) for a, b in pairs)


def as_dict(md) -> dict:
    return {"split": (md.num_decodes, md.num_prefills, md.num_decode_tokens, md.num_prefill_tokens),
            "decode_indices": md.decode_swa_indices, "decode_lens": md.decode_swa_lens,
            "prefill_indices": md.prefill_swa_indices, "prefill_lens": md.prefill_swa_lens}


def runners_for(config: SWAConfig, device: torch.device, backends: list[str]):
    out: list[tuple[str, Callable[..., Any], Callable[..., Any], SWAMetadataBuilder | None]] = []
    for name in backends:
        platform = None
        if device.type == "cuda" and name == "sm12x":
            platform = PlatformInfo.from_assume("vendor=cuda,capability=12.0")
        builder = SWAMetadataBuilder(config, device=device, backend=name, platform=platform, validate=False)
        builder.warmup()
        out.append((f"swa_hal[{builder.backend_name}]", builder.build, as_dict, builder))
    if device.type == "cuda":
        from swa_hal_cuda.flashmla import scheduler_factory

        baseline = SeedSequenceBuilder(config, device, scheduler_factory()[0])
        out.append(("seed sequence", baseline.build, lambda d: d, None))
    else:
        baseline = NaiveTorchBuilder(config, device)
        out.append(("naive torch", baseline.build, lambda d: d, None))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--backends", nargs="*", help="default: the auto-selected one (plus sm12x on a CUDA GPU)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "out"),
                        help="folder of the result files (default: benchmarks/out, untracked)")
    parser.add_argument("--tag", default=None, help="name of the result files (default: the device)")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--targets", choices=("yes", "no", "only"), default="yes",
                        help="on a GPU, also measure the performance targets in interleaved repetitions (targets.py)")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions of the targets")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    backends = args.backends or ([None, "sm12x"] if device.type == "cuda" else [None])
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = args.tag or ("h200" if "H200" in device_name else device.type)
    if device.type == "cuda" and args.targets != "no":
        from targets import run as run_targets

        print(f"targets: {args.reps} interleaved repetitions, medians of {args.iters}", flush=True)
        target_rows, target_lines = run_targets(args.iters, args.reps, warm=lambda: warm_gpu(device))
        header = (f"device: {device_name}; {run_info()}; "
                  f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {args.reps} interleaved "
                  f"repetitions, each the median of {args.iters} builds (GPU: of 200 graph replays); "
                  f"builds guarded except the *_guard_off rows")
        print("\n".join([header, *target_lines]))
        (out_dir / f"targets_{tag}.txt").write_text("\n".join([header, *target_lines]) + "\n")
        (out_dir / f"targets_{tag}.json").write_text(
            json.dumps({"device": device_name, "torch_threads": torch.get_num_threads(), "rows": target_rows}, indent=2))
        if args.targets == "only":
            return 0
    rows = []
    # Progress, one line as each case starts: the naive torch baseline of long_prefill alone runs for minutes on
    # a CPU. Its estimate is from the case's 20 warm-up builds: every timing below is a multiple of one build.
    cases = len(SCENARIOS) * (len(backends) + 1)
    print(f"{cases} cases ({len(SCENARIOS)} scenarios x {len(backends) + 1} builders), {args.iters} builds per "
          f"timing, on {device_name}", flush=True)
    for scenario_name, config_file in SCENARIOS:
        config = SWAConfig.from_yaml(ROOT / "configs" / config_file)
        batch = Scenario.from_yaml(ROOT / "configs" / "batches" / f"{scenario_name}.yaml").make_batch(config, device)
        print(f"{scenario_name}: {batch.num_tokens} tokens; starting the builders (kernels compile once)", flush=True)
        for runner, fn, to_dict, builder in runners_for(config, device, backends):
            def call(fn=fn):
                return fn(batch)

            correct = check(config, batch, to_dict(call()))
            t0 = time.perf_counter()
            for _ in range(20):
                call()
            sync(device)
            one = (time.perf_counter() - t0) / 20
            builds = 3 * args.iters + (200 if scenario_name in GRAPH_SCENARIOS and device.type == "cuda" else 0)
            print(f"[{len(rows) + 1}/{cases}] {scenario_name} / {runner}: {one * 1e3:.2f} ms a build, about "
                  f"{_duration(one * builds)} for its {builds} timed builds", flush=True)
            row = {"scenario": scenario_name, "tokens": batch.num_tokens, "runner": runner, "correct": correct,
                   "guarded": None if builder is None else builder.guard}

            def stage(what: str, seconds: float = one * args.iters) -> None:
                if seconds > 20:  # a timing that runs for a while says so as it starts
                    print(f"      {what}: about {_duration(seconds)}", flush=True)

            warm_gpu(device)
            row["sm_clock_mhz"] = sm_clock_mhz(device)
            stage(f"host time, {args.iters} builds")
            row["host_us"] = host_us(call, args.iters, device)
            warm_gpu(device)
            stage(f"end-to-end time, {args.iters} builds")
            row["e2e_us"] = e2e_us(call, args.iters, device)
            warm_gpu(device)
            graph = time_graph(call, device) if scenario_name in GRAPH_SCENARIOS else None
            row["graph_us"], row["graph_wall_us"] = graph if graph else (None, None)
            row["launches"] = count_launches(call, device)
            stage(f"host time again (the spread between two runs), {args.iters} builds")
            row["host_us_repeat"] = host_us(call, args.iters, device)  # the spread between two runs
            if builder is not None:  # what full validation (validate=True) adds to a build
                row["validate_us"] = time_validation(builder, batch, device)
            rows.append(row)
            print(f"  {scenario_name:<13} {runner:<16} host {row['host_us']:9.1f}  e2e {row['e2e_us']:9.1f}  "
                  f"graph {row['graph_us'] if row['graph_us'] is None else round(row['graph_us'], 1)!s:>6}  "
                  f"launches {row['launches']:>3}  correct {correct}"
                  + (f"  validation +{row['validate_us']:.0f} us" if "validate_us" in row else "")
                  + (f"  sm clock {row['sm_clock_mhz']} MHz" if row.get("sm_clock_mhz") else ""), flush=True)

    targets = GPU_TARGETS if device.type == "cuda" else CPU_TARGETS
    baseline_name = "seed sequence" if device.type == "cuda" else "naive torch"
    guard = guard_label(rows)
    lines = [f"device: {device_name}; {run_info()}; "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; medians of {args.iters}; {guard}",
             f"{'scenario':<13} {'runner':<16} {'host us':>9} {'(repeat)':>9} {'e2e us':>9} {'graph ev/wall':>13} "
             f"{'launches':>8} {'host x':>7} {'e2e x':>7} {'valid. us':>9}  targets"]
    verdicts = []
    for row in rows:
        base = next(r for r in rows if r["scenario"] == row["scenario"] and r["runner"] == baseline_name)
        host_x = base["host_us"] / row["host_us"]
        e2e_x = base["e2e_us"] / row["e2e_us"]
        row["host_speedup"], row["e2e_speedup"] = host_x, e2e_x
        notes = []
        if row["runner"] != baseline_name and row["runner"].startswith("swa_hal") and row["runner"] == _primary(rows, row):
            for key, limit in targets.get(row["scenario"], {}).items():
                value = {"host": row["host_us"], "e2e": row["e2e_us"], "graph": row["graph_us"],
                         "launches": row["launches"], "speedup": host_x}[key]
                ok = value is not None and (value >= limit if key == "speedup" else value <= limit)
                notes.append(f"{key}{'>=' if key == 'speedup' else '<='}{limit}:{'met' if ok else 'MISSED'}")
                verdicts.append({"scenario": row["scenario"], "metric": key, "target": limit, "value": value, "met": ok})
        graph = "-" if row["graph_us"] is None else f"{row['graph_us']:.1f}/{row['graph_wall_us']:.1f}"
        valid = f"{row['validate_us']:.0f}" if "validate_us" in row else "-"
        lines.append(f"{row['scenario']:<13} {row['runner']:<16} {row['host_us']:9.1f} {row['host_us_repeat']:9.1f} "
                     f"{row['e2e_us']:9.1f} {graph:>13} {row['launches']:>8} {host_x:7.2f} {e2e_x:7.2f} {valid:>9}  "
                     f"{' '.join(notes)}")
    print("\n".join(lines))
    result = {"device": device_name, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
              "host": host_platform.node(), "iters": args.iters, "guard": guard, "rows": rows, "targets": verdicts,
              "table": lines}
    (out_dir / f"bench_{tag}.json").write_text(json.dumps(result, indent=2))
    (out_dir / f"bench_{tag}.txt").write_text("\n".join(lines) + "\n")
    if not args.no_plot:
        plot(rows, out_dir / f"bench_{tag}.png",
             f"{device_name}, {torch.get_num_threads()} torch threads, medians of {args.iters} builds; {guard}")
    return 0 if all(r["correct"] for r in rows) else 1


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _primary(rows, row) -> str:
    """The auto-selected swa_hal runner of a scenario (the first one measured)."""
    return next(r["runner"] for r in rows if r["scenario"] == row["scenario"] and r["runner"].startswith("swa_hal"))


def guard_label(rows) -> str:
    """Whether swa_hal's builds in ``rows`` were guarded (docs/semantics.md #guarded-builds)."""
    guards = {r["guarded"] for r in rows if r.get("guarded") is not None}
    if guards == {True}:
        return "swa_hal builds guarded"
    if guards == {False}:
        return "swa_hal builds unguarded (SWA_HAL_GUARD=0)"
    return "swa_hal builds guarded and unguarded"


def _bar_label(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def plot(rows, path: Path, subtitle: str) -> None:
    """Host and end-to-end medians per scenario, one bar per runner, each bar labelled with its value."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart")
        return
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    runners = list(dict.fromkeys(r["runner"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    width = 0.8 / len(runners)
    for ax, metric, title in ((axes[0], "host_us", "host time per build (no synchronisation)"),
                              (axes[1], "e2e_us", "end-to-end time per build (synchronised)")):
        for i, runner in enumerate(runners):
            values = [next((r[metric] for r in rows if r["scenario"] == s and r["runner"] == runner), 0) for s in scenarios]
            bars = ax.bar([x + i * width for x in range(len(scenarios))], values, width, label=runner)
            ax.bar_label(bars, labels=[_bar_label(v) if v else "" for v in values], fontsize=7, padding=2)
        ax.set_xticks([x + width * (len(runners) - 1) / 2 for x in range(len(scenarios))], scenarios, rotation=15)
        ax.set_yscale("log")
        ax.margins(y=0.15)
        ax.set_xlabel("scenario (configs/batches/)")
        ax.set_ylabel("median us per build, log scale")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(subtitle, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"chart: {path}")


if __name__ == "__main__":
    sys.exit(main())
