"""vLLM's own scheduler drives swa_hal's SWA builders (``vllm_traffic``): its real ``Scheduler`` and
``KVCacheManager`` with prefix caching, chunked prefill, preemption and MTP drafts, each step's metadata
built by vLLM's own SWA builder and by swa_hal's (torch backend every step, the cuda Triton backend in the
interpreter every few steps), field by field equal; the traffic is checked to contain what it is for.

Run with ``make test-vllm``.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import pytest

pytest.importorskip("vllm")

import vllm_harness as H  # noqa: E402
import vllm_traffic as T  # noqa: E402

SEED = 20261203
# 1,100 scheduler steps per vLLM release in all (the native builds' Triton kernels run in the interpreter:
# about a tenth of a second a step, a fourth with images).
STEPS = 400
VISION_STEPS = 300


def check_traffic(engine: T.Engine, *, drafts: bool, steps: int = STEPS) -> None:
    c = engine.counts
    assert not engine.diffs, f"{len(engine.diffs)} steps differ:\n" + "\n".join(engine.diffs[:5])
    assert c["steps"] == steps and c["builds:torch"] == steps, dict(c)
    assert c["builds:cuda"] >= steps // engine.traffic.triton_every, dict(c)
    # What the traffic is for: cache hits on shared prefixes, chunked prompts, preempted and resumed
    # requests, steps that mix decodes and prefills.
    assert c["prefix_cache_hits"] >= 3 and c["prefix_cache_hit_tokens"] >= 3 * engine.variant.block_size, dict(c)
    assert c["chunked_prefill_chunks"] >= 50, dict(c)
    if not engine.traffic.images:  # the vision run's pool is larger: its point is cache hits
        assert c["preemptions"] >= 2 and c["resumed_after_preemption"] >= 2, dict(c)
    assert c["mixed_steps"] >= 50 and c["decode_rows"] > 0 and c["prefill_rows"] > 0, dict(c)
    assert c["requests"] >= 20, dict(c)
    if drafts:
        assert c["draft_steps"] >= steps // 2 and c["accepted_drafts"] > 0 and c["rejected_drafts"] > 0, dict(c)
        if engine.variant.spec_tokens > 1:
            assert c["draft_updates:torch"] >= steps // 4 and c["draft_updates:cuda"] > 0, dict(c)
    else:
        assert c["draft_steps"] == 0, dict(c)
    for key in ("steps", "prefix_cache_hits", "preemptions", "chunked_prefill_chunks", "draft_steps"):
        H.COUNTS[f"traffic:{key}"] += c[key]


def test_mtp_traffic_from_vllms_scheduler_builds_as_vllm(tmp_path):
    """MTP with two drafts (W=6, 8-token blocks): drafts drawn, accepted in part, then the drafter's
    draft-step updates; a 16-block pool under a 24-token budget."""
    engine = T.run(T.Traffic(variant="v4_mtp2_w6b8", num_blocks=16), STEPS, SEED, tmp=tmp_path)
    check_traffic(engine, drafts=True)


def test_plain_traffic_from_vllms_scheduler_builds_as_vllm(tmp_path):
    """No drafts (W=8, 4-token blocks): a 24-block pool under a 24-token budget."""
    engine = T.run(T.Traffic(variant="v4_w8b4", num_blocks=24), STEPS, SEED, tmp=tmp_path)
    check_traffic(engine, drafts=False)


def test_vision_traffic_from_vllms_scheduler_builds_as_vllm(tmp_path):
    """Images in the shared prefix (W=6, 4-token blocks, MTP with one draft): vLLM's scheduler prefills an
    image in one chunk (as its GPU platforms set it) and its prefix cache hits end inside images; vLLM's
    ``prepare_attn`` makes the steps' ``mm_req_doc_ranges`` from the requests' image features.

    A request whose image range starts before its chunk (a hit inside an image) gets vLLM's builder's rows
    from swa_hal too (docs/semantics.md #vision-spans): like every other step, it must build as vLLM's does."""
    traffic = T.Traffic(variant="v4_vision_w6b4", images=3, num_blocks=48, num_prefixes=1)
    engine = T.run(traffic, VISION_STEPS, SEED, tmp=tmp_path)
    c = engine.counts
    check_traffic(engine, drafts=True, steps=VISION_STEPS)
    assert c["prefix_cache_hits_inside_image"] >= 1 and c["steps_with_span_into_chunk"] >= 1, dict(c)
    assert c["image_rows_visible_steps"] >= 10, dict(c)
    H.COUNTS["traffic:prefix_cache_hits_inside_image"] += c["prefix_cache_hits_inside_image"]
