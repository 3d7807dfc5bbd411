#!/usr/bin/env python
"""Where a call's host time goes, on the machine it runs on: cProfile over many calls of each host path
(the functions with the most time of their own), and the cost of the device primitives every path
uses (a small ``torch.empty``, ``data_ptr``, the current-stream query, a device switch).

The paths: a decode-256 ``build``; the vLLM step of 8 groups as the plugin's step builds feed it
(``benchmarks/vllm_step.py``), built, and built and handed out to the 8 groups' builders; SGLang's
decode-256 causal rows through the adapter and as a plain ``build_slot_rows``
(``benchmarks/sglang_rows.py``); DeepSeek-V4.1's decode-256 request-window layout through the adapter
(``benchmarks/sglang_window.py``). Profiles are for finding the costly part of a
path; timings to report come from those benchmarks.

    python3 benchmarks/host_profile.py [--device cuda] [--calls 2000] [--top 18] [--paths ...]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "backends"), str(ROOT / "benchmarks")]

PATHS = ("decode", "step8", "plugin_step8", "sglang_causal", "slot_rows", "window_layout")


def paths(device):
    """Each path's call, made ready (warmed) on ``device``."""

    from common import vllm_plugin_options, vllm_plugin_step, vllm_step_inputs

    from swa_hal import SWAConfig, SWAMetadataBuilder
    from swa_hal.integrations.engine import batch_from_common_metadata
    from swa_hal.integrations.sglang import SGLangSWAIndices
    from swa_hal.scenarios import Scenario

    flash = SWAConfig.from_yaml(ROOT / "configs" / "deepseek_v4_flash.yaml")
    out = {}
    batch = Scenario.from_yaml(ROOT / "configs" / "batches" / "decode_only.yaml").make_batch(flash, device)
    single = SWAMetadataBuilder(flash, device=device)
    out["decode"] = lambda: single.build(batch)

    inputs = vllm_step_inputs(8, 256, device)
    tables, slots = inputs.tables, inputs.slot_mappings
    common = inputs.common(tables[0], slots[0])
    config = inputs.config
    step_builder = SWAMetadataBuilder(config, device=device, **vllm_plugin_options())  # as the plugin's

    def step8():
        step_builder.build_groups(batch_from_common_metadata(common), tables, slots)
        step_builder.poll_violations()

    out["step8"] = step8

    # The same step as the vLLM plugin hands it out (benchmarks/vllm_step.py's "plugin step").
    out["plugin_step8"] = vllm_plugin_step(inputs, step_builder)

    from sglang_rows import scenarios as row_scenarios
    from sglang_window import scenarios as window_scenarios

    kw = row_scenarios(device)["decode 256"]["kw"]
    adapter = SGLangSWAIndices(device=device)
    out["sglang_causal"] = lambda: adapter.causal(**kw)
    rows = adapter.causal_rows(**kw)  # the call's rows, prepared once: the plain build
    out["slot_rows"] = lambda: adapter.builder.build_slot_rows(rows)
    case = window_scenarios(device)[0]
    window = SGLangSWAIndices(case.window, device)
    out["window_layout"] = lambda: window.window_layout(
        case.req, case.pos, zero_row=case.zero_row, capacity=case.capacity, floor=case.floor,
        num_groups=case.num_groups, padded_rows=case.padded_rows,
    )  # fmt: skip
    for fn in out.values():
        for _ in range(50):
            fn()
    return out


def primitives(device) -> dict[str, float]:
    """Host microseconds of the device primitives a call is made of."""
    import torch

    t = torch.zeros(256, dtype=torch.int32, device=device)
    index = (device.index or 0) if device.type == "cuda" else -1

    def stream():
        torch._C._cuda_getCurrentRawStream(index)

    def switch():
        with torch.cuda.device(index):
            pass

    cases = {
        "torch.empty(256, int32)": lambda: torch.empty(256, dtype=torch.int32, device=device),
        "torch.empty((256, 128), int32)": lambda: torch.empty((256, 128), dtype=torch.int32, device=device),
        "tensor.data_ptr()": t.data_ptr,
        "tensor.stride()": t.stride,
        "tensor.get_device()": t.get_device,
        "split_with_sizes (7 views)": lambda: t.split_with_sizes([32] * 7 + [32]),
    }
    if device.type == "cuda":
        cases["current raw stream"] = stream
        cases["torch.cuda.device(i) enter+exit"] = switch
    found = {}
    for name, fn in cases.items():
        for _ in range(1000):
            fn()
        n = 20000
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        found[name] = (time.perf_counter() - t0) / n * 1e6
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--calls", type=int, default=2000, help="calls profiled per path (default 2000)")
    p.add_argument("--top", type=int, default=18, help="functions listed per path (default 18)")
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    args = p.parse_args()
    import torch
    from common import run_info

    device = torch.device(args.device)
    print(run_info())
    for name, us in primitives(device).items():
        print(f"primitive {name:<36} {us:7.2f} us")
    calls = paths(device)
    for name in args.paths:
        fn = calls[name]
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        plain = (time.perf_counter() - t0) / args.calls * 1e6
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fn()
        prof.disable()
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text).sort_stats("tottime")
        stats.print_stats(args.top)
        print(f"\n=== {name}: {plain:.1f} us a call unprofiled; profiled, by own time:")
        lines = [ln for ln in text.getvalue().splitlines() if ln.strip()[:1].isdigit() or "ncalls" in ln]
        print("\n".join(ln.replace(str(ROOT) + "/", "") for ln in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
