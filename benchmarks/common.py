"""Timing helpers shared by the benchmark scripts: host and end-to-end medians, CUDA-graph replays, kernel
durations from the profiler, launch counts, the GPU warm-up and the line that says what a run ran with.

Every script under benchmarks/ imports these from here; this module imports no other benchmark script.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.device("cuda")


def sync(device: torch.device = CUDA) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_info() -> str:
    """What a run ran with: torch, the Python, and the number of CPU threads torch used."""
    return (
        f"torch {torch.__version__}; python {sys.version.split()[0]}; "
        f"torch threads {torch.get_num_threads()} of {os.cpu_count()} cpus"
    )


def warm_gpu(device: torch.device = CUDA, seconds: float = 0.3) -> None:
    """Keep the GPU busy for a moment before a timed section: an idle H200 sits at a low SM clock
    (345 MHz was read) and latency-bound kernels would be timed at that clock."""
    if device.type != "cuda":
        return
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(8):
            a @ a
        sync(device)


def sm_clock_mhz(device: torch.device = CUDA) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001 - the clock is informative only
        return None


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def compared(ours: list[float], theirs: list[float] | None) -> tuple[str, str, str]:
    """The cells of a comparison row: each side's "median (min-max)" and the median of the per-repetition
    ratios theirs / ours ("-" where there is no other side)."""

    def cell(values: list[float]) -> str:
        s = summary(values)
        return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"

    if theirs is None:
        return cell(ours), "-", "-"
    return cell(ours), cell(theirs), f"{statistics.median(y / x for x, y in zip(ours, theirs)):.2f}x"


def host_us(fn: Callable[[], object], iters: int, device: torch.device = CUDA) -> float:
    """Median wall time of ``fn()`` without synchronising: what the caller's CPU pays."""
    return median_us(host_samples(fn, iters, device))


def host_mean_us(fn: Callable[[], object], iters: int, device: torch.device = CUDA) -> float:
    """Mean wall time of ``fn()`` without synchronising: the cost of work done once every so many calls
    (a violation poll's look) included, which the median leaves out."""
    return statistics.fmean(host_samples(fn, iters, device)) * 1e6


def host_samples(fn: Callable[[], object], iters: int, device: torch.device = CUDA) -> list[float]:
    """Wall times (s) of ``iters`` calls of ``fn()`` without synchronising."""
    samples = []
    for i in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
        if device.type == "cuda" and i % 50 == 49:
            sync(device)  # keep the queue short, outside the timed region
    sync(device)
    return samples


def e2e_us(fn: Callable[[], object], iters: int, device: torch.device = CUDA) -> float:
    """Median wall time of synchronise, ``fn()``, synchronise."""
    samples = []
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        samples.append(time.perf_counter() - t0)
    return median_us(samples)


class GraphTimer:
    """A build captured once in a CUDA graph; GPU time per replay from CUDA events."""

    def __init__(self, fn: Callable[[], object]):
        fn()
        sync()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            fn()
        for _ in range(20):
            self.graph.replay()

    def __call__(self, replays: int = 200) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        sync()
        start.record()
        for _ in range(replays):
            self.graph.replay()
        end.record()
        sync()
        return start.elapsed_time(end) * 1e3 / replays


def graph_timer_or_none(what: object, fn: Callable[[], object]) -> GraphTimer | None:
    """``fn`` captured in a ``GraphTimer``; None, reported under ``what``, where an op of it cannot be captured."""
    try:
        return GraphTimer(fn)
    except Exception as exc:  # noqa: BLE001 - an op that cannot be captured is reported, not fatal
        print(f"{what}: not capturable ({type(exc).__name__})")
        return None


def count_launches(fn: Callable[[], object], device: torch.device) -> int:
    """Kernels, memsets and copies of one ``fn()`` (torch.profiler); on the CPU, top-level aten operations."""
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


def kernel_us(fn: Callable[[], object], device: torch.device = CUDA, builds: int = 200, per_build: int = 1) -> float:
    """GPU time of the kernels of one ``fn()`` from the profiler's device timestamps (CUPTI): the median
    over ``builds`` eager calls of the summed durations of its ``per_build`` kernels. Unlike a graph
    replay timed with CUDA events, this leaves out the graph launch's own latency (``kernel_gpu_time.py``
    prints a graph of one empty kernel's replay beside its duration)."""
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


def vllm_step_inputs(groups: int, reqs: int, device: torch.device) -> SimpleNamespace:
    """A decode step of ``reqs`` requests over ``groups`` SWA KV-cache groups (DeepSeek-V4-Flash config), laid
    out as vLLM's model runner V2 hands it to the plugin's step builds: ``config``, the step's ``batch``, a
    tuple of per-group ``tables``, each group's own slot mapping (``rows``), the ``[G, T]`` view
    ``slot_mappings`` of a persistent ``[G, max_num_batched_tokens]`` buffer, and ``common(table, slots)``,
    the step's common metadata for one group."""
    import dataclasses
    import random

    from swa_hal import SWAConfig
    from swa_hal.scenarios import synthesize_batch

    config = dataclasses.replace(SWAConfig.from_yaml(ROOT / "configs" / "deepseek_v4_flash.yaml"), num_kv_groups=groups)
    rng = random.Random(0)
    seqs = [rng.randint(1, 32768) for _ in range(reqs)]
    batch = synthesize_batch(config, seqs, [1] * reqs, rng=rng, device=device)
    others = [synthesize_batch(config, seqs, [1] * reqs, rng=rng, device=device) for _ in range(groups)]
    rows = [o.slot_mapping for o in others]
    persistent = torch.full((groups, config.max_num_batched_tokens), -1, dtype=torch.int64, device=device)
    for g, s in enumerate(rows):
        persistent[g, : s.shape[0]] = s

    def common(table: torch.Tensor, slots: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(
            seq_lens=batch.seq_lens, seq_lens_cpu_upper_bound=batch.seq_lens_cpu,
            query_start_loc=batch.query_start_loc, query_start_loc_cpu=batch.query_start_loc_cpu,
            block_table_tensor=table, slot_mapping=slots, max_query_len=batch.max_query_len,
            num_reqs=reqs, num_actual_tokens=batch.num_tokens, causal=True,
        )

    return SimpleNamespace(
        config=config,
        batch=batch,
        tables=tuple(o.block_table for o in others),
        rows=rows,
        slot_mappings=persistent[:, : batch.num_tokens],
        common=common,
    )


def vllm_plugin_options() -> dict[str, Any]:
    """The options the vLLM plugin makes its swa_hal builders with, those this tree's ``SWAMetadataBuilder``
    takes: no planner objects (vLLM's builders make their own). An earlier tree (an A/B run) gets its
    defaults."""
    import inspect

    from swa_hal import SWAMetadataBuilder

    return {"tile_schedulers": False} if "tile_schedulers" in inspect.signature(SWAMetadataBuilder).parameters else {}


def vllm_group_builds(inputs: SimpleNamespace, device: torch.device, **options: Any) -> Callable[[], None]:
    """The vLLM plugin without step builds over ``vllm_step_inputs``: per group, the batch from its common
    metadata, one ``build`` of a builder of its own (made here with ``options``), the poll."""
    from swa_hal import SWAMetadataBuilder
    from swa_hal.integrations.engine import batch_from_common_metadata

    builders = [SWAMetadataBuilder(inputs.config, device=device, **options) for _ in inputs.tables]
    cms = [inputs.common(t, s) for t, s in zip(inputs.tables, inputs.slot_mappings.unbind(0))]

    def per_group() -> None:
        for builder, cm in zip(builders, cms):
            builder.build(batch_from_common_metadata(cm))
            builder.poll_violations()

    return per_group


def vllm_plugin_step(inputs: SimpleNamespace, builder: Any) -> Callable[[], None]:
    """The vLLM plugin's step over ``vllm_step_inputs``: a ``Step`` per ``prepare_attn`` call, then each
    group's builder asking it for its metadata in vLLM's order (the first ask builds every group through
    ``builder``, a ``SWAMetadataBuilder`` with a group per table). Stand-ins for vLLM's builder objects,
    which the step knows by identity only."""
    from swa_hal.integrations.vllm_step import Step, StepPlan

    tables, slots = inputs.tables, inputs.slot_mappings
    askers = [object() for _ in tables]
    plan = StepPlan({id(b): (b, g) for g, b in enumerate(askers)}, tuple(range(len(tables))), builder)
    cms = [inputs.common(tables[g], slots[g]) for g in range(len(tables))]

    def step() -> None:
        handing = Step(plan, tables, slots)
        for asker, cm in zip(askers, cms):
            handing.metadata(asker, cm, None)

    return step
