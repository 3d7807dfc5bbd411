"""One call at a time on a builder's fixed buffers, with the builder's GPU current: ``BuilderLock``, and the
device switch alone: ``OnDevice``."""

from __future__ import annotations

import threading
from typing import Any

import torch

from .errors import ConcurrentBuildError


class OnDevice:
    """Make a builder's GPU current while it launches: kernels are loaded and launched on the current
    device, which may be another GPU (another builder's, or another thread's default). A plain class rather
    than a generator context manager: it is entered on every build, and a builder serves one build at a
    time, so one instance per builder is enough."""

    __slots__ = ("index", "_switched")

    def __init__(self, index: int):
        self.index = index  # -1: the CPU, nothing to make current
        self._switched: Any = None

    def __enter__(self) -> None:
        # torch's raw query: ``torch.cuda.current_device()`` re-checks CUDA's lazy initialisation first,
        # which a builder on a GPU has done (its buffers are there), at 3-4 us a call on a GPU host.
        if self.index >= 0 and torch._C._cuda_getDevice() != self.index:
            self._switched = torch.cuda.device(self.index)
            self._switched.__enter__()

    def __exit__(self, *exc: object) -> None:
        switched = self._switched
        if switched is not None:
            self._switched = None
            switched.__exit__(*exc)


class BuilderLock:
    """What every entry point of a builder holds while it runs: ``with lock("build"): ...``.

    Taken without waiting: a second thread entering any entry point fails at once with a
    ``ConcurrentBuildError`` naming the call, since a builder's fixed buffers serve one build at a time and
    waiting would hand the first caller's views another step's values. While held, the builder's GPU is the
    current device (``OnDevice``). A plain class with one kept entry per call name, not a generator context
    manager: it is entered on every build.
    """

    __slots__ = ("lock", "device", "_entries")

    def __init__(self, device_index: int):
        self.lock = threading.Lock()
        self.device = OnDevice(device_index)
        self._entries: dict[str, _Held] = {}

    def __call__(self, what: str) -> _Held:
        held = self._entries.get(what)
        if held is None:
            held = self._entries[what] = _Held(self, what)
        return held


class _Held:
    """``BuilderLock(what)``: the context manager of one entry point."""

    __slots__ = ("owner", "what")

    def __init__(self, owner: BuilderLock, what: str):
        self.owner = owner
        self.what = what

    def __enter__(self) -> None:
        owner = self.owner
        if not owner.lock.acquire(blocking=False):
            raise ConcurrentBuildError(
                f"{self.what}: this SWAMetadataBuilder is already in use by another thread; a builder's fixed "
                f"buffers serve one build at a time, so give each thread its own builder"
            )
        try:
            owner.device.__enter__()
        except BaseException:
            owner.lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        owner = self.owner
        try:
            owner.device.__exit__(*exc)
        finally:
            owner.lock.release()
