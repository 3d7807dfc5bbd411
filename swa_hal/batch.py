"""AttentionBatch: the per-step inputs of docs/semantics.md #inputs."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

import torch

from .errors import BatchCapacityError, BatchRangeError, BatchShapeError

if TYPE_CHECKING:
    from .config import SWAConfig


@dataclasses.dataclass(eq=False)
class AttentionBatch:
    """One scheduler step, decodes first (docs/semantics.md #inputs).

    Device tensors: ``seq_lens`` int32 [R], ``query_start_loc`` int32 [R+1], ``block_table`` int32
    [R', max_pages] (R' >= R), ``slot_mapping`` int64 [T] (-1 marks a padding token).
    Host copies: ``query_start_loc_cpu`` int32 [R+1], ``seq_lens_cpu`` int32 [R] (exact for prefill
    rows, an upper bound for decode rows).
    ``num_tokens`` is T, which may exceed ``query_start_loc[R]`` by padding rows (CUDA graphs).
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

    @property
    def num_reqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def device(self) -> torch.device:
        return self.seq_lens.device

    def validate(self, config: "SWAConfig", capacity: int | None = None) -> None:
        """Check every constraint of docs/semantics.md #inputs against ``config``; raise a BatchValidationError naming
        the field, index and constraint. Reads device values, so it synchronises: debug and CLI use."""
        from .validation import validate_batch

        validate_batch(self, config, capacity)

    def to(self, device: str | torch.device) -> "AttentionBatch":
        """The same batch with its device tensors on ``device`` (host copies stay on the CPU)."""
        return dataclasses.replace(
            self,
            seq_lens=self.seq_lens.to(device),
            query_start_loc=self.query_start_loc.to(device),
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
        block_size: int = 64,
    ) -> "AttentionBatch":
        """Build a batch from plain lists (tests, the CLI, examples).

        Derives query_start_loc (device and host copies) and max_query_len; when no slot_mapping is
        given, derives it from the block table (each real token's own slot; padding rows past the
        real tokens get -1; ``block_size`` is B, needed only for that). A ragged block table is
        padded with -1.
        """
        seq_lens = [int(s) for s in seq_lens]
        query_lens = [int(q) for q in query_lens]
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
        total = real if num_tokens is None else int(num_tokens)
        if total < real:
            raise BatchRangeError("num_tokens", f"num_tokens={total} is smaller than the {real} scheduled tokens")

        if isinstance(block_table, torch.Tensor):
            bt = block_table.to(dtype=torch.int32, device="cpu")
        else:
            rows = [list(map(int, row)) for row in block_table]
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
                slots[:real] = bt.to(torch.int64)[req, page] * block_size + pos % block_size
        elif isinstance(slot_mapping, torch.Tensor):
            slots = slot_mapping.to(dtype=torch.int64, device="cpu")
        else:
            slots = torch.tensor(list(slot_mapping), dtype=torch.int64)

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
        )
