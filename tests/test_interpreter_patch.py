"""The test-only interpreter patches (tests/interpreter_patch.py) change no result: the overflow sanitiser they
switch off cannot fire in the interpreter, and a wrapping int32 add gives the same lanes either way."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from swa_hal.envs import env_flag

pytestmark = pytest.mark.skipif(not env_flag("TRITON_INTERPRET"), reason="the patches are for the interpreter")

triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit
def _wrapping_add(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    tl.store(out_ptr + offs, x + x)  # int32 + int32: wraps at 2^31


def _run(**options) -> torch.Tensor:
    from triton.runtime import interpreter

    saved = interpreter.interpreter_builder.options
    interpreter.interpreter_builder.options = dataclasses.replace(saved, **options)
    try:
        x = torch.tensor([1, 2**30, 2**31 - 1, -(2**31)], dtype=torch.int32)
        out = torch.empty_like(x)
        _wrapping_add[(1,)](x, out, N=4)
        return out
    finally:
        interpreter.interpreter_builder.options = saved


# 2 * x in two's complement int32, worked by hand: 2, 2^31 -> -2^31, 2^32 - 2 -> -2, -2^32 -> 0.
WRAPPED = [2, -(2**31), -2, 0]


def test_the_sanitiser_is_switched_off_by_the_patch():
    from triton.runtime import interpreter

    assert interpreter.interpreter_builder.options.sanitize_overflow is False


@pytest.mark.parametrize("sanitize", [True, False])
def test_an_overflowing_add_wraps_the_same_with_and_without_the_sanitiser(sanitize):
    assert _run(sanitize_overflow=sanitize).tolist() == WRAPPED


def test_the_sanitiser_only_fires_under_debug_which_the_interpreter_never_sets():
    """Its check reaches ``device_assert``, which does nothing unless ``debug`` is set; the interpreter's
    options leave ``debug`` off. If a Triton release sets it, this fails and the patch must be revisited."""
    from triton.runtime import interpreter

    assert interpreter.InterpreterOptions().debug is False
    # The interpreter wraps the kernel's AssertionError in its InterpreterError.
    with pytest.raises(interpreter.InterpreterError, match="int32 overflow"), np.errstate(all="ignore"):
        _run(sanitize_overflow=True, debug=True)
