"""Tile sizes of the kernels' programs: a function of the config and the device type alone.

Runtime sizes are never specialised, so the tiles chosen here (and the constexprs of each compile
key) are all the variants a builder can launch. The interpreter pays per program, not per element,
so on the CPU a program takes a bigger tile (the logic is the same; tests cover both).
"""

from __future__ import annotations

from .. import envs

# Elements of one program's [rows, width] tile.
GPU_TILE_ELEMS = 4096
CPU_TILE_ELEMS = 8192
# Decode rows are latency-bound (a few programs, each a chain of dependent loads): smaller tiles
# spread the same rows over more programs (docs/performance.md).
GPU_DECODE_TILE_ELEMS = 512


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def tile_elems(device_type: str, decode: bool = False) -> int:
    override = envs.env_int("SWA_HAL_DECODE_TILE_ELEMS" if decode else "SWA_HAL_TILE_ELEMS")
    if override:
        return override
    if device_type == "cpu":
        return CPU_TILE_ELEMS
    return GPU_DECODE_TILE_ELEMS if decode else GPU_TILE_ELEMS


def tile(width: int, device_type: str, decode: bool = False) -> tuple[int, int]:
    """(rows, padded width) of one program's tile for rows ``width`` wide."""
    block_w = next_pow2(max(width, 16))
    return min(256, next_pow2(max(1, tile_elems(device_type, decode) // block_w))), block_w
