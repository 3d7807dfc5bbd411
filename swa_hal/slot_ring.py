"""Ring rows (docs/semantics.md #ring-rows): token-slot rows over a per-request SWA ring.

Some SWA caches (SGLang's per-request ring, ``swa_req_ring_size``) give each request slot ``s`` its own
``size`` cache rows and keep position ``q`` at row ``s * size + q % size``. A row's entries are then
computed from its positions alone: no ``req_to_token``, no slot map. The windows are the token-slot
rows' (causal newest first, DSpark context then block), so a ring is a flavour of ``SlotRows``
(``SlotRows(..., ring=SlotRing(size, slots))``); this module holds the ring, its O(1) host checks and
the vectorised torch build (the Triton backends launch ``kernels/slot_rows.py`` with ``RING`` set).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

from .config import INT32_LIMIT
from .errors import BatchCapacityError, BatchShapeError
from .rules import Violation, record_candidate


@dataclasses.dataclass(frozen=True)
class SlotRing:
    """A per-request SWA ring: ``slots`` request slots of ``size`` rows each; slot ``s`` keeps position
    ``q`` at row ``s * size + q % size``, so every row lies in ``[0, slots * size)``."""

    size: int
    slots: int

    @property
    def rows(self) -> int:
        return self.size * self.slots


# The kernels step a row's ring offsets in int32 (``(first - c + size) % size``, ``first < size``), which
# holds up to 2 * size - 1: a ring of more than 2^30 rows per slot would wrap.
MAX_RING_SIZE = 1 << 30


def _positive(name: str, value: object, high: int) -> int:
    # The type first: a numpy scalar or a float would compare, but the kernels take plain ints.
    if type(value) is not int or not 1 <= value <= high:
        raise BatchShapeError("ring", f"ring.{name}={value!r} must be a positive integer (an int in [1, {high}])")
    return value


class RingCall(Protocol):
    """What the ring reads of a call (a ``slot_rows.SlotRows`` with ``ring``): named here so the two modules
    do not import each other."""

    @property
    def row_ends(self) -> torch.Tensor: ...
    @property
    def pools(self) -> torch.Tensor: ...
    @property
    def floors(self) -> torch.Tensor | None: ...
    @property
    def block(self) -> int: ...
    @property
    def ring(self) -> SlotRing | None: ...
    @property
    def num_rows(self) -> int: ...


def preflight_ring(rows: RingCall, window: int, limit: int) -> SlotRing:
    """The ring's own O(1) host checks (the tensors are ``preflight_slot_rows``'s): a ring, no paged
    inputs beside it, as many rows per slot as a row has positions, and every ring row a cache slot."""
    ring = rows.ring
    if not isinstance(ring, SlotRing):
        raise BatchShapeError("ring", f"ring must be a SlotRing, got {type(ring).__name__}")
    size, slots = _positive("size", ring.size, MAX_RING_SIZE), _positive("slots", ring.slots, INT32_LIMIT + 1)
    # Ring rows are computed, never looked up: a table given beside them would be silently ignored.
    for name in ("req_to_token", "slot_map", "block_slots"):
        if getattr(rows, name) is not None:
            raise BatchShapeError(name, f"ring rows read no {name}: pass it for paged token-slot rows only")
    # A row covers up to W positions (W + N for a DSpark block): a shorter ring would give two of them
    # one row, the older one overwritten by the newer.
    need = window + rows.block
    if size < need:
        raise BatchCapacityError(
            "ring",
            f"ring.size={size} is shorter than a row's positions ({need}: window {window} + block {rows.block}): "
            "two positions of one row would share a ring row",
        )
    if size * slots > min(limit, INT32_LIMIT + 1):
        raise BatchCapacityError(
            "ring",
            f"the ring's {slots} slots x {size} rows reach past the cache's slots [0, {min(limit, INT32_LIMIT + 1)}) "
            "(ring rows are int32 cache slots)",
        )
    return ring


def row_prefixes(rows: RingCall, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Each row's position p and pool row (int64) from its int64 ``ends``, and DSpark rows' block heads
    (None for causal rows): every row of a block reads its block's first row, the block's prefix P and
    pool row. Shared by the ring and the paged token-slot builds, which clamp ``ends`` differently."""
    pools = rows.pools.to(torch.int64)
    nb = rows.block
    if not nb:
        return ends - 1, pools, None
    head = torch.arange(rows.num_rows, device=ends.device) // nb * nb
    return ends[head] - 1, pools[head], head


def build_ring_rows(
    rows: RingCall, window: int, out: torch.Tensor, lens: torch.Tensor, record: torch.Tensor, *, guard: bool
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
