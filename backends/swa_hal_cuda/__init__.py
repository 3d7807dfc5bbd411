"""Built-in plugin ``cuda``: NVIDIA Hopper (SM90) and Blackwell (SM100), Triton kernels and
FlashMLA tile-scheduler objects."""

from swa_hal import Availability, BackendSpec, hookimpl
from swa_hal.backend import require


def is_available(platform) -> Availability:
    return require(platform, vendor="cuda", vendor_label="an NVIDIA CUDA device", capability_majors=(9, 10), triton=True)


SPEC = BackendSpec(
    name="cuda",
    priority=200,
    factory="swa_hal_cuda.backend:CudaBackend",
    is_available=is_available,
    vendors=("cuda",),
    platforms=("vendor=cuda,capability=9.0", "vendor=cuda,capability=10.0"),
    summary="Triton kernels + FlashMLA tile scheduler (SM90, SM100)",
    kernels="triton",
    cuda_graphs=True,
)


@hookimpl
def swa_hal_register_backends():
    return [SPEC]
