"""The torch backend (``backend.py``), its guard (``guard.py``) and its tuned row fills (``rows.py``): the
PyTorch wing beside the Triton one (``swa_hal/triton_backend.py`` and ``swa_hal/kernels/``)."""

from .backend import TORCH_SPEC, TorchBackend, swa_hal_register_backends

__all__ = ["TORCH_SPEC", "TorchBackend", "swa_hal_register_backends"]
