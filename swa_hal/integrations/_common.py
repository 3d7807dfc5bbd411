"""What every engine plugin of swa_hal does the same way: the on/off switch, the engine version
check, installing once, and the one log line that says which swa_hal backend now serves the engine.

Nothing here imports an engine: a plugin module imports its engine itself, after ``enabled`` and
``require_version`` have agreed. (docs/engines-internals.md, "The two engines' conventions".)
"""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from ..envs import env_switch

T = TypeVar("T")


class EngineVersionError(RuntimeError):
    """The engine installed is not the version an swa_hal plugin was built and tested against."""

    def __init__(self, engine: str, found: str | None, supported: Iterable[str], switch: str | None = None):
        self.engine = engine
        self.found = found
        self.supported = tuple(supported)
        have = "is not installed" if found is None else f"{found} is installed"
        off = f"; set {switch}=0 to run {engine} without swa_hal" if switch else ""
        super().__init__(
            f"swa_hal's {engine} plugin supports {engine} {', '.join(self.supported)} only, and {engine} {have}: "
            f"its hooks patch that version's internals, so swa_hal leaves {engine} untouched{off}"
        )


def enabled(switch: str, env: Mapping[str, str] | None = None) -> bool:
    """An integration is on unless its switch (``SWA_HAL_SGLANG``, ``SWA_HAL_VLLM``) is set to a false
    word (0, false, no, off; any case). Any other value than a true or false word is an error, so a
    typo never silently flips the engine's attention metadata (``swa_hal.envs``)."""
    return env_switch(switch, env)


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed. Asks the package
    metadata only: the engine itself is not imported."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_supported(found: str, supported: Iterable[str]) -> bool:
    """Whether ``found`` is one of ``supported``: exact versions ("0.5.23") or PEP 440 specifier sets
    (">=0.33,<0.34", "==0.33.*")."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    for item in supported:
        if item[:1] in "<>=!~":
            try:
                if Version(found) in SpecifierSet(item):
                    return True
            except (InvalidSpecifier, InvalidVersion):
                continue
        elif found == item:
            return True
    return False


def require_version(
    engine: str,
    distribution: str,
    supported: Iterable[str],
    *,
    switch: str | None = None,
    error: type[EngineVersionError] = EngineVersionError,
) -> str:
    """The engine's installed version when ``version_supported``; ``error`` (an EngineVersionError)
    naming what was found otherwise, "not installed" included."""
    supported = tuple(supported)
    found = installed_version(distribution)
    if found is None or not version_supported(found, supported):
        raise error(engine, found, supported, switch)
    return found


def auto_backend(device: Any = None, *, backend: str | None = None, platform: Any = None) -> tuple[str, str]:
    """(backend name, platform description) that a builder on ``device`` would get, found without
    creating a CUDA context (the probe asks NVML first) and without building anything."""
    from ..platform import probe_platform
    from ..selection import select_backend

    plat = platform if platform is not None else probe_platform(device)
    return select_backend(backend, plat).name, plat.describe()


def announce(
    logger: logging.Logger, engine: str, engine_version: str, what: str, backend: str, platform: str, detail: str = ""
) -> str:
    """Log the plugin's one line (INFO) and return it; ``detail`` ends the line when given."""
    from .. import __version__

    line = f"swa_hal {__version__}: {engine} {engine_version} {what} through swa_hal backend {backend!r} ({platform})"
    if detail:
        line += f"; {detail}"
    logger.info(line)
    return line


class InstallOnce:
    """Runs an install function at most once per process, however often the engine's loader calls
    the entry point (SGLang calls it in every process; tests call it again on purpose)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._result: Any = None
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def __call__(self, install: Callable[[], T]) -> T:
        with self._lock:
            if not self._done:
                self._result = install()
                self._done = True
            return self._result

    def reset(self) -> None:
        """For tests: forget that the install ran (it does not undo it)."""
        with self._lock:
            self._done = False
            self._result = None
