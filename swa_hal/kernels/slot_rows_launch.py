"""The launch contract of ``slot_rows_kernel`` (``slot_rows.py``; docs/semantics.md #token-slot-rows):
its compile key, argument record and launch object. Importable without Triton.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .launch import CompileKey, TritonLaunch, cdiv, record_fields
from .tiles import tile


@dataclasses.dataclass(frozen=True, eq=True)
class SlotRowsKey(CompileKey):
    """The constexprs of ``slot_rows_kernel``, and the dtypes of the engine's inputs its compilation is
    specialised on (``dtypes``: ends, pools, floors, req_to_token, slot map, block slots). ``RING``: the
    ring's rows per request slot (docs/semantics.md #ring-rows), 0 for paged rows."""

    WINDOW: int
    WIDTH: int
    BLOCK_N: int
    HAS_FLOORS: bool
    RING: int
    BLOCK_T: int
    BLOCK_W: int
    GUARD: bool
    SLOT_LIMIT: int
    CLAMP: bool
    dtypes: tuple[torch.dtype, ...] = ()

    __hash__ = CompileKey.__hash__

    def constexprs(self) -> dict[str, Any]:
        out = super().constexprs()
        del out["dtypes"]
        return out

    def pointer_dtypes(self) -> dict[str, torch.dtype]:
        return dict(zip(SLOT_ROWS_INPUTS, self.dtypes))


@dataclasses.dataclass(slots=True, kw_only=True, eq=False)
class SlotRowsArgs:
    """The runtime arguments of ``slot_rows_kernel``, in signature order."""

    out_ptr: Any
    lens_ptr: Any
    violation_ptr: Any
    ends_ptr: Any
    pools_ptr: Any
    floors_ptr: Any
    rt_ptr: Any
    map_ptr: Any
    block_slots_ptr: Any
    n_rows: int
    rt_stride: int
    rt_width: int
    num_pools: int
    map_len: int


SLOT_ROWS_INPUTS = ("ends_ptr", "pools_ptr", "floors_ptr", "rt_ptr", "map_ptr", "block_slots_ptr")
SLOT_ROWS_POINTERS: dict[str, torch.dtype] = dict.fromkeys(record_fields(SlotRowsArgs)[:9], torch.int32)
# Every pointer is read at every launch: the outputs may be the engine's tensors too
# (``build_slot_rows(out=..., lens=...)``), and absent optional inputs read the violation record.
SLOT_ROWS_ENGINE = ("out_ptr", "lens_ptr", "violation_ptr", *SLOT_ROWS_INPUTS)
SLOT_ROWS_INTS = [name for name in record_fields(SlotRowsArgs) if name not in SLOT_ROWS_POINTERS]


def slot_rows_key(
    window: int,
    width: int,
    block: int,
    *,
    has_floors: bool,
    guard: bool,
    slot_limit: int,
    clamp: bool,
    device_type: str,
    dtypes: tuple[torch.dtype, ...],
    ring: int = 0,
) -> SlotRowsKey:
    # Rows of one token each, two dependent gathers per entry: latency-bound like decode rows.
    block_t, block_w = tile(width, device_type, decode=True)
    return SlotRowsKey(
        WINDOW=window,
        WIDTH=width,
        BLOCK_N=block,
        HAS_FLOORS=has_floors,
        RING=ring,
        BLOCK_T=block_t,
        BLOCK_W=block_w,
        GUARD=guard,
        SLOT_LIMIT=slot_limit,
        CLAMP=clamp,
        dtypes=dtypes,
    )


class SlotRowsLaunch(TritonLaunch):
    """``slot_rows_kernel``: one launch per ``build_slot_rows``."""

    KERNEL = "swa_hal.kernels.slot_rows:slot_rows_kernel"
    Args = SlotRowsArgs
    POINTERS = SLOT_ROWS_POINTERS
    ENGINE = SLOT_ROWS_ENGINE

    @staticmethod
    def programs(key: SlotRowsKey, args: SlotRowsArgs) -> int:
        return cdiv(args.n_rows, key.BLOCK_T)
