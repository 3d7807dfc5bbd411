"""docs/semantics.md #split, #per-token-helpers, #causal-rows, #dspark-rows, #prefill-metadata in plain, vectorized PyTorch: the oracle every backend is tested against.

Each function runs on any torch device, loops over neither tokens nor window entries, and can write
into caller-owned buffers (``out=``, ``workspace=``) so the torch backend builds with no per-build
allocation the size of the output. All arithmetic is int32, like the kernels' (the config and
validation keep every position and slot inside int32).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from .config import SWAConfig
from .errors import SpeculativeModeError
from .split import Split, split_decodes_and_prefills

if TYPE_CHECKING:
    from .batch import ImageSpans

__all__ = [
    "RowWorkspace",
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


class RowWorkspace:
    """Scratch space for ``*_window_rows``: allocated once, reused by every build."""

    def __init__(self, max_rows: int, max_width: int, device: torch.device | str):
        n = max_rows * max_width
        self.arange = torch.arange(max(max_rows, max_width), dtype=torch.int32, device=device)
        self._pages = torch.empty(n, dtype=torch.int32, device=device)
        self._blocks = torch.empty(n, dtype=torch.int32, device=device)
        self._mask = torch.empty(n, dtype=torch.bool, device=device)
        self._rows = torch.empty((4, max_rows), dtype=torch.int32, device=device)

    def matrices(self, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = rows * width
        return (
            self._pages[:n].view(rows, width),
            self._blocks[:n].view(rows, width),
            self._mask[:n].view(rows, width),
        )

    def vectors(self, rows: int) -> torch.Tensor:
        return self._rows[:, :rows]


def _arange(n: int, device: torch.device, workspace: RowWorkspace | None) -> torch.Tensor:
    if workspace is not None:
        return workspace.arange[:n]
    return torch.arange(n, dtype=torch.int32, device=device)


def token_to_req(
    query_start_loc: torch.Tensor,
    num_tokens: int,
    *,
    out: torch.Tensor | None = None,
    workspace: RowWorkspace | None = None,
) -> torch.Tensor:
    """docs/semantics.md #per-token-helpers: the request owning each token row, on the device (no host sync); rows past the
    scheduled tokens map to 0."""
    num_reqs = query_start_loc.shape[0] - 1
    rows = _arange(num_tokens, query_start_loc.device, workspace)
    # The owner of t is the number of request ends at or before t (zero-length requests included).
    owner = torch.searchsorted(query_start_loc[1:], rows, right=True, out_int32=True, out=out)
    return owner.remainder_(num_reqs)  # R (past the scheduled tokens) -> 0


def valid_tokens(slot_mapping: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """docs/semantics.md #per-token-helpers: a token is valid when it has a KV slot."""
    return torch.ge(slot_mapping, 0, out=out)


def _fill_rows(
    block_table: torch.Tensor,
    req: torch.Tensor,
    start: torch.Tensor,
    last: torch.Tensor,
    lens: torch.Tensor,
    block_size: int,
    out: torch.Tensor,
    workspace: RowWorkspace | None,
    guard: RowGuard | None = None,
) -> None:
    """out[i, j] = slot(req[i], start[i] + j) for j < lens[i], else -1.

    Positions are clamped to ``last`` (the last position of the row, or start itself for an empty
    row) so every block-table read is in bounds even for the padding entries that are later -1.
    With ``guard`` (docs/semantics.md #guarded-builds), rows that read past the table or a block id
    outside ``[0, guard.limit)`` are emptied and reported in ``guard``.
    """
    rows, width = out.shape
    if rows == 0:
        return
    if workspace is not None:
        pages, blocks, pad = workspace.matrices(rows, width)
    else:
        pages = torch.empty_like(out)
        blocks = torch.empty_like(out)
        pad = torch.empty(out.shape, dtype=torch.bool, device=out.device)
    cols = _arange(width, out.device, workspace)
    table = block_table if block_table.is_contiguous() else block_table.contiguous()

    torch.add(start[:, None], cols, out=out)  # positions
    torch.minimum(out, last[:, None], out=out)
    # Integer division is slow on CPUs; a power-of-two page size divides by shifting.
    shift = block_size.bit_length() - 1 if block_size & (block_size - 1) == 0 else None
    if shift is not None:
        torch.bitwise_right_shift(out, shift, out=pages)
    else:
        torch.div(out, block_size, rounding_mode="floor", out=pages)
    torch.ge(cols, lens[:, None], out=pad)
    if guard is not None:
        off_table = ~pad & ((pages < 0) | (pages >= table.shape[1]))
        guard.flag_rows(off_table, pages, PAGES)
    # Clamped into the table: a valid batch never needs it, a malformed one must not read outside it.
    pages.clamp_(0, table.shape[1] - 1)
    pages.add_((req * table.shape[1])[:, None])  # flat block-table offsets
    torch.index_select(table.view(-1), 0, pages.view(-1), out=blocks.view(-1))
    if guard is not None:
        guard.flag_rows(~pad & ((blocks < 0) | (blocks >= guard.limit)), blocks, BLOCK)
    if shift is not None:
        out.bitwise_and_(block_size - 1)
    else:
        torch.remainder(out, block_size, out=out)
    out.add_(blocks, alpha=block_size)  # slot = block * B + position % B
    out.masked_fill_(pad, -1)
    if guard is not None:
        out.masked_fill_(guard.kind[:, None] > 0, -1)
        lens.masked_fill_(guard.kind > 0, 0)


# Row-level rules of a guarded build (the request-level ones live in swa_hal/guard.py).
PAGES, BLOCK = 5, 6


class RowGuard:
    """Per-row findings of a guarded build: the first broken rule of each row and its value."""

    def __init__(self, rows: int, limit: int, device: torch.device):
        self.limit = limit
        self.kind = torch.zeros(rows, dtype=torch.int32, device=device)
        self.value = torch.zeros(rows, dtype=torch.int32, device=device)

    def flag_rows(self, bad: torch.Tensor, values: torch.Tensor, code: int) -> None:
        hit = bad.any(dim=1)
        first = torch.where(bad, torch.arange(bad.shape[1], device=bad.device), bad.shape[1]).amin(dim=1)
        what = values.gather(1, first.clamp_max(bad.shape[1] - 1)[:, None])[:, 0]
        new = hit & (self.kind == 0)
        self.kind.masked_fill_(new, code)
        torch.where(new, what, self.value, out=self.value)


def _row_inputs(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    token_to_req: torch.Tensor,
    token_offset: int,
    num_rows: int,
    workspace: RowWorkspace | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    req = token_to_req[token_offset : token_offset + num_rows]
    seq = torch.index_select(seq_lens, 0, req)
    end = torch.index_select(query_start_loc[1:], 0, req)
    rows = _arange(num_rows, seq_lens.device, workspace)
    return req, seq, end, rows


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
    inside their image span: left = min(p - start, M - 1), right = min(end - p, M); 0 / 0 outside
    every span; where spans overlap, the last one listed that contains p wins."""
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
    req, seq, end, rows = _row_inputs(query_start_loc, seq_lens, token_to_req, token_offset, num_rows, None)
    pos = (seq - end + rows + token_offset).long()
    ptr = spans.indptr.long()
    num_reqs = ptr.shape[0] - 1
    span_ids = torch.arange(num_spans, device=device)
    # The request of span i: the number of CSR ends at or before it (spans past indptr[R] have none,
    # which only a malformed CSR can have).
    span_req = torch.searchsorted(ptr[1:].contiguous(), span_ids, right=True)
    span_req = torch.where((span_ids >= ptr[0]) & (span_req < num_reqs), span_req, -1)
    starts, ends = spans.starts[:num_spans].long(), spans.ends[:num_spans].long()
    inside = (req.long()[:, None] == span_req[None, :]) & (pos[:, None] >= starts) & (pos[:, None] <= ends)
    # The last listed span containing p: the highest span number among the matches.
    order = torch.arange(1, num_spans + 1, device=device)
    pick = (inside * order).argmax(dim=1)
    hit = inside.any(dim=1)
    left = torch.clamp_max(pos - starts[pick], max_image_tokens - 1)
    right = torch.clamp_max(ends[pick] - pos, max_image_tokens)
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
    workspace: RowWorkspace | None = None,
    guard: RowGuard | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """docs/semantics.md #causal-rows: rows for tokens [token_offset, token_offset + num_rows), from row 0.

    A valid token at position p sees positions max(p - W + 1, 0, replay_start[r]) .. p, oldest
    first (#bounded-replay); inside an image span (``left`` / ``right`` per row, #vision-spans) the
    window reaches further left and past p. The rest of the row is -1; the length is never negative.
    An invalid token gets lens 0 and an all -1 row.
    Returns (indices [num_rows, 1, width], lens [num_rows]); width defaults to W.
    """
    width = window_size if width is None else width
    out_indices, out_lens = _row_outputs(num_rows, width, seq_lens.device, out_indices, out_lens)
    if num_rows == 0:
        return out_indices, out_lens
    req, seq, end, rows = _row_inputs(query_start_loc, seq_lens, token_to_req, token_offset, num_rows, workspace)
    invalid = ~is_valid[token_offset : token_offset + num_rows]
    # pos(t) = P_r + (t - qsl[r]) = S_r - qsl[r + 1] + t
    pos = seq.sub_(end).add_(rows).add_(token_offset).masked_fill_(invalid, 0)
    start = torch.sub(pos, window_size - 1)
    last = pos
    if left is not None:
        start.sub_(torch.sub(left, window_size - 1).clamp_min_(0))
    start.clamp_min_(0)
    if replay_start is not None:
        torch.maximum(start, torch.index_select(replay_start, 0, req), out=start)
    if right is not None:
        last = pos + right
    # lens = last + 1 - start, never negative (a replay bound past p leaves an empty row) and never
    # longer than the row (only malformed input could ask for more; #engine-parity).
    torch.sub(last, start, out=out_lens).add_(1).clamp_(0, width)
    out_lens.masked_fill_(invalid, 0)
    # Empty rows read page 0 (clamped positions) and are all -1 afterwards.
    last = torch.where(out_lens > 0, last, 0)
    _fill_rows(block_table, req, start, last, out_lens, block_size, out_indices.view(num_rows, -1), workspace, guard)
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
    workspace: RowWorkspace | None = None,
    check: bool = True,
    guard: RowGuard | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """docs/semantics.md #dspark-rows (DSpark draft rows): every token of request r sees positions
    [max(P_r - W, 0), S_r): the last W context tokens and the whole draft block, future drafts
    included. A row longer than ``width`` raises (``check``) instead of being truncated."""
    out_indices, out_lens = _row_outputs(num_rows, width, seq_lens.device, out_indices, out_lens)
    if num_rows == 0:
        return out_indices, out_lens
    req, seq, end, _ = _row_inputs(query_start_loc, seq_lens, token_to_req, token_offset, num_rows, workspace)
    begin = torch.index_select(query_start_loc, 0, req)
    valid = is_valid[token_offset : token_offset + num_rows]
    prefix = seq - (end - begin)
    start = torch.clamp_min(prefix - window_size, 0).masked_fill_(~valid, 0)
    torch.sub(seq, start, out=out_lens)
    out_lens.masked_fill_(~valid, 0)
    if check:
        longest = int(out_lens.max())
        if longest > width:
            row = int(torch.argmax(out_lens))
            raise SpeculativeModeError(
                "decode_swa_indices",
                f"DSpark row {row} needs {longest} entries but the non-causal width is {width} "
                f"(window {window_size} + draft block); refusing to truncate",
                row,
            )
    out_lens.clamp_max_(width)  # unchecked callers still never get a row longer than its width
    last = (seq - 1).clamp_min_(0).masked_fill_(~valid, 0)
    _fill_rows(block_table, req, start, last, out_lens, block_size, out_indices.view(num_rows, -1), workspace, guard)
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
    t2r = token_to_req(batch.query_start_loc, batch.num_tokens)
    valid = valid_tokens(batch.slot_mapping)
    replay = batch.replay_start
    if replay is None:
        replay = torch.zeros_like(batch.seq_lens)
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
