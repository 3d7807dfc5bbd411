"""The CUDA backend: the shared Triton kernels plus FlashMLA scheduler objects (docs/semantics.md #layer-types-and-schedulers)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swa_hal.config import LAYER_TYPES
from swa_hal.schedulers import FreshSchedulers
from swa_hal.triton_backend import TritonBackend

from .flashmla import scheduler_factory

# FlashMLA's sparse decode (and so its tile scheduler) exists for these capability majors.
SCHEDULER_MAJORS = (9, 10)


class CudaBackend(TritonBackend):
    name = "cuda"

    def __init__(self, config, device, platform):
        super().__init__(config, device, platform)
        self._layer_types = config.layer_types
        cap = platform.capability
        if cap is None or cap[0] not in SCHEDULER_MAJORS:
            self._fresh_scheduler = None
            self.scheduler_problem = f"FlashMLA's scheduler needs SM90 or SM100; platform is {platform.describe()}"
        else:
            self._fresh_scheduler, self.scheduler_problem = scheduler_factory()

    def make_tile_schedulers(self, num_decode_tokens: int) -> Mapping[str, Any]:
        # A plan is valid only for the lens it was made from, so every build gets new objects, made
        # when a layer first asks for its type's (swa_hal/schedulers.py).
        if num_decode_tokens and self._fresh_scheduler is not None:
            return FreshSchedulers(self._fresh_scheduler, self._layer_types)
        return dict.fromkeys(LAYER_TYPES)

    def status(self) -> dict[str, str]:
        out = super().status()
        if self._fresh_scheduler is None:
            out["tile scheduler"] = f"none: {self.scheduler_problem}"
        else:
            out["tile scheduler"] = "FlashMLA, fresh per build for " + ", ".join(self._layer_types)
        return out
