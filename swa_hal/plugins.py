"""Plugin loading that survives broken plugins, and the registry of backends they declare.

We walk the ``swa_hal.backends`` entry points ourselves instead of pluggy's
``load_setuptools_entrypoints``: there, one plugin that fails to import stops every other. Here a
plugin that fails to import, implements an unknown hook, raises while registering, or yields a
malformed spec is skipped with a warning naming its distribution and the error (``SWA_HAL_STRICT=1``
turns each of those into a PluginError). ``SWA_HAL_PLUGINS`` (allow list) and
``SWA_HAL_DISABLE_PLUGINS`` (block list) filter by entry-point name.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import logging
import os
import threading
import warnings
from typing import Any, Iterable, Mapping

import pluggy

from . import hookspecs
from .backend import Availability, BackendSpec
from .errors import PluginError
from .platform import PlatformInfo

ENTRY_POINT_GROUP = "swa_hal.backends"
BUILTIN_DIST = "swa-hal"
EMBEDDED_PLUGIN = "swa_hal_torch"
EMBEDDED_NAME = "torch"

log = logging.getLogger("swa_hal.plugins")


class PluginWarning(UserWarning):
    """A plugin problem the host survived."""


@dataclasses.dataclass
class PluginRecord:
    """One entry point (or programmatic registration) and what became of it.

    status: "active", "failed" (import or registration error), "blocked" (env lists),
    "conflict" (all its backends lost a name clash), "embedded" (the built-in fallback).
    """

    name: str
    target: str
    dist: str | None
    version: str | None
    status: str
    detail: str = ""
    backends: list[str] = dataclasses.field(default_factory=list)

    @property
    def builtin(self) -> bool:
        return _normalize(self.dist) == BUILTIN_DIST

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RegisteredBackend:
    spec: BackendSpec
    plugin: PluginRecord

    @property
    def name(self) -> str:
        return self.spec.name


def _normalize(dist: str | None) -> str | None:
    return None if dist is None else dist.lower().replace("_", "-").replace(".", "-")


def _env_list(env: Mapping[str, str], key: str) -> list[str] | None:
    raw = env.get(key)
    if raw is None or not raw.strip():
        return None
    return [item.strip() for item in raw.split(",") if item.strip()]


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _dist_of(ep: Any) -> tuple[str | None, str | None]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    name = getattr(dist, "name", None)
    if name is None:
        try:
            name = dist.metadata["Name"]
        except Exception:  # noqa: BLE001 - metadata of a broken install
            name = None
    return name, getattr(dist, "version", None)


class PluginRegistry:
    """Loads plugins and holds the backends they declare. Create one with ``get_registry()``, or
    directly (tests pass ``entry_points`` and ``env``)."""

    def __init__(
        self,
        entry_points: Iterable[Any] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        strict: bool | None = None,
        embedded_default: bool = True,
    ):
        self.env = dict(os.environ if env is None else env)
        self.strict = _truthy(self.env.get("SWA_HAL_STRICT")) if strict is None else strict
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: list[PluginRecord] = []
        self.backends: dict[str, RegisteredBackend] = {}
        self.problems: list[str] = []
        if entry_points is None:
            entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        self._load_entry_points(list(entry_points))
        if embedded_default:
            self._embed_default()

    # -- reporting -----------------------------------------------------------------------------

    def _problem(self, message: str, exc: BaseException | None = None) -> None:
        """A plugin misbehaved: warn and carry on, or raise in strict mode."""
        self.problems.append(message)
        if self.strict:
            raise PluginError(f"{message} (SWA_HAL_STRICT=1)") from exc
        warnings.warn(message, PluginWarning, stacklevel=3)
        log.warning(message)

    @staticmethod
    def _who(record: PluginRecord) -> str:
        dist = f"{record.dist} {record.version}" if record.dist else "no distribution"
        return f"plugin {record.name!r} ({dist})"

    # -- loading -------------------------------------------------------------------------------

    def _load_entry_points(self, eps: list[Any]) -> None:
        allow = _env_list(self.env, "SWA_HAL_PLUGINS")
        block = _env_list(self.env, "SWA_HAL_DISABLE_PLUGINS") or []
        names = {ep.name for ep in eps}
        for var, listed in (("SWA_HAL_PLUGINS", allow or []), ("SWA_HAL_DISABLE_PLUGINS", block)):
            for item in listed:
                if item not in names and not (item == EMBEDDED_NAME):
                    self._problem(
                        f"{var} names {item!r}, which no installed plugin provides "
                        f"(installed: {', '.join(sorted(names)) or 'none'})"
                    )
        self._allow, self._block = allow, block
        # Built-ins first: when a third party reuses a built-in name, the built-in keeps it.
        ordered = sorted(eps, key=lambda ep: (_normalize(_dist_of(ep)[0]) != BUILTIN_DIST, ep.name))
        for ep in ordered:
            dist, version = _dist_of(ep)
            record = PluginRecord(ep.name, getattr(ep, "value", "?"), dist, version, "active")
            self.plugins.append(record)
            if ep.name in block:
                record.status, record.detail = "blocked", "listed in SWA_HAL_DISABLE_PLUGINS"
                continue
            if allow is not None and ep.name not in allow:
                record.status, record.detail = "blocked", "not listed in SWA_HAL_PLUGINS"
                continue
            try:
                obj = ep.load()
            except Exception as exc:  # noqa: BLE001 - any import failure must not take the host down
                record.status, record.detail = "failed", f"import failed: {type(exc).__name__}: {exc}"
                self._problem(f"{self._who(record)} failed to load and was skipped: {type(exc).__name__}: {exc}", exc)
                continue
            self._register(obj, record)

    def _embed_default(self) -> None:
        """The reference backend is always there unless the env lists exclude it."""
        if EMBEDDED_NAME in self.backends:
            return
        if EMBEDDED_NAME in (self._block or []) or (self._allow is not None and EMBEDDED_NAME not in self._allow):
            return
        try:
            module = importlib.import_module(EMBEDDED_PLUGIN)
        except ImportError:
            from . import reference_backend as module  # running from a source tree without install
        try:
            version = importlib.metadata.version(BUILTIN_DIST)
        except importlib.metadata.PackageNotFoundError:
            version = None
        record = PluginRecord(EMBEDDED_NAME, module.__name__, BUILTIN_DIST, version, "embedded",
                              "registered directly (no entry point found)")
        self.plugins.append(record)
        self._register(module, record)

    def register_plugin(self, obj: Any, name: str, *, dist: str | None = None, version: str | None = None) -> PluginRecord:
        """Register a plugin object by hand (tests, the conformance kit, embedding applications)."""
        record = PluginRecord(name, repr(obj), dist, version, "active")
        self.plugins.append(record)
        self._register(obj, record)
        return record

    def unregister_plugin(self, name: str) -> None:
        for record in [p for p in self.plugins if p.name == name]:
            self.plugins.remove(record)
            for backend in record.backends:
                if backend in self.backends and self.backends[backend].plugin is record:
                    del self.backends[backend]
        plugin = self.pm.get_plugin(name)
        if plugin is not None:
            self.pm.unregister(plugin)

    def _register(self, obj: Any, record: PluginRecord) -> None:
        try:
            self.pm.register(obj, name=record.name)
        except Exception as exc:  # noqa: BLE001 - pluggy validation errors, duplicate names
            record.status, record.detail = "failed", f"registration failed: {type(exc).__name__}: {exc}"
            self._problem(f"{self._who(record)} could not be registered: {type(exc).__name__}: {exc}", exc)
            return
        unknown = [hc.name for hc in self.pm.get_hookcallers(obj) or [] if not hc.has_spec()]
        for hook in unknown:
            self._problem(f"{self._who(record)} implements unknown hook {hook!r}; it is ignored "
                          f"(known hooks: swa_hal_register_backends)")
        impls = [i for i in self.pm.hook.swa_hal_register_backends.get_hookimpls() if i.plugin is obj]
        if not impls:
            record.detail = record.detail or "declares no backends"
        clashes: list[str] = []
        for impl in impls:
            try:
                specs = list(impl.function() or ())
            except Exception as exc:  # noqa: BLE001 - a raising hook must not take the host down
                record.status, record.detail = "failed", f"swa_hal_register_backends raised {type(exc).__name__}: {exc}"
                self._problem(f"{self._who(record)}: swa_hal_register_backends raised {type(exc).__name__}: {exc}", exc)
                continue
            for spec in specs:
                self._add_spec(spec, record, clashes)
        if record.status in ("active", "embedded") and clashes and not record.backends:
            record.status = "conflict"
            record.detail = "every backend it declares has a name already taken: " + ", ".join(clashes)

    def _add_spec(self, spec: Any, record: PluginRecord, clashes: list[str]) -> None:
        if not isinstance(spec, BackendSpec):
            self._problem(f"{self._who(record)} yielded {type(spec).__name__}, not a BackendSpec; skipped")
            return
        problems = spec.problems()
        if problems:
            self._problem(f"{self._who(record)} yielded a malformed BackendSpec: {'; '.join(problems)}; skipped")
            return
        existing = self.backends.get(spec.name)
        if existing is not None:
            # First come keeps the name, and built-ins load first, so a built-in always keeps its own.
            clashes.append(spec.name)
            self._problem(
                f"backend name {spec.name!r} is provided by both {self._who(existing.plugin)} and "
                f"{self._who(record)}; keeping the one from {existing.plugin.dist or existing.plugin.name}"
            )
            return
        self.backends[spec.name] = RegisteredBackend(spec, record)
        record.backends.append(spec.name)

    # -- queries -------------------------------------------------------------------------------

    def availability(self, name: str, platform: PlatformInfo) -> Availability:
        """Ask a backend whether it can run on ``platform``; a raising probe counts as unavailable."""
        rb = self.backends[name]
        try:
            result = rb.spec.is_available(platform)
        except Exception as exc:  # noqa: BLE001 - a probe must not take the host down
            self._problem(f"{self._who(rb.plugin)}: is_available of backend {name!r} raised "
                          f"{type(exc).__name__}: {exc}; treated as unavailable", exc)
            return Availability.no(f"availability probe raised {type(exc).__name__}: {exc}")
        if not isinstance(result, Availability):
            self._problem(f"{self._who(rb.plugin)}: is_available of backend {name!r} returned "
                          f"{type(result).__name__}, not Availability; treated as unavailable")
            return Availability.no(f"availability probe returned {type(result).__name__}, not Availability")
        return result


_default: PluginRegistry | None = None
_lock = threading.Lock()


def get_registry() -> PluginRegistry:
    """The process-wide registry, loaded on first use."""
    global _default
    with _lock:
        if _default is None:
            _default = PluginRegistry()
        return _default


def reset_registry() -> None:
    """Forget the process-wide registry (tests; after installing a plugin at run time)."""
    global _default
    with _lock:
        _default = None
