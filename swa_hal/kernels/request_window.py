"""Request-window layouts in one launch (docs/semantics.md #request-window-layouts).

The first ``query_programs`` programs take BLOCK_T query rows each (padding rows included); the others
take BLOCK_G history groups each. What a row needs of its run (the run's number, first and last row) is
found by scanning ``req`` in chunks of CHUNK rows, so no scan pass runs before the launch:

* a query program counts the run starts before its rows (its rows' run numbers) and keeps the last one
  (their run's first row, when it starts before them), then looks up to ``capacity`` rows past each row
  for the next start (whether the row commits: its run ends within the ring);
* a history program walks all rows, ranking the run starts, for the start of its run and of the next
  (the run's last row, which stands for the run, as in SGLang's op).

Every lane's address is clamped into its tensor, masked or not (SM12x's rule), so one variant serves
every Triton backend.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .request_window_launch import REQUEST_WINDOW_ENGINE, REQUEST_WINDOW_INTS
from .swa_metadata import _row_block


@triton.jit
def _is_start(req_ptr, j, n_rows):
    """Whether row j starts a run (False past n_rows); the loads' addresses stay in ``req``."""
    at = tl.minimum(tl.maximum(j, 0), n_rows - 1)
    here = tl.load(req_ptr + at)
    before = tl.load(req_ptr + tl.maximum(at - 1, 0))
    return (j >= 0) & (j < n_rows) & ((j == 0) | (here != before))


@triton.jit
def _fields(out_ptr, padded, history_rows, WINDOW: tl.constexpr):
    """Each output field's place in the call's one output block (int64 ``out_ptr``), in the order
    ``triton_backend._new_layout`` splits it: the int64 fields (req, pos [P]; history req, pos, loc, src
    [H]; runs [1]), then the int32 ones (write_loc, lengths [P], indices [P, W]) from the next int64 word,
    then the bool ones (history_valid [H], commit_mask [P]) from the int64 word after them."""
    p = padded.to(tl.int64)
    hist_req = out_ptr + 2 * p
    runs = hist_req + 4 * history_rows
    tail32 = (runs + 1).to(tl.pointer_type(tl.int32))
    words32 = (p * (WINDOW + 2) + 1) // 2
    tail8 = (runs + 1 + words32).to(tl.pointer_type(tl.int1))
    return (
        out_ptr,
        out_ptr + p,
        tail32,
        tail32 + 2 * p,
        tail32 + p,
        tail8 + history_rows,
        hist_req,
        hist_req + history_rows,
        hist_req + 2 * history_rows,
        tail8,
        hist_req + 3 * history_rows,
        runs,
    )


@triton.jit(do_not_specialize=REQUEST_WINDOW_INTS, do_not_specialize_on_alignment=list(REQUEST_WINDOW_ENGINE))
def request_window_kernel(
    req_ptr,
    pos_ptr,
    floors_ptr,
    out_ptr,
    n_rows,
    padded,
    groups,
    capacity,
    zero_row,
    query_programs,
    WINDOW: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_G: tl.constexpr,
    CHUNK: tl.constexpr,
    HAS_FLOORS: tl.constexpr,
):
    pid = tl.program_id(0)
    cj = tl.arange(0, CHUNK)
    lb = tl.arange(0, BLOCK_W)
    lb_at = tl.minimum(lb, WINDOW - 1)
    in_window = lb < WINDOW
    cap = capacity.to(tl.int64)
    history_rows = groups.to(tl.int64) * WINDOW
    (out_req_ptr, out_pos_ptr, write_ptr, indices_ptr, lengths_ptr, commit_ptr, hist_req_ptr, hist_pos_ptr,
     hist_loc_ptr, hist_valid_ptr, hist_src_ptr, runs_ptr) = _fields(out_ptr, padded, history_rows, WINDOW)  # fmt: skip
    if pid < query_programs:
        lo = pid * BLOCK_T
        rows, live, at = _row_block(lo, n_rows, BLOCK_T, True)  # always clamped: one variant serves all
        # The run starts before this program's rows: how many, and the last.
        before = tl.minimum(lo, n_rows)
        acc_n = tl.zeros([CHUNK], dtype=tl.int32)
        acc_f = tl.zeros([CHUNK], dtype=tl.int32)
        for c in range(0, before, CHUNK):
            j = c + cj
            st = _is_start(req_ptr, j, before)
            acc_n += st.to(tl.int32)
            acc_f = tl.maximum(acc_f, tl.where(st, j, 0))
        st_rows = _is_start(req_ptr, rows, n_rows)
        k = tl.arange(0, BLOCK_T)
        upto = (k[None, :] <= k[:, None]) & st_rows[None, :]  # [row, earlier row of the program]
        group = tl.sum(acc_n, 0) + tl.sum(upto.to(tl.int32), 1) - 1
        first = tl.maximum(tl.max(acc_f, 0), tl.max(tl.where(upto, rows[None, :], 0), 1))
        # The next start within capacity rows of each row (or the end of the rows): the row commits.
        reach = tl.minimum(cap, n_rows).to(tl.int32)
        hi = tl.minimum(lo + BLOCK_T + reach, n_rows)
        acc_c = tl.zeros([BLOCK_T], dtype=tl.int32)
        for c in range(lo + 1, hi, CHUNK):
            j = c + cj
            st = _is_start(req_ptr, j, n_rows)
            gap = (j[None, :] - rows[:, None]).to(tl.int64)
            acc_c += tl.sum((st[None, :] & (gap > 0) & (gap <= cap)).to(tl.int32), 1)
        commit = live & ((acc_c > 0) | (rows.to(tl.int64) + cap >= n_rows))

        req = tl.load(req_ptr + at).to(tl.int64)
        pos = tl.load(pos_ptr + at).to(tl.int64)
        first_pos = pos - (rows - first).to(tl.int64)
        seen = pos[:, None] - lb[None, :]
        valid = live[:, None] & in_window[None, :] & (seen >= 0)
        if HAS_FLOORS:
            floor = tl.load(floors_ptr + at).to(tl.int64)
            valid &= seen >= floor[:, None]
        from_first = seen - first_pos[:, None]
        # A run past the groups has no history rows: it reads its own query rows only (never past the workspace).
        valid &= (from_first >= 0) | (group[:, None] < groups)
        # Before the run's first position: its history group; from it on: the run's own query rows.
        old = group[:, None].to(tl.int64) * WINDOW + WINDOW + from_first
        new = history_rows + first[:, None].to(tl.int64) + from_first
        loc = tl.where(from_first < 0, old, new)
        out = rows < padded
        out_at = tl.minimum(rows, padded - 1)
        tl.store(
            indices_ptr + out_at[:, None].to(tl.int64) * WINDOW + lb_at[None, :],
            tl.where(valid, loc, -1).to(tl.int32),
            mask=out[:, None] & in_window[None, :],
        )
        tl.store(out_req_ptr + out_at, tl.where(live, req, 0), mask=out)
        tl.store(out_pos_ptr + out_at, tl.where(live, pos, 0), mask=out)
        tl.store(write_ptr + out_at, (history_rows + rows).to(tl.int32), mask=out)
        tl.store(lengths_ptr + out_at, tl.sum(valid.to(tl.int32), 1), mask=out)
        tl.store(commit_ptr + out_at, commit, mask=out)
        tl.store(runs_ptr + rows * 0, (group + 1).to(tl.int64), mask=rows == n_rows - 1)
    else:
        g = (pid - query_programs) * BLOCK_G + tl.arange(0, BLOCK_G)
        g_ok = g < groups
        # Rank the run starts: run g starts at acc_s's row, run g + 1 at acc_e's.
        acc_s = tl.full([BLOCK_G], -1, dtype=tl.int32)
        acc_e = tl.full([BLOCK_G], -1, dtype=tl.int32)
        count = 0
        for c in range(0, n_rows, CHUNK):
            j = c + cj
            st = _is_start(req_ptr, j, n_rows)
            rank = count + tl.cumsum(st.to(tl.int32), 0) - 1
            at_s = st[None, :] & (rank[None, :] == g[:, None])
            at_e = st[None, :] & (rank[None, :] == g[:, None] + 1)
            acc_s = tl.maximum(acc_s, tl.max(tl.where(at_s, j[None, :], -1), 1))
            acc_e = tl.maximum(acc_e, tl.max(tl.where(at_e, j[None, :], -1), 1))
            count += tl.sum(st.to(tl.int32), 0)
        live = acc_s >= 0
        end = tl.where(live, tl.where(acc_e >= 0, acc_e, n_rows) - 1, 0)
        req = tl.where(live, tl.load(req_ptr + end).to(tl.int64), 0)
        first_pos = tl.where(live, tl.load(pos_ptr + end).to(tl.int64) - end + tl.maximum(acc_s, 0), 0)
        hpos = first_pos[:, None] - WINDOW + lb[None, :]
        valid = live[:, None] & (hpos >= 0)
        if HAS_FLOORS:
            floor = tl.where(live, tl.load(floors_ptr + end).to(tl.int64), 0)
            valid &= hpos >= floor[:, None]
        # C's remainder is Python's where it is used: valid positions are non-negative.
        src = tl.where(valid, req[:, None] * cap + hpos % cap, zero_row.to(tl.int64))
        h = tl.minimum(g, groups - 1)[:, None].to(tl.int64) * WINDOW + lb_at[None, :]
        mask = g_ok[:, None] & in_window[None, :]
        tl.store(hist_req_ptr + h, req[:, None] + lb[None, :] * 0, mask=mask)
        tl.store(hist_pos_ptr + h, hpos, mask=mask)
        tl.store(hist_loc_ptr + h, h, mask=mask)
        tl.store(hist_valid_ptr + h, valid, mask=mask)
        tl.store(hist_src_ptr + h, src, mask=mask)
