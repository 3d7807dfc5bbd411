"""The one-launch metadata kernel (docs/semantics.md #per-token-helpers, #causal-rows, #dspark-rows, #prefill-metadata, #fixed-buffers in a single grid).

The grid is cut into consecutive program ranges, the first three once per KV-cache group
(docs/semantics.md #group-builds; one group for a plain build):

  [0, dec)                 decode rows (causal, or DSpark non-causal), token_to_req and is_valid
  [dec, dec + pre)         prefill rows, written from row 0 (token offset = num_decode_tokens)
  [.., + clear)            zero decode lens rows [num_decode_tokens, decode_clear_end)
  [G * that, + gather)     prefill gather lens (shared by the groups)

A group build (GROUPED) reads each group's block table and slot mapping through a small table of
addresses, strides and widths; the per-group outputs are stacked group after group.

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

from typing import Any, NamedTuple

import triton
import triton.language as tl

from .rows_launch import CLEAR_BLOCK as CLEAR_ROWS
from .rows_launch import GATHER_BLOCK as GATHER_ROWS
from .rows_launch import ROWS_ENGINE, ROWS_INTS
from .rules import (
    BLOCK,
    HOST_SEQ,
    HOST_SPLIT,
    MODEL_LEN,
    OWN_SLOT,
    PADDING_SLOT,
    PAGES,
    QUERY_ORDER,
    REPLAY,
    ROW_WIDTH,
    SEQ_SHORT,
    SPAN,
)

# Triton kernels may only read module globals that are constexpr.
NO_REQUEST = tl.constexpr(2147483647)
NO_SPAN = tl.constexpr(1073741824)
# A guarded build looks at no more spans per block of rows than this (a malformed indptr could
# otherwise make a program loop for billions of iterations); rows past it are checked by their own block.
MAX_SPAN_SCAN = tl.constexpr(65536)
# Rows per lens-clearing program and prefills per gather program: fixed sizes, which the host's grid
# (``rows_launch.RowsArgs.programs``) divides by too.
CLEAR_BLOCK = tl.constexpr(CLEAR_ROWS)
GATHER_BLOCK = tl.constexpr(GATHER_ROWS)


# The launch facts the helpers share, bundled by the kernel and read by name (Triton keeps a NamedTuple's
# fields through jit calls; each is a compile-time bundle of the kernel's own values, so no instruction
# changes). A field added to one is read where it is used, and no unpacking elsewhere can shift.
class Requests(NamedTuple):
    """The requests' inputs: their offsets and lengths (``host_seq_ptr``: the prefills' host seq_lens on the
    device, rule 15, or seq_lens itself), the replay bounds the build reads, and the owner search's size."""

    qsl_ptr: Any
    seq_lens_ptr: Any
    host_seq_ptr: Any
    replay_ptr: Any
    num_reqs: Any
    search_chunks: Any


class Spans(NamedTuple):
    """The image span CSR (docs/semantics.md #vision-spans) and its span count."""

    indptr_ptr: Any
    starts_ptr: Any
    ends_ptr: Any
    count: Any


class Plan(NamedTuple):
    """The host's split and bounds (docs/semantics.md #split, #guarded-builds): the sizes, rule 14's query caps
    (``max_query_len``, ``decode_query_max``) and the requests with a bound (``num_bounds``), rule 16's bound,
    whether rule 17 is checked (``build_checks``) and whether a prefill follows a draft update's decodes."""

    num_tokens: Any
    num_decodes: Any
    num_decode_tokens: Any
    max_query_len: Any
    decode_query_max: Any
    max_model_len: Any
    build_checks: Any
    num_bounds: Any
    prefill_follows: Any


class Table(NamedTuple):
    """One KV-cache group's block table and slot mapping, the table's row stride and its width in pages."""

    block_table_ptr: Any
    slot_mapping_ptr: Any
    stride: Any
    pages: Any


class Part(NamedTuple):
    """A program's part of the rows: its first row, the part's row count and first token, and the owner
    guess (the part's first request, and the query length its requests likely have)."""

    first_row: Any
    num_rows: Any
    token_offset: Any
    guess_req: Any
    guess_len: Any


class Out(NamedTuple):
    """A part's outputs: its rows and their lengths."""

    indices_ptr: Any
    lens_ptr: Any


class Shared(NamedTuple):
    """The per-token outputs the groups share, and the violation record."""

    token_to_req_ptr: Any
    is_valid_ptr: Any
    left_ptr: Any
    right_ptr: Any
    violation_ptr: Any


@triton.jit
def _owner_of(
    tok,
    row_ok,
    requests,
    part,
    BLOCK_T: tl.constexpr,
    SEARCH_BLOCK: tl.constexpr,
    EAGER_PADDING: tl.constexpr,
    GUARD: tl.constexpr,
    CLAMP: tl.constexpr,
):
    """Request owning each token (the number of ends qsl[1..R] at or before it; R, past the scheduled
    tokens, maps to 0), with the request's start and end offsets, sequence length and replay bound.

    A batch whose requests of this segment are all ``part.guess_len`` long (decode, MTP, equal prefill
    chunks) takes a shortcut: the owner of t is guess_req + (t - token_offset) // guess_len, and its
    offsets, length and bound are loaded with the check, in one round of loads; only a block with a
    wrong guess searches, then loads.

    Rows past the scheduled tokens (padding) take request 0's values. EAGER_PADDING loads those with the
    check (decode programs: few, latency-bound, and a padded decode batch is the common CUDA-graph
    case). Otherwise a padding row fails the check (the guess is at most the last request, which ends
    at the scheduled end) and its block searches, which maps it to request 0: prefill programs are
    many and issue-bound, and five loads and selects per row are measurable there (docs/performance.md).

    A guarded build takes the shortcut only where the offsets never decrease: a guess inside its
    request's offsets is then its owner, but where qsl decreases somewhere the count of ends can differ
    from it (docs/semantics.md #guarded-builds), so every block counts."""
    qsl_ptr, seq_lens_ptr, replay_ptr = requests.qsl_ptr, requests.seq_lens_ptr, requests.replay_ptr
    num_reqs, search_chunks = requests.num_reqs, requests.search_chunks
    guess = tl.minimum(
        tl.maximum(part.guess_req + (tok - part.token_offset) // tl.maximum(part.guess_len, 1), 0), num_reqs - 1
    )
    lo = tl.load(qsl_ptr + guess)
    hi = tl.load(qsl_ptr + guess + 1)
    seq = tl.load(seq_lens_ptr + guess)
    bound = tl.load(replay_ptr + guess)
    right = ~row_ok | ((lo <= tok) & (tok < hi))
    if EAGER_PADDING:
        # Request 0's, for rows past the scheduled tokens: in the same round of loads (a load after
        # the block-wide check below would be a round of its own).
        scheduled = tl.load(qsl_ptr + num_reqs)
        begin0 = tl.load(qsl_ptr)
        end0 = tl.load(qsl_ptr + 1)
        seq0 = tl.load(seq_lens_ptr)
        bound0 = tl.load(replay_ptr)
        padding = tok >= scheduled
        right = right | padding
    if GUARD:
        # Past qsl[R] is past every end only where the offsets never decrease: the padding shortcut too.
        # Checked after this round of loads, not before it: its block-wide sum ends in a barrier, and a load
        # after a barrier waits for it (the offsets' loads would be a round of their own).
        right = right & _offsets_ordered(qsl_ptr, num_reqs, search_chunks, SEARCH_BLOCK, CLAMP)
    if tl.min(right.to(tl.int32), axis=0) == 1:
        owner = guess
        begin = lo
        end = hi
        if EAGER_PADDING:
            # Rows past the scheduled tokens belong to request 0.
            owner = tl.where(padding, 0, guess)
            begin = tl.where(padding, begin0, lo)
            end = tl.where(padding, end0, hi)
            seq = tl.where(padding, seq0, seq)
            bound = tl.where(padding, bound0, bound)
    else:
        owner = _search_owner(tok, qsl_ptr, num_reqs, search_chunks, BLOCK_T, SEARCH_BLOCK, CLAMP)
        # owner is in [0, num_reqs): these addresses are in bounds even unmasked.
        begin = tl.load(qsl_ptr + owner, mask=row_ok, other=0)
        end = tl.load(qsl_ptr + owner + 1, mask=row_ok, other=0)
        seq = tl.load(seq_lens_ptr + owner, mask=row_ok, other=0)
        bound = tl.load(replay_ptr + owner, mask=row_ok, other=0)
    return owner, begin, end, seq, bound


@triton.jit
def _offsets_ordered(qsl_ptr, num_reqs, search_chunks, SEARCH_BLOCK: tl.constexpr, CLAMP: tl.constexpr):
    """Whether qsl[0..R] never decreases (one pass over the offsets, as the owner search makes). The first
    chunk (every batch of at most SEARCH_BLOCK requests) is straight-line code, so its loads issue with the
    program's first round instead of after it."""
    drops = _offset_drops(qsl_ptr, num_reqs, 0, SEARCH_BLOCK, CLAMP)
    for chunk in range(1, search_chunks):
        drops += _offset_drops(qsl_ptr, num_reqs, chunk, SEARCH_BLOCK, CLAMP)
    return drops == 0


@triton.jit
def _offset_drops(qsl_ptr, num_reqs, chunk, SEARCH_BLOCK: tl.constexpr, CLAMP: tl.constexpr):
    """How many of the pairs (qsl[k], qsl[k + 1]), k in chunk ``chunk``, decrease."""
    k = chunk * SEARCH_BLOCK + tl.arange(0, SEARCH_BLOCK)
    in_range = k < num_reqs
    ka = k
    kb = k + 1
    if CLAMP:  # every lane inside qsl[0..R], R = 0 included
        ka = tl.minimum(ka, num_reqs)
        kb = tl.minimum(kb, num_reqs)
    a = tl.load(qsl_ptr + ka, mask=in_range, other=0)
    b = tl.load(qsl_ptr + kb, mask=in_range, other=0)
    return tl.sum((b < a).to(tl.int32), axis=0)


@triton.jit
def _search_owner(
    tok, qsl_ptr, num_reqs, search_chunks, BLOCK_T: tl.constexpr, SEARCH_BLOCK: tl.constexpr, CLAMP: tl.constexpr
):
    """The owner by counting request ends (any batch)."""
    # The owner is non-decreasing in the token, so when the first and last token of the block have
    # the same one (most prefill blocks) every token does: two scalar counts instead of a
    # [BLOCK_T, SEARCH_BLOCK] compare.
    first_tok = tl.min(tok, axis=0)
    last_tok = tl.max(tok, axis=0)
    first = tl.sum(tl.zeros([SEARCH_BLOCK], dtype=tl.int32), axis=0)
    last = first
    for chunk in range(search_chunks):
        k = 1 + chunk * SEARCH_BLOCK + tl.arange(0, SEARCH_BLOCK)
        in_range = k <= num_reqs
        if CLAMP:
            k = tl.minimum(k, num_reqs)
        ends = tl.load(qsl_ptr + k, mask=in_range, other=NO_REQUEST)
        first += tl.sum((ends <= first_tok).to(tl.int32), axis=0)
        last += tl.sum((ends <= last_tok).to(tl.int32), axis=0)
    if first == last:
        count = tl.zeros([BLOCK_T], dtype=tl.int32) + first
    else:
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
def _capped_distance(hi, lo, CAP: tl.constexpr):
    """min(hi - lo, CAP) for hi >= lo. As uint32 the difference is exact even where it leaves int32 (a
    wrapped position of a malformed request inside a span near INT32_MIN), as the reference's is; the same
    one instruction as a signed minimum."""
    return tl.minimum((hi - lo).to(tl.uint32, bitcast=True), CAP).to(tl.int32, bitcast=True)


@triton.jit
def _image_visibility(
    pos, req, row_ok, seq, spans, BLOCK_T: tl.constexpr, MAX_IMAGE: tl.constexpr, GUARD: tl.constexpr
):
    """Per row: (left, right) inside the last listed image span of its request holding pos, and
    (guarded) the first span of its request that breaks a rule (inverted, or starting below 0), or NO_SPAN.

    right stops at the request's last position seq - 1 (a span past it: a chunk that ends inside its
    image; docs/semantics.md #vision-spans): min(min(e, seq - 1) - pos, MAX_IMAGE), 0 where pos is past
    seq - 1 (only where the offsets decrease). Where pos < seq, seq - 1 does not wrap and min(e, seq - 1)
    >= pos inside the span, so the capped distance is exact."""
    lo = tl.load(spans.indptr_ptr + req, mask=row_ok, other=0)
    hi = tl.load(spans.indptr_ptr + req + 1, mask=row_ok, other=0)
    left = tl.zeros([BLOCK_T], dtype=tl.int32)
    right = tl.zeros([BLOCK_T], dtype=tl.int32)
    bad_span = tl.full([BLOCK_T], NO_SPAN, dtype=tl.int32)
    # Rows are ordered by request, so the spans of this block are one contiguous range.
    first = tl.min(tl.where(row_ok, lo, NO_SPAN), axis=0)
    stop = tl.max(tl.where(row_ok, hi, 0), axis=0)
    # Only spans that exist are read, whatever the CSR says (a malformed one is the guard's to report).
    first = tl.maximum(first, 0)
    stop = tl.minimum(stop, spans.count)
    if GUARD:
        stop = tl.minimum(stop, first + MAX_SPAN_SCAN)
    written = pos < seq
    last = seq - 1
    for i in range(first, stop):
        a = tl.load(spans.starts_ptr + i)
        e = tl.load(spans.ends_ptr + i)
        mine = (i >= lo) & (i < hi)
        inside = mine & (pos >= a) & (pos <= e)
        left = tl.where(inside, _capped_distance(pos, a, MAX_IMAGE - 1), left)
        right = tl.where(inside, tl.where(written, _capped_distance(tl.minimum(e, last), pos, MAX_IMAGE), 0), right)
        if GUARD:
            broken = mine & ((a > e) | (a < 0))
            bad_span = tl.where(broken & (bad_span == NO_SPAN), i, bad_span)
    return left, right, bad_span


@triton.jit
def _decode_without_images(
    out, tok_at, shared, pos, req, row_ok, seq, spans, BLOCK_T: tl.constexpr, MAX_IMAGE: tl.constexpr,
    GUARD: tl.constexpr,
):  # fmt: skip
    """Decode rows (causal or DSpark) of a vision model see no image: their visibility is 0. Guarded, the
    first span of the row's request that breaks rule 4, else NO_SPAN: the rule holds for every request,
    decodes included (decode rows never use spans, but the request is malformed; docs/semantics.md
    #guarded-builds). ``out``: the per-token outputs (``Shared``)."""
    zero = tl.zeros([BLOCK_T], dtype=tl.int32)
    tl.store(out.left_ptr + tok_at, zero, mask=shared)
    tl.store(out.right_ptr + tok_at, zero, mask=shared)
    bad_span = tl.full([BLOCK_T], NO_SPAN, dtype=tl.int32)
    if GUARD:
        bad_span = _image_visibility(pos, req, row_ok, seq, spans, BLOCK_T, MAX_IMAGE, GUARD)[2]
    return bad_span


@triton.jit
def _flag(kind, value, cond, code: tl.constexpr, what):
    """Keep the first broken rule of each row: (kind, value) take (code, what) where none is set yet."""
    new = (kind == 0) & cond
    return tl.where(new, code, kind), tl.where(new, what, value)


@triton.jit
def _split_broken(req, begin, end, query, plan):
    """Rule 14: the request's device offsets disagree with the split the host made from its copies
    (docs/semantics.md #guarded-builds): longer than max_query_len, ending past the batch's tokens, a
    decode longer than max_decode_query_len or ending past the decode tokens, a prefill starting before
    them, a request past the replay bounds (padding in the host copy, without a bound) with query tokens.
    Compared, never subtracted. ``plan``: the host's split (``Plan``)."""
    decode = req < plan.num_decodes
    # A request the host copy makes padding has no query token: its cap is 0.
    cap = tl.where(req < plan.num_bounds, plan.max_query_len, 0)
    broken = (query > cap) | (end > plan.num_tokens)
    broken |= decode & ((query > plan.decode_query_max) | (end > plan.num_decode_tokens))
    return broken | (~decode & (begin < plan.num_decode_tokens))


@triton.jit
def _record(violation_ptr, kind, req, value, rows, group):
    """Record a broken row unless a violation is recorded already: each broken row counts itself with
    an atomic add, and the one that finds the count at 0 writes its kind, request, value and ``group``
    (g + 1 in a group build's group g, else 0: swa_hal.rules.RECORD_LEN). No
    block-wide reduction: a block without a broken row pays one compare, its atomics masked off (a
    reduction kept four values live past the stores; docs/performance.md)."""
    broken = kind > 0
    at = violation_ptr + rows * 0
    old = tl.atomic_add(at, 1, mask=broken, sem="relaxed")
    first = broken & (old == 0)
    tl.store(at + 1, kind, mask=first)
    tl.store(at + 2, req, mask=first)
    tl.store(at + 3, value, mask=first)
    tl.store(at + 4, group, mask=first)


@triton.jit
def _page_block(
    facts,
    kind,
    value,
    K: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_LIMIT: tl.constexpr,
    GUARD: tl.constexpr,
    CLAMP: tl.constexpr,
):
    """The block of each row's K-th page (0 where the row does not reach it), with the guard's checks of
    the page (rule 5) and of the block id (rule 6). The row reads its K-th page when it reaches past its
    first K pages, off + lens > K * B: compared as lens > K * B - off, relative to the first page, since
    the page's first position, (first_page + K) * B, lies past int32 for a page after the last int32 page
    (it wrapped below the row's end, and a valid row on the last page read, or was emptied for, the page
    past it). ``facts``: (the row's table entries, its first page, its offset there, its length, the
    table's width)."""
    row_table, first_page, off, lens, max_pages = facts
    pk = first_page + K
    if K == 0:
        need = lens > 0
    else:
        need = lens > K * BLOCK_SIZE - off
    if GUARD:
        in_table = (pk >= 0) & (pk < max_pages)
        kind, value = _flag(kind, value, need & ~in_table, PAGES, pk)
        need = need & in_table
    if CLAMP:
        pk = tl.minimum(tl.maximum(pk, 0), max_pages - 1)
    bk = tl.load(row_table + pk, mask=need, other=0)
    if GUARD:
        # Every block id handed out lies in [0, BLOCK_LIMIT): inside the KV cache, and its slots
        # inside int32 (block * BLOCK_SIZE cannot overflow).
        kind, value = _flag(kind, value, need & ((bk < 0) | (bk >= BLOCK_LIMIT)), BLOCK, bk)
    return bk, kind, value


@triton.jit
def _from_page(base, cols, off, bk, K: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Entry c of a row lies on its K-th page from column K * B - off on: its slot there is base_K + c,
    base_K = off + (block_K - K) * B. (Each per-row value spread over the columns is one conversion.)"""
    return tl.where(cols[None, :] >= K * BLOCK_SIZE - off[:, None], (off + (bk - K) * BLOCK_SIZE)[:, None], base)


@triton.jit
def _row_bases(
    row_table,
    start,
    lens,
    max_pages,
    kind,
    value,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_LIMIT: tl.constexpr,
    ROW_PAGES: tl.constexpr,
    GUARD: tl.constexpr,
    CLAMP: tl.constexpr,
):
    """Each entry's slot minus its column (``base``, [BLOCK_T, BLOCK_W]): entry c of a row is
    ``base + c``. Reads the row's pages' blocks, with rules 5 and 6 checked on them (guarded)."""
    cols = tl.arange(0, BLOCK_W)
    if ROW_PAGES <= 4:
        # A row spans at most ROW_PAGES pages: load each page's block once per row. Entry c (position
        # start + c) on the row's page k is base_k + c with base_k = start + (block_k - page_k) *
        # BLOCK_SIZE, and it is on page k from column k * BLOCK_SIZE - (start % BLOCK_SIZE) on: per
        # entry a compare and a select per page past the first, and one add. Every page's block is
        # loaded before any of them is used: spreading a per-row value over the tile's columns is a
        # layout conversion through shared memory with a barrier, and a load issued after one waits
        # for it, so interleaving them would make the pages dependent rounds of loads.
        first_page = start // BLOCK_SIZE
        off = start - first_page * BLOCK_SIZE
        facts = (row_table, first_page, off, lens, max_pages)
        bk0, kind, value = _page_block(facts, kind, value, 0, BLOCK_SIZE, BLOCK_LIMIT, GUARD, CLAMP)
        if ROW_PAGES > 1:
            bk1, kind, value = _page_block(facts, kind, value, 1, BLOCK_SIZE, BLOCK_LIMIT, GUARD, CLAMP)
        if ROW_PAGES > 2:
            bk2, kind, value = _page_block(facts, kind, value, 2, BLOCK_SIZE, BLOCK_LIMIT, GUARD, CLAMP)
        if ROW_PAGES > 3:
            bk3, kind, value = _page_block(facts, kind, value, 3, BLOCK_SIZE, BLOCK_LIMIT, GUARD, CLAMP)
        base = tl.zeros([BLOCK_T, BLOCK_W], dtype=tl.int32) + (off + bk0 * BLOCK_SIZE)[:, None]
        if ROW_PAGES > 1:
            base = _from_page(base, cols, off, bk1, 1, BLOCK_SIZE)
        if ROW_PAGES > 2:
            base = _from_page(base, cols, off, bk2, 2, BLOCK_SIZE)
        if ROW_PAGES > 3:
            base = _from_page(base, cols, off, bk3, 3, BLOCK_SIZE)
    else:
        pos2 = start[:, None] + cols[None, :]
        read = cols[None, :] < lens[:, None]
        page = pos2 // BLOCK_SIZE
        if GUARD:
            page_ok = (page >= 0) & (page < max_pages)
            off_table = read & ~page_ok
            read = read & page_ok
            first_off = tl.min(tl.where(off_table, cols[None, :], BLOCK_W), axis=1)
            page_at = tl.sum(tl.where(cols[None, :] == first_off[:, None], page, 0), axis=1)
            kind, value = _flag(kind, value, first_off < BLOCK_W, PAGES, page_at)
        if CLAMP:
            page = tl.minimum(tl.maximum(page, 0), max_pages - 1)
        block = tl.load(row_table[:, None] + page, mask=read, other=0)
        if GUARD:
            bad_block = read & ((block < 0) | (block >= BLOCK_LIMIT))
            first_bad = tl.min(tl.where(bad_block, cols[None, :], BLOCK_W), axis=1)
            block_at = tl.sum(tl.where(cols[None, :] == first_bad[:, None], block, 0), axis=1)
            kind, value = _flag(kind, value, first_bad < BLOCK_W, BLOCK, block_at)
        base = start[:, None] + (block - page) * BLOCK_SIZE
    return base, kind, value


@triton.jit
def _request_rules(kind, value, checked, tok, req, begin, end, seq, requests, plan, CHECK_HOST_SEQ: tl.constexpr):
    """The request-level rules a guarded build checks at each row with a slot (docs/semantics.md
    #guarded-builds): 13 (a slot past the scheduled tokens), 1, 2, 16, 14 and, in prefill programs, 15.
    Returns the rows' kinds, values and the requests their records name."""
    qsl_ptr, num_reqs, prefill_follows = requests.qsl_ptr, requests.num_reqs, plan.prefill_follows
    query = end - begin
    # A row past the scheduled tokens (padding) has no request: a slot there is the engine's mistake,
    # and request 0's window would be handed out for it (its value: the row's token). In a draft-step
    # update of a build with prefills the decode part has no padding: a row past the decodes' end is the
    # first prefill's, starting inside the decode tokens (rule 14; its value: that prefill's query).
    scheduled = tl.load(qsl_ptr + num_reqs)
    past = checked & (tok >= scheduled)
    following = tl.load(qsl_ptr + num_reqs + prefill_follows) - scheduled
    inside = tl.where(prefill_follows != 0, past, False)
    kind, value = _flag(kind, value, tl.where(prefill_follows != 0, False, past), PADDING_SLOT, tok)
    kind, value = _flag(kind, value, inside, HOST_SPLIT, following)
    kind, value = _flag(kind, value, checked & (end < begin), QUERY_ORDER, query)
    # S_r < q_r compared, not S_r - q_r < 0: the difference leaves int32 at the edges (S_r near
    # INT32_MIN) and wraps to a prefix >= 0. A query below 0 with end >= begin wrapped (begin near
    # INT32_MIN): it is past int32, longer than any S_r.
    kind, value = _flag(kind, value, checked & ((seq < query) | (query < 0)), SEQ_SHORT, seq)
    kind, value = _flag(kind, value, checked & (seq > plan.max_model_len), MODEL_LEN, seq)
    # The split was made on the host from the host copies; the rows follow the device offsets. A
    # request whose device offsets the split does not admit breaks rule 14 (its value: the query).
    kind, value = _flag(kind, value, checked & _split_broken(req, begin, end, query, plan), HOST_SPLIT, query)
    if CHECK_HOST_SEQ:
        # Rule 15 (prefill programs; a decode program's row of a prefill broke rule 14 already): the
        # chunk plan reads a prefill's host seq_lens, which must be the device's (its value: the host's).
        # host_seq_ptr is seq_lens itself where there is no host copy to hold (equal by construction).
        host = tl.load(requests.host_seq_ptr + req, mask=checked, other=0)
        kind, value = _flag(kind, value, checked & (req >= plan.num_decodes) & (host != seq), HOST_SEQ, host)
    return kind, value, tl.where(inside, num_reqs, req)


@triton.jit
def _row_window(
    kind,
    value,
    checked,
    shared,
    row_ok,
    tok,
    tok_at,
    req,
    begin,
    end,
    seq,
    bound,
    num_decodes,
    shared_out,
    spans,
    WINDOW: tl.constexpr,
    BLOCK_T: tl.constexpr,
    NONCAUSAL: tl.constexpr,
    IMAGES: tl.constexpr,
    CLEAR_IMAGES: tl.constexpr,
    MAX_IMAGE: tl.constexpr,
    GUARD: tl.constexpr,
):
    """Each row's window, (start, lens) before the row's width caps it: causal (from its replay bound,
    widened by image visibility in prefill programs of a vision model, docs/semantics.md #vision-spans)
    or DSpark (#dspark-rows); with the guard's rules 3 and 4. ``shared_out``: the per-token outputs
    (``Shared``), whose image visibility prefill rows write."""
    prefix = seq - (end - begin)
    pos = seq - end + tok  # P_r + (t - qsl[r])
    if NONCAUSAL:
        # DSpark rows ignore the replay bound (docs/semantics.md #dspark-rows).
        start = tl.maximum(prefix - WINDOW, 0)
        lens = seq - start
        if GUARD:
            # A prefill's bound still holds (rule 3): a decode row a broken query_start_loc gave to a
            # prefill is emptied with that prefill's rows, as the reference empties every row of it.
            broken_bound = (req >= num_decodes) & ((bound < 0) | (bound > prefix))
            kind, value = _flag(kind, value, checked & broken_bound, REPLAY, bound)
    else:
        last = pos
        if IMAGES:
            left, right, bad_span = _image_visibility(pos, req, row_ok, seq, spans, BLOCK_T, MAX_IMAGE, GUARD)
            tl.store(shared_out.left_ptr + tok_at, left, mask=shared)
            tl.store(shared_out.right_ptr + tok_at, right, mask=shared)
            start = tl.maximum(pos - (WINDOW - 1) - tl.maximum(left - (WINDOW - 1), 0), 0)
            last = pos + right
        else:
            start = tl.maximum(pos - (WINDOW - 1), 0)
        start = tl.maximum(start, bound)
        # Never negative: a replay bound past p leaves an empty row.
        lens = tl.maximum(last + 1 - start, 0)
        if GUARD:
            kind, value = _flag(kind, value, checked & ((bound < 0) | (bound > prefix)), REPLAY, bound)
            if IMAGES:
                kind, value = _flag(kind, value, checked & (bad_span != NO_SPAN), SPAN, bad_span)
    if CLEAR_IMAGES:
        # Decode rows (the decode programs', which never work out images), causal or DSpark, see no image:
        # their visibility is cleared and their spans checked.
        bad_span = _decode_without_images(
            shared_out, tok_at, shared, pos, req, row_ok, seq, spans, BLOCK_T, MAX_IMAGE, GUARD
        )
        if GUARD:
            kind, value = _flag(kind, value, checked & (bad_span != NO_SPAN), SPAN, bad_span)
    return start, lens, kind, value


@triton.jit
def _own_slot(kind, value, checked, lens, own_pos, tok, slot, row_table, max_pages, build_checks,
              BLOCK_SIZE: tl.constexpr, CLAMP: tl.constexpr):  # fmt: skip
    """Rule 17 (builds, not draft updates: build_checks): a row with entries (one that broke no rule that
    empties it) reads its token's own position, on a page inside the table whose block id is in range
    (rules 5 and 6), and the slot there must be the token's slot_mapping entry; a table made for another
    page size, or a slot mapping of another table, gives another (its value: the token's row). Recorded
    only: the row keeps its entries."""
    own_page = own_pos // BLOCK_SIZE
    own_ok = checked & (lens > 0) & (own_pos >= 0) & (own_page < max_pages)
    # A select, not `& (build_checks != 0)`: a scalar test joined to a block is an int32 mask in Triton's
    # interpreter, which triton 3.9 refuses (docs/kernels.md #triton-versions).
    own_ok = tl.where(build_checks != 0, own_ok, False)
    if CLAMP:
        own_page = tl.minimum(tl.maximum(own_page, 0), max_pages - 1)
    own_block = tl.load(row_table + own_page, mask=own_ok, other=0)
    own_slot = own_block.to(tl.int64) * BLOCK_SIZE + (own_pos - own_page * BLOCK_SIZE)
    return _flag(kind, value, own_ok & (own_slot != slot), OWN_SLOT, tok)


@triton.jit
def _row_block(first, n, BLOCK: tl.constexpr, CLAMP: tl.constexpr):
    """A program's BLOCK rows (or requests) from ``first``: their indices, which of them exist (below
    ``n``), and the indices to address, under CLAMP kept below ``n`` on masked lanes too (SM12x's rule)."""
    rows = first + tl.arange(0, BLOCK)
    row_ok = rows < n
    rows_at = rows
    if CLAMP:
        rows_at = tl.minimum(rows, n - 1)
    return rows, row_ok, rows_at


@triton.jit
def _window_rows(
    out,
    shared_out,
    requests,
    table,
    spans,
    plan,
    part,
    record_group,
    WINDOW: tl.constexpr,
    WIDTH: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr,
    SEARCH_BLOCK: tl.constexpr,
    NONCAUSAL: tl.constexpr,
    IMAGES: tl.constexpr,
    CLEAR_IMAGES: tl.constexpr,
    MAX_IMAGE: tl.constexpr,
    GUARD: tl.constexpr,
    BLOCK_LIMIT: tl.constexpr,
    EAGER_PADDING: tl.constexpr,
    CHECK_HOST_SEQ: tl.constexpr,
    CLAMP: tl.constexpr,
):
    """One program's block of decode or prefill rows (docs/semantics.md #causal-rows, #dspark-rows): each
    row's owner, its per-token helpers, its window's entries and length, guarded where GUARD. The launch
    facts come in the named tuples the kernel bundles its arguments in (``swa_metadata_kernel``): ``out``
    (``Out``, this part's rows), ``shared_out`` (``Shared``, per token, shared by the groups), ``requests``
    (``Requests``), ``table`` (``Table``, this group's), ``spans`` (``Spans``), ``plan`` (``Plan``) and
    ``part`` (``Part``, this program's rows).
    """
    max_pages = table.pages
    rows, row_ok, rows_at = _row_block(part.first_row, part.num_rows, BLOCK_T, CLAMP)
    tok = part.token_offset + rows
    tok_at = tok
    if CLAMP:
        tok_at = tl.minimum(tok, plan.num_tokens - 1)

    # Issued before the owner check: a load after a block-wide reduction waits for it.
    slot = tl.load(table.slot_mapping_ptr + tok_at, mask=row_ok, other=-1)
    req, begin, end, seq, bound = _owner_of(
        tok, row_ok, requests, part, BLOCK_T, SEARCH_BLOCK, EAGER_PADDING, GUARD, CLAMP
    )
    valid = slot >= 0
    # Per-request outputs are shared by every KV-cache group: the first group (record_group 0 in a plain
    # build, 1 in a group build) writes them. A select rather than `row_ok & (record_group <= 1)`: Triton's
    # interpreter widens a scalar comparison to int32 when it meets a block, and triton 3.9's refuses an
    # int32 mask (docs/kernels.md #triton-versions); compiled, both are one predicate.
    shared = tl.where(record_group <= 1, row_ok, False)
    tl.store(shared_out.token_to_req_ptr + tok_at, req, mask=shared)
    tl.store(shared_out.is_valid_ptr + tok_at, valid, mask=row_ok)

    kind = tl.zeros([BLOCK_T], dtype=tl.int32)
    value = tl.zeros([BLOCK_T], dtype=tl.int32)
    checked = row_ok & valid
    if GUARD:
        kind, value, named = _request_rules(
            kind, value, checked, tok, req, begin, end, seq, requests, plan, CHECK_HOST_SEQ
        )
    start, lens, kind, value = _row_window(
        kind, value, checked, shared, row_ok, tok, tok_at, req, begin, end, seq, bound, plan.num_decodes,
        shared_out, spans, WINDOW, BLOCK_T, NONCAUSAL, IMAGES, CLEAR_IMAGES, MAX_IMAGE, GUARD,
    )  # fmt: skip
    if GUARD and NONCAUSAL:
        kind, value = _flag(kind, value, checked & (lens > WIDTH), ROW_WIDTH, lens)
    # Never longer than the row: what is handed out stays inside it whatever the input. A causal row that
    # needs more (an image longer than M + W where M > W) keeps its first WIDTH positions, as the
    # reference does (docs/semantics.md #vision-spans).
    lens = tl.where(checked, tl.minimum(lens, WIDTH), 0)

    row_table = table.block_table_ptr + req * table.stride
    # The most pages a row of WIDTH consecutive positions can touch: up to 4, each page's block is loaded
    # once per row instead of once per entry.
    base, kind, value = _row_bases(
        row_table, start, lens, max_pages, kind, value, BLOCK_SIZE, BLOCK_T, BLOCK_W, BLOCK_LIMIT,
        (WIDTH + BLOCK_SIZE - 2) // BLOCK_SIZE + 1, GUARD, CLAMP,
    )  # fmt: skip
    if GUARD:
        # A broken row is handed out empty: zeroing its lens empties it entry by entry for free.
        lens = tl.where(kind > 0, 0, lens)
        # Rule 17 after: a row whose slot_mapping entry is not its own slot is recorded and keeps its rows,
        # which the table and seq_lens define inside the cache (docs/semantics.md #guarded-builds).
        kind, value = _own_slot(
            kind, value, checked, lens, seq - end + tok, tok, slot, row_table, max_pages, plan.build_checks,
            BLOCK_SIZE, CLAMP,
        )  # fmt: skip
    cols = tl.arange(0, BLOCK_W)
    idx = tl.where(cols[None, :] < lens[:, None], base + cols[None, :], -1)

    cols_at = cols
    if CLAMP:
        cols_at = tl.minimum(cols, WIDTH - 1)
    if WIDTH == BLOCK_W:
        store_ok = row_ok[:, None]  # the same along a row: the compiler may store vectors
    else:
        store_ok = row_ok[:, None] & (cols[None, :] < WIDTH)
    tl.store(out.indices_ptr + rows_at[:, None] * WIDTH + cols_at[None, :], idx, mask=store_ok)
    tl.store(out.lens_ptr + rows_at, lens, mask=row_ok)
    if GUARD:
        # After the stores: its block-wide reduction would otherwise hold them back.
        _record(shared_out.violation_ptr, kind, named, value, rows, record_group)


@triton.jit
def _gather_lens(
    gather_lens_ptr,
    program,
    num_prefills,
    requests,
    spans,
    plan,
    WINDOW: tl.constexpr,
    GATHER_BLOCK: tl.constexpr,
    MAX_IMAGE: tl.constexpr,
    GUARD: tl.constexpr,
    CLAMP: tl.constexpr,
):
    """The prefills' gather lengths (docs/semantics.md #prefill-metadata), GATHER_BLOCK prefills per
    program (``program``: this one's index among the gather programs), shared by the KV-cache groups;
    ``requests``, ``spans`` and ``plan`` as ``_window_rows`` takes them."""
    _, real, i = _row_block(program * GATHER_BLOCK, num_prefills, GATHER_BLOCK, CLAMP)
    req = plan.num_decodes + i
    seq = tl.load(requests.seq_lens_ptr + req, mask=real, other=0)
    begin = tl.load(requests.qsl_ptr + req, mask=real, other=0)
    end = tl.load(requests.qsl_ptr + req + 1, mask=real, other=0)
    query = end - begin
    bound = tl.load(requests.replay_ptr + req, mask=real, other=0)
    visible = tl.minimum(tl.maximum(seq - query - bound, 0), WINDOW - 1)
    gather = query + visible
    if GUARD:
        # A prefill that broke a rule gets gather length 0. Its violation is recorded by the row programs,
        # at its rows with a slot, as the reference does: a prefill without any records nothing
        # (docs/semantics.md #guarded-builds). Compared, not subtracted (the row programs' rules 1 and
        # 2): a query that wrapped is past int32.
        broken = (end < begin) | (seq < query) | (query < 0)  # QUERY_ORDER, SEQ_SHORT
        broken |= seq > plan.max_model_len  # MODEL_LEN
        broken |= _split_broken(req, begin, end, query, plan)  # HOST_SPLIT
        broken |= tl.load(requests.host_seq_ptr + req, mask=real, other=0) != seq  # HOST_SEQ
        broken |= (bound < 0) | (bound > seq - query)  # REPLAY
        if MAX_IMAGE > 0:
            no_pos = tl.zeros([GATHER_BLOCK], dtype=tl.int32)
            bad_span = _image_visibility(no_pos, req, real, seq, spans, GATHER_BLOCK, MAX_IMAGE, GUARD)[2]
            broken |= bad_span != NO_SPAN  # SPAN
        gather = tl.where(broken, 0, gather)
    tl.store(gather_lens_ptr + i, gather, mask=real)


# Runtime ints never specialise (value 1, multiples of 16) and engine tensors are never assumed aligned:
# then one compile per key serves every batch shape, which lets warmup() promise no compilation at run time.
# The argument lists are the launch contract's (rows_launch.py).
@triton.jit(do_not_specialize=ROWS_INTS, do_not_specialize_on_alignment=list(ROWS_ENGINE))
def swa_metadata_kernel(
    # outputs (the builder's fixed buffers; per-group ones stacked group after group)
    decode_idx_ptr,
    decode_lens_ptr,
    prefill_idx_ptr,
    prefill_lens_ptr,
    token_to_req_ptr,
    is_valid_ptr,
    gather_lens_ptr,
    left_ptr,
    right_ptr,
    violation_ptr,
    # inputs (engine tensors, or the builder's zero buffers when the batch has none)
    qsl_ptr,
    seq_lens_ptr,
    host_seq_ptr,
    block_table_ptr,
    slot_mapping_ptr,
    replay_ptr,
    span_indptr_ptr,
    span_starts_ptr,
    span_ends_ptr,
    group_inputs_ptr,
    # host scalars
    bt_stride,
    max_pages,
    num_reqs,
    num_tokens,
    num_decodes,
    num_prefills,
    num_decode_tokens,
    num_prefill_tokens,
    decode_clear_end,
    dec_progs,
    pre_progs,
    clear_progs,
    search_chunks,
    num_groups,
    group_rows,
    decode_guess_len,
    prefill_guess_len,
    max_query_len,
    decode_query_max,
    num_spans,
    max_model_len,
    build_checks,
    num_bounds,
    prefill_follows,
    # compile-time shape of the work
    WINDOW: tl.constexpr,
    DECODE_WIDTH: tl.constexpr,
    PREFILL_WIDTH: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_TP: tl.constexpr,
    BLOCK_WP: tl.constexpr,
    SEARCH_BLOCK: tl.constexpr,
    MAX_IMAGE: tl.constexpr,
    NONCAUSAL: tl.constexpr,
    GUARD: tl.constexpr,
    BLOCK_LIMIT: tl.constexpr,
    GROUPED: tl.constexpr,
    CLAMP: tl.constexpr,
):
    pid = tl.program_id(0)
    group_progs = dec_progs + pre_progs + clear_progs
    # What the row programs and the gather programs both read (``_window_rows``): the requests' inputs, the
    # image spans, the host's split and bounds.
    requests = Requests(qsl_ptr, seq_lens_ptr, host_seq_ptr, replay_ptr, num_reqs, search_chunks)
    spans = Spans(span_indptr_ptr, span_starts_ptr, span_ends_ptr, num_spans)
    plan = Plan(
        num_tokens, num_decodes, num_decode_tokens, max_query_len, decode_query_max, max_model_len, build_checks,
        num_bounds, prefill_follows,
    )  # fmt: skip
    if pid < num_groups * group_progs:
        # One KV-cache group's rows (docs/semantics.md #group-builds): groups share the split,
        # seq_lens, query_start_loc and replay bounds; each has its own block table and slot mapping.
        g = pid // group_progs
        local = pid - g * group_progs
        if GROUPED:
            # Row g of the builder's group table: block table and slot mapping addresses, the
            # table's row stride and width.
            desc = group_inputs_ptr + g * 4
            table = tl.load(desc).to(tl.pointer_type(tl.int32))
            slots = tl.load(desc + 1).to(tl.pointer_type(tl.int64))
            stride = tl.load(desc + 2).to(tl.int32)
            pages = tl.load(desc + 3).to(tl.int32)
        else:
            table = block_table_ptr
            slots = slot_mapping_ptr
            stride = bt_stride
            pages = max_pages
        rows_at = g.to(tl.int64) * group_rows
        dec_idx = decode_idx_ptr + rows_at * DECODE_WIDTH
        dec_lens = decode_lens_ptr + rows_at
        valid_out = is_valid_ptr + rows_at
        # What a violation of these rows records as its group (swa_hal.rules.RECORD_LEN): g + 1 in a group build;
        # a plain build has one group, g = 0.
        if GROUPED:
            record_group = g + 1
        else:
            record_group = g
        # Decode and prefill rows: the same function, its launch facts in named tuples (``_window_rows``).
        shared_out = Shared(token_to_req_ptr, valid_out, left_ptr, right_ptr, violation_ptr)
        kv = Table(table, slots, stride, pages)
        if local < dec_progs:
            _window_rows(
                out=Out(dec_idx, dec_lens),
                shared_out=shared_out,
                requests=requests,
                table=kv,
                spans=spans,
                plan=plan,
                part=Part(local * BLOCK_T, num_decode_tokens, 0, 0, decode_guess_len),
                record_group=record_group,
                WINDOW=WINDOW,
                WIDTH=DECODE_WIDTH,
                BLOCK_SIZE=BLOCK_SIZE,
                BLOCK_T=BLOCK_T,
                BLOCK_W=BLOCK_W,
                SEARCH_BLOCK=SEARCH_BLOCK,
                NONCAUSAL=NONCAUSAL,
                IMAGES=False,
                CLEAR_IMAGES=MAX_IMAGE > 0,
                MAX_IMAGE=MAX_IMAGE,
                GUARD=GUARD,
                BLOCK_LIMIT=BLOCK_LIMIT,
                EAGER_PADDING=True,
                CHECK_HOST_SEQ=False,
                CLAMP=CLAMP,
            )
        elif local < dec_progs + pre_progs:
            _window_rows(
                out=Out(prefill_idx_ptr + rows_at * PREFILL_WIDTH, prefill_lens_ptr + rows_at),
                shared_out=shared_out,
                requests=requests,
                table=kv,
                spans=spans,
                plan=plan,
                part=Part(
                    (local - dec_progs) * BLOCK_TP,
                    num_prefill_tokens,
                    num_decode_tokens,
                    num_decodes,
                    prefill_guess_len,
                ),
                record_group=record_group,
                WINDOW=WINDOW,
                WIDTH=PREFILL_WIDTH,
                BLOCK_SIZE=BLOCK_SIZE,
                BLOCK_T=BLOCK_TP,
                BLOCK_W=BLOCK_WP,
                SEARCH_BLOCK=SEARCH_BLOCK,
                NONCAUSAL=False,
                IMAGES=MAX_IMAGE > 0,
                CLEAR_IMAGES=False,
                MAX_IMAGE=MAX_IMAGE,
                GUARD=GUARD,
                BLOCK_LIMIT=BLOCK_LIMIT,
                EAGER_PADDING=False,
                CHECK_HOST_SEQ=GUARD,
                CLAMP=CLAMP,
            )
        else:
            # Names differ from the gather branch's: Triton unifies same-named values across branches.
            clear_from = num_decode_tokens + (local - dec_progs - pre_progs) * CLEAR_BLOCK
            _, stale, rows = _row_block(clear_from, decode_clear_end, CLEAR_BLOCK, CLAMP)
            tl.store(dec_lens + rows, tl.zeros([CLEAR_BLOCK], dtype=tl.int32), mask=stale)
    else:
        _gather_lens(
            gather_lens_ptr,
            pid - num_groups * group_progs,
            num_prefills,
            requests,
            spans,
            plan,
            WINDOW,
            GATHER_BLOCK,
            MAX_IMAGE,
            GUARD,
            CLAMP,
        )
