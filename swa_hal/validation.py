"""Full validation of an AttentionBatch (docs/semantics.md #inputs) against a config.

Each failure raises the BatchValidationError subclass of its kind, with a message that starts with
the field (and index) and states the constraint. Reads device values, so it synchronises: the
builder runs it when asked (``validate=True``, the CLI, ``SWA_HAL_DEBUG=1``); the hot path runs only
the O(1) host preflight (docs/kernels.md #words).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from .config import INT32_LIMIT
from .errors import (
    BatchCapacityError,
    BatchConsistencyError,
    BatchDeviceError,
    BatchDtypeError,
    BatchOrderError,
    BatchRangeError,
    BatchShapeError,
    SpeculativeModeError,
)
from .preflight import check_unbounded_padding, refuse_untyped_spans
from .reference import image_visibility, token_to_req
from .split import split_decodes_and_prefills

if TYPE_CHECKING:
    from .batch import AttentionBatch
    from .config import SWAConfig


def _tensor(name: str, t: object, dtype: torch.dtype, ndim: int, *, cpu: bool = False) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise BatchDtypeError(name, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise BatchDtypeError(name, f"{name} has dtype {t.dtype}; expected {dtype}")
    if t.dim() != ndim:
        raise BatchShapeError(name, f"{name} has {t.dim()} dimensions {tuple(t.shape)}; expected {ndim}")
    if cpu and t.device.type != "cpu":
        raise BatchDeviceError(name, f"{name} is on {t.device}; it is the host copy and must be on the CPU")
    if ndim == 1 and t.numel() > 1 and t.stride(0) != 1:
        raise BatchShapeError(name, f"{name} must be contiguous (stride {t.stride(0)})")
    return t


def _first(mask: torch.Tensor) -> int:
    return int(torch.nonzero(mask)[0, 0])


def _offset_counts(name: str, ptr: torch.Tensor) -> torch.Tensor:
    """The counts between the offsets ``ptr`` (the host tensor named ``name``), which must start at 0 and
    never decrease."""
    if int(ptr[0]) != 0:
        raise BatchOrderError(name, f"{name}[0]={int(ptr[0])}; it must start at 0", 0)
    counts = ptr[1:] - ptr[:-1]
    if bool((counts < 0).any()):
        i = _first(counts < 0)
        raise BatchOrderError(
            name,
            f"{name}[{i + 1}]={int(ptr[i + 1])} is smaller than {name}[{i}]={int(ptr[i])}: it must be non-decreasing",
            i + 1,
        )
    return counts


def validate_batch(batch: AttentionBatch, config: SWAConfig, capacity: int | None = None) -> None:
    """Every rule of docs/semantics.md #inputs (a host sync). R is the host offsets'
    request count, as on the default path: per-request tensors longer than R (an engine's persistent buffers)
    are read for their first R entries."""
    cap = config.max_num_batched_tokens if capacity is None else capacity
    seq_lens = _tensor("seq_lens", batch.seq_lens, torch.int32, 1)
    qsl = _tensor("query_start_loc", batch.query_start_loc, torch.int32, 1)
    qsl_cpu = _tensor("query_start_loc_cpu", batch.query_start_loc_cpu, torch.int32, 1, cpu=True)
    seq_cpu = batch.seq_lens_cpu
    if seq_cpu is not None:
        _tensor("seq_lens_cpu", seq_cpu, torch.int32, 1, cpu=True)
    table = _tensor("block_table", batch.block_table, torch.int32, 2)
    slots = _tensor("slot_mapping", batch.slot_mapping, torch.int64, 1)
    device = seq_lens.device
    for name, t in (("query_start_loc", qsl), ("block_table", table), ("slot_mapping", slots)):
        if t.device != device:
            raise BatchDeviceError(name, f"{name} is on {t.device} but seq_lens is on {device}")
    if device.type == "meta":
        raise BatchDeviceError("seq_lens", "seq_lens is on meta: meta tensors hold no values to validate")
    if table.stride(1) != 1:
        raise BatchShapeError("block_table", "block_table must be contiguous along its pages (stride(1) == 1)")

    num_reqs = qsl_cpu.shape[0] - 1
    if num_reqs < 1:
        raise BatchShapeError("query_start_loc_cpu", "query_start_loc_cpu has no request: the batch is empty")
    if num_reqs > config.max_num_seqs:
        raise BatchCapacityError("seq_lens", f"seq_lens has {num_reqs} requests; max_num_seqs is {config.max_num_seqs}")
    if qsl.shape[0] != num_reqs + 1:
        raise BatchShapeError(
            "query_start_loc", f"query_start_loc has {qsl.shape[0]} entries; query_start_loc_cpu has {num_reqs + 1}"
        )
    for name, t in (("seq_lens", seq_lens), ("seq_lens_cpu", seq_cpu)):
        if t is not None and t.shape[0] < num_reqs:
            raise BatchShapeError(name, f"{name} has {t.shape[0]} entries for {num_reqs} requests")
    if seq_lens.shape[0] > num_reqs or (seq_cpu is not None and seq_cpu.shape[0] > num_reqs):
        seq_lens, seq_cpu = seq_lens[:num_reqs], None if seq_cpu is None else seq_cpu[:num_reqs]
        batch = batch.replace(seq_lens=seq_lens, seq_lens_cpu=seq_cpu)
    if table.shape[0] < num_reqs:
        raise BatchShapeError("block_table", f"block_table has {table.shape[0]} rows for {num_reqs} requests")
    if table.shape[1] < 1:
        raise BatchShapeError("block_table", "block_table has no page columns")

    num_tokens = batch.num_tokens
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int):
        raise BatchDtypeError("num_tokens", f"num_tokens must be an int, got {num_tokens!r}")
    if num_tokens < 1:
        raise BatchShapeError("num_tokens", f"num_tokens={num_tokens}: the batch has no token rows")
    if num_tokens > cap:
        raise BatchCapacityError(
            "num_tokens", f"num_tokens={num_tokens} exceeds the builder's capacity (max_num_batched_tokens={cap})"
        )
    if slots.shape[0] != num_tokens:
        raise BatchShapeError("slot_mapping", f"slot_mapping has {slots.shape[0]} entries; num_tokens is {num_tokens}")
    mql = batch.max_query_len
    if isinstance(mql, bool) or not isinstance(mql, int) or mql < 0:
        raise BatchDtypeError("max_query_len", f"max_query_len must be a non-negative int, got {mql!r}")
    if not isinstance(batch.causal, bool):
        raise BatchDtypeError("causal", f"causal must be a bool, got {batch.causal!r}")

    # -- values ---------------------------------------------------------------------------------
    starts = qsl_cpu.to(torch.int64)
    dev_starts = qsl.cpu().to(torch.int64)
    if not torch.equal(starts, dev_starts):
        i = _first(starts != dev_starts)
        raise BatchConsistencyError(
            "query_start_loc",
            f"query_start_loc[{i}]={int(dev_starts[i])} differs from its host copy "
            f"query_start_loc_cpu[{i}]={int(starts[i])}",
            i,
        )
    query = _offset_counts("query_start_loc", starts)
    scheduled = int(starts[-1])
    if scheduled > num_tokens:
        raise BatchRangeError(
            "num_tokens",
            f"num_tokens={num_tokens} is smaller than the {scheduled} scheduled tokens (query_start_loc[-1])",
        )
    longest = int(query.max())
    if longest > mql:
        raise BatchConsistencyError(
            "max_query_len", f"max_query_len={mql} but request {int(torch.argmax(query))} has {longest} query tokens"
        )

    seq = seq_lens.cpu().to(torch.int64)
    if bool((seq < 0).any()):
        r = _first(seq < 0)
        raise BatchRangeError("seq_lens", f"seq_lens[{r}]={int(seq[r])} is negative", r)
    short = seq < query
    if bool(short.any()):
        r = _first(short)
        raise BatchRangeError(
            "seq_lens", f"seq_lens[{r}]={int(seq[r])} is shorter than its query length {int(query[r])}", r
        )
    if bool((seq > config.max_model_len).any()):
        r = _first(seq > config.max_model_len)
        raise BatchCapacityError(
            "seq_lens", f"seq_lens[{r}]={int(seq[r])} exceeds max_model_len={config.max_model_len}", r
        )

    split = split_decodes_and_prefills(qsl_cpu, mql, num_tokens, config.decode_threshold)
    if seq_cpu is not None:
        host = seq_cpu.to(torch.int64)
        under = host < seq
        if bool(under.any()):
            r = _first(under)
            raise BatchConsistencyError(
                "seq_lens_cpu",
                f"seq_lens_cpu[{r}]={int(host[r])} is below seq_lens[{r}]={int(seq[r])}; the host copy must be an upper bound",
                r,
            )
        nd = split.num_decodes
        if bool((host[nd:] != seq[nd:]).any()):
            r = nd + _first(host[nd:] != seq[nd:])
            raise BatchConsistencyError(
                "seq_lens_cpu",
                f"seq_lens_cpu[{r}]={int(host[r])} differs from seq_lens[{r}]={int(seq[r])}; prefill rows must be exact",
                r,
            )

    if not batch.causal:
        if not config.is_dspark:
            raise SpeculativeModeError(
                "causal",
                f"causal=False is only legal with DSpark drafting; speculative_method={config.speculative_method!r}",
            )
        width = config.noncausal_index_width
        nd = split.num_decodes
        need = torch.minimum(seq[:nd], query[:nd] + config.window_size)
        if nd and bool((need > width).any()):
            r = _first(need > width)
            raise SpeculativeModeError(
                "seq_lens",
                f"seq_lens[{r}]={int(seq[r])}: its DSpark row needs {int(need[r])} entries, wider than the non-causal width {width}",
                r,
            )

    replay = _validate_replay(batch.replay_start, seq, query, device, batch.query_start_loc_cpu)
    _validate_spans(batch.image_spans, seq, query, device, config)
    reach = _image_reach(batch, config, split)
    _validate_pages(table, seq, query, starts, config, batch.causal, replay, reach)
    _validate_slots(slots, table, seq, starts, scheduled, config)


def _validate_replay(replay_start, seq, query, device, query_start_loc_cpu) -> torch.Tensor | None:
    """docs/semantics.md #bounded-replay: 0 <= replay_start[r] <= seq_lens[r] - query_len[r]."""
    if replay_start is None:
        return None
    num_reqs = seq.shape[0]
    t = _tensor("replay_start", replay_start, torch.int32, 1)
    if t.device != device:
        raise BatchDeviceError("replay_start", f"replay_start is on {t.device} but seq_lens is on {device}")
    bound = t[:num_reqs].cpu().to(torch.int64)
    if t.shape[0] < num_reqs:  # padding requests past the bounds have none (#bounded-replay)
        check_unbounded_padding(t.shape[0], num_reqs, query_start_loc_cpu)
        bound = torch.cat([bound, bound.new_zeros(num_reqs - t.shape[0])])
    prefix = seq - query
    if bool((bound < 0).any()):
        r = _first(bound < 0)
        raise BatchRangeError("replay_start", f"replay_start[{r}]={int(bound[r])} is negative", r)
    if bool((bound > prefix).any()):
        r = _first(bound > prefix)
        raise BatchRangeError(
            "replay_start",
            f"replay_start[{r}]={int(bound[r])} is past the prefix seq_lens[{r}] - query_len = "
            f"{int(prefix[r])}: it must lie in [0, {int(prefix[r])}] (a bound past a position would empty its window)",
            r,
        )
    return bound


def _validate_spans(spans, seq, query, device, config) -> None:
    """docs/semantics.md #vision-spans: a CSR over the requests; every span neither inverted nor starting
    at a negative position. A span may start before the request's new tokens (a prefix-cache hit inside
    an image), end after them (a chunk that ends inside an image) and hold more than max_image_tokens:
    the rows follow the rule for each (docs/semantics.md #vision-spans)."""
    if spans is None:
        return
    refuse_untyped_spans(spans)
    num_reqs = seq.shape[0]
    indptr = _tensor("image_spans.indptr", spans.indptr, torch.int32, 1)
    starts_t = _tensor("image_spans.starts", spans.starts, torch.int32, 1)
    ends_t = _tensor("image_spans.ends", spans.ends, torch.int32, 1)
    for name, t in (("image_spans.indptr", indptr), ("image_spans.starts", starts_t), ("image_spans.ends", ends_t)):
        if t.device != device:
            raise BatchDeviceError(name, f"{name} is on {t.device} but seq_lens is on {device}")
    if indptr.shape[0] < num_reqs + 1:
        raise BatchShapeError(
            "image_spans.indptr",
            f"image_spans.indptr has {indptr.shape[0]} entries; expected num_reqs + 1 = {num_reqs + 1}",
        )
    if starts_t.shape[0] != ends_t.shape[0]:
        raise BatchShapeError(
            "image_spans.ends", f"image_spans.ends has {ends_t.shape[0]} entries but starts has {starts_t.shape[0]}"
        )
    ptr = indptr[: num_reqs + 1].cpu().to(torch.int64)
    counts = _offset_counts("image_spans.indptr", ptr)
    n = int(ptr[-1])
    if n > starts_t.shape[0]:
        raise BatchShapeError(
            "image_spans.indptr", f"image_spans.indptr[{num_reqs}]={n} but there are {starts_t.shape[0]} spans"
        )
    if n == 0:
        return
    starts, ends = starts_t[:n].cpu().to(torch.int64), ends_t[:n].cpu().to(torch.int64)
    req = torch.repeat_interleave(torch.arange(num_reqs), counts)
    if bool((starts > ends).any()):
        i = _first(starts > ends)
        raise BatchRangeError(
            "image_spans",
            f"image_spans[{int(req[i])}]: span {i} is inverted: start {int(starts[i])} > end {int(ends[i])}",
            int(req[i]),
        )
    if bool((starts < 0).any()):
        i = _first(starts < 0)
        raise BatchRangeError(
            "image_spans",
            f"image_spans[{int(req[i])}]: span {i} [{int(starts[i])}, {int(ends[i])}] starts at a negative position",
            int(req[i]),
        )


def _image_reach(batch, config, split) -> torch.Tensor | None:
    """The lowest position each request's prefill rows read where an image span widens them
    (docs/semantics.md #vision-spans: a row reaches back max(W - 1, left) positions, so a span that starts
    before the new tokens reaches pages below the plain window's), int64 [R]; None without spans. Rows of
    tokens without a slot count too, as the plain windows' pages do below."""
    spans = batch.image_spans
    nd, npt = split.num_decode_tokens, split.num_prefill_tokens
    scheduled = int(batch.query_start_loc_cpu[-1])
    rows = min(npt, scheduled - nd)
    if spans is None or config.max_image_tokens <= 0 or rows <= 0 or spans.starts.shape[0] == 0:
        return None
    qsl, seq_lens = batch.query_start_loc.cpu(), batch.seq_lens.cpu()
    owners = token_to_req(qsl, nd + rows)
    cpu_spans = dataclasses.replace(spans, indptr=spans.indptr.cpu(), starts=spans.starts.cpu(), ends=spans.ends.cpu())
    left, _ = image_visibility(
        qsl, seq_lens, owners, cpu_spans, token_offset=nd, num_rows=rows, max_image_tokens=config.max_image_tokens
    )
    req = owners[nd:].long()
    pos = seq_lens.long()[req] - qsl.long()[1:][req] + torch.arange(nd, nd + rows)
    lowest = (pos - torch.clamp_min(left.long(), config.window_size - 1)).clamp_min_(0)
    reach = torch.full((seq_lens.shape[0],), INT32_LIMIT + 1, dtype=torch.int64)
    return reach.scatter_reduce_(0, req, lowest, reduce="amin")


def _validate_pages(table, seq, query, starts, config, causal, replay=None, images=None) -> None:
    """Every page a window reads must exist, be a real block, and give int32 slot ids. Pages below a
    request's replay bound are never read (an engine may have freed them); ``images`` (``_image_reach``):
    the lowest position image spans widen each request's rows to, which may lie below its plain window."""
    block = config.block_size
    num_reqs = seq.shape[0]
    rows = table[:num_reqs].cpu().to(torch.int64)
    needed = torch.where(seq > 0, (seq - 1) // block + 1, torch.zeros_like(seq))
    if bool((needed > rows.shape[1]).any()):
        r = _first(needed > rows.shape[1])
        raise BatchCapacityError(
            "block_table",
            f"block_table has {rows.shape[1]} pages per row but request {r} (seq_lens={int(seq[r])}, "
            f"block_size={block}) needs {int(needed[r])}",
            r,
        )
    prefix = seq - query
    reach = config.window_size if not causal else config.window_size - 1
    lowest = torch.clamp_min(prefix - reach, 0)
    if images is not None:
        lowest = torch.minimum(lowest, images)
    if causal and replay is not None:
        lowest = torch.maximum(lowest, replay)
    first = lowest // block
    cols = torch.arange(rows.shape[1])[None, :]
    read = (cols >= first[:, None]) & (cols < needed[:, None]) & (query[:, None] > 0)
    bad = read & (rows < 0)
    if bool(bad.any()):
        r, p = (int(x) for x in torch.nonzero(bad)[0])
        raise BatchRangeError(
            "block_table", f"block_table[{r}, {p}]={int(rows[r, p])} is negative but the window reads page {p}", r
        )
    if config.num_kv_blocks is not None:
        bad = read & (rows >= config.num_kv_blocks)
        if bool(bad.any()):
            r, p = (int(x) for x in torch.nonzero(bad)[0])
            raise BatchRangeError(
                "block_table",
                f"block_table[{r}, {p}]={int(rows[r, p])} is past the cache's {config.num_kv_blocks} pages",
                r,
            )
    bad = read & (rows * block + block - 1 > INT32_LIMIT)
    if bool(bad.any()):
        r, p = (int(x) for x in torch.nonzero(bad)[0])
        raise BatchRangeError(
            "block_table",
            f"block_table[{r}, {p}]={int(rows[r, p])} x block_size {block} overflows the int32 slot ids",
            r,
        )


def _validate_slots(slots, table, seq, starts, scheduled, config) -> None:
    """slot_mapping must be -1 or the token's own slot, and -1 on padding rows."""
    s = slots.cpu()
    if bool((s < -1).any()):
        t = _first(s < -1)
        raise BatchRangeError(
            "slot_mapping", f"slot_mapping[{t}]={int(s[t])}; a slot is >= 0, or -1 for a padding token", t
        )
    if bool((s[scheduled:] != -1).any()):
        t = scheduled + _first(s[scheduled:] != -1)
        raise BatchConsistencyError(
            "slot_mapping",
            f"slot_mapping[{t}]={int(s[t])} but row {t} is past the {scheduled} scheduled tokens; padding rows must be -1",
            t,
        )
    if scheduled == 0:
        return
    num_reqs = seq.shape[0]
    query = starts[1:] - starts[:-1]
    req = torch.repeat_interleave(torch.arange(num_reqs), query)
    pos = seq[req] - starts[1:][req] + torch.arange(scheduled)
    rows = table[:num_reqs].cpu().to(torch.int64)
    expected = rows[req, pos // config.block_size] * config.block_size + pos % config.block_size
    real = s[:scheduled]
    wrong = (real >= 0) & (real != expected)
    if bool(wrong.any()):
        t = _first(wrong)
        raise BatchConsistencyError(
            "slot_mapping",
            f"slot_mapping[{t}]={int(real[t])} but block_table puts request {int(req[t])} "
            f"position {int(pos[t])} in slot {int(expected[t])}",
            t,
        )
