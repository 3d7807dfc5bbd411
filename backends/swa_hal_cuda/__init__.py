"""Built-in plugin ``cuda``: NVIDIA Hopper (SM90) and Blackwell (SM100), Triton kernels and
FlashMLA tile-scheduler objects."""

from swa_hal import hookimpl
from swa_hal.specs import vendor_backend_spec

SPEC = vendor_backend_spec(
    "cuda",
    factory="swa_hal_cuda.backend:CudaBackend",
    priority=200,
    vendor="cuda",
    vendor_label="an NVIDIA CUDA device",
    capability_majors=(9, 10),
    platforms=("vendor=cuda,capability=9.0", "vendor=cuda,capability=10.0"),
    summary="Triton kernels + FlashMLA tile scheduler (SM90, SM100)",
    cuda_graphs=True,
)


@hookimpl
def swa_hal_register_backends():
    return [SPEC]
