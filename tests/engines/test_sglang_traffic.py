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
