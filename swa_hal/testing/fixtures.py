"""The conformance kit's base: the fixtures every topic uses, each one overridable.

A backend's suite combines this base (or a subclass of it that overrides fixtures) with the topics that
apply to it, one mixin per module of ``swa_hal.testing``::

    from swa_hal.testing.fixtures import BackendFixtures
    from swa_hal.testing.random_batches import RandomBatchTests
    from swa_hal.testing.selection import SelectionTests
    from swa_hal.testing.vectors import VectorTests


    class AcmeFixtures(BackendFixtures):
        backend_name = "acme"

        @pytest.fixture
        def target(self, spec):
            return Target(PlatformInfo.from_assume("vendor=acme"), torch.device("acme"))


    class TestAcme(SelectionTests, VectorTests, RandomBatchTests, AcmeFixtures):
        pass

``BackendConformance`` (``swa_hal.testing.conformance``) combines every topic.

Class attributes: ``backend_name`` (or ``--swa-hal-backend``), ``platform`` (the ``--assume`` string the
outputs are computed on; default: the spec's first platform), ``device``, ``batches_per_case``, ``opt_out``
(test name without ``test_`` -> reason; shown as a skip), ``configs`` and ``draft_update_configs``.

Fixtures: ``registry``, ``name`` (the backend name), ``spec``, ``target`` (platform and device),
``make_builder(config, **kw)`` and ``make_batch(config, rng, kind, **kw)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple

import pytest
import torch

from ..backend import BackendSpec
from ..batch import AttentionBatch
from ..builder import SWAMetadataBuilder
from ..config import SWAConfig
from ..envs import env_flag
from ..platform import PlatformInfo
from ..plugins import PluginRegistry, get_registry
from .batches import KINDS, random_batch

# Platforms every backend is asked about: it must answer each without raising.
PLATFORM_GRID = (
    "vendor=cpu",
    "vendor=cuda,capability=7.0",
    "vendor=cuda,capability=8.0",
    "vendor=cuda,capability=9.0",
    "vendor=cuda,capability=10.0",
    "vendor=cuda,capability=12.0",
    "vendor=cuda,capability=12.1",
    "vendor=cuda,capability=9.0,triton=0",
    "vendor=rocm,arch=gfx942,capability=9.4",
    "vendor=rocm,arch=gfx950,capability=9.5",
    "vendor=xpu",
    "vendor=tpu",
)


def swa_config(
    window_size: int, block_size: int, max_model_len: int, max_num_batched_tokens: int, max_num_seqs: int, **kw: Any
) -> SWAConfig:
    """A config from its geometry and capacity, positionally (a table of configs reads as one row each), and
    any other field by keyword."""
    return SWAConfig(
        window_size=window_size,
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        **kw,
    )


# The config fields of one MTP draft token.
MTP1 = dict(num_speculative_tokens=1, speculative_method="mtp")

# Each row: window, block, max_model_len, max_num_batched_tokens, max_num_seqs, then the other fields.
CONFORMANCE_CONFIGS: dict[str, SWAConfig] = {
    # The worked-vector geometry (docs/semantics.md) with one MTP draft token.
    "w4b4_mtp": swa_config(4, 4, 512, 96, 12, compress_ratios=(0, 4, 128), **MTP1),
    # A window that is not a power of two, one-token pages.
    "w5b1": swa_config(5, 1, 160, 64, 9),
    # The smallest window.
    "w1b16": swa_config(1, 16, 256, 48, 6),
    # Parallel drafting: decode queries up to 1 + 2 * 2 tokens.
    "w12b8_parallel": swa_config(
        12, 8, 512, 128, 16, num_speculative_tokens=2, parallel_drafting=True, speculative_method="mtp"
    ),
    # DeepSeek-V4 rows (W=128, B=64) at a small capacity.
    "v4": swa_config(128, 64, 65536, 512, 24, compress_ratios=(0, 0, 4, 128)),
    # DSpark: non-causal draft rows (W=7 + 5 drafts -> 64 wide).
    "w7b3_dspark": swa_config(7, 3, 300, 96, 10, num_speculative_tokens=5, speculative_method="dspark"),
    # The vision variant: image spans widen prefill rows to W + M = 6 + 5 (docs/semantics.md #vision-spans).
    "w6b4_vision": swa_config(6, 4, 256, 96, 10, max_image_tokens=5, **MTP1),
    # DeepSeek-V4.1 layer types (compress ratios 0, 1, 2: swaonly, c1a, c2a).
    "v41": swa_config(128, 64, 65536, 256, 16, model_version="deepseek_v41", compress_ratios=(0, 1, 2)),
    # DSpark at DeepSeek-V4 size: 128 + 7 drafts -> 192 wide.
    "v4_dspark": swa_config(128, 64, 65536, 256, 16, num_speculative_tokens=7, speculative_method="dspark"),
}


def cases(configs: Mapping[str, SWAConfig]) -> list[Any]:
    """``(config name, batch kind)`` for every config and every batch kind it allows."""
    return [
        pytest.param(name, kind, id=f"{name}-{kind}")
        for name, cfg in configs.items()
        for kind in KINDS
        if kind != "dspark" or cfg.is_dspark
    ]


def expect_equal(got: Any, want: Any, what: str) -> None:
    """Fail with ``what``, the value the backend gave and the one it should have given, unless they are equal."""
    if got != want:
        pytest.fail(f"{what}: the backend gives\n  {got}\nbut the reference is\n  {want}", pytrace=False)


def requires(claim: str) -> pytest.MarkDecorator:
    """Collect the test only for backends that make ``claim`` (deselected otherwise)."""
    return pytest.mark.swa_hal_requires(claim)


# The types of the ``make_builder`` and ``make_batch`` fixtures.
MakeBuilder = Callable[..., SWAMetadataBuilder]
MakeBatch = Callable[..., AttentionBatch]


class Target(NamedTuple):
    """Where a suite computes outputs: a platform (None: probe the device) and a torch device."""

    platform: PlatformInfo | None
    device: torch.device


class BackendFixtures:
    """The overridable base of a backend's conformance suite (see the module docstring)."""

    backend_name: ClassVar[str | None] = None
    platform: ClassVar[str | None] = None
    device: ClassVar[str | None] = None
    batches_per_case: ClassVar[int] = 2
    opt_out: ClassVar[dict[str, str]] = {}
    configs: ClassVar[Mapping[str, SWAConfig]] = CONFORMANCE_CONFIGS
    # Configs (names in ``configs``) the draft-update topic steps through.
    draft_update_configs: ClassVar[tuple[str, ...]] = ("w4b4_mtp", "w12b8_parallel", "v4")

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrize from this class's ``configs`` (collection time, so not through a fixture):
        ``config_name, kind`` over every config and batch kind it allows, ``draft_config`` over
        ``draft_update_configs``."""
        if "kind" in metafunc.fixturenames:
            metafunc.parametrize("config_name, kind", cases(self.configs))
        if "draft_config" in metafunc.fixturenames:
            metafunc.parametrize("draft_config", [n for n in self.draft_update_configs if n in self.configs])

    @pytest.fixture(autouse=True)
    def _opt_out(self, request: pytest.FixtureRequest) -> None:
        test = request.node.originalname.removeprefix("test_")
        if test in self.opt_out:
            pytest.skip(f"opted out: {self.opt_out[test]}")

    @pytest.fixture
    def registry(self) -> PluginRegistry:
        return get_registry()

    @pytest.fixture
    def name(self, request: pytest.FixtureRequest) -> str:
        name = self.backend_name or request.config.getoption("swa_hal_backend", None)
        if not name:
            pytest.fail("set backend_name on the conformance class or pass --swa-hal-backend NAME")
        return str(name)

    @pytest.fixture
    def spec(self, registry: PluginRegistry, name: str) -> BackendSpec:
        if name not in registry.backends:
            pytest.fail(
                f"backend {name!r} is not registered (registered: {', '.join(sorted(registry.backends))}); "
                f"plugin problems: {registry.problems}"
            )
        return registry.backends[name].spec

    @pytest.fixture
    def target(self, spec: BackendSpec) -> Target:
        """The platform and device the outputs are computed on: ``device`` if set, else the backend's own
        device when this machine has one (a CUDA device for vendors ``cuda`` and ``rocm``, an XPU for ``xpu``),
        else the CPU (Triton kernels through the interpreter)."""
        xpu = getattr(torch, "xpu", None)
        rocm = getattr(torch.version, "hip", None) is not None
        if self.device is not None:
            device = torch.device(self.device)
        elif ("rocm" if rocm else "cuda") in spec.vendors and torch.cuda.is_available():
            device = torch.device("cuda")  # torch's "cuda" device is the ROCm GPU on a ROCm build
        elif "xpu" in spec.vendors and xpu is not None and xpu.is_available():
            device = torch.device("xpu")
        else:
            device = torch.device("cpu")
        if device.type != "cpu":
            return Target(None, device)  # probe the real device
        if spec.kernels == "triton" and not env_flag("TRITON_INTERPRET"):
            pytest.fail(
                f"backend {spec.name!r} runs Triton kernels, and on a CPU they need the Triton interpreter: "
                "pass --swa-hal-interpret (or set TRITON_INTERPRET=1 before triton is imported)"
            )
        assume = self.platform or (spec.platforms[0] if spec.platforms else None)
        return Target(PlatformInfo.from_assume(assume) if assume else None, device)

    @pytest.fixture
    def make_builder(
        self, spec: BackendSpec, registry: PluginRegistry, target: Target
    ) -> Callable[..., SWAMetadataBuilder]:
        """``make_builder(config, **kw)``: a builder of this backend on the target."""

        def make(config: SWAConfig, **kw: Any) -> SWAMetadataBuilder:
            return SWAMetadataBuilder(
                config, device=target.device, backend=spec.name, platform=target.platform, registry=registry, **kw
            )

        return make

    @pytest.fixture
    def make_batch(self, target: Target) -> Callable[..., AttentionBatch]:
        """``make_batch(config, rng, kind, **kw)``: a random valid batch of ``kind`` on the target device,
        image spans where swa_hal departs from the engines included (``random_batch(..., departures=True)``)."""

        def make(config: SWAConfig, rng: Any, kind: str, **kw: Any) -> AttentionBatch:
            kw.setdefault("device", str(target.device))
            kw.setdefault("departures", True)
            return random_batch(config, rng, kind, **kw)

        return make
