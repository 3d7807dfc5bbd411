#!/usr/bin/env python
"""What the guard costs the ``torch`` backend on the CPU: guarded against unguarded builds, interleaved.

For decode-256, the mixed step and the 16k-token prefill (configs/batches/*.yaml with the
DeepSeek-V4-Flash config) it builds one guarded and one unguarded builder on the CPU (``torch``
backend, no full validation) and times them in turn, ``--rounds`` rounds of ``--iters`` builds each
(A B A B ...), so both see the same load. It prints per scenario the median host time of each, their
ratio, the lowest and highest of the rounds' own ratios (each round's medians: the spread the host's
drifting speed leaves), and the aten operations of one build (a TorchDispatchMode counter: every aten call, nested
ones included). The header says how many torch threads the process had and how many the builds ran
with.

    PYTHONPATH=.:backends python benchmarks/cpu_guard.py [--iters 200] [--rounds 5] [--scenarios ...]

Runs on any tree with guarded builds (``SWAMetadataBuilder(..., guard=)``), so two trees can be
compared with the same script.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("decode_only", "mixed", "long_prefill")
CONFIG = "deepseek_v4_flash.yaml"


class OpCounter(TorchDispatchMode):
    """Counts the aten operations dispatched while it is active, and the torch thread count they ran with."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.threads: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        self.threads.add(torch.get_num_threads())
        return func(*args, **(kwargs or {}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=200, help="builds per round and variant (default 200)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    args = p.parse_args()

    from swa_hal import SWAConfig, SWAMetadataBuilder
    from swa_hal.scenarios import Scenario

    config = SWAConfig.from_yaml(ROOT / "configs" / CONFIG)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(
        f"torch {torch.__version__}; python {sys.version.split()[0]}; torch threads "
        f"{torch.get_num_threads()} of {os.cpu_count()} cpus; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    import swa_hal

    print(
        f"swa_hal from {Path(swa_hal.__file__).parent.parent}; backend torch on cpu; medians of {args.rounds} x {args.iters} builds, interleaved"
    )
    print(
        f"{'scenario':<14} {'guarded us':>11} {'unguarded us':>13} {'ratio':>6} {'round ratios':>13} "
        f"{'aten ops g':>11} {'aten ops u':>11} {'build threads':>14}"
    )
    for name in args.scenarios:
        batch = Scenario.from_yaml(ROOT / "configs" / "batches" / f"{name}.yaml").make_batch(config, "cpu")
        builders = {
            guard: SWAMetadataBuilder(config, device="cpu", backend="torch", validate=False, guard=guard)
            for guard in (True, False)
        }
        ops, threads = {}, set()
        for guard, b in builders.items():
            for _ in range(5):
                b.build(batch)
            with OpCounter() as counter:
                b.build(batch)
            ops[guard] = counter.count
            threads |= counter.threads
        samples: dict[bool, list[float]] = {True: [], False: []}
        round_ratios = []
        for _ in range(args.rounds):
            medians = {}
            for guard, b in builders.items():
                times = []
                for _ in range(args.iters):
                    t0 = time.perf_counter()
                    b.build(batch)
                    times.append(time.perf_counter() - t0)
                samples[guard] += times
                medians[guard] = statistics.median(times)
            round_ratios.append(medians[True] / medians[False])
        g, u = (statistics.median(samples[k]) * 1e6 for k in (True, False))
        spread = f"{min(round_ratios):.2f}-{max(round_ratios):.2f}"
        print(
            f"{name:<14} {g:>11.1f} {u:>13.1f} {g / u:>6.2f} {spread:>13} {ops[True]:>11} {ops[False]:>11} {','.join(map(str, sorted(threads))):>14}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
