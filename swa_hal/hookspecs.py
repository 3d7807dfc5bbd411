"""The hooks a swa_hal plugin may implement (pluggy project name ``swa_hal``).

A plugin is a module (or object) named by an entry point in the ``swa_hal.backends`` group::

    [project.entry-points."swa_hal.backends"]
    acme = "swa_hal_acme"

whose functions are marked with ``swa_hal.hookimpl``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .backend import BackendSpec

PROJECT_NAME = "swa_hal"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def swa_hal_register_backends() -> Iterable[BackendSpec]:
    """Return (or yield) the backends this plugin provides, as ``BackendSpec`` values.

    Keep it cheap and side-effect free: import nothing heavy and touch no device. What the backend
    needs at run time goes behind ``BackendSpec.factory`` ("module:attr"), imported only when the
    backend is selected; when it can run goes into ``BackendSpec.is_available(platform)``.

    The host calls it once per plugin, right after registering it (a plugin whose hook raises is skipped
    on its own). ``swa_hal.specs.vendor_backend_spec`` builds the common shape; by hand::

        @swa_hal.hookimpl
        def swa_hal_register_backends():
            yield BackendSpec(
                name="acme", priority=300, factory="swa_hal_acme.backend:AcmeBackend",
                is_available=lambda p: Availability.check([] if p.vendor == "acme" else ["needs an Acme device"]),
                vendors=("acme",), platforms=("vendor=acme",),
            )
    """
