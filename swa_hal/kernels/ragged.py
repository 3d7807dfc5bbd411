"""The ragged (CSR) form of decode rows that ROCm sparse-decode kernels consume.

``ragged[indptr[t] + j] = indices[t, j]`` for j < lens[t], with indptr the exclusive prefix sum of
lens (computed beforehand into a fixed buffer). One program per block of rows; no allocation, no
host sync, so it can run inside graph capture and after an in-place draft-step update.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .ragged_launch import IndptrLaunch, RaggedLaunch
from .swa_metadata import _row_block


@triton.jit(do_not_specialize=["n_rows", "capacity"], do_not_specialize_on_alignment=list(RaggedLaunch.ENGINE))
def ragged_rows_kernel(
    ragged_ptr,
    indptr_ptr,
    idx_ptr,
    lens_ptr,
    n_rows,
    capacity,
    WIDTH: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr,
    CLAMP: tl.constexpr,
):
    rows, row_ok, rows_at = _row_block(tl.program_id(0) * BLOCK_T, n_rows, BLOCK_T, CLAMP)
    base = tl.load(indptr_ptr + rows_at, mask=row_ok, other=0)
    lens = tl.load(lens_ptr + rows_at, mask=row_ok, other=0)
    cols = tl.arange(0, BLOCK_W)
    live = row_ok[:, None] & (cols[None, :] < lens[:, None])
    cols_at = cols
    if CLAMP:
        cols_at = tl.minimum(cols, WIDTH - 1)
    values = tl.load(idx_ptr + rows_at[:, None] * WIDTH + cols_at[None, :], mask=live, other=-1)
    dest = base[:, None] + cols[None, :]
    if CLAMP:
        dest = tl.minimum(dest, capacity - 1)
    tl.store(ragged_ptr + dest, values, mask=live)


@triton.jit(do_not_specialize=["n_rows"], do_not_specialize_on_alignment=list(IndptrLaunch.ENGINE))
def ragged_indptr_kernel(indptr_ptr, lens_ptr, n_rows, BLOCK: tl.constexpr, CLAMP: tl.constexpr):
    """indptr[0] = 0, indptr[t + 1] = lens[0] + ... + lens[t]; one program walks the rows."""
    carry = tl.sum(tl.zeros([BLOCK], dtype=tl.int32), axis=0)
    tl.store(indptr_ptr, carry)
    for start in range(0, n_rows, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        keep = offs < n_rows
        if CLAMP:
            offs = tl.minimum(offs, n_rows - 1)
        lens = tl.load(lens_ptr + offs, mask=keep, other=0)
        tl.store(indptr_ptr + 1 + offs, tl.cumsum(lens, axis=0) + carry, mask=keep)
        carry += tl.sum(lens, axis=0)
