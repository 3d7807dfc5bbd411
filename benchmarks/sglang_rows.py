"""SGLang's DeepSeek-V4 SWA rows (docs/semantics.md #token-slot-rows) from swa_hal's auto-selected backend,
against SGLang 0.5.23's own Triton ops for the same inputs, in one run.

    python3 benchmarks/sglang_rows.py [--iters 1000] [--reps 3]

swa_hal: ``SGLangSWAIndices.causal`` / ``.dspark`` (what the plugin's hooks call: one
``build_slot_rows``, one launch). SGLang: ``BuildCausalSwaPageIndices`` plus the lens arithmetic of
its backend's causal branch; ``ComputeDsparkWindowGather`` + ``BuildDsparkSwaPageIndices`` for DSpark.
The SGLang side runs only where its dsv4 ops import (``sglang`` on the path). Every figure is the median
of ``--reps`` interleaved repetitions (median of ``--iters`` calls each), with min and max; ratios are
taken within each repetition. Pools are laid out as SGLang's paged SWA allocator lays them out (both
pools paged in step, 256-token pages in random order).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import quiet_kineto  # noqa: F401 - before torch: the profiler's log lines silenced
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    compared,
    count_launches,
    e2e_us,
    graph_timer_or_none,
    host_mean_us,
    host_us,
    run_info,
    warm_gpu,
)

from swa_hal.integrations.sglang import SGLangSWAIndices  # noqa: E402

W, ALIGN, PAGE = 128, 64, 256


class Pool:
    """``req_to_token`` (int32) and ``full_to_swa`` (int64, trailing -1) for ``requests`` requests."""

    def __init__(self, rng: random.Random, requests: int, positions: int, device: torch.device):
        pages = -(-positions // PAGE)
        total = requests * pages
        full, swa = list(range(1, total + 1)), list(range(1, total + 1))
        rng.shuffle(full)
        rng.shuffle(swa)
        offs = torch.arange(PAGE)
        full_pages = torch.tensor(full).view(requests, pages)
        rt = (full_pages[:, :, None] * PAGE + offs).view(requests, pages * PAGE)
        f2s = torch.zeros((total + 1) * PAGE + 1, dtype=torch.int64)
        f2s[(torch.tensor(full)[:, None] * PAGE + offs).flatten()] = (torch.tensor(swa)[:, None] * PAGE + offs).flatten()
        f2s[-1] = -1
        self.req_to_token = rt.to(torch.int32).to(device)
        self.full_to_swa = f2s.to(device)
        self.positions = pages * PAGE


def scenarios(device: torch.device) -> dict[str, dict]:
    rng = random.Random(0)
    out = {}

    def causal(name: str, seqs: list[int], q: int, floor: bool = False) -> None:
        pool = Pool(rng, len(seqs), max(seqs) + 1, device)
        ends = torch.tensor([s - q + 1 + j for s in seqs for j in range(q)], dtype=torch.int32)
        pools = torch.arange(len(seqs)).repeat_interleave(q)
        kw = dict(
            req_to_token=pool.req_to_token,
            full_to_swa=pool.full_to_swa,
            req_pool_indices_repeated=pools.to(device),
            seq_lens_casual=ends.to(device),
        )
        if floor:
            kw["swa_replay_start"] = torch.tensor([max(0, s - W) for s in seqs], dtype=torch.int32).repeat_interleave(
                q
            ).to(device)
        out[name] = {"kind": "causal", "rows": len(seqs) * q, "kw": kw}

    causal("decode 256", [rng.randint(1000, 32000) for _ in range(256)], 1)
    causal("target verify 64 x 4", [rng.randint(1000, 32000) for _ in range(64)], 4)
    causal("extend 4 x 2048", [rng.randint(2048, 32000) for _ in range(4)], 2048)
    causal("late tail 8 x 128 (floors)", [rng.randint(2048, 32000) for _ in range(8)], 128, floor=True)
    n, nb = 64, 4
    prefixes = [rng.randint(1000, 32000) for _ in range(n)]
    pool = Pool(rng, n, max(prefixes) + nb + 1, device)
    ends = torch.tensor([p + 1 + j for p in prefixes for j in range(nb)], dtype=torch.int32)
    pools = torch.arange(n).repeat_interleave(nb)
    pos = torch.tensor(prefixes)[:, None] + torch.arange(nb)
    out_loc = pool.req_to_token.cpu()[torch.arange(n)[:, None], pos].flatten().to(torch.int64)
    valid_from = torch.tensor([p - rng.randint(0, 2 * W) for p in prefixes], dtype=torch.int64).clamp_min(0)
    out["dspark 64 x 4 (valid_from)"] = {
        "kind": "dspark",
        "rows": n * nb,
        "kw": dict(
            req_to_token=pool.req_to_token,
            full_to_swa=pool.full_to_swa,
            seq_lens_casual=ends.to(device),
            req_pool_indices_repeated=pools.to(device),
            out_loc=out_loc.to(device),
            block_size=nb,
            valid_from=valid_from.to(device),
        ),
    }
    return out


def sglang_runner(case: dict) -> Callable[[], object] | None:
    try:
        from sglang.kernels.ops.attention.dsv4.attn_metadata_kernels import BuildCausalSwaPageIndices
        from sglang.kernels.ops.speculative.dspark.dspark_attn_metadata import (
            BuildDsparkSwaPageIndices,
            ComputeDsparkWindowGather,
        )
    except ImportError:
        return None
    kw = case["kw"]
    if case["kind"] == "causal":
        floor = kw.get("swa_replay_start")

        def causal() -> object:
            idx = BuildCausalSwaPageIndices.execute(
                req_to_token=kw["req_to_token"],
                full_to_swa_mapping=kw["full_to_swa"],
                req_pool_indices_repeated=kw["req_pool_indices_repeated"],
                seq_lens_casual=kw["seq_lens_casual"],
                swa_window=W,
                page_index_aligned_size=ALIGN,
                swa_replay_start=floor,
            )
            lens = torch.clamp(kw["seq_lens_casual"], max=W)
            if floor is not None:
                lens = torch.minimum(lens, (kw["seq_lens_casual"] - floor).clamp_min(0))
            return idx, lens

        return causal

    def dspark() -> object:
        gather = ComputeDsparkWindowGather.execute(
            seq_lens_casual=kw["seq_lens_casual"],
            req_pool_indices_repeated=kw["req_pool_indices_repeated"],
            block_size=kw["block_size"],
            swa_window=W,
            valid_from=kw["valid_from"],
        )
        return BuildDsparkSwaPageIndices.execute(
            req_to_token=kw["req_to_token"],
            full_to_swa_mapping=kw["full_to_swa"],
            req_pool_indices_per_request=gather.req_pool_indices_per_request,
            offsets=gather.offsets,
            invalid=gather.invalid,
            out_loc=kw["out_loc"][: gather.num_q],
            context_lens=gather.context_lens,
            block_size=kw["block_size"],
            swa_window=W,
            page_index_aligned_size=ALIGN,
        )

    return dspark


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="torch device (default cuda; cpu: a dry run, no GPU times)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    adapter = SGLangSWAIndices(W, device)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"swa_hal backend: {adapter.backend_name}; device: {gpu}; {run_info()}")
    runners: dict[tuple[str, str], Callable[[], object]] = {}
    launches: dict[tuple[str, str], int] = {}
    for name, case in scenarios(device).items():
        method = adapter.causal if case["kind"] == "causal" else adapter.dspark
        ours = lambda m=method, kw=case["kw"]: m(**kw)  # noqa: E731
        # The same rows prepared once and built directly: what the adapter's own work is measured against.
        prepared = (adapter.causal_rows if case["kind"] == "causal" else adapter.dspark_rows)(**case["kw"])
        plain = lambda rows=prepared: adapter.builder.build_slot_rows(rows)  # noqa: E731
        theirs = sglang_runner(case)
        got = ours()
        assert all(torch.equal(a, b) for a, b in zip(got, plain()))
        if theirs is not None:
            want = theirs()
            same = torch.equal(got[0], want[0]) and torch.equal(got[1], want[1].to(torch.int32))
            print(f"{name}: rows {case['rows']}, swa_hal == SGLang: {same}")
            if not same:
                return 1
        for who, fn in (("swa_hal", ours), ("plain", plain), ("sglang", theirs)):
            if fn is not None:
                runners[(name, who)] = fn
                launches[(name, who)] = count_launches(fn, device)
    # None: not captured (no CUDA device, or an op that cannot be).
    graphs = {key: graph_timer_or_none(key, fn) if device.type == "cuda" else None for key, fn in runners.items()}
    measured: dict[tuple[str, str, str], list[float]] = {}
    for rep in range(args.reps):
        for key, fn in runners.items():
            measured.setdefault((*key, "host"), []).append(host_us(fn, args.iters, device))
            if key[1] == "swa_hal":  # the adapter's polls look at every SWA_HAL_POLL_EVERY-th call
                measured.setdefault((*key, "mean"), []).append(host_mean_us(fn, args.iters, device))
            measured.setdefault((*key, "e2e"), []).append(e2e_us(fn, args.iters, device))
            graph = graphs[key]
            if graph is not None:
                warm_gpu(device)  # the GPU's clock up before timing its time
                measured.setdefault((*key, "gpu"), []).append(graph())
        print(f"  repetition {rep + 1}/{args.reps} done", flush=True)
    print(f"\n{'scenario':<28} {'metric':<5} {'swa_hal median (min-max)':>26} {'SGLang median (min-max)':>26} "
          f"{'SGLang/swa_hal':>15}")
    for name in dict.fromkeys(k[0] for k in runners):
        for metric in ("host", "e2e", "gpu"):
            a = measured.get((name, "swa_hal", metric))
            b = measured.get((name, "sglang", metric))
            if a is None:
                continue
            cell_a, cell_b, ratio = compared(a, b)
            print(f"{name:<28} {metric:<5} {cell_a:>26} {cell_b:>26} {ratio:>15}")
        theirs_n = launches.get((name, "sglang"))
        print(f"{name:<28} launches: swa_hal {launches[(name, 'swa_hal')]}, SGLang {theirs_n if theirs_n else '-'}")
    print(f"\n{'scenario':<28} {'host us: adapter':>17} {'(mean)':>8} {'plain build':>12} {'adapter/plain':>14}")
    adapter_ratio: dict[str, float] = {}
    for name in dict.fromkeys(k[0] for k in runners):
        a, m, p = (measured[(name, who, metric)] for who, metric in
                   (("swa_hal", "host"), ("swa_hal", "mean"), ("plain", "host")))  # fmt: skip
        adapter_ratio[name] = statistics.median(x / y for x, y in zip(a, p))
        print(f"{name:<28} {statistics.median(a):>17.2f} {statistics.median(m):>8.2f} {statistics.median(p):>12.2f} "
              f"{adapter_ratio[name]:>13.2f}x")  # fmt: skip
    decode = adapter_ratio.get("decode 256")
    if decode is not None:
        print(f"target: decode 256 through the adapter within 1.2x of the plain build: "
              f"{'met' if decode <= 1.2 else 'MISSED'} ({decode:.2f}x)")  # fmt: skip
    for name in dict.fromkeys(k[0] for k in runners):
        b = measured.get((name, "sglang", "host"))
        if b is not None:
            r = statistics.median(y / x for x, y in zip(measured[(name, "swa_hal", "host")], b))
            print(f"target: {name} >= 2x cheaper on the host than SGLang: {'met' if r >= 2 else 'MISSED'} ({r:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
