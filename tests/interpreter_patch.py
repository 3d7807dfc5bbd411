"""Patch triton.language once per interpreted launch, not once per @triton.jit helper call.

Triton 3.6's interpreter patches the language modules (``tl``, ``tl.core``, ``tl.math``, ``tl.tensor``) with
interpreter implementations when a launch starts and restores them when it ends. It also calls the same
``_patch_lang`` on every call of a nested ``@triton.jit`` helper, where the modules are already patched by
the launch in progress: each of those calls walks every member of the modules again (``inspect.getmembers``)
and re-sets identical wrappers. Our kernels call helpers thousands of times per build, so that repeated
patching was about a fifth of the interpreter's time.

``install()`` makes a nested call skip the patching when every language module the helper sees is already
patched by the launch in progress. Nothing a kernel computes changes: the helper runs against the same
patched modules it would have re-patched, and the launch's own patch and restore are Triton's.

It also switches off the interpreter's integer-overflow sanitiser, which is dead work there: for every int32
``+``, ``-`` and ``*`` it recomputes the operation in int64 and compares it with both bounds (six numpy
operations), then hands the result to ``device_assert``, which returns at once because the interpreter's
options never set ``debug``. That was about a third of an interpreted fuzz test's time. Kernels are held to
no wrap by their results (tests/test_int32_edges.py), never by that assertion; ``test_interpreter_patch.py``
shows the sanitiser cannot fire here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# Per launch in progress (innermost last): ids of the language modules it has patched so far.
_patched: list[set[int]] = []


class _NoPatch:
    """The scope of a skipped nested patch (Triton never restores a nested call's scope anyway)."""

    def restore(self) -> None:
        pass


def install() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter._patch_lang, "_once_per_launch", False):
        return
    options = interpreter.interpreter_builder.options
    interpreter.interpreter_builder.options = dataclasses.replace(options, sanitize_overflow=False)
    real_patch, real_launch = interpreter._patch_lang, interpreter.GridExecutor.__call__

    def patch_lang(fn: Any) -> Any:
        # What Triton's _patch_lang patches for fn: the triton.language modules visible in its globals.
        wanted = {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}
        if _patched and wanted <= _patched[-1]:
            return _NoPatch()  # a nested helper call: the launch in progress already patched these modules
        scope = real_patch(fn)
        if _patched:
            _patched[-1] |= wanted
        return scope

    def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        # GridExecutor.__call__ patches the language (for real: nothing is patched yet in this launch),
        # runs every program and restores the language; helper calls in between skip their patching.
        _patched.append(set())
        try:
            return real_launch(self, *args, **kwargs)
        finally:
            _patched.pop()

    patch_lang._once_per_launch = True  # type: ignore[attr-defined]
    interpreter._patch_lang = patch_lang
    interpreter.GridExecutor.__call__ = launch
