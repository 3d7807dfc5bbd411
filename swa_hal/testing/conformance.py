"""The conformance kit: one base class every backend's test suite subclasses.

    # tests/test_acme_conformance.py of a plugin package
    from swa_hal.testing import BackendConformance

    class TestAcme(BackendConformance):
        backend_name = "acme"
        opt_out = {"draft_update": "Acme graphs cannot update in place yet"}

Run it with ``pytest -p swa_hal.testing.plugin``. Outputs are compared with ``swa_hal.reference`` bit for
bit on the worked vectors (docs/semantics.md) and on random batches of every kind, on the backend's own device, or on the CPU
through the Triton interpreter when the backend says its kernels are Triton. Tests that check a claim
(``clamps_addresses``, ``cuda_graphs``, in-place draft updates) are collected only for backends that make
it; ``opt_out`` turns off any test by name, with the reason shown in the report.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, ClassVar

import pytest
import torch

from ..backend import Availability, BackendSpec
from ..batch import AttentionBatch
from ..builder import SWAMetadataBuilder
from ..config import SWAConfig
from ..errors import BatchValidationError
from ..platform import PlatformInfo
from ..plugins import PluginRegistry, get_registry
from .batches import KINDS, random_batch
from .compare import compare_with_reference

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

CONFORMANCE_CONFIGS: dict[str, SWAConfig] = {
    # The worked-vector geometry (docs/semantics.md) with one MTP draft token.
    "w4b4_mtp": SWAConfig(window_size=4, block_size=4, compress_ratios=(0, 4, 128), max_model_len=512,
                          max_num_batched_tokens=96, max_num_seqs=12, num_speculative_tokens=1,
                          speculative_method="mtp"),
    # A window that is not a power of two, one-token pages.
    "w5b1": SWAConfig(window_size=5, block_size=1, max_model_len=160, max_num_batched_tokens=64, max_num_seqs=9),
    # The smallest window.
    "w1b16": SWAConfig(window_size=1, block_size=16, max_model_len=256, max_num_batched_tokens=48, max_num_seqs=6),
    # Parallel drafting: decode queries up to 1 + 2 * 2 tokens.
    "w12b8_parallel": SWAConfig(window_size=12, block_size=8, max_model_len=512, max_num_batched_tokens=128,
                                max_num_seqs=16, num_speculative_tokens=2, parallel_drafting=True,
                                speculative_method="mtp"),
    # DeepSeek-V4 rows (W=128, B=64) at a small capacity.
    "v4": SWAConfig(window_size=128, block_size=64, compress_ratios=(0, 0, 4, 128), max_model_len=65536,
                    max_num_batched_tokens=512, max_num_seqs=24),
    # DSpark: non-causal draft rows (W=7 + 5 drafts -> 64 wide).
    "w7b3_dspark": SWAConfig(window_size=7, block_size=3, max_model_len=300, max_num_batched_tokens=96,
                             max_num_seqs=10, num_speculative_tokens=5, speculative_method="dspark"),
    # DSpark at DeepSeek-V4 size: 128 + 7 drafts -> 192 wide.
    "v4_dspark": SWAConfig(window_size=128, block_size=64, max_model_len=65536, max_num_batched_tokens=256,
                           max_num_seqs=16, num_speculative_tokens=7, speculative_method="dspark"),
}


def _cases(configs: dict[str, SWAConfig]) -> list[Any]:
    return [
        pytest.param(name, kind, id=f"{name}-{kind}")
        for name, cfg in configs.items()
        for kind in KINDS
        if kind != "dspark" or cfg.is_dspark
    ]


def requires(claim: str):
    """Collect the test only for backends that make ``claim`` (deselected otherwise)."""
    return pytest.mark.swa_hal_requires(claim)


class BackendConformance:
    """Base class of a backend's conformance suite. Set ``backend_name`` (or pass
    ``--swa-hal-backend``); optionally ``platform`` (an ``--assume`` string the backend runs on; default:
    its spec's first platform), ``device``, ``batches_per_case`` and ``opt_out``."""

    backend_name: ClassVar[str | None] = None
    platform: ClassVar[str | None] = None
    device: ClassVar[str | None] = None
    batches_per_case: ClassVar[int] = 2
    opt_out: ClassVar[dict[str, str]] = {}

    # -- plumbing ------------------------------------------------------------------------------

    @pytest.fixture
    def registry(self) -> PluginRegistry:
        return get_registry()

    @pytest.fixture
    def name(self, request) -> str:
        name = self.backend_name or request.config.getoption("swa_hal_backend", None)
        if not name:
            pytest.fail("set backend_name on the conformance class or pass --swa-hal-backend NAME")
        return name

    @pytest.fixture
    def spec(self, registry, name) -> BackendSpec:
        if name not in registry.backends:
            pytest.fail(f"backend {name!r} is not registered (registered: {', '.join(sorted(registry.backends))}); "
                        f"plugin problems: {registry.problems}")
        return registry.backends[name].spec

    @pytest.fixture(autouse=True)
    def _opt_out(self, request):
        test = request.node.originalname.removeprefix("test_")
        if test in self.opt_out:
            pytest.skip(f"opted out: {self.opt_out[test]}")

    def target(self, spec: BackendSpec) -> tuple[PlatformInfo | None, torch.device]:
        """The platform and device the outputs are computed on."""
        if self.device is not None:
            device = torch.device(self.device)
        elif spec.kernels == "triton" and not torch.cuda.is_available():
            device = torch.device("cpu")  # the Triton interpreter
        elif spec.vendors and "cuda" in spec.vendors and torch.cuda.is_available():
            device = torch.device("cuda")
        else:
            device = torch.device("cpu")
        if device.type != "cpu":
            return None, device  # probe the real device
        assume = self.platform or (spec.platforms[0] if spec.platforms else None)
        return (PlatformInfo.from_assume(assume) if assume else None), device

    def make_builder(self, spec: BackendSpec, registry: PluginRegistry, config: SWAConfig, **kw) -> SWAMetadataBuilder:
        platform, device = self.target(spec)
        return SWAMetadataBuilder(config, device=device, backend=spec.name, platform=platform, registry=registry, **kw)

    # -- the spec ------------------------------------------------------------------------------

    def test_spec_is_well_formed(self, spec, name):
        assert spec.problems() == []
        assert spec.name == name
        assert spec.summary, "give the backend a one-line summary (shown by swa-hal info)"

    def test_availability_grid(self, spec, registry):
        for assume in PLATFORM_GRID + tuple(spec.platforms):
            result = spec.is_available(PlatformInfo.from_assume(assume))
            assert isinstance(result, Availability), f"is_available({assume!r}) returned {type(result).__name__}"
            if not result.ok:
                assert result.reasons and all(isinstance(r, str) and r for r in result.reasons), assume

    def test_available_and_selected_on_its_own_platforms(self, spec, registry):
        from ..selection import select_backend

        for assume in spec.platforms:
            platform = PlatformInfo.from_assume(assume)
            assert spec.is_available(platform).ok, f"{spec.name} is not available on its own platform {assume}"
            if spec.auto_select:
                picked = select_backend(platform=platform, registry=registry, env={}).name
                assert picked == spec.name, f"on {assume} auto-selection picks {picked!r}, not {spec.name!r}"

    def test_probing_does_not_initialise_cuda(self, spec):
        if torch.cuda.is_initialized():
            pytest.skip("CUDA was initialised earlier in this process; this check runs in CPU-only sessions")
        for assume in PLATFORM_GRID:
            spec.is_available(PlatformInfo.from_assume(assume))
        assert not torch.cuda.is_initialized(), "is_available initialised CUDA"

    def test_factory_resolves(self, spec, registry):
        factory = spec.load_factory()
        assert callable(factory)
        builder = self.make_builder(spec, registry, CONFORMANCE_CONFIGS["w4b4_mtp"])
        assert builder.backend_name == spec.name

    # -- the semantics -------------------------------------------------------------------------

    def test_spec_vectors(self, spec, registry):
        config = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=32,
                           max_num_seqs=4, num_speculative_tokens=1, speculative_method="mtp")
        builder = self.make_builder(spec, registry, config)
        batch = AttentionBatch.from_lists([6, 3], [2, 3], [[7, 3], [5]], block_size=4).to(builder.device)
        md = builder.build(batch)
        assert md.decode_swa_indices.view(2, 4).tolist() == [[29, 30, 31, 12], [30, 31, 12, 13]]
        assert md.decode_swa_lens.tolist() == [4, 4]
        assert md.prefill_swa_indices.view(3, 4).tolist() == [[20, -1, -1, -1], [20, 21, -1, -1], [20, 21, 22, -1]]
        assert md.prefill_swa_lens.tolist() == [1, 2, 3]
        dspark = dataclasses.replace(config, speculative_method="dspark", num_speculative_tokens=2)
        builder = self.make_builder(spec, registry, dspark)
        batch = AttentionBatch.from_lists([10], [3], [[2, 9, 6]], causal=False, block_size=4).to(builder.device)
        md = builder.build(batch)
        assert md.decode_swa_indices.view(3, 64).tolist() == [[11, 36, 37, 38, 39, 24, 25] + [-1] * 57] * 3
        assert md.decode_swa_lens.tolist() == [7, 7, 7]

    @pytest.mark.parametrize("config_name, kind", _cases(CONFORMANCE_CONFIGS))
    def test_random_batches_match_reference(self, spec, registry, config_name, kind):
        config = CONFORMANCE_CONFIGS[config_name]
        builder = self.make_builder(spec, registry, config)
        rng = random.Random(f"{spec.name}-{config_name}-{kind}")
        addresses = None
        for _ in range(self.batches_per_case):
            batch = random_batch(config, rng, kind, device=str(builder.device))
            md = builder.build(batch)
            problems = compare_with_reference(config, batch, md)
            assert not problems, f"{kind} batch {batch.num_tokens} tokens: " + "; ".join(problems)
            # Rows past the decode rows hold lens 0 (a captured graph may read them).
            tail = builder.buffers.decode_lens[md.num_decode_tokens :]
            assert int(tail.abs().sum()) == 0, "decode lens past num_decode_tokens must be 0"
            now = tuple(t.untyped_storage().data_ptr()
                        for t in (md.decode_swa_lens, md.token_to_req_indices, md.is_valid_token))
            assert addresses is None or now == addresses, "output buffers moved between builds"
            addresses = now

    def test_invalid_batch_raises_a_validation_error(self, spec, registry):
        config = CONFORMANCE_CONFIGS["w4b4_mtp"]
        builder = self.make_builder(spec, registry, config)
        batch = AttentionBatch.from_lists([3], [2], [[0]], block_size=4).to(builder.device)
        batch.seq_lens.fill_(1)  # shorter than its 2 query tokens
        with pytest.raises(BatchValidationError, match=r"seq_lens\[0\]=1 is shorter than its query length 2"):
            builder.build(batch, validate=True)

    # -- claims --------------------------------------------------------------------------------

    @requires("clamps_addresses")
    @pytest.mark.parametrize("config_name, kind", _cases(CONFORMANCE_CONFIGS))
    def test_address_strict(self, spec, registry, config_name, kind):
        from .interpreter import address_strict

        platform, device = self.target(spec)
        if device.type != "cpu":
            pytest.skip("address-strict runs under the Triton interpreter on the CPU")
        config = CONFORMANCE_CONFIGS[config_name]
        builder = self.make_builder(spec, registry, config)
        rng = random.Random(f"strict-{spec.name}-{config_name}-{kind}")
        with address_strict():
            for _ in range(self.batches_per_case):
                batch = random_batch(config, rng, kind)
                md = builder.build(batch)
                assert not compare_with_reference(config, batch, md)
                if md.causal and md.num_decode_tokens and builder.supports_draft_decode_metadata_update:
                    builder.update_draft_decode_metadata(md)  # the in-place variant, same rule

    @requires("draft_update")
    @pytest.mark.parametrize("config_name", ["w4b4_mtp", "w12b8_parallel", "v4"])
    def test_draft_update_matches_a_fresh_build(self, spec, registry, config_name):
        config = CONFORMANCE_CONFIGS[config_name]
        live = self.make_builder(spec, registry, config)
        fresh = self.make_builder(spec, registry, config)
        rng = random.Random(f"draft-{spec.name}-{config_name}")
        for kind in ("decode", "mtp", "mixed", "invalid"):
            # Room to grow: contexts leave 8 positions and every request holds 2 spare pages.
            batch = random_batch(config, rng, kind, max_context=config.max_model_len - 8, extra_pages=2,
                                 device=str(live.device))
            md = live.build(batch)
            for step in range(1, 8):
                batch.seq_lens[: md.num_decodes] += 1  # the engine advances decode requests in place
                batch.seq_lens_cpu[: md.num_decodes] += 1
                live.update_draft_decode_metadata(md)
                want = fresh.build(batch)
                rows = md.num_decode_tokens
                where = f"{kind} batch, draft step {step}"
                assert torch.equal(md.decode_swa_indices.cpu(), want.decode_swa_indices[:rows].cpu()), where
                assert torch.equal(md.decode_swa_lens.cpu(), want.decode_swa_lens.cpu()), where
                if md.decode_swa_indptr is not None:  # a ragged form must be refreshed too
                    assert torch.equal(md.decode_swa_indptr.cpu(), want.decode_swa_indptr.cpu()), where
                    n = int(want.decode_swa_indptr[-1])
                    assert torch.equal(md.decode_swa_ragged_indices[:n].cpu(), want.decode_swa_ragged_indices[:n].cpu()), where

    @requires("cuda_graphs")
    @pytest.mark.gpu
    def test_decode_build_replays_in_a_cuda_graph(self, spec, registry):
        from .graphs import check_graph_replay

        platform, device = self.target(spec)
        if device.type != "cuda":
            pytest.fail("the CUDA-graph claim is checked on a CUDA device; run this suite there with -m gpu")
        check_graph_replay(self.make_builder(spec, registry, CONFORMANCE_CONFIGS["v4"]), rng=random.Random(0))
