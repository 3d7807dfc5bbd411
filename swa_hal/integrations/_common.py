"""What every engine plugin of swa_hal does the same way: the on/off switch, the engine version
check, installing once, and the one log line that says which swa_hal backend now serves the engine.

Nothing here imports an engine: a plugin module imports its engine itself, after ``enabled`` and
``require_version`` have agreed. (docs/engines-internals.md, "The two engines' conventions".)
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from ..envs import env_engine_mode, env_flag

T = TypeVar("T")


# Installs an engine plugin under an engine version it was not tested with (docs/engines.md #versions).
FORCE_SWITCH = "SWA_HAL_FORCE_ENGINE"


def supported_text(supported: Iterable[str]) -> str:
    """The supported versions as people write them: "==0.33.*" reads "0.33.x"."""
    out = []
    for item in supported:
        if item.startswith("==") and item.endswith(".*"):
            item = item[2:-2] + ".x"
        out.append(item)
    return ", ".join(out)


def _prerelease_note(found: str) -> str:
    """ " (a pre-release)" where ``found`` is a PEP 440 pre- or development release: the reason a version that
    starts like a supported one is not one."""
    from packaging.version import InvalidVersion, Version

    try:
        return " (a pre-release, which comes before the release it names)" if Version(found).is_prerelease else ""
    except InvalidVersion:
        return ""


class EngineVersionError(RuntimeError):
    """The engine installed is not a version an swa_hal plugin was built and tested against (raised where the
    plugin is used directly, or at the engine's start-up under ``SWA_HAL_STRICT=1``)."""

    def __init__(self, engine: str, found: str | None, supported: Iterable[str], switch: str | None = None):
        self.engine = engine
        self.found = found
        self.supported = tuple(supported)
        have = "is not installed" if found is None else f"{found} is installed{_prerelease_note(found)}"
        off = f"; set {switch}=0 to run {engine} without swa_hal" if switch else ""
        super().__init__(
            f"swa_hal's {engine} plugin supports {engine} {supported_text(self.supported)} only, and {engine} {have}: "
            f"its hooks patch those versions' internals{off}, or {FORCE_SWITCH}=1 to install it anyway (untested)"
        )


def enabled(switch: str, env: Mapping[str, str] | None = None) -> bool:
    """An integration is on unless its switch (``SWA_HAL_SGLANG``, ``SWA_HAL_VLLM``) is set to a false
    word (0, false, no, off; any case); ``shadow`` is on too. Any other value is an error, so a typo never
    silently flips the engine's attention metadata (``swa_hal.envs``)."""
    return env_engine_mode(switch, env) != "off"


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed. Asks the package
    metadata only: the engine itself is not imported."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_supported(found: str, supported: Iterable[str]) -> bool:
    """Whether ``found`` is one of ``supported``, by PEP 440's rules (``packaging.version``), never by string:

    * a version ("0.5.23") stands for that release's builds: the release itself however written
      ("0.5.23.0"), its post-releases ("0.5.23.post1") and local builds ("0.5.23+cu129"); a pre-release or
      development release of it ("0.5.23rc1", "0.5.23.dev0") comes before it and is not it;
    * a specifier set (">=0.33,<0.34", "==0.33.*") holds what PEP 440 says it holds, pre-releases and
      development releases excluded unless the specifier names one (passed explicitly: packaging's own
      default for a version already installed changed between its releases).

    A version that is not PEP 440 (a source build's "unknown") is no supported version."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        version = Version(found)
    except InvalidVersion:
        return False
    for item in supported:
        try:
            if item[:1] in "<>=!~":
                spec = SpecifierSet(item)
                if spec.contains(version, prereleases=any(Version(s.version.rstrip(".*")).is_prerelease for s in spec)):
                    return True
                continue
            wanted = Version(item)
        except (InvalidSpecifier, InvalidVersion):
            continue
        if wanted.is_prerelease or wanted.is_postrelease:  # a named pre- or post-release: that one, any local build
            if Version(version.public) == wanted:
                return True
        elif not version.is_prerelease and Version(version.base_version) == wanted:
            return True
    return False


def require_version(
    engine: str,
    distribution: str,
    supported: Iterable[str],
    *,
    switch: str | None = None,
    error: type[EngineVersionError] = EngineVersionError,
    found: str | None = None,
) -> str:
    """The engine's installed version (or ``found``) when ``version_supported`` or forced
    (``SWA_HAL_FORCE_ENGINE=1``); ``error`` (an EngineVersionError) naming what was found otherwise, "not
    installed" included. For direct use of a plugin's parts; an engine's start-up goes through ``gate_mode``."""
    supported = tuple(supported)
    if found is None:
        found = installed_version(distribution)
    if found is None or not (version_supported(found, supported) or env_flag(FORCE_SWITCH)):
        raise error(engine, found, supported, switch)
    return found


_warned: set[tuple[str, str]] = set()


def gate_mode(
    logger: logging.Logger,
    engine: str,
    distribution: str,
    supported: Iterable[str],
    *,
    switch: str,
    error: type[EngineVersionError] = EngineVersionError,
    found: str | None = None,
) -> tuple[str, str | None]:
    """At the engine's start-up: (mode, the engine's version) for the plugin (docs/engines.md
    #releases-outside-the-tested-set). ``off``: install nothing (the switch says so, or the engine is not
    installed); ``serve``: swa_hal serves the engine; ``shadow``: the engine serves and swa_hal builds beside it
    and compares (``swa_hal.integrations.shadow``).

    On a tested release the switch decides (unset or a true word: ``serve``). On any other release, pre and
    development releases of a tested one included, the plugin shadows (a warning says so once per process,
    with how to promote or refuse), unless the switch is off; ``SWA_HAL_FORCE_ENGINE=1`` serves it (untested,
    with a warning) and ``SWA_HAL_STRICT=1`` raises ``error`` instead. A plugin never stops an engine from
    starting otherwise."""
    asked = env_engine_mode(switch)
    if asked == "off":
        return "off", None
    supported = tuple(supported)
    if found is None:
        found = installed_version(distribution)
    if found is not None and version_supported(found, supported):
        return asked or "serve", found
    if env_flag("SWA_HAL_STRICT"):
        raise error(engine, found, supported, switch)
    if found is None:
        return "off", None
    have = f"{found} is installed{_prerelease_note(found)}"
    if env_flag(FORCE_SWITCH):
        logger.warning(
            "swa_hal: %s %s; the plugin supports %s %s and serves it anyway (%s=1, untested)",
            engine,
            have,
            engine,
            supported_text(supported),
            FORCE_SWITCH,
        )
        return "serve", found
    if (engine, found) not in _warned:
        _warned.add((engine, found))
        logger.warning(
            "swa_hal: %s %s, and swa_hal's %s plugin was tested with %s %s only: %s serves with its own code and "
            "swa_hal builds beside it and compares (shadow mode; SWA_HAL_SHADOW_PROMOTE=1 lets swa_hal serve after "
            "SWA_HAL_SHADOW_STEPS equal calls, %s=1 serves at once, untested; %s=0 turns the plugin off; "
            "SWA_HAL_STRICT=1 refuses to start instead)",
            engine,
            have,
            engine,
            engine,
            supported_text(supported),
            engine,
            FORCE_SWITCH,
            switch,
        )
    return "shadow", found


def auto_backend(device: Any = None, *, backend: str | None = None, platform: Any = None) -> tuple[str, str]:
    """(backend name, platform description) that a builder on ``device`` would get, found without
    creating a CUDA context (the probe asks NVML first) and without building anything."""
    from ..platform import probe_platform
    from ..selection import select_backend

    plat = platform if platform is not None else probe_platform(device)
    return select_backend(backend, plat).name, plat.describe()


def announce(
    logger: logging.Logger,
    engine: str,
    engine_version: str,
    what: str,
    backend: str,
    platform: str,
    detail: str = "",
    *,
    level: int = logging.INFO,
) -> str:
    """Log the plugin's one line (INFO, or ``level``) and return it; ``detail`` ends the line when given."""
    from .. import __version__

    line = f"swa_hal {__version__}: {engine} {engine_version} {what} through swa_hal backend {backend!r} ({platform})"
    if detail:
        line += f"; {detail}"
    logger.log(level, line)
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


@contextlib.contextmanager
def kept_log(logger: logging.Logger, lines: list[str]) -> Iterator[None]:
    """``logger``'s records at INFO and above, kept in ``lines`` (``LEVEL message``) and not passed on, for the
    block: what a plugin report shows of a plugin's start-up (its engine's log handlers are not set up then)."""

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{record.levelname} {record.getMessage()}")

    keep, level, propagate = Keep(logging.DEBUG), logger.level, logger.propagate
    logger.addHandler(keep)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(keep)
        logger.setLevel(level)
        logger.propagate = propagate
