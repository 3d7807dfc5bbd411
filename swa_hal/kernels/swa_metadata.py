"""The one-launch metadata kernel (docs/semantics.md #per-token-helpers, #causal-rows, #dspark-rows, #prefill-metadata, #fixed-buffers in a single grid).

The grid is cut into four consecutive program ranges:

  [0, dec)                 decode rows (causal, or DSpark non-causal), token_to_req and is_valid
  [dec, dec + pre)         prefill rows, written from row 0 (token offset = num_decode_tokens)
  [.., + clear)            zero decode lens rows [num_decode_tokens, decode_clear_end)
  [.., + gather)           prefill gather lens

A program finds each token's request by counting request ends at or before the token over
query_start_loc (one vectorised compare per chunk of requests, no dependent load chain), so no
host-computed token_to_req is needed.

Causal rows honour each request's replay bound (docs/semantics.md #bounded-replay); with
MAX_IMAGE > 0 (the vision variant, #vision-spans) prefill programs also work out each token's
image visibility from the span CSR and widen its row. A draft-step update (#draft-updates) is the
same kernel with only the decode programs.

Platform variants are constexpr flags of this one source:
  CLAMP          every lane's address, masked or not, stays inside its tensor (SM12x rule)
  NONCAUSAL      decode rows are DSpark draft rows (docs/semantics.md #dspark-rows)
Every masked load passes ``other=`` (XPU leaves masked lanes undefined otherwise).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Runtime integers must never specialise (value 1, multiples of 16), and engine-owned input
# tensors must not specialise on alignment: then one compile per constexpr key serves every
# batch shape, which is what lets warmup() promise no compilation at run time.
RUNTIME_INTS = [
    "bt_stride", "max_pages", "num_reqs", "num_tokens", "num_decodes", "num_prefills",
    "num_decode_tokens", "num_prefill_tokens", "decode_clear_end", "dec_progs", "pre_progs",
    "clear_progs", "search_chunks",
]
ENGINE_TENSORS = [
    "qsl_ptr", "seq_lens_ptr", "block_table_ptr", "slot_mapping_ptr", "replay_ptr",
    "span_indptr_ptr", "span_starts_ptr", "span_ends_ptr",
]

# Triton kernels may only read module globals that are constexpr.
NO_REQUEST = tl.constexpr(2147483647)
NO_SPAN = tl.constexpr(1073741824)


@triton.jit
def _owner_of(tok, qsl_ptr, num_reqs, search_chunks, BLOCK_T: tl.constexpr, SEARCH_BLOCK: tl.constexpr,
              CLAMP: tl.constexpr):
    """Request owning each token: the number of ends qsl[1..R] at or before it; R (past the
    scheduled tokens) maps to 0."""
    count = tl.zeros([BLOCK_T], dtype=tl.int32)
    for chunk in range(search_chunks):
        k = 1 + chunk * SEARCH_BLOCK + tl.arange(0, SEARCH_BLOCK)
        in_range = k <= num_reqs
        if CLAMP:
            k = tl.minimum(k, num_reqs)
        ends = tl.load(qsl_ptr + k, mask=in_range, other=NO_REQUEST)
        count += tl.sum((ends[None, :] <= tok[:, None]).to(tl.int32), axis=1)
    return tl.where(count == num_reqs, 0, count)


@triton.jit
def _image_visibility(pos, req, row_ok, span_indptr_ptr, span_starts_ptr, span_ends_ptr,
                      BLOCK_T: tl.constexpr, MAX_IMAGE: tl.constexpr):
    """Per row: (left, right) inside the last listed image span of its request holding pos."""
    lo = tl.load(span_indptr_ptr + req, mask=row_ok, other=0)
    hi = tl.load(span_indptr_ptr + req + 1, mask=row_ok, other=0)
    left = tl.zeros([BLOCK_T], dtype=tl.int32)
    right = tl.zeros([BLOCK_T], dtype=tl.int32)
    # Rows are ordered by request, so the spans of this block are one contiguous range.
    first = tl.min(tl.where(row_ok, lo, NO_SPAN), axis=0)
    stop = tl.max(tl.where(row_ok, hi, 0), axis=0)
    for i in range(first, stop):
        a = tl.load(span_starts_ptr + i)
        e = tl.load(span_ends_ptr + i)
        inside = (i >= lo) & (i < hi) & (pos >= a) & (pos <= e)
        left = tl.where(inside, tl.minimum(pos - a, MAX_IMAGE - 1), left)
        right = tl.where(inside, tl.minimum(e - pos, MAX_IMAGE), right)
    return left, right


@triton.jit
def _window_rows(
    out_idx_ptr, out_lens_ptr, token_to_req_ptr, is_valid_ptr, left_ptr, right_ptr,
    qsl_ptr, seq_lens_ptr, block_table_ptr, slot_mapping_ptr, replay_ptr,
    span_indptr_ptr, span_starts_ptr, span_ends_ptr,
    bt_stride, max_pages, num_reqs, num_tokens, search_chunks,
    row0, n_rows, token_offset,
    WINDOW: tl.constexpr, WIDTH: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, SEARCH_BLOCK: tl.constexpr,
    NONCAUSAL: tl.constexpr, IMAGES: tl.constexpr, CLEAR_IMAGES: tl.constexpr, MAX_IMAGE: tl.constexpr,
    CLAMP: tl.constexpr,
):
    rows = row0 + tl.arange(0, BLOCK_T)
    row_ok = rows < n_rows
    tok = token_offset + rows
    tok_at = tok
    rows_at = rows
    if CLAMP:
        tok_at = tl.minimum(tok, num_tokens - 1)
        rows_at = tl.minimum(rows, n_rows - 1)

    req = _owner_of(tok, qsl_ptr, num_reqs, search_chunks, BLOCK_T, SEARCH_BLOCK, CLAMP)
    slot = tl.load(slot_mapping_ptr + tok_at, mask=row_ok, other=-1)
    valid = slot >= 0
    tl.store(token_to_req_ptr + tok_at, req, mask=row_ok)
    tl.store(is_valid_ptr + tok_at, valid, mask=row_ok)

    # req is in [0, num_reqs) by construction, so these addresses are in bounds even unmasked.
    seq = tl.load(seq_lens_ptr + req, mask=row_ok, other=0)
    end = tl.load(qsl_ptr + req + 1, mask=row_ok, other=0)
    if NONCAUSAL:
        # DSpark rows ignore the replay bound (docs/semantics.md #dspark-rows).
        begin = tl.load(qsl_ptr + req, mask=row_ok, other=0)
        start = tl.maximum(seq - (end - begin) - WINDOW, 0)
        lens = seq - start
    else:
        pos = seq - end + tok  # P_r + (t - qsl[r])
        last = pos
        if IMAGES:
            left, right = _image_visibility(pos, req, row_ok, span_indptr_ptr, span_starts_ptr, span_ends_ptr,
                                            BLOCK_T, MAX_IMAGE)
            tl.store(left_ptr + tok_at, left, mask=row_ok)
            tl.store(right_ptr + tok_at, right, mask=row_ok)
            start = tl.maximum(pos - (WINDOW - 1) - tl.maximum(left - (WINDOW - 1), 0), 0)
            last = pos + right
        else:
            start = tl.maximum(pos - (WINDOW - 1), 0)
            if CLEAR_IMAGES:  # decode rows of a vision model see no image
                zero = tl.zeros([BLOCK_T], dtype=tl.int32)
                tl.store(left_ptr + tok_at, zero, mask=row_ok)
                tl.store(right_ptr + tok_at, zero, mask=row_ok)
        start = tl.maximum(start, tl.load(replay_ptr + req, mask=row_ok, other=0))
        # Never negative: a replay bound past p leaves an empty row.
        lens = tl.maximum(last + 1 - start, 0)
    # Never longer than the row: what is handed out stays inside it whatever the input.
    lens = tl.where(row_ok & valid, tl.minimum(lens, WIDTH), 0)

    cols = tl.arange(0, BLOCK_W)
    pos2 = start[:, None] + cols[None, :]
    live = cols[None, :] < lens[:, None]
    page = pos2 // BLOCK_SIZE
    if CLAMP:
        page = tl.minimum(tl.maximum(page, 0), max_pages - 1)
    block = tl.load(block_table_ptr + req[:, None] * bt_stride + page, mask=live, other=0)
    idx = tl.where(live, block * BLOCK_SIZE + pos2 % BLOCK_SIZE, -1)

    cols_at = cols
    if CLAMP:
        cols_at = tl.minimum(cols, WIDTH - 1)
    store_ok = row_ok[:, None] & (cols[None, :] < WIDTH)
    tl.store(out_idx_ptr + rows_at[:, None] * WIDTH + cols_at[None, :], idx, mask=store_ok)
    tl.store(out_lens_ptr + rows_at, lens, mask=row_ok)


@triton.jit(do_not_specialize=RUNTIME_INTS, do_not_specialize_on_alignment=ENGINE_TENSORS)
def swa_metadata_kernel(
    # outputs (the builder's fixed buffers)
    decode_idx_ptr, decode_lens_ptr, prefill_idx_ptr, prefill_lens_ptr,
    token_to_req_ptr, is_valid_ptr, gather_lens_ptr, left_ptr, right_ptr,
    # inputs (engine tensors, or the builder's zero buffers when the batch has none)
    qsl_ptr, seq_lens_ptr, block_table_ptr, slot_mapping_ptr, replay_ptr,
    span_indptr_ptr, span_starts_ptr, span_ends_ptr,
    # host scalars
    bt_stride, max_pages, num_reqs, num_tokens, num_decodes, num_prefills,
    num_decode_tokens, num_prefill_tokens, decode_clear_end, dec_progs, pre_progs, clear_progs,
    search_chunks,
    # compile-time shape of the work
    WINDOW: tl.constexpr, DECODE_WIDTH: tl.constexpr, PREFILL_WIDTH: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_TP: tl.constexpr, BLOCK_WP: tl.constexpr,
    SEARCH_BLOCK: tl.constexpr, CLEAR_BLOCK: tl.constexpr, GATHER_BLOCK: tl.constexpr,
    MAX_IMAGE: tl.constexpr, NONCAUSAL: tl.constexpr, CLAMP: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < dec_progs:
        _window_rows(
            decode_idx_ptr, decode_lens_ptr, token_to_req_ptr, is_valid_ptr, left_ptr, right_ptr,
            qsl_ptr, seq_lens_ptr, block_table_ptr, slot_mapping_ptr, replay_ptr,
            span_indptr_ptr, span_starts_ptr, span_ends_ptr,
            bt_stride, max_pages, num_reqs, num_tokens, search_chunks,
            pid * BLOCK_T, num_decode_tokens, 0,
            WINDOW, DECODE_WIDTH, BLOCK_SIZE, BLOCK_T, BLOCK_W, SEARCH_BLOCK,
            NONCAUSAL, False, MAX_IMAGE > 0, MAX_IMAGE, CLAMP,
        )
    elif pid < dec_progs + pre_progs:
        _window_rows(
            prefill_idx_ptr, prefill_lens_ptr, token_to_req_ptr, is_valid_ptr, left_ptr, right_ptr,
            qsl_ptr, seq_lens_ptr, block_table_ptr, slot_mapping_ptr, replay_ptr,
            span_indptr_ptr, span_starts_ptr, span_ends_ptr,
            bt_stride, max_pages, num_reqs, num_tokens, search_chunks,
            (pid - dec_progs) * BLOCK_TP, num_prefill_tokens, num_decode_tokens,
            WINDOW, PREFILL_WIDTH, BLOCK_SIZE, BLOCK_TP, BLOCK_WP, SEARCH_BLOCK,
            False, MAX_IMAGE > 0, False, MAX_IMAGE, CLAMP,
        )
    elif pid < dec_progs + pre_progs + clear_progs:
        # Names differ from the gather branch's: Triton unifies same-named values across branches.
        rows = num_decode_tokens + (pid - dec_progs - pre_progs) * CLEAR_BLOCK + tl.arange(0, CLEAR_BLOCK)
        stale = rows < decode_clear_end
        if CLAMP:
            rows = tl.minimum(rows, decode_clear_end - 1)
        tl.store(decode_lens_ptr + rows, tl.zeros([CLEAR_BLOCK], dtype=tl.int32), mask=stale)
    else:
        i = (pid - dec_progs - pre_progs - clear_progs) * GATHER_BLOCK + tl.arange(0, GATHER_BLOCK)
        real = i < num_prefills
        if CLAMP:
            i = tl.minimum(i, num_prefills - 1)
        req = num_decodes + i
        seq = tl.load(seq_lens_ptr + req, mask=real, other=0)
        query = tl.load(qsl_ptr + req + 1, mask=real, other=0) - tl.load(qsl_ptr + req, mask=real, other=0)
        bound = tl.load(replay_ptr + req, mask=real, other=0)
        visible = tl.minimum(tl.maximum(seq - query - bound, 0), WINDOW - 1)
        tl.store(gather_lens_ptr + i, query + visible, mask=real)
