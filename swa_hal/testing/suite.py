"""The whole conformance kit for any installed backend, named on the command line: no test file to write.

    pytest -p swa_hal.testing.plugin --pyargs swa_hal.testing.suite --swa-hal-backend NAME [--swa-hal-interpret]

This is what a CI job of the per-platform matrix runs for its row's backend (``swa-hal matrix``). It is never
collected on its own: pytest collects it only when it is named, as above.
"""

from __future__ import annotations

from .conformance import BackendConformance


class TestInstalledBackend(BackendConformance):
    """Every topic of the kit for the backend given by ``--swa-hal-backend``."""
