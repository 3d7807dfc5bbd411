"""Launching a Triton kernel with as little host time as possible.

The first launch of a compile key goes through Triton's JIT (binding, specialisation, cache
lookup, compile on a miss) and we keep the compiled kernel it returns. Later launches of that key
call the compiled kernel's C launch function directly, with tensors replaced by their addresses:
that skips the per-call argument binding, Triton's Python launcher wrapper (it makes a closure and
asks two allocators for scratch space the kernel does not use) and, for every pointer, a
``data_ptr()`` call and a driver query (``cuPointerGetAttribute``), which together are most of
Triton's launch overhead. It is sound because nothing a launch passes can change the
specialisation (runtime ints and engine tensors are declared unspecialised, our own buffers never
move) and the builder checks dtypes and devices of the inputs before every build, which is what the
driver query would have caught.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch
import triton
from triton.runtime.jit import JITFunction

from ..jit import num_warps

# The leading arguments of the C launch function of the Triton versions we call it directly on:
# grid (3), stream, function, cooperative grid, PDL, global and profile scratch, kernel metadata,
# launch metadata, enter and exit hooks. Another layout (another Triton) takes the wrapper's path.
_DIRECT_FORMAT = "iiiKKppOOOOOO"
_RUNTIME = triton.knobs.runtime


def _hooks_idle() -> bool:
    """No launch hooks are installed (profilers such as proton add some): the fast path may skip them.
    Triton 3.6 keeps an empty HookChain there rather than None."""
    hook = _RUNTIME.launch_enter_hook
    return hook is None or not getattr(hook, "calls", True)


def _direct_launch(kernel: Any) -> Any:
    """The C launch function and the arguments it takes before the kernel's own, when this Triton's
    launcher can be called directly (a CUDA launcher whose kernel needs no scratch space); else None."""
    launcher = kernel.run
    try:
        from triton.backends.nvidia import driver as nvidia
    except ImportError:
        return None
    if (
        type(launcher) is not getattr(nvidia, "CudaLauncher", None)
        or getattr(nvidia, "_BASE_ARGS_FORMAT", None) != _DIRECT_FORMAT
        or launcher.global_scratch_size
        or launcher.profile_scratch_size
    ):
        return None
    head = (launcher.launch_cooperative_grid, launcher.launch_pdl, None, None, kernel.packed_metadata, None, None, None)
    return launcher.launch, head


class KernelLauncher:
    def __init__(self, fn: Any, device: torch.device):
        self.fn = fn
        self.interpreted = not isinstance(fn, JITFunction)
        # key -> (launch function, its leading arguments, constexprs, positions of pointer arguments)
        self._compiled: dict[Hashable, tuple[Any, tuple[Any, ...], tuple[Any, ...], tuple[int, ...]]] = {}
        self.kernels: dict[Hashable, Any] = {}  # the compiled kernels, for inspection (registers, spills)
        self.launches = 0
        if not self.interpreted:
            from triton.runtime.driver import driver

            self._current_stream = driver.active.get_current_stream
            self._device_index = device.index if device.index is not None else torch.cuda.current_device()

    def ready(self, key: Hashable) -> bool:
        """Whether launches of ``key`` take the fast path (and so accept addresses for pointers)."""
        return key in self._compiled

    def __call__(self, key: Any, grid: int, args: Sequence[Any], addresses: bool = False) -> None:
        """Launch ``key`` on ``grid`` programs. Pointer arguments may be tensors or addresses;
        ``addresses=True`` promises that once ``ready(key)`` every pointer is an address already."""
        self.launches += 1
        entry = self._compiled.get(key)
        if entry is None:
            self._slow(key, grid, args)
            return
        launch, head, constexprs, pointers = entry
        if not addresses:
            raw = list(args)
            for i in pointers:
                arg = raw[i]
                if arg.__class__ is not int:
                    raw[i] = arg.data_ptr()
            args = raw
        stream = self._current_stream(self._device_index)
        if _hooks_idle():
            launch(grid, 1, 1, stream, *head, *args, *constexprs)
        else:
            # A profiler's launch hooks are installed: the compiled kernel's own runner calls them
            # (addresses are fine there too; Triton's JIT would not take them for pointers).
            self.kernels[key][(grid, 1, 1)](*args, *constexprs, stream=stream)

    def _slow(self, key: Any, grid: int, args: Sequence[Any]) -> None:
        constexprs = key.constexprs()
        kernel = self.fn[(grid,)](*args, num_warps=num_warps(), **constexprs)
        if not self.interpreted and kernel is not None:
            if hasattr(kernel, "result"):
                kernel = kernel.result()
            pointers = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
            self.kernels[key] = kernel
            direct = _direct_launch(kernel)
            if direct is None:
                # Through Triton's own launcher wrapper (its leading arguments differ).
                head: tuple[Any, ...] = (kernel.function, kernel.packed_metadata, None, None, None)
                self._compiled[key] = (kernel.run, head, tuple(constexprs.values()), pointers)
            else:
                launch, head = direct
                self._compiled[key] = (launch, (kernel.function, *head), tuple(constexprs.values()), pointers)
