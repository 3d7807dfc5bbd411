"""The conformance kit and test helpers.

- ``BackendConformance`` (``swa_hal.testing.conformance``): every topic of the conformance kit in one class.
- ``BackendFixtures`` (``swa_hal.testing.fixtures``): the kit's overridable fixtures, and one mixin per
  topic: ``SelectionTests``, ``VectorTests``, ``RandomBatchTests``, ``DraftUpdateTests``,
  ``AddressRuleTests``, ``GraphTests``, ``HostSyncTests``, ``GroupBuildTests``, ``SlotRowTests``,
  ``GuardedOutputTests``, ``PlainModelTests`` (modules ``selection``, ``vectors``, ``random_batches``,
  ``draft_updates``, ``address_rules``, ``graphs``, ``host_sync``, ``groups``, ``slot_rows``, ``guarded``,
  ``plain_model``), so a backend takes the topics that apply.
- ``plain_differences`` (``swa_hal.testing.plain_model``): a build against the plain loop model, the oracle
  apart from every fast path.
- ``swa_hal.testing.plugin``: the opt-in pytest plugin (options and fixtures).
- ``swa_hal.testing.suite``: the whole kit for the backend named by ``--swa-hal-backend``, with no test file
  (``pytest -p swa_hal.testing.plugin --pyargs swa_hal.testing.suite --swa-hal-backend NAME``).
- ``address_strict`` (``swa_hal.testing.interpreter``): the SM12x address rule on a CPU.
- ``random_batch`` and ``compare_with_reference``: batches of every kind, and bit-exact comparison;
  ``other_groups``: the block tables and slot mappings of more KV-cache groups for a batch (``build_groups``).
- ``window_case`` (``swa_hal.testing.request_windows``): random DeepSeek-V4.1 steps for request-window layouts.

Names are imported lazily: importing ``swa_hal.testing`` loads neither pytest nor any module of the kit.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BackendConformance": "conformance",
    "BackendFixtures": "fixtures",
    "Target": "fixtures",
    "CONFORMANCE_CONFIGS": "fixtures",
    "requires": "fixtures",
    "SelectionTests": "selection",
    "VectorTests": "vectors",
    "RandomBatchTests": "random_batches",
    "PlainModelTests": "plain_model",
    "plain_differences": "plain_model",
    "DraftUpdateTests": "draft_updates",
    "AddressRuleTests": "address_rules",
    "GraphTests": "graphs",
    "GroupBuildTests": "groups",
    "other_groups": "groups",
    "SlotRowTests": "slot_rows",
    "GuardedOutputTests": "guarded",
    "HostSyncTests": "host_sync",
    "BuildWatch": "host_sync",
    "random_slot_rows": "slot_rows",
    "random_ring_rows": "slot_rows",
    "address_strict": "interpreter",
    "AddressViolation": "interpreter",
    "random_batch": "batches",
    "KINDS": "batches",
    "compare_with_reference": "compare",
    "check_graph_replay": "graphs",
    "window_case": "request_windows",
    "WindowCase": "request_windows",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
