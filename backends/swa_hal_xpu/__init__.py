"""Built-in plugin ``xpu``: Intel GPUs through Triton's XPU backend; no scheduler."""

from swa_hal import hookimpl
from swa_hal.specs import vendor_backend_spec

SPEC = vendor_backend_spec(
    "xpu",
    factory="swa_hal_xpu.backend:XpuBackend",
    priority=200,
    vendor="xpu",
    vendor_label="an Intel XPU device",
    platforms=("vendor=xpu",),
    summary="Triton kernels on Intel XPU (every masked load passes other=)",
)


@hookimpl
def swa_hal_register_backends():
    return [SPEC]
