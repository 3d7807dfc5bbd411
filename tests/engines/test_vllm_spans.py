"""Image spans against vLLM's own DeepSeek-V4 SWA builders (docs/semantics.md #vision-spans): an image that
began before the chunk (a prefix-cache hit, or an earlier chunk, ended inside it), one longer than
max_image_tokens, and, where swa_hal departs from vLLM on purpose (#engine-parity), one that goes on past the
chunk and one whose rows need more than their width.

Each equality test builds the same ``CommonAttentionMetadata`` (with ``mm_req_doc_ranges``) with vLLM's
native builder class and with the swa_hal builder vLLM would get for it, on every swa_hal backend, and
compares every field vLLM's builder fills (``vllm_harness.compare``), as tests/engines/test_vllm.py does.
Run in the vLLM environment of ``make test-vllm`` (vLLM on its CPU platform, Triton in the interpreter).
"""

from __future__ import annotations

import os

# vLLM on its CPU platform, before anything imports it (tests/engines/test_vllm.py says why).
os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import random

import pytest
import torch

pytest.importorskip("vllm")

import vllm_harness as H
from vllm.models.deepseek_v4.nvidia import flashinfer_sparse as v4_flashinfer
from vllm.models.deepseek_v4.nvidia import flashmla as v4_flashmla
from vllm.v1.attention.backends.mla import sparse_swa
from vllm.v1.attention.ops.flashmla import FlashMLASchedMeta

from swa_hal import AttentionBatch
from swa_hal.integrations import vllm as integ

CPU = torch.device("cpu")
LAYER = "model.layers.0.attn.swa_cache"
SEED = 20261207
# The Triton backends, each on the first platform it declares (the kernels run in the interpreter).
TRITON_BACKENDS = {
    "cuda": "vendor=cuda,capability=9.0",
    "sm12x": "vendor=cuda,capability=12.0",
    "rocm": "vendor=rocm,arch=gfx942,capability=9.4",
    "xpu": "vendor=xpu",
}
BACKENDS = ["torch", *TRITON_BACKENDS]
VARIANTS = {
    v.name: v
    for v in (
        # docs/semantics.md #vision-spans vectors V7, V9 (M <= W) and V8 (M > W).
        H.Variant("v4_vision_w4b4_m4", window=4, block_size=4, max_image_tokens=4),
        H.Variant("v4_vision_w4b4_m8", window=4, block_size=4, max_image_tokens=8),
        # vLLM's own in-image visibility test's setup: W = 8, M = 6, 64-token pages.
        H.Variant("v4_vision_w8b64_m6", window=8, block_size=64, max_image_tokens=6),
        # M > W: an image longer than M + W = 13 needs rows wider than W + M.
        H.Variant("v4_vision_w4b2_m9", window=4, block_size=2, max_image_tokens=9),
        H.Variant("v4_vision_w6b4_m5_mtp", window=6, block_size=4, max_image_tokens=5, spec_tokens=1),
    )
}


@pytest.fixture(scope="module", autouse=True)
def planner_stub():
    """FlashMLA's planner needs CUDA; the builders only create one fresh planner object per layer type."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sparse_swa, "get_mla_metadata", lambda *a, **k: (FlashMLASchedMeta(), None))
        yield


@pytest.fixture(scope="module")
def vllm_configs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf-spans")
    return {name: H.make_vllm_config(v, tmp) for name, v in VARIANTS.items()}


@pytest.fixture(scope="module")
def rocm():
    return H.import_rocm_modules()


def natives(rocm):
    """vLLM's DeepSeek-V4 SWA builder classes: the base, FlashMLA, FlashInfer and ROCm AITER."""
    return (
        sparse_swa.DeepseekSparseSWAMetadataBuilder,
        v4_flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder,
        v4_flashinfer.DeepseekSparseSWAFlashInferMetadataBuilder,
        rocm[0].DeepseekV4ROCMAiterSparseSWAMetadataBuilder,
    )


def builders(native_cls, variant, vllm_configs, backend):
    v, vc = VARIANTS[variant], vllm_configs[variant]
    spec = H.make_kv_spec(v)
    kw = {"backend": backend, **({"platform": TRITON_BACKENDS[backend]} if backend != "torch" else {})}
    native = native_cls(spec, [LAYER], vc, CPU)
    ours = integ.swa_hal_builder_cls(native_cls)(spec, [LAYER], vc, CPU, **kw)
    H.force_rocm_ragged_prefill(native, ours)
    return native, ours, H.swa_config_for(v, vc)


def build_both(native, ours, batch, ranges):
    got_native = native.build(0, H.common_metadata(batch, image_ranges=ranges), replay_start=batch.replay_start)
    got_ours = ours.build(0, H.common_metadata(batch, image_ranges=ranges), replay_start=batch.replay_start)
    return got_native, got_ours


def step(seqs, queries, block_size, *, seed=0, pages=None, replay_start=None):
    """A step of these lengths over shuffled distinct pages (one spare page per request)."""
    pages = pages or max(-(-s // block_size) for s in seqs) + 1
    g = torch.Generator().manual_seed(seed)
    table = torch.randperm(len(seqs) * pages, generator=g, dtype=torch.int64).to(torch.int32).view(len(seqs), pages)
    return AttentionBatch.from_lists(seqs, queries, table, block_size=block_size, replay_start=replay_start)


def prefill_part(md, field):
    """A per-token field (indexed by token row, like the visibility arrays) on the prefill rows."""
    return getattr(md, field)[md.num_decode_tokens : md.num_decode_tokens + md.num_prefill_tokens].tolist()


def assert_in_cache(md, batch, block_size):
    """Every index handed out is -1 or a slot of a page of the step's table; no length is negative."""
    slots = set((batch.block_table.long() * block_size).view(-1, 1).add(torch.arange(block_size)).view(-1).tolist())
    for part in ("decode", "prefill"):
        idx, lens = getattr(md, f"{part}_swa_indices"), getattr(md, f"{part}_swa_lens")
        if idx is None or lens.numel() == 0:
            continue
        assert int(lens.min()) >= 0
        assert set(idx[idx >= 0].tolist()) <= slots and bool((idx >= -1).all())
    if md.prefill_gather_lens is not None:
        assert int(md.prefill_gather_lens.min()) >= 0


# -- equal to vLLM's builder ------------------------------------------------------------------------------

# name: variant, seq_lens, query_lens, mm_req_doc_ranges, replay_start, and where the docs give them, the prefill
# lens, left and right visibility and gather lens (docs/semantics.md #vision-spans, vectors V7-V9) that vLLM's
# builder and swa_hal's must both hand out.
CASES = {
    # The prefix-cache hit of the report: positions 8..15, the image 7..10 begins one position before them.
    "V7 prefix-cache hit inside an image": (
        "v4_vision_w4b4_m4",
        [16],
        [8],
        {0: [(7, 10)]},
        None,
        ([6, 5, 4, 4, 4, 4, 4, 4], [1, 2, 3, 0, 0, 0, 0, 0], [2, 1, 0, 0, 0, 0, 0, 0], [11]),
    ),
    "V8 image began more than W - 1 before the chunk": (
        "v4_vision_w4b4_m8",
        [16],
        [6],
        {0: [(4, 11)]},
        None,
        ([8, 8, 4, 4, 4, 4], [6, 7, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [9]),
    ),
    # A decode (its image, 0..3, lies before its new token), then two prefills of which only the second straddles.
    "V9 two prefills, one straddling": (
        "v4_vision_w4b4_m4",
        [7, 10, 9],
        [1, 4, 3],
        {0: [(0, 3)], 1: [(6, 8)], 2: [(4, 7)]},
        None,
        ([6, 5, 4, 4, 5, 4, 4], [0, 1, 2, 0, 2, 3, 0], [2, 1, 0, 0, 1, 0, 0], [7, 6]),
    ),
    # vLLM's test_builder_in_image_visibility: a 9-token image with M = 6, and a 16-token one.
    "vLLM's 9-token image, M = 6": (
        "v4_vision_w8b64_m6",
        [30, 12],
        [30, 12],
        {0: [(4, 12), (20, 24)], 1: []},
        None,
        None,
    ),
    "vLLM's 16-token image, M = 6": ("v4_vision_w8b64_m6", [26], [26], {0: [(2, 17)]}, None, None),
    # The same images, resumed inside: the chunk starts 14 and 4 positions into them.
    "a chunk that starts inside a 16-token image": ("v4_vision_w8b64_m6", [26], [10], {0: [(2, 17)]}, None, None),
    "a chunk that starts inside a 9-token image": (
        "v4_vision_w8b64_m6",
        [30, 12],
        [22, 12],
        {0: [(4, 12), (20, 24)], 1: [(0, 11)]},
        None,
        None,
    ),
    # An image whose start is far below the window, long images, an MTP decode and replay bounds.
    "straddling images with replay bounds": (
        "v4_vision_w6b4_m5_mtp",
        [15, 30, 28],
        [2, 9, 12],
        {1: [(3, 23)], 2: [(14, 18), (19, 21)]},
        [3, 18, 10],
        None,
    ),
    "M > W, an image of M + W tokens resumed inside": ("v4_vision_w4b2_m9", [30], [7], {0: [(14, 26)]}, None, None),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_straddling_and_long_images_equal_vllms_builder(vllm_configs, rocm, case, backend):
    variant, seqs, queries, ranges, replay, want = CASES[case]
    block_size = VARIANTS[variant].block_size
    for i, native_cls in enumerate(natives(rocm)):
        native, ours, cfg = builders(native_cls, variant, vllm_configs, backend)
        batch = step(seqs, queries, block_size, seed=i, replay_start=replay)
        got_native, got_ours = build_both(native, ours, batch, ranges)
        diffs = H.compare(got_native, got_ours, batch)
        assert not diffs, f"{native_cls.__name__}:\n" + "\n".join(diffs)
        if want is not None:
            lens, left, right, gather = want
            for md in (got_native, got_ours):
                assert md.prefill_swa_lens.tolist() == lens
                assert prefill_part(md, "prefill_left_visible") == left
                assert prefill_part(md, "prefill_right_visible") == right
                assert md.prefill_gather_lens.tolist() == gather
        assert_in_cache(got_ours, batch, block_size)
        ours.swa_hal.check()  # no span here is malformed: a guarded build empties nothing and records nothing


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_straddling_and_long_images_equal_vllms_builder(vllm_configs, rocm, backend):
    """swa_hal's random spans (``random_batch``): inside the new tokens, straddling their start and longer
    than M, each within what vLLM's builder handles safely; plus vLLM's other images of the request."""
    rng = random.Random(f"{SEED}-{backend}")
    straddling = 0
    for j, variant in enumerate(
        ("v4_vision_w4b4_m4", "v4_vision_w4b4_m8", "v4_vision_w4b2_m9", "v4_vision_w6b4_m5_mtp")
    ):
        for i, kind in enumerate(("prefill", "mixed", "prefill")):
            native, ours, cfg = builders(natives(rocm)[(i + j) % 4], variant, vllm_configs, backend)
            batch, ranges = H.draw(cfg, rng, kind, replay=0.5, spans=1.0)
            got_native, got_ours = build_both(native, ours, batch, ranges)
            diffs = H.compare(got_native, got_ours, batch)
            assert not diffs, f"{variant} {kind} #{i}:\n" + "\n".join(diffs)
            ours.swa_hal.check()
            qsl, seqs = batch.query_start_loc_cpu.tolist(), batch.seq_lens_cpu.tolist()
            for r, spans in (ranges or {}).items():
                first = seqs[r] - (qsl[r + 1] - qsl[r])
                straddling += sum(a < first <= e for a, e in spans)
    assert straddling >= 3


# -- where swa_hal departs from vLLM on purpose (docs/semantics.md #engine-parity) ------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_chunk_ending_inside_an_image_native_reads_unwritten_positions_swa_hal_stops_at_the_last(
    vllm_configs, backend
):
    """docs/semantics.md #vision-spans, vector V11. vLLM 0.33's scheduler can end a chunk inside an image (one
    the chunk also starts inside, after a prefix-cache hit); vLLM's builder (0.33's and 0.34's are the same)
    then widens the image's rows to positions this step has not written. swa_hal cuts the span at S - 1."""
    native, ours, cfg = builders(
        sparse_swa.DeepseekSparseSWAMetadataBuilder, "v4_vision_w4b4_m4", vllm_configs, backend
    )
    # Positions 4..11 of a 12-token sequence; page 3 (positions 12..15) holds block 0, vLLM's table entry for a
    # page not allocated yet.
    batch = AttentionBatch.from_lists([12], [8], [[3, 1, 2, 0]], block_size=4)
    ranges = {0: [(9, 14)]}
    got_native, got_ours = build_both(native, ours, batch, ranges)
    # vLLM: the rows of positions 9, 10, 11 reach positions 13, 14, 14, on page 3 (slots 0, 1, 2).
    assert prefill_part(got_native, "prefill_right_visible")[5:] == [4, 4, 3]
    assert got_native.prefill_swa_lens[5:].tolist() == [8, 8, 7]
    assert got_native.prefill_swa_indices[5, 0, :8].tolist() == [6, 7, 8, 9, 10, 11, 0, 1]
    # swa_hal: the rows stop at position 11 (slot 11), the last one this step writes.
    assert prefill_part(got_ours, "prefill_right_visible")[5:] == [2, 1, 0]
    assert got_ours.prefill_swa_lens[5:].tolist() == [6, 5, 4]
    assert got_ours.prefill_swa_indices[5, 0, :7].tolist() == [6, 7, 8, 9, 10, 11, -1]
    assert not set(got_ours.prefill_swa_indices.view(-1).tolist()) & {0, 1, 2, 3}  # nothing of page 3
    # Everything else is vLLM's: the rows before the image, the left visibility, the gather length.
    assert torch.equal(got_native.prefill_swa_indices[:5], got_ours.prefill_swa_indices[:5])
    assert torch.equal(got_native.prefill_swa_lens[:5], got_ours.prefill_swa_lens[:5])
    assert prefill_part(got_native, "prefill_left_visible") == prefill_part(got_ours, "prefill_left_visible")
    assert got_native.prefill_gather_lens.tolist() == got_ours.prefill_gather_lens.tolist() == [11]
    assert_in_cache(got_ours, batch, 4)
    ours.swa_hal.check()  # a valid span: nothing recorded


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_row_longer_than_its_width_native_length_past_the_row_swa_hal_keeps_the_width(vllm_configs, backend):
    """docs/semantics.md #vision-spans, vector V12's rule on vLLM: with M = 9 > W = 4 a 16-token image's rows
    need up to 2M = 18 entries. vLLM's builder writes the row's W + M = 13 entries and hands out the longer
    length; swa_hal hands out the same entries with the row's width as the length."""
    native, ours, cfg = builders(
        sparse_swa.DeepseekSparseSWAMetadataBuilder, "v4_vision_w4b2_m9", vllm_configs, backend
    )
    width = cfg.window_size + cfg.max_image_tokens
    batch = step([16], [16], cfg.block_size)
    got_native, got_ours = build_both(native, ours, batch, {0: [(0, 15)]})
    native_lens = got_native.prefill_swa_lens.tolist()
    assert max(native_lens) > width  # e.g. position 8: left 8, right 7, positions 0..15
    assert got_ours.prefill_swa_lens.tolist() == [min(n, width) for n in native_lens]
    assert torch.equal(got_native.prefill_swa_indices, got_ours.prefill_swa_indices)
    for f in ("prefill_left_visible", "prefill_right_visible", "prefill_gather_lens"):
        assert getattr(got_native, f).tolist() == getattr(got_ours, f).tolist(), f
    assert_in_cache(got_ours, batch, cfg.block_size)
    ours.swa_hal.check()


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_rows_below_the_gather_come_from_the_paged_cache_and_the_gather_is_vllms(vllm_configs, rocm, backend):
    """docs/semantics.md #vision-spans, vector V8: an image that began more than W - 1 positions before the
    chunk. The gather length is vLLM's builder's, q + min(P, W - 1), the bound vLLM sizes its gather workspace
    by; the paged rows reach the image's start below the gather, and vLLM's ROCm V4 combine, which indexes the
    gathered buffer, starts those rows at the gather's first position: inside the request's gathered rows."""
    native, ours, cfg = builders(
        sparse_swa.DeepseekSparseSWAMetadataBuilder, "v4_vision_w4b4_m8", vllm_configs, backend
    )
    batch = step([16], [6], cfg.block_size)
    got_native, got_ours = build_both(native, ours, batch, {0: [(4, 11)]})
    assert not H.compare(got_native, got_ours, batch)
    gather = int(got_ours.prefill_gather_lens[0])
    assert gather == 6 + min(10, cfg.window_size - 1) == 9
    table = batch.block_table[0].tolist()
    slot = lambda p: table[p // 4] * 4 + p % 4  # noqa: E731
    # The rows of positions 10 and 11 start at the image's start, 4; the gather starts at 16 - 9 = 7.
    assert got_ours.prefill_swa_indices[0, 0, :8].tolist() == [slot(p) for p in range(4, 12)]
    # vLLM's ROCm V4 combine on swa_hal's metadata (one request: N = 0 compressed rows, M = gather rows).
    combined, lens = rocm[0].combine_topk_swa_indices(
        torch.zeros((6, 1), dtype=torch.int32),
        got_ours.query_start_loc,
        got_ours.prefill_seq_lens,
        got_ours.prefill_gather_lens,
        cfg.window_size,
        1,
        0,
        gather,
        0,
        max_image_tokens=cfg.max_image_tokens,
        left_visible=got_ours.prefill_left_visible,
        right_visible=got_ours.prefill_right_visible,
    )
    rows = [combined[t, : int(lens[t])].tolist() for t in range(6)]
    # Buffer row k holds position 7 + k: position 10 sees 7..11, position 11 7..11, then plain windows.
    assert rows[:3] == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4], [2, 3, 4, 5]]
    assert all(0 <= i < gather for row in rows for i in row)
