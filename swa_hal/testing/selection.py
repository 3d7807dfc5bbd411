"""Conformance topic: the spec, availability and selection (no device needed)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from ..backend import Availability, BackendSpec
from ..builder import SWAMetadataBuilder
from ..platform import PlatformInfo
from ..plugins import PluginRegistry
from ..selection import select_backend
from .fixtures import CONFORMANCE_CONFIGS, PLATFORM_GRID, BackendFixtures


class SelectionTests(BackendFixtures):
    """The spec is well formed; availability answers a grid of platforms without raising, with reasons for
    every "no"; the backend is selected on its own platforms; probing does not initialise CUDA; the factory
    resolves."""

    def test_spec_is_well_formed(self, spec: BackendSpec, name: str) -> None:
        problems = spec.problems()
        assert not problems, f"the spec of backend {name!r} is malformed: {'; '.join(problems)}"
        assert spec.name == name, f"the suite tests backend {name!r} but the spec it found is named {spec.name!r}"
        assert spec.summary, "give the backend a one-line summary (shown by swa-hal info)"

    def test_availability_grid(self, spec: BackendSpec) -> None:
        for assume in PLATFORM_GRID + tuple(spec.platforms):
            result = spec.is_available(PlatformInfo.from_assume(assume))
            assert isinstance(result, Availability), f"is_available({assume!r}) returned {type(result).__name__}"
            if not result.ok:
                assert result.reasons and all(isinstance(r, str) and r for r in result.reasons), (
                    f"is_available({assume!r}) says unavailable without a reason for each no "
                    f"(reasons: {result.reasons!r}); give every failure a non-empty string"
                )

    def test_available_and_selected_on_its_own_platforms(self, spec: BackendSpec, registry: PluginRegistry) -> None:
        for assume in spec.platforms:
            platform = PlatformInfo.from_assume(assume)
            assert spec.is_available(platform).ok, f"{spec.name} is not available on its own platform {assume}"
            if spec.auto_select:
                picked = select_backend(platform=platform, registry=registry, env={}).name
                assert picked == spec.name, f"on {assume} auto-selection picks {picked!r}, not {spec.name!r}"

    def test_probing_does_not_initialise_cuda(self, spec: BackendSpec) -> None:
        if torch.cuda.is_initialized():
            pytest.skip("CUDA was initialised earlier in this process; this check runs in CPU-only sessions")
        for assume in PLATFORM_GRID:
            spec.is_available(PlatformInfo.from_assume(assume))
        assert not torch.cuda.is_initialized(), "is_available initialised CUDA"

    def test_factory_resolves(self, spec: BackendSpec, make_builder: Callable[..., SWAMetadataBuilder]) -> None:
        factory = spec.load_factory()
        assert callable(factory), f"factory {spec.factory!r} names {factory!r}, which is not callable"
        builder = make_builder(CONFORMANCE_CONFIGS["w4b4_mtp"])
        assert builder.backend_name == spec.name, (
            f"a builder that asked for backend {spec.name!r} runs backend {builder.backend_name!r} "
            f"(made by {spec.factory!r}); a backend is named after its spec"
        )
