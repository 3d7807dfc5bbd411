"""swa_hal_example: a vendor-style swa_hal backend, installed as its own distribution.

It targets a made-up accelerator ("vendor=example"): outputs come from swa_hal's torch backend, then a
post-pass adds the ragged (CSR) decode rows this vendor's attention kernel reads. Registration is
one hook returning one BackendSpec; nothing heavy is imported until the backend is selected.
"""

from swa_hal import hookimpl
from swa_hal.specs import vendor_backend_spec

__version__ = "0.1.0"

SPEC = vendor_backend_spec(
    "example",
    factory="swa_hal_example.backend:ExampleBackend",
    priority=250,
    vendor="example",
    vendor_label="an Example accelerator",
    platforms=("vendor=example",),
    summary="torch backend outputs + a ragged (CSR) post-pass (out-of-tree example plugin)",
    kernels="torch",
)


@hookimpl
def swa_hal_register_backends():
    return [SPEC]
