"""The one cache of the host fast path: objects a build would otherwise make again on every step.

A build hands out views of the builder's fixed buffers and derives a few objects from the engine's
tensors (a numpy view of a host copy, a tail view, each KV-cache group's view of a stacked input).
Engines hand in the same persistent buffers step after step, and making a view costs more host time
than finding it, so these are kept here:

* by shape, for views of the builder's own buffers (the key says which view of which shape);
* by identity, for objects derived from an engine tensor: ``tensor_key`` is its address, shape,
  strides, dtype and device, and the kept object holds the tensor's memory alive, so an equal key
  always means the same memory seen the same way.

One bound for everything (past ``limit`` entries the cache starts over) and one switch:
``SWA_HAL_CACHE=0`` keeps nothing, so every build makes everything anew (a test runs the build
paths both ways and compares).
"""

from __future__ import annotations

from typing import Any

import torch

from . import envs

LIMIT = 4096


def tensor_key(t: torch.Tensor) -> tuple[Any, ...]:
    """Identity of a tensor as a kernel or a view sees it: address, shape, strides, dtype, device
    (its index: with the address it names the memory, a process driving one kind of accelerator)."""
    return (t.data_ptr(), t.shape, t.stride(), t.dtype, t.get_device())


class HostCache(dict):
    """A bounded dict: look up with ``get`` (a plain dict lookup, the hot path), store with ``keep``.
    Disabled (``SWA_HAL_CACHE=0`` when it was made, or ``enabled=False``), ``keep`` stores nothing."""

    def __init__(self, limit: int = LIMIT, enabled: bool | None = None):
        super().__init__()
        self.limit = limit
        self.enabled = envs.env_switch("SWA_HAL_CACHE") if enabled is None else enabled

    def keep(self, key: Any, value: Any) -> Any:
        """Store ``value`` under ``key`` (unless disabled) and return it."""
        if self.enabled:
            if len(self) >= self.limit:  # many shapes over a long run: start over
                self.clear()
            self[key] = value
        return value

    def head(self, t: torch.Tensor, n: int) -> torch.Tensor:
        """``t[:n]`` of a per-request input longer than the step's ``n`` requests (an engine's persistent
        buffer), kept by the tensor's identity."""
        key = ("head", n, tensor_key(t))
        head = self.get(key)
        return head if head is not None else self.keep(key, t[:n])
