"""Token-slot rows (docs/semantics.md #token-slot-rows): window rows for engines that address their KV
cache through a per-request token table instead of a block table.

Such an engine (SGLang) keeps ``req_to_token[pool, q]``, the token slot of position q of the request in
pool row ``pool``, and ``slot_map[s]``, the SWA cache slot of token slot s (-1: none). It asks for one
row per query token, each given by its own position, pool row and floor, so no split, no
``query_start_loc`` and no per-request host data are involved. Two layouts:

* causal (``block == 0``): row i covers positions ``p_i, p_i - 1, ..., lo_i`` newest first,
  ``lo_i = max(p_i - W + 1, 0, floors[i])``; lens ``max(p_i - lo_i + 1, 0)``.
* DSpark (``block == N``): rows come in blocks of N; a block with prefix P (its first row's position)
  and pool row r covers its context ``[P - ctx, P)`` ascending, ``ctx = min(P, W)`` (and at most
  ``P - floors[r]``, the request's ``valid_from``), then the block's own N tokens (``block_slots``);
  lens ``ctx + N``, the same row for the block's N rows.

Entry values are ``slot_map[token slot]``; a token slot of -1 gives -1, as does every column at or
past lens. With ``ring`` (docs/semantics.md #ring-rows, ``slot_ring.py``) the same windows hold rows of a
per-request SWA ring instead, computed from the positions (no ``req_to_token``, no slot map, no
``block_slots``). This module holds the inputs and their O(1) host preflight; the builds are the backends'
(the torch backend's ``torch_backend/slot_rows.py``, the Triton backends' ``kernels/slot_rows.py``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from .config import INT32_LIMIT, MAX_ROW_WIDTH
from .errors import BatchCapacityError, BatchDeviceError, BatchDtypeError, BatchShapeError, BlockGeometryError
from .slot_ring import SlotRing, preflight_ring

if TYPE_CHECKING:
    from .config import SWAConfig

INDEX_DTYPES = (torch.int32, torch.int64)


# Not frozen: a new one per call (the SGLang adapter makes one for every call), and a frozen dataclass's
# constructor sets each field through object.__setattr__, about 2 us more a call.
@dataclasses.dataclass(eq=False)
class SlotRows:
    """One call's inputs (docs/semantics.md #token-slot-rows).

    row_ends: [n] each row's position + 1 (SGLang's ``seq_lens_casual``).
    pools: [n] each row's row of ``req_to_token`` (ring rows: its request slot of the ring).
    req_to_token: [pools, positions] token slots (None for ring rows).
    slot_map: [token slots] the cache slot of each token slot (-1: none; None for ring rows).
    floors: causal: [n] each row's lowest position, or None; DSpark: [pools] (ring: [slots]) each
        request's lowest position (``valid_from``), or None.
    block: 0 for causal rows, else the DSpark block size N (n a multiple of N).
    block_slots: DSpark: [n] the token slots of each block's own tokens, block after block (paged only).
    width: the row width of the output (at least W causal, W + N DSpark); None: exactly that.
    ring: a per-request SWA ring (docs/semantics.md #ring-rows): entries are its rows, computed from
        the positions, in place of ``slot_map[req_to_token[pool, q]]``; None: paged rows.
    """

    row_ends: torch.Tensor
    pools: torch.Tensor
    req_to_token: torch.Tensor | None = None
    slot_map: torch.Tensor | None = None
    floors: torch.Tensor | None = None
    block: int = 0
    block_slots: torch.Tensor | None = None
    width: int | None = None
    ring: SlotRing | None = None

    @property
    def num_rows(self) -> int:
        return self.row_ends.shape[0]

    def to(self, device: str | torch.device) -> SlotRows:
        """The same call with every tensor on ``device``."""
        return dataclasses.replace(
            self,
            **{
                f.name: getattr(self, f.name).to(device)
                for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), torch.Tensor)
            },
        )

    def row_width(self, window: int) -> int:
        need = window + self.block
        return need if self.width is None else self.width


def slot_limit(config: SWAConfig) -> int:
    """Cache slots a row may hold lie in [-1, slot_limit): the SWA cache's slots when the config knows
    its pages, else every slot that fits int32."""
    if config.num_kv_blocks is not None:
        return min(config.num_kv_blocks * config.block_size, INT32_LIMIT + 1)
    return INT32_LIMIT + 1


def _index_tensor(name: str, t: object, device: torch.device, ndim: int) -> torch.Tensor:
    # One expression for a good tensor (it runs for every input of every call), then the rule it broke.
    if (
        isinstance(t, torch.Tensor)
        and (t.dtype is torch.int32 or t.dtype is torch.int64)
        and t.device == device
        and t.dim() == ndim
        and (t.stride()[-1] == 1 or t.shape[-1] <= 1)
    ):
        return t
    if not isinstance(t, torch.Tensor):
        raise BatchDtypeError(name, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in INDEX_DTYPES:
        raise BatchDtypeError(name, f"{name} has dtype {t.dtype}; expected torch.int32 or torch.int64")
    if t.device != device:
        raise BatchDeviceError(name, f"{name} is on {t.device}; the builder's device is {device}")
    if t.dim() != ndim:
        raise BatchShapeError(name, f"{name} has {t.dim()} dimensions {tuple(t.shape)}; expected {ndim}")
    raise BatchShapeError(name, f"{name} must have unit stride in its last dimension (stride {tuple(t.stride())})")


def preflight_slot_rows(rows: SlotRows, window: int, device: torch.device, limit: int = INT32_LIMIT + 1) -> int:
    """The O(1) host checks of a call (dtypes, devices, ranks, strides, lengths; a ring's size and reach
    against ``limit``, the cache's slots); returns the row width. The checks that need the data are the
    guarded build's (docs/semantics.md #guarded-builds)."""
    n = _index_tensor("row_ends", rows.row_ends, device, 1).shape[0]
    pools = _index_tensor("pools", rows.pools, device, 1)
    if pools.shape[0] != n:
        raise BatchShapeError("pools", f"pools has {pools.shape[0]} rows; row_ends has {n}")
    block = rows.block
    # The type first (a float or numpy scalar would compare), then the bound: a row of W + N entries must fit
    # one kernel tensor (MAX_ROW_WIDTH).
    if type(block) is not int or not 0 <= block <= MAX_ROW_WIDTH - window:
        raise BatchShapeError(
            "block",
            f"block={block!r} must be 0 (causal rows) or the DSpark block size, an int in "
            f"[1, {MAX_ROW_WIDTH - window}] (rows of window {window} + block at most {MAX_ROW_WIDTH} wide)",
        )
    if rows.ring is not None:
        num_pools = preflight_ring(rows, window, limit).slots
        per = f"ring slot (the ring has {num_pools} slots)"
    else:
        if rows.req_to_token is None or rows.slot_map is None:
            missing = "req_to_token" if rows.req_to_token is None else "slot_map"
            raise BatchShapeError(missing, f"{missing} is required for token-slot rows without a ring")
        rt = _index_tensor("req_to_token", rows.req_to_token, device, 2)
        if rt.shape[1] >= INT32_LIMIT:
            # The kernels compute a row's positions and their end in int32, saturating wider inputs: a row
            # end past int32 is then known to read past the table (docs/semantics.md #guarded-builds).
            raise BatchCapacityError(
                "req_to_token",
                f"req_to_token has {rt.shape[1]} positions per pool row; at most {INT32_LIMIT - 1} (positions "
                "and row ends are int32)",
            )
        sm = _index_tensor("slot_map", rows.slot_map, device, 1)
        # An empty table or map has nothing a row could read, and no address a clamped lane could keep to
        # (docs/semantics.md #token-slot-rows): refused by shape, whatever the rows hold.
        if n and (rt.shape[0] == 0 or rt.shape[1] == 0):
            raise BatchShapeError(
                "req_to_token",
                f"req_to_token has shape {tuple(rt.shape)}: token-slot rows need at least one pool row and one "
                "position",
            )
        if n and sm.shape[0] == 0:
            raise BatchShapeError("slot_map", "slot_map is empty: token-slot rows need at least one token slot")
        num_pools = rt.shape[0]
        per = f"pool row (req_to_token has {num_pools})"
    if rows.floors is not None:
        floors = _index_tensor("floors", rows.floors, device, 1)
        if block == 0 and floors.shape[0] < n:
            raise BatchShapeError("floors", f"floors has {floors.shape[0]} rows; row_ends has {n}")
        if block and floors.shape[0] < num_pools:
            raise BatchShapeError("floors", f"floors has {floors.shape[0]} entries; DSpark floors are per {per}")
    if block and n % block:
        raise BlockGeometryError("row_ends", f"row_ends has {n} rows, not a multiple of the DSpark block size {block}")
    if block and rows.ring is None:
        if rows.block_slots is None:
            raise BatchShapeError("block_slots", "block_slots is required for DSpark rows (block > 0)")
        slots = _index_tensor("block_slots", rows.block_slots, device, 1)
        if slots.shape[0] < n:
            raise BatchShapeError("block_slots", f"block_slots has {slots.shape[0]} entries; row_ends has {n} rows")
    width = rows.row_width(window)
    if type(width) is not int:
        raise BatchCapacityError("width", f"width={width!r} must be an int or None")
    if width < window + block:
        raise BatchCapacityError(
            "width",
            f"width={width} is narrower than a row can be ({window + block}: window {window} + block {block})",
        )
    if width > MAX_ROW_WIDTH:
        # A kernel holds a whole row in one Triton tensor; the [n, width] output's offsets are int64.
        raise BatchCapacityError("width", f"width={width} is wider than a kernel's row can be ({MAX_ROW_WIDTH})")
    return width


def new_slot_rows_outputs(n: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A call's new outputs, ``(out, lens)`` (int32 [n, width] and [n]), as views of one new tensor: an
    allocation on a GPU costs about 5 us of host time, a view about 1."""
    out, lens = torch.empty(n * (width + 1), dtype=torch.int32, device=device).split_with_sizes([n * width, n])
    return out.view(n, width), lens


def check_outputs(out: torch.Tensor, lens: torch.Tensor, n: int, width: int, device: torch.device) -> None:
    """Caller-provided outputs: int32, on the device, [n, width] contiguous and [n]."""
    for name, t, shape in (("out", out, (n, width)), ("lens", lens, (n,))):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
            raise BatchDtypeError(name, f"{name} must be an int32 tensor")
        if t.device != device:
            raise BatchDeviceError(name, f"{name} is on {t.device}; the builder's device is {device}")
        if tuple(t.shape) != shape or not t.is_contiguous():
            raise BatchShapeError(name, f"{name} must be contiguous with shape {shape}; got {tuple(t.shape)}")
