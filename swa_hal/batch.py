"""AttentionBatch: a step's inputs for one KV-cache group (docs/semantics.md #inputs).

``ImageSpans`` and the image-range helpers live in ``spans.py`` and are importable from here too."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .errors import BatchCapacityError, BatchRangeError, BatchShapeError, BatchValidationError
from .spans import ImageSpans, _integral, check_image_ranges, ranges_in_step, spans_to_csr
from .step_inputs import FIELDS as INPUT_FIELDS
from .step_inputs import StepInputs


def _integral_list(field: str, values: Sequence[object]) -> list[int]:
    return [_integral(f"{field}[{i}]", v) for i, v in enumerate(values)]


__all__ = ["AttentionBatch", "ImageSpans", "check_image_ranges", "ranges_in_step", "spans_to_csr"]


@dataclasses.dataclass(eq=False, init=False)
class AttentionBatch:
    """One scheduler step, decodes first (docs/semantics.md #inputs): the step's per-request ``inputs``
    (``StepInputs``: seq_lens, query_start_loc and their host copies, max_query_len, num_tokens, causal,
    replay_start, image_spans) and one KV-cache group's ``block_table`` int32 [R', max_pages] (R' >= R)
    and ``slot_mapping`` int64 [T] (-1 marks a padding token).

    Made from the inputs (``AttentionBatch(inputs=..., block_table=..., slot_mapping=...)``) or from their
    fields by keyword (``AttentionBatch(seq_lens=..., query_start_loc=..., ..., block_table=...,
    slot_mapping=...)``); fields given beside ``inputs`` replace those of it, so ``dataclasses.replace(batch,
    seq_lens=...)`` gives a batch with new inputs. The inputs' fields read through the batch
    (``batch.seq_lens``); they are never set on it. Validation lives in ``swa_hal.validation.validate_batch``.
    """

    inputs: StepInputs
    block_table: torch.Tensor
    slot_mapping: torch.Tensor

    def __init__(
        self,
        *,
        block_table: torch.Tensor,
        slot_mapping: torch.Tensor,
        inputs: StepInputs | None = None,
        **fields: Any,
    ):
        if inputs is None:
            inputs = StepInputs(**fields)
        elif fields:
            inputs = inputs.replace(**fields)
        self.inputs = inputs
        self.block_table = block_table
        self.slot_mapping = slot_mapping

    if TYPE_CHECKING:  # the inputs' fields read through the batch (set below, one property each)

        def __getattr__(self, name: str) -> Any: ...

    @property
    def num_reqs(self) -> int:
        return self.inputs.seq_lens.shape[0]

    @property
    def device(self) -> torch.device:
        return self.inputs.seq_lens.device

    def replace(self, **changes: Any) -> AttentionBatch:
        """This batch with ``changes``: any of the inputs' fields, ``block_table``, ``slot_mapping``
        (``dataclasses.replace`` does the same)."""
        return dataclasses.replace(self, **changes)

    def with_group(self, block_table: torch.Tensor, slot_mapping: torch.Tensor) -> AttentionBatch:
        """This step with one KV-cache group's block table and slot mapping (docs/semantics.md
        #group-builds): the same ``inputs`` object (once per group build); this batch itself where they are
        its own (a single build, a group of one)."""
        if block_table is self.block_table and slot_mapping is self.slot_mapping:
            return self
        return AttentionBatch(inputs=self.inputs, block_table=block_table, slot_mapping=slot_mapping)

    def to(self, device: str | torch.device) -> AttentionBatch:
        """The same batch with its device tensors on ``device`` (host copies stay on the CPU)."""
        return AttentionBatch(
            inputs=self.inputs.to(device),
            block_table=self.block_table.to(device),
            slot_mapping=self.slot_mapping.to(device),
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
        block_size: int | None = None,
        replay_start: Sequence[int] | None = None,
        image_spans: Mapping[int, Sequence[tuple[int, int]]] | None = None,
    ) -> AttentionBatch:
        """Build a batch from plain lists (tests, the CLI, examples).

        Derives query_start_loc (device and host copies) and max_query_len; when no slot_mapping is
        given, derives it from the block table (each real token's own slot; padding rows past the
        real tokens get -1), which takes ``block_size``, the page size B of the builder's config: it has
        no default, since slots derived with another page size than the builder's are not the table's,
        and a guarded build empties every row that reads them. A ragged block table is
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
            if block_size is None:
                raise BatchValidationError(
                    "block_size",
                    "block_size is required to derive the slot mapping from the block table: pass the page size of "
                    "the builder's config (block_size=config.block_size), or give the slot_mapping",
                )
            block_size = _integral("block_size", block_size)
            if block_size < 1:
                raise BatchRangeError("block_size", f"block_size={block_size} must be at least 1 (tokens per page)")
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


# The step's inputs read through a batch (``batch.seq_lens`` is ``batch.inputs.seq_lens``); read-only: a
# batch with other inputs is a new batch (``dataclasses.replace``). Setting the same object back is
# allowed, so an in-place update reads as one (``batch.seq_lens += 1``).
def _input_field(name: str) -> property:
    def read(batch: AttentionBatch) -> Any:
        return getattr(batch.inputs, name)

    def write(batch: AttentionBatch, value: Any) -> None:
        if value is not getattr(batch.inputs, name):
            raise AttributeError(
                f"{name} is one of the step's inputs (batch.inputs, which never changes): make a batch with "
                f"another {name} with dataclasses.replace(batch, {name}=...)"
            )

    return property(read, write, doc=f"``inputs.{name}``")


for _name in INPUT_FIELDS:
    setattr(AttentionBatch, _name, _input_field(_name))
del _name
