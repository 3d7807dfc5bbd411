"""Lazy, guarded access to FlashMLA's scheduler objects.

``flash_mla`` is optional. Its wheels link against one torch and one CUDA runtime, so importing it
can fail with ImportError (not installed, ABI mismatch) or OSError (a shared library such as
libcudart or libcuda is missing, e.g. on a machine without a driver). Either way the CUDA backend
keeps building indices and lens; the scheduler slots stay None and ``swa-hal info`` says why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def scheduler_factory() -> tuple[Callable[[], Any] | None, str | None]:
    """Return (make one fresh empty scheduler object, None) or (None, why not)."""
    try:
        import flash_mla
    except (ImportError, OSError) as exc:
        return None, (
            f"flash_mla is not importable ({type(exc).__name__}: {exc}); "
            "install a wheel matching your torch (see docs/backends.md, 'FlashMLA distributions')"
        )
    get_mla_metadata = getattr(flash_mla, "get_mla_metadata", None)
    if get_mla_metadata is None:
        return None, f"flash_mla at {getattr(flash_mla, '__file__', '?')} has no get_mla_metadata()"

    def fresh() -> Any:
        # get_mla_metadata() returns (empty FlashMLASchedMeta, None); it plans lazily on first use.
        return get_mla_metadata()[0]

    return fresh, None
