"""docs/semantics.md #split, #per-token-helpers, #causal-rows, #dspark-rows, #prefill-metadata in plain, vectorized PyTorch: the oracle every backend is tested against.

Each function runs on any torch device and loops over neither tokens nor window entries: a row is a
[rows, width] table of positions, looked up in the block table. No workspaces, caches or guards: the torch
backend's tuned fills of the same rows live in ``torch_backend/rows.py`` and are held to these bit for bit. Positions
are int64 here (the config and validation keep every valid one inside int32).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from .config import SWAConfig
from .errors import SpeculativeModeError
from .split import Split, split_decodes_and_prefills

if TYPE_CHECKING:
    from .spans import ImageSpans

__all__ = [
    "ReferenceResult",
    "token_to_req",
    "valid_tokens",
    "causal_window_rows",
    "noncausal_window_rows",
    "prefill_gather_lens",
    "ragged_rows",
    "image_visibility",
    "has_image_spans",
    "split_decodes_and_prefills",
    "build_reference",
]


def token_to_req(query_start_loc: torch.Tensor, num_tokens: int, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """docs/semantics.md #per-token-helpers: the request owning each token row, on the device (no host sync); rows past the
    scheduled tokens map to 0."""
    num_reqs = query_start_loc.shape[0] - 1
    rows = torch.arange(num_tokens, dtype=torch.int32, device=query_start_loc.device)
    # The owner of t is the number of request ends at or before t (zero-length requests included): a
    # search of the sorted ends, which are the ends themselves unless the offsets decrease somewhere.
    ends = torch.sort(query_start_loc[1:]).values
    owner = torch.searchsorted(ends, rows, right=True, out_int32=True, out=out)
    # R (past the scheduled tokens) -> 0
    return owner.remainder_(num_reqs)


def valid_tokens(slot_mapping: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """docs/semantics.md #per-token-helpers: a token is valid when it has a KV slot."""
    return torch.ge(slot_mapping, 0, out=out)


def _row_inputs(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, token_to_req: torch.Tensor, token_offset: int, num_rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    req = token_to_req[token_offset : token_offset + num_rows]
    seq = torch.index_select(seq_lens, 0, req)
    end = torch.index_select(query_start_loc[1:], 0, req)
    rows = torch.arange(num_rows, dtype=torch.int32, device=seq_lens.device)
    return req, seq, end, rows


def _window_entries(
    block_table: torch.Tensor,
    req: torch.Tensor,
    start: torch.Tensor,
    lens: torch.Tensor,
    block_size: int,
    out_indices: torch.Tensor,
    out_lens: torch.Tensor,
) -> None:
    """Row i holds the slots of its request's positions start[i] .. start[i] + lens[i] - 1, oldest first,
    then -1 (a slot is block_table[r, p // B] * B + p % B): one [rows, width] table of positions."""
    rows, width = out_indices.shape[0], out_indices.shape[-1]
    cols = torch.arange(width, dtype=torch.int64, device=lens.device)
    inside = cols[None, :] < lens.long()[:, None]
    pos = torch.where(inside, start.long()[:, None] + cols[None, :], 0)
    blocks = block_table.long()[req.long()[:, None], pos // block_size]
    slots = torch.where(inside, blocks * block_size + pos % block_size, -1)
    out_indices.view(rows, width).copy_(slots)
    out_lens.copy_(lens)


def _row_outputs(
    num_rows: int, width: int, device: torch.device, out_indices: torch.Tensor | None, out_lens: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    if out_indices is None:
        out_indices = torch.empty((num_rows, 1, width), dtype=torch.int32, device=device)
    if out_lens is None:
        out_lens = torch.empty(num_rows, dtype=torch.int32, device=device)
    return out_indices, out_lens


def image_visibility(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    token_to_req: torch.Tensor,
    spans: ImageSpans,
    *,
    token_offset: int,
    num_rows: int,
    max_image_tokens: int,
    out_left: torch.Tensor | None = None,
    out_right: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """docs/semantics.md #vision-spans: how far rows [token_offset, token_offset + num_rows) see
    inside their image span: left = min(p - start, M - 1), right = min(min(end, S_r - 1) - p, M) (never
    past the request's last position, never below 0); 0 / 0 outside every span; where spans overlap, the
    last one listed that contains p wins. A span may start before the request's new tokens, end after
    them and hold more than M tokens."""
    device = seq_lens.device
    if out_left is None:
        out_left = torch.empty(num_rows, dtype=torch.int32, device=device)
    if out_right is None:
        out_right = torch.empty(num_rows, dtype=torch.int32, device=device)
    out_left.zero_()
    out_right.zero_()
    num_spans = min(spans.starts.shape[0], spans.ends.shape[0])
    if num_rows == 0 or num_spans == 0:
        return out_left, out_right
    req, seq, end, rows = _row_inputs(query_start_loc, seq_lens, token_to_req, token_offset, num_rows)
    pos = (seq - end + rows + token_offset).long()
    ptr = spans.indptr.long()
    num_reqs = ptr.shape[0] - 1
    span_ids = torch.arange(num_spans, device=device)
    # Request r's spans are the existing ones in [indptr[r], indptr[r + 1]) (none where the CSR decreases).
    owner = req.long().clamp(0, num_reqs - 1)
    mine = (span_ids >= ptr[owner][:, None]) & (span_ids < ptr[owner + 1][:, None])
    starts, ends = spans.starts[:num_spans].long(), spans.ends[:num_spans].long()
    inside = mine & (pos[:, None] >= starts) & (pos[:, None] <= ends)
    # The last listed span containing p: the highest span number among the matches.
    order = torch.arange(1, num_spans + 1, device=device)
    pick = (inside * order).argmax(dim=1)
    hit = inside.any(dim=1)
    left = torch.clamp_max(pos - starts[pick], max_image_tokens - 1)
    # A span past the request's last position (a chunk that ends inside its image) is cut there: no row
    # reaches a position this step has not written. Exact int64 distances; a position past the last one
    # (only where the offsets decrease, a malformed batch) sees nothing to its right.
    last = seq.long() - 1
    right = (torch.minimum(ends[pick], last) - pos).clamp_(0, max_image_tokens)
    out_left.copy_(torch.where(hit, left, 0))
    out_right.copy_(torch.where(hit, right, 0))
    return out_left, out_right


def causal_window_rows(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    token_to_req: torch.Tensor,
    is_valid: torch.Tensor,
    *,
    token_offset: int,
    num_rows: int,
    window_size: int,
    block_size: int,
    replay_start: torch.Tensor | None = None,
    left: torch.Tensor | None = None,
    right: torch.Tensor | None = None,
    width: int | None = None,
    out_indices: torch.Tensor | None = None,
    out_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """docs/semantics.md #causal-rows: rows for tokens [token_offset, token_offset + num_rows), from row 0.

    A valid token at position p sees positions max(p - W + 1, 0, replay_start[r]) .. p, oldest
    first (#bounded-replay); inside an image span (``left`` / ``right`` per row, #vision-spans) the
    window reaches further left and past p. The rest of the row is -1; the length is never negative
    and never longer than the row (a row that needs more keeps its first ``width`` positions).
    An invalid token gets lens 0 and an all -1 row.
    Returns (indices [num_rows, 1, width], lens [num_rows]); width defaults to W.
    """
    width = window_size if width is None else width
    out_indices, out_lens = _row_outputs(num_rows, width, seq_lens.device, out_indices, out_lens)
    if num_rows == 0:
        return out_indices, out_lens
    req, seq, end, rows = _row_inputs(query_start_loc, seq_lens, token_to_req, token_offset, num_rows)
    pos = (seq - end + rows + token_offset).long()  # P_r + (t - qsl[r])
    start = pos - (window_size - 1)
    last = pos
    if left is not None:
        start = start - (left.long() - (window_size - 1)).clamp_min(0)
    if right is not None:
        last = pos + right.long()
    start = start.clamp_min(0)
    if replay_start is not None:
        start = torch.maximum(start, replay_start.long()[req.long()])
    lens = torch.where(is_valid[token_offset : token_offset + num_rows], (last + 1 - start).clamp(0, width), 0)
    _window_entries(block_table, req, start, lens, block_size, out_indices, out_lens)
    return out_indices, out_lens


def noncausal_window_rows(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    token_to_req: torch.Tensor,
    is_valid: torch.Tensor,
    *,
    token_offset: int,
    num_rows: int,
    window_size: int,
    block_size: int,
    width: int,
    out_indices: torch.Tensor | None = None,
    out_lens: torch.Tensor | None = None,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """docs/semantics.md #dspark-rows (DSpark draft rows): every token of request r sees positions
    [max(P_r - W, 0), S_r): the last W context tokens and the whole draft block, future drafts
    included. A row longer than ``width`` raises (``check``) instead of being truncated."""
    out_indices, out_lens = _row_outputs(num_rows, width, seq_lens.device, out_indices, out_lens)
    if num_rows == 0:
        return out_indices, out_lens
    req, seq, _, _ = _row_inputs(query_start_loc, seq_lens, token_to_req, token_offset, num_rows)
    r = req.long()
    query = (query_start_loc[1:].long() - query_start_loc[:-1].long())[r]
    start = (seq.long() - query - window_size).clamp_min(0)
    lens = torch.where(is_valid[token_offset : token_offset + num_rows], seq.long() - start, 0)
    if check:
        longest = int(lens.max())
        if longest > width:
            row = int(torch.argmax(lens))
            raise SpeculativeModeError(
                "decode_swa_indices",
                f"DSpark row {row} needs {longest} entries but the non-causal width is {width} "
                f"(window {window_size} + draft block); refusing to truncate",
                row,
            )
    _window_entries(block_table, req, start, lens.clamp_max(width), block_size, out_indices, out_lens)
    return out_indices, out_lens


def prefill_gather_lens(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_decodes: int,
    num_prefills: int,
    window_size: int,
    *,
    replay_start: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """docs/semantics.md #prefill-metadata: gather_len[i] = q_r + min(max(P_r - replay_start[r], 0), W - 1)
    for r = num_decodes + i (#bounded-replay; no bound: replay_start 0)."""
    lo, hi = num_decodes, num_decodes + num_prefills
    query = query_start_loc[lo + 1 : hi + 1] - query_start_loc[lo:hi]
    prefix = seq_lens[lo:hi] - query
    if replay_start is not None:
        prefix = prefix - replay_start[lo:hi]
    return torch.add(query, prefix.clamp_(0, window_size - 1), out=out)


def ragged_rows(indices: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ragged (CSR) form of dense rows: the valid entries of every row concatenated, and
    indptr [rows + 1], the exclusive prefix sum of lens. Synchronises (its length is data)."""
    rows = lens.shape[0]
    indptr = torch.zeros(rows + 1, dtype=torch.int32, device=lens.device)
    torch.cumsum(lens, 0, dtype=torch.int32, out=indptr[1:])
    flat = indices.reshape(rows, indices.shape[-1])
    keep = torch.arange(flat.shape[1], device=lens.device)[None, :] < lens[:, None]
    return flat[keep], indptr


@dataclasses.dataclass(eq=False)
class ReferenceResult:
    """Every output of one build, as fresh tensors."""

    split: Split
    token_to_req: torch.Tensor
    is_valid: torch.Tensor
    decode_indices: torch.Tensor
    decode_lens: torch.Tensor
    decode_width: int
    prefill_indices: torch.Tensor
    prefill_lens: torch.Tensor
    prefill_gather_lens: torch.Tensor | None
    replay_start: torch.Tensor
    # Indexed by absolute token, 0 on decode rows; None unless the config and the batch have spans.
    prefill_left_visible: torch.Tensor | None = None
    prefill_right_visible: torch.Tensor | None = None


def has_image_spans(config: SWAConfig, batch) -> bool:
    """Whether a build computes image visibility: the vision variant and at least one span."""
    spans = batch.image_spans
    return config.max_image_tokens > 0 and spans is not None and spans.starts.shape[0] > 0


def build_reference(config: SWAConfig, batch) -> ReferenceResult:
    """The whole build (docs/semantics.md #split to #prefill-metadata) for one batch, from scratch."""
    split = split_decodes_and_prefills(
        batch.query_start_loc_cpu, batch.max_query_len, batch.num_tokens, config.decode_threshold
    )
    nd, npf, ndt, npt = split
    num_reqs = nd + npf
    t2r = token_to_req(batch.query_start_loc, batch.num_tokens)
    valid = valid_tokens(batch.slot_mapping)
    replay = batch.replay_start
    if replay is None:
        replay = torch.zeros_like(batch.seq_lens[:num_reqs])
    elif replay.shape[0] < num_reqs:  # padding requests past the bounds have none (#bounded-replay)
        replay = torch.cat([replay, replay.new_zeros(num_reqs - replay.shape[0])])
    else:  # an engine's longer buffer: the step's R bounds (#inputs)
        replay = replay[:num_reqs]
    common: dict[str, Any] = dict(window_size=config.window_size, block_size=config.block_size)
    inputs = (batch.query_start_loc, batch.seq_lens, batch.block_table, t2r, valid)
    if batch.causal:
        dec_idx, dec_lens = causal_window_rows(*inputs, token_offset=0, num_rows=ndt, replay_start=replay, **common)
        width = config.window_size
    else:
        if not config.is_dspark:
            raise SpeculativeModeError(
                "causal", f"causal=False is only legal with DSpark; speculative_method={config.speculative_method!r}"
            )
        width = config.noncausal_index_width
        dec_idx, dec_lens = noncausal_window_rows(*inputs, token_offset=0, num_rows=ndt, width=width, **common)
    left_all = right_all = left = right = None
    if npt and has_image_spans(config, batch):
        left_all = torch.zeros(ndt + npt, dtype=torch.int32, device=batch.seq_lens.device)
        right_all = torch.zeros_like(left_all)
        left, right = image_visibility(
            batch.query_start_loc,
            batch.seq_lens,
            t2r,
            batch.image_spans,
            token_offset=ndt,
            num_rows=npt,
            max_image_tokens=config.max_image_tokens,
            out_left=left_all[ndt:],
            out_right=right_all[ndt:],
        )
    pre_idx, pre_lens = causal_window_rows(
        *inputs,
        token_offset=ndt,
        num_rows=npt,
        replay_start=replay,
        left=left,
        right=right,
        width=config.prefill_index_width,
        **common,
    )
    gather = (
        prefill_gather_lens(batch.seq_lens, batch.query_start_loc, nd, npf, config.window_size, replay_start=replay)
        if npf > 0
        else None
    )
    return ReferenceResult(
        split, t2r, valid, dec_idx, dec_lens, width, pre_idx, pre_lens, gather, replay, left_all, right_all
    )
