"""AttentionBatch: the per-step inputs of docs/semantics.md #inputs."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .errors import BatchCapacityError, BatchDtypeError, BatchRangeError, BatchShapeError


@dataclasses.dataclass(eq=False)
class ImageSpans:
    """Per-request image spans of the vision variant, in CSR form (docs/semantics.md #vision-spans).

    ``indptr`` int32 [R+1]: request r's spans are ``starts[indptr[r]:indptr[r+1]]`` and the same
    slice of ``ends``; ``starts`` / ``ends`` int32 [n] are inclusive token positions. All on the
    batch's device, so they can live in fixed buffers (``SWAMetadataBuilder.image_spans_from_ranges``).
    """

    indptr: torch.Tensor
    starts: torch.Tensor
    ends: torch.Tensor

    @classmethod
    def from_ranges(
        cls,
        ranges: Mapping[int, Sequence[tuple[int, int]]],
        num_reqs: int,
        *,
        device: str | torch.device = "cpu",
    ) -> ImageSpans:
        """From ``{request: [(start, end), ...]}`` (the shape engines keep them in), in listed order."""
        indptr, starts, ends = spans_to_csr(ranges, num_reqs)
        as_tensor = lambda v: torch.tensor(v, dtype=torch.int32).to(device)  # noqa: E731
        return cls(as_tensor(indptr), as_tensor(starts), as_tensor(ends))

    def to(self, device: str | torch.device) -> ImageSpans:
        return ImageSpans(self.indptr.to(device), self.starts.to(device), self.ends.to(device))


def check_image_ranges(
    ranges: Mapping[int, Sequence[tuple[int, int]]], num_reqs: int, field: str = "image_spans"
) -> dict[int, list[tuple[int, int]]]:
    """``{request: [(start, end), ...]}`` checked, as ints: a mapping; each request an int in
    ``[0, num_reqs)``; each range a pair of integers with ``0 <= start <= end``. Each error names
    ``field``, the request and the range (``image_spans[1][0]=(7, 5) is inverted: start 7 > end 5``)."""
    if not isinstance(ranges, Mapping):
        raise BatchShapeError(
            field, f"{field} must be a mapping {{request: [(start, end), ...]}}, got {type(ranges).__name__}"
        )
    out: dict[int, list[tuple[int, int]]] = {}
    for req, spans in ranges.items():
        if isinstance(req, bool) or not isinstance(req, numbers.Integral) or not 0 <= req < num_reqs:
            raise BatchRangeError(field, f"{field} names request {req!r}; the batch has {num_reqs}")
        req = int(req)
        if not _listlike(spans):
            raise BatchShapeError(field, f"{field}[{req}]={spans!r} is not a list of (start, end) pairs", req)
        out[req] = [_image_range(field, req, k, span) for k, span in enumerate(spans)]
    return out


def _listlike(value: object) -> bool:
    """A list, a tuple or an array (NumPy's too): something with a length and items, but no text or mapping."""
    return not isinstance(value, (str, bytes, Mapping)) and hasattr(value, "__len__") and hasattr(value, "__getitem__")


def _image_range(field: str, req: int, k: int, span: Any) -> tuple[int, int]:
    name = f"{field}[{req}][{k}]"
    if not _listlike(span) or len(span) != 2:
        raise BatchShapeError(field, f"{name}={span!r} is not a (start, end) pair", req)
    start, end = _integral(name, span[0]), _integral(name, span[1])
    if start < 0:
        raise BatchRangeError(field, f"{name}=({start}, {end}) starts at a negative position", req)
    if start > end:
        raise BatchRangeError(field, f"{name}=({start}, {end}) is inverted: start {start} > end {end}", req)
    return start, end


def spans_to_csr(
    ranges: Mapping[int, Sequence[tuple[int, int]]], num_reqs: int
) -> tuple[list[int], list[int], list[int]]:
    """``{request: [(start, end), ...]}`` as CSR lists (indptr, starts, ends), checked by ``check_image_ranges``."""
    checked = check_image_ranges(ranges, num_reqs)
    indptr, starts, ends = [0], [], []
    for r in range(num_reqs):
        for start, end in checked.get(r, ()):
            starts.append(start)
            ends.append(end)
        indptr.append(len(starts))
    return indptr, starts, ends


def ranges_in_step(
    ranges: Mapping[int, Sequence[tuple[int, int]]],
    query_start_loc_cpu: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    num_reqs: int,
    field: str = "mm_req_doc_ranges",
) -> dict[int, list[tuple[int, int]]]:
    """The image ranges that overlap each request's new tokens this step, whole. Engines list every image
    of a request (prefilled by earlier chunks, or still to come); only those over this step's tokens can
    reach the rows (docs/semantics.md #vision-spans). An image that overlaps them is kept as the engine
    gave it, also where it began before the new tokens (a prefix-cache hit, or an earlier chunk, that ended
    inside it) or goes on past them (a chunk that ends inside it): its earlier positions widen the rows,
    and the rows stop at the request's last position. Host values only (a host seq_lens upper bound is
    exact for prefill rows; decode rows lie past every image). The ranges are checked first
    (``check_image_ranges``; errors name ``field``, the engine's attribute)."""
    checked = check_image_ranges(ranges, num_reqs, field)
    qsl = query_start_loc_cpu.tolist()
    seqs = seq_lens_cpu.tolist()
    out: dict[int, list[tuple[int, int]]] = {}
    for r, spans in checked.items():
        if not spans:
            continue
        first, last = seqs[r] - (qsl[r + 1] - qsl[r]), seqs[r] - 1
        kept = [(a, e) for a, e in spans if e >= first and a <= last]
        if kept:
            out[r] = kept
    return out


def _integral(field: str, value: object) -> int:
    """An integer given as an int or an integral number (3 or 3.0), never silently rounded (6.9)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise BatchDtypeError(field, f"{field}={value!r} is not an integer")
    as_int = int(value)  # type: ignore[call-overload]  # numbers.Real: int, float, numpy scalars
    if as_int != value:
        raise BatchDtypeError(field, f"{field}={value!r} is not an integer")
    return as_int


def _integral_list(field: str, values: Sequence[object]) -> list[int]:
    return [_integral(f"{field}[{i}]", v) for i, v in enumerate(values)]


@dataclasses.dataclass(eq=False)
class AttentionBatch:
    """One scheduler step, decodes first (docs/semantics.md #inputs).

    Device tensors: ``seq_lens`` int32 [R], ``query_start_loc`` int32 [R+1], ``block_table`` int32
    [R', max_pages] (R' >= R), ``slot_mapping`` int64 [T] (-1 marks a padding token).
    Host copies: ``query_start_loc_cpu`` int32 [R+1], ``seq_lens_cpu`` int32 [R] (exact for prefill
    rows, an upper bound for decode rows).
    ``num_tokens`` is T, which may exceed ``query_start_loc[R]`` by padding rows (CUDA graphs).
    Optional: ``replay_start`` int32 [R] (device), each request's lower bound on the window
    (docs/semantics.md #bounded-replay; None: no bound), and ``image_spans`` (vision variant).
    Validation lives in ``swa_hal.validation.validate_batch``.
    """

    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor | None
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    max_query_len: int
    num_tokens: int
    causal: bool = True
    replay_start: torch.Tensor | None = None
    image_spans: ImageSpans | None = None

    @property
    def num_reqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def device(self) -> torch.device:
        return self.seq_lens.device

    def with_group(self, block_table: torch.Tensor, slot_mapping: torch.Tensor) -> AttentionBatch:
        """This step with one KV-cache group's block table and slot mapping (docs/semantics.md
        #group-builds): a shallow copy, without re-running the constructor (once per group build)."""
        new = object.__new__(AttentionBatch)
        new.__dict__.update(self.__dict__)
        new.block_table = block_table
        new.slot_mapping = slot_mapping
        return new

    def to(self, device: str | torch.device) -> AttentionBatch:
        """The same batch with its device tensors on ``device`` (host copies stay on the CPU)."""
        return dataclasses.replace(
            self,
            seq_lens=self.seq_lens.to(device),
            query_start_loc=self.query_start_loc.to(device),
            block_table=self.block_table.to(device),
            slot_mapping=self.slot_mapping.to(device),
            replay_start=None if self.replay_start is None else self.replay_start.to(device),
            image_spans=None if self.image_spans is None else self.image_spans.to(device),
        )

    @classmethod
    def from_lists(
        cls,
        seq_lens: Sequence[int],
        query_lens: Sequence[int],
        block_table: Sequence[Sequence[int]] | torch.Tensor,
        *,
        slot_mapping: Sequence[int] | torch.Tensor | None = None,
        num_tokens: int | None = None,
        causal: bool = True,
        device: str | torch.device = "cpu",
        block_size: int = 64,
        replay_start: Sequence[int] | None = None,
        image_spans: Mapping[int, Sequence[tuple[int, int]]] | None = None,
    ) -> AttentionBatch:
        """Build a batch from plain lists (tests, the CLI, examples).

        Derives query_start_loc (device and host copies) and max_query_len; when no slot_mapping is
        given, derives it from the block table (each real token's own slot; padding rows past the
        real tokens get -1; ``block_size`` is B, needed only for that). A ragged block table is
        padded with -1. ``replay_start`` is one lower bound per request; ``image_spans`` maps a
        request to its inclusive (start, end) image spans.
        """
        seq_lens = _integral_list("seq_lens", seq_lens)
        query_lens = _integral_list("query_lens", query_lens)
        if len(seq_lens) != len(query_lens):
            raise BatchShapeError(
                "query_lens", f"query_lens has {len(query_lens)} entries but seq_lens has {len(seq_lens)}"
            )
        if not seq_lens:
            raise BatchShapeError("seq_lens", "seq_lens is empty: a batch needs at least one request")
        for r, (s, q) in enumerate(zip(seq_lens, query_lens)):
            if q < 0:
                raise BatchRangeError("query_lens", f"query_lens[{r}]={q} is negative", r)
            if s < q:
                raise BatchRangeError("seq_lens", f"seq_lens[{r}]={s} is shorter than its query length {q}", r)
        qsl = [0]
        for q in query_lens:
            qsl.append(qsl[-1] + q)
        real = qsl[-1]
        total = real if num_tokens is None else _integral("num_tokens", num_tokens)
        if total < real:
            raise BatchRangeError("num_tokens", f"num_tokens={total} is smaller than the {real} scheduled tokens")

        if isinstance(block_table, torch.Tensor):
            bt = block_table.to(dtype=torch.int32, device="cpu")
        else:
            rows = [_integral_list(f"block_table[{r}]", row) for r, row in enumerate(block_table)]
            width = max(1, max((len(row) for row in rows), default=1))
            bt = torch.full((len(rows), width), -1, dtype=torch.int32)
            for r, row in enumerate(rows):
                if row:
                    bt[r, : len(row)] = torch.tensor(row, dtype=torch.int32)

        if slot_mapping is None:
            slots = torch.full((total,), -1, dtype=torch.int64)
            if real:
                req = torch.repeat_interleave(torch.arange(len(seq_lens)), torch.tensor(query_lens))
                ends = torch.tensor(qsl[1:], dtype=torch.int64)
                pos = torch.tensor(seq_lens, dtype=torch.int64)[req] - ends[req] + torch.arange(real)
                page = pos // block_size
                if bt.shape[0] < len(seq_lens) or int(page.max()) >= bt.shape[1]:
                    raise BatchCapacityError(
                        "block_table",
                        f"block_table {tuple(bt.shape)} is too narrow to hold the pages of every token "
                        f"(needs {int(page.max()) + 1} pages with block_size {block_size})",
                    )
                blocks = bt.to(torch.int64)[req, page]
                if bool((blocks < 0).any()):
                    # A row shorter than its request's pages (padded with -1) or a negative block id: the
                    # slot it would give is not a slot of the cache.
                    t = int(torch.nonzero(blocks < 0)[0])
                    r, p = int(req[t]), int(page[t])
                    raise BatchCapacityError(
                        "block_table",
                        f"block_table[{r}, {p}]={int(blocks[t])}: request {r}'s token {t} (position {int(pos[t])}) "
                        f"needs page {p}, which the row does not hold; give the slot_mapping or every page",
                        r,
                    )
                slots[:real] = blocks * block_size + pos % block_size
        elif isinstance(slot_mapping, torch.Tensor):
            slots = slot_mapping.to(dtype=torch.int64, device="cpu")
        else:
            slots = torch.tensor(_integral_list("slot_mapping", slot_mapping), dtype=torch.int64)
        replay = None
        if replay_start is not None:
            values = _integral_list("replay_start", replay_start)
            if len(values) != len(seq_lens):
                raise BatchShapeError(
                    "replay_start", f"replay_start has {len(values)} entries but the batch has {len(seq_lens)} requests"
                )
            replay = torch.tensor(values, dtype=torch.int32).to(device)
        spans = None if image_spans is None else ImageSpans.from_ranges(image_spans, len(seq_lens), device=device)

        qsl_cpu = torch.tensor(qsl, dtype=torch.int32)
        seq_cpu = torch.tensor(seq_lens, dtype=torch.int32)
        return cls(
            seq_lens=seq_cpu.to(device),
            query_start_loc=qsl_cpu.to(device),
            query_start_loc_cpu=qsl_cpu,
            seq_lens_cpu=seq_cpu.clone(),
            block_table=bt.to(device),
            slot_mapping=slots.to(device),
            max_query_len=max(query_lens),
            num_tokens=total,
            causal=bool(causal),
            replay_start=replay,
            image_spans=spans,
        )
