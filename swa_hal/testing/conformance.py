"""The whole conformance kit in one class: every topic of ``swa_hal.testing``.

    # tests/test_acme_conformance.py of a plugin package
    from swa_hal.testing import BackendConformance

    class TestAcme(BackendConformance):
        backend_name = "acme"
        opt_out = {"draft_update_matches_a_fresh_build": "Acme graphs cannot update in place yet"}

Run it with ``pytest -p swa_hal.testing.plugin`` (add ``--swa-hal-interpret`` to run Triton kernels on a CPU).
Outputs are compared with ``swa_hal.reference`` bit for bit on the worked vectors (docs/semantics.md), on
random batches of every kind and on the guarded output of malformed ones, on the backend's own device, or on
the CPU through the Triton interpreter when the backend says its kernels are Triton. Tests that check a claim (``clamps_addresses``, ``cuda_graphs``,
in-place draft updates) are collected only for backends that make it; ``opt_out`` turns off any test by
name, with the reason shown in the report.

A backend that only some topics apply to combines those mixins with ``BackendFixtures`` instead
(``swa_hal.testing.fixtures`` shows how).
"""

from __future__ import annotations

from .address_rules import AddressRuleTests
from .draft_updates import DraftUpdateTests
from .fixtures import CONFORMANCE_CONFIGS, PLATFORM_GRID, BackendFixtures, Target, requires
from .graphs import GraphTests
from .groups import GroupBuildTests
from .guarded import GuardedOutputTests
from .host_sync import HostSyncTests
from .plain_model import PlainModelTests
from .random_batches import RandomBatchTests
from .selection import SelectionTests
from .slot_rows import SlotRowTests
from .vectors import VectorTests

__all__ = [
    "CONFORMANCE_CONFIGS",
    "PLATFORM_GRID",
    "AddressRuleTests",
    "BackendConformance",
    "BackendFixtures",
    "DraftUpdateTests",
    "GraphTests",
    "GroupBuildTests",
    "GuardedOutputTests",
    "HostSyncTests",
    "PlainModelTests",
    "RandomBatchTests",
    "SelectionTests",
    "SlotRowTests",
    "Target",
    "VectorTests",
    "requires",
]


class BackendConformance(
    SelectionTests,
    VectorTests,
    RandomBatchTests,
    PlainModelTests,
    GroupBuildTests,
    DraftUpdateTests,
    AddressRuleTests,
    GraphTests,
    HostSyncTests,
    SlotRowTests,
    GuardedOutputTests,
):
    """Every topic of the kit. Set ``backend_name`` (or pass ``--swa-hal-backend``); optionally
    ``platform``, ``device``, ``batches_per_case``, ``opt_out``, ``configs`` (see ``BackendFixtures``)."""
