"""Drift and shadow mode in vLLM (docs/engines.md #drift, #shadow-mode), ``make test-vllm``.

Drift: the swa_hal builder is handed what a newer vLLM hands it (a keyword its ``build`` or
``update_draft_decode_metadata`` does not know, a field of ``CommonAttentionMetadata`` it does not know set, a
set-up that meets an attribute vLLM no longer has): vLLM's own code answers, equal to vLLM's own builder's, no
exception reaches vLLM, one warning names the method and what it did not know, ``stepped_aside()`` counts it;
``SWA_HAL_STRICT=1`` raises ``EngineDriftError``. The newer vLLM is vLLM's own base build with the newer
signature (it takes the new keyword and drops it), so the answer that must come back is vLLM's.

Shadow mode: vLLM's own builds serve; swa_hal's are compared with them, in the same memory; equal builds count
towards a promotion after which swa_hal serves at the same addresses; a planted difference (a length one off, a
shifted replay bound) is found on the call it is planted in.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random

os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import pytest
import torch

pytest.importorskip("vllm")

import vllm_harness as H  # noqa: E402
from test_vllm import (  # noqa: E402,F401 - fixtures of the vLLM suite
    advance_draft_step,
    builders,
    build_both,
    chunk_args,
    planner_stub,
    plugin_log,
    vllm_configs,
)
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.mla import sparse_swa  # noqa: E402

from swa_hal.integrations import EngineDriftError, stepped_aside  # noqa: E402
from swa_hal.integrations import vllm as integ  # noqa: E402
from swa_hal.integrations import vllm_builder, vllm_shadow  # noqa: E402
from swa_hal.integrations.aside import reset_stepped_aside  # noqa: E402

BASE = sparse_swa.DeepseekSparseSWAMetadataBuilder
SEED = "vllm-drift"


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def log_lines():
    reset_stepped_aside()
    lines = Lines()
    integ.log.addHandler(lines)
    yield lines
    integ.log.removeHandler(lines)
    reset_stepped_aside()


def newer_method(monkeypatch, name, keyword):
    """vLLM's base ``name`` as a newer vLLM has it: one more keyword, taken and dropped; returns its calls."""
    own = getattr(BASE, name)
    calls = []

    def newer(self, *args, **kwargs):
        calls.append(kwargs.pop(keyword, None))
        return own(self, *args, **kwargs)

    monkeypatch.setattr(BASE, name, newer)
    return calls


def a_step(cfg, kind="mixed", seed=SEED, **kw):
    return H.draw(cfg, random.Random(f"{seed}-{kind}"), kind, **kw)


def test_a_new_build_keyword_steps_aside_to_vllms_build(plugin_log, vllm_configs, log_lines, monkeypatch):
    native, ours, cfg = builders(BASE, "v4_w8b4", vllm_configs, backend="torch")
    batch, ranges = a_step(cfg)
    want = native.build(0, H.common_metadata(batch))
    calls = newer_method(monkeypatch, "build", "spec_decode_metadata")
    for _ in range(2):
        got = ours.build(0, H.common_metadata(batch), spec_decode_metadata="draft tree")
        assert not H.compare(want, got, batch)
    assert calls[-2:] == ["draft tree", "draft tree"]  # vLLM's own build answered both calls
    (entry,) = stepped_aside("vLLM")
    assert entry["hook"] == "build" and entry["calls"] == 2
    assert "arguments it does not know: spec_decode_metadata" in entry["reason"]
    warned = [line for line in log_lines.lines if "spec_decode_metadata" in line]
    assert len(warned) == 1 and "vLLM's own code" in warned[0]
    # A call it knows is swa_hal's again: vLLM's build does not run for it.
    done = len(calls)
    assert not H.compare(want, ours.build(0, H.common_metadata(batch)), batch)
    assert len(calls) == done


@dataclasses.dataclass
class NewerCommonAttentionMetadata(CommonAttentionMetadata):
    """vLLM's common metadata as a newer release has it: one more field (decode context parallelism's)."""

    dcp_decode_ranks: torch.Tensor | None = None


def test_a_common_metadata_field_it_does_not_know_steps_aside_when_set(
    plugin_log, vllm_configs, log_lines, monkeypatch
):
    native, ours, cfg = builders(BASE, "v4_w8b4", vllm_configs, backend="torch")
    batch, _ = a_step(cfg)
    want = native.build(0, H.common_metadata(batch))

    def newer(**changes):
        cm = H.common_metadata(batch)
        fields = {f.name: getattr(cm, f.name) for f in dataclasses.fields(cm)}
        return NewerCommonAttentionMetadata(**fields, **changes)

    assert not H.compare(want, ours.build(0, newer()), batch)  # left at its default: not drift
    assert stepped_aside() == []
    got = ours.build(0, newer(dcp_decode_ranks=torch.zeros(2, dtype=torch.int32)))
    assert not H.compare(want, got, batch)
    (entry,) = stepped_aside("vLLM")
    assert entry["reason"] == "common metadata fields it does not know are set: dcp_decode_ranks", entry


def test_a_set_up_that_meets_drift_leaves_the_builder_vllms(plugin_log, vllm_configs, log_lines, monkeypatch):
    """A newer vLLM without an attribute the set-up reads: the builder keeps vLLM's own buffers and every
    build is vLLM's own, equal to vLLM's builder's."""

    def gone(builder):
        raise AttributeError("'VllmConfig' object has no attribute 'speculative_config'")

    monkeypatch.setattr(vllm_builder, "swa_config_from_vllm", gone)
    native, ours, cfg = builders(BASE, "v4_w8b4", vllm_configs, backend="torch")
    assert ours.swa_hal_aside.startswith("AttributeError") and "speculative_config" in ours.swa_hal_aside
    assert ours.decode_swa_indices.shape == native.decode_swa_indices.shape  # vLLM's own rows kept
    for kind in ("mixed", "decode"):
        batch, _ = a_step(cfg, kind)
        assert not H.compare(native.build(0, H.common_metadata(batch)), ours.build(0, H.common_metadata(batch)), batch)
    hooks = {e["hook"]: e["calls"] for e in stepped_aside("vLLM")}
    assert hooks == {"builder set-up": 1, "build": 2}, hooks


def test_a_new_update_keyword_steps_aside_to_vllms_update(plugin_log, vllm_configs, log_lines, monkeypatch):
    native, ours, cfg = builders(BASE, "v4_mtp2_w6b8", vllm_configs, backend="torch")
    batch, ranges = a_step(cfg, "mtp", extra_pages=1)
    got_native, got_ours = build_both(native, ours, batch, ranges)
    calls = newer_method(monkeypatch, "update_draft_decode_metadata", "draft_step")
    for step in range(1, 3):
        advance_draft_step(batch, cfg.block_size)
        native.update_draft_decode_metadata(got_native)
        ours.update_draft_decode_metadata(got_ours, draft_step=step)
        assert not H.compare(got_native, got_ours, batch, **chunk_args("v4_mtp2_w6b8"))
    assert [c for c in calls if c is not None] == [1, 2]  # vLLM's own update answered swa_hal's calls
    (entry,) = stepped_aside("vLLM")
    assert entry["hook"] == "update_draft_decode_metadata" and entry["calls"] == 2


def test_drift_under_strict_is_a_clear_error(plugin_log, vllm_configs, monkeypatch):
    native, ours, cfg = builders(BASE, "v4_w8b4", vllm_configs, backend="torch")
    batch, _ = a_step(cfg)
    newer_method(monkeypatch, "build", "spec_decode_metadata")
    monkeypatch.setenv("SWA_HAL_STRICT", "1")
    with pytest.raises(EngineDriftError, match="spec_decode_metadata") as info:
        ours.build(0, H.common_metadata(batch), spec_decode_metadata=None)
    assert (info.value.engine, info.value.hook) == ("vLLM", "build")


def test_an_error_vllms_own_code_raises_passes_through(plugin_log, vllm_configs, monkeypatch):
    """vLLM's own build_tile_scheduler raising inside swa_hal's build is vLLM's answer, not drift."""
    native, ours, cfg = builders(BASE, "v4_w8b4", vllm_configs, backend="torch")
    batch, _ = a_step(cfg)

    def broken(self, num_decode_tokens):
        raise RuntimeError("vLLM's own planner")

    monkeypatch.setattr(type(ours), "build_tile_scheduler", broken)
    reset_stepped_aside()
    with pytest.raises(RuntimeError, match="vLLM's own planner"):
        ours.build(0, H.common_metadata(batch))
    assert stepped_aside() == []


# -- shadow mode ----------------------------------------------------------------------------------------------


@pytest.fixture
def shadowed(plugin_log, monkeypatch):
    """The plugin as vLLM loads it with ``SWA_HAL_VLLM=shadow``; a function setting the shadow's settings (before
    the builders are made). The serving plugin is back afterwards."""

    def settings(steps=10**6, every=1, promote=False):
        monkeypatch.setenv("SWA_HAL_VLLM", "shadow")
        monkeypatch.setenv("SWA_HAL_SHADOW_STEPS", str(steps))
        monkeypatch.setenv("SWA_HAL_SHADOW_EVERY", str(every))
        monkeypatch.setenv("SWA_HAL_SHADOW_PROMOTE", "1" if promote else "0")
        integ.unregister()
        assert integ.register()
        shadow = vllm_shadow.current()
        assert shadow is not None and not integ.step_builds_active()
        return shadow

    yield settings
    monkeypatch.delenv("SWA_HAL_VLLM", raising=False)
    integ.unregister()
    integ.register()


def storage(t):
    return t.untyped_storage().data_ptr()


@pytest.mark.parametrize("variant", ["v4_w8b4", "v4_mtp2_w6b8", "v41_mtp1_w7b16", "v4_vision_w6b4"])
def test_shadow_serves_vllms_builds_in_swa_hals_memory_and_finds_them_equal(shadowed, vllm_configs, variant):
    shadow = shadowed()
    native, ours, cfg = builders(BASE, variant, vllm_configs, backend="torch")
    rng = random.Random(f"{SEED}-shadow-{variant}")
    for i in range(8):
        batch, ranges = H.draw(cfg, rng, ("mixed", "decode", "prefill")[i % 3], replay=0.5)
        got_native, got_ours = build_both(native, ours, batch, ranges)
        assert not H.compare(got_native, got_ours, batch, **chunk_args(variant))
        # vLLM's build wrote swa_hal's buffers: the addresses a promoted swa_hal fills.
        assert storage(got_ours.decode_swa_lens) == storage(ours.swa_hal.buffers.decode_lens)
    report = shadow.report()
    assert report["compared"] == report["equal"] == 8 and report["difference"] is None, report


def test_shadow_compares_draft_updates(shadowed, vllm_configs):
    shadow = shadowed()
    native, ours, cfg = builders(BASE, "v4_mtp2_w6b8", vllm_configs, backend="torch")
    batch, ranges = a_step(cfg, "mtp", extra_pages=1)
    got_native, got_ours = build_both(native, ours, batch, ranges)
    for _ in range(3):
        advance_draft_step(batch, cfg.block_size)
        native.update_draft_decode_metadata(got_native)
        ours.update_draft_decode_metadata(got_ours)
        assert not H.compare(got_native, got_ours, batch, **chunk_args("v4_mtp2_w6b8"))
    report = shadow.report()
    assert report["compared"] == report["equal"] == 4, report  # the build and three updates


def test_shadow_promotes_and_swa_hal_serves_at_the_same_addresses(shadowed, vllm_configs, monkeypatch):
    shadow = shadowed(steps=3, every=2, promote=True)
    native, ours, cfg = builders(BASE, "v4_w8b4", vllm_configs, backend="torch")
    vllm_builds = newer_method(monkeypatch, "build", "unused")
    rng = random.Random(f"{SEED}-promote")
    addresses = set()
    for i in range(6):
        batch, ranges = H.draw(cfg, rng, "mixed")
        got_native, got_ours = build_both(native, ours, batch, ranges)
        assert not H.compare(got_native, got_ours, batch)
        addresses.add((storage(got_ours.decode_swa_indices), storage(got_ours.prefill_swa_lens)))
    # Builds 1-3 compared and served by vLLM (and the native builder's own 6 builds); then swa_hal's.
    assert shadow.mode == "serve" and len(vllm_builds) == 6 + 3, len(vllm_builds)
    assert len(addresses) == 1  # the same memory before and after the promotion


def _planted_lens(monkeypatch, on_call, shift):
    """swa_hal's build with ``shift`` applied to its answer on the shadow's call ``on_call``."""
    real = vllm_builder.SwaHalSparseSWAMetadataBuilder.swa_hal_build

    def planted(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if vllm_shadow.current().calls == on_call:
            shift(out)
        return out

    monkeypatch.setattr(vllm_builder.SwaHalSparseSWAMetadataBuilder, "swa_hal_build", planted)


def test_shadow_finds_a_length_one_off_on_its_call(shadowed, vllm_configs, monkeypatch, log_lines):
    shadow = shadowed()
    native, ours, cfg = builders(BASE, "v4_w8b4", vllm_configs, backend="torch")

    def one_off(md):
        md.decode_swa_lens[0] += 1

    _planted_lens(monkeypatch, 4, one_off)
    rng = random.Random(f"{SEED}-planted")
    for _ in range(6):
        batch, ranges = H.draw(cfg, rng, "decode")
        got_native, got_ours = build_both(native, ours, batch, ranges)
        assert not H.compare(got_native, got_ours, batch)  # vLLM served every build
    report = shadow.report()
    assert report["mode"] == "off" and report["compared"] == 4 and report["equal"] == 3, report
    assert report["difference"].startswith(f"call 4 (build of {type(ours).__name__}): "), report
    assert "decode_swa_lens[0] differs: vLLM " in report["difference"]
    assert len([line for line in log_lines.lines if "decode_swa_lens[0]" in line]) == 1


def test_shadow_finds_a_shifted_replay_bound_on_its_call(shadowed, vllm_configs, monkeypatch):
    """swa_hal reading request 0's replay bound one higher on the third call: its rows differ there."""
    shadow = shadowed()
    native, ours, cfg = builders(BASE, "v41_mtp1_w7b16", vllm_configs, backend="torch")
    real = vllm_builder.SwaHalSparseSWAMetadataBuilder.swa_hal_batch

    def shifted(self, cm, replay_start=None):
        if vllm_shadow.current().calls == 3 and replay_start is not None:
            replay_start = replay_start.clone()
            replay_start[0] += 1
        return real(self, cm, replay_start)

    monkeypatch.setattr(vllm_builder.SwaHalSparseSWAMetadataBuilder, "swa_hal_batch", shifted)
    rng = random.Random(f"{SEED}-replay")
    for _ in range(4):
        while True:  # a step whose first request's window reaches below its bound
            batch, ranges = H.draw(cfg, rng, "prefill", replay=1.0)
            if batch.replay_start is not None and int(batch.replay_start[0]) > 0:
                break
        build_both(native, ours, batch, ranges)
    report = shadow.report()
    assert report["compared"] == 3 and report["difference"].startswith("call 3 "), report


# -- the step hooks -------------------------------------------------------------------------------------------


def test_a_newer_prepare_attn_gets_no_step_hook_and_says_why(plugin_log, log_lines, monkeypatch):
    """A vLLM whose ``DefaultModelState.prepare_attn`` takes a parameter the step hook does not know: the hook is
    not installed (every SWA group builds on its own, as vLLM calls its builders), counted and logged once."""
    from swa_hal.integrations import vllm_step
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    def prepare_attn(self, input_batch, cudagraph_mode, block_tables, slot_mappings, attn_groups, kv_cache_config,
                     for_capture=False, ubatch_idx=0, model_specific_attn_metadata=None, dcp_layout=None):
        return None

    monkeypatch.setattr(DefaultModelState, "prepare_attn", prepare_attn)
    patched = []
    assert vllm_step.install(patched) is False and patched == []
    (entry,) = stepped_aside("vLLM")
    assert entry["hook"] == "prepare_attn (step builds)" and "does not know: dcp_layout" in entry["reason"]
    assert len([line for line in log_lines.lines if "dcp_layout" in line]) == 1


def test_attention_groups_it_cannot_read_open_no_step(plugin_log, log_lines):
    """Attention groups in a layout the step hook does not know (a mapping of KV-cache group to its attention
    groups, where vLLM 0.33 and 0.34 hand a list of lists): no step build, every group builds on its own, the call
    counted and logged once."""
    from swa_hal.integrations import vllm_step

    slots = torch.zeros((2, 4), dtype=torch.int64)
    vllm_step.plans.clear()
    with vllm_step._step_or_none((slots[0], slots[1]), slots, {0: object(), 1: object()}, 0) as step:
        assert step is None
    (entry,) = stepped_aside("vLLM")
    assert entry["hook"] == "prepare_attn (step builds)" and entry["reason"].startswith("TypeError"), entry
    assert len([line for line in log_lines.lines if "prepare_attn (step builds)" in line]) == 1


def test_the_drafters_call_without_a_step_keyword_is_counted(plugin_log):
    from vllm.v1.worker.gpu.spec_decode import speculator

    reset_stepped_aside()
    with pytest.raises(TypeError):  # vLLM's own answer to the call
        speculator.build_attn_metadata(attn_groups=[], num_reqs=0)
    (entry,) = stepped_aside("vLLM")
    assert entry["hook"] == "build_attn_metadata (drafter step builds)" and "block_tables" in entry["reason"]
