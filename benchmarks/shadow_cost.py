#!/usr/bin/env python
"""What shadow mode costs a call (docs/engines.md #shadow-mode), in an engine's environment on the CPU.

vLLM (``--engine vllm``, in ``.venv-vllm-0.34.0``): one KV-cache group's build of a step, four ways, interleaved:
vLLM's own builder; swa_hal's builder serving; swa_hal's builder shadowing, on a compared call (vLLM's build,
swa_hal's, the comparison) and on an uncompared one (vLLM's build and a counter). SGLang (``--engine sglang``, in
``.venv-sglang``): the causal op as its hook answers it, the same four ways (SGLang's op; swa_hal's hook serving;
shadowing, compared and not).

    TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= python benchmarks/shadow_cost.py --engine vllm [--reps 5] [--iters 40]

Prints each repetition's medians, then per path the median host time of a call (min-max over repetitions) and
its ratio to the engine's own. Two more paths time what shadow mode adds to the engine's own call, alone: a
compared call's (swa_hal's build, its copy aside, the comparison) and an uncompared call's (a counter and a look
for landed verdicts). On the CPU vLLM's own build runs its Triton kernels in the interpreter, so its time (and
every path that includes it) is far above a GPU's and its noise hides the rest: the added work, timed alone, is
what carries over.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "backends"), str(ROOT / "tests"), str(ROOT / "tests" / "engines")]


def median_us(fn, iters: int) -> float:
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def vllm_paths(reqs: int):
    """(engine's own, swa_hal serving, shadow compared, shadow uncompared) builds of one decode step."""
    import tempfile

    import torch
    import vllm_harness as H
    from vllm.v1.attention.backends.mla import sparse_swa
    from vllm.v1.attention.ops.flashmla import FlashMLASchedMeta

    from swa_hal.integrations import vllm as integ
    from swa_hal.integrations import vllm_shadow
    from swa_hal.integrations.shadow import Shadow, ShadowSettings

    sparse_swa.get_mla_metadata = lambda *a, **k: (FlashMLASchedMeta(), None)  # FlashMLA's planner needs CUDA
    integ.register()
    variant = H.Variant("v4_w128b64", window=128, block_size=64, max_num_seqs=reqs, max_model_len=4096)
    vc = H.make_vllm_config(variant, Path(tempfile.mkdtemp()))
    spec = H.make_kv_spec(variant)
    base = sparse_swa.DeepseekSparseSWAMetadataBuilder
    ours_cls = integ.swa_hal_builder_cls(base)

    def make(shadow):
        vllm_shadow.start(shadow)
        try:
            return ours_cls(spec, ["model.layers.0.attn.swa_cache"], vc, torch.device("cpu"), backend="torch")
        finally:
            vllm_shadow.start(None)

    native = base(spec, ["model.layers.0.attn.swa_cache"], vc, torch.device("cpu"))
    serving = make(None)
    every = Shadow("vLLM", integ.log, ShadowSettings(10**9, 1, False))
    rarely = Shadow("vLLM", integ.log, ShadowSettings(1, 10**9, False))
    compared, uncompared = make(every), make(rarely)
    cfg = H.swa_config_for(variant, vc)
    batch, _ = H.draw(cfg, random.Random("shadow-cost"), "decode", max_reqs=reqs, max_context=2000)
    cm = H.common_metadata(batch)

    def shadowed(builder, shadow):
        def call():
            vllm_shadow.start(shadow)
            try:
                builder.build(0, cm)
            finally:
                vllm_shadow.start(None)

        return call

    shadowed(uncompared, rarely)()  # its one compared call, so the timed ones are not
    vllm_md = native.build(0, cm)

    def added() -> None:  # what a compared call does besides vLLM's own build
        call = every.turn()
        assert call is not None  # every call of ``every`` is compared
        ours = vllm_shadow._snapshot(compared.swa_hal_build(0, cm))
        every.compare(call, "benchmark", vllm_shadow.build_checks(vllm_md, ours, cm))

    paths = {
        "vLLM's own build": lambda: native.build(0, cm),
        "swa_hal serving": lambda: serving.build(0, cm),
        "shadow, compared": shadowed(compared, every),
        "shadow, not compared": shadowed(uncompared, rarely),
        "compared call's own work": added,
        "uncompared call's own work": rarely.turn,
    }
    return paths, f"vLLM builder, decode-{batch.num_reqs} (W=128, pages of 64), swa_hal's torch backend", (every, rarely)


def sglang_paths(reqs: int):
    import sglang_harness as H
    import torchvision_stub

    torchvision_stub.install()
    from sglang.kernels.ops.attention.dsv4.attn_metadata_kernels import BuildCausalSwaPageIndices

    from swa_hal.integrations import sglang as integ
    from swa_hal.integrations.shadow import Shadow, ShadowSettings

    integ.configure(backend="torch")
    rng = random.Random("shadow-cost")
    while True:
        case = H.causal_case(rng, "decode")
        if case.rows >= min(reqs, 6):
            break
    own = BuildCausalSwaPageIndices.__dict__["execute"].__func__
    kwargs = case.op_kwargs()
    every = Shadow("SGLang", integ.log, ShadowSettings(10**9, 1, False))
    rarely = Shadow("SGLang", integ.log, ShadowSettings(1, 10**9, False))

    def hooked(shadow):
        def call():
            integ._shadow = shadow
            try:
                integ.causal_execute(own, BuildCausalSwaPageIndices, **kwargs)
            finally:
                integ._shadow = None

        return call

    hooked(rarely)()
    sglang_rows = own(BuildCausalSwaPageIndices, **kwargs)

    def added() -> None:  # what a compared call does besides SGLang's own op
        call = every.turn()
        assert call is not None  # every call of ``every`` is compared
        integ._compare_causal(every, call, own, (BuildCausalSwaPageIndices,), kwargs, sglang_rows, None)

    paths = {
        "SGLang's own op": lambda: own(BuildCausalSwaPageIndices, **kwargs),
        "swa_hal serving": hooked(None),
        "shadow, compared": hooked(every),
        "shadow, not compared": hooked(rarely),
        "compared call's own work": added,
        "uncompared call's own work": rarely.turn,
    }
    return paths, f"SGLang causal op, {case.rows} rows, swa_hal's torch backend", (every, rarely)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=("vllm", "sglang"), required=True)
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    p.add_argument("--iters", type=int, default=40, help="calls timed per repetition and path (default 40)")
    p.add_argument("--reqs", type=int, default=16, help="requests of the step (default 16)")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    paths, what, shadows = (vllm_paths if args.engine == "vllm" else sglang_paths)(args.reqs)
    names = list(paths)
    for fn in paths.values():  # warm
        fn()
    times: dict[str, list[float]] = {n: [] for n in names}
    print(f"{what}; {args.reps} interleaved repetitions of {args.iters} calls per path")
    for rep in range(args.reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:  # rotating order
            times[name].append(median_us(paths[name], args.iters))
        print(f"  rep {rep + 1}: " + ", ".join(f"{n} {times[n][-1]:.0f} us" for n in names))
    for shadow in shadows:
        shadow.poll(wait=True)
        assert shadow.difference is None, shadow.difference
    own = names[0]
    print(f"{'path':<22} {'us per call (min-max)':>26} {'/ own':>7}")
    for name in names:
        v = times[name]
        ratio = statistics.median(a / b for a, b in zip(v, times[own]))
        print(f"{name:<22} {statistics.median(v):>12.0f} ({min(v):.0f}-{max(v):.0f}) {ratio:>7.2f}x")
    work, idle, served = (times[n] for n in ("compared call's own work", "uncompared call's own work", names[1]))
    ratios = [w / s for w, s in zip(work, served)]
    print(
        f"a compared call adds {statistics.median(work):.0f} us to the engine's own call ({statistics.median(ratios):.2f}x "
        f"swa_hal serving it); an uncompared one {statistics.median(idle):.1f} us"
    )
    print(f"comparisons equal: {shadows[0].equal} of {shadows[0].compared}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
