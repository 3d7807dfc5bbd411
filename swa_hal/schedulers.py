"""The per-build mapping of layer types to fresh planner objects (docs/semantics.md #layer-types-and-schedulers).

A FlashMLA planner object plans on first use for the lens it sees, so every build hands out new ones.
An engine reads only the layer types its layers have (a KV-cache group often holds one type), so the
objects are made on first access: each build's mapping is new, each object is made at most once per
build, and a type no layer reads costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from .config import LAYER_TYPES


class FreshSchedulers(Mapping[str, Any]):
    """Every key of LAYER_TYPES: a new ``make()`` object for the model's ``layer_types``, made on first
    access in this build; None for the other types."""

    __slots__ = ("_make", "_types", "_made")

    def __init__(self, make: Callable[[], Any], layer_types: tuple[str, ...]):
        self._make = make
        self._types = layer_types
        self._made: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        made = self._made
        got = made.get(key)
        if got is not None:
            return got
        if key in self._types:
            got = made[key] = self._make()
            return got
        if key in LAYER_TYPES:
            return None
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return key in LAYER_TYPES  # without making the object

    def __iter__(self) -> Iterator[str]:
        return iter(LAYER_TYPES)

    def __len__(self) -> int:
        return len(LAYER_TYPES)

    def __repr__(self) -> str:
        made = ", ".join(self._made) or "none yet"
        return f"FreshSchedulers(types={list(self._types)}, made: {made})"


# What a builder made with ``tile_schedulers=False`` hands out: None for every type, one read-only mapping
# shared by all its builds (an engine that makes its own planner objects reads none of these).
NO_SCHEDULERS: Mapping[str, Any] = MappingProxyType(dict.fromkeys(LAYER_TYPES))


def no_schedulers(num_decode_tokens: int) -> Mapping[str, Any]:
    """``Backend.make_tile_schedulers``'s stand-in for a builder without planner objects."""
    return NO_SCHEDULERS
