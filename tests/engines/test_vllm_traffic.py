"""vLLM's own scheduler and model runner drive swa_hal's SWA builders (``vllm_traffic``, ``vllm_runner``): its real
``AsyncScheduler`` (async scheduling, as vLLM 0.34 runs by default) and ``KVCacheManager`` with prefix caching,
chunked prefill, preemption, MTP and DSpark drafts, V4.1's bounded replay and several SWA KV-cache groups per
step, and its model runner V2 (CUDA-graph padding, nulled and persistent block tables, host upper bounds, the
MTP drafter's own batches, V4.1's decoder replay sub-batches and its specialized decode's recorded metadata
builds); each step's metadata built by vLLM's own SWA builder and by swa_hal's (torch backend
every step, the cuda Triton backend in the interpreter every few steps), field by field equal; the traffic is
checked to contain what it is for.

Run with ``make test-vllm``.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import contextlib
import dataclasses

import pytest

pytest.importorskip("vllm")

import vllm_harness as H  # noqa: E402
import vllm_traffic as T  # noqa: E402

SEED = 20261203
# 1,100 scheduler steps per vLLM release here (the native builds' Triton kernels run in the interpreter:
# about a tenth of a second a step, a fourth with images).
STEPS = 400
VISION_STEPS = 300
LONG_IMAGE_STEPS = 150
V4_STEPS = 100


def check_traffic(engine: T.Engine, *, drafts: bool, steps: int = STEPS) -> None:
    c = engine.counts
    assert not engine.diffs, f"{len(engine.diffs)} steps differ:\n" + "\n".join(engine.diffs[:5])
    assert c["steps"] == steps and c["builds:torch"] == steps, dict(c)
    assert c["builds:cuda"] >= steps // engine.traffic.triton_every, dict(c)
    # What the traffic is for: cache hits on shared prefixes, chunked prompts, preempted and resumed
    # requests, steps that mix decodes and prefills.
    assert c["prefix_cache_hits"] >= 3 and c["prefix_cache_hit_tokens"] >= 3 * engine.variant.block_size, dict(c)
    assert c["chunked_prefill_chunks"] >= 30, dict(c)
    if not engine.traffic.images:  # the vision run's pool is larger: its point is cache hits
        assert c["preemptions"] >= 2 and c["resumed_after_preemption"] >= 2, dict(c)
    assert c["mixed_steps"] >= 50 and c["decode_rows"] > 0 and c["prefill_rows"] > 0, dict(c)
    assert c["requests"] >= 20, dict(c)
    if drafts:
        assert c["draft_steps"] >= steps // 2 and c["accepted_drafts"] > 0 and c["rejected_drafts"] > 0, dict(c)
        if engine.variant.spec_tokens > 1:
            check_drafter(engine, steps)
    else:
        assert c["draft_steps"] == 0, dict(c)
    check_runner(engine)
    for key in ("steps", "prefix_cache_hits", "preemptions", "chunked_prefill_chunks", "draft_steps"):
        H.COUNTS[f"traffic:{key}"] += c[key]


def check_runner(engine: T.Engine, *, padded_full: bool = True) -> None:
    """What vLLM's model runner did to the inputs (tests/engines/vllm_runner.py) was in the traffic: steps
    padded to a FULL graph's request count and to a PIECEWISE graph's token count, block-table entries
    nulled below the window and entries left past a request's blocks by earlier steps."""
    c = engine.counts
    if engine.traffic.cudagraph_mode == "FULL":
        assert c["padded_full_steps"] >= 3 and c["cudagraph:PIECEWISE"] == 0, dict(c)
    elif engine.traffic.images or not padded_full:  # few uniform decode steps off the capture grid
        assert c["cudagraph:FULL"] >= 3 and c["padded_piecewise_steps"] >= 1, dict(c)
    else:
        assert c["padded_full_steps"] >= 3 and c["padded_piecewise_steps"] >= 1, dict(c)
    assert c["nulled_table_entries"] > 0 and c["stale_table_entries"] > 0, dict(c)
    # Async scheduling (on by default, as in vLLM 0.34): a step is scheduled before the last one's rejected
    # drafts are known, so the host sequence lengths are upper bounds above the device's.
    assert engine.traffic.async_scheduling
    if engine.variant.spec_tokens:
        assert c["host_upper_bound_rows"] > 0, dict(c)
    for key in (
        "padded_full_steps",
        "padded_piecewise_steps",
        "nulled_table_entries",
        "stale_table_entries",
        "host_upper_bound_rows",
    ):
        H.COUNTS[f"traffic:{key}"] += c[key]


def check_drafter(engine: T.Engine, steps: int) -> None:
    """vLLM's MTP drafter drafted in batches of its own after the target's steps, some padded to a graph's
    request count, and each draft step's update was compared (not the target's batch updated in place)."""
    c = engine.counts
    assert c["drafter_batches"] >= steps // 4 and c["drafter_padded_requests"] > 0, dict(c)
    assert c["drafter_updates:torch"] >= steps // 4 and c["drafter_updates:cuda"] > 0, dict(c)
    H.COUNTS["traffic:drafter_batches"] += c["drafter_batches"]


def test_mtp_traffic_from_vllms_scheduler_builds_as_vllm(tmp_path):
    """MTP with two drafts (W=6, 8-token blocks): drafts drawn, accepted in part, then the drafter's
    draft-step updates; a 16-block pool under a 24-token budget."""
    engine = T.run(T.Traffic(variant="v4_mtp2_w6b8", num_blocks=16), STEPS, SEED, tmp=tmp_path)
    check_traffic(engine, drafts=True)


def test_plain_traffic_from_vllms_scheduler_builds_as_vllm(tmp_path):
    """No drafts (W=8, 4-token blocks): a 20-block pool under a 24-token budget, requests arriving often."""
    traffic = T.Traffic(variant="v4_w8b4", num_blocks=20, max_tokens=(20, 80), arrivals=0.9)
    engine = T.run(traffic, STEPS, SEED, tmp=tmp_path)
    check_traffic(engine, drafts=False)


def test_vision_traffic_from_vllms_scheduler_builds_as_vllm(tmp_path):
    """Images in the shared prefix (W=6, 4-token blocks, MTP with one draft): vLLM's scheduler prefills an
    image in one chunk (as its GPU platforms set it) and its prefix cache hits end inside images; vLLM's
    ``prepare_attn`` makes the steps' ``mm_req_doc_ranges`` from the requests' image features.

    A request whose image range starts before its chunk (a hit inside an image) gets vLLM's builder's rows
    from swa_hal too (docs/semantics.md #vision-spans): like every other step, it must build as vLLM's does."""
    traffic = T.Traffic(variant="v4_vision_w6b4", images=3, num_blocks=48, num_prefixes=1, adjacent_images=0.5)
    engine = T.run(traffic, VISION_STEPS, SEED, tmp=tmp_path)
    c = engine.counts
    check_traffic(engine, drafts=True, steps=VISION_STEPS)
    assert c["prefix_cache_hits_inside_image"] >= 1 and c["steps_with_span_into_chunk"] >= 1, dict(c)
    assert c["image_rows_visible_steps"] >= 10 and c["adjacent_images"] >= 1, dict(c)
    H.COUNTS["traffic:prefix_cache_hits_inside_image"] += c["prefix_cache_hits_inside_image"]


def test_adjacent_long_images_traffic_builds_as_vllm_up_to_the_documented_differences(tmp_path):
    """Images longer than the window (M = 9 > W = 4, so image rows are widened past it), laid out back to
    back, with an MTP drafter: vLLM's scheduler rolls a chunk back by its one-token lookahead before the next
    image, so the chunk ends inside the previous one (docs/semantics.md #vision-spans). vLLM's builder then
    widens that image's rows to positions no step has written; swa_hal stops them at the request's last
    position and equals vLLM's builder handed the ranges cut there. And vLLM's builder asserts where a step's
    requests list more image ranges than its span buffers hold; swa_hal builds, equal to vLLM's builder
    with room for them. Both differences happen in this traffic, and nothing else differs."""
    traffic = T.SUITE["vision_long_images"]
    engine = T.run(traffic, LONG_IMAGE_STEPS, SEED, tmp=tmp_path)
    c = engine.counts
    check_traffic(engine, drafts=True, steps=LONG_IMAGE_STEPS)
    assert c["adjacent_images"] >= 1 and c["image_rows_visible_steps"] >= 10, dict(c)
    assert c["chunks_ending_inside_image"] >= 1 and c["chunk_inside_image_rows_differ"] >= 1, dict(c)
    assert c["vllm_span_capacity_asserts"] >= 1, dict(c)
    for key in ("chunks_ending_inside_image", "vllm_span_capacity_asserts"):
        H.COUNTS[f"traffic:{key}"] += c[key]


# The hybrid runs: 150 and 100 steps per vLLM release, with the interpreter's overflow checks off (vLLM's
# kernels are the expected values, not under test; swa_hal's keep their checks in the backend tests).
HYBRID_STEPS = 150
DSPARK_STEPS = 100
FULL_STEPS = 100
SPECIALIZED_STEPS = 100


@contextlib.contextmanager
def no_overflow_checks():
    from triton.runtime import interpreter

    before = interpreter.interpreter_builder.options.sanitize_overflow
    T.interpreter_checks(False)
    try:
        yield
    finally:
        T.interpreter_checks(before)


def check_groups(engine: T.Engine, steps: int) -> None:
    """Every step had the SWA groups, and swa_hal built them all in one step build."""
    c = engine.counts
    assert not engine.diffs, f"{len(engine.diffs)} steps differ:\n" + "\n".join(engine.diffs[:5])
    assert c["steps"] == steps and c["builds:torch"] == steps and c["builds:cuda"] >= steps // 8, dict(c)
    assert c["multi_group_steps"] == steps, dict(c)
    assert c["step_builds:torch"] == steps and c["step_builds:cuda"] == c["builds:cuda"], dict(c)
    assert c["prefix_cache_hits"] >= 3 and c["chunked_prefill_chunks"] >= 20 and c["mixed_steps"] >= 20, dict(c)
    for key in ("steps", "multi_group_steps", "prefix_cache_hits", "draft_steps"):
        H.COUNTS[f"traffic:{key}"] += c[key]


def test_v41_bounded_replay_traffic_with_two_swa_groups_builds_as_vllm(tmp_path):
    """V4.1 with bounded replay (W=8, 4-token blocks, MTP with two drafts): a prefix-cacheable group beside
    two SWA groups, as vLLM's V4.1 model lays out its caches, so vLLM's scheduler rewinds each prefix hit by
    a window and hands the request its replay_start; vLLM's V4.1 model state hands the prefills' bounds to
    the builders (and pads the replayed slots of the cacheable group). Both SWA groups, each with its own
    block table, are compared on every build and draft-step update.

    Steps of more than 16 tokens run eagerly (past the largest token graph), and there the model state
    prepares the decoder replay layers' sub-batch (``_prepare_replay_batch``): each prefill trimmed to its
    last window rows, its window KV start raised to ``seq_len - W`` where trimmed, built by builders vLLM
    creates for the sub-batch (vLLM's own, swa_hal's of each backend) and compared too."""
    traffic = T.SUITE["v41_replay"]
    with no_overflow_checks():
        engine = T.run(traffic, HYBRID_STEPS, SEED, tmp=tmp_path)
    c = engine.counts
    check_groups(engine, HYBRID_STEPS)
    # Prefills with a replay bound: their first chunk's windows clamped at it, and later chunks after it.
    assert c["replay_steps"] >= 10 and c["replay_clamped_prefills"] >= 5 and c["replay_later_chunks"] >= 3, dict(c)
    assert c["preemptions"] >= 1 and c["resumed_after_preemption"] >= 1, dict(c)
    check_drafter(engine, HYBRID_STEPS)
    check_runner(engine, padded_full=False)  # padded FULL steps with bounds: the FULL-graph test below
    check_replay_batches(engine, HYBRID_STEPS)
    H.COUNTS["traffic:replay_steps"] += c["replay_steps"]


def check_replay_batches(engine: T.Engine, steps: int) -> None:
    """The decoder replay sub-batches were in the traffic: prefills trimmed to their last window rows, window
    KV starts raised above the scheduler's replay start, each sub-batch compared on every torch build and on
    the Triton backend's steps, by builders vLLM created for it from each group's backend (two replay
    groups and the first layer's own: 3 on each side, every one of the side's family)."""
    c = engine.counts
    assert c["replay_batches"] >= steps // 15 and c["replay_batch_trimmed_requests"] >= c["replay_batches"], dict(c)
    assert c["replay_batch_raised_kv_starts"] >= steps // 30, dict(c)
    assert c["replay_batch_builds:torch"] == c["replay_batches"] and c["replay_batch_builds:cuda"] >= 1, dict(c)
    assert c["replay_batch_builders:native"] == 3 and c["replay_batch_builders:torch"] == 3, dict(c)
    assert c["replay_batch_builders:cuda"] == 3, dict(c)
    for key in ("replay_batches", "replay_batch_trimmed_requests", "replay_batch_raised_kv_starts"):
        H.COUNTS[f"traffic:{key}"] += c[key]


def test_v41_specialized_decode_traffic_builds_as_vllm(tmp_path):
    """V4.1's specialized decode (``decode_backend=latency_specialized``): vLLM's
    ``DeepseekV41SpecializedDecodeModelState`` with FlashInfer's SWA builder, bounded replay and the decoder
    replay layers, MTP with two drafts. At start-up it records the metadata build of every uniform-decode
    shape its FULL decode graphs serve, on a dummy batch with worst-case host sequence lengths; every FULL
    uniform-decode step then replays that recording instead of building (vllm_runner.cpu_metadata_graphs:
    the recorded build re-run on the step's device buffers, its tensors refreshed in place). swa_hal's
    replayed metadata must equal vLLM's on every such step, as its eager builds do on the others."""
    with no_overflow_checks():
        engine = T.run(T.SUITE["v41_specialized_decode"], SPECIALIZED_STEPS, SEED, tmp=tmp_path)
    c = engine.counts
    check_groups(engine, SPECIALIZED_STEPS)
    check_drafter(engine, SPECIALIZED_STEPS)
    check_runner(engine, padded_full=False)
    check_replay_batches(engine, SPECIALIZED_STEPS)
    steps = c["metadata_graph_steps"]
    assert steps >= SPECIALIZED_STEPS // 4 and c["metadata_graph_replays:torch"] == steps, dict(c)
    assert c["metadata_graph_replays:native"] == steps and c["metadata_graph_replays:cuda"] >= 1, dict(c)
    # The stand-in holds for vLLM's own recordable builder: its replays leave no field stale.
    assert c["metadata_graph_stale_fields:native"] == 0, dict(c)
    H.COUNTS["traffic:metadata_graph_steps"] += steps


@pytest.mark.parametrize("swa_groups", [1, 2])
def test_v41_replay_traffic_in_full_graphs_builds_as_vllm(tmp_path, swa_groups):
    """V4.1 with bounded replay where every step runs a FULL CUDA graph (``cudagraph_mode=FULL``): vLLM pads
    each step's requests to the captured count and slices the model state's bounds, one per real request,
    with the padded count, so the builders get fewer bounds than requests. Padding requests have no bound
    (docs/semantics.md #bounded-replay, vector R3): swa_hal builds every such step as vLLM does, prefills
    with bounds among them, and hands out zeros for the padding requests' bounds; with one SWA group (each
    group's builder builds alone) and with two (one step build for both)."""
    traffic = T.Traffic(
        variant="v41_w8b4",
        spec_tokens=2,
        swa_groups=swa_groups,
        cacheable_group=True,
        num_blocks=96,
        cudagraph_mode="FULL",
    )
    steps = FULL_STEPS if swa_groups > 1 else FULL_STEPS // 2
    with no_overflow_checks():
        engine = T.run(traffic, steps, SEED, tmp=tmp_path)
    c = engine.counts
    if swa_groups > 1:
        check_groups(engine, steps)
    else:
        assert not engine.diffs, f"{len(engine.diffs)} steps differ:\n" + "\n".join(engine.diffs[:5])
        assert c["steps"] == steps and c["builds:cuda"] >= steps // 8 and c["multi_group_steps"] == 0, dict(c)
    check_runner(engine)
    assert c["padded_full_replay_steps"] >= steps // 2 and c["replay_clamped_prefills"] >= 3, dict(c)
    H.COUNTS["traffic:padded_full_replay_steps"] += c["padded_full_replay_steps"]


def test_dspark_traffic_with_two_swa_groups_builds_as_vllm(tmp_path):
    """DSpark with three drafts (W=5, 4-token blocks) from a real ``SpeculativeConfig`` (method
    ``dspark``), two SWA groups beside a prefix-cacheable one: the target's verification steps. DSpark
    drafts in one forward: there is no draft step to update between."""
    traffic = T.Traffic(variant="v4_dspark3_w5b4", swa_groups=2, cacheable_group=True, num_blocks=160)
    with no_overflow_checks():
        engine = T.run(traffic, DSPARK_STEPS, SEED, tmp=tmp_path)
    c = engine.counts
    check_groups(engine, DSPARK_STEPS)
    check_runner(engine, padded_full=False)
    assert c["draft_steps"] >= DSPARK_STEPS // 2 and c["accepted_drafts"] > 0 and c["rejected_drafts"] > 0, dict(c)
    assert c["draft_tokens"] >= 3 * c["draft_steps"] and c["replay_steps"] == 0, dict(c)


def test_deepseek_v4_geometry_traffic_builds_as_vllm(tmp_path):
    """DeepSeek-V4's own SWA geometry (W = 128, 64-token blocks, MTP-1): prompts of hundreds of tokens under a
    512-token budget and a 32-block pool, so rows span several pages, windows reach below the nulled table
    entries' positions only where the runner left them, and chunks cut through pages (the long run's traffic)."""
    traffic = dataclasses.replace(T.SUITE["v4_geometry"], triton_every=10)
    engine = T.run(traffic, V4_STEPS, SEED, tmp=tmp_path)
    c = engine.counts
    assert not engine.diffs, f"{len(engine.diffs)} steps differ:\n" + "\n".join(engine.diffs[:5])
    assert c["steps"] == V4_STEPS and c["builds:cuda"] >= V4_STEPS // 10, dict(c)
    assert c["prefix_cache_hits"] >= 3 and c["chunked_prefill_chunks"] >= 3 and c["mixed_steps"] >= 5, dict(c)
    check_runner(engine)
    H.COUNTS["traffic:v4_geometry_steps"] += c["steps"]


# -- shadow mode on traffic (docs/engines.md #shadow-mode) ----------------------------------------------------


@contextlib.contextmanager
def shadow_plugin(steps: int, every: int, promote: bool):
    """The plugin loaded with ``SWA_HAL_VLLM=shadow`` and these shadow settings (as vLLM loads it), the serving
    plugin back afterwards."""
    from swa_hal.integrations import vllm as integ
    from swa_hal.integrations import vllm_shadow

    settings = {
        "SWA_HAL_VLLM": "shadow",
        "SWA_HAL_SHADOW_STEPS": str(steps),
        "SWA_HAL_SHADOW_EVERY": str(every),
        "SWA_HAL_SHADOW_PROMOTE": "1" if promote else "0",
    }
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        integ.unregister()
        integ.register()
        yield vllm_shadow.current()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        integ.unregister()
        integ.register()


# MTP with two drafts and two SWA groups: builds and draft updates, async host bounds, graph padding. (No replay
# bounds: vLLM's padded steps leave their padding requests without one, which the traffic's own comparison holds
# swa_hal's zeros to; while vLLM serves there are none. The shadow's V4.1 replay is tests/engines/test_vllm_drift.py's.)
SHADOW_TRAFFIC = T.Traffic(variant="v4_mtp2_w6b8", swa_groups=2, num_blocks=32)


def test_shadow_on_traffic_stays_equal_and_is_promoted(tmp_path):
    """MTP drafts and two SWA groups under vLLM's scheduler and model runner: vLLM's own builds serve while the
    first 60 builds and updates and one in 10 after them are compared; all equal, so swa_hal serves after 60, at
    the addresses vLLM's builds filled, and its metadata equals vLLM's builders' for the rest of the run (the
    traffic's own comparison, every step)."""
    with shadow_plugin(steps=60, every=10, promote=True) as shadow:
        engine = T.run(SHADOW_TRAFFIC, 120, SEED, backends=("torch",), tmp=tmp_path)
    assert not engine.diffs, "\n".join(engine.diffs[:5])
    report = shadow.report()
    assert report["mode"] == "serve" and report["difference"] is None, report
    assert report["equal"] == report["compared"] == 60, report
    assert engine.counts["draft_steps"] > 0, dict(engine.counts)


def test_shadow_on_traffic_finds_a_planted_difference_on_its_call(tmp_path, monkeypatch):
    """swa_hal's build answering one decode length one off at the shadow's 30th call: found on that call,
    named by field and entry; vLLM served every step, so the traffic's own comparison stays clean."""
    from swa_hal.integrations import vllm_builder, vllm_shadow

    real = vllm_builder.SwaHalSparseSWAMetadataBuilder.swa_hal_build
    planted = []

    def one_off(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if vllm_shadow.current().calls >= 30 and not planted and out.num_decode_tokens:
            planted.append(vllm_shadow.current().calls)
            out.decode_swa_lens[0] += 1
        return out

    monkeypatch.setattr(vllm_builder.SwaHalSparseSWAMetadataBuilder, "swa_hal_build", one_off)
    with shadow_plugin(steps=10**6, every=1, promote=False) as shadow:
        engine = T.run(SHADOW_TRAFFIC, 40, SEED, backends=("torch",), tmp=tmp_path)
    assert not engine.diffs, "\n".join(engine.diffs[:5])
    report = shadow.report()
    (call,) = planted
    assert report["mode"] == "off" and report["compared"] == call and report["equal"] == call - 1, report
    assert report["difference"].startswith(f"call {call} (build of "), report
    assert "decode_swa_lens[0] differs: vLLM " in report["difference"], report
