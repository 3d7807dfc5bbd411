"""swa_hal_example: a vendor-style swa_hal backend, installed as its own distribution.

It targets a made-up accelerator ("vendor=example"): outputs come from swa_hal's reference, then a
post-pass adds the ragged (CSR) decode rows this vendor's attention kernel reads. Registration is
one hook returning one BackendSpec; nothing heavy is imported until the backend is selected.
"""

from swa_hal import Availability, BackendSpec, hookimpl
from swa_hal.backend import require

__version__ = "0.1.0"


def is_available(platform) -> Availability:
    return require(platform, vendor="example", vendor_label="an Example accelerator")


SPEC = BackendSpec(
    name="example",
    priority=250,
    factory="swa_hal_example.backend:ExampleBackend",
    is_available=is_available,
    vendors=("example",),
    platforms=("vendor=example",),
    summary="reference outputs + a ragged (CSR) post-pass (out-of-tree example plugin)",
    kernels="torch",
)


@hookimpl
def swa_hal_register_backends():
    return [SPEC]
