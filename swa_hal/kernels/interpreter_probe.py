"""Can this Triton interpreter run swa_hal's kernels? One tiny kernel built from the constructs they use.

Triton's interpreter runs kernels through numpy, and some pairs of releases cannot run swa_hal's kernels
there (seen: triton 3.6 with numpy 2.4 cannot turn a loaded count into a loop bound). A backend that
starts in such an interpreter would fail at its first build, after ``warmup()`` and ``swa-hal info
--expect`` had reported success; the Triton backends run this probe when they start in the interpreter
and refuse to start instead, naming the versions (docs/kernels.md #triton-versions).
"""

from __future__ import annotations

import functools

import torch

# The versions whose interpreter is known to run the kernels (the [triton] extra admits these).
WORKING = "triton 3.6 to 3.9 with numpy < 2.4, or triton 3.8 or 3.9 with numpy 2.4"


def _kernel() -> object:
    import triton
    import triton.language as tl

    @triton.jit
    def probe(out_ptr, n_ptr, BLOCK: tl.constexpr):
        g = tl.program_id(0)
        n = tl.load(n_ptr)  # a count read from memory bounds a loop, as the kernels' searches do
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros((BLOCK,), dtype=tl.int32)
        for i in range(0, n):
            acc += i
        # A block mask selected by a program-id test, as the kernels' per-group writes are (not `block & test`:
        # the interpreter widens the test to an int32 block, which triton 3.9 refuses as a mask).
        tl.store(out_ptr + g * BLOCK + offs, acc + offs, mask=tl.where(g == 0, offs < n, False))

    return probe


@functools.cache
def interpreter_problem() -> str | None:
    """None when the interpreter runs the probe right; otherwise what went wrong, with the versions."""
    import numpy
    import triton

    out = torch.full((2, 8), -1, dtype=torch.int32)
    n = torch.tensor([3], dtype=torch.int32)
    try:
        _kernel()[(2,)](out, n, BLOCK=8)  # type: ignore[index]
    except Exception as exc:  # noqa: BLE001 - any failure of the interpreter is the answer
        problem = f"{type(exc).__name__}: {exc}"
    else:
        want = [[3, 4, 5] + [-1] * 5, [-1] * 8]
        if out.tolist() == want:
            return None
        problem = f"wrong result {out.tolist()}, expected {want}"
    return (
        f"the Triton interpreter of triton {triton.__version__} with numpy {numpy.__version__} cannot run "
        f"swa_hal's kernels ({problem}); use {WORKING}"
    )
