#!/usr/bin/env python
"""Before and after in one run: the targets of two source trees, measured in turn (A B A B ...).

Each repetition runs the target measurement of tree A, then of tree B, each in its own process with
its own code (``benchmarks/bench_build.py --targets only --reps 1`` by default), and reads the JSON
they write. Hosts drift by up to 2x between runs, so what this prints is the ratio B / A of every
figure within each repetition: its median, min and max over the repetitions.

    python benchmarks/ab.py --a /path/to/before --b . --reps 3 [--iters 500]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def measure(tree: Path, iters: int, out: Path) -> dict[tuple[str, str], float]:
    """One target run of ``tree``: (case, metric) -> median."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "backends")])}
    cmd = [sys.executable, str(tree / "benchmarks" / "bench_build.py"), "--targets", "only", "--reps", "1",
           "--iters", str(iters), "--out", str(out), "--tag", "ab"]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    rows = json.loads((out / "targets_ab.json").read_text())["rows"]
    return {(r["case"], r["metric"]): r["median"] for r in rows}


def table(args: argparse.Namespace, runs: dict[str, list[dict[tuple[str, str], float]]]) -> str:
    """B / A per figure over the repetitions so far."""
    done = len(runs["b"])
    keys = [k for k in runs["a"][0] if all(k in r for r in runs["a"] + runs["b"])]
    lines = [
        f"A = {args.a}, B = {args.b}; {done} alternated repetitions of {args.iters} builds",
        f"{'case':<26} {'metric':<18} {'A median':>9} {'B median':>9} {'B/A median':>10} {'min':>6} {'max':>6}",
    ]
    for key in keys:
        a = [r[key] for r in runs["a"][:done]]
        b = [r[key] for r in runs["b"]]
        ratios = [y / x for x, y in zip(a, b) if x > 0]
        if not ratios:
            continue
        lines.append(
            f"{key[0]:<26} {key[1]:<18} {statistics.median(a):9.2f} {statistics.median(b):9.2f} "
            f"{statistics.median(ratios):10.3f} {min(ratios):6.3f} {max(ratios):6.3f}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", required=True, type=Path, help="the tree measured first in each repetition (before)")
    parser.add_argument("--b", required=True, type=Path, help="the tree measured second (after)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--table", type=Path, help="also write the table here, after every repetition")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[tuple[str, str], float]]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for side in ("a", "b"):
                out = Path(tmp) / f"{side}{rep}"
                out.mkdir()
                runs[side].append(measure(getattr(args, side).resolve(), args.iters, out))
            text = table(args, runs)
            if args.table:
                args.table.write_text(text)
            print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
