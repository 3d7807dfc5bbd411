"""A stand-in for the few torchvision names SGLang 0.5.23's import chain of its DeepSeek-V4 attention backends
binds at import time, for ``make test-sglang``'s environment.

Why: the backend modules import ``sglang.srt.configs``, whose vision-model configs import
``torchvision.transforms`` (``InterpolationMode``, ``functional``) at module level. torchvision's wheels are built
against one torch release each, and the registry's torchvision does not import beside the CPU torch 2.13.0 that
environment runs, so the real package cannot be installed there. Nothing the tests drive (the attention
metadata) uses torchvision: the stand-in holds only the names bound at import, so any call into it fails with
an AttributeError instead of computing something.

``install()`` first lets transformers decide that torchvision is absent (its cached availability check), so
transformers never takes the stand-in for the real package.
"""

from __future__ import annotations

import enum
import importlib.machinery
import importlib.util
import sys
import types


class InterpolationMode(enum.Enum):
    """torchvision's interpolation modes, by the names SGLang's vision configs read as defaults."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def _module(name: str, **attrs: object) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    module.__path__ = []  # a package: its submodules resolve through sys.modules
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    sys.modules[name] = module
    return module


def install() -> bool:
    """Put the stand-in in ``sys.modules`` unless a real torchvision is importable; True if it did."""
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        return False
    from transformers.utils import import_utils

    assert not import_utils.is_torchvision_available()  # cached before the stand-in exists
    functional = _module("torchvision.transforms.functional", InterpolationMode=InterpolationMode)
    v2_functional = _module("torchvision.transforms.v2.functional")
    v2 = _module("torchvision.transforms.v2", functional=v2_functional)
    transforms = _module("torchvision.transforms", InterpolationMode=InterpolationMode, functional=functional, v2=v2)
    _module("torchvision", transforms=transforms)
    return True
