#!/usr/bin/env python
"""The long run of the guarded-output fuzz (docs/semantics.md #guarded-builds): malformed inputs through
every guarded entry point of each backend, each compared bit for bit with the torch backend on the CPU.

The cases are the conformance kit's (``swa_hal.testing.guarded``): ``build`` and two draft-step updates of
its metadata, ``build_groups`` of three malformed groups and a grouped update (now and then views of one
storage, or structures that disagree with the batch), ``build_slot_rows`` at windows 8 and 20, paged
(``slot_rows``) and over a per-request ring (``ring_rows``), ``build_request_window`` at the same windows
(``request_window``), each entry point's settings just inside and outside their bounds (``settings``), and
validated builds of valid steps in the forms the default path takes (``validated``: longer per-request
buffers, host upper bounds, DSpark steps among them, overstated max_query_len, padding requests without
bounds, and inputs of a type the default path refuses). The classes each entry drew are printed after the run. Each case is a seeded
malformed input; a case counts as clean when the backend raised what the reference raised
and otherwise handed out every output field equal to the reference's and recorded a violation exactly when
the reference did. On top of that every index handed out must lie in ``[-1, cache slots)``.

    python benchmarks/fuzz_guarded.py --device cuda --cases 8000            # the four Triton backends and torch, natively
    TRITON_INTERPRET=1 python benchmarks/fuzz_guarded.py --cases 200 --address-strict  # on a CPU, every lane checked

Where the device is a GPU, the Triton backends other than the device's own run on it with their platform
forced (the lanes they compute are theirs; the device only executes them). ``--address-strict`` (the CPU
interpreter only) checks every lane address of every kernel against its tensors'
storage (``swa_hal.testing.interpreter.address_strict``). Run it under ``compute-sanitizer --tool memcheck``
with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` to have every device access checked against one allocation per
tensor. It prints a line per backend and entry point, then the total; exit status 1 if any case differed. A
backend and entry point that runs for more than 10 s prints its progress to stderr every 10 s as it goes.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "backends")]

# The platform each backend is forced onto when the device is a GPU of another (the CUDA SM90 backend
# runs on the probed device itself).
FORCED = {
    "cuda": None,
    "sm12x": "vendor=cuda,capability=12.0",
    "rocm": "vendor=rocm,arch=gfx942,capability=9.4",
    "xpu": "vendor=xpu",
    "torch": None,
}
ENTRIES = ("build", "groups", "slot_rows", "ring_rows", "request_window", "settings", "validated")
# One config per window (SLOT_ROW_WINDOWS), which --windows picks from.
WINDOWED = ("slot_rows", "ring_rows", "request_window")
# A backend and entry point still running says how far it is this often (through the interpreter, 100 cases of
# one entry point take minutes).
PROGRESS_EVERY_S = 10.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="torch device the backends run on (default cpu)")
    p.add_argument("--backends", nargs="+", default=list(FORCED), choices=list(FORCED))
    p.add_argument("--entries", nargs="+", default=list(ENTRIES), choices=ENTRIES)
    p.add_argument("--cases", type=int, default=100, help="malformed inputs per backend and entry point")
    p.add_argument("--seed", default="long", help="seed prefix (default: long)")
    p.add_argument("--address-strict", action="store_true", help="check every lane address (CPU interpreter)")
    p.add_argument("--show", type=int, default=3, help="differing cases printed per line (default 3)")
    p.add_argument("--windows", nargs="+", type=int, help="only the token-slot configs of these windows")
    p.add_argument(
        "--shard",
        default="0/1",
        help="K/N: this process's share of the cases (its own seeds), so N processes split a long run",
    )
    args = p.parse_args()

    import torch

    from swa_hal import PlatformInfo, SWAMetadataBuilder
    from swa_hal.slot_rows import slot_limit
    from swa_hal.testing import guarded
    from swa_hal.testing.interpreter import address_strict

    device = torch.device(args.device)
    shard, shards = (int(v) for v in args.shard.split("/"))
    if not 0 <= shard < shards:
        p.error(f"--shard {args.shard}: K must be in [0, N)")
    cases = {
        "build": guarded.build_case,
        "groups": guarded.group_case,
        "slot_rows": guarded.slot_rows_case,
        "ring_rows": guarded.ring_rows_case,
        "request_window": guarded.request_window_case,
        "settings": guarded.settings_case,
        "validated": guarded.validated_case,
    }
    configs = {
        "build": [guarded.GUARDED_CONFIG, guarded.GUARDED_DSPARK_CONFIG, guarded.GUARDED_DSPARK_EDGE_CONFIG],
        "groups": [guarded.GUARDED_CONFIG],
        "slot_rows": [guarded.guarded_slot_rows_config(w) for w in guarded.SLOT_ROW_WINDOWS],
        "ring_rows": [guarded.guarded_slot_rows_config(w) for w in guarded.SLOT_ROW_WINDOWS],
        "request_window": [guarded.guarded_slot_rows_config(w) for w in guarded.SLOT_ROW_WINDOWS],
        # One config without a cache (a ring of 2^30 rows fits), one with (the ring's reach bound binds).
        "settings": [guarded.SETTINGS_CONFIG, guarded.guarded_slot_rows_config(8)],
        "validated": [guarded.GUARDED_CONFIG, guarded.GUARDED_DSPARK_EDGE_CONFIG],
    }
    print(
        f"torch {torch.__version__} on {device}; {args.cases} cases per backend and entry point; seed {args.seed!r}",
        flush=True,
    )
    total = failed = outside = 0
    # A run stopped by SIGTERM (a time limit's ``timeout``) still reports the cases it finished.
    signal.signal(signal.SIGTERM, _stop)
    stopped = False
    for name in args.backends:
        if stopped:
            break
        if device.type == "cpu":
            platform = _own_platform(name)
        else:
            assume = FORCED[name]
            platform = PlatformInfo.from_assume(assume) if assume else None
        # Every lane for the SM12x backend (its kernels clamp every lane's address), the lanes the mask
        # leaves on for the others (what any GPU requires).
        strict = partial(address_strict, active_only=name != "sm12x") if args.address_strict else guarded.unchecked
        for entry in args.entries:
            if stopped:
                break
            t0 = time.perf_counter()
            bad: list[str] = []
            n = 0
            windows = args.windows if entry in WINDOWED else None
            chosen = [c for c in configs[entry] if windows is None or c.window_size in windows]
            per_config = max(1, args.cases // max(1, len(configs[entry])) // shards)
            planned, shown_at = per_config * len(chosen), t0
            for config in chosen:
                if stopped:
                    break
                builder = SWAMetadataBuilder(config, device=device, backend=name, platform=platform)
                ref = guarded.reference_builder(config)
                limit = slot_limit(config)
                tail = f"-{shard}/{shards}" if shards > 1 else ""
                rng = random.Random(f"{args.seed}-{name}-{entry}-{config.window_size}{tail}")
                for k in range(per_config):
                    try:
                        problems = cases[entry](guarded.Draw(builder, ref, rng, device, k, strict))
                    except _Stopped:
                        stopped = True  # the case under way is not counted
                        break
                    n += 1
                    if problems:
                        bad.append(problems[0])
                    if time.perf_counter() - shown_at > PROGRESS_EVERY_S and n < planned:
                        # Progress on stderr (the record on stdout stays one line per backend and entry point).
                        shown_at = time.perf_counter()
                        print(
                            f"  ... {name} {entry}: {n}/{planned} cases, {len(bad)} failing so far, "
                            f"{shown_at - t0:.0f} s",
                            file=sys.stderr,
                            flush=True,
                        )
                if entry != "settings":  # its builders build no group rows: their buffers were never written
                    outside += _outside(builder, limit)
            total += n
            failed += len(bad)
            dt = time.perf_counter() - t0
            part = f" {shard}/{shards}" if shards > 1 else ""
            shown = f" w{','.join(str(c.window_size) for c in chosen)}" if windows else ""
            cut = f" (stopped at {n} of {planned})" if stopped else ""
            print(f"{name:<6} {entry:<10} {n:>7} cases  {len(bad):>4} differ  {dt:7.1f} s{shown}{part}{cut}", flush=True)
            for line in bad[: args.show]:
                # The case first, then what differed: a long case summary must not hide the difference.
                print(f"    {line if len(line) <= 1600 else line[:600] + ' ... ' + line[-1000:]}")
    print("classes drawn: " + ", ".join(f"{name} {count}" for name, count in sorted(guarded.DRAWN.items())))
    print(f"total: {total} malformed inputs, {failed} differ from the reference, {outside} indices outside the cache")
    return 1 if failed or outside else 0


class _Stopped(BaseException):
    """SIGTERM arrived: the run reports what it finished and ends (a BaseException: no case catches it)."""


def _stop(signum, frame):
    raise _Stopped


def _own_platform(name: str):
    """On a CPU: the backend's first declared platform (its kernels then run through the interpreter)."""
    from swa_hal import PlatformInfo
    from swa_hal.plugins import get_registry

    spec = get_registry().backends[name].spec
    return PlatformInfo.from_assume(spec.platforms[0]) if spec.platforms else None


def _outside(builder, limit: int) -> int:
    """Entries of the builder's index buffers outside [-1, limit): what a guarded build must never hand out."""
    count = 0
    buffers = builder.buffers
    for buf in (buffers.group_decode_indices, buffers.group_prefill_indices):
        count += int(((buf < -1) | (buf >= limit)).sum())
    return count


if __name__ == "__main__":
    sys.exit(main())
