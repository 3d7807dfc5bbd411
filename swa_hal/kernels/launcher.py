"""Launching a Triton kernel with as little host time as possible.

The first launch of a compile key goes through Triton's JIT (binding, specialisation, cache
lookup, compile on a miss) and we keep the compiled kernel it returns. Later launches of that key
call the compiled kernel's launcher directly, with tensors replaced by their addresses: that skips
the per-call argument binding and, for every pointer, a ``data_ptr()`` call and a driver query
(``cuPointerGetAttribute``), which together are most of Triton's launch overhead. It is sound
because nothing a launch passes can change the specialisation (runtime ints and engine tensors are
declared unspecialised, our own buffers never move) and the builder checks dtypes and devices of
the inputs before every build, which is what the driver query would have caught.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch
import triton
from triton.runtime.jit import JITFunction

from ..jit import NUM_WARPS


def _hooks_idle() -> bool:
    """No launch hooks are installed (profilers such as proton add some): the fast path may skip them.
    Triton 3.6 keeps an empty HookChain there rather than None."""
    hook = triton.knobs.runtime.launch_enter_hook
    return hook is None or not getattr(hook, "calls", True)


class KernelLauncher:
    def __init__(self, fn: Any, device: torch.device):
        self.fn = fn
        self.interpreted = not isinstance(fn, JITFunction)
        self._compiled: dict[Hashable, tuple[Any, tuple[Any, ...], tuple[int, ...]]] = {}
        self.launches = 0
        # Pass addresses instead of tensors on the fast path (see the module docstring).
        self.raw_pointers = True
        if not self.interpreted:
            from triton.runtime.driver import driver

            self._current_stream = driver.active.get_current_stream
            self._device_index = device.index if device.index is not None else torch.cuda.current_device()

    def ready(self, key: Hashable) -> bool:
        """Whether launches of ``key`` take the fast path (and so accept addresses for pointers)."""
        return key in self._compiled

    def __call__(self, key: Any, grid: int, args: Sequence[Any]) -> None:
        self.launches += 1
        entry = self._compiled.get(key)
        if entry is not None and _hooks_idle():
            kernel, constexprs, pointers = entry
            if self.raw_pointers:
                raw = list(args)
                for i in pointers:
                    arg = raw[i]
                    if arg.__class__ is not int:
                        raw[i] = arg.data_ptr()
                args = raw
            kernel.run(
                grid,
                1,
                1,
                self._current_stream(self._device_index),
                kernel.function,
                kernel.packed_metadata,
                None,
                None,
                None,
                *args,
                *constexprs,
            )
            return
        constexprs = key.constexprs()
        kernel = self.fn[(grid,)](*args, num_warps=NUM_WARPS, **constexprs)
        if not self.interpreted and kernel is not None:
            if hasattr(kernel, "result"):
                kernel = kernel.result()
            pointers = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
            self._compiled[key] = (kernel, tuple(constexprs.values()), pointers)
