"""Image spans of the vision variant (docs/semantics.md #vision-spans): the per-request input
``StepInputs.image_spans``, in CSR form, and the checks and conversions of the ranges engines keep."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .errors import BatchDtypeError, BatchRangeError, BatchShapeError


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
