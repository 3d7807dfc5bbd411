"""Guarded builds (docs/semantics.md #guarded-builds): checks that need the data, done by the build itself.

In guard mode the build (the Triton kernel, or the vectorised torch code below) also checks what the
host preflight cannot see without a sync: query_start_loc non-decreasing, seq_len >= query_len, replay
and span bounds, every block id a window reads inside ``[0, block_limit)`` and inside the block
table's width. A row that breaks a rule is handed out empty (lens 0, all -1), so no index points
outside the KV cache, and the first violation found is recorded in a small device buffer:
``[count, kind, request, value]``. ``SWAMetadataBuilder.check()`` reads it (one sync, when the engine
chooses) and raises the error full validation would have raised.
"""

from __future__ import annotations

import enum
import functools
from typing import TYPE_CHECKING

import torch

from .config import INT32_LIMIT
from .errors import BatchCapacityError, BatchOrderError, BatchRangeError, BatchValidationError, SpeculativeModeError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .batch import ImageSpans
    from .config import SWAConfig
    from .reference import RowGuard

RECORD_LEN = 4  # count, kind, request, value


class Violation(enum.IntEnum):
    """The rules a guarded build checks, in the order a row is checked (the first broken one is kept)."""

    QUERY_ORDER = 1  # query_start_loc[r + 1] < query_start_loc[r]
    SEQ_SHORT = 2  # seq_lens[r] < query_len[r]
    REPLAY = 3  # replay_start[r] outside [0, seq_lens[r] - query_len[r]]
    SPAN = 4  # an image span inverted, outside the request's new tokens, or longer than max_image_tokens
    PAGES = 5  # a window reads a page past the block table's width
    BLOCK = 6  # a window reads a block id outside [0, block_limit)
    ROW_WIDTH = 7  # a row needs more entries than its width (a DSpark block too long for its row)
    # Token-slot rows (docs/semantics.md #token-slot-rows); "request" is then the row.
    POOL = 8  # a row's pool index outside req_to_token's rows
    POSITION = 9  # a row reads a position past req_to_token's width
    TOKEN_SLOT = 10  # a token slot outside [-1, len(slot_map))
    CACHE_SLOT = 11  # a cache slot outside [-1, slot_limit)


def block_limit(config: SWAConfig) -> int:
    """Block ids a window may read lie in [0, block_limit): the KV cache's pages when the config knows
    them, else every id whose slots fit FlashMLA's int32 slot encoding."""
    # Capped at INT32_LIMIT so the bound itself is an int32 value (block ids are int32).
    if config.num_kv_blocks is not None:
        return min(config.num_kv_blocks, INT32_LIMIT)
    return min((INT32_LIMIT + 1) // config.block_size, INT32_LIMIT)


def violation_error(record: list[int], config: SWAConfig) -> BatchValidationError | None:
    """The typed error a recorded violation stands for (the type full validation raises), or None."""
    count, kind, req, value = record
    if count == 0:
        return None
    where = " (found by a guarded build, which handed the offending rows out empty)"
    if kind == Violation.QUERY_ORDER:
        return BatchOrderError(
            "query_start_loc",
            f"query_start_loc[{req + 1}] is smaller than query_start_loc[{req}] (query length "
            f"{value}): it must be non-decreasing{where}",
            req + 1,
        )
    if kind == Violation.SEQ_SHORT:
        return BatchRangeError("seq_lens", f"seq_lens[{req}]={value} is shorter than its query length{where}", req)
    if kind == Violation.REPLAY:
        return BatchRangeError(
            "replay_start", f"replay_start[{req}]={value} is outside [0, seq_lens[{req}] - query_len]{where}", req
        )
    if kind == Violation.SPAN:
        return BatchRangeError(
            "image_spans",
            f"image_spans[{req}]: span {value} is inverted, outside the request's new tokens or longer "
            f"than max_image_tokens={config.max_image_tokens}{where}",
            req,
        )
    if kind == Violation.PAGES:
        return BatchCapacityError(
            "block_table", f"block_table: request {req}'s window reads page {value}, past the table's width{where}", req
        )
    if kind == Violation.BLOCK:
        return BatchRangeError(
            "block_table",
            f"block_table: request {req}'s window reads block id {value}, outside [0, "
            f"{block_limit(config)}) (num_kv_blocks={config.num_kv_blocks}){where}",
            req,
        )
    if kind == Violation.ROW_WIDTH:
        return SpeculativeModeError(
            "decode_swa_indices",
            f"request {req}: its row needs {value} entries, wider than the row; refusing to truncate{where}",
            req,
        )
    if kind == Violation.POOL:
        return BatchRangeError("pools", f"pools[{req}]={value} is not a row of req_to_token{where}", req)
    if kind == Violation.POSITION:
        return BatchCapacityError(
            "req_to_token",
            f"req_to_token: row {req}'s window reads position {value}, past the table's width{where}",
            req,
        )
    if kind == Violation.TOKEN_SLOT:
        return BatchRangeError(
            "req_to_token",
            f"req_to_token: row {req}'s window reads token slot {value}, outside [-1, len(slot_map)){where}",
            req,
        )
    if kind == Violation.CACHE_SLOT:
        return BatchRangeError(
            "slot_map", f"slot_map: row {req}'s window reads cache slot {value}, outside the cache{where}", req
        )
    return BatchValidationError("batch", f"unknown guard violation kind {kind} at request {req}{where}", req)


def torch_guard(
    config: SWAConfig,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    replay_start: torch.Tensor,
    spans: ImageSpans | None,
    num_reqs: int,
    record: torch.Tensor,
    *,
    causal: bool,
    row_guards: Sequence[tuple[RowGuard, torch.Tensor]] = (),
) -> torch.Tensor:
    """The guard of the torch backend, vectorised and without a host sync.

    Checks the request-level rules; ``row_guards`` bring the row-level findings of the rows just
    filled (``reference.RowGuard`` and each row's request). Returns a bool mask [num_reqs] of the
    requests that broke a request-level rule (their rows are emptied by the caller; rows that broke
    a row-level rule were emptied while filled) and records the lowest flagged request in
    ``record`` when it holds no violation yet.
    """
    device = seq_lens.device
    i64 = torch.int64
    qsl = query_start_loc[: num_reqs + 1].to(i64)
    query = qsl[1:] - qsl[:-1]
    seq = seq_lens[:num_reqs].to(i64)
    prefix = seq - query
    bound = replay_start[:num_reqs].to(i64)
    kind = torch.zeros(num_reqs, dtype=i64, device=device)
    value = torch.zeros(num_reqs, dtype=i64, device=device)

    flag = functools.partial(flag_first, kind, value)

    flag(query < 0, Violation.QUERY_ORDER, query)
    flag(prefix < 0, Violation.SEQ_SHORT, seq)
    if causal:
        flag((bound < 0) | (bound > prefix), Violation.REPLAY, bound)
    if spans is not None and config.max_image_tokens > 0 and spans.starts.shape[0] > 0:
        ptr = spans.indptr[: num_reqs + 1].to(i64)
        n = min(spans.starts.shape[0], spans.ends.shape[0])
        span_ids = torch.arange(n, device=device)
        # The owner of span i is the number of request ends at or before it; R: no request owns it.
        owner = torch.searchsorted(ptr[1:].contiguous(), span_ids, right=True)
        owned = (owner < num_reqs) & (span_ids >= ptr[0])
        owner = owner.clamp_max(num_reqs - 1)
        a, e = spans.starts[:n].to(i64), spans.ends[:n].to(i64)
        bad = owned & ((a > e) | (a < prefix[owner]) | (e > seq[owner] - 1) | (e - a + 1 > config.max_image_tokens))
        bad_req = torch.zeros(num_reqs, dtype=torch.bool, device=device)
        bad_req.index_put_((owner,), bad, accumulate=True)
        first_span = torch.full((num_reqs,), n, dtype=i64, device=device)
        first_span.scatter_reduce_(0, owner, torch.where(bad, span_ids, n), reduce="amin")
        flag(bad_req, Violation.SPAN, first_span)
    if not causal:
        need = torch.minimum(seq, query + config.window_size)
        flag(need > config.noncausal_index_width, Violation.ROW_WIDTH, need)
    broken = kind > 0
    # Rows that read past the table or a block id outside the cache (found while filling them).
    for rows, owners in row_guards:
        row_broken = rows.kind > 0
        first_row = torch.where(
            row_broken, torch.arange(row_broken.shape[0], device=device), row_broken.shape[0]
        ).amin()
        at_row = first_row.clamp_max(max(row_broken.shape[0] - 1, 0))
        if row_broken.shape[0]:
            req = owners[at_row].to(i64).clamp(0, num_reqs - 1)
            take = row_broken.any() & (kind[req] == 0) & ~broken.any()
            kind[req] = torch.where(take, rows.kind[at_row].to(i64), kind[req])
            value[req] = torch.where(take, rows.value[at_row].to(i64), value[req])
    record_first(record, kind, value)
    return broken


def flag_first(
    kind: torch.Tensor, value: torch.Tensor, cond: torch.Tensor, code: Violation, what: torch.Tensor
) -> None:
    """Keep each item's first broken rule: where none is set yet and ``cond`` holds, (kind, value) take
    (code, what). In place, vectorised."""
    new = (kind == 0) & cond
    kind.masked_fill_(new, int(code))
    torch.where(new, what, value, out=value)


def record_first(record: torch.Tensor, kind: torch.Tensor, value: torch.Tensor) -> None:
    """Record the lowest item whose ``kind`` is set (a request, or a row), unless ``record`` already
    holds a violation; count it either way. Vectorised, no host sync."""
    n = kind.shape[0]
    flagged = kind > 0
    at = torch.where(flagged, torch.arange(n, device=kind.device), n).amin().clamp_max(n - 1)
    any_flag = flagged.any()
    count = record[0] + any_flag.to(record.dtype)
    new = torch.stack(
        [
            count,
            kind[at].to(record.dtype),
            at.to(record.dtype),
            value[at].clamp(-INT32_LIMIT - 1, INT32_LIMIT).to(record.dtype),
        ]
    )
    keep = torch.stack([count, record[1], record[2], record[3]])
    record.copy_(torch.where(any_flag & (record[0] == 0), new, keep))
