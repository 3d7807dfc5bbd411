"""The torch backend's token-slot and ring rows (docs/semantics.md #token-slot-rows, #ring-rows): the
vectorised torch builds of a ``SlotRows`` call (``swa_hal/slot_rows.py`` holds the inputs and their host
preflight, ``swa_hal/slot_ring.py`` the ring's), into the caller's outputs, without a host sync and in a fixed
number of operations whatever the rows. The Triton backends launch ``kernels/slot_rows.py`` instead.
"""

from __future__ import annotations

import torch

from ..config import INT32_LIMIT
from ..rules import Violation, record_candidate
from ..slot_rows import SlotRows


def row_prefixes(rows: SlotRows, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Each row's position p and pool row (int64) from its int64 ``ends``, and DSpark rows' block heads
    (None for causal rows): every row of a block reads its block's first row, the block's prefix P and
    pool row. Shared by the ring and the paged token-slot builds, which clamp ``ends`` differently."""
    pools = rows.pools.to(torch.int64)
    nb = rows.block
    if not nb:
        return ends - 1, pools, None
    head = torch.arange(rows.num_rows, device=ends.device) // nb * nb
    return ends[head] - 1, pools[head], head


def _first_bad(values: torch.Tensor, low: int, high: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: whether an entry lies outside [low, high], which entry is the first, and its value."""
    bad = torch.ne(values, values.clamp(low, high))
    any_bad, first = torch.max(bad, 1)
    return any_bad, first, values.gather(1, first[:, None])[:, 0]


def build_slot_rows(
    rows: SlotRows,
    window: int,
    out: torch.Tensor,
    lens: torch.Tensor,
    record: torch.Tensor,
    *,
    guard: bool,
    limit: int,
) -> None:
    """The torch build of token-slot rows into ``out``/``lens`` (no host sync). Guarded: a row that
    breaks a rule is handed out empty and the lowest such row is recorded in ``record`` (``rules.py``),
    with its first broken rule; a fixed number of operations whatever the rows."""
    if rows.ring is not None:
        build_ring_rows(rows, window, out, lens, record, guard=guard)
        return
    n = rows.num_rows
    if n == 0:
        return
    dev = out.device
    i64 = torch.int64
    width = out.shape[1]
    nb = rows.block
    cols = torch.arange(width, device=dev)
    rt, slot_map = rows.req_to_token, rows.slot_map
    assert rt is not None and slot_map is not None  # the preflight's
    num_pools, positions = rt.shape
    p, pool, head = row_prefixes(rows, rows.row_ends.to(i64))
    pool_at = pool.clamp(0, max(num_pools - 1, 0))
    if nb:
        ctx = p.clamp(0, window)
        if rows.floors is not None:
            floor = rows.floors.to(i64)[pool_at]
            ctx = torch.minimum(ctx, (p - floor).clamp_min(0))
        row_lens = torch.where(p >= 0, ctx + nb, 0)
        first_q = p - ctx  # context positions ascend from P - ctx
        top = p - 1  # the highest context position read
    else:
        lo = (p - (window - 1)).clamp_min(0)
        if rows.floors is not None:
            lo = torch.maximum(lo, rows.floors[:n].to(i64))
        row_lens = (p + 1 - lo).clamp_min(0)
        ctx = row_lens
        first_q = p  # positions descend from p
        top = p
    live = cols[None, :] < row_lens[:, None]
    # Token slots: req_to_token[pool, q], read through one flat index (q clamped into the pool's row).
    if positions and num_pools:
        # The pools' rows as one flat view (unit inner stride: the preflight's), row r at r * stride(0).
        table = rt.as_strided(((num_pools - 1) * rt.stride(0) + positions,), (1,))
        base = pool_at * rt.stride(0)
        q = first_q[:, None] + cols if nb else first_q[:, None] - cols
        index = q.clamp_(0, positions - 1).add_(base[:, None])
        token = torch.index_select(table, 0, index.view(-1)).view(n, width)
    else:
        token = torch.full((n, width), -1, dtype=rt.dtype, device=dev)
    if nb:
        assert rows.block_slots is not None and head is not None
        at = (head[:, None] + cols[None, :] - ctx[:, None]).clamp_(0, n - 1)
        from_table = cols[None, :] < ctx[:, None]
        token = torch.where(from_table, token, torch.index_select(rows.block_slots, 0, at.view(-1)).view(n, width))
    token = torch.where(live, token, -1)
    map_len = slot_map.shape[0]
    if map_len:
        at_map = token.clamp(0, map_len - 1)
        has = (at_map == token) & live
        slot = torch.where(has, torch.index_select(slot_map, 0, at_map.view(-1)).view(n, width), -1)
    else:
        slot = torch.full((n, width), -1, dtype=slot_map.dtype, device=dev)
    if guard:
        # Rules 8-11 per row, in order (rules.py): pool, position, token slot, cache slot. Entries past
        # lens are -1 here, which both slot rules accept.
        bad_token, _, token_value = _first_bad(token, -1, map_len - 1)
        bad_slot, _, slot_value = _first_bad(slot, -1, limit - 1)
        broken_by = torch.stack(
            [(row_lens > 0) & (pool != pool_at), (ctx > 0) & (top >= positions), bad_token, bad_slot]
        )
        broken, rule = torch.max(broken_by, 0)
        values = torch.stack([pool, top, token_value.to(i64), slot_value.to(i64)])
        value = values.gather(0, rule[None, :])[0].clamp_(-INT32_LIMIT - 1, INT32_LIMIT)
        key = torch.where(broken, torch.arange(n, device=dev), n)
        first = key.argmin(0, keepdim=True)
        found = torch.index_select(broken, 0, first)
        new = torch.cat([found, rule[first] + int(Violation.POOL), first, value[first]]).to(record.dtype)
        record_candidate(record, found, new)
        row_lens = torch.where(broken, 0, row_lens)
        slot = torch.where(broken[:, None], -1, slot)
    out.copy_(slot)
    lens.copy_(row_lens)


def build_ring_rows(
    rows: SlotRows, window: int, out: torch.Tensor, lens: torch.Tensor, record: torch.Tensor, *, guard: bool
) -> None:
    """The torch build of ring rows into ``out``/``lens`` (no host sync). Guarded: a row with entries
    whose request slot is outside the ring is handed out empty and the lowest one recorded (rule 12);
    nothing else a ring row computes can leave the ring."""
    n = rows.num_rows
    if n == 0:
        return
    ring = rows.ring
    assert ring is not None
    dev = out.device
    i64 = torch.int64
    size = ring.size
    width = out.shape[1]
    nb = rows.block
    cols = torch.arange(width, device=dev)
    # Exact int64 positions: a ring has no width to read past, so every position is a valid one and its
    # row must be its exact one (``q % size``); ends at or below 0 are rows at a negative position.
    p, pool, _ = row_prefixes(rows, rows.row_ends.to(i64).clamp_min(0))
    if nb:
        ctx = p.clamp(0, window)
        if rows.floors is not None:
            floor = rows.floors.to(i64)[pool.clamp(0, ring.slots - 1)]
            # max(P - floor, 0), capped at W, without forming P - floor (a floor near INT64_MIN).
            ctx = torch.minimum(ctx, p - torch.minimum(torch.maximum(floor, p - window), p))
        row_lens = torch.where(p >= 0, ctx + nb, 0)
        # The context ascending from P - ctx, then the block's own P + j, as ring offsets: reduced before the
        # columns are added, so a prefix near INT64_MAX gives its exact rows instead of wrapping past it.
        q = (p - ctx).remainder(size)[:, None] + cols
    else:
        lo = (p - (window - 1)).clamp_min(0)
        if rows.floors is not None:
            lo = torch.maximum(lo, rows.floors[:n].to(i64))
        row_lens = (p + 1 - lo).clamp_min(0)
        q = p[:, None] - cols  # newest first
    live = cols[None, :] < row_lens[:, None]
    entry = pool[:, None] * size + q.remainder(size)
    if guard:
        # Rule 12: only a row with entries is checked (an empty row computes no ring row).
        broken = (row_lens > 0) & ((pool < 0) | (pool >= ring.slots))
        key = torch.where(broken, torch.arange(n, device=dev), n)
        first = key.argmin(0, keepdim=True)
        found = torch.index_select(broken, 0, first)
        value = pool[first].clamp(-INT32_LIMIT - 1, INT32_LIMIT)
        new = torch.cat([found.to(i64), torch.full_like(first, int(Violation.RING_SLOT)), first, value])
        new = new.to(record.dtype)
        record_candidate(record, found, new)
        row_lens = torch.where(broken, 0, row_lens)
        live &= ~broken[:, None]
    out.copy_(torch.where(live, entry, -1))
    lens.copy_(row_lens)
