"""SGLang's SWA allocator under random scheduler-driven traffic (``sglang_traffic``), and SGLang's own
``ScheduleBatch``, ``PrefillAdder`` and ``UnifiedRadixCache`` under traffic (``sglang_schedule_traffic``): every
step's SWA rows and lens from swa_hal, through the plugin's hooks, equal SGLang's own; the traffic is checked to
contain what it is meant to (prefix hits, chunked extends, decodes, target-verify steps, mixed steps, slot reuse,
SWA eviction, cache eviction, retraction), so a run that degenerates fails."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang")

import sglang_schedule_traffic as ST  # noqa: E402
import sglang_traffic as T  # noqa: E402

from swa_hal.integrations import sglang as integ  # noqa: E402

# Steps per run: the Triton backend (in the interpreter) builds every Traffic.triton_every-th step.
STEPS = 400
MUST_HAPPEN = (
    "prefix_hits",
    "chunked_extends",
    "decodes",
    "verifies",
    "finished",
    "slot_reuse",
    "swa_evicted_tokens",
    "cache_evictions",
    "retractions",
    "rejected_page_frees",
    "builds_cuda",
)


@pytest.fixture(scope="module")
def plugin():
    """SGLang's own loader installs swa_hal's hooks; when this module loaded them, the ops and the loader's
    state are put back afterwards, as test_sglang.py's fixture does, so a later module loads them afresh."""
    import sglang.srt.plugins as sgl_plugins
    from sglang.kernels.ops.attention.dsv4.attn_metadata_kernels import BuildCausalSwaPageIndices
    from sglang.kernels.ops.speculative.dspark.dspark_attn_metadata import BuildDsparkSwaRingIndices
    from sglang.srt.plugins.hook_registry import HookRegistry

    ours = not T.plugin_loaded()
    original = BuildCausalSwaPageIndices.__dict__["execute"], BuildDsparkSwaRingIndices.__dict__["execute"]
    T.load_plugin()
    yield
    if ours:
        BuildCausalSwaPageIndices.execute, BuildDsparkSwaRingIndices.execute = original
        HookRegistry.reset()
        integ._install_once.reset()
        sgl_plugins._plugins_loaded = False
    integ.configure()


# SGLang's page of 128 and a smaller one; the larger page decodes longer, so requests still slide past their
# windows and the pools still run out.
TRAFFIC = {64: T.Traffic(page_size=64), 128: T.Traffic(page_size=128, max_tokens=(40, 320))}


@pytest.mark.parametrize(("seed", "page_size"), [(1, 64), (2, 128)])
def test_traffic_rows_and_lens_equal_sglangs(plugin, seed, page_size):
    engine = T.run(TRAFFIC[page_size], seed, STEPS)
    assert not engine.diffs, engine.diffs[:10]
    missing = [k for k in MUST_HAPPEN if not engine.counts[k]]
    assert not missing, (missing, dict(engine.counts))


# SGLang's own batch, policy and cache: 600 steps per variant (each takes a few seconds).
SCHEDULED_STEPS = 600
SCHEDULED_MUST_HAPPEN = (
    "prefix_hits",
    "chunked_extends",
    "decodes",
    "finished",
    "slot_reuse",
    "rows_past_swa_frees",
    "cache_evicted_tokens",
    "cache_evicted_swa_tokens",
    "retractions",
    "builds_cuda",
)
SCHEDULED = {
    "page64": ST.Traffic(page_size=64),
    "page64-mixed": ST.Traffic(page_size=64, mixed_chunk=True),
    "page128": ST.Traffic(page_size=128, token_budget=256),
}


@pytest.mark.parametrize(("seed", "variant"), [(1, "page64"), (2, "page64-mixed"), (3, "page128")])
def test_sglang_schedule_batch_traffic_rows_and_lens_equal_sglangs(plugin, seed, variant):
    """The steps come from SGLang's real ``ScheduleBatch`` (extend, mixed and decode batches, retraction),
    ``PrefillAdder`` and ``UnifiedRadixCache`` (prefix hits, chunk checkpoints, SWA frees, eviction)."""
    traffic = SCHEDULED[variant]
    engine = ST.run(traffic, seed, SCHEDULED_STEPS)
    assert not engine.diffs, engine.diffs[:10]
    must = SCHEDULED_MUST_HAPPEN + (("mixed_steps",) if traffic.mixed_chunk else ())
    missing = [k for k in must if not engine.counts[k]]
    assert not missing, (missing, dict(engine.counts))


# -- shadow mode on traffic (docs/engines.md #shadow-mode) ----------------------------------------------------

SHADOW_STEPS = 120


def _shadow(monkeypatch, steps: int, every: int, promote: bool):
    from swa_hal.integrations.shadow import Shadow, ShadowSettings

    shadow = Shadow("SGLang", integ.log, ShadowSettings(steps, every, promote))
    monkeypatch.setattr(integ, "_shadow", shadow)
    return shadow


def _counted_causal(monkeypatch, plant=None):
    """Every causal build swa_hal makes, counted; ``plant(call, indices, lens)`` may change its answer."""
    real = integ.SGLangSWAIndices.causal
    calls = []

    def causal(self, **inputs):
        calls.append(1)
        got = real(self, **inputs)
        return plant(len(calls), *got) if plant else got

    monkeypatch.setattr(integ.SGLangSWAIndices, "causal", causal)
    return calls


def test_shadow_on_traffic_stays_equal_and_is_promoted(plugin, monkeypatch):
    """SGLang serves every step while the first 40 calls and one in 5 after them are compared; all equal, so
    after 40 swa_hal serves (SWA_HAL_SHADOW_PROMOTE=1) and its rows equal SGLang's for the rest of the run."""
    shadow = _shadow(monkeypatch, steps=40, every=5, promote=True)
    built = _counted_causal(monkeypatch)
    engine = T.run(TRAFFIC[64], 3, SHADOW_STEPS, backends=("torch",))
    assert not engine.diffs, engine.diffs[:5]
    report = shadow.report()
    assert report["mode"] == "serve" and report["difference"] is None, report
    assert report["compared"] == report["equal"] == 40, report
    # Each build of the traffic is swa_hal's once: compared while shadowing, served after the promotion.
    assert len(built) == engine.counts["builds_torch"] > 40, (len(built), dict(engine.counts))


def test_shadow_on_traffic_finds_a_planted_difference_on_its_call(plugin, monkeypatch):
    """swa_hal's 25th causal build is one off in one entry: the shadow finds it on that call, names the field and
    entry, and compares nothing after; SGLang served every step, so the traffic's own comparison is clean."""
    shadow = _shadow(monkeypatch, steps=10**6, every=1, promote=False)

    def one_off(call, indices, lens):
        if call == 25:
            indices = indices.clone()
            indices[0, 0] += 1
        return indices, lens

    _counted_causal(monkeypatch, one_off)
    engine = T.run(TRAFFIC[64], 4, 60, backends=("torch",))
    assert not engine.diffs, engine.diffs[:5]
    report = shadow.report()
    assert report["mode"] == "off" and report["compared"] == 25 and report["equal"] == 24, report
    assert report["difference"].startswith("call 25 (causal rows): swa_page_indices[0, 0] differs"), report
