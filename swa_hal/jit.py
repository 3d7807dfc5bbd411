"""Compile keys and warmup.

Every Triton kernel's variants are a function of the config and the backend alone: runtime sizes
are never specialised (see ``kernels/swa_metadata.py``), so the keys listed here are all the
compilations a builder can ever need, and ``warmup()`` makes them before the first real build.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from .config import SWAConfig
from .guard import block_limit

# Requests compared per step of the owner search: the whole batch in one step up to 512 requests.
MAX_SEARCH_BLOCK = 512
CLEAR_BLOCK = 1024
GATHER_BLOCK = 256
NUM_WARPS = 4
# Elements of one program's [rows, width] tile. The interpreter pays per program, not per
# element, so on the CPU a program takes a bigger tile (the logic is the same; tests cover both).
GPU_TILE_ELEMS = 4096
CPU_TILE_ELEMS = 8192
# Decode rows are latency-bound (a few programs, each a chain of dependent loads): smaller tiles
# spread the same rows over more programs (docs/performance.md).
GPU_DECODE_TILE_ELEMS = 512


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def num_warps() -> int:
    """Warps per program of every kernel; ``SWA_HAL_NUM_WARPS`` overrides it for tuning sweeps."""
    override = os.environ.get("SWA_HAL_NUM_WARPS")
    return int(override) if override else NUM_WARPS


def tile_elems(device_type: str, decode: bool = False) -> int:
    override = os.environ.get("SWA_HAL_DECODE_TILE_ELEMS" if decode else "SWA_HAL_TILE_ELEMS")
    if override:
        return int(override)
    if device_type == "cpu":
        return CPU_TILE_ELEMS
    return GPU_DECODE_TILE_ELEMS if decode else GPU_TILE_ELEMS


class _Key:
    """Compile keys are looked up on every launch: hash them once."""

    _hash: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(dataclasses.astuple(self)))  # type: ignore[call-overload]

    def __hash__(self) -> int:
        return self._hash

    def constexprs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, eq=True)
class RowsKey(_Key):
    """The constexprs of ``swa_metadata_kernel``."""

    WINDOW: int
    DECODE_WIDTH: int
    PREFILL_WIDTH: int
    BLOCK_SIZE: int
    BLOCK_T: int
    BLOCK_W: int
    BLOCK_TP: int
    BLOCK_WP: int
    SEARCH_BLOCK: int
    CLEAR_BLOCK: int
    GATHER_BLOCK: int
    MAX_IMAGE: int
    NONCAUSAL: bool
    GUARD: bool
    BLOCK_LIMIT: int
    GROUPED: bool
    DECODE_ROW_PAGES: int
    PREFILL_ROW_PAGES: int
    CLAMP: bool

    __hash__ = _Key.__hash__


@dataclasses.dataclass(frozen=True, eq=True)
class RaggedKey(_Key):
    """The constexprs of ``ragged_rows_kernel``."""

    WIDTH: int
    BLOCK_T: int
    BLOCK_W: int
    CLAMP: bool

    __hash__ = _Key.__hash__


def search_block(config: SWAConfig) -> int:
    return min(MAX_SEARCH_BLOCK, next_pow2(max(16, config.max_num_seqs)))


def row_pages(width: int, block_size: int) -> int:
    """The most pages ``width`` consecutive positions can touch: up to 4, the kernel loads each page's
    block once per row instead of once per entry."""
    return (width + block_size - 2) // block_size + 1


def _tile(width: int, device_type: str, decode: bool = False) -> tuple[int, int]:
    """(rows, padded width) of one program's tile for rows ``width`` wide."""
    block_w = next_pow2(max(width, 16))
    return min(256, next_pow2(max(1, tile_elems(device_type, decode) // block_w))), block_w


def rows_key(
    config: SWAConfig, *, causal: bool, clamp: bool, device_type: str, guard: bool = False, grouped: bool = False
) -> RowsKey:
    width = config.window_size if causal else config.noncausal_index_width
    block_t, block_w = _tile(width, device_type, decode=True)
    block_tp, block_wp = _tile(config.prefill_index_width, device_type)
    return RowsKey(
        WINDOW=config.window_size,
        DECODE_WIDTH=width,
        PREFILL_WIDTH=config.prefill_index_width,
        BLOCK_SIZE=config.block_size,
        BLOCK_T=block_t,
        BLOCK_W=block_w,
        BLOCK_TP=block_tp,
        BLOCK_WP=block_wp,
        SEARCH_BLOCK=search_block(config),
        CLEAR_BLOCK=CLEAR_BLOCK,
        GATHER_BLOCK=GATHER_BLOCK,
        MAX_IMAGE=config.max_image_tokens,
        NONCAUSAL=not causal,
        GUARD=guard,
        BLOCK_LIMIT=block_limit(config),
        GROUPED=grouped,
        DECODE_ROW_PAGES=row_pages(width, config.block_size),
        PREFILL_ROW_PAGES=row_pages(config.prefill_index_width, config.block_size),
        CLAMP=clamp,
    )


def ragged_key(config: SWAConfig, *, causal: bool, clamp: bool, device_type: str) -> RaggedKey:
    width = config.window_size if causal else config.noncausal_index_width
    block_t, block_w = _tile(width, device_type)
    return RaggedKey(WIDTH=width, BLOCK_T=block_t, BLOCK_W=block_w, CLAMP=clamp)


def rows_keys(config: SWAConfig, *, clamp: bool, device_type: str, guard: bool = False) -> list[RowsKey]:
    """Every variant a builder with this config can launch: the causal build (draft-step updates
    launch it too, with decode programs only), the DSpark build when DSpark is configured, and both
    again as group builds when the config has more than one KV-cache group."""
    keys = []
    for grouped in (False, True) if config.num_kv_groups > 1 else (False,):
        for causal in (True, False) if config.is_dspark else (True,):
            keys.append(
                rows_key(config, causal=causal, clamp=clamp, device_type=device_type, guard=guard, grouped=grouped)
            )
    return keys


@dataclasses.dataclass(frozen=True, eq=True)
class SlotRowsKey(_Key):
    """The constexprs of ``slot_rows_kernel``, and the input dtypes its compilation is specialised on."""

    WINDOW: int
    WIDTH: int
    BLOCK_N: int
    HAS_FLOORS: bool
    BLOCK_T: int
    BLOCK_W: int
    GUARD: bool
    SLOT_LIMIT: int
    CLAMP: bool
    dtypes: tuple[str, ...] = ()

    __hash__ = _Key.__hash__

    def constexprs(self) -> dict[str, Any]:
        out = super().constexprs()
        del out["dtypes"]
        return out


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
    dtypes: tuple[str, ...],
) -> SlotRowsKey:
    # Rows of one token each, two dependent gathers per entry: latency-bound like decode rows.
    block_t, block_w = _tile(width, device_type, decode=True)
    return SlotRowsKey(
        WINDOW=window,
        WIDTH=width,
        BLOCK_N=block,
        HAS_FLOORS=has_floors,
        BLOCK_T=block_t,
        BLOCK_W=block_w,
        GUARD=guard,
        SLOT_LIMIT=slot_limit,
        CLAMP=clamp,
        dtypes=dtypes,
    )


INDPTR_BLOCK = 1024


@dataclasses.dataclass(frozen=True, eq=True)
class IndptrKey(_Key):
    """The constexprs of ``ragged_indptr_kernel``."""

    BLOCK: int
    CLAMP: bool

    __hash__ = _Key.__hash__
