"""The common shape of a backend declaration, shared by the built-in plugins and open to third parties.

A plugin package declares its backend in a few lines::

    from swa_hal import hookimpl
    from swa_hal.specs import vendor_backend_spec

    SPEC = vendor_backend_spec(
        "acme", factory="swa_hal_acme.backend:AcmeBackend", priority=300,
        vendor="acme", vendor_label="an Acme accelerator", platforms=("vendor=acme",),
        summary="Triton kernels on Acme devices",
    )


    @hookimpl
    def swa_hal_register_backends():
        return [SPEC]
"""

from __future__ import annotations

import functools
from typing import Any

from .backend import BackendSpec, require


def vendor_backend_spec(
    name: str,
    *,
    factory: str,
    priority: int,
    vendor: str,
    vendor_label: str,
    platforms: tuple[str, ...],
    summary: str,
    capability_majors: tuple[int, ...] | None = None,
    kernels: str = "triton",
    **options: Any,
) -> BackendSpec:
    """A ``BackendSpec`` available on one vendor's devices (``platform.vendor == vendor``), optionally only
    on some capability majors; Triton kernels (the default) also need Triton. ``vendors`` is ``(vendor,)``;
    ``options`` are the remaining ``BackendSpec`` fields (``clamps_addresses``, ``cuda_graphs``, ...)."""
    is_available = functools.partial(
        require,
        vendor=vendor,
        vendor_label=vendor_label,
        capability_majors=capability_majors,
        triton=kernels == "triton",
    )
    return BackendSpec(
        name=name,
        priority=priority,
        factory=factory,
        is_available=is_available,
        vendors=(vendor,),
        platforms=platforms,
        summary=summary,
        kernels=kernels,
        **options,
    )
