"""Guard violations seen without a sync (docs/semantics.md #guarded-builds): ``ViolationWatch``.

A guarded build records its first violation in a small device buffer, ``[count, kind, request, value,
group]``.
``SWAMetadataBuilder.check()`` reads it with one host sync, which an engine's step loop never makes. The
watch reads it a build later instead: each ``poll`` (one per build) first looks at the host copy the
previous poll started, if that copy has landed, then starts the next one. A non-zero record becomes the
typed error full validation would have raised (``rules.violation_error``): logged once per kind (a
warning naming the field, the request and the value), or raised under ``SWA_HAL_STRICT=1``.

On CUDA the copy goes to pinned host memory with ``copy_(non_blocking=True)`` behind an event that the
next poll only queries; on the CPU the record is host memory already and is read in place. A poll never
synchronises, allocates no tensor, and does nothing during CUDA graph capture.

On CUDA, looking costs a copy, an event record and an event query (about 25 us of host time a build on an
H200's host, more than a build itself), so the builder looks only at every ``every``-th poll (``due``;
``SWA_HAL_POLL_EVERY``, default 16): a violation then surfaces within about ``2 * every`` builds instead of
one, and a clean step pays a counter. ``check()`` is unaffected: it reads the record itself.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from .envs import VARIABLES, env_flag, env_int
from .rules import REQUEST, VALUE, violation_error

if TYPE_CHECKING:
    import numpy as np

    from .config import SWAConfig
    from .errors import BatchValidationError

log = logging.getLogger("swa_hal")

# The warning, per kind: ``{error}`` is the typed error's message (it names the field, and the request
# or row, with the value in context); the three named values follow it for programs that scan logs.
MESSAGE = (
    "swa_hal: a guarded build handed out empty rows: {name}: {error} [field={field} request={request} "
    "value={value}]; logged once per kind, SWA_HAL_STRICT=1 raises instead"
)


def describe(record: list[int], error: BatchValidationError) -> str:
    """The warning ``poll`` logs for ``record`` (``[count, kind, request, value, group]``) and its error."""
    return MESSAGE.format(
        name=type(error).__name__, error=error, field=error.field, request=record[REQUEST], value=record[VALUE]
    )


class ViolationWatch:
    """Reads a builder's violation record a build late, without a host sync (see the module docstring).

    ``record``: the device buffer guarded builds record into (``MetadataBuffers.violation``, int32 [5]);
    ``config``: the builder's config (the errors' wording); ``logger``: where the warnings go (an engine
    plugin points it at the engine's logger); ``strict``: raise instead of logging (None: read
    ``SWA_HAL_STRICT`` when a violation is found, so a clean step reads no setting); ``every``: on CUDA,
    look at every ``every``-th ``due`` (None: ``SWA_HAL_POLL_EVERY``, default 16). ``group_names``: how
    the engine numbers the builder's KV-cache groups, which the errors of group builds name (None: by
    their place in the call); ``check()`` names them the same way.
    """

    def __init__(
        self,
        record: torch.Tensor,
        config: SWAConfig,
        *,
        logger: logging.Logger | None = None,
        strict: bool | None = None,
        every: int | None = None,
    ):
        self.record = record
        self.config = config
        self.logger = logger if logger is not None else log
        self.strict = strict
        self.group_names: tuple[int, ...] | None = None
        self.cuda = record.device.type == "cuda"
        if every is None:
            every = env_int("SWA_HAL_POLL_EVERY")
            every = int(VARIABLES["SWA_HAL_POLL_EVERY"].default) if every is None else every
        if every < 1:
            raise ValueError(f"every={every}: must be at least 1 (1: look at every build)")
        self.every = every
        # Polls left before the next look; the first poll looks (a fresh builder starts its first copy).
        self._countdown = 0
        self.logged: set[int] = set()  # the kinds already logged
        # The first violation taken off the device since the last ``take`` (what ``check()`` raises).
        self._first: list[int] | None = None
        # CUDA: a copy was started and not yet looked at; CPU: the last poll saw a violation.
        self._pending = False
        self._event: torch.cuda.Event | None = None
        if self.cuda:
            self._host = torch.zeros(record.shape, dtype=record.dtype, pin_memory=True)
            self._event = torch.cuda.Event()
        else:
            # The record itself: CPU memory needs no copy to be read without a sync.
            self._host = record
        self._view: np.ndarray = self._host.numpy()

    def due(self) -> bool:
        """Whether this build's poll should look (``poll``): always on the CPU, where looking reads host
        memory in place; on CUDA at every ``every``-th call, the others costing a counter."""
        if not self.cuda:
            return True
        if self._countdown:
            self._countdown -= 1
            return False
        self._countdown = self.every - 1
        return True

    def poll(self) -> None:
        """Once per build, after its launch: report what the previous poll saw, if it is readable (a
        warning per kind, or the typed error raised when strict), then look again. No sync."""
        if not self.cuda:
            # Host memory, read in place; a violation is reported by the poll after the one that first
            # saw it, as on CUDA (the record keeps its first violation, so both polls read the same one).
            if not self._view[0]:
                self._pending = False
            elif not self._pending:
                self._pending = True
            else:
                self._pending = False
                self._take_off()
            return
        if torch.cuda.is_current_stream_capturing():
            return  # a copy or a clear inside a graph would replay at every step
        event = self._event
        assert event is not None
        if self._pending:
            if not event.query():
                return  # still in flight: its host memory is not readable yet
            self._pending = False
            if self._view[0]:
                self._take_off()
                return  # the record was just cleared: the next poll copies it again
        self._host.copy_(self.record, non_blocking=True)
        event.record(torch.cuda.current_stream(self.record.device))
        self._pending = True

    def _take_off(self) -> None:
        """The host copy holds a violation: clear the device record, remember the violation for
        ``take``, and log it (once per kind) or raise it."""
        values = self._view.tolist()
        # In stream, no sync. The record keeps its first violation and only counts later ones, so the
        # device record still holds this very violation: clearing it loses nothing a copy could show.
        self.record.zero_()
        if self.cuda:
            self._view[0] = 0
        if self._first is None:
            self._first = values
        error = violation_error(values, self.config, self.group_names)
        if error is None:
            return
        strict = env_flag("SWA_HAL_STRICT") if self.strict is None else self.strict
        if strict:
            self._first = None  # raised here: a later check() does not raise it again
            raise error
        kind = values[1]
        if kind not in self.logged:
            self.logged.add(kind)
            self.logger.warning(describe(values, error))

    def take(self) -> list[int] | None:
        """The first violation taken off the device since the last ``take`` (waiting for a copy still in
        flight: a sync, for ``check()``), or None; forgets it."""
        if self.cuda and self._pending:
            assert self._event is not None
            self._event.synchronize()
            if self._view[0]:
                values = self._view.tolist()
                self._view[0] = 0
                if self._first is None:
                    self._first = values
        # On the CPU the record itself is what a poll saw: the caller reads and clears it.
        self._pending = False
        first, self._first = self._first, None
        return first
