"""The built-in backends run the conformance kit against themselves: every Triton backend through
the interpreter on the CPU (SM12x address-strict), the torch backend natively."""

from swa_hal.testing import BackendConformance


class TestTorchBackend(BackendConformance):
    backend_name = "torch"


class TestCudaBackend(BackendConformance):
    backend_name = "cuda"


class TestSm12xBackend(BackendConformance):
    backend_name = "sm12x"


class TestRocmBackend(BackendConformance):
    backend_name = "rocm"


class TestXpuBackend(BackendConformance):
    backend_name = "xpu"
