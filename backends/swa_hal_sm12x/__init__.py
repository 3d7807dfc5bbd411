"""Built-in plugin ``sm12x``: NVIDIA SM120/SM121 (RTX Blackwell, GB10), Triton kernels whose every
lane address is clamped in bounds, masked or not; no FlashMLA scheduler."""

from swa_hal import Availability, BackendSpec, hookimpl
from swa_hal.backend import require


def is_available(platform) -> Availability:
    return require(platform, vendor="cuda", vendor_label="an NVIDIA CUDA device", capability_majors=(12,), triton=True)


SPEC = BackendSpec(
    name="sm12x",
    priority=200,
    factory="swa_hal_sm12x.backend:Sm12xBackend",
    is_available=is_available,
    vendors=("cuda",),
    platforms=("vendor=cuda,capability=12.0", "vendor=cuda,capability=12.1"),
    summary="Triton kernels with every lane address clamped in bounds (SM120, SM121)",
    kernels="triton",
    clamps_addresses=True,
    cuda_graphs=True,
)


@hookimpl
def swa_hal_register_backends():
    return [SPEC]
