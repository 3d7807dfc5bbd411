"""The launch contracts of the ragged-rows kernels (``ragged.py``): ``ragged_indptr_kernel`` (the
exclusive prefix sum of the decode lens) and ``ragged_rows_kernel`` (the CSR scatter). Importable
without Triton.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from .launch import CompileKey, TritonLaunch, record_fields
from .tiles import tile

if TYPE_CHECKING:
    from ..config import SWAConfig

INDPTR_BLOCK = 1024


@dataclasses.dataclass(frozen=True, eq=False)
class IndptrKey(CompileKey):
    """The constexprs of ``ragged_indptr_kernel``."""

    BLOCK: int
    CLAMP: bool


@dataclasses.dataclass(frozen=True, eq=False)
class RaggedKey(CompileKey):
    """The constexprs of ``ragged_rows_kernel``."""

    WIDTH: int
    BLOCK_T: int
    BLOCK_W: int
    CLAMP: bool


@dataclasses.dataclass(slots=True, kw_only=True, eq=False)
class IndptrArgs:
    indptr_ptr: Any
    lens_ptr: Any
    n_rows: int


@dataclasses.dataclass(slots=True, kw_only=True, eq=False)
class RaggedArgs:
    ragged_ptr: Any
    indptr_ptr: Any
    idx_ptr: Any
    lens_ptr: Any
    n_rows: int
    capacity: int


def indptr_key(*, clamp: bool) -> IndptrKey:
    return IndptrKey(BLOCK=INDPTR_BLOCK, CLAMP=clamp)


def ragged_key(config: SWAConfig, *, causal: bool, clamp: bool, device_type: str) -> RaggedKey:
    width = config.window_size if causal else config.noncausal_index_width
    block_t, block_w = tile(width, device_type)
    return RaggedKey(WIDTH=width, BLOCK_T=block_t, BLOCK_W=block_w, CLAMP=clamp)


def ragged_keys(config: SWAConfig, *, clamp: bool, device_type: str) -> list[RaggedKey]:
    """The ragged variants a config needs: causal rows, and DSpark rows when DSpark is configured."""
    return [
        ragged_key(config, causal=causal, clamp=clamp, device_type=device_type)
        for causal in ((True, False) if config.is_dspark else (True,))
    ]


class IndptrLaunch(TritonLaunch):
    KERNEL = "swa_hal.kernels.ragged:ragged_indptr_kernel"
    Args = IndptrArgs
    POINTERS = dict.fromkeys(record_fields(IndptrArgs)[:2], torch.int32)
    # The lens are a view of the builder's decode lens: read at every launch, like an engine tensor
    # (a group's view does not start on an aligned address in every config).
    ENGINE = ("lens_ptr",)


class RaggedLaunch(TritonLaunch):
    KERNEL = "swa_hal.kernels.ragged:ragged_rows_kernel"
    Args = RaggedArgs
    POINTERS = dict.fromkeys(record_fields(RaggedArgs)[:4], torch.int32)
    # The decode rows and lens are views of the builder's buffers (a group's, or the DSpark rows).
    ENGINE = ("idx_ptr", "lens_ptr")
