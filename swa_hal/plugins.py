"""The registry of backends, declared by pluggy plugins.

pluggy does the plugin work: the hook specification (``hookspecs``) is added with ``add_hookspecs``,
each plugin is registered with ``PluginManager.register`` (which checks its hook signatures), unknown
hooks are found by ``check_pending``, ``SWA_HAL_DISABLE_PLUGINS`` names are blocked with
``set_blocked``, and ``swa_hal_register_backends`` is called through the plugin manager.

The registry adds what pluggy leaves to its host:

- isolation per distribution: a plugin that fails to import, raises while registering or in its hook
  (any exception, ``SystemExit`` included; only ``KeyboardInterrupt`` goes through), implements an
  unknown hook or yields a malformed spec is skipped with a warning naming its distribution;
- the allow list ``SWA_HAL_PLUGINS`` (only these entry-point names load);
- strict mode: ``SWA_HAL_STRICT=1`` turns each of those problems into a ``PluginError``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
import threading
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import pluggy

from . import hookspecs
from .backend import Availability, BackendSpec
from .envs import env_flag, env_list, warn_unknown
from .errors import PluginError
from .platform import PlatformInfo

ENTRY_POINT_GROUP = "swa_hal.backends"
BUILTIN_DIST = "swa-hal"
EMBEDDED_PLUGIN = "swa_hal_torch"
EMBEDDED_NAME = "torch"
REGISTER_HOOK = "swa_hal_register_backends"


class PluginWarning(UserWarning):
    """A plugin problem the host survived."""


@dataclasses.dataclass
class PluginRecord:
    """One entry point (or programmatic registration) and what became of it.

    status: "active", "failed" (import, registration or hook error), "blocked" (env lists),
    "conflict" (all its backends lost a name clash), "embedded" (the built-in fallback).
    """

    name: str
    target: str
    dist: str | None
    version: str | None
    status: str
    detail: str = ""
    backends: list[str] = dataclasses.field(default_factory=list)

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
    """The names an env list holds, or None when it is unset (an empty list still filters)."""
    return env_list(key, env) if env.get(key, "").strip() else None


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


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
        # Loaded once per process: the moment to say that a misspelt SWA_HAL_* variable is ignored.
        warn_unknown(self.env, stacklevel=3)
        self.strict = env_flag("SWA_HAL_STRICT", self.env) if strict is None else strict
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: list[PluginRecord] = []
        self.backends: dict[str, RegisteredBackend] = {}
        self.problems: list[str] = []
        if entry_points is None:
            entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        # The entry points are walked here rather than by pm.load_setuptools_entrypoints: there, the
        # first plugin that fails to import stops the loading of every other one.
        eps = list(entry_points)
        names = {ep.name for ep in eps}
        self._allow = self._listed("SWA_HAL_PLUGINS", names)
        for name in self._listed("SWA_HAL_DISABLE_PLUGINS", names) or ():
            self.pm.set_blocked(name)
        # Built-ins first: when a third party reuses a built-in name, the built-in keeps it.
        for ep in sorted(eps, key=lambda ep: (_normalize(_dist_of(ep)[0]) != BUILTIN_DIST, ep.name)):
            self._load(ep)
        if embedded_default:
            self._embed_default()

    # -- reporting -----------------------------------------------------------------------------

    def _problem(self, message: str, exc: BaseException | None = None) -> None:
        """A plugin misbehaved: warn and carry on, or raise in strict mode."""
        self.problems.append(message)
        if self.strict:
            raise PluginError(f"{message} (SWA_HAL_STRICT=1)") from exc
        # One mechanism: a PluginWarning (the CLI prints each one as one line, once).
        warnings.warn(message, PluginWarning, stacklevel=3)

    def _fail(self, record: PluginRecord, detail: str, message: str, exc: BaseException) -> None:
        record.status, record.detail = "failed", detail
        self._problem(f"{self._who(record)}{message}", exc)

    @staticmethod
    def _who(record: PluginRecord) -> str:
        dist = f"{record.dist} {record.version}" if record.dist else "no distribution"
        return f"plugin {record.name!r} ({dist})"

    # -- loading -------------------------------------------------------------------------------

    def _listed(self, var: str, installed: set[str]) -> list[str] | None:
        """The names in the env list ``var`` (None when unset); names no plugin provides are reported."""
        listed = _env_list(self.env, var)
        for item in listed or ():
            if item not in installed and item != EMBEDDED_NAME:
                self._problem(
                    f"{var} names {item!r}, which no installed plugin provides "
                    f"(installed: {', '.join(sorted(installed)) or 'none'})"
                )
        return listed

    def _excluded(self, name: str) -> str | None:
        """Why the env lists keep plugin ``name`` out, or None."""
        if self.pm.is_blocked(name):
            return "listed in SWA_HAL_DISABLE_PLUGINS"
        if self._allow is not None and name not in self._allow:
            return "not listed in SWA_HAL_PLUGINS"
        return None

    def _load(self, ep: Any) -> None:
        dist, version = _dist_of(ep)
        record = PluginRecord(ep.name, getattr(ep, "value", "?"), dist, version, "active")
        self.plugins.append(record)
        excluded = self._excluded(ep.name)
        if excluded:
            record.status, record.detail = "blocked", excluded
            return
        try:
            plugin = ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit included: one plugin's import must not end the host
            err = _error(exc)
            self._fail(record, f"import failed: {err}", f" failed to load and was skipped: {err}", exc)
            return
        self._register(plugin, record)

    def _embed_default(self) -> None:
        """The torch backend is always there unless the env lists exclude it."""
        if EMBEDDED_NAME in self.backends or self._excluded(EMBEDDED_NAME):
            return
        try:
            module = importlib.import_module(EMBEDDED_PLUGIN)
        except ImportError:  # running from a source tree that was never installed
            module = importlib.import_module(".torch_backend", __package__)
        try:
            version: str | None = importlib.metadata.version(BUILTIN_DIST)
        except importlib.metadata.PackageNotFoundError:
            version = None
        record = PluginRecord(
            EMBEDDED_NAME,
            module.__name__,
            BUILTIN_DIST,
            version,
            "embedded",
            "registered directly (no entry point found)",
        )
        self.plugins.append(record)
        self._register(module, record)

    def register_plugin(
        self, obj: Any, name: str, *, dist: str | None = None, version: str | None = None
    ) -> PluginRecord:
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

    def _register(self, plugin: Any, record: PluginRecord) -> None:
        try:
            registered = self.pm.register(plugin, name=record.name)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # pluggy's validation errors, a name or object registered twice
            err = _error(exc)
            self._fail(record, f"registration failed: {err}", f" could not be registered: {err}", exc)
            return
        if registered is None:
            record.status, record.detail = "blocked", "listed in SWA_HAL_DISABLE_PLUGINS"
            return
        self._check_hooks(record)
        specs = self._declared_specs(plugin, record)
        clashes: list[str] = []
        for spec in specs:
            self._add_spec(spec, record, clashes)
        if record.status in ("active", "embedded") and clashes and not record.backends:
            record.status = "conflict"
            record.detail = "every backend it declares has a name already taken: " + ", ".join(clashes)

    def _check_hooks(self, record: PluginRecord) -> None:
        """Report the hooks of the plugin just registered that no spec knows (a typo, another project's hook)."""
        while True:
            try:
                self.pm.check_pending()
                return
            except pluggy.PluginValidationError as exc:
                # check_pending stops at the first implementation without a spec, and would stop there again
                # for every later plugin. Every spec is added before any plugin, so an unknown hook never
                # becomes known: its caller is dropped once reported. The plugin's other hooks still count.
                callers = self.pm.get_hookcallers(exc.plugin) or []
                unknown = next(
                    hc.name
                    for hc in callers
                    if not hc.has_spec()
                    and any(i.plugin is exc.plugin and not i.optionalhook for i in hc.get_hookimpls())
                )
                delattr(self.pm.hook, unknown)
                known = sorted(
                    name for name, hc in vars(self.pm.hook).items() if not name.startswith("_") and hc.has_spec()
                )
                self._problem(
                    f"{self._who(record)} implements unknown hook {unknown!r}; it is ignored "
                    f"(known hooks: {', '.join(known)})",
                    exc,
                )

    def _declared_specs(self, plugin: Any, record: PluginRecord) -> list[Any]:
        """What the plugin's ``swa_hal_register_backends`` returns (or yields), called through pluggy."""
        # The hook is called for this plugin alone: pm.hook.swa_hal_register_backends() runs every plugin in
        # one call, and the first one to raise would cost every other plugin its backends.
        others = [p for p in self.pm.get_plugins() if p is not plugin]
        hook = self.pm.subset_hook_caller(REGISTER_HOOK, remove_plugins=others)
        if not hook.get_hookimpls():
            record.detail = record.detail or "declares no backends"
            return []
        try:
            return [spec for result in hook() for spec in (result or ())]
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a raising hook, SystemExit included, must not end the host
            err = _error(exc)
            self._fail(record, f"{REGISTER_HOOK} raised {err}", f": {REGISTER_HOOK} raised {err}", exc)
            return []

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
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit included: a probe must not end the host
            self._problem(
                f"{self._who(rb.plugin)}: is_available of backend {name!r} raised {_error(exc)}; treated as unavailable",
                exc,
            )
            return Availability.no(f"availability probe raised {_error(exc)}")
        if not isinstance(result, Availability):
            self._problem(
                f"{self._who(rb.plugin)}: is_available of backend {name!r} returned "
                f"{type(result).__name__}, not Availability; treated as unavailable"
            )
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
