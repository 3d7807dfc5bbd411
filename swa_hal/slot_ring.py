"""Ring rows (docs/semantics.md #ring-rows): token-slot rows over a per-request SWA ring.

Some SWA caches (SGLang's per-request ring, ``swa_req_ring_size``) give each request slot ``s`` its own
``size`` cache rows and keep position ``q`` at row ``s * size + q % size``. A row's entries are then
computed from its positions alone: no ``req_to_token``, no slot map. The windows are the token-slot
rows' (causal newest first, DSpark context then block), so a ring is a flavour of ``SlotRows``
(``SlotRows(..., ring=SlotRing(size, slots))``); this module holds the ring and its O(1) host checks (the
torch backend builds ring rows in ``torch_backend/slot_rows.py``, the Triton backends launch
``kernels/slot_rows.py`` with ``RING`` set).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from .config import INT32_LIMIT
from .errors import BatchCapacityError, BatchShapeError


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
    """What the ring's checks read of a call (a ``slot_rows.SlotRows`` with ``ring``): named here so the two
    modules do not import each other."""

    @property
    def block(self) -> int: ...
    @property
    def ring(self) -> SlotRing | None: ...


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
