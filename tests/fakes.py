"""Fake entry points and plugins for plugin-fault tests."""

from __future__ import annotations

import types

from swa_hal import Availability, BackendSpec, hookimpl


class FakeDist:
    def __init__(self, name: str, version: str = "1.0"):
        self.name = name
        self.version = version


class FakeEntryPoint:
    """Looks like importlib.metadata.EntryPoint: name, value, dist, load()."""

    def __init__(self, name, obj=None, *, error=None, dist="acme-swa", version="1.0"):
        self.name = name
        self.value = f"{name}_plugin"
        self.group = "swa_hal.backends"
        self.dist = FakeDist(dist, version) if dist else None
        self._obj, self._error = obj, error

    def load(self):
        if self._error is not None:
            raise self._error
        return self._obj


def spec(name="acme", priority=300, vendor="acme", **kw):
    kw.setdefault("factory", "swa_hal.torch_backend:TorchBackend")
    return BackendSpec(
        name=name, priority=priority,
        is_available=kw.pop("is_available", lambda p: Availability.check([] if p.vendor == vendor else [f"needs {vendor}"])),
        vendors=(vendor,), platforms=(f"vendor={vendor}",), **kw,
    )


def with_hook(mod, hook):
    """``mod`` with ``hook`` as a hook implementation, under the hook function's own name."""
    setattr(mod, hook.__name__, hookimpl(hook))
    return mod


def plugin_module(*specs, name="acme_plugin"):
    def swa_hal_register_backends():
        return list(specs)

    return with_hook(types.ModuleType(name), swa_hal_register_backends)


def builtin_entry_points():
    """The real built-in entry points (the installed distribution's)."""
    import importlib.metadata

    return [ep for ep in importlib.metadata.entry_points(group="swa_hal.backends") if ep.dist and ep.dist.name == "swa-hal"]
