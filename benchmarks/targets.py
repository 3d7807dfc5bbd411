"""The performance targets, measured in interleaved repetitions (A B A B ...) so that the host's drift
between runs cancels out of the comparisons: every figure is the median of the repetitions' medians,
with their min and max, and every comparison is a ratio measured in the same run.

Measured on the auto-selected backend (guarded builds, the default):
  decode-256, mixed 64 + 4 x 2048, 8 x 2048 prefill: host, end to end, GPU time two ways: "gpu" is a
    replay of the build captured in a CUDA graph (CUDA events; it includes the graph launch's own
    latency: a graph of one empty kernel replays in 2.5-9.4 us on H200 machines, depending on the machine),
    "kernel" the kernel's duration from the profiler's device timestamps
  8 KV-cache groups x decode-256: one build_groups() against 8 single builds (host, e2e, GPU), the
    groups given as lists of tensors and stacked in one tensor each
  guard on against guard off: GPU time of decode-256 and of the 16k-row prefill, host time

``bench_build.py --targets only`` runs it and writes the table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from common import ROOT, GraphTimer, e2e_us, host_us, kernel_us, summary

from swa_hal import SWAConfig, SWAMetadataBuilder
from swa_hal.scenarios import Scenario, synthesize_batch

GROUPS = 8
TARGETS = {  # (scenario, metric) -> upper bound in us (ratios: lower bound)
    ("decode_only", "host"): 30, ("decode_only", "e2e"): 40, ("decode_only", "gpu"): 3, ("decode_only", "kernel"): 3,
    ("mixed", "host"): 25, ("mixed", "e2e"): 40,
    ("long_prefill", "host"): 25, ("long_prefill", "e2e"): 40, ("long_prefill", "gpu"): 4.2,
    ("long_prefill", "kernel"): 4.2,
    ("groups8_decode256", "host"): 30, ("groups8_decode256", "host_stacked"): 30, ("groups8_decode256", "gpu"): 8,
    ("groups8_decode256", "kernel"): 8,
    ("groups8_vs_8_single", "host_ratio"): 4.0, ("groups8_vs_8_single", "host_ratio_stacked"): 4.0,
    ("guard_cost_decode256", "gpu"): 1.0, ("guard_cost_long_prefill", "gpu"): 1.0,
    ("guard_cost_decode256", "kernel"): 1.0, ("guard_cost_long_prefill", "kernel"): 1.0,
    ("guard_cost_decode256", "host"): 0.0,
}


def touch(md) -> None:
    for layer_type in md.tile_sched:
        md.tile_sched[layer_type]


def run(iters: int = 1000, reps: int = 3, warm: Callable[[], None] | None = None) -> tuple[list[dict], list[str]]:
    device = torch.device("cuda")
    flash = SWAConfig.from_yaml(ROOT / "configs" / "deepseek_v4_flash.yaml")
    grouped_config = dataclasses.replace(flash, num_kv_groups=GROUPS)
    cases: dict[str, dict[str, Callable[[], float]]] = {}

    def builder(config: SWAConfig, guard: bool = True) -> SWAMetadataBuilder:
        b = SWAMetadataBuilder(config, device=device, validate=False, guard=guard)
        b.warmup()
        return b

    for name in ("decode_only", "mixed", "long_prefill"):
        batch = Scenario.from_yaml(ROOT / "configs" / "batches" / f"{name}.yaml").make_batch(flash, device)
        on, off = builder(flash, True), builder(flash, False)
        graph_on, graph_off = GraphTimer(lambda b=on: b.build(batch)), GraphTimer(lambda b=off: b.build(batch))
        cases[name] = {
            "host": lambda b=on, x=batch: host_us(lambda: b.build(x), iters),
            # The FlashMLA planner objects are made when a layer first asks for one: also the build
            # plus every layer type's object, what a step whose layers read every type pays.
            "host_all_sched": lambda b=on, x=batch: host_us(lambda: touch(b.build(x)), iters),
            "e2e": lambda b=on, x=batch: e2e_us(lambda: b.build(x), iters),
            "gpu": graph_on,
            "kernel": lambda b=on, x=batch: kernel_us(lambda: b.build(x), device),
            "host_guard_off": lambda b=off, x=batch: host_us(lambda: b.build(x), iters),
            "gpu_guard_off": graph_off,
            "kernel_guard_off": lambda b=off, x=batch: kernel_us(lambda: b.build(x), device),
        }

    # 8 KV-cache groups of a decode-256 step: each its own block table and slot mapping.
    rng = __import__("random").Random(0)
    reqs = 256
    seqs = [rng.randint(1, 32768) for _ in range(reqs)]
    batch = synthesize_batch(grouped_config, seqs, [1] * reqs, rng=rng, device=device)
    tables, slots = [], []
    for _ in range(GROUPS):
        other = synthesize_batch(grouped_config, seqs, [1] * reqs, rng=rng, device=device)
        tables.append(other.block_table)
        slots.append(other.slot_mapping)
    g_builder = builder(grouped_config)
    single_batches = [dataclasses.replace(batch, block_table=t, slot_mapping=s) for t, s in zip(tables, slots)]

    def groups_once() -> None:
        g_builder.build_groups(batch, tables, slots)

    # The same groups stacked in one buffer each, as an engine that keeps them so would hand them in: a
    # slice of its persistent [G, max_num_seqs, P] and [G, max_num_batched_tokens] buffers. Like the
    # listed tables above, the slices are made outside the timed region (slicing is the engine's cost
    # in either form: per group for listed tables, once for stacked ones).
    width = max(t.shape[1] for t in tables)
    stacked_tables = torch.full((GROUPS, grouped_config.max_num_seqs, width), -1, dtype=torch.int32, device=device)
    stacked_slots = torch.full((GROUPS, grouped_config.max_num_batched_tokens), -1, dtype=torch.int64, device=device)
    for g in range(GROUPS):
        stacked_tables[g, :reqs, : tables[g].shape[1]] = tables[g]
        stacked_slots[g, : slots[g].shape[0]] = slots[g]

    step_tables, step_slots = stacked_tables[:, :reqs], stacked_slots[:, : batch.num_tokens]

    def groups_stacked() -> None:
        g_builder.build_groups(batch, step_tables, step_slots)

    def singles() -> None:
        for b in single_batches:
            g_builder.build(b)

    def groups_all_sched() -> None:
        for md in g_builder.build_groups(batch, tables, slots):
            touch(md)

    cases["groups8_decode256"] = {
        "host": lambda: host_us(groups_once, iters), "e2e": lambda: e2e_us(groups_once, iters),
        "host_stacked": lambda: host_us(groups_stacked, iters), "e2e_stacked": lambda: e2e_us(groups_stacked, iters),
        "host_all_sched": lambda: host_us(groups_all_sched, iters),
        "gpu": GraphTimer(groups_once),
        "kernel": lambda: kernel_us(groups_once, device),
        "host_8_single": lambda: host_us(singles, iters // 4), "e2e_8_single": lambda: e2e_us(singles, iters // 4),
        "gpu_8_single": GraphTimer(singles),
        "kernel_8_single": lambda: kernel_us(singles, device, per_build=GROUPS),
    }

    measured: dict[tuple[str, str], list[float]] = {}
    for rep in range(reps):
        for case, metrics in cases.items():
            for metric, fn in metrics.items():
                if warm is not None and metric.startswith("gpu"):
                    warm()
                measured.setdefault((case, metric), []).append(fn())
        print(f"  repetition {rep + 1}/{reps} done", flush=True)

    rows = []

    def add(case: str, metric: str, values: list[float], unit: str = "us") -> None:
        target = TARGETS.get((case, metric))
        s = summary(values)
        met = None
        if target is not None:
            met = s["median"] >= target if "ratio" in metric else s["median"] <= target
        rows.append({"case": case, "metric": metric, "unit": unit, "values": values, **s, "target": target,
                     "met": met})

    for (case, metric), values in measured.items():
        add(case, metric, values)
    # Ratios measured within each repetition.
    g = measured
    add("groups8_vs_8_single", "host_ratio",
        [a / b for a, b in zip(g[("groups8_decode256", "host_8_single")], g[("groups8_decode256", "host")])], "x")
    add("groups8_vs_8_single", "host_ratio_stacked",
        [a / b for a, b in zip(g[("groups8_decode256", "host_8_single")], g[("groups8_decode256", "host_stacked")])],
        "x")
    add("groups8_vs_8_single", "gpu_ratio",
        [a / b for a, b in zip(g[("groups8_decode256", "gpu_8_single")], g[("groups8_decode256", "gpu")])], "x")
    for case, label in (("decode_only", "guard_cost_decode256"), ("long_prefill", "guard_cost_long_prefill")):
        add(label, "gpu", [a - b for a, b in zip(g[(case, "gpu")], g[(case, "gpu_guard_off")])])
        add(label, "kernel", [a - b for a, b in zip(g[(case, "kernel")], g[(case, "kernel_guard_off")])])
        add(label, "host", [a - b for a, b in zip(g[(case, "host")], g[(case, "host_guard_off")])])

    lines = [f"{'case':<26} {'metric':<16} {'median':>9} {'min':>9} {'max':>9}  target"]
    for r in rows:
        verdict = "" if r["target"] is None else (
            f"{'>=' if 'ratio' in r['metric'] else '<='}{r['target']} {'met' if r['met'] else 'MISSED'}")
        lines.append(f"{r['case']:<26} {r['metric']:<16} {r['median']:9.2f} {r['min']:9.2f} {r['max']:9.2f}  "
                     f"{r['unit']} {verdict}")
    return rows, lines
