"""The benchmark scripts that run on a CPU, run the way their docstrings say, in a few seconds each.

docs/performance.md's figures come from benchmarks/: a script that a change broke (a renamed internal, a changed
signature) would be found only at the next measurement, often on a GPU machine whose time is scarce. Each case
runs one script as a subprocess (the Triton backends in the interpreter) with small counts and checks a line of
its report; scripts that compare outputs with the reference exit non-zero on a difference. The GPU-only scripts
are held by ``make lint`` (the arguments of their calls into swa_hal). Slow: about two minutes of one core."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import ROOT

pytestmark = pytest.mark.slow

DRY_SM90 = ["--device", "cpu", "--backend", "cuda", "--assume", "vendor=cuda,capability=9.0"]

# script, its arguments, a line of its report ({out}: a folder of the test's).
CASES = {
    "host_path_cpu": (["--iters", "5", "--rounds", "1"], r"decode-256 host path, launch a no-op: unguarded [\d.]+ us"),
    "cpu_guard": (["--iters", "2", "--rounds", "1", "--scenarios", "decode_only"], r"\ndecode_only +[\d.]+ +[\d.]+ "),
    "cpu_ring_rows": ([], r"[\d.]+ us"),
    "kernel_sass": (["--config", "configs/deepseek_v4_flash.yaml"], r"SASS: \d+ instructions"),
    "fuzz_guarded": (
        ["--cases", "2"],
        r"total: \d+ malformed inputs, 0 differ from the reference, 0 indices outside the cache",
    ),
    "bench_build": (["--device", "cpu", "--iters", "3", "--no-plot", "--out", "{out}"], r"\ndecode_only +swa_hal\["),
    "vllm_step": (["--device", "cpu", "--reps", "1", "--iters", "8"], r"targets \(the plugin step\): host"),
    "host_floor": ([*DRY_SM90, "--reps", "1", "--iters", "5"], r"vLLM step of 8 groups, target 25 us"),
    "host_profile": (["--device", "cpu", "--calls", "3", "--top", "2"], r"=== window_layout: [\d.]+ us a call"),
}


@pytest.mark.parametrize("script", sorted(CASES))
def test_the_benchmark_runs_on_a_cpu(script, tmp_path):
    args, line = CASES[script]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), *(a.format(out=tmp_path) for a in args)]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(command)} exited {proc.returncode}:\n{output[-4000:]}"
    assert re.search(line, proc.stdout), f"{script}: no line matching {line!r} in:\n{proc.stdout[-4000:]}"
