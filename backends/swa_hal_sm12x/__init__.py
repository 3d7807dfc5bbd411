"""Built-in plugin ``sm12x``: NVIDIA SM120/SM121 (RTX Blackwell, GB10), Triton kernels whose every
lane address is clamped in bounds, masked or not; no FlashMLA scheduler."""

from swa_hal import hookimpl
from swa_hal.specs import vendor_backend_spec

SPEC = vendor_backend_spec(
    "sm12x",
    factory="swa_hal_sm12x.backend:Sm12xBackend",
    priority=200,
    vendor="cuda",
    vendor_label="an NVIDIA CUDA device",
    capability_majors=(12,),
    platforms=("vendor=cuda,capability=12.0", "vendor=cuda,capability=12.1"),
    summary="Triton kernels with every lane address clamped in bounds (SM120, SM121)",
    clamps_addresses=True,
    cuda_graphs=True,
)


@hookimpl
def swa_hal_register_backends():
    return [SPEC]
