"""DeepSeek-V4.1's request-window layout (docs/semantics.md #request-window-layouts) from swa_hal's
auto-selected backend, against SGLang 0.5.23's own ``window_layout`` for the same inputs, in one run.

    python3 benchmarks/sglang_window.py [--device cuda|cpu] [--iters 1000] [--reps 3] [--steps 200]

swa_hal: ``SGLangSWAIndices.window_layout`` (what the plugin's hook calls: one ``build_request_window``, one
launch on the Triton backends). SGLang: ``window_layout`` of ``sglang/srt/mem_cache/dsv41_request_window.py``,
what its V4.1 backends call: on CUDA its run scans and its Triton op ``build_window_layout``, elsewhere its torch
path. Each scenario is checked equal field by field first (every ``WindowLayout`` field: dtype, shape,
values), then ``--steps`` random V4.1 steps (``swa_hal.testing.request_windows``; on CUDA every third has more
runs than history groups, which only SGLang's op takes: there swa_hal's layout is the op's with the earlier
entries of the runs past the groups dropped, a designed difference counted apart; any other difference
fails the run). Then both are timed: host (no sync), end-to-end
(sync, call, sync), on CUDA a graph replay ("gpu") and the summed kernel durations ("kernel"), and the
launches of one call (on a CPU: top-level aten operations). Every figure is the median of ``--reps``
interleaved repetitions (median of ``--iters`` calls each), with min and max; ratios SGLang / swa_hal are
taken within each repetition. SGLang runs where its module imports (``sglang`` on the path:
``benchmarks/sglang_site.py`` builds a folder of it for a machine without it); otherwise swa_hal is timed alone.

On a CPU, ``TRITON_INTERPRET=1 ... --device cpu --sglang-op --backend cuda --assume vendor=cuda,capability=9.0``
compares what SGLang's CUDA path runs (its run scans and op) with swa_hal's Triton kernel, both in the Triton
interpreter; timings mean nothing there, so ``--reps 0`` (only the checks) and fewer ``--steps`` suit it.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import quiet_kineto  # noqa: F401 - before torch: the profiler's log lines silenced
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import compared, count_launches, e2e_us, graph_timer_or_none, host_us, kernel_us, run_info, warm_gpu  # noqa: E402

from swa_hal import PlatformInfo  # noqa: E402
from swa_hal.integrations.sglang import SGLangSWAIndices  # noqa: E402
from swa_hal.request_window import RequestWindowLayout  # noqa: E402
from swa_hal.testing.request_windows import (  # noqa: E402
    WINDOW_KINDS,
    WindowCase,
    runs_past_the_groups_read_their_own_rows,
    window_case,
    window_runs,
)

W, CAPACITY, SLOTS = 128, 256, 512  # SGLang's window and ring rows per request; ring slots of the pool
FIELDS = RequestWindowLayout.FIELDS


def step(
    rng: random.Random, name: str, runs: list[int], *, floors: bool = False, padded: int | None = None
) -> WindowCase:
    """One step as SGLang's V4.1 backend hands it over: a run of rows per request (int64 request-pool
    slots, int32 positions, ascending by one), one history group per request; ``floors``: half the requests
    replay from their run's first position (the encoder replay), half from a floor inside their history."""
    slots = rng.sample(range(SLOTS), len(runs))
    req: list[int] = []
    pos: list[int] = []
    floor: list[int] = []
    for slot, count in zip(slots, runs):
        first = rng.randint(1000, 32000)
        lo = first if rng.random() < 0.5 else max(0, first - rng.randint(1, 2 * W))
        req += [slot] * count
        pos += range(first, first + count)
        floor += [lo] * count
    return WindowCase(
        kind=name,
        req=torch.tensor(req, dtype=torch.int64),
        pos=torch.tensor(pos, dtype=torch.int32),
        zero_row=SLOTS * CAPACITY,
        window=W,
        capacity=CAPACITY,
        floor=torch.tensor(floor, dtype=torch.int32) if floors else None,
        num_groups=len(runs),
        padded_rows=padded,
    )


def scenarios(device: torch.device) -> list[WindowCase]:
    rng = random.Random(0)
    cases = [
        step(rng, "decode 256", [1] * 256),
        step(rng, "target verify 64 x 4", [4] * 64),
        step(rng, "extend 4 x 2048", [2048] * 4),
        step(rng, "mixed 4 x 512 + 64 x 1", [512] * 4 + [1] * 64),
        step(rng, "replay 8 x 128 (floors)", [128] * 8, floors=True),
        step(rng, "prefill graph 16 x 100 (pad 2048)", [100] * 16, padded=2048),
    ]
    return [c.to(device) for c in cases]


def sglang_window(op: bool) -> tuple[Callable[..., Any] | None, str]:
    """SGLang's ``window_layout`` (``op``: what its CUDA path runs, called on any device) and a line saying
    which; None and the reason where it does not import."""
    try:
        from sglang.srt.mem_cache import dsv41_request_window as rw
        from sglang.version import __version__
    except Exception as exc:  # noqa: BLE001 - any failure of its import chain leaves swa_hal timed alone
        return None, f"SGLang's window_layout does not import here ({type(exc).__name__}: {exc}); timing swa_hal only"
    level = rw.resolve_level().name
    if not op:
        fn = getattr(rw.window_layout, "__wrapped__", rw.window_layout)  # SGLang's own, under any hook
        return fn, f"SGLang {__version__} window_layout (invariant level {level})"
    from sglang.kernels.ops.kvcache.dsv41_window_layout import build_window_layout

    def cuda_path(req: torch.Tensor, pos: torch.Tensor, **kwargs: Any) -> Any:
        group, first, last = rw._first_row_offsets(req)
        return rw.WindowLayout(**build_window_layout(req, pos, group, first, last, **kwargs))

    return cuda_path, f"SGLang {__version__} window_layout's CUDA path: run scans + build_window_layout"


def differences(case: WindowCase, got: RequestWindowLayout, want: Any) -> list[str]:
    """The WindowLayout fields where swa_hal's layout is not ``want`` (SGLang's layout, or its fields by name;
    dtype, shape or a value), and ``runs``."""
    if not isinstance(want, dict):
        want = {name: getattr(want, name) for name in FIELDS}
    bad = []
    for name in FIELDS:
        have, expected = getattr(got, name), want[name]
        if name == "size":
            same = have == expected
        else:
            same = have.dtype == expected.dtype and have.shape == expected.shape and torch.equal(have, expected)
        if not same:
            bad.append(name)
    if int(got.runs) != window_runs(case):
        bad.append("runs")
    return bad


def random_steps(
    count: int, overfull: bool, call_ours: Callable[..., Any], theirs: Callable[..., Any], device: torch.device
) -> tuple[int, int, int, list[str]]:
    """``count`` random V4.1 steps (the engine tests' generator): the ones equal to SGLang's layout, the ones
    with more runs than groups, those of them that differ from SGLang's layout by design only (a run past the
    groups reads its own rows only: docs/semantics.md #engine-parity), and what differed otherwise."""
    rng = random.Random("sglang-window-benchmark")
    equal, over, designed, failed = 0, 0, 0, []
    for i in range(count):
        kind = WINDOW_KINDS[i % len(WINDOW_KINDS)]
        window = rng.choice((4, 8, 16, 100)) if rng.random() < 0.4 else W
        more = overfull and i % 3 == (i // len(WINDOW_KINDS)) % 3
        case = window_case(rng, kind, window=window, overfull=more).to(device)
        over += more
        got, want = call_ours(case), theirs(case.req, case.pos, **case.kwargs())
        if not differences(case, got, want):
            equal += 1
            continue
        # Out of the contract (more runs than groups): swa_hal must equal SGLang's layout with those runs'
        # earlier entries dropped; anything else is a failure.
        fields = {name: getattr(want, name) for name in FIELDS}
        bad = differences(case, got, runs_past_the_groups_read_their_own_rows(case, fields)) if more else ["-"]
        if more and not bad:
            designed += 1
        else:
            failed.append(f"step {i} ({kind}, W={window}): {', '.join(differences(case, got, want))}")
    return equal, over, designed, failed


def kernels_of(fn: Callable[[], object]) -> int:
    """Kernels of one call (the profiler's CUDA events that are neither copies nor memsets)."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(
        1 for e in prof.events() if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions (0: only the checks)")
    ap.add_argument("--steps", type=int, default=200, help="random V4.1 steps compared before timing")
    ap.add_argument("--backend", help="swa_hal's backend (default: auto-selected)")
    ap.add_argument("--assume", help="swa_hal's platform, as swa-hal info --assume takes it (with --backend)")
    ap.add_argument(
        "--sglang-op",
        action="store_true",
        help="call what SGLang's CUDA path runs on any device (on a CPU: TRITON_INTERPRET=1)",
    )
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    platform = PlatformInfo.from_assume(args.assume) if args.assume else None
    adapters: dict[int, SGLangSWAIndices] = {}

    def adapter(window: int) -> SGLangSWAIndices:
        if window not in adapters:
            adapters[window] = SGLangSWAIndices(window, device, backend=args.backend, platform=platform)
        return adapters[window]

    def call_ours(case: WindowCase) -> RequestWindowLayout:
        return adapter(case.window).window_layout(
            case.req, case.pos, zero_row=case.zero_row, capacity=case.capacity, floor=case.floor,
            num_groups=case.num_groups, padded_rows=case.padded_rows,
        )  # fmt: skip

    theirs_fn, which = sglang_window(args.sglang_op)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"swa_hal backend: {adapter(W).backend_name}; device: {name}; {run_info()}")
    print(which)
    if theirs_fn is not None:
        overfull = device.type == "cuda" or args.sglang_op  # SGLang's torch path fails on those
        equal, over, designed, failed = random_steps(args.steps, overfull, call_ours, theirs_fn, device)
        print(
            f"random V4.1 steps: {equal} of {args.steps} equal to SGLang's field by field, {designed} differ by "
            f"design only (runs past the history groups read their own rows only), {len(failed)} otherwise "
            f"({over} with more runs than groups)"
        )
        for line in failed[:10]:
            print(f"  differs: {line}")
        if failed:
            return 1

    cases = scenarios(device)
    runners: dict[tuple[str, str], Callable[[], object]] = {}
    for case in cases:
        runs = window_runs(case)
        ours = lambda c=case: call_ours(c)  # noqa: E731
        got = ours()
        line = f"{case.kind}: rows {case.pos.numel()}, runs {runs}, groups {case.num_groups}, size {got.size}"
        runners[(case.kind, "swa_hal")] = ours
        if theirs_fn is not None:
            theirs = lambda c=case: theirs_fn(c.req, c.pos, **c.kwargs())  # noqa: E731
            bad = differences(case, got, theirs())
            print(
                f"{line}; swa_hal == SGLang field by field: {not bad}" + (f" (differ: {', '.join(bad)})" if bad else "")
            )
            if bad:
                return 1
            runners[(case.kind, "sglang")] = theirs
        else:
            print(line)
    if args.reps == 0:
        return 0
    launches = {key: count_launches(fn, device) for key, fn in runners.items()}
    graphs = dict.fromkeys(runners)  # None: not captured (no CUDA device, or an op that cannot be)
    kernels: dict[tuple[str, str], int] = {}
    if device.type == "cuda":
        for key, fn in runners.items():
            kernels[key] = kernels_of(fn)
            graphs[key] = graph_timer_or_none(key, fn)
    measured: dict[tuple[str, str, str], list[float]] = {}
    for rep in range(args.reps):
        for key, fn in runners.items():
            measured.setdefault((*key, "host"), []).append(host_us(fn, args.iters, device))
            measured.setdefault((*key, "e2e"), []).append(e2e_us(fn, args.iters, device))
            if device.type != "cuda":
                continue
            graph = graphs[key]
            warm_gpu(device)  # the GPU's clock up before timing its time
            if graph is not None:
                measured.setdefault((*key, "gpu"), []).append(graph())
            if kernels[key]:
                try:
                    builds = max(20, min(200, args.iters // 5))
                    measured.setdefault((*key, "kernel"), []).append(kernel_us(fn, device, builds, kernels[key]))
                except RuntimeError as exc:  # the profiler saw other kernels than counted: reported, not fatal
                    print(f"{key}: no kernel time ({exc})")
                    kernels[key] = 0
        print(f"  repetition {rep + 1}/{args.reps} done", flush=True)
    print(
        f"\n{'scenario':<36} {'metric':<6} {'swa_hal median (min-max)':>30} {'SGLang median (min-max)':>30} "
        f"{'SGLang/swa_hal':>15}"
    )
    for case in cases:
        for metric in ("host", "e2e", "gpu", "kernel"):
            a = measured.get((case.kind, "swa_hal", metric))
            b = measured.get((case.kind, "sglang", metric))
            if a is None:
                continue
            cell_a, cell_b, ratio = compared(a, b)
            print(f"{case.kind:<36} {metric:<6} {cell_a:>30} {cell_b:>30} {ratio:>15}")
        theirs_n = launches.get((case.kind, "sglang"))
        what = "launches" if device.type == "cuda" else "aten ops"
        print(
            f"{case.kind:<36} {what}: swa_hal {launches[(case.kind, 'swa_hal')]}, SGLang "
            f"{theirs_n if theirs_n is not None else '-'}"
        )
    if device.type == "cuda":
        print(
            "host and e2e in us per call; gpu: one CUDA-graph replay; kernel: the summed kernel durations of one "
            "call (profiler)"
        )
    else:
        print("host and e2e in us per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
