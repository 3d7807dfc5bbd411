"""Request-window layouts (docs/semantics.md #request-window-layouts): the window rows of DeepSeek-V4.1,
whose attention reads one step's workspace (history rows copied from a per-request ring, then the step's
own query rows) instead of the paged SWA cache.

The inputs are one row per query token (its request's ring slot and its position, optionally its floor);
rows of one request follow each other as a *run*. The outputs say where each query row writes in the
workspace, which workspace rows it reads (newest first), which ring row each history row is copied from,
and which query rows commit back to the ring. This module holds the inputs, their O(1) host preflight and
the syncing validation of ``validate=True`` builds; the builds are the backends' (the torch backend's
``torch_backend/request_window.py``, which every other backend is held to, and the Triton backends'
``kernels/request_window.py``).
"""

from __future__ import annotations

import dataclasses

import torch

from .config import INT32_LIMIT
from .errors import BatchCapacityError, BatchConsistencyError, BatchRangeError, BatchShapeError
from .slot_rows import _index_tensor

# SGLang's ring rows per request (``RequestWindow``'s capacity).
DEFAULT_CAPACITY = 256


# Not frozen, for the reason SlotRows is not (a new one per call; the frozen constructor costs more).
@dataclasses.dataclass(eq=False)
class RequestWindowRows:
    """One call's inputs (docs/semantics.md #request-window-layouts).

    req: [n] each query row's request (its ring slot); a run is a maximal stretch of equal values.
    pos: [n] each query row's position; within a run they ascend by one.
    zero_row: the ring row an invalid history row copies from (a row of zeros).
    capacity: ring rows per request, at least the window (at most 2^31 - 1); ring row of (request, position)
        is ``req * capacity + pos % capacity``.
    floors: [>= n] each query row's lowest readable position, or None (0).
    num_groups: history groups of ``W`` rows in the workspace (None: n); at least the number of runs.
    padded_rows: query rows of the layout (a prefill graph pads past n); None or <= n: n.
    """

    req: torch.Tensor
    pos: torch.Tensor
    zero_row: int
    capacity: int = DEFAULT_CAPACITY
    floors: torch.Tensor | None = None
    num_groups: int | None = None
    padded_rows: int | None = None

    @property
    def num_rows(self) -> int:
        return self.pos.shape[0]

    def groups(self) -> int:
        return self.num_rows if self.num_groups is None else self.num_groups

    def padded(self) -> int:
        return max(self.num_rows, self.padded_rows or 0)

    def to(self, device: str | torch.device) -> RequestWindowRows:
        """The same call with every tensor on ``device``."""
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)


# Not frozen: a new one per call, the caller's to keep; a frozen dataclass's constructor sets each of its 13
# fields through object.__setattr__, about 1-2 us more a call.
@dataclasses.dataclass(eq=False)
class RequestWindowLayout:
    """One call's outputs: SGLang's ``WindowLayout`` fields, same dtypes, plus ``runs``.

    Query rows (``P = padded`` of them; rows past n are padding): ``req``, ``pos`` (int64 [P]),
    ``write_loc`` (int32 [P]), ``indices`` (int32 [P, W], newest first, -1 past lengths), ``lengths``
    (int32 [P]), ``commit_mask`` (bool [P]). History rows (``G * W``): ``history_req``, ``history_pos``,
    ``history_loc``, ``history_src`` (int64), ``history_valid`` (bool). ``size`` = G * W + P, the
    workspace rows. ``runs`` (int64 [1], on the device): how many runs the rows hold, for the check
    ``runs <= G`` that needs no host sync.
    """

    req: torch.Tensor
    pos: torch.Tensor
    write_loc: torch.Tensor
    indices: torch.Tensor
    lengths: torch.Tensor
    history_req: torch.Tensor
    history_pos: torch.Tensor
    history_loc: torch.Tensor
    history_valid: torch.Tensor
    history_src: torch.Tensor
    commit_mask: torch.Tensor
    size: int
    runs: torch.Tensor

    # SGLang's WindowLayout fields, in its order (runs is swa_hal's own).
    FIELDS = (
        "req",
        "pos",
        "write_loc",
        "indices",
        "lengths",
        "history_req",
        "history_pos",
        "history_loc",
        "history_valid",
        "history_src",
        "commit_mask",
        "size",
    )

    def fields(self) -> dict[str, torch.Tensor | int]:
        return {name: getattr(self, name) for name in self.FIELDS}


# A ring row is int64 (``history_src``), and ``zero_row`` is handed out as one.
INT64_LIMIT = 2**63 - 1


def _count(name: str, value: object, low: int, high: int, allow_none: bool = False) -> None:
    # The type first, then the bounds: a float, a bool or a numpy scalar would pass a comparison, and the
    # Triton backends launch with the value as it is (a numpy scalar fails inside the kernel's launch).
    # A plain int is one test; this runs for four settings of every call.
    if (type(value) is int and low <= value <= high) or (value is None and allow_none):
        return
    kind = f"an int in [{low}, {high}]{' or None' if allow_none else ''}"
    raise BatchRangeError(name, f"{name}={value!r} must be {kind}")


def preflight_request_window(rows: RequestWindowRows, window: int, device: torch.device) -> None:
    """The O(1) host checks of a call: dtypes, devices, ranks, strides, lengths, the scalar settings' types
    and bounds, and that every workspace row fits int32 (``write_loc``). The rules that need the data are
    ``validate_request_window``'s."""
    n = _index_tensor("pos", rows.pos, device, 1).shape[0]
    req = _index_tensor("req", rows.req, device, 1)
    if req.shape[0] != n:
        raise BatchShapeError("req", f"req has {req.shape[0]} rows; pos has {n}")
    if n == 0:
        raise BatchShapeError("pos", "a request-window layout needs at least one query row (pos is empty)")
    if rows.floors is not None and _index_tensor("floors", rows.floors, device, 1).shape[0] < n:
        raise BatchShapeError("floors", f"floors has {rows.floors.shape[0]} rows; pos has {n}")
    _count("zero_row", rows.zero_row, 0, INT64_LIMIT)
    # At most int32: the kernel's commit test (``row + capacity``) and the ring row of every int32 slot
    # (``req * capacity + pos % capacity``) then stay inside int64.
    _count("capacity", rows.capacity, 1, INT32_LIMIT)
    _count("num_groups", rows.num_groups, 1, INT32_LIMIT, allow_none=True)
    _count("padded_rows", rows.padded_rows, 0, INT32_LIMIT, allow_none=True)
    if rows.capacity < window:
        # A run's history is the W positions before it, read back from the ring: a shorter ring keeps two
        # of them in one row, the newer over the older, and the older one's history row reads the newer key.
        raise BatchCapacityError(
            "capacity",
            f"capacity={rows.capacity} ring rows per request are fewer than the window ({window}): two of "
            "a run's history positions would share a ring row",
        )
    history = rows.groups() * window
    size = history + rows.padded()
    if size > INT32_LIMIT:
        # Name the setting that made the workspace too large: the padding when the groups and the live
        # rows fit on their own.
        padded_too_large = rows.padded_rows is not None and rows.padded_rows > n and history + n <= INT32_LIMIT
        field = "padded_rows" if padded_too_large else "num_groups"
        raise BatchCapacityError(
            field,
            f"{field}: the workspace has {size} rows ({rows.groups()} groups of {window} + {rows.padded()} query rows); "
            f"write_loc is int32 (at most {INT32_LIMIT})",
        )


def validate_request_window(rows: RequestWindowRows) -> None:
    """The rules that need the data (a host sync; ``validate=True`` builds): the runs fit the history
    groups, and positions ascend by one within a run (a run's history starts at its first position)."""
    req = rows.req.to(torch.int64).cpu()
    pos = rows.pos.to(torch.int64).cpu()
    starts = torch.ones(req.shape[0], dtype=torch.bool)
    starts[1:] = req[1:] != req[:-1]
    run_rows = torch.nonzero(starts)[:, 0]
    groups = rows.groups()
    if run_rows.shape[0] > groups:
        at = int(run_rows[groups])
        raise BatchCapacityError(
            "req",
            f"req[{at}] starts run {groups + 1}, past num_groups={groups} (the runs past it get no history)",
            at,
        )
    broken = torch.nonzero(~starts[1:] & (pos[1:] != pos[:-1] + 1))
    if broken.shape[0]:
        at = int(broken[0, 0]) + 1
        raise BatchConsistencyError(
            "pos",
            f"pos[{at}]={int(pos[at])} does not follow pos[{at - 1}]={int(pos[at - 1])} within the run of "
            f"request {int(req[at])} (positions of a run ascend by one)",
            at,
        )
