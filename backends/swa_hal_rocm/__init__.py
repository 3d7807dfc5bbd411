"""Built-in plugin ``rocm``: AMD GPUs through Triton's HIP backend, plus the ragged (CSR) decode
rows ROCm sparse-decode kernels consume; no FlashMLA scheduler."""

from swa_hal import Availability, BackendSpec, hookimpl
from swa_hal.backend import require


def is_available(platform) -> Availability:
    return require(platform, vendor="rocm", vendor_label="an AMD ROCm device", triton=True)


SPEC = BackendSpec(
    name="rocm",
    priority=200,
    factory="swa_hal_rocm.backend:RocmBackend",
    is_available=is_available,
    vendors=("rocm",),
    platforms=("vendor=rocm,arch=gfx942,capability=9.4", "vendor=rocm,arch=gfx950,capability=9.5"),
    summary="Triton kernels + ragged (CSR) decode rows for ROCm sparse decode",
    kernels="triton",
    cuda_graphs=True,
)


@hookimpl
def swa_hal_register_backends():
    return [SPEC]
