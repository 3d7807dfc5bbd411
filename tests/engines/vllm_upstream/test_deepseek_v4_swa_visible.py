# Copied from vLLM (https://github.com/vllm-project/vllm), file tests/v1/attention/test_deepseek_v4_swa_visible.py at
# commit 06d0369d75e060e83dffac3e0190ceff8fc37e12. Copyright contributors to the vLLM project. Licensed under the
# Apache License, Version 2.0 (the "License"); you may not use this file except in compliance with the License. You
# may obtain a copy of the License at http://www.apache.org/licenses/LICENSE-2.0 (the repository's LICENSE file
# holds it).
#
# Changes from the upstream file, nothing else (no assertion edited):
# - only the tests of the SWA metadata builder (``make_builder`` / ``build_metadata`` and the ``test_builder_*`` and
#   ``test_v41_image_prefill_uses_causal_swa`` tests, with the reference helpers they use) are copied: the file's
#   other tests call vLLM's index and combine kernels directly (``_compute_swa_indices_and_lens_kernel``,
#   ``_compute_image_visibility_kernel``, ``combine_topk_swa_indices``, ``build_flashinfer_mixed_sparse_indices``),
#   which swa_hal does not replace; the imports only they use (``inspect``, ``TypedDict``, those kernels) go with them;
# - the tests run on the CPU: their ``skipif(not torch.cuda.is_available())`` marks are dropped and every
#   ``torch.device("cuda")`` / ``device="cuda"`` is ``DEVICE``, the CPU (vLLM's builders and ops are Triton kernels
#   and torch code, which run in the Triton interpreter; upstream runs the file on CUDA only);
# - ``create_vllm_config`` comes from ``vllm_test_utils`` (this folder), a stand-in for upstream's
#   ``tests.v1.attention.utils`` helper that loads a local DeepSeek-V4 config instead of downloading a model.
#
# conftest.py says how the file runs twice (against vLLM's own builders, and with swa_hal's plugin registered) and
# which tests reach swa_hal.
"""Tests for DeepSeek-V4 in-image bidirectional SWA visibility (vision variant).

The reference semantics are a torch port of the official
``get_image_visible`` / ``get_window_topk_idxs_visible``: inside an image span
[span_start, span_end] (inclusive), a token at ``pos`` sees
``min(pos - span_start, max_image_tokens - 1)`` extra tokens to the left and
``min(span_end - pos, max_image_tokens)`` to the right; the window then starts
at ``max(pos - (window - 1) - max(left - (window - 1), 0), 0)`` and ends at
``pos + right`` (inclusive).
"""

import pytest
import torch

from vllm_test_utils import create_vllm_config
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.mla.sparse_swa import (
    DeepseekSparseSWAMetadataBuilder,
)
from vllm.v1.kv_cache_interface import SlidingWindowMLASpec

DEVICE = torch.device("cpu")

WINDOW = 8
MAX_IMG = 6
WIDTH = WINDOW + MAX_IMG
BLOCK_SIZE = 64


def ref_left_right(
    seq_lens: list[int],
    query_lens: list[int],
    spans_per_req: list[list[tuple[int, int]]],
    max_image_tokens: int,
) -> tuple[list[int], list[int]]:
    """Per-token (left, right) for the flattened decode-first token stream."""
    lefts: list[int] = []
    rights: list[int] = []
    for seq_len, query_len, spans in zip(seq_lens, query_lens, spans_per_req):
        prefix_len = seq_len - query_len
        for i in range(query_len):
            pos = prefix_len + i
            left = right = 0
            for span_start, span_end in spans:
                if span_start <= pos <= span_end:
                    left = min(pos - span_start, max_image_tokens - 1)
                    right = min(span_end - pos, max_image_tokens)
            lefts.append(left)
            rights.append(right)
    return lefts, rights


def ref_swa_bounds(
    pos: int, window: int, left: int, right: int, replay_start: int = 0
) -> tuple[int, int]:
    """Reference [start, end) window bounds for one query token. Under SWA
    bounded replay no window KV exists below ``replay_start``."""
    left_add = max(left - (window - 1), 0)
    start = max(pos - (window - 1) - left_add, 0, replay_start)
    return start, pos + right + 1


def make_batch(
    seq_lens: list[int],
    query_lens: list[int],
    device: torch.device,
):
    """Build the kernel inputs for a decode-first batch."""
    num_reqs = len(seq_lens)
    query_start_loc = torch.zeros(num_reqs + 1, dtype=torch.int32, device=device)
    query_start_loc[1:] = torch.tensor(
        query_lens, dtype=torch.int32, device=device
    ).cumsum(0)
    num_tokens = int(query_start_loc[-1])
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    token_to_req = torch.repeat_interleave(
        torch.arange(num_reqs, dtype=torch.int32, device=device),
        torch.tensor(query_lens, dtype=torch.int32, device=device),
    )
    max_blocks = (max(seq_lens) + BLOCK_SIZE - 1) // BLOCK_SIZE
    block_table = torch.arange(
        num_reqs * max_blocks, dtype=torch.int32, device=device
    ).view(num_reqs, max_blocks)
    slot_mapping = torch.arange(num_tokens, dtype=torch.int64, device=device)
    return query_start_loc, seq_lens_t, token_to_req, slot_mapping, block_table


def ref_swa_slot_rows(
    seq_lens: list[int],
    query_lens: list[int],
    spans_per_req: list[list[tuple[int, int]]],
    block_table: torch.Tensor,
    window: int,
    max_image_tokens: int,
    width: int,
    replay_starts: list[int] | None = None,
) -> tuple[list[list[int]], list[int]]:
    """Reference paged slot-id rows and lens for every token in the batch."""
    block_table_cpu = block_table.cpu()
    lefts, rights = ref_left_right(
        seq_lens, query_lens, spans_per_req, max_image_tokens
    )
    replay_starts = replay_starts or [0] * len(seq_lens)
    rows: list[list[int]] = []
    lens: list[int] = []
    token = 0
    for req, (seq_len, query_len) in enumerate(zip(seq_lens, query_lens)):
        prefix_len = seq_len - query_len
        for i in range(query_len):
            pos = prefix_len + i
            start, end = ref_swa_bounds(
                pos, window, lefts[token], rights[token], replay_starts[req]
            )
            row = []
            for p in range(start, end):
                blk = int(block_table_cpu[req, p // BLOCK_SIZE])
                row.append(blk * BLOCK_SIZE + p % BLOCK_SIZE)
            lens.append(len(row))
            row.extend([-1] * (width - len(row)))
            rows.append(row)
            token += 1
    return rows, lens


def make_builder(
    vision: bool,
    window: int = WINDOW,
    max_image_tokens: int = MAX_IMG,
    max_num_batched_tokens: int = 64,
    model_name: str = "meta-llama/Meta-Llama-3-8B",
    builder_cls: type[
        DeepseekSparseSWAMetadataBuilder
    ] = DeepseekSparseSWAMetadataBuilder,
    mm_prefix_clamp_sliding_window: bool = True,
    bounded_replay: bool = False,
) -> DeepseekSparseSWAMetadataBuilder:
    overrides: dict = {"sliding_window": window}
    if vision:
        # Emulate the V4 vision config, whose mm_prefix_clamp_sliding_window
        # gates the in-kernel SWA widening. V4.1 (causal image tokens) leaves
        # it off.
        overrides.update(
            vision_n_layers=2,
            vision_max_n_token=max_image_tokens,
            mm_prefix_clamp_sliding_window=mm_prefix_clamp_sliding_window,
        )
    vllm_config = create_vllm_config(
        model_name=model_name,
        max_model_len=4096,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=8,
        hf_config_override=overrides,
    )
    spec = SlidingWindowMLASpec(
        block_size=BLOCK_SIZE,
        num_kv_heads=1,
        head_size=512,
        dtype=torch.bfloat16,
        sliding_window=window,
        cache_dtype_str="auto",
        model_version="deepseek_v4",
        bounded_replay=bounded_replay,
    )
    return builder_cls(
        kv_cache_spec=spec,
        layer_names=["layer0"],
        vllm_config=vllm_config,
        device=DEVICE,
    )


def build_metadata(
    builder: DeepseekSparseSWAMetadataBuilder,
    seq_lens: list[int],
    query_lens: list[int],
    mm_req_doc_ranges: dict[int, list[tuple[int, int]]] | None,
    replay_starts: list[int] | None = None,
):
    device = DEVICE
    query_start_loc, seq_lens_t, _, slot_mapping, block_table = make_batch(
        seq_lens, query_lens, device
    )
    replay_start = (
        None
        if replay_starts is None
        else torch.tensor(replay_starts, dtype=torch.int32, device=device)
    )
    return builder.build(
        0,
        CommonAttentionMetadata(
            query_start_loc=query_start_loc,
            query_start_loc_cpu=query_start_loc.cpu(),
            seq_lens=seq_lens_t,
            seq_lens_cpu_upper_bound=seq_lens_t.cpu(),
            num_reqs=len(seq_lens),
            num_actual_tokens=int(query_start_loc[-1]),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            block_table_tensor=block_table,
            slot_mapping=slot_mapping,
            causal=True,
            mm_req_doc_ranges=mm_req_doc_ranges,
        ),
        replay_start=replay_start,
    )


def test_builder_in_image_visibility():
    seq_lens = [30, 12]
    query_lens = [30, 12]
    spans = [[(4, 12), (20, 24)], []]
    builder = make_builder(vision=True)
    md = build_metadata(builder, seq_lens, query_lens, {0: spans[0], 1: spans[1]})
    assert md.num_prefills == 2
    assert md.num_decode_tokens == 0
    assert md.prefill_swa_indices.shape[-1] == WIDTH
    assert md.prefill_left_visible is not None
    assert md.prefill_right_visible is not None

    ref_left, ref_right = ref_left_right(seq_lens, query_lens, spans, MAX_IMG)
    assert md.prefill_left_visible.cpu().tolist() == ref_left
    assert md.prefill_right_visible.cpu().tolist() == ref_right

    _, _, _, _, block_table = make_batch(seq_lens, query_lens, DEVICE)
    rows, lens = ref_swa_slot_rows(
        seq_lens, query_lens, spans, block_table, WINDOW, MAX_IMG, WIDTH
    )
    assert md.prefill_swa_lens.cpu().tolist() == lens
    assert md.prefill_swa_indices[:, 0].cpu().tolist() == rows


def test_builder_no_image_spans_fast_path():
    """Vision model, image-free batch: no visibility tensors, plain window."""
    seq_lens = [30, 12]
    query_lens = [30, 12]
    builder = make_builder(vision=True)
    md = build_metadata(builder, seq_lens, query_lens, {0: [], 1: []})
    assert md.prefill_left_visible is None
    assert md.prefill_right_visible is None

    _, _, _, _, block_table = make_batch(seq_lens, query_lens, DEVICE)
    rows, lens = ref_swa_slot_rows(
        seq_lens, query_lens, [[], []], block_table, WINDOW, MAX_IMG, WIDTH
    )
    assert md.prefill_swa_lens.cpu().tolist() == lens
    assert md.prefill_swa_indices[:, 0].cpu().tolist() == rows


def test_builder_text_model_unchanged():
    """Text-only model: buffers stay window-sized and spans are ignored."""
    seq_lens = [30, 12]
    query_lens = [30, 12]
    builder = make_builder(vision=False)
    assert builder.max_image_tokens == 0
    md = build_metadata(builder, seq_lens, query_lens, None)
    assert md.prefill_swa_indices.shape[-1] == WINDOW
    assert md.prefill_left_visible is None

    _, _, _, _, block_table = make_batch(seq_lens, query_lens, DEVICE)
    rows, lens = ref_swa_slot_rows(
        seq_lens, query_lens, [[], []], block_table, WINDOW, MAX_IMG, WINDOW
    )
    assert md.prefill_swa_lens.cpu().tolist() == lens
    assert md.prefill_swa_indices[:, 0].cpu().tolist() == rows


@pytest.mark.parametrize("compress_ratio", [0, 1, 2])
@pytest.mark.parametrize("query_len", [100, 4000])
def test_v41_image_prefill_uses_causal_swa(compress_ratio, query_len):
    """V4.1 image tokens use the same causal SWA as text, including in chunks."""
    from vllm.models.deepseek_v41.common.ops.cache_utils import (
        combine_topk_swa_indices as combine_v41,
    )
    from vllm.models.deepseek_v41.sparse_mla import DeepseekV41SparseSWAMetadataBuilder

    seq_len, window, max_image_tokens = 4000, 128, 2048
    spans = [(1900, 3947)]
    builder = make_builder(
        True,
        window,
        max_image_tokens,
        query_len,
        builder_cls=DeepseekV41SparseSWAMetadataBuilder,
        mm_prefix_clamp_sliding_window=False,
    )
    assert builder.max_image_tokens == 0
    md = build_metadata(builder, [seq_len], [query_len], {0: spans})
    assert md.prefill_left_visible is None
    assert md.prefill_right_visible is None
    assert md.prefill_swa_indices.shape[-1] == window
    plan = md.get_prefill_chunk_plan(
        compress_ratio, prefill_chunk_size=4, has_compressed=compress_ratio > 0
    )
    [(start, end, n, m)] = plan
    gather_len = int(md.prefill_gather_lens[0])
    assert (start, end, m - n) == (0, 1, gather_len)
    assert gather_len == query_len + min(seq_len - query_len, window - 1)
    indices, lens = combine_v41(
        torch.empty(query_len, 0, dtype=torch.int32, device=DEVICE),
        md.query_start_loc,
        md.prefill_seq_lens,
        md.prefill_gather_lens,
        window,
        compress_ratio,
        0,
        m,
        n,
    )
    indices, lens = indices.cpu(), lens.cpu().tolist()
    paged_indices = md.prefill_swa_indices.cpu()
    paged_lens = md.prefill_swa_lens.cpu().tolist()
    for token, pos in enumerate(range(seq_len - query_len, seq_len)):
        lo, hi = max(0, pos - window + 1), pos + 1
        row = indices[token, : lens[token]]
        assert lens[token] == hi - lo
        assert torch.all((row >= n) & (row < m))
        absolute_keys = row - n + seq_len - gather_len
        assert absolute_keys.tolist() == list(range(lo, hi))
        assert paged_lens[token] == hi - lo
        assert paged_indices[token, 0, : hi - lo].tolist() == list(range(lo, hi))


# SWA bounded replay: every prefill index path clamps the window at replay_start.


def test_builder_replay_start_bounds_prefill_window_and_gather():
    """Paged-direct prefill indices stop at replay_start and the FlashMLA
    gather only covers the context the request may see."""
    seq_lens = [40, 12, 30]
    query_lens = [24, 12, 10]
    replay_starts = [12, 0, 0]
    builder = make_builder(vision=False)
    md = build_metadata(builder, seq_lens, query_lens, None, replay_starts)
    assert md.replay_start is not None
    assert md.replay_start.cpu().tolist() == replay_starts

    _, _, _, _, block_table = make_batch(seq_lens, query_lens, DEVICE)
    rows, lens = ref_swa_slot_rows(
        seq_lens,
        query_lens,
        [[], [], []],
        block_table,
        WINDOW,
        MAX_IMG,
        WINDOW,
        replay_starts=replay_starts,
    )
    assert md.prefill_swa_lens.cpu().tolist() == lens
    assert md.prefill_swa_indices[:, 0].cpu().tolist() == rows
    # Request 0: the first replayed row (pos 16) sees [12, 16]; its last row
    # (pos 39) is a full window above the replay start and sees all of it.
    assert md.prefill_swa_lens[0].item() == 16 - 12 + 1
    assert md.prefill_swa_lens[23].item() == WINDOW
    # gather_len = query_len + min(prefix_len - replay_start, WINDOW - 1).
    assert md.prefill_gather_lens.cpu().tolist() == [
        24 + min(16 - 12, WINDOW - 1),
        12,
        10 + min(20, WINDOW - 1),
    ]


def test_builder_replaying_group_builds_without_replay_start():
    """Graph captures build without model-specific kwargs: a replaying group's
    metadata then bounds nothing."""
    builder = make_builder(vision=False, bounded_replay=True)
    md = build_metadata(builder, [40, 12], [24, 12], None)
    assert not md.replay_start.any()
    assert md.prefill_swa_lens[0].item() == WINDOW
