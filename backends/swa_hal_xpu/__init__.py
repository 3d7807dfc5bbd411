"""Built-in plugin ``xpu``: Intel GPUs through Triton's XPU backend; no scheduler."""

from swa_hal import Availability, BackendSpec, hookimpl
from swa_hal.backend import require


def is_available(platform) -> Availability:
    return require(platform, vendor="xpu", vendor_label="an Intel XPU device", triton=True)


SPEC = BackendSpec(
    name="xpu",
    priority=200,
    factory="swa_hal_xpu.backend:XpuBackend",
    is_available=is_available,
    vendors=("xpu",),
    platforms=("vendor=xpu",),
    summary="Triton kernels on Intel XPU (every masked load passes other=)",
    kernels="triton",
)


@hookimpl
def swa_hal_register_backends():
    return [SPEC]
