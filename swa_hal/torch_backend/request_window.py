"""The torch backend's request-window layouts (docs/semantics.md #request-window-layouts): the vectorised
torch build of a ``RequestWindowRows`` call (``swa_hal/request_window.py`` holds the inputs, their host
preflight and the syncing validation), in new tensors, without a host sync. The Triton backends launch
``kernels/request_window.py`` instead, and are held to this build bit for bit.
"""

from __future__ import annotations

import torch

from ..request_window import RequestWindowLayout, RequestWindowRows


def build_request_window(rows: RequestWindowRows, window: int) -> RequestWindowLayout:
    """The torch build (no host sync; a fixed number of operations whatever the rows). A run past the
    history groups (the invariant SGLang reports as ``dsv41.window_groups_fit``) gets no history rows, and
    its query rows read only the run's own rows (SGLang's op points them past the history: docs/semantics.md
    #request-window-layouts)."""
    i64 = torch.int64
    req = rows.req.to(i64)
    pos = rows.pos.to(i64)
    n = pos.shape[0]
    dev = pos.device
    groups = rows.groups()
    padded = rows.padded()
    capacity = rows.capacity
    history_rows = groups * window
    offset = torch.arange(n, device=dev)
    # Runs: the start of each, each row's run number, and its run's first and last rows.
    starts = torch.ones(n, dtype=torch.bool, device=dev)
    starts[1:] = req[1:] != req[:-1]
    group = starts.cumsum(0) - 1
    first = torch.cummax(torch.where(starts, offset, 0), 0).values
    ends = torch.ones(n, dtype=torch.bool, device=dev)
    ends[:-1] = starts[1:]
    last = torch.cummin(torch.where(ends, offset, n - 1).flip(0), 0).values.flip(0)
    first_pos = pos - (offset - first)

    lookback = torch.arange(window, device=dev)
    seen = pos[:, None] - lookback
    valid = seen >= 0
    floors = None if rows.floors is None else rows.floors[:n].to(i64)
    if floors is not None:
        valid &= seen >= floors[:, None]
    from_first = seen - first_pos[:, None]
    # A run past the groups has no history rows: it reads its own query rows only (never past the workspace).
    valid &= (from_first >= 0) | (group[:, None] < groups)
    # Before the run's first position: its history group; from it on: the run's own query rows.
    loc = torch.where(
        from_first < 0, group[:, None] * window + window + from_first, history_rows + first[:, None] + from_first
    )
    indices = torch.where(valid, loc, -1).to(torch.int32)
    lengths = valid.sum(-1, dtype=torch.int32)
    commit = (last - offset) < capacity

    # History: group g is run g's (g < groups); its last row stands for the run, as in SGLang's op.
    slot = torch.where(starts & (group < groups), group, groups)
    run_start = torch.full((groups + 1,), -1, dtype=i64, device=dev).scatter_(0, slot, offset)[:groups]
    live = run_start >= 0
    start = run_start.clamp_min(0)
    end = last.index_select(0, start)
    g_req = torch.where(live, req.index_select(0, end), 0)
    g_first = torch.where(live, pos.index_select(0, end) - end + start, 0)
    history_pos = (g_first[:, None] - window + lookback).reshape(-1)
    # A copy, not ``expand(...).reshape(-1)``: with one group that is a view of stride 0 (every row one
    # element), which a graph replay's in-place refresh (SGLang's ``WindowLayout.copy_``) cannot write.
    history_req = g_req.repeat_interleave(window)
    history_valid = (history_pos >= 0) & live.repeat_interleave(window)
    if floors is not None:
        g_floor = torch.where(live, floors.index_select(0, end), 0)
        history_valid &= history_pos >= g_floor.repeat_interleave(window)
    history_src = torch.where(history_valid, history_req * capacity + history_pos % capacity, rows.zero_row)

    write_loc = torch.arange(history_rows, history_rows + padded, dtype=torch.int32, device=dev)
    pad = padded - n
    if pad:
        # Padding rows write the workspace past the live rows, read nothing and commit nowhere.
        req_out = torch.cat([req, req.new_zeros(pad)])
        pos_out = torch.cat([pos, pos.new_zeros(pad)])
        indices = torch.cat([indices, indices.new_full((pad, window), -1)])
        lengths = torch.cat([lengths, lengths.new_zeros(pad)])
        commit = torch.cat([commit, commit.new_zeros(pad)])
    else:
        # New tensors even where the inputs are int64 already: the caller keeps them (a graph replay
        # copies into them), so they must not alias the engine's inputs.
        req_out = req.clone() if req is rows.req else req
        pos_out = pos.clone() if pos is rows.pos else pos
    return RequestWindowLayout(
        req=req_out,
        pos=pos_out,
        write_loc=write_loc,
        indices=indices,
        lengths=lengths,
        history_req=history_req,
        history_pos=history_pos,
        history_loc=torch.arange(history_rows, device=dev),
        history_valid=history_valid,
        history_src=history_src,
        commit_mask=commit,
        size=history_rows + padded,
        runs=group[-1:] + 1,
    )
