"""Shadow mode: the engine serves, swa_hal builds beside it and compares (docs/engines.md #shadow-mode).

On a release outside the tested set (or with ``SWA_HAL_VLLM=shadow`` / ``SWA_HAL_SGLANG=shadow``) every call a
plugin hooks is served by the engine's own code; for the first ``SWA_HAL_SHADOW_STEPS`` calls and then one
call in ``SWA_HAL_SHADOW_EVERY``, swa_hal builds the same metadata beside it and compares them field by field.
The first difference turns swa_hal off for the process (the engine keeps serving; nothing is compared
again) and is logged once: the call, the field, the first differing entry and both values. Under
``SWA_HAL_SHADOW_PROMOTE=1``, after ``SWA_HAL_SHADOW_STEPS`` equal comparisons swa_hal serves from the next
call on.

A comparison never synchronises: on a GPU its verdict is a small device record (per field: differs, the
first differing entry, both values there) copied to pinned host memory behind an event and read by a later
call; on the CPU it is read at once. A call made while a CUDA graph is being captured is not compared (a
comparison recorded into a graph would replay at every step, and reading it would sync); it counts as
skipped.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from typing import Any

import numpy as np
import torch

from ..envs import VARIABLES, env_flag, env_int

# What a comparison's device record holds per field (int64): whether it differs, the first differing entry
# (flat), and the engine's and swa_hal's values there.
_DIFFERS, _ENTRY, _ENGINE, _OURS = range(4)
# Device comparisons in flight at most; past this a call waits for the oldest (a sync), which a shadow that
# compares one call in SWA_HAL_SHADOW_EVERY never reaches.
MAX_PENDING = 64


@dataclasses.dataclass(frozen=True)
class Check:
    """One field of a comparison: the engine's value and swa_hal's, and (tensors) the entries where the field
    is defined (``mask``, broadcast against them; None: every entry). Tensors are compared on their device;
    anything else with ``==`` on the host."""

    field: str
    engine: Any
    ours: Any
    mask: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class ShadowSettings:
    """``steps`` (N): the first calls compared, and the equal comparisons before swa_hal may serve; ``every``
    (K): one call in K compared after those; ``promote``: serve after N equal comparisons."""

    steps: int
    every: int
    promote: bool

    @classmethod
    def from_env(cls) -> ShadowSettings:
        def number(name: str) -> int:
            value = env_int(name)
            return int(VARIABLES[name].default) if value is None else value

        return cls(number("SWA_HAL_SHADOW_STEPS"), number("SWA_HAL_SHADOW_EVERY"), env_flag("SWA_HAL_SHADOW_PROMOTE"))


@dataclasses.dataclass
class _Pending:
    call: int
    where: str
    fields: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    host: torch.Tensor
    event: Any


class Shadow:
    """One engine plugin's shadow in this process: which mode it is in (``shadow``; ``serve`` once promoted;
    ``off`` after a difference), what it compared and the first difference. Thread-safe: an engine may build
    on several threads."""

    def __init__(self, engine: str, logger: logging.Logger, settings: ShadowSettings | None = None):
        self.engine = engine
        self.logger = logger
        self.settings = settings if settings is not None else ShadowSettings.from_env()
        self.mode = "shadow"
        self.calls = 0  # calls seen while shadowing
        self.compared = 0  # comparisons started
        self.equal = 0  # comparisons whose verdict is in, and equal
        self.skipped = 0  # calls due for a comparison but made while a CUDA graph was captured
        self.difference: str | None = None
        self._pending: deque[_Pending] = deque()
        self._lock = threading.Lock()

    @property
    def shadowing(self) -> bool:
        return self.mode == "shadow"

    def turn(self) -> int | None:
        """The number of this call (from 1) when it is to be compared, else None. Reads the verdicts that have
        landed first, so a difference found by then stops the comparisons and a promotion takes effect."""
        self.poll()
        with self._lock:
            if self.mode != "shadow":
                return None
            self.calls += 1
            call = self.calls
            s = self.settings
            due = call <= s.steps or (call - s.steps) % s.every == 0
            if not due:
                return None
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                self.skipped += 1
                return None
            self.compared += 1
            return call

    def compare(self, call: int, where: str, checks: list[Check]) -> None:
        """Compare call ``call`` (``where``: what it built, for the log) field by field; the verdict is read now
        on the CPU, a later call on a GPU (``poll``)."""
        for check in checks:  # what the host holds decides at once
            if not isinstance(check.engine, torch.Tensor) or not isinstance(check.ours, torch.Tensor):
                if not _same(check.engine, check.ours):
                    self._differs(call, where, check.field, f"{self.engine} {check.engine!r}, swa_hal {check.ours!r}")
                    return
            elif tuple(check.engine.shape) != tuple(check.ours.shape):
                self._differs(
                    call,
                    where,
                    check.field,
                    f"shapes {self.engine} {tuple(check.engine.shape)}, swa_hal {tuple(check.ours.shape)}",
                )
                return
        tensors = [c for c in checks if isinstance(c.engine, torch.Tensor) and c.engine.numel()]
        if not tensors:
            self._verdict(call, where, None)
            return
        record = torch.stack([_record(c) for c in tensors])
        fields = tuple(c.field for c in tensors)
        shapes = tuple(tuple(c.engine.shape) for c in tensors)
        if record.device.type != "cuda":
            self._read(call, where, fields, shapes, record.numpy())
            return
        host = torch.empty(record.shape, dtype=record.dtype, pin_memory=True)
        host.copy_(record, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(record.device))
        with self._lock:
            self._pending.append(_Pending(call, where, fields, shapes, host, event))
            full = len(self._pending) > MAX_PENDING
        if full:
            self.poll(wait=True)

    def refused(self, call: int, where: str, exc: BaseException) -> None:
        """Call ``call`` was one swa_hal refused (a typed error) where the engine served it: a difference, since
        swa_hal serving would have raised inside the engine."""
        self._verdict(call, where, f"call {call} ({where}): swa_hal refused it where {self.engine} served it: {exc}")

    def poll(self, wait: bool = False) -> None:
        """Read the device verdicts that have landed (``wait``: all of them, a sync)."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                head = self._pending[0]
                if not wait and not head.event.query():
                    return
                self._pending.popleft()
            head.event.synchronize()
            self._read(head.call, head.where, head.fields, head.shapes, head.host.numpy())

    def report(self) -> dict[str, Any]:
        """What this shadow did: its mode, calls seen, comparisons started and found equal, calls skipped
        under graph capture, the first difference, and its settings."""
        with self._lock:
            return {
                "engine": self.engine,
                "mode": self.mode,
                "calls": self.calls,
                "compared": self.compared,
                "equal": self.equal,
                "pending": len(self._pending),
                "skipped_in_graph_capture": self.skipped,
                "difference": self.difference,
                "settings": dataclasses.asdict(self.settings),
            }

    # -- verdicts --------------------------------------------------------------------------------------

    def _read(
        self, call: int, where: str, fields: tuple[str, ...], shapes: tuple[tuple[int, ...], ...], rows: np.ndarray
    ) -> None:
        for field, shape, row in zip(fields, shapes, rows.tolist()):
            if row[_DIFFERS]:
                entry = tuple(int(i) for i in np.unravel_index(row[_ENTRY], shape)) if shape else ()
                self._differs(
                    call,
                    where,
                    f"{field}{list(entry)}",
                    f"{self.engine} {row[_ENGINE]}, swa_hal {row[_OURS]}",
                )
                return
        self._verdict(call, where, None)

    def _differs(self, call: int, where: str, field: str, values: str) -> None:
        self._verdict(call, where, f"call {call} ({where}): {field} differs: {values}")

    def _verdict(self, call: int, where: str, difference: str | None) -> None:
        promoted = False
        with self._lock:
            if difference is None:
                self.equal += 1
                s = self.settings
                if self.mode == "shadow" and s.promote and self.equal >= s.steps:
                    self.mode = "serve"
                    promoted = True
            elif self.difference is None:
                self.difference = difference
                self.mode = "off"
                self._pending.clear()
            else:
                return
        if promoted:
            self.logger.info(
                "swa_hal shadow: %d of %d comparisons equal: swa_hal now serves %s (SWA_HAL_SHADOW_PROMOTE=1)",
                self.equal,
                self.compared,
                self.engine,
            )
        elif difference is not None:
            self.logger.warning(
                "swa_hal shadow: %s; swa_hal is off for this process and %s's own code keeps serving "
                "(%d comparisons were equal before it)",
                difference,
                self.engine,
                self.equal,
            )


def fields_of(value: Any) -> dict[str, Any]:
    """The fields of an engine's record, whatever kind it is: a msgspec ``Struct`` (``__struct_fields__``), a
    dataclass, a named tuple, or any object's attributes."""
    names = getattr(value, "__struct_fields__", None)
    if names is None and dataclasses.is_dataclass(value):
        names = [f.name for f in dataclasses.fields(value)]
    if names is None:
        names = getattr(value, "_fields", None)
    if names is None:
        return dict(vars(value))
    return {name: getattr(value, name) for name in names}


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that do not compare are not the same
        return False


def _record(check: Check) -> torch.Tensor:
    """A field's verdict on its device, without a sync: [differs, first differing entry, engine's value,
    swa_hal's value] (int64)."""
    a, b = check.engine, check.ours
    if a.dtype != b.dtype:
        a, b = a.to(torch.int64), b.to(torch.int64)
    differs = a.ne(b)
    if check.mask is not None:
        differs = differs & check.mask
    flat = differs.reshape(-1)
    entry = flat.to(torch.uint8).argmax().reshape(1)
    return torch.cat(
        [
            flat.any().reshape(1).to(torch.int64),
            entry.to(torch.int64),
            a.reshape(-1).index_select(0, entry).to(torch.int64),
            b.reshape(-1).index_select(0, entry).to(torch.int64),
        ]
    )
