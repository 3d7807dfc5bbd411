"""swa_hal inside vLLM 0.33 and 0.34: the plugin, the builder family, and parity with vLLM's own builders.

Every parity test builds the same ``CommonAttentionMetadata`` twice, with vLLM's native builder class
and with the swa_hal builder vLLM would get for it, and compares every field vLLM's builder fills
(``vllm_harness.compare``). vLLM runs on its CPU platform; its Triton kernels and swa_hal's Triton
backends run in the Triton interpreter (the Triton backends on an assumed platform of their own).
FlashMLA's planner needs CUDA, so ``get_mla_metadata`` is a stub that hands out fresh planner objects.

Run with ``make test-vllm``.
"""

from __future__ import annotations

import os

# vLLM on its CPU platform, before anything imports it: no CUDA device (without CUDA_VISIBLE_DEVICES=""
# vLLM swaps Triton for a placeholder) and Triton kernels in the interpreter.
os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import contextlib
import dataclasses
import json
import logging
import random
import re
import subprocess
import sys
from importlib.metadata import entry_points, version

import pytest
import torch
import vllm.plugins
import vllm_harness as H
from helpers import logged_warnings
from vllm.models.deepseek_v4.cpu.cpu_mla import DeepseekV4CPUSparseSWAMetadataBuilder
from vllm.models.deepseek_v4.nvidia import flashinfer_sparse as v4_flashinfer
from vllm.models.deepseek_v4.nvidia import flashmla as v4_flashmla
from vllm.models.deepseek_v41 import sparse_mla as v41_sparse_mla
from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as v41_flashinfer
from vllm.models.deepseek_v41.nvidia import flashmla as v41_flashmla
from vllm.models.deepseek_v41.sparse_mla import DeepseekV41SparseSWAMetadataBuilder
from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.attention.backends.mla import sparse_swa
from vllm.v1.attention.ops.flashmla import FlashMLASchedMeta

from swa_hal import AttentionBatch
from swa_hal.errors import BatchRangeError, ConfigError, SpeculativeModeError
from swa_hal.integrations import vllm as integ
from swa_hal.integrations import vllm_common, vllm_shadow
from swa_hal.reference import build_reference
from swa_hal.schedulers import no_schedulers
from swa_hal.step_inputs import StepInputs

CPU = torch.device("cpu")
SEED = 20261130
# The Triton backends, each on the first platform it declares (the kernels run in the interpreter).
TRITON_BACKENDS = {
    "cuda": "vendor=cuda,capability=9.0",
    "sm12x": "vendor=cuda,capability=12.0",
    "rocm": "vendor=rocm,arch=gfx942,capability=9.4",
    "xpu": "vendor=xpu",
}
# vLLM's builder classes per model version: the base (the V4.1 base), FlashMLA and FlashInfer.
V4_NATIVES = (
    sparse_swa.DeepseekSparseSWAMetadataBuilder,
    v4_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder,
    v4_flashinfer.DeepseekSparseSWAFlashInferMetadataBuilder,
)
V41_NATIVES = (
    DeepseekV41SparseSWAMetadataBuilder,
    v41_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder,
    v41_flashinfer.DeepseekSparseSWAFlashInferMetadataBuilder,
)
EXTRA_VARIANTS = {
    v.name: v
    for v in (
        H.Variant(
            "v41_dspark2_w6b4",
            window=6,
            block_size=4,
            version="deepseek_v41",
            compress_ratios=(0, 1, 2),
            spec_tokens=2,
            dspark=True,
        ),
        # W + k = 64: a DSpark row of q = k + 1 needs 65 entries, one more than the 64-wide row.
        H.Variant("v4_dspark3_w61b16", window=61, block_size=16, spec_tokens=3, dspark=True),
    )
}
ALL_VARIANTS = {**H.VARIANTS, **EXTRA_VARIANTS}
PARITY_VARIANTS = [n for n in ALL_VARIANTS if n != "v4_dspark3_w61b16"]
# Batches per (variant, kind) and backend.
TORCH_BATCHES = 4
TRITON_BATCHES = 4
COUNTS = H.COUNTS  # reported at the end of the run (conftest.py)


@pytest.fixture(scope="session", autouse=True)
def planner_stub():
    """FlashMLA's planner needs CUDA; the builders only create one fresh planner object per layer type."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sparse_swa, "get_mla_metadata", lambda *a, **k: (FlashMLASchedMeta(), None))
        yield


class Keep(logging.Handler):
    """Keeps every record of the plugin's logger (``vllm.plugins.swa_hal``) while attached."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.logger = logging.getLogger("vllm.plugins.swa_hal")

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> list[logging.LogRecord]:
        self.logger.addHandler(self)
        return self.records

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)


@pytest.fixture(scope="session")
def plugin_log():
    """vLLM's own plugin loader, as every vLLM process runs it, with the plugin's log records kept."""
    logger = logging.getLogger("vllm.plugins.swa_hal")
    level = logger.level
    logger.setLevel(logging.INFO)
    with Keep() as records:
        integ.unregister()
        vllm.plugins.plugins_loaded = False
        vllm.plugins.load_general_plugins()
        yield list(records), records  # (what the load logged, everything logged since)
    logger.setLevel(level)


@pytest.fixture(scope="session")
def rocm(plugin_log):
    """vLLM's ROCm AITER modules, imported after the plugin registered (as vLLM imports a platform's
    model code after loading plugins)."""
    return H.import_rocm_modules()


@pytest.fixture(scope="session")
def vllm_configs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf")
    return {name: H.make_vllm_config(v, tmp) for name, v in ALL_VARIANTS.items()}


def builders(native_cls, variant_name, vllm_configs, **swa_hal_kw):
    v = ALL_VARIANTS[variant_name]
    vc = vllm_configs[variant_name]
    spec = H.make_kv_spec(v)
    native = native_cls(spec, ["model.layers.0.attn.swa_cache"], vc, CPU)
    ours = integ.swa_hal_builder_cls(native_cls)(spec, ["model.layers.0.attn.swa_cache"], vc, CPU, **swa_hal_kw)
    H.force_rocm_ragged_prefill(native, ours)  # ROCm: also build the aiter prefill's ragged rows
    return native, ours, H.swa_config_for(v, vc)


def xpu_v4_native():
    """vLLM 0.34's XPU SWA builder for V4 (the base backend hands it out on XPU); None on 0.33."""
    if not H.V034:
        return None
    from vllm.models.deepseek_v4.xpu.xpu_sparse import DeepseekV4XPUSparseSWAMetadataBuilder

    return DeepseekV4XPUSparseSWAMetadataBuilder


def natives_for(variant_name, rocm):
    """vLLM's builder classes for the variant's model version: base, FlashMLA, FlashInfer, ROCm AITER
    (and, from vLLM 0.34, V4's XPU builder)."""
    a4, a41 = rocm
    if ALL_VARIANTS[variant_name].version == "deepseek_v41":
        return (*V41_NATIVES, a41.DeepseekV41ROCMAiterSparseSWAMetadataBuilder)
    xpu = xpu_v4_native()
    return (*V4_NATIVES, a4.DeepseekV4ROCMAiterSparseSWAMetadataBuilder, *((xpu,) if xpu else ()))


def kinds_for(variant_name):
    kinds = ["decode", "mtp", "mixed", "prefill", "padded", "invalid", "short_context"]
    if ALL_VARIANTS[variant_name].dspark:
        kinds.append("dspark")
    return kinds


def build_both(native, ours, batch, ranges, *, num_actual_tokens=None):
    cm_native = H.common_metadata(batch, image_ranges=ranges, num_actual_tokens=num_actual_tokens)
    cm_ours = H.common_metadata(batch, image_ranges=ranges, num_actual_tokens=num_actual_tokens)
    got_native = native.build(0, cm_native, replay_start=batch.replay_start)
    got_ours = ours.build(0, cm_ours, replay_start=batch.replay_start)
    return got_native, got_ours


def chunk_args(variant_name):
    if ALL_VARIANTS[variant_name].version == "deepseek_v41":
        return dict(chunk_ratios=(1, 2), has_compressed=(True, False))
    return dict(chunk_ratios=(1, 4, 128), has_compressed=(None,))


def tally(kind, batch, ranges, native_md):
    if hasattr(native_md, "prefill_swa_ragged_indptr") and batch.replay_start is not None:
        COUNTS["rocm_replay"] += 1  # bounded replay on ROCm (V4.1 CDNA3/4 from vLLM 0.34)
    COUNTS["batches"] += 1
    COUNTS[kind] += 1
    COUNTS["replay_start"] += batch.replay_start is not None
    COUNTS["image_spans"] += native_md.prefill_left_visible is not None


# -- the plugin -------------------------------------------------------------------------------


def test_entry_point_is_declared():
    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("swa_hal") == "swa_hal.integrations.vllm:register"


def test_vllm_plugin_loader_activates_swa_hal(plugin_log):
    at_load, since = plugin_log
    assert integ.is_registered()
    lines = [r.getMessage() for r in at_load]
    assert len(lines) == 1, lines
    installed = version("vllm")
    assert f"vLLM {installed} builds its DeepSeek-V4/V4.1 SWA metadata through swa_hal backend 'torch'" in lines[0]
    # vLLM loads plugins in every process, sometimes more than once: nothing changes, nothing is logged.
    before = len(since)
    vllm.plugins.plugins_loaded = False
    vllm.plugins.load_general_plugins()
    assert integ.register() is True
    assert len(since) == before


def test_builder_vllm_resolves_for_a_deepseek_v4_swa_cache_is_swa_hals(plugin_log, vllm_configs):
    from vllm.config import set_current_vllm_config

    vc = vllm_configs["v4_w8b4"]
    with set_current_vllm_config(vc):
        layer = sparse_swa.DeepseekV4SWACache(
            head_dim=512,
            window_size=8,
            dtype=torch.bfloat16,
            prefix="model.layers.0.attn.swa_cache",
            cache_config=vc.cache_config,
            block_size=4,
        )
    backend = layer.get_attn_backend()
    assert backend is sparse_swa.DeepseekSparseSWABackend  # the backend itself is vLLM's, unchanged
    builder_cls = backend.get_builder_cls()
    assert integ.is_swa_hal_builder(builder_cls)
    # On the CPU platform vLLM picks its CPU subclass; swa_hal wraps exactly that class.
    assert integ.native_builder_cls(builder_cls) is DeepseekV4CPUSparseSWAMetadataBuilder
    assert issubclass(builder_cls, DeepseekV4CPUSparseSWAMetadataBuilder)
    builder = builder_cls(layer.get_kv_cache_spec(vc), [layer.prefix], vc, CPU)
    assert builder.swa_hal_backend == "torch"
    import pickle

    assert pickle.loads(pickle.dumps(builder_cls)) is builder_cls  # found by name in any process


# vLLM 0.34 lowered the V4.1 FlashMLA and FlashInfer SWA builders from ALWAYS to UNIFORM_BATCH.
V41_SUPPORT = AttentionCGSupport.UNIFORM_BATCH if H.V034 else AttentionCGSupport.ALWAYS


@pytest.mark.parametrize(
    "backend_cls, native, support",
    [
        (
            v4_flashmla.DeepseekSparseSWAFlashMLABackend,
            v4_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder,
            AttentionCGSupport.ALWAYS,
        ),
        (
            v41_flashmla.DeepseekSparseSWAFlashMLABackend,
            v41_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder,
            V41_SUPPORT,
        ),
        (
            v4_flashinfer.DeepseekSparseSWAFlashInferBackend,
            v4_flashinfer.DeepseekSparseSWAFlashInferMetadataBuilder,
            AttentionCGSupport.ALWAYS,
        ),
        (
            v41_flashinfer.DeepseekSparseSWAFlashInferBackend,
            v41_flashinfer.DeepseekSparseSWAFlashInferMetadataBuilder,
            V41_SUPPORT,
        ),
    ],
    ids=["v4-flashmla", "v41-flashmla", "v4-flashinfer", "v41-flashinfer"],
)
def test_every_platform_backend_hands_out_swa_hal(plugin_log, vllm_configs, backend_cls, native, support):
    cls = backend_cls.get_builder_cls()
    assert integ.native_builder_cls(cls) is native and issubclass(cls, native)
    # What the subclass declares is kept: CUDA-graph support, draft updates, reordering.
    assert cls.get_cudagraph_support(vllm_configs["v4_w8b4"], None) == support == native._cudagraph_support
    assert cls.supports_draft_decode_metadata_update is native.supports_draft_decode_metadata_update is True
    assert cls.reorder_batch_threshold is None
    # swa_hal sits under the platform subclass and over vLLM's base: the subclass's own build runs on top.
    mro = cls.__mro__
    assert (
        mro.index(native)
        < mro.index(integ.sparse_swa_builder_base())
        < mro.index(sparse_swa.DeepseekSparseSWAMetadataBuilder)
    )


@pytest.mark.skipif(not H.V034, reason="vLLM 0.33 has no XPU SWA builder (its base builder serves XPU)")
def test_xpu_base_backend_hands_out_swa_hals_xpu_builder(plugin_log, vllm_configs, monkeypatch):
    """On XPU, vLLM 0.34's base SWA backend hands out its own XPU builder; under the plugin, swa_hal's
    builder over it, keeping its CUDA-graph rule (ALWAYS under adaptive verification)."""
    from vllm.platforms import current_platform

    native = xpu_v4_native()
    monkeypatch.setattr(type(current_platform), "is_xpu", lambda self: True)
    cls = sparse_swa.DeepseekSparseSWABackend.get_builder_cls()
    assert integ.native_builder_cls(cls) is native and issubclass(cls, native)
    vc = vllm_configs["v4_mtp2_w6b8"]
    assert cls.get_cudagraph_support(vc, None) == native.get_cudagraph_support(vc, None)
    vc.speculative_config.enable_adaptive_verification = True
    try:
        assert cls.get_cudagraph_support(vc, None) == AttentionCGSupport.ALWAYS
    finally:
        vc.speculative_config.enable_adaptive_verification = False


def test_platform_backends_defined_later_are_covered(plugin_log):
    """ROCm's module cannot be imported without a ROCm torch; its backends are defined when vLLM
    imports it, after the plugin ran: a subclass defined now stands in for them."""

    class LateBuilder(sparse_swa.DeepseekSparseSWAMetadataBuilder):
        supports_draft_decode_metadata_update = False

    class LateBackend(sparse_swa.DeepseekSparseSWABackend):
        @staticmethod
        def get_builder_cls():
            return LateBuilder

    cls = LateBackend.get_builder_cls()
    assert integ.native_builder_cls(cls) is LateBuilder
    assert cls.supports_draft_decode_metadata_update is False


def test_rocm_backends_imported_after_registration_hand_out_swa_hal(rocm, vllm_configs):
    a4, a41 = rocm
    for backend, native in (
        (a41.DeepseekV41ROCMAiterSparseSWABackend, a41.DeepseekV41ROCMAiterSparseSWAMetadataBuilder),
    ):
        cls = backend.get_builder_cls()
        assert integ.native_builder_cls(cls) is native and issubclass(cls, native)
        # vLLM's ROCm builder keeps it off (its update leaves the ragged rows stale); swa_hal's rebuilds them.
        assert native.supports_draft_decode_metadata_update is False
        assert cls.supports_draft_decode_metadata_update is True
        vc = vllm_configs["v41_mtp1_w7b16"]
        assert cls.get_cudagraph_support(vc, None) == AttentionCGSupport.UNIFORM_BATCH
        vc.speculative_config.enable_adaptive_verification = True
        try:
            assert cls.get_cudagraph_support(vc, None) == AttentionCGSupport.ALWAYS  # ROCm's own rule
        finally:
            vc.speculative_config.enable_adaptive_verification = False
    # V4's ROCm builder is what the base backend returns on a ROCm platform.
    v4 = integ.swa_hal_builder_cls(a4.DeepseekV4ROCMAiterSparseSWAMetadataBuilder)
    assert integ.is_swa_hal_builder(v4)
    assert a4.DeepseekV4ROCMAiterSparseSWAMetadataBuilder.supports_draft_decode_metadata_update is False
    assert v4.supports_draft_decode_metadata_update is True


def test_rocm_one_launch_decode_build_defers_to_swa_hal(rocm, vllm_configs, monkeypatch):
    """On gfx942 (and, from vLLM 0.34, gfx950) with the monokernel, ROCm's V4.1 builder fills a decode batch's rows with one launch
    of its own kernel. Under swa_hal that shortcut declines (the rows are swa_hal's), and the result
    equals vLLM's one-launch build."""
    from vllm.models.deepseek_v41.amd.ops import swa_decode_meta

    _, a41 = rocm
    taken = []
    real_build = swa_decode_meta.build

    def spy(builder, *args):
        out = real_build(builder, *args)
        taken.append((integ.is_swa_hal_builder(type(builder)), out is not None))
        return out

    # The gate's name by release: ``enabled`` (0.33: gfx942), ``monokernel_cdna3_or_4`` (0.34: gfx942 and gfx950).
    gate = "monokernel_cdna3_or_4" if H.V034 else "enabled"
    assert hasattr(swa_decode_meta, gate)
    monkeypatch.setattr(swa_decode_meta, gate, lambda: True)
    monkeypatch.setattr(swa_decode_meta, "build", spy)
    native, ours, cfg = builders(
        a41.DeepseekV41ROCMAiterSparseSWAMetadataBuilder, "v41_mtp1_w7b16", vllm_configs, backend="torch"
    )
    rng = random.Random(SEED)
    for kind in ("decode", "mtp"):
        batch, ranges = H.draw(cfg, rng, kind, replay=1.0)
        got_native, got_ours = build_both(native, ours, batch, ranges)
        diffs = H.compare(got_native, got_ours, batch, **chunk_args("v41_mtp1_w7b16"))
        assert not diffs, "\n".join(diffs)
    assert taken == [(False, True), (True, False)] * 2


def test_off_switch_leaves_vllm_untouched(plugin_log, monkeypatch):
    integ.unregister()
    try:
        assert sparse_swa.DeepseekSparseSWABackend.get_builder_cls() is DeepseekV4CPUSparseSWAMetadataBuilder
        monkeypatch.setenv("SWA_HAL_VLLM", "0")
        assert integ.register() is False
        assert not integ.is_registered()
        assert sparse_swa.DeepseekSparseSWABackend.get_builder_cls() is DeepseekV4CPUSparseSWAMetadataBuilder
        assert v41_flashmla.DeepseekSparseSWAFlashMLABackend.get_builder_cls() is (
            v41_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder
        )
        monkeypatch.setenv("SWA_HAL_VLLM", "of")  # a typo is an error, never a silent switch
        with pytest.raises(ValueError, match="SWA_HAL_VLLM='of'"):
            integ.register()
    finally:
        monkeypatch.delenv("SWA_HAL_VLLM")
        assert integ.register() is True
    assert integ.is_swa_hal_builder(sparse_swa.DeepseekSparseSWABackend.get_builder_cls())


def test_supported_vllm_versions_and_direct_use_of_another():
    for good in ("0.33.0", "0.33.4+cu130", "0.34.0", "0.34.2"):
        assert integ.check_vllm(good) == good
    for bad in ("0.32.1", "0.35.0", "1.0.0", "weird"):
        with pytest.raises(
            integ.VllmVersionError,
            match=r"supports vLLM 0\.33\.x, 0\.34\.x only.*SWA_HAL_VLLM=0.*SWA_HAL_FORCE_ENGINE=1",
        ):
            integ.check_vllm(bad)


@contextlib.contextmanager
def installed_vllm(monkeypatch, found):
    """vLLM's own plugin loader run afresh, as a process of an engine whose vLLM reports ``found``;
    yields the plugin's log records. swa_hal's registration is put back afterwards."""
    from swa_hal.integrations import _common

    integ.unregister()
    monkeypatch.setattr(vllm_common, "vllm_version", lambda: found)
    monkeypatch.setattr(_common, "_warned", set())
    try:
        with Keep() as records:
            yield records
    finally:
        monkeypatch.undo()
        integ.unregister()
        integ.register()


def load_vllm_plugins():
    vllm.plugins.plugins_loaded = False
    vllm.plugins.load_general_plugins()


@pytest.mark.parametrize("found", ["0.35.0", "0.32.1", "0.34.1.dev7", "0.35.0rc1"])
def test_another_vllm_is_shadowed_with_one_warning(plugin_log, monkeypatch, found):
    """Under a vLLM outside the tested series (a pre or development release of one included), vLLM's own
    plugin loader runs to the end: swa_hal logs one warning (the version found, the tested ones, how to promote
    or refuse) and installs in shadow mode: the SWA backends hand out swa_hal's builders, whose builds are
    vLLM's own, compared with swa_hal's (docs/engines.md #releases-outside-the-tested-set)."""
    with installed_vllm(monkeypatch, found) as records:
        load_vllm_plugins()
        load_vllm_plugins()  # vLLM loads plugins more than once per process: still one warning
        assert integ.is_registered() and vllm_shadow.current() is not None
        assert vllm_shadow.current().mode == "shadow"
        assert integ.is_swa_hal_builder(sparse_swa.DeepseekSparseSWABackend.get_builder_cls())
        assert not integ.step_builds_active()  # vLLM's own builds serve: no step builds
        warnings = [r for r in records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in records]
        line = warnings[0].getMessage()
        assert f"vLLM {found} is installed" in line and "0.33.x, 0.34.x" in line
        for word in ("shadow mode", "SWA_HAL_SHADOW_PROMOTE=1", "SWA_HAL_FORCE_ENGINE=1", "SWA_HAL_STRICT=1"):
            assert word in line, line
        started = [r.getMessage() for r in records if r.levelno == logging.INFO and "shadows" in r.getMessage()]
        assert len(started) == 1 and "shadow mode: vLLM's own builds serve" in started[0]
    assert vllm_shadow.current() is None  # the tested release again: swa_hal serves


def test_another_vllm_switched_off_is_untouched(plugin_log, monkeypatch):
    with installed_vllm(monkeypatch, "0.35.0"):
        monkeypatch.setenv("SWA_HAL_VLLM", "0")
        load_vllm_plugins()
        assert not integ.is_registered()
        assert sparse_swa.DeepseekSparseSWABackend.get_builder_cls() is DeepseekV4CPUSparseSWAMetadataBuilder


def test_another_vllm_under_strict_stops_the_start(plugin_log, monkeypatch):
    with installed_vllm(monkeypatch, "0.35.0"):
        monkeypatch.setenv("SWA_HAL_STRICT", "1")
        with pytest.raises(integ.VllmVersionError, match="vLLM 0.35.0 is installed"):
            load_vllm_plugins()
        assert not integ.is_registered()


def test_another_vllm_forced_installs_with_a_warning(plugin_log, monkeypatch):
    with installed_vllm(monkeypatch, "0.35.0") as records:
        monkeypatch.setenv("SWA_HAL_FORCE_ENGINE", "1")
        load_vllm_plugins()
        assert integ.is_registered()
        assert integ.is_swa_hal_builder(sparse_swa.DeepseekSparseSWABackend.get_builder_cls())
        assert any("serves it anyway" in r.getMessage() for r in records if r.levelno == logging.WARNING)
        assert vllm_shadow.current() is None


# Speculative methods of both releases (vLLM 0.34 knows no "medusa"; 0.33's rule does not read the method).
SPEC_METHODS = ("mtp", "eagle", "eagle3", "ngram", "suffix", "draft_model", "dspark")


def expected_split_width(method, k, parallel, runner_v2):
    """vLLM's split width, restated from each release (docs/semantics.md #split): 0.33: 1 + k, plus k more
    under parallel drafting on model runner V1; 0.34: 1 + k plus the drafter's extra slots (1 for a
    standalone draft model's unsliced token, 0 otherwise; parallel drafting no longer matters)."""
    if H.V034:
        return 1 + k + (1 if method == "draft_model" else 0)
    return 1 + k + (k if parallel and not runner_v2 else 0)


@pytest.mark.parametrize("runner_v2", [True, False] if not H.V034 else [True], ids=lambda v: f"v2={v}")
@pytest.mark.parametrize("parallel", [False, True], ids=lambda p: f"parallel={p}")
@pytest.mark.parametrize("method", SPEC_METHODS)
def test_split_width_is_vllms_own_for_each_speculative_method(
    plugin_log, vllm_configs, monkeypatch, method, parallel, runner_v2
):
    """The plugin takes vLLM's split width from vLLM's builder, whichever release computed it: equal to
    vLLM's own value and to each release's rule, for every method, and a batch splits the same way."""
    if not H.V034:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if runner_v2 else "0")
    k = 3
    dspark = method == "dspark"
    variant = "v4_dspark3_w5b4" if dspark else "v4_mtp2_w6b8"
    vc = vllm_configs[variant]
    before = vc.speculative_config
    object.__setattr__(vc, "speculative_config", H.SpecStub(k, dspark, method=method, parallel_drafting=parallel))
    try:
        native, ours, cfg = builders(
            sparse_swa.DeepseekSparseSWAMetadataBuilder, variant, vllm_configs, backend="torch"
        )
    finally:
        object.__setattr__(vc, "speculative_config", before)
    want = expected_split_width(method, k, parallel, runner_v2)
    assert native.decode_threshold == want
    assert ours.swa_config.decode_threshold == ours.swa_hal.decode_threshold == want
    # A request of exactly the width decodes, one token longer prefills: as vLLM splits it.
    pages = -(-40 // cfg.block_size)
    table = torch.arange(2 * pages, dtype=torch.int32).view(2, pages)
    batch = AttentionBatch.from_lists([40, 40], [want, want + 1], table, block_size=cfg.block_size)
    got_native, got_ours = build_both(native, ours, batch, None)
    assert (got_native.num_decodes, got_native.num_prefills) == (got_ours.num_decodes, got_ours.num_prefills) == (1, 1)


def test_a_backend_that_cannot_be_chosen_leaves_vllm_untouched(plugin_log, monkeypatch):
    from swa_hal.errors import BackendNotFoundError, BackendUnavailableError

    integ.unregister()
    try:
        monkeypatch.setenv("SWA_HAL_BACKEND", "acme")
        with pytest.raises(BackendNotFoundError, match="'acme'"):
            integ.register()
        monkeypatch.setenv("SWA_HAL_BACKEND", "cuda")  # no CUDA device here
        with pytest.raises(BackendUnavailableError, match="'cuda'"):
            integ.register()
        assert not integ.is_registered()
        assert sparse_swa.DeepseekSparseSWABackend.get_builder_cls() is DeepseekV4CPUSparseSWAMetadataBuilder
    finally:
        monkeypatch.delenv("SWA_HAL_BACKEND")
        integ.register()


def test_configure_sets_the_backend_of_builders_vllm_constructs(plugin_log, vllm_configs):
    previous = integ.configure(backend="sm12x", platform=TRITON_BACKENDS["sm12x"])
    try:
        builder_cls = v41_flashmla.DeepseekSparseSWAFlashMLABackend.get_builder_cls()
        v = ALL_VARIANTS["v41_w8b4"]
        builder = builder_cls(H.make_kv_spec(v), ["layer"], vllm_configs["v41_w8b4"], CPU)
        assert builder.swa_hal_backend == "sm12x"
        assert builder.swa_config.model_version == "deepseek_v41"
        assert builder.swa_config.layer_types == ("swaonly", "c1a", "c2a")
    finally:
        integ.configure(previous.backend, previous.platform, previous.validate)


@contextlib.contextmanager
def pcp_config(vc, size):
    """The session's VllmConfig with ``prefill_context_parallel_size`` set (the builders read it when made)."""
    before = vc.parallel_config.prefill_context_parallel_size
    object.__setattr__(vc.parallel_config, "prefill_context_parallel_size", size)
    try:
        yield vc
    finally:
        object.__setattr__(vc.parallel_config, "prefill_context_parallel_size", before)


@pytest.mark.parametrize(
    "native, variant, pcp",
    [
        (sparse_swa.DeepseekSparseSWAMetadataBuilder, "v4_w8b4", 2),
        (v4_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder, "v4_w8b4", 4),
        (v41_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder, "v41_w8b4", 8),
        (DeepseekV41SparseSWAMetadataBuilder, "v41_w8b4", 3),
    ],
    ids=["v4-base-2", "v4-flashmla-4", "v41-flashmla-8", "v41-base-3"],
)
def test_prefill_context_parallelism_is_vllms_where_unchecked(
    plugin_log, vllm_configs, monkeypatch, native, variant, pcp
):
    """vLLM's V4 builders build over the whole slot mapping (only its V4.1 builder takes the rank's
    chunk), so swa_hal under them leaves PCP to vLLM; under V4.1 it takes the sizes it is tested at. A builder
    swa_hal does not serve is vLLM's own (docs/engines.md #drift); SWA_HAL_STRICT=1 refuses it by name."""
    monkeypatch.setattr(v41_sparse_mla, "get_pcp_group", lambda: H.FakePCPGroup(0, [torch.zeros(0)] * pcp))
    refused = r"prefill context parallelism.*V4\.1 at sizes 2 and 4 only.*SWA_HAL_VLLM=0"
    with pcp_config(vllm_configs[variant], pcp) as vc:
        cls = integ.swa_hal_builder_cls(native)
        builder = cls(H.make_kv_spec(ALL_VARIANTS[variant]), ["layer"], vc, CPU)
        assert builder.swa_hal_aside is not None and re.search(refused, builder.swa_hal_aside)
        assert builder.decode_swa_indices.shape[-1] == vc.model_config.hf_config.sliding_window  # vLLM's own rows
        monkeypatch.setenv("SWA_HAL_STRICT", "1")
        with pytest.raises(ConfigError, match=refused):
            cls(H.make_kv_spec(ALL_VARIANTS[variant]), ["layer"], vc, CPU)


@pytest.mark.parametrize("pcp", [2, 4])
def test_pcp_v41_builders_hold_twice_the_requests(plugin_log, vllm_configs, rocm, monkeypatch, pcp):
    """A PCP rank's batch holds up to two segments per request: vLLM's V4.1 builder sizes its no-replay
    bounds 2 * max_num_seqs + 1, and swa_hal's builder under each V4.1 class takes 2 * max_num_seqs."""
    group = H.FakePCPGroup(pcp - 1, [torch.zeros(0, dtype=torch.int64)] * pcp)
    monkeypatch.setattr(v41_sparse_mla, "get_pcp_group", lambda: group)
    with pcp_config(vllm_configs["v41_w8b4"], pcp):
        for native_cls in natives_for("v41_w8b4", rocm):
            native, ours, _ = builders(native_cls, "v41_w8b4", vllm_configs, backend="torch")
            seqs = vllm_configs["v41_w8b4"].scheduler_config.max_num_seqs
            assert native.pcp_rank == ours.pcp_rank == pcp - 1
            assert native.no_replay_start.shape[0] == ours.no_replay_start.shape[0] == 2 * seqs + 1
            assert ours.swa_config.max_num_seqs == 2 * seqs
    _, plain, _ = builders(DeepseekV41SparseSWAMetadataBuilder, "v41_w8b4", vllm_configs, backend="torch")
    assert plain.swa_config.max_num_seqs == vllm_configs["v41_w8b4"].scheduler_config.max_num_seqs


def test_without_vllm_the_module_says_so(plugin_log, monkeypatch):
    monkeypatch.setattr(vllm_common, "vllm_installed", lambda: False)
    with pytest.raises(
        integ.VllmNotInstalledError, match=r"needs vLLM 0\.33\.x, 0\.34\.x, which is not installed: install vLLM"
    ):
        integ.check_vllm()


def test_importing_the_module_imports_nothing_from_vllm():
    code = (
        "import sys, swa_hal.integrations.vllm as m; "
        "print(sorted(k for k in sys.modules if k == 'vllm' or k.startswith('vllm.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_fresh_vllm_process_logs_one_line(tmp_path):
    """A new process, as vLLM starts its workers: the loader runs twice, the plugin logs once."""
    code = (
        # Engine processes configure vLLM's logging before they load plugins.
        "from vllm.config.logging import LoggingConfig; from vllm.logger import configure_logging;"
        "configure_logging(LoggingConfig());"
        "import vllm.plugins as p; p.load_general_plugins(); p.plugins_loaded = False; p.load_general_plugins();"
        "from vllm.v1.attention.backends.mla import sparse_swa as s;"
        "print('RESOLVED', s.DeepseekSparseSWABackend.get_builder_cls().__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    text = out.stdout + out.stderr
    lines = [line for line in text.splitlines() if "SWA metadata through swa_hal backend" in line]
    assert len(lines) == 1, text
    assert "swa_hal backend 'torch'" in lines[0]
    assert "step builds on" in lines[0]
    assert "RESOLVED SwaHalDeepseekV4CPUSparseSWAMetadataBuilder" in text


def _info_engine(tmp_path, *argv, **env):
    """`swa-hal info --engine vllm` in a new process, as a user runs it: vLLM's logging not set up."""
    full = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", "SWA_HAL_VLLM")}
    full.update(env)
    cmd = [sys.executable, "-m", "swa_hal.cli", "info", "--engine", "vllm", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=full, timeout=600)


def test_info_engine_vllm_says_the_plugin_is_active_with_its_start_up_line(tmp_path):
    """vLLM 0.34 sets up its logging after it loads the plugins, so load_general_plugins() alone shows no line;
    `swa-hal info --engine vllm` loads them as vLLM does and reports what the plugin said."""
    proc = _info_engine(tmp_path, "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    engine = json.loads(proc.stdout)["engine"]
    assert (engine["version"], engine["active"], engine["registered"]) == (version("vllm"), True, True)
    assert engine["entry_point"] == "swa_hal.integrations.vllm:register"
    assert engine["startup"].startswith(f"swa_hal 0.1.0: vLLM {version('vllm')} builds its DeepSeek-V4/V4.1 SWA")
    assert "through swa_hal backend 'torch'" in engine["startup"] and engine["step_builds"] is True
    proc = _info_engine(tmp_path)
    assert proc.returncode == 0
    assert "  active: yes, serving vLLM" in proc.stdout and engine["mode"] == "serve"
    assert f"  start-up line: {engine['startup']}" in proc.stdout
    assert engine["hook_gaps"] == {} and "  stepped aside: 0 calls in this process" in proc.stdout


def test_info_engine_vllm_says_when_the_plugin_shadows(tmp_path):
    proc = _info_engine(tmp_path, "--json", SWA_HAL_VLLM="shadow")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    engine = json.loads(proc.stdout)["engine"]
    assert engine["mode"] == "shadow" and engine["step_builds"] is False
    assert engine["shadow"]["mode"] == "shadow" and engine["shadow"]["calls"] == 0
    assert "shadows its DeepSeek-V4/V4.1 SWA metadata" in engine["startup"]
    proc = _info_engine(tmp_path, SWA_HAL_VLLM="shadow")
    assert "  active: yes, shadowing vLLM" in proc.stdout and "  shadow:        shadow: 0 calls" in proc.stdout


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"VLLM_PLUGINS": "some_other_plugin"}, "VLLM_PLUGINS='some_other_plugin' does not name swa_hal"),
        ({"SWA_HAL_VLLM": "0"}, "SWA_HAL_VLLM=0: the plugin leaves vLLM its own builders"),
    ],
)
def test_info_engine_vllm_says_why_the_plugin_is_not_active(tmp_path, env, reason):
    proc = _info_engine(tmp_path, **env)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"  active: no: {reason}" in proc.stdout, proc.stdout
    assert "start-up line" not in proc.stdout


# -- parity with vLLM's builders --------------------------------------------------------------


@pytest.mark.parametrize("variant", PARITY_VARIANTS)
def test_parity_torch_backend(plugin_log, vllm_configs, rocm, variant):
    rng = random.Random(f"{SEED}-{variant}-torch")
    natives = natives_for(variant, rocm)
    pairs = [builders(n, variant, vllm_configs, backend="torch") for n in natives]
    assert all(ours.swa_hal_backend == "torch" for _, ours, _ in pairs)
    for kind in kinds_for(variant):
        for i in range(TORCH_BATCHES):
            native, ours, cfg = pairs[i % len(pairs)]
            batch, ranges = H.draw(cfg, rng, kind, replay=0.5)
            actual = None
            if kind == "padded" and i % 2:  # vLLM V1 padding: rows past num_actual_tokens
                actual = int(batch.query_start_loc_cpu[-1])
            got_native, got_ours = build_both(native, ours, batch, ranges, num_actual_tokens=actual)
            assert type(got_ours) is type(got_native)
            diffs = H.compare(got_native, got_ours, batch, **chunk_args(variant))
            assert not diffs, f"{type(native).__name__} {kind} #{i}:\n" + "\n".join(diffs)
            tally(kind, batch, ranges, got_native)
            COUNTS["backend:torch"] += 1


@pytest.mark.parametrize("backend", sorted(TRITON_BACKENDS))
@pytest.mark.parametrize("variant", PARITY_VARIANTS)
def test_parity_triton_backends(plugin_log, vllm_configs, rocm, variant, backend):
    rng = random.Random(f"{SEED}-{variant}-{backend}")
    pairs = [
        builders(n, variant, vllm_configs, backend=backend, platform=TRITON_BACKENDS[backend])
        for n in natives_for(variant, rocm)
    ]
    assert all(ours.swa_hal_backend == backend for _, ours, _ in pairs)
    for j, kind in enumerate(kinds_for(variant)):
        for i in range(TRITON_BATCHES):
            native, ours, cfg = pairs[(i + j) % len(pairs)]
            batch, ranges = H.draw(cfg, rng, kind, replay=0.5)
            got_native, got_ours = build_both(native, ours, batch, ranges)
            diffs = H.compare(got_native, got_ours, batch, **chunk_args(variant))
            assert not diffs, f"{backend} {type(native).__name__} {kind} #{i}:\n" + "\n".join(diffs)
            tally(kind, batch, ranges, got_native)
            COUNTS[f"backend:{backend}"] += 1


# -- prefill context parallelism --------------------------------------------------------------

PCP_VARIANTS = ["v41_w8b4", "v41_mtp1_w7b16", "v41_dspark2_w6b4"]
PCP_BATCHES = 2  # per (variant, kind, size), each built on every rank


def pcp_kinds(variant_name):
    # No "padded": under PCP vLLM pads each rank's rows itself (the partition makes them).
    return [k for k in kinds_for(variant_name) if k != "padded"]


class PCPRanks:
    """A native and a swa_hal builder per PCP rank, under vLLM's V4.1 module's ``get_pcp_group`` faked
    per rank: each rank's builds run in this one process, its all-gather of positions answered from
    every rank's positions of the current step."""

    # The group vLLM's V4.1 module sees now (one for all instances: one accessor is patched).
    active: H.FakePCPGroup | None = None

    def __init__(self, monkeypatch, native_cls, variant, vllm_configs, pcp, **swa_hal_kw):
        self.pcp = pcp
        self.groups = [H.FakePCPGroup(r, [torch.zeros(0, dtype=torch.int64)] * pcp) for r in range(pcp)]
        monkeypatch.setattr(v41_sparse_mla, "get_pcp_group", lambda: PCPRanks.active)
        self.pairs = []
        with pcp_config(vllm_configs[variant], pcp):
            for group in self.groups:
                PCPRanks.active = group
                self.pairs.append(builders(native_cls, variant, vllm_configs, **swa_hal_kw)[:2])

    def build(self, ranks):
        """Every rank's (native, swa_hal) metadata of one step (``H.pcp_partition``'s ranks)."""
        positions = [r.positions for r in ranks]
        out = []
        for r, group, (native, ours) in zip(ranks, self.groups, self.pairs):
            group.positions = positions
            PCPRanks.active = group
            cms = [H.common_metadata(r.batch, num_actual_tokens=r.num_actual_tokens, **r.cm_kwargs) for _ in range(2)]
            before = group.gathers
            got = (
                native.build(0, cms[0], replay_start=r.batch.replay_start),
                ours.build(0, cms[1], replay_start=r.batch.replay_start),
            )
            assert group.gathers == before + 2, "each build all-gathers the positions once"
            out.append(got)
        return out


def pcp_diffs(rank, got_native, got_ours, variant, swa_config):
    """``H.compare`` over the rank's own rows, plus the fields V4.1 adds under PCP: ``cache_slot_mapping``
    the whole gathered slot mapping (the step's own tensor), ``cache_positions`` every rank's positions."""
    diffs = H.compare(got_native, got_ours, rank.batch, **chunk_args(variant))
    rows = rank.batch.slot_mapping.shape[0]
    for md, who in ((got_native, "native"), (got_ours, "swa_hal")):
        if md.is_valid_token.shape[0] != rows:
            diffs.append(f"{who} is_valid_token has {md.is_valid_token.shape[0]} rows, the rank has {rows}")
        if md.slot_mapping.shape[0] != rows:
            diffs.append(f"{who} slot_mapping has {md.slot_mapping.shape[0]} rows, the rank has {rows}")
        if md.cache_slot_mapping is not rank.gathered_slots:
            diffs.append(f"{who} cache_slot_mapping is not the gathered slot mapping")
    if not torch.equal(got_native.cache_positions, got_ours.cache_positions):
        diffs.append(f"cache_positions: {got_native.cache_positions.tolist()} vs {got_ours.cache_positions.tolist()}")
    return diffs + reference_diffs(rank, got_native, swa_config)


def reference_diffs(rank, native, swa_config):
    """docs/semantics.md #context-parallel-ranks: the reference over the rank-local batch is the rank's
    metadata (vLLM's rows cover its first num_actual_tokens rows, is_valid_token every row)."""
    ref = build_reference(swa_config, rank.batch)
    ndt, npt, npf = native.num_decode_tokens, native.num_prefill_tokens, native.num_prefills
    pairs = [("is_valid_token", native.is_valid_token, ref.is_valid)]
    if ndt:  # (an empty rank's zero decode rows have the causal width in vLLM, whatever `causal` says)
        pairs += [
            ("decode_swa_indices", native.decode_swa_indices, ref.decode_indices[:ndt]),
            ("decode_swa_lens", native.decode_swa_lens, ref.decode_lens[:ndt]),
        ]
    if npt:
        pairs += [
            ("prefill_swa_indices", native.prefill_swa_indices, ref.prefill_indices[:npt]),
            ("prefill_swa_lens", native.prefill_swa_lens, ref.prefill_lens[:npt]),
            ("prefill_gather_lens", native.prefill_gather_lens, ref.prefill_gather_lens[:npf]),
        ]
    return [f"reference {name}: {a.tolist()} vs {b.tolist()}" for name, a, b in pairs if not _same(a, b)]


def pcp_ranks_of(cfg, batch, pcp, **kw):
    """vLLM's ``PCPManager`` cut of ``batch`` into ``pcp`` ranks (``H.pcp_partition``) under ``cfg``'s limits."""
    return H.pcp_partition(
        batch,
        pcp,
        decode_threshold=cfg.decode_threshold,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        **kw,
    )


def pcp_parity(monkeypatch, vllm_configs, rocm, variant, pcp, seed, batches, **swa_hal_kw):
    rng = random.Random(seed)
    natives = natives_for(variant, rocm)
    ranks_by_native = [PCPRanks(monkeypatch, n, variant, vllm_configs, pcp, **swa_hal_kw) for n in natives]
    cfg = H.swa_config_for(ALL_VARIANTS[variant], vllm_configs[variant])
    for j, kind in enumerate(pcp_kinds(variant)):
        for i in range(batches):
            per_rank = ranks_by_native[(i + j) % len(natives)]
            batch, _ = H.draw(cfg, rng, kind, replay=0.5)
            # PCP-only serving owns each decode on one rank; with DCP every rank runs it (and short
            # prefills), and only rank 0 writes the replicated rows.
            shard = (i + j) % 2 == 0
            ranks = pcp_ranks_of(
                cfg,
                batch,
                pcp,
                shard_decode_requests=shard,
                dcp=1 if shard else pcp,
            )
            for rank, (got_native, got_ours) in zip(ranks, per_rank.build(ranks)):
                assert type(got_ours) is type(got_native)
                diffs = pcp_diffs(rank, got_native, got_ours, variant, per_rank.pairs[0][1].swa_config)
                name = type(per_rank.pairs[0][0]).__name__
                assert not diffs, f"PCP={pcp} rank {rank.rank} {name} {kind} #{i} shard={shard}:\n" + "\n".join(diffs)
                COUNTS[f"pcp{pcp}_rank_builds"] += 1
                COUNTS["pcp_prefill_rank_builds"] += got_native.num_prefills > 0
                COUNTS["pcp_rank_builds_with_unwritten_rows"] += bool((rank.batch.slot_mapping < 0).any())


@pytest.mark.parametrize("pcp", [2, 4])
@pytest.mark.parametrize("variant", PCP_VARIANTS)
def test_pcp_parity_torch_backend(plugin_log, vllm_configs, rocm, monkeypatch, variant, pcp):
    pcp_parity(
        monkeypatch, vllm_configs, rocm, variant, pcp, f"{SEED}-pcp{pcp}-{variant}", PCP_BATCHES, backend="torch"
    )


@pytest.mark.parametrize("pcp", [2, 4])
def test_pcp_parity_cuda_backend(plugin_log, vllm_configs, rocm, monkeypatch, pcp):
    pcp_parity(
        monkeypatch,
        vllm_configs,
        rocm,
        "v41_mtp1_w7b16",
        pcp,
        f"{SEED}-pcp{pcp}-cuda",
        1,
        backend="cuda",
        platform=TRITON_BACKENDS["cuda"],
    )


@pytest.mark.parametrize("backend", ["torch", "cuda"])
@pytest.mark.parametrize("pcp", [2, 4])
def test_pcp_rank_with_two_segments_of_every_request(plugin_log, vllm_configs, rocm, monkeypatch, pcp, backend):
    """max_num_seqs prefills, each long enough for all 2P chunks: every rank's batch holds two segments
    of each, 2 * max_num_seqs requests, which vLLM's V4.1 builder takes and so must swa_hal's."""
    variant = "v41_w8b4"
    v = ALL_VARIANTS[variant]
    cfg = H.swa_config_for(v, vllm_configs[variant])
    n = cfg.max_num_seqs
    query_lens = [4 * pcp] * n  # 2P whole chunks of 2 tokens: longer than a decode, none empty
    seq_lens = [q + 3 * r for r, q in enumerate(query_lens)]
    pages = [-(-s // v.block_size) for s in seq_lens]
    width = max(pages)
    block_table = [[sum(pages[:r]) + i if i < pages[r] else 0 for i in range(width)] for r in range(n)]
    batch = AttentionBatch.from_lists(seq_lens, query_lens, block_table, block_size=v.block_size)
    ranks = H.pcp_partition(
        batch,
        pcp,
        decode_threshold=cfg.decode_threshold,
        max_num_seqs=n,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
    )
    assert all(r.batch.query_start_loc_cpu.shape[0] - 1 == 2 * n for r in ranks)
    kw = dict(backend=backend)
    if backend != "torch":
        kw["platform"] = TRITON_BACKENDS[backend]
    per_rank = PCPRanks(
        monkeypatch, v41_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder, variant, vllm_configs, pcp, **kw
    )
    for rank, (got_native, got_ours) in zip(ranks, per_rank.build(ranks)):
        assert got_native.num_prefills == 2 * n
        diffs = pcp_diffs(rank, got_native, got_ours, variant, per_rank.pairs[0][1].swa_config)
        assert not diffs, f"PCP={pcp} rank {rank.rank}:\n" + "\n".join(diffs)


DRAFT_VARIANTS = ["v4_w8b4", "v4_mtp2_w6b8", "v4_dspark3_w5b4", "v41_mtp1_w7b16", "v41_dspark2_w6b4"]


def advance_draft_step(batch: AttentionBatch, block_size: int) -> None:
    """A draft step (``H.moved_tokens``): the slots of the moved tokens (padding tokens keep slot -1)."""
    for r, t, pos in H.moved_tokens(batch):
        if batch.slot_mapping[t] >= 0:
            batch.slot_mapping[t] = int(batch.block_table[r, pos // block_size]) * block_size + pos % block_size


@pytest.mark.parametrize("backend", ["torch", *sorted(TRITON_BACKENDS)])
@pytest.mark.parametrize("variant", DRAFT_VARIANTS)
def test_parity_after_three_draft_steps(plugin_log, vllm_configs, rocm, variant, backend):
    rng = random.Random(f"{SEED}-{variant}-{backend}-draft")
    kw = {"backend": backend}
    if backend != "torch":
        kw["platform"] = TRITON_BACKENDS[backend]
    # vLLM's ROCm AITER builder keeps draft updates off (its own update leaves its ragged rows stale), so
    # its update is no reference: test_rocm_draft_updates_equal_a_fresh_build covers swa_hal's under it.
    natives = [n for n in natives_for(variant, rocm) if n.supports_draft_decode_metadata_update]
    kinds = ["decode", "mtp", "padded"] + (["dspark"] if ALL_VARIANTS[variant].dspark else [])
    for j, kind in enumerate(kinds):
        native_cls = natives[j % len(natives)]
        native, ours, cfg = builders(native_cls, variant, vllm_configs, **kw)
        assert ours.supports_draft_decode_metadata_update
        batch, ranges = H.draw(cfg, rng, kind, replay=0.5, extra_pages=1)
        got_native, got_ours = build_both(native, ours, batch, ranges)
        for step in range(1, 4):
            advance_draft_step(batch, cfg.block_size)
            native.update_draft_decode_metadata(got_native)
            ours.update_draft_decode_metadata(got_ours)
            diffs = H.compare(got_native, got_ours, batch, **chunk_args(variant))
            assert not diffs, f"{backend} {native_cls.__name__} {kind} step {step}:\n" + "\n".join(diffs)
        COUNTS["draft_updates"] += 3


def speculator_update(builder, metadata, spec):
    """A draft step's in-place update as vLLM's speculator runs it (``DraftModelSpeculator._update_draft_decode_metadata``:
    every attention group's ``update_draft_decode_metadata`` over the step's metadata by layer name), for
    one SWA group built by ``builder``; without DCP, so no DCP-local lengths are prepared."""
    import types

    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    (group,) = H.attention_groups([builder], H.StepLayout(1, (0,)), spec)[0]
    runner = types.SimpleNamespace(block_tables=types.SimpleNamespace(cp_size=1), attn_groups=[[group]])
    DraftModelSpeculator._update_draft_decode_metadata(runner, {group.layer_names[0]: metadata}, 0)


@pytest.mark.parametrize("backend", ["torch", "cuda"])
@pytest.mark.parametrize("pcp", [2, 4])
def test_pcp_dspark_draft_steps_through_the_speculator(plugin_log, vllm_configs, monkeypatch, pcp, backend):
    """V4.1 PCP with DSpark (reachable from vLLM 0.34: PCP ranks, fixed-length drafts): each rank builds its
    DSpark draft step's non-causal rows from its own chunk, then three draft steps update them in place
    through vLLM's speculator path. Every rank's metadata equals vLLM's own builder's after each step."""
    variant = "v41_dspark2_w6b4"
    kw = {"backend": backend, **({"platform": TRITON_BACKENDS[backend]} if backend != "torch" else {})}
    ranks_of = PCPRanks(
        monkeypatch, v41_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder, variant, vllm_configs, pcp, **kw
    )
    spec = H.make_kv_spec(ALL_VARIANTS[variant])
    cfg = H.swa_config_for(ALL_VARIANTS[variant], vllm_configs[variant])
    rng = random.Random(f"{SEED}-pcp{pcp}-dspark-{backend}")
    updated = 0
    for _ in range(2):
        batch, _ = H.draw(cfg, rng, "dspark", replay=0.5, extra_pages=1)
        ranks = pcp_ranks_of(cfg, batch, pcp)
        built = ranks_of.build(ranks)
        for rank, group, (native, ours), (got_native, got_ours) in zip(ranks, ranks_of.groups, ranks_of.pairs, built):
            assert not rank.batch.causal  # the draft step's non-causal rows
            if got_native.num_decode_tokens == 0:  # a rank that owns no draft request this step
                continue
            PCPRanks.active = group
            for step in range(1, 4):
                advance_draft_step(rank.batch, cfg.block_size)
                speculator_update(native, got_native, spec)
                speculator_update(ours, got_ours, spec)
                diffs = H.compare(got_native, got_ours, rank.batch, **chunk_args(variant))
                assert not diffs, f"PCP={pcp} rank {rank.rank} draft step {step}:\n" + "\n".join(diffs)
                updated += 1
    assert updated >= 3
    COUNTS["pcp_dspark_draft_updates"] += updated


def _advance_host_upper_bound(batch: AttentionBatch) -> None:
    """The drafter advances the host upper bound of seq_lens with the device values (a fresh build
    reads it); on the CPU the two may be one tensor."""
    if batch.seq_lens_cpu is not None and batch.seq_lens_cpu is not batch.seq_lens:
        batch.seq_lens_cpu.copy_(batch.seq_lens)


ROCM_DRAFT_VARIANTS = ["v4_mtp2_w6b8", "v4_dspark3_w5b4", "v41_mtp1_w7b16", "v41_dspark2_w6b4"]


@pytest.mark.parametrize("backend", ["torch", "rocm"])
@pytest.mark.parametrize("variant", ROCM_DRAFT_VARIANTS)
def test_rocm_draft_updates_equal_a_fresh_build(plugin_log, vllm_configs, rocm, variant, backend):
    """Under swa_hal, ROCm AITER's V4 and V4.1 builders update draft steps in place: after each of three
    draft steps the ragged rows, dense rows and lens equal a full build at the advanced lengths, by a
    second swa_hal builder and by vLLM's own ROCm builder, in the memory the first build handed out."""
    a4, a41 = rocm
    v41 = ALL_VARIANTS[variant].version == "deepseek_v41"
    native_cls = (
        a41.DeepseekV41ROCMAiterSparseSWAMetadataBuilder if v41 else a4.DeepseekV4ROCMAiterSparseSWAMetadataBuilder
    )
    kw = {"backend": backend, **({"platform": TRITON_BACKENDS[backend]} if backend != "torch" else {})}
    native, ours, cfg = builders(native_cls, variant, vllm_configs, **kw)
    _, fresh, _ = builders(native_cls, variant, vllm_configs, **kw)
    assert not native.supports_draft_decode_metadata_update
    assert ours.supports_draft_decode_metadata_update and ours.swa_hal_backend == backend
    rng = random.Random(f"{SEED}-{variant}-{backend}-rocm-draft")
    kinds = ["decode", "mtp", "padded"] + (["dspark"] if ALL_VARIANTS[variant].dspark else [])
    moved = 0
    for kind in kinds:
        # Decode-only steps: ROCm's ragged rows are the decodes'.
        batch, ranges = H.draw(cfg, rng, kind, replay=0.5, extra_pages=1, dspark_prefills=0)
        md = ours.build(0, H.common_metadata(batch, image_ranges=ranges), replay_start=batch.replay_start)
        assert md.num_prefills == 0 and md.num_decode_tokens > 0, kind
        ragged = (md.decode_swa_ragged_indices, md.decode_swa_ragged_indptr)
        addresses = [t.data_ptr() for t in ragged]
        for step in range(1, 4):
            before = [t.clone() for t in ragged]
            advance_draft_step(batch, cfg.block_size)
            _advance_host_upper_bound(batch)
            ours.update_draft_decode_metadata(md)
            assert [t.data_ptr() for t in (md.decode_swa_ragged_indices, md.decode_swa_ragged_indptr)] == addresses
            moved += any(not torch.equal(a, b) for a, b in zip(before, ragged))
            for name, builder in (("swa_hal", fresh), ("vLLM", native)):
                cm = H.common_metadata(batch, image_ranges=ranges)
                want = builder.build(0, cm, replay_start=batch.replay_start)
                diffs = H.compare(want, md, batch, **chunk_args(variant))
                assert not diffs, f"{backend} {kind} step {step}, against {name}'s build:\n" + "\n".join(diffs)
            COUNTS["rocm_draft_updates"] += 1
    # The rows did move: rows left as the first build made them would have failed above.
    assert moved > 0


@pytest.mark.parametrize("variant", ["v41_mtp1_w7b16", "v4_dspark3_w5b4"])
def test_cuda_graph_capture_dummy_batches(plugin_log, vllm_configs, rocm, variant):
    """vLLM captures graphs on dummy batches (InputBatch.make_dummy): seq_len == query_len, a zeroed
    block table, padding slots; ``build_for_cudagraph_capture`` gives what vLLM's builder gives."""
    cfg_v = ALL_VARIANTS[variant]
    for native_cls in natives_for(variant, rocm):
        native, ours, cfg = builders(native_cls, variant, vllm_configs, backend="torch")
        for num_reqs, q in ((1, 1), (5, 1), (4, cfg.decode_threshold), (3, cfg.decode_threshold + 3)):
            table = torch.zeros(num_reqs, 4, dtype=torch.int32)
            batch = AttentionBatch.from_lists([q] * num_reqs, [q] * num_reqs, table, block_size=cfg_v.block_size)
            for padding in (True, False):
                step = batch
                if padding:
                    step = dataclasses.replace(batch, slot_mapping=torch.full_like(batch.slot_mapping, -1))
                got_native = native.build_for_cudagraph_capture(H.common_metadata(step))
                got_ours = ours.build_for_cudagraph_capture(H.common_metadata(step))
                diffs = H.compare(got_native, got_ours, step, **chunk_args(variant))
                assert not diffs, f"{native_cls.__name__} {num_reqs}x{q} padding={padding}:\n" + "\n".join(diffs)


def test_fixed_addresses_across_builds(plugin_log, vllm_configs):
    """CUDA graphs replay against the addresses of the first build: every output lives in swa_hal's
    fixed buffers, the same memory at every build of the same shape."""
    native_cls = v41_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder
    _, ours, cfg = builders(native_cls, "v41_mtp1_w7b16", vllm_configs, backend="torch")
    seen = None
    for _ in range(3):
        batch = AttentionBatch.from_lists(
            [40, 90, 7], [2, 1, 2], torch.arange(30, dtype=torch.int32).view(3, 10), block_size=cfg.block_size
        )
        md = ours.build(0, H.common_metadata(batch))
        ptrs = tuple(
            getattr(md, f).data_ptr()
            for f in ("decode_swa_indices", "decode_swa_lens", "token_to_req_indices", "is_valid_token")
        )
        assert seen is None or ptrs == seen
        seen = ptrs
    buffers = ours.swa_hal.buffers
    assert md.decode_swa_indices.untyped_storage().data_ptr() == buffers.decode_indices.data_ptr()
    assert md.decode_swa_lens.untyped_storage().data_ptr() == buffers.decode_lens.data_ptr()


# -- vLLM's recorded metadata graphs (V4.1 specialized decode) ----------------------------------


def _metadata_graphs():
    import importlib

    return importlib.import_module(integ.METADATA_GRAPHS_MODULE)


def _attention_groups(builder_list):
    """vLLM's attention groups, one KV-cache group per builder (what ``can_record`` is handed)."""
    from vllm.v1.worker.utils import AttentionGroup

    spec = H.make_kv_spec(ALL_VARIANTS["v41_mtp1_w7b16"])
    return [
        [AttentionGroup(type(b), [f"model.layers.{i}.attn"], spec, i, metadata_builders=[b])]
        for i, b in enumerate(builder_list)
    ]


def test_recorded_metadata_graphs_stay_on_exactly_where_vllm_records(plugin_log, vllm_configs, rocm):
    """vLLM records a step's metadata build only when every group's builder is exactly a type it lists
    as recordable. Each mix of groups records with swa_hal's builders exactly when it records with
    vLLM's own in their place, on vLLM's own ``AttnMetadataCudaGraphs``."""
    from vllm.models.deepseek_v41.compressor import CompressorMetadataBuilder
    from vllm.models.deepseek_v41.sparse_mla import DeepseekV4SparseMLAMetadataBuilder
    from vllm.v1.attention.backends.mla.sparse_indexer import DeepseekV41SparseIndexerMetadataBuilder

    graphs = _metadata_graphs()
    _, a41 = rocm
    v41, v4 = "v41_mtp1_w7b16", "v4_mtp2_w6b8"
    swa = {  # (native, swa_hal) builder pairs of vLLM's SWA classes
        "flashinfer": builders(v41_flashinfer.DeepseekSparseSWAFlashInferMetadataBuilder, v41, vllm_configs)[:2],
        "flashmla": builders(v41_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder, v41, vllm_configs)[:2],
        "v41_base": builders(DeepseekV41SparseSWAMetadataBuilder, v41, vllm_configs)[:2],
        "rocm": builders(a41.DeepseekV41ROCMAiterSparseSWAMetadataBuilder, v41, vllm_configs)[:2],
        "v4_flashinfer": builders(v4_flashinfer.DeepseekSparseSWAFlashInferMetadataBuilder, v4, vllm_configs)[:2],
    }
    # The other groups' builders are vLLM's in both runs; only their exact type is read.
    other = {
        "compressor": object.__new__(CompressorMetadataBuilder),
        "indexer": object.__new__(DeepseekV41SparseIndexerMetadataBuilder),
        "mla": object.__new__(DeepseekV4SparseMLAMetadataBuilder),
    }
    mixes = [
        ["flashinfer"],
        ["flashinfer", "compressor", "indexer", "flashinfer"],
        ["flashmla"],
        ["v41_base"],
        ["rocm"],
        ["v4_flashinfer"],
        ["flashinfer", "flashmla"],
        ["flashinfer", "compressor", "mla"],
        ["compressor", "indexer"],
    ]
    outcomes = []
    for mix in mixes:
        native = [swa[n][0] if n in swa else other[n] for n in mix]
        ours = [swa[n][1] if n in swa else other[n] for n in mix]
        assert [integ.is_swa_hal_builder(type(b)) for b in ours] == [n in swa for n in mix]
        want = graphs.AttnMetadataCudaGraphs(vllm_configs[v41], 2).can_record(_attention_groups(native))
        got = graphs.AttnMetadataCudaGraphs(vllm_configs[v41], 2).can_record(_attention_groups(ours))
        assert got is want, mix
        outcomes.append(want)
    assert outcomes == [True, True, False, False, False, False, False, False, True]


def test_recordable_set_is_extended_once_and_given_back(plugin_log, monkeypatch):
    """Only the swa_hal counterparts of the SWA builders vLLM lists are added, once; ``unregister``
    gives vLLM its own set back; full validation (host reads at every build) keeps recording off."""
    graphs = _metadata_graphs()
    listed = graphs._RECORDABLE_BUILDERS
    ours = {cls for cls in listed if integ.is_swa_hal_builder(cls)}
    natives = {integ.native_builder_cls(cls) for cls in ours}
    assert natives == {v41_flashinfer.DeepseekSparseSWAFlashInferMetadataBuilder} and natives <= listed
    assert integ.register() is True and graphs._RECORDABLE_BUILDERS is listed  # idempotent
    integ.unregister()
    try:
        native = graphs._RECORDABLE_BUILDERS
        assert native == listed - ours and not any(integ.is_swa_hal_builder(cls) for cls in native)
        monkeypatch.setenv("SWA_HAL_DEBUG", "1")
        assert integ.register() is True
        assert graphs._RECORDABLE_BUILDERS is native
        integ.unregister()
    finally:
        monkeypatch.delenv("SWA_HAL_DEBUG", raising=False)
        integ.register()
    assert graphs._RECORDABLE_BUILDERS == listed


@pytest.mark.parametrize("backend", ["torch", "cuda"])
@pytest.mark.parametrize("variant, causal", [("v41_mtp1_w7b16", True), ("v41_dspark2_w6b4", False)])
def test_recordable_swa_hal_builds_replay_valid(plugin_log, vllm_configs, variant, causal, backend):
    """A recorded build replays the kernels of its capture, against the addresses of then, and the
    runner hands out the metadata recorded with it. So for every swa_hal builder vLLM records: two builds
    of one graph key (uniform decode, same shapes) over the same input buffers with other values write
    the same memory, which then holds the second build's values, equal to vLLM's own build of them."""
    graphs = _metadata_graphs()
    recordable = [cls for cls in graphs._RECORDABLE_BUILDERS if integ.is_swa_hal_builder(cls)]
    assert recordable
    kw = {"backend": backend, **({"platform": TRITON_BACKENDS[backend]} if backend != "torch" else {})}
    for cls in recordable:
        native, ours, cfg = builders(integ.native_builder_cls(cls), variant, vllm_configs, **kw)
        assert type(ours) is cls
        q = cfg.decode_threshold
        table = torch.arange(120, dtype=torch.int32).view(3, 40)
        inputs = AttentionBatch.from_lists([40, 90, 7], [q] * 3, table, block_size=cfg.block_size, causal=causal)
        first = ours.build(0, H.common_metadata(inputs))
        tensors = {
            f.name: getattr(first, f.name)
            for f in dataclasses.fields(first)
            if isinstance(getattr(first, f.name), torch.Tensor)
        }
        named = {"decode_swa_indices", "decode_swa_lens", "token_to_req_indices", "is_valid_token"}
        if not causal:  # FlashInfer's own buffers, filled for DSpark rows only
            named |= {"flashinfer_decode_topk_lens", "flashinfer_decode_seq_lens"}
        assert named <= tensors.keys()
        addresses = {name: t.data_ptr() for name, t in tensors.items()}
        recorded = {name: t.clone() for name, t in tensors.items()}
        # The next step of the same key: new values in the same input buffers.
        step = AttentionBatch.from_lists(
            [61, 12, 150],
            [q] * 3,
            torch.arange(120, 0, -1, dtype=torch.int32).view(3, 40),
            block_size=cfg.block_size,
            causal=causal,
        )
        for name in ("seq_lens", "query_start_loc", "block_table", "slot_mapping"):
            getattr(inputs, name).copy_(getattr(step, name))
        if inputs.seq_lens_cpu is not None and inputs.seq_lens_cpu is not inputs.seq_lens:
            inputs.seq_lens_cpu.copy_(step.seq_lens_cpu)
        second = ours.build(0, H.common_metadata(inputs))
        for name, t in tensors.items():
            other = getattr(second, name)
            assert isinstance(other, torch.Tensor) and other.data_ptr() == addresses[name], name
            assert other.shape == t.shape and torch.equal(t, other), name  # the recorded metadata sees them
        assert not torch.equal(recorded["decode_swa_indices"], tensors["decode_swa_indices"])
        assert not torch.equal(recorded["decode_swa_lens"], tensors["decode_swa_lens"])
        want = native.build(0, H.common_metadata(inputs))
        diffs = H.compare(want, first, inputs, **chunk_args(variant))
        assert not diffs, "\n".join(diffs)


# -- one adapter, one padding rule, one field map -------------------------------------------------


def _same(a, b):
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.equal(a, b)
    return a is b or (not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor) and a == b)


def _padded_batches(cfg, rng):
    """Padded batches (padding rows past the scheduled tokens, zero-length padding requests): decode
    only, MTP, and mixed (the padding rows go with the prefills)."""
    from swa_hal.scenarios import synthesize_batch

    thr = cfg.decode_threshold
    yield H.draw(cfg, rng, "padded", replay=0.5)[0]
    for queries in ([1, thr, 1], [thr, thr + 3, 1, thr + 1]):
        seqs = [q + rng.randint(0, 3 * cfg.window_size) for q in queries]
        yield synthesize_batch(cfg, seqs + [0], queries + [0], rng=rng, padding_rows=rng.randint(1, 9))


@pytest.mark.parametrize("backend", ["torch", "cuda"])
@pytest.mark.parametrize("variant", ["v4_w8b4", "v41_mtp1_w7b16"])
def test_padding_rows_both_adapters_equal_the_reference(plugin_log, vllm_configs, variant, backend):
    """The generic EngineSWABuilder and the vLLM builder read one padded batch's CommonAttentionMetadata
    through the one adapter (``engine.batch_from_common_metadata``) and its padding rule: both equal the
    reference (swa_hal/reference.py) on every row, padding rows included (request 0, invalid, empty
    rows; docs/semantics.md #per-token-helpers, vector C2). vLLM's metadata, read back through the field
    map, is the first ``num_actual_tokens`` rows of it (all of them when vLLM counts the padding, as its
    runner does), with ``is_valid_token`` over every slot row; vLLM's own builder gives the same."""
    from swa_hal import PlatformInfo, SWAMetadata
    from swa_hal.integrations import EngineSWABuilder
    from swa_hal.integrations import vllm_builder as VB
    from swa_hal.testing import compare_with_reference

    kw = {"backend": backend, **({"platform": TRITON_BACKENDS[backend]} if backend != "torch" else {})}
    native_cls = (V41_NATIVES if ALL_VARIANTS[variant].version == "deepseek_v41" else V4_NATIVES)[0]
    native, ours, _ = builders(native_cls, variant, vllm_configs, **kw)
    config = ours.swa_config
    platform = PlatformInfo.from_assume(kw["platform"]) if "platform" in kw else None
    engine = EngineSWABuilder(config, "cpu", backend=backend, platform=platform)
    rng = random.Random(f"{SEED}-{variant}-{backend}-padding")
    for batch in _padded_batches(config, rng):
        scheduled = int(batch.query_start_loc_cpu[-1])
        assert batch.num_tokens > scheduled
        for actual in (batch.num_tokens, scheduled):
            cm = H.common_metadata(batch, num_actual_tokens=actual)
            md_engine = engine.build(0, cm, replay_start=batch.replay_start)
            assert not compare_with_reference(config, batch, md_engine)
            pad = slice(scheduled, batch.num_tokens)
            assert not md_engine.is_valid_token[pad].any() and (md_engine.token_to_req_indices[pad] == 0).all()

            got = ours.build(0, cm, replay_start=batch.replay_start)
            back = ours.swa_hal_metadata(got)
            want = VB.engine_rows(md_engine, actual)
            for theirs, name in VB.FIELDS + (VB.PREFILL_FIELDS if want.num_prefills else ()):
                assert _same(getattr(want, name), getattr(back, name)), f"{theirs}: {actual}/{batch.num_tokens} rows"
            assert isinstance(back, SWAMetadata) and back.is_valid_token.shape[0] == batch.num_tokens
            if actual == batch.num_tokens:
                assert not compare_with_reference(config, batch, back)
            cm_native = H.common_metadata(batch, num_actual_tokens=actual)
            got_native = native.build(0, cm_native, replay_start=batch.replay_start)
            diffs = H.compare(got_native, got, batch, **chunk_args(variant))
            assert not diffs, "\n".join(diffs)


def test_one_field_list_maps_both_directions(plugin_log, vllm_configs):
    """``FIELDS`` / ``PREFILL_FIELDS`` name real fields on both sides, cover every field vLLM's base
    build fills (the tile schedulers aside: vLLM's own planner objects), and the two directions made
    from them are each other's inverse."""
    from swa_hal import SWAMetadata
    from swa_hal.integrations import vllm_builder as VB

    pairs = VB.FIELDS + VB.PREFILL_FIELDS
    theirs = {f.name: f for f in dataclasses.fields(sparse_swa.DeepseekSparseSWAMetadata)}
    ours_names = {f.name for f in dataclasses.fields(SWAMetadata)}
    assert all(t in theirs and o in ours_names for t, o in pairs)
    assert len({t for t, _ in pairs}) == len({o for _, o in pairs}) == len(pairs)
    native, ours, cfg = builders(sparse_swa.DeepseekSparseSWAMetadataBuilder, "v4_mtp2_w6b8", vllm_configs)
    batch, _ = H.draw(cfg, random.Random(SEED), "mixed", replay=1.0)
    md_native = native.build(0, H.common_metadata(batch), replay_start=batch.replay_start)
    assert md_native.num_prefills and md_native.num_decodes

    def filled(field):
        value, default = getattr(md_native, field.name), field.default
        return (
            field.default is dataclasses.MISSING
            and field.default_factory is dataclasses.MISSING
            or (
                value is not None
                and not isinstance(value, dict)
                and (isinstance(value, torch.Tensor) or value != default)
            )
        )

    filled_names = {n for n, f in theirs.items() if filled(f) and not n.startswith("tile_sched_")}
    assert filled_names <= {t for t, _ in pairs}, filled_names - {t for t, _ in pairs}
    got = ours.build(0, H.common_metadata(batch), replay_start=batch.replay_start)
    back = ours.swa_hal_metadata(got)
    again = VB.to_vllm(back)
    assert again.keys() == {t for t, _ in pairs}
    assert all(again[t] is getattr(got, t) for t in again if isinstance(again[t], torch.Tensor))
    assert all(_same(again[t], getattr(got, t)) for t in again)
    assert VB.from_vllm(got).keys() == {o for _, o in pairs}


# -- where vLLM's builder is unsafe, swa_hal's documented behaviour -----------------------------


def _replay_past_position(cfg):
    batch = AttentionBatch.from_lists(
        [20, 30],
        [1, 1],
        torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]], dtype=torch.int32),
        block_size=cfg.block_size,
    )
    # Request 0's only token is at position 19; a replay bound of 25 lies past it.
    return dataclasses.replace(batch, replay_start=torch.tensor([25, 10], dtype=torch.int32))


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_replay_start_past_a_position_native_negative_lens_swa_hal_empty_row(plugin_log, vllm_configs, backend):
    kw = {"backend": backend, **({"platform": TRITON_BACKENDS[backend]} if backend != "torch" else {})}
    native, ours, cfg = builders(DeepseekV41SparseSWAMetadataBuilder, "v41_w8b4", vllm_configs, **kw)
    batch = _replay_past_position(cfg)
    got_native, got_ours = build_both(native, ours, batch, None)
    assert got_native.decode_swa_lens[0] == 20 - 25  # vLLM: a negative length reaches the kernel
    assert got_ours.decode_swa_lens[0] == 0  # swa_hal: an empty row, never a negative length
    assert (got_ours.decode_swa_indices[0] == -1).all()
    # The guarded build recorded why; the engine may ask when it chooses (one host sync).
    with pytest.raises(BatchRangeError, match="replay_start"):
        ours.swa_hal.check()
    # Request 1 (bound 10 below its window) is the same in both.
    assert torch.equal(got_native.decode_swa_lens[1], got_ours.decode_swa_lens[1])
    assert torch.equal(got_native.decode_swa_indices[1], got_ours.decode_swa_indices[1])
    # With validation on, swa_hal names the bad input instead.
    _, strict, _ = builders(DeepseekV41SparseSWAMetadataBuilder, "v41_w8b4", vllm_configs, validate=True, **kw)
    with pytest.raises(BatchRangeError, match="replay_start"):
        strict.build(0, H.common_metadata(batch), replay_start=batch.replay_start)


# -- guard violations in vLLM's log ----------------------------------------------------------------

SEQ_SHORT_LINE = (
    "swa_hal: a guarded build handed out empty rows: BatchRangeError: seq_lens[1]=3 is shorter than its query "
    "length (found by a guarded build, which handed the offending rows out empty) [field=seq_lens request=1 "
    "value=3]; logged once per kind, SWA_HAL_STRICT=1 raises instead"
)


def _vllms_builder(vllm_configs, backend):
    """The builder vLLM makes for a V4.1 FlashMLA SWA layer: the class its backend hands out."""
    cls = v41_flashmla.DeepseekSparseSWAFlashMLABackend.get_builder_cls()
    assert integ.is_swa_hal_builder(cls)
    kw = {"backend": backend, **({"platform": TRITON_BACKENDS[backend]} if backend != "torch" else {})}
    v = ALL_VARIANTS["v41_w8b4"]
    return cls(H.make_kv_spec(v), ["model.layers.0.attn.swa_cache"], vllm_configs["v41_w8b4"], CPU, **kw)


def _steps(block_size):
    """A clean step (a decode and a prefill) and malformed ones: request 1's seq_len 3 shorter than its 5
    new tokens; request 0's window reading block id -3."""
    table = torch.arange(16, dtype=torch.int32).view(2, 8)
    good = AttentionBatch.from_lists([20, 30], [1, 5], table, block_size=block_size)
    short = dataclasses.replace(good, seq_lens=torch.tensor([20, 3], dtype=torch.int32))
    bad_table = table.clone()
    bad_table[0, 4] = -3
    negative = dataclasses.replace(good, block_table=bad_table)
    return good, short, negative


@pytest.fixture
def swa_hal_warnings(caplog):
    """The plugin's warnings, each once (vLLM's logging may cut its loggers off from caplog's root)."""
    with logged_warnings(caplog, "vllm.plugins.swa_hal") as warnings:
        yield warnings


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_guard_violation_reaches_vllms_log_a_build_later(plugin_log, vllm_configs, swa_hal_warnings, backend):
    """vLLM never calls check(): the swa_hal builder's build polls the violation record without a sync and
    logs the typed error once per kind, naming the field, request and value, through the plugin's logger."""
    builder = _vllms_builder(vllm_configs, backend)
    good, short, negative = _steps(builder.swa_config.block_size)
    for _ in range(2):
        builder.build(0, H.common_metadata(good))
    assert swa_hal_warnings() == []
    md = builder.build(0, H.common_metadata(short))
    assert int(md.prefill_swa_lens[:5].abs().sum()) == 0  # request 1's rows handed out empty
    assert swa_hal_warnings() == []  # a build later, never by a sync in this one
    builder.build(0, H.common_metadata(good))
    assert swa_hal_warnings() == [SEQ_SHORT_LINE]
    for _ in range(2):  # the same kind again: not logged again
        builder.build(0, H.common_metadata(short))
    builder.build(0, H.common_metadata(good))
    assert swa_hal_warnings() == [SEQ_SHORT_LINE]
    builder.build(0, H.common_metadata(negative))
    builder.build(0, H.common_metadata(good))
    got = swa_hal_warnings()
    assert len(got) == 2 and "[field=block_table request=0 value=-3]" in got[1], got
    assert "BatchRangeError: block_table: request 0's window reads block id -3" in got[1]


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_guard_violation_raises_at_the_next_vllm_build_when_strict(
    plugin_log, vllm_configs, swa_hal_warnings, monkeypatch, backend
):
    monkeypatch.setenv("SWA_HAL_STRICT", "1")
    builder = _vllms_builder(vllm_configs, backend)
    good, short, negative = _steps(builder.swa_config.block_size)
    builder.build(0, H.common_metadata(good))
    builder.build(0, H.common_metadata(short))
    with pytest.raises(BatchRangeError, match=r"seq_lens\[1\]=3 is shorter than its query length") as info:
        builder.build(0, H.common_metadata(good))
    assert info.value.field == "seq_lens" and info.value.index == 1
    builder.build(0, H.common_metadata(good))  # raised once
    builder.build(0, H.common_metadata(negative))
    with pytest.raises(BatchRangeError, match="block id -3") as info:
        builder.build(0, H.common_metadata(good))
    assert info.value.field == "block_table" and info.value.index == 0
    assert swa_hal_warnings() == []


def test_dspark_row_wider_than_its_width_native_cuts_swa_hal_empties_and_records(plugin_log, vllm_configs):
    native, ours, cfg = builders(
        sparse_swa.DeepseekSparseSWAMetadataBuilder, "v4_dspark3_w61b16", vllm_configs, backend="torch"
    )
    assert cfg.noncausal_index_width == native.noncausal_index_width == 64
    table = torch.arange(40, dtype=torch.int32).view(2, 20)
    batch = dataclasses.replace(
        AttentionBatch.from_lists([200, 150], [4, 2], table, block_size=cfg.block_size), causal=False
    )
    got_native = native.build(0, H.common_metadata(batch))
    # vLLM: 4 + 61 = 65 entries claimed in a 64-wide row; the 65th is silently dropped.
    assert int(got_native.decode_swa_lens[0]) == 65 > got_native.decode_swa_indices.shape[-1] == 64
    # swa_hal: the row's width is the device length's (a decode's seq_lens_cpu is only an upper bound,
    # docs/semantics.md #dspark-rows): request 0's rows are emptied and recorded, never cut; request 1's fit.
    got = ours.build(0, H.common_metadata(batch))
    assert got.decode_swa_lens.tolist() == [0, 0, 0, 0, 63, 63]
    with pytest.raises(SpeculativeModeError, match="^request 0: its row needs 65 entries, wider than the row; refusing"):
        ours.swa_hal.check()


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_image_ranges_of_the_whole_prompt(plugin_log, vllm_configs, backend):
    """vLLM's ``mm_req_doc_ranges`` lists every image of a request: one an earlier chunk prefilled, one
    over this step's tokens, one still to come. Only the images over the new tokens shape the rows."""
    kw = {"backend": backend, **({"platform": TRITON_BACKENDS[backend]} if backend != "torch" else {})}
    native, ours, cfg = builders(sparse_swa.DeepseekSparseSWAMetadataBuilder, "v4_vision_w6b4", vllm_configs, **kw)
    table = torch.arange(60, dtype=torch.int32).view(2, 30)
    batch = AttentionBatch.from_lists([40, 30], [10, 12], table, block_size=cfg.block_size)
    ranges = {0: [(5, 9), (32, 35)], 1: [(2, 6), (20, 24), (31, 40)]}
    got_native, got_ours = build_both(native, ours, batch, ranges)
    assert got_native.prefill_left_visible is not None and int(got_native.prefill_left_visible.max()) > 0
    diffs = H.compare(got_native, got_ours, batch)
    assert not diffs, "\n".join(diffs)


def test_vllms_own_cpu_builder_fails_swa_hals_builds(plugin_log, vllm_configs):
    """vLLM 0.33.0's CPU subclass returns three tile-scheduler slots; its base build reads five
    (KeyError 'c1a') on every build. The swa_hal builder under the same subclass fills all five."""
    native, ours, cfg = builders(DeepseekV4CPUSparseSWAMetadataBuilder, "v4_w8b4", vllm_configs, backend="torch")
    batch, _ = H.draw(cfg, random.Random(SEED), "mixed")
    with pytest.raises(KeyError, match="c1a"):
        native.build(0, H.common_metadata(batch))
    md = ours.build(0, H.common_metadata(batch))
    assert all(getattr(md, f"tile_sched_{k}") is None for k in ("swaonly", "c4a", "c128a", "c1a", "c2a"))
    reference, _, _ = builders(sparse_swa.DeepseekSparseSWAMetadataBuilder, "v4_w8b4", vllm_configs)
    expected = reference.build(0, H.common_metadata(batch))
    diffs = [d for d in H.compare(expected, md, batch) if not d.startswith("tile_sched_")]
    assert not diffs, "\n".join(diffs)


# -- step builds: one build per model-runner step for every SWA group -------------------------------

STEP_VARIANTS = ["v4_w8b4", "v4_mtp2_w6b8", "v4_dspark3_w5b4", "v41_w8b4", "v41_mtp1_w7b16", "v41_dspark2_w6b4"]
# Steps per variant and layout: through the torch backend (6 variants: 216 steps) and through the cuda
# Triton backend in the interpreter (6 variants: 36 steps). Each layout's builders serve a run of steps,
# as in an engine: two and three SWA groups, then four to eight. The expected values are vLLM's own
# builds, group by group, its kernels in the interpreter: what the time goes into.
STEP_STEPS = {"torch": (14, 14, 8), "cuda": (2, 2, 2)}
# Small steps (the interpreter's time grows with the tokens); every kind still has decodes and prefills.
STEP_BATCH = dict(max_tokens=24, max_reqs=8, max_context=200)


def step_kinds(variant_name):
    kinds = ["decode", "mixed", "mtp", "padded"]
    return kinds + (["dspark"] if ALL_VARIANTS[variant_name].dspark else [])


class Calls:
    """Calls of swa_hal's builds, group builds and updates, and of a backend's computes, by name."""

    def __init__(self, monkeypatch):
        from swa_hal.builder import SWAMetadataBuilder

        self.n = {}
        for name in ("build", "build_groups", "update_draft_decode_metadata", "_update_groups"):
            self._count(monkeypatch, SWAMetadataBuilder, name)

    def _count(self, monkeypatch, cls, name):
        original = getattr(cls, name)

        def counted(*args, **kwargs):
            self.n[name] = self.n.get(name, 0) + 1
            return original(*args, **kwargs)

        monkeypatch.setattr(cls, name, counted)

    def launches(self, backend):
        """Count the group computes of ``backend`` (an instance) and, on a Triton backend, its kernel
        launches (the torch backend computes group after group: one call, no launch to count)."""
        for name in ("compute_groups", "_launch") if hasattr(backend, "_launch") else ("compute_groups",):
            original = getattr(backend, name)

            def counted(*args, _name=name, _original=original, **kwargs):
                self.n["launch:" + _name] = self.n.get("launch:" + _name, 0) + 1
                return _original(*args, **kwargs)

            setattr(backend, name, counted)

    def take(self):
        n, self.n = self.n, {}
        return n


class StepRig:
    """One layout's groups twice: vLLM's own builders (the expected values) and the swa_hal builders vLLM
    gets for the same class, each in its attention groups, and the model state of the variant."""

    def __init__(self, variant_name, vllm_configs, native_cls, layout, **swa_hal_kw):
        v = ALL_VARIANTS[variant_name]
        vc = vllm_configs[variant_name]
        spec = H.make_kv_spec(v)
        n = len(layout.swa)
        names = [[f"model.layers.{j}.attn.swa_cache"] for j in range(n)]
        self.natives = [native_cls(spec, names[j], vc, CPU) for j in range(n)]
        ours_cls = integ.swa_hal_builder_cls(native_cls)
        self.ours = [ours_cls(spec, names[j], vc, CPU, **swa_hal_kw) for j in range(n)]
        H.force_rocm_ragged_prefill(*self.natives, *self.ours)
        self.native_groups = H.attention_groups(self.natives, layout, spec)
        self.our_groups = H.attention_groups(self.ours, layout, spec)
        self.layout, self.variant, self.vc = layout, v, vc
        self.cfg = H.swa_config_for(v, vc)

    def draw(self, rng, kind):
        """A step of ``kind``: the batch, vLLM's inputs for it and its model state."""
        batch, _ = H.draw(self.cfg, rng, kind, replay=0.5, extra_pages=1, **STEP_BATCH)
        tables, slots = H.step_inputs(batch, self.layout, self.cfg.block_size, rng, extra_tokens=rng.randint(0, 3))
        t = slots.shape[1]
        # vLLM's num_actual_tokens counts the padding rows; a padded step also without them.
        num_tokens = int(batch.query_start_loc_cpu[-1]) if kind == "padded" and rng.random() < 0.5 else t
        ib = H.input_batch(batch, num_tokens, self.cfg.decode_threshold, H.token_positions(batch))
        cacheable = tuple(i for i in range(self.layout.num_kv_groups) if rng.random() < 0.5)
        state = H.model_state(self.variant.version, self.vc, window=self.variant.window, cacheable=cacheable)
        return batch, tables, slots, ib, state

    def build(self, groups, batch, tables, slots, ib, state, *, causal=True, for_capture=False, ranges=None):
        """The step's metadata by layer: vLLM's ``prepare_attn``; a non-causal (DSpark) step, or one with
        image ranges, as vLLM's drafter module builds it: its ``build_attn_metadata``, by keyword."""
        if causal and ranges is None:
            return H.prepare_attn(
                state, ib, tables, slots, groups, self.layout, batch.replay_start, for_capture=for_capture
            )
        from vllm.models.deepseek_v41.nvidia.model_state import ReplayAttnMetadata
        from vllm.v1.worker.gpu.spec_decode import speculator

        num_reqs = ib.num_reqs
        extra = {}
        if batch.replay_start is not None:
            extra["model_specific_attn_metadata"] = ReplayAttnMetadata(batch.replay_start)
        return speculator.build_attn_metadata(
            attn_groups=groups,
            num_reqs=num_reqs,
            num_tokens=ib.num_tokens,
            query_start_loc_gpu=ib.query_start_loc,
            query_start_loc_cpu=torch.from_numpy(ib.query_start_loc_np),
            max_query_len=ib.max_query_len,
            seq_lens=ib.seq_lens,
            max_seq_len=int(ib.seq_lens_cpu_upper_bound.max()),
            block_tables=tables,
            slot_mappings=slots,
            kv_cache_config=H.kv_cache_config(self.layout),
            seq_lens_cpu_upper_bound=ib.seq_lens_cpu_upper_bound,
            causal=causal,
            mm_req_doc_ranges=ranges,
            **extra,
        )

    def diffs(self, want, got, batch, tables, slots, variant_name):
        out = []
        for j, i in enumerate(self.layout.swa):
            name = f"model.layers.{j}.attn.swa_cache"
            step = dataclasses.replace(batch, block_table=tables[i], slot_mapping=slots[i])
            out += [f"group {i}: {d}" for d in H.compare(want[name], got[name], step, **chunk_args(variant_name))]
        return out


def step_parity(monkeypatch, vllm_configs, rocm, variant, backend):
    kw = {"backend": backend, **({"platform": TRITON_BACKENDS[backend]} if backend != "torch" else {})}
    rng = random.Random(f"{SEED}-{variant}-{backend}-step")
    calls = Calls(monkeypatch)
    natives = natives_for(variant, rocm)
    kinds = step_kinds(variant)
    first = 0
    # vLLM's layout as it comes: every group an SWA group (its tuple and [G, T] buffer as they are), every
    # other one (a strided view of the buffer), anywhere among other groups.
    sizes, forms = (2, 3, rng.randint(4, 8)), ("all", "even", "any")
    for layout_index, (steps, num_swa, form) in enumerate(zip(STEP_STEPS[backend], sizes, forms)):
        layout = H.random_layout(rng, num_swa, form)
        rig = StepRig(variant, vllm_configs, natives[layout_index % len(natives)], layout, **kw)
        counted = False
        for i in range(first, first + steps):
            kind = kinds[i % len(kinds)]
            batch, tables, slots, ib, state = rig.draw(rng, kind)
            causal = kind != "dspark"
            want = rig.build(rig.native_groups, batch, tables, slots, ib, state, causal=causal)
            calls.take()
            got = rig.build(rig.our_groups, batch, tables, slots, ib, state, causal=causal)
            plan = rig.ours[0].swa_hal_step[0]
            if not counted:  # the step builder exists from the first step on
                calls.launches(plan.builder.backend)
                calls.take()
                got = rig.build(rig.our_groups, batch, tables, slots, ib, state, causal=causal)
                counted = True
            n = calls.take()
            # One build for every SWA group of the step, one launch, no group building on its own.
            assert n.get("build_groups") == 1 and "build" not in n, n
            assert n.get("launch:compute_groups") == 1, n
            assert n.get("launch:_launch", 1) == 1, n
            assert plan.kv_ids == layout.swa
            diffs = rig.diffs(want, got, batch, tables, slots, variant)
            assert not diffs, f"{backend} {type(rig.natives[0]).__name__} {layout} {kind} #{i}:\n" + "\n".join(diffs)
            COUNTS[f"step:{backend}"] += 1
            COUNTS[f"step_groups:{backend}"] += len(layout.swa)
            COUNTS["step_replay"] += batch.replay_start is not None and bool(batch.replay_start.any())
            COUNTS[f"step_kind:{kind}"] += 1
            inputs = plan.inputs(tables, slots)
            COUNTS["step_inputs:" + ("as_is" if inputs[1] is slots else type(inputs[1]).__name__)] += 1
        first += steps


@pytest.mark.parametrize("variant", STEP_VARIANTS)
def test_step_builds_equal_vllms_per_group_builds_torch_backend(plugin_log, vllm_configs, rocm, monkeypatch, variant):
    step_parity(monkeypatch, vllm_configs, rocm, variant, "torch")


@pytest.mark.parametrize("variant", STEP_VARIANTS)
def test_step_builds_equal_vllms_per_group_builds_triton_backend(plugin_log, vllm_configs, rocm, monkeypatch, variant):
    step_parity(monkeypatch, vllm_configs, rocm, variant, "cuda")


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_step_builds_with_image_ranges(plugin_log, vllm_configs, rocm, monkeypatch, backend):
    """The vision variant: the step build puts the step's image spans in its own span buffers once, and
    every group's visibility and rows equal vLLM's own build of that group."""
    kw = {"backend": backend, **({"platform": TRITON_BACKENDS[backend]} if backend != "torch" else {})}
    variant = "v4_vision_w6b4"
    rng = random.Random(f"{SEED}-step-vision-{backend}")
    rig = StepRig(variant, vllm_configs, sparse_swa.DeepseekSparseSWAMetadataBuilder, H.StepLayout(4, (0, 2, 3)), **kw)
    calls = Calls(monkeypatch)
    visible = 0
    for i in range(6 if backend == "torch" else 2):
        batch, ranges = H.draw(rig.cfg, rng, ("mixed", "prefill")[i % 2], spans=1.0, **STEP_BATCH)
        tables, slots = H.step_inputs(batch, rig.layout, rig.cfg.block_size, rng)
        ib = H.input_batch(batch, slots.shape[1], rig.cfg.decode_threshold, H.token_positions(batch))
        want = rig.build(rig.native_groups, batch, tables, slots, ib, None, ranges=ranges or {})
        calls.take()
        got = rig.build(rig.our_groups, batch, tables, slots, ib, None, ranges=ranges or {})
        assert calls.take() == {"build_groups": 1}
        diffs = rig.diffs(want, got, batch, tables, slots, variant)
        assert not diffs, f"{backend} #{i}:\n" + "\n".join(diffs)
        first = want["model.layers.0.attn.swa_cache"].prefill_left_visible
        visible += first is not None and int(first.max()) > 0
        COUNTS["step_image_spans"] += 1
    assert visible > 0


DRAFT_STEP_VARIANTS = ["v4_mtp2_w6b8", "v4_dspark3_w5b4", "v41_mtp1_w7b16"]


@pytest.mark.parametrize("backend", ["torch", "cuda"])
@pytest.mark.parametrize("variant", DRAFT_STEP_VARIANTS)
def test_step_builds_update_each_draft_step_in_one_grouped_update(
    plugin_log, vllm_configs, rocm, monkeypatch, variant, backend
):
    """vLLM's drafter updates every group's metadata in turn after each draft step: on a step build's
    metadata the first group's update updates every group in one grouped update, the others find theirs
    done; after each of three draft steps every group equals vLLM's own builder's update of its build."""
    kw = {"backend": backend, **({"platform": TRITON_BACKENDS[backend]} if backend != "torch" else {})}
    rng = random.Random(f"{SEED}-{variant}-{backend}-step-draft")
    calls = Calls(monkeypatch)
    natives = [n for n in natives_for(variant, rocm) if n.supports_draft_decode_metadata_update]
    for j, kind in enumerate(["decode", "mtp"]):
        layout = H.random_layout(rng, rng.randint(2, 5))
        rig = StepRig(variant, vllm_configs, natives[j % len(natives)], layout, **kw)
        batch, tables, slots, ib, state = rig.draw(rng, kind)
        want = rig.build(rig.native_groups, batch, tables, slots, ib, state)
        got = rig.build(rig.our_groups, batch, tables, slots, ib, state)
        assert got[rig.our_groups[layout.swa[0]][0].layer_names[0]].num_decode_tokens > 0
        for step in range(1, 4):
            H.advance_draft_step_groups(batch, tables, slots, rig.cfg.block_size)
            calls.take()
            for groups in rig.native_groups:  # vLLM's loop (speculator._update_draft_decode_metadata)
                for group in groups:
                    group.update_draft_decode_metadata(want)
            for groups in rig.our_groups:
                for group in groups:
                    group.update_draft_decode_metadata(got)
            n = calls.take()
            assert n == {"update_draft_decode_metadata": 1, "_update_groups": 1}, n
            diffs = rig.diffs(want, got, batch, tables, slots, variant)
            assert not diffs, f"{backend} {kind} {layout} draft step {step}:\n" + "\n".join(diffs)
            COUNTS["step_draft_updates"] += 1


class TaggedInputs(StepInputs):
    """A step's inputs as a type of their own, the stand-in for an input vLLM's metadata has no field for: an
    update that rebuilds the inputs from vLLM's named fields makes a plain ``StepInputs`` and drops it."""

    __slots__ = ()


@pytest.mark.parametrize("backend", ["torch", "cuda"])
@pytest.mark.parametrize("step_builds", [False, True])
def test_a_draft_update_carries_the_builds_own_inputs(
    plugin_log, vllm_configs, rocm, monkeypatch, step_builds, backend
):
    """Every draft-step update of vLLM's metadata runs on the inputs its build read (``SWAMetadata.inputs``),
    alone or in a step build: none is made again from vLLM's fields, where an input it has no field for
    would fall back to its default (docs/semantics.md #draft-updates)."""
    from swa_hal import plan as B
    from swa_hal.integrations import engine, vllm_step

    made = engine.inputs_from_common_metadata
    tagged = lambda *a, **kw: TaggedInputs(*made(*a, **kw))  # noqa: E731
    monkeypatch.setattr(engine, "inputs_from_common_metadata", tagged)
    monkeypatch.setattr(vllm_step, "inputs_from_common_metadata", tagged)
    seen = []
    update_inputs = B.update_inputs
    monkeypatch.setattr(B, "update_inputs", lambda md: seen.append(update_inputs(md)) or seen[-1])
    kw = {"backend": backend, **({"platform": TRITON_BACKENDS[backend]} if backend != "torch" else {})}
    variant = "v4_mtp2_w6b8"
    rng = random.Random(f"{SEED}-{backend}-{step_builds}-update-inputs")
    native_cls = sparse_swa.DeepseekSparseSWAMetadataBuilder
    if step_builds:
        layout = H.StepLayout(3, (0, 2))
        rig = StepRig(variant, vllm_configs, native_cls, layout, **kw)
        batch, tables, slots, ib, state = rig.draw(rng, "mtp")
        want = rig.build(rig.native_groups, batch, tables, slots, ib, state)
        got = rig.build(rig.our_groups, batch, tables, slots, ib, state)
    else:
        native, ours, cfg = builders(native_cls, variant, vllm_configs, **kw)
        batch, ranges = H.draw(cfg, rng, "mtp", replay=0.5, extra_pages=1)
        got_native, got_ours = build_both(native, ours, batch, ranges)
    for _ in range(2):
        seen.clear()
        if step_builds:
            H.advance_draft_step_groups(batch, tables, slots, rig.cfg.block_size)
            for groups, theirs in zip(rig.our_groups, rig.native_groups):
                for group, native_group in zip(groups, theirs):
                    native_group.update_draft_decode_metadata(want)
                    group.update_draft_decode_metadata(got)
            diffs = rig.diffs(want, got, batch, tables, slots, variant)
        else:
            advance_draft_step(batch, cfg.block_size)
            native.update_draft_decode_metadata(got_native)
            ours.update_draft_decode_metadata(got_ours)
            diffs = H.compare(got_native, got_ours, batch, **chunk_args(variant))
        assert not diffs, "\n".join(diffs)
        assert seen and all(type(inputs) is TaggedInputs for inputs in seen), [type(i).__name__ for i in seen]


def _last_step_line(plugin_log):
    lines = [r.getMessage() for r in plugin_log[1] if "step builds" in r.getMessage()]
    return lines[-1]


def test_step_builds_are_on_by_default_and_installed_once(plugin_log):
    """The start-up line names the backend and the step builds; registering again wraps nothing twice;
    unregistering gives vLLM its own ``prepare_attn`` back."""
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    first = [r.getMessage() for r in plugin_log[0] if "SWA metadata through swa_hal backend" in r.getMessage()]
    assert len(first) == 1 and "step builds on" in first[0] and "backend 'torch'" in first[0], first
    from vllm.v1.worker.gpu import attn_utils
    from vllm.v1.worker.gpu.spec_decode import speculator

    hooked = DefaultModelState.__dict__["prepare_attn"]
    original = hooked.__wrapped__
    assert hooked.__swa_hal__ and not getattr(original, "__swa_hal__", False)
    drafter = speculator.build_attn_metadata
    assert drafter.__swa_hal__ and drafter.__wrapped__ is attn_utils.build_attn_metadata
    assert integ.register() is True and DefaultModelState.__dict__["prepare_attn"] is hooked
    assert speculator.build_attn_metadata is drafter and integ.step_builds_active()
    integ.unregister()
    try:
        assert DefaultModelState.__dict__["prepare_attn"] is original and not integ.step_builds_active()
        assert speculator.build_attn_metadata is attn_utils.build_attn_metadata
    finally:
        integ.register()
    again = DefaultModelState.__dict__["prepare_attn"]
    assert again.__swa_hal__ and again.__wrapped__ is original
    assert speculator.build_attn_metadata.__wrapped__ is attn_utils.build_attn_metadata
    assert sum(attr in ("prepare_attn", "build_attn_metadata") for _, attr, _ in integ._patched) == 2


@pytest.mark.parametrize("case", ["off", "absent"])
def test_without_step_builds_each_group_builds_alone(plugin_log, vllm_configs, rocm, monkeypatch, case):
    """``SWA_HAL_VLLM_STEP=0``, or a vLLM without model runner V2's ``prepare_attn``: vLLM's step loop calls
    each SWA group's builder, which builds its group alone (one build per group, no group build), as
    vLLM's own builders do."""
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    from swa_hal.integrations import vllm_step

    integ.unregister()
    try:
        with monkeypatch.context() as mp:
            if case == "off":
                mp.setenv("SWA_HAL_VLLM_STEP", "0")
            else:
                mp.setattr(vllm_step, "MODEL_STATE_MODULE", "vllm.v1.worker.gpu.model_states.not_in_this_vllm")
            assert integ.register() is True
        from vllm.v1.worker.gpu.spec_decode import speculator

        assert not getattr(DefaultModelState.prepare_attn, "__swa_hal__", False)
        assert not getattr(speculator.build_attn_metadata, "__swa_hal__", False)
        assert not integ.step_builds_active()
        want_line = "step builds off (SWA_HAL_VLLM_STEP=0)" if case == "off" else "step builds unavailable"
        assert want_line in _last_step_line(plugin_log)
        calls = Calls(monkeypatch)
        rng = random.Random(f"{SEED}-step-{case}")
        for variant in ("v4_mtp2_w6b8", "v41_w8b4"):
            layout = H.random_layout(rng, 3)
            rig = StepRig(variant, vllm_configs, natives_for(variant, rocm)[1], layout, backend="torch")
            for kind in ("decode", "mixed"):
                batch, tables, slots, ib, state = rig.draw(rng, kind)
                want = rig.build(rig.native_groups, batch, tables, slots, ib, state)
                calls.take()
                got = rig.build(rig.our_groups, batch, tables, slots, ib, state)
                assert calls.take() == {"build": 3}
                diffs = rig.diffs(want, got, batch, tables, slots, variant)
                assert not diffs, "\n".join(diffs)
            assert all(b.swa_hal_step is None for b in rig.ours)
    finally:
        integ.unregister()
        integ.register()
    assert integ.step_builds_active()


def test_a_step_build_serves_only_its_own_inputs(plugin_log, vllm_configs, rocm, monkeypatch):
    """Builders called outside ``prepare_attn`` (model runner V1's loop, or any direct call) build alone;
    inside a step, a group whose inputs are not the step's (another slot mapping, other shared inputs)
    builds alone too, and the step build serves the others; each result equals vLLM's own build. A direct
    integrator that writes into a step's input between two groups' asks (vLLM never does): the step build
    read the old values, so each later group whose tensors changed (a version counter moved) builds alone
    from the new ones (docs/engines.md, step builds)."""
    from swa_hal.integrations import vllm_step

    variant = "v41_mtp1_w7b16"
    rng = random.Random(f"{SEED}-step-own-inputs")
    layout = H.StepLayout(4, (0, 1, 3))
    rig = StepRig(variant, vllm_configs, v41_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder, layout, backend="torch")
    calls = Calls(monkeypatch)
    batch, tables, slots, ib, state = rig.draw(rng, "mixed")
    batch = dataclasses.replace(batch, replay_start=torch.zeros_like(batch.seq_lens))
    rig.build(rig.our_groups, batch, tables, slots, ib, state)  # the plan and its builder exist

    def group_step(j, **changes):
        i = layout.swa[j]
        return dataclasses.replace(batch, **{"block_table": tables[i], "slot_mapping": slots[i], **changes})

    def check(j, step, cm_kw=None):
        cm_kw = cm_kw or {}
        want = rig.natives[j].build(0, H.common_metadata(step, **cm_kw), replay_start=batch.replay_start)
        got = rig.ours[j].build(0, H.common_metadata(step, **cm_kw), replay_start=batch.replay_start)
        diffs = H.compare(want, got, step, **chunk_args(variant))
        assert not diffs, "\n".join(diffs)

    calls.take()
    for j in range(3):  # no step open: each group alone
        check(j, group_step(j))
    assert calls.take() == {"build": 3}
    with vllm_step.open_step(tables, slots, rig.our_groups, 0):
        check(1, group_step(1, slot_mapping=slots[layout.swa[1]].clone()))  # not the step's slot row
        assert calls.take() == {"build": 1}
        check(0, group_step(0))  # the step build, for every group
        assert calls.take() == {"build_groups": 1}
        check(2, group_step(2), {"num_actual_tokens": int(batch.query_start_loc_cpu[-1]) - 1})  # other shared input
        assert calls.take() == {"build": 1}
        check(2, group_step(2))
        check(1, group_step(1))
        assert calls.take() == {}
        # Shared inputs are compared by identity first, then by what a build reads: another view of the
        # same seq_lens memory is the step's input, a copy of it is not.
        check(1, group_step(1, seq_lens=batch.seq_lens[:]))
        assert calls.take() == {}
        check(1, group_step(1, seq_lens=batch.seq_lens.clone()))
        assert calls.take() == {"build": 1}
    check(0, group_step(0))  # the step closed: alone again
    assert calls.take() == {"build": 1}
    with vllm_step.open_step(tables, slots, rig.our_groups, 0):
        check(0, group_step(0))
        assert calls.take() == {"build_groups": 1}
        # A shared input written in place: each request's window now starts at its first query token
        # (#bounded-replay), so every later group builds alone, from the new bounds.
        batch.replay_start.copy_(batch.seq_lens - (batch.query_start_loc[1:] - batch.query_start_loc[:-1]))
        assert bool(batch.replay_start.any())
        check(1, group_step(1))
        check(2, group_step(2))
        assert calls.take() == {"build": 2}
    batch.replay_start.zero_()
    with vllm_step.open_step(tables, slots, rig.our_groups, 0):
        check(0, group_step(0))
        assert calls.take() == {"build_groups": 1}
        tables[layout.swa[2]][0, 0] += 1  # one group's own table
        check(2, group_step(2))
        assert calls.take() == {"build": 1}
        slots[layout.swa[1]][0] = -1  # the stacked slot mappings, one row
        check(1, group_step(1))
        assert calls.take() == {"build": 1}


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_step_builds_under_cudagraph_capture(plugin_log, vllm_configs, rocm, monkeypatch, backend):
    """vLLM captures FULL graphs through the same ``prepare_attn`` (``for_capture``, dummy batches: a zeroed
    block table, padding slots): the capture build is a step build, and the next FULL step of that shape
    builds into the same memory, both equal to vLLM's own builds."""
    kw = {"backend": backend, **({"platform": TRITON_BACKENDS[backend]} if backend != "torch" else {})}
    variant = "v41_mtp1_w7b16"
    rng = random.Random(f"{SEED}-step-capture-{backend}")
    layout = H.StepLayout(3, (0, 1, 2))
    rig = StepRig(variant, vllm_configs, v41_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder, layout, **kw)
    calls = Calls(monkeypatch)
    q, n = rig.cfg.decode_threshold, 4
    dummy = AttentionBatch.from_lists([q] * n, [q] * n, torch.zeros(n, 4, dtype=torch.int32), block_size=16)
    dummy = dataclasses.replace(dummy, slot_mapping=torch.full_like(dummy.slot_mapping, -1))
    real = AttentionBatch.from_lists(
        [rng.randint(q, 60) for _ in range(n)],
        [q] * n,
        torch.arange(4 * n, dtype=torch.int32).view(n, 4),
        block_size=16,
    )
    seen = None
    for step, capture in ((dummy, True), (real, False)):
        tables, slots = H.step_inputs(step, layout, rig.cfg.block_size, rng)
        ib = H.input_batch(step, slots.shape[1], q, H.token_positions(step))
        state = H.model_state(rig.variant.version, rig.vc, window=rig.variant.window)
        kw = dict(for_capture=capture, full=True)
        want = H.prepare_attn(state, ib, tables, slots, rig.native_groups, layout, None, **kw)
        calls.take()
        got = H.prepare_attn(state, ib, tables, slots, rig.our_groups, layout, None, **kw)
        assert calls.take() == {"build_groups": 1}
        diffs = rig.diffs(want, got, step, tables, slots, variant)
        assert not diffs, f"capture={capture}:\n" + "\n".join(diffs)
        names = ("decode_swa_indices", "decode_swa_lens", "token_to_req_indices", "is_valid_token")
        ptrs = [tuple(getattr(md, f).data_ptr() for f in names) for md in got.values()]
        assert seen is None or ptrs == seen
        seen = ptrs
    plan = rig.ours[0].swa_hal_step[0]
    assert (
        got["model.layers.0.attn.swa_cache"].decode_swa_lens.data_ptr() == plan.builder.buffers.decode_lens.data_ptr()
    )
    # vLLM's kernels read the planner objects of vLLM's build_tile_scheduler: swa_hal's builders make none.
    assert plan.builder._make_schedulers is no_schedulers and rig.ours[0].swa_hal._make_schedulers is no_schedulers


def test_coverage_of_the_random_batches():
    """Runs last in the file: the parity tests above covered what the issue asks for."""
    if COUNTS["batches"] == 0:
        pytest.skip("run with the parity tests")
    print(dict(COUNTS))
    assert COUNTS["batches"] >= 200
    assert COUNTS["rocm_replay"] >= 4, dict(COUNTS)
    assert all(COUNTS[f"backend:{b}"] >= 200 for b in ("torch", *TRITON_BACKENDS)), dict(COUNTS)
    for kind in ("decode", "mtp", "mixed", "padded", "dspark", "replay_start", "image_spans"):
        assert COUNTS[kind] > 0, kind
    assert COUNTS["draft_updates"] > 0
    # Step builds: at least 200 steps of 2 to 8 SWA groups through the torch backend, some through a Triton
    # backend, every kind, replay bounds, and grouped draft updates.
    assert COUNTS["step:torch"] >= 200 and COUNTS["step:cuda"] > 0, dict(COUNTS)
    for kind in ("decode", "mixed", "mtp", "padded", "dspark"):
        assert COUNTS[f"step_kind:{kind}"] > 0, kind
    assert COUNTS["step_replay"] > 0 and COUNTS["step_draft_updates"] >= 3 and COUNTS["step_image_spans"] > 0
    # vLLM's buffers as they are, a strided view of the slot mappings, and listed rows.
    assert all(COUNTS[f"step_inputs:{form}"] > 0 for form in ("as_is", "Tensor", "list")), dict(COUNTS)
