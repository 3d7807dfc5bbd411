"""The launch contract of ``request_window_kernel`` (``request_window.py``; docs/semantics.md
#request-window-layouts): its compile key, the calls a config can make, its argument record and launch
object, which owns the dispatch. Importable without Triton.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch

from .launch import DtypesKey, KeyedLaunch, cdiv, record_fields
from .tiles import next_pow2, tile

# Rows of the run scans' chunks: a program walks the rows before it (and a ring's worth after) this many
# at a time.
CHUNK = 256


REQUEST_WINDOW_INPUTS = ("req_ptr", "pos_ptr", "floors_ptr")


@dataclasses.dataclass(frozen=True, eq=False)
class RequestWindowKey(DtypesKey):
    """The constexprs of ``request_window_kernel``, and the dtypes of the engine's inputs its
    compilation is specialised on (``dtypes``: req, pos, floors)."""

    WINDOW: int
    BLOCK_W: int
    BLOCK_T: int
    BLOCK_G: int
    CHUNK: int
    HAS_FLOORS: bool
    dtypes: tuple[torch.dtype, ...] = ()

    INPUTS = REQUEST_WINDOW_INPUTS


@dataclasses.dataclass(slots=True, kw_only=True, eq=False)
class RequestWindowArgs:
    """The runtime arguments of ``request_window_kernel``, in signature order."""

    req_ptr: Any
    pos_ptr: Any
    floors_ptr: Any
    # The call's one output block (int64): every field of the layout at its place in it (the kernel's
    # ``_fields``), so a launch reads one address where it would read twelve.
    out_ptr: Any
    n_rows: int
    padded: int
    groups: int
    capacity: int
    zero_row: int
    query_programs: int


# The inputs' dtypes are the key's (``pointer_dtypes``); the outputs' are fixed.
REQUEST_WINDOW_POINTERS: dict[str, torch.dtype] = {
    **dict.fromkeys(REQUEST_WINDOW_INPUTS, torch.int64),
    "out_ptr": torch.int64,
}
# Every pointer is an engine tensor: the inputs are the engine's and the outputs new on every call.
REQUEST_WINDOW_ENGINE = tuple(REQUEST_WINDOW_POINTERS)
REQUEST_WINDOW_INTS = [name for name in record_fields(RequestWindowArgs) if name not in REQUEST_WINDOW_ENGINE]


def request_window_key(
    window: int, *, has_floors: bool, device_type: str, dtypes: tuple[torch.dtype, ...]
) -> RequestWindowKey:
    # One row per query token (or per history group), W entries each: the decode tiles' shape.
    block_t, _ = tile(window, device_type, decode=True)
    return RequestWindowKey(
        WINDOW=window,
        BLOCK_W=next_pow2(window),
        BLOCK_T=block_t,
        BLOCK_G=block_t,
        CHUNK=CHUNK,
        HAS_FLOORS=has_floors,
        dtypes=dtypes,
    )


class RequestWindowFacts(NamedTuple):
    """What a request-window call brings that its compile key depends on: ``request_window_key``'s
    arguments besides the window and the device type."""

    has_floors: bool
    dtypes: tuple[torch.dtype, ...]  # req, pos, floors


def request_window_facts() -> list[RequestWindowFacts]:
    """The request-window calls an engine makes (SGLang's ``window_layout``): with and without floors,
    the inputs all int32 or all int64 (absent floors read ``pos`` in their place). Any config: the
    layout's key depends on the window alone, and SGLang's adapter builds with a config of its window."""
    return [
        RequestWindowFacts(has_floors=floors, dtypes=(dtype,) * 3)
        for dtype in (torch.int32, torch.int64)
        for floors in (False, True)
    ]


class RequestWindowLaunch(KeyedLaunch[RequestWindowKey]):
    """``request_window_kernel``: one launch per ``build_request_window``. A call's facts are
    ``RequestWindowFacts``."""

    KERNEL = "swa_hal.kernels.request_window:request_window_kernel"
    Args = RequestWindowArgs
    POINTERS = REQUEST_WINDOW_POINTERS
    Facts = RequestWindowFacts
    INT64 = ("zero_row",)  # any int64 ring row (docs/semantics.md #request-window-layouts)
    ENGINE = REQUEST_WINDOW_ENGINE

    def dispatch(self, facts: RequestWindowFacts) -> RequestWindowKey:
        return request_window_key(self.config.window_size, device_type=self.device_type, **facts._asdict())

    def warmup_facts(self, guard: bool) -> list[RequestWindowFacts]:
        return request_window_facts()  # the kernel has no guarded variant

    @staticmethod
    def query_programs(key: RequestWindowKey, padded: int) -> int:
        return cdiv(padded, key.BLOCK_T)

    @staticmethod
    def programs(key: RequestWindowKey, args: RequestWindowArgs) -> int:
        # The query rows' programs, then the history groups'.
        return args.query_programs + cdiv(args.groups, key.BLOCK_G)
