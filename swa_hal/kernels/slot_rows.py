"""Token-slot rows in one launch (docs/semantics.md #token-slot-rows).

Each program takes BLOCK_T rows. A row's position, pool row and floor come from the engine's per-row
tensors (a DSpark row reads its block's first row), its window follows from them, and every entry
is two dependent gathers: the token slot ``req_to_token[pool, q]`` (DSpark block entries read
``block_slots``), then the cache slot ``slot_map[token slot]``. Consecutive columns read consecutive
positions of one request, so the first gather is one contiguous run per row.

Flags, as in ``swa_metadata.py``: GUARD checks the pool row, the positions, the token and cache slots,
hands offending rows out empty and records the first violation; CLAMP keeps every lane's address
inside its tensor (SM12x). Newest first (causal) or oldest first (DSpark) is BLOCK_N == 0 or not.
RING > 0 is the ring flavour (docs/semantics.md #ring-rows, ``_ring_rows``): the same windows, each entry
the ring row ``pool * RING + q % RING``, computed; nothing is read past the per-row inputs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .rules import CACHE_SLOT, POOL, POSITION, RING_SLOT, TOKEN_SLOT
from .slot_rows_launch import SLOT_ROWS_ENGINE, SLOT_ROWS_INTS
from .swa_metadata import _flag, _record, _row_block


@triton.jit
def _int32(v):
    """A recorded value, saturated to int32 (the violation record's dtype)."""
    return tl.minimum(tl.maximum(v, -2147483648), 2147483647).to(tl.int32)


@triton.jit
def _sat32(v):
    """An int64 (or int32) input saturated into int32: the row arithmetic below is int32, and a truncated
    int64 value would stand for another position. Callers show the saturated value decides the row as the
    exact one does, but for row ends past int32 (``far`` below)."""
    return tl.minimum(tl.maximum(v, -2147483648), 2147483647).to(tl.int32)


@triton.jit
def _first_bad(bad, values, cols, BLOCK_W: tl.constexpr):
    """Per row: whether any column is bad, and the value at the first bad column."""
    first = tl.min(tl.where(bad, cols[None, :], BLOCK_W), axis=1)
    at = tl.sum(tl.where(cols[None, :] == first[:, None], values, 0), axis=1)
    return first < BLOCK_W, at


@triton.jit
def _ring_rows(
    end,
    pool,
    pool_at,
    pool_ok,
    floors_ptr,
    violation_ptr,
    rows,
    rows_at,
    row_ok,
    cols,
    WINDOW: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_FLOORS: tl.constexpr,
    RING: tl.constexpr,
    GUARD: tl.constexpr,
):
    """Ring rows (docs/semantics.md #ring-rows): a row's entries and lens, its request slot checked
    (rule 12). The row arithmetic is int64 on the exact inputs: a ring has no width, so no position is
    out of reach and each needs its exact ``q % RING``. Per entry only int32 remains: a row spans fewer
    positions than the ring has rows (the preflight's), so ``q % RING`` steps from the row's first one."""
    p = tl.maximum(end.to(tl.int64), 0) - 1
    if BLOCK_N > 0:
        ctx = tl.minimum(tl.maximum(p, 0), WINDOW)
        if HAS_FLOORS:
            # valid_from of the block's request slot; a slot outside the ring is the guard's to report.
            floor = tl.load(floors_ptr + pool_at, mask=row_ok & pool_ok, other=0).to(tl.int64)
            # max(P - floor, 0) capped at W, without forming P - floor (a floor near INT64_MIN).
            ctx = tl.minimum(ctx, p - tl.minimum(tl.maximum(floor, p - WINDOW), p))
        row_lens = tl.where(p >= 0, ctx + BLOCK_N, 0)
        start = p - ctx  # the context ascends from P - ctx into the block's own P + j
    else:
        lo = tl.maximum(p - (WINDOW - 1), 0)
        if HAS_FLOORS:
            lo = tl.maximum(lo, tl.load(floors_ptr + rows_at, mask=row_ok, other=0).to(tl.int64))
        row_lens = tl.maximum(p + 1 - lo, 0)
        start = p  # newest first
    row_lens = tl.where(row_ok, row_lens, 0).to(tl.int32)
    # start >= 0 wherever the row has entries; elsewhere its value is never used.
    first = (tl.maximum(start, 0) % RING).to(tl.int32)
    if BLOCK_N > 0:
        at = (first[:, None] + cols[None, :]) % RING
    else:
        at = (first[:, None] - cols[None, :] + RING) % RING
    entry = pool[:, None] * RING + at
    if GUARD:
        kind = tl.zeros_like(row_lens)
        value = tl.zeros_like(row_lens)
        kind, value = _flag(kind, value, (row_lens > 0) & ~pool_ok, RING_SLOT, _int32(pool))
        row_lens = tl.where(kind > 0, 0, row_lens)
        _record(violation_ptr, kind, rows, value, rows, 0)  # no group build
    live = cols[None, :] < row_lens[:, None]
    return tl.where(live, entry, -1).to(tl.int32), row_lens


@triton.jit(do_not_specialize=SLOT_ROWS_INTS, do_not_specialize_on_alignment=list(SLOT_ROWS_ENGINE))
def slot_rows_kernel(
    out_ptr,
    lens_ptr,
    violation_ptr,
    ends_ptr,
    pools_ptr,
    floors_ptr,
    rt_ptr,
    map_ptr,
    block_slots_ptr,
    n_rows,
    rt_stride,
    rt_width,
    num_pools,
    map_len,
    WINDOW: tl.constexpr,
    WIDTH: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_FLOORS: tl.constexpr,
    RING: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr,
    GUARD: tl.constexpr,
    SLOT_LIMIT: tl.constexpr,
    CLAMP: tl.constexpr,
):
    rows, row_ok, rows_at = _row_block(tl.program_id(0) * BLOCK_T, n_rows, BLOCK_T, CLAMP)
    if BLOCK_N > 0:
        head = rows_at - rows_at % BLOCK_N
    else:
        head = rows_at
    end = tl.load(ends_ptr + head, mask=row_ok, other=0)
    pool = tl.load(pools_ptr + head, mask=row_ok, other=0).to(tl.int64)
    pool_ok = (pool >= 0) & (pool < num_pools)
    pool_at = pool
    if CLAMP:
        pool_at = tl.minimum(tl.maximum(pool, 0), num_pools - 1)
    cols = tl.arange(0, BLOCK_W)
    if RING > 0:
        idx, row_lens = _ring_rows(
            end,
            pool,
            pool_at,
            pool_ok,
            floors_ptr,
            violation_ptr,
            rows,
            rows_at,
            row_ok,
            cols,
            WINDOW,
            BLOCK_N,
            HAS_FLOORS,
            RING,
            GUARD,
        )
    else:
        # Ends at or below 0 all give p < 0, an empty row: raised to 0, p = end - 1 and every position below
        # stay inside int32 (p - W + 1 would wrap near INT32_MIN). A guarded call saturates int64 ends into
        # int32 first: a row whose end is past int32 reads positions past req_to_token's width (below
        # 2^31 - 1, the preflight's) whenever it reads any, so it is flagged by its exact end (``far``). An
        # unguarded call's values are inside int32 (docs/semantics.md #guarded-builds): one int32 maximum.
        if GUARD:
            p = _sat32(tl.maximum(end, 0)) - 1
        else:
            p = tl.maximum(end.to(tl.int32), 0) - 1
        far = end > 2147483647
        if BLOCK_N > 0:
            ctx = tl.minimum(tl.maximum(p, 0), WINDOW)
            # Without floors a far block (P >= 2^31 - 1) has context, min(P, W) > 0.
            far_ctx = far
            if HAS_FLOORS:
                # valid_from of the block's request; a pool row outside the table is the guard's to report.
                floor = tl.load(floors_ptr + pool_at, mask=row_ok & pool_ok, other=0)
                # min(ctx, max(p - floor, 0)) with the floor clamped into [p - W, p] first (ctx <= W): p - floor
                # itself leaves int32 for a floor near INT32_MIN. Guarded, in the floor's own dtype (exact for
                # int64 floors past int32).
                f = floor
                if not GUARD:
                    f = floor.to(tl.int32)
                ctx = tl.minimum(ctx, p - tl.minimum(tl.maximum(f, p - WINDOW), p).to(tl.int32))
                far_ctx = far & (floor < end - 1)
            row_lens = tl.where(p >= 0, ctx + BLOCK_N, 0)
            # A far block has N entries of its own whatever its context (P >= 0).
            far_live = far
            q = (p - ctx)[:, None] + cols[None, :]
            top = p - 1
        else:
            lo = tl.maximum(p - (WINDOW - 1), 0)
            # A far row (p >= 2^31 - 1) has entries, min(W, p + 1 - floor) > 0, without floors always.
            far_live = far
            if HAS_FLOORS:
                floor = tl.load(floors_ptr + rows_at, mask=row_ok, other=0)
                # Guarded, saturated: a floor past int32 is past every p here too (p < 2^31 - 1), one below
                # lies below 0.
                if GUARD:
                    lo = tl.maximum(lo, _sat32(floor))
                else:
                    lo = tl.maximum(lo, floor.to(tl.int32))
                far_live = far & (floor < end)
            row_lens = tl.maximum(p + 1 - lo, 0)
            ctx = row_lens
            far_ctx = far_live
            q = p[:, None] - cols[None, :]
            top = p
        row_lens = tl.where(row_ok, row_lens, 0)
        kind = tl.zeros([BLOCK_T], dtype=tl.int32)
        value = tl.zeros([BLOCK_T], dtype=tl.int32)
        if GUARD:
            # A far row is checked by what its exact end gives (far_live, far_ctx): its saturated window can
            # differ, but it reads past the table whenever it reads the table (its position is saturated in
            # the value, as the record's is).
            live_row = (row_lens > 0) | (row_ok & far_live)
            kind, value = _flag(kind, value, live_row & ~pool_ok, POOL, _int32(pool))
            past = ((ctx > 0) & (top >= rt_width)) | (row_ok & far_ctx)
            kind, value = _flag(kind, value, past, POSITION, tl.where(far, 2147483647, top))
        live = cols[None, :] < row_lens[:, None]
        from_table = cols[None, :] < ctx[:, None]
        read = live & from_table
        if GUARD:
            read = read & (kind == 0)[:, None]
        q_at = q
        if CLAMP:
            q_at = tl.minimum(tl.maximum(q, 0), rt_width - 1)
        token = tl.load(rt_ptr + pool_at[:, None] * rt_stride + q_at, mask=read, other=-1).to(tl.int64)
        if BLOCK_N > 0:
            own = live & ~from_table
            at = head[:, None] + cols[None, :] - ctx[:, None]
            if CLAMP:
                at = tl.minimum(tl.maximum(at, 0), n_rows - 1)
            token = tl.where(own, tl.load(block_slots_ptr + at, mask=own, other=-1).to(tl.int64), token)
        if GUARD:
            bad, what = _first_bad(live & ((token < -1) | (token >= map_len)), token, cols, BLOCK_W)
            kind, value = _flag(kind, value, bad, TOKEN_SLOT, _int32(what))
        has = live & (token >= 0) & (token < map_len)
        token_at = token
        if CLAMP:
            token_at = tl.minimum(tl.maximum(token, 0), map_len - 1)
        slot = tl.load(map_ptr + token_at, mask=has, other=-1).to(tl.int64)
        if GUARD:
            bad, what = _first_bad(has & ((slot < -1) | (slot >= SLOT_LIMIT)), slot, cols, BLOCK_W)
            kind, value = _flag(kind, value, bad, CACHE_SLOT, _int32(what))
            broken = kind > 0
            row_lens = tl.where(broken, 0, row_lens)
            slot = tl.where(broken[:, None], -1, slot)
            _record(violation_ptr, kind, rows, value, rows, 0)  # no group build
        idx = tl.where(live, slot, -1).to(tl.int32)
    cols_at = cols
    if CLAMP:
        cols_at = tl.minimum(cols, WIDTH - 1)
    store_ok = row_ok[:, None] & (cols[None, :] < WIDTH)
    tl.store(out_ptr + rows_at.to(tl.int64)[:, None] * WIDTH + cols_at[None, :], idx, mask=store_ok)
    tl.store(lens_ptr + rows_at, row_lens, mask=row_ok)
