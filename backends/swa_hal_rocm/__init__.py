"""Built-in plugin ``rocm``: AMD GPUs through Triton's HIP backend, plus the ragged (CSR) decode
rows ROCm sparse-decode kernels consume; no FlashMLA scheduler."""

from swa_hal import hookimpl
from swa_hal.specs import vendor_backend_spec

SPEC = vendor_backend_spec(
    "rocm",
    factory="swa_hal_rocm.backend:RocmBackend",
    priority=200,
    vendor="rocm",
    vendor_label="an AMD ROCm device",
    platforms=("vendor=rocm,arch=gfx942,capability=9.4", "vendor=rocm,arch=gfx950,capability=9.5"),
    summary="Triton kernels + ragged (CSR) decode rows for ROCm sparse decode",
    cuda_graphs=True,
)


@hookimpl
def swa_hal_register_backends():
    return [SPEC]
