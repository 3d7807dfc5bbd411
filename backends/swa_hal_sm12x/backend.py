"""SM12x with Triton 3.6 faults on out-of-bounds addresses even in masked-off lanes, so this
backend runs the shared kernels in their CLAMP variant."""

from swa_hal.triton_backend import TritonBackend


class Sm12xBackend(TritonBackend):
    name = "sm12x"
    CLAMP_ADDRESSES = True
