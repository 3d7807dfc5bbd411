"""XPU: the shared kernels as they are (they already pass ``other=`` to every masked load,
which XPU needs because masked lanes are otherwise undefined)."""

from swa_hal.triton_backend import TritonBackend


class XpuBackend(TritonBackend):
    name = "xpu"
