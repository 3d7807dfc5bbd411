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
reference, and writes JSON and a PNG chart to benchmarks/results/. ``make bench`` runs it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as host_platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_gpu(device: torch.device, seconds: float = 0.3) -> None:
    """Keep the GPU busy for a moment before a timed section: an idle H200 sits at a low SM clock
    (345 MHz was read here) and latency-bound kernels would be timed at that clock."""
    if device.type != "cuda":
        return
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(8):
            a @ a
        sync(device)


def sm_clock_mhz(device: torch.device) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001 - the clock is informative only
        return None


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def time_host(fn, iters: int, device: torch.device) -> float:
    samples = []
    for i in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
        if device.type == "cuda" and i % 50 == 49:
            sync(device)  # keep the queue short; outside the timed region
    sync(device)
    return median_us(samples)


def time_e2e(fn, iters: int, device: torch.device) -> float:
    samples = []
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        samples.append(time.perf_counter() - t0)
    return median_us(samples)


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


def count_launches(fn, device: torch.device) -> int:
    from torch.profiler import DeviceType, ProfilerActivity, profile

    fn()
    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        sync(device)
    events = prof.events()
    if device.type == "cuda":
        return sum(1 for e in events if e.device_type == DeviceType.CUDA)
    return sum(1 for e in events if e.name.startswith("aten::") and e.cpu_parent is None)


def kernel_us(fn, device: torch.device, builds: int = 200, per_build: int = 1) -> float:
    """GPU time of the kernels of one ``fn()`` from the profiler's device timestamps (CUPTI): the median
    over ``builds`` eager calls of the summed durations of its ``per_build`` kernels. Unlike a graph
    replay timed with CUDA events, this leaves out the launch latency between kernels (a replay of a
    graph holding one empty kernel takes about 2.5 us on an H200; ``kernel_gpu_time.py`` prints it)."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    for _ in range(20):
        fn()
    sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(builds):
            fn()
            if i % 50 == 49:
                sync(device)
        sync(device)
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
    )
    if len(spans) < builds * per_build:
        raise RuntimeError(f"the profiler saw {len(spans)} kernels for {builds} builds of {per_build}")
    sums = [sum(end - start for start, end in spans[i : i + per_build]) for i in range(0, len(spans), per_build)]
    return median_us([s * 1e-6 for s in sums])


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
    out = []
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
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
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
        header = (f"device: {device_name}; torch {torch.__version__}; "
                  f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {args.reps} interleaved "
                  f"repetitions, each the median of {args.iters} builds (GPU: of 200 graph replays)")
        print("\n".join([header, *target_lines]))
        (out_dir / f"targets_{tag}.txt").write_text("\n".join([header, *target_lines]) + "\n")
        (out_dir / f"targets_{tag}.json").write_text(json.dumps({"device": device_name, "rows": target_rows}, indent=2))
        if args.targets == "only":
            return 0
    rows = []
    for scenario_name, config_file in SCENARIOS:
        config = SWAConfig.from_yaml(ROOT / "configs" / config_file)
        batch = Scenario.from_yaml(ROOT / "configs" / "batches" / f"{scenario_name}.yaml").make_batch(config, device)
        for runner, fn, to_dict, builder in runners_for(config, device, backends):
            def call(fn=fn):
                return fn(batch)

            correct = check(config, batch, to_dict(call()))
            for _ in range(20):
                call()
            row = {"scenario": scenario_name, "tokens": batch.num_tokens, "runner": runner, "correct": correct}
            warm_gpu(device)
            row["sm_clock_mhz"] = sm_clock_mhz(device)
            row["host_us"] = time_host(call, args.iters, device)
            warm_gpu(device)
            row["e2e_us"] = time_e2e(call, args.iters, device)
            warm_gpu(device)
            graph = time_graph(call, device) if scenario_name in GRAPH_SCENARIOS else None
            row["graph_us"], row["graph_wall_us"] = graph if graph else (None, None)
            row["launches"] = count_launches(call, device)
            row["host_us_repeat"] = time_host(call, args.iters, device)  # the spread between two runs
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
    lines = [f"device: {device_name}; torch {torch.__version__}; python {sys.version.split()[0]}; "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; medians of {args.iters}",
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
    result = {"device": device_name, "torch": torch.__version__, "host": host_platform.node(),
              "iters": args.iters, "rows": rows, "targets": verdicts, "table": lines}
    (out_dir / f"bench_{tag}.json").write_text(json.dumps(result, indent=2))
    (out_dir / f"bench_{tag}.txt").write_text("\n".join(lines) + "\n")
    if not args.no_plot:
        plot(rows, out_dir / f"bench_{tag}.png", device_name)
    return 0 if all(r["correct"] for r in rows) else 1


def _primary(rows, row) -> str:
    """The auto-selected swa_hal runner of a scenario (the first one measured)."""
    return next(r["runner"] for r in rows if r["scenario"] == row["scenario"] and r["runner"].startswith("swa_hal"))


def plot(rows, path: Path, device_name: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart")
        return
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    runners = list(dict.fromkeys(r["runner"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(runners)
    for ax, metric, title in ((axes[0], "host_us", "host us per build"), (axes[1], "e2e_us", "end-to-end us per build")):
        for i, runner in enumerate(runners):
            values = [next((r[metric] for r in rows if r["scenario"] == s and r["runner"] == runner), 0) for s in scenarios]
            ax.bar([x + i * width for x in range(len(scenarios))], values, width, label=runner)
        ax.set_xticks([x + width * (len(runners) - 1) / 2 for x in range(len(scenarios))], scenarios, rotation=15)
        ax.set_yscale("log")
        ax.set_title(f"{title} ({device_name})", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"chart: {path}")


if __name__ == "__main__":
    sys.exit(main())
