"""Built-in plugin: the pure-PyTorch backend (``torch``), registered by entry point."""

from swa_hal.torch_backend import swa_hal_register_backends

__all__ = ["swa_hal_register_backends"]
