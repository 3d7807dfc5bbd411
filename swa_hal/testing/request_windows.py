"""Random DeepSeek-V4.1 steps for request-window layouts (docs/semantics.md #request-window-layouts): the
arguments of SGLang 0.5.23's ``window_layout`` (``sglang/srt/mem_cache/dsv41_request_window.py``) for one step
of each kind its V4.1 backends build. The SGLang engine tests (``make test-sglang``) compare swa_hal's layout
with SGLang's on them, and ``benchmarks/sglang_window.py`` does on a GPU; neither this module nor its cases
need SGLang.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import torch

from ..request_window import RequestWindowRows

SWA_WINDOW = 128  # SGLang's (sglang/srt/layers/attention/deepseek_v4_backend.py)

WINDOW_KINDS = (
    "decode",
    "extend",
    "mixed",
    "replay",
    "replay_folded",
    "padded",
    "long_runs",
    "split_runs",
    "spare_groups",
)


# The arguments SGLang's ``window_layout`` takes by keyword, after the rows' requests and positions.
LAYOUT_KEYWORDS = ("zero_row", "window", "capacity", "floor", "num_groups", "padded_rows")


@dataclasses.dataclass
class WindowCase:
    """The arguments of one ``window_layout`` call."""

    kind: str
    req: torch.Tensor
    pos: torch.Tensor
    zero_row: int
    window: int
    capacity: int
    floor: torch.Tensor | None
    num_groups: int | None
    padded_rows: int | None

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of SGLang's ``window_layout`` (the window included)."""
        return {name: getattr(self, name) for name in LAYOUT_KEYWORDS}

    def rows(self) -> RequestWindowRows:
        """The same call as swa_hal's inputs (the window is the builder's), in ``RequestWindowRows``'s field order."""
        return RequestWindowRows(
            self.req, self.pos, self.zero_row, self.capacity, self.floor, self.num_groups, self.padded_rows
        )

    def to(self, device: str | torch.device) -> WindowCase:
        floor = None if self.floor is None else self.floor.to(device)
        return dataclasses.replace(self, req=self.req.to(device), pos=self.pos.to(device), floor=floor)


def window_case(rng: random.Random, kind: str, *, window: int = SWA_WINDOW, overfull: bool = False) -> WindowCase:
    """One random V4.1 step of ``kind`` (on the CPU). Rows come in runs (one request's consecutive new tokens):
    decode (one row each), extend (prefill chunks), mixed, replay (the encoder replay's floor: each run's
    first position), replay_folded (a per-request floor anywhere up to past the run), padded (the prefill
    graph's padding rows), long_runs (runs longer than the ring, so some rows do not commit),
    split_runs (one request in two runs that are not adjacent), spare_groups (more history groups than
    runs). ``overfull``: more runs than ``num_groups`` (SGLang's ``dsv41.window_groups_fit``)."""
    capacity = rng.choice((256, 256, 64, 16)) if window <= 16 else 256
    nreq = rng.randint(2 if overfull else 1, 6)
    slots = rng.sample(range(12), nreq)
    runs: list[tuple[int, int, int]] = []  # (slot, first position, rows)
    for s in slots:
        if kind == "decode" or (kind == "mixed" and rng.random() < 0.5):
            count = 1
        elif kind == "long_runs":
            count = rng.randint(capacity - 3, capacity + 20)
        else:
            count = rng.randint(1, 40)
        first = rng.choice((0, rng.randint(0, 5), rng.randint(window - 4, window + 4), rng.randint(0, 900)))
        runs.append((s, max(first, 0), count))
    if kind == "split_runs" and len(runs) > 1:
        s, first, count = runs[0]
        runs.append((s, first + count, rng.randint(1, 9)))
    req: list[int] = []
    pos: list[int] = []
    floor: list[int] = []
    for s, first, count in runs:
        if kind == "replay":
            lo = first
        elif kind == "replay_folded":
            lo = rng.randint(0, first + count + 1)
        else:
            lo = 0
        req += [s] * count
        pos += range(first, first + count)
        floor += [lo] * count
    dtype = rng.choice((torch.int32, torch.int64))
    n = len(pos)
    groups: int | None = None
    if overfull:
        groups = rng.randint(1, len(runs) - 1)
    elif kind == "spare_groups":
        groups = len(runs) + rng.randint(1, 4)
    elif rng.random() < 0.6:
        groups = len(runs)
    padded = n + rng.randint(1, 9) if kind == "padded" else (n if rng.random() < 0.1 else None)
    return WindowCase(
        kind=kind,
        req=torch.tensor(req, dtype=dtype),
        pos=torch.tensor(pos, dtype=dtype),
        zero_row=12 * capacity,
        window=window,
        capacity=capacity,
        floor=torch.tensor(floor, dtype=dtype) if kind.startswith("replay") or rng.random() < 0.15 else None,
        num_groups=groups,
        padded_rows=padded,
    )


def window_runs(case: WindowCase) -> int:
    """The step's runs (SGLang's groups of rows with one request)."""
    return 1 + int((case.req[1:] != case.req[:-1]).sum())


def runs_past_the_groups_read_their_own_rows(case: WindowCase, layout: dict[str, Any]) -> dict[str, Any]:
    """SGLang's op's layout ``layout`` (its ``WindowLayout`` fields by name) as swa_hal hands it out
    (docs/semantics.md #engine-parity): a run past the history groups reads its own query rows only. The op
    points that run's earlier entries at rows past the history (up to past the workspace); swa_hal makes them
    -1, and ``lengths`` counts the rest. Every other field, and every run with a group, is the op's."""
    indices = layout["indices"]
    device = indices.device
    req = case.req.to(device)
    n = req.shape[0]
    groups = n if case.num_groups is None else case.num_groups
    starts = torch.ones(n, dtype=torch.bool, device=device)
    starts[1:] = req[1:] != req[:-1]
    group = starts.cumsum(0) - 1
    rows = torch.arange(n, device=device)
    first = torch.cummax(torch.where(starts, rows, 0), 0).values
    k = torch.arange(indices.shape[1], device=device)
    before_run = (group[:, None] >= groups) & (k[None, :] > (rows - first)[:, None])
    indices = indices.clone()
    indices[:n][before_run] = -1
    return {**layout, "indices": indices, "lengths": (indices >= 0).sum(-1, dtype=layout["lengths"].dtype)}
