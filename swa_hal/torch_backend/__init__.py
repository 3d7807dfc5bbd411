"""The torch backend (``backend.py``), its guard (``guard.py``), its tuned row fills (``rows.py``) and its
builds of token-slot and ring rows (``slot_rows.py``) and request-window layouts (``request_window.py``): the
PyTorch wing beside the Triton one (``swa_hal/triton_backend.py`` and ``swa_hal/kernels/``)."""

from .backend import TORCH_SPEC, TorchBackend, swa_hal_register_backends

__all__ = ["TORCH_SPEC", "TorchBackend", "swa_hal_register_backends"]
