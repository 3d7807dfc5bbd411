"""The example backend: swa_hal's torch backend plus one typed extra, the typical vendor shape.

It keeps the rules every backend keeps: its buffers are allocated once, in ``allocate``, one set of what it
hands out per KV-cache group; each build and each draft-step update writes into them in place (``out=`` and
in-place ops, no new tensors); and no device value is ever read on the host, so a decode build can be captured
in a CUDA graph.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from swa_hal.torch_backend import TorchBackend

if TYPE_CHECKING:
    from swa_hal.buffers import MetadataBuffers
    from swa_hal.metadata import SWAMetadata


@dataclasses.dataclass(frozen=True)
class ExampleRaggedRows:
    """The decode rows in CSR form, as the Example accelerator's attention kernel reads them
    (``metadata.extra(ExampleRaggedRows)``).

    indptr: int32 [num_decode_tokens + 1], the exclusive prefix sum of the decode lens.
    indices: int32, a whole fixed buffer: its first ``indptr[-1]`` entries are the valid entries of every
        decode row, concatenated; the rest is stale (its length is data: reading it would need a sync).
    """

    indptr: torch.Tensor
    indices: torch.Tensor


class _RaggedBuffers:
    """One group's CSR form, allocated once: ``indptr`` and the entries (``flat``, of which ``indices`` is
    handed out), whose one slot past the rows' entries (``trash``) takes the writes of the columns past each
    row's length."""

    def __init__(self, cap: int, width: int, device: torch.device):
        self.indptr = torch.zeros(cap + 1, dtype=torch.int32, device=device)
        self.trash = cap * width
        self.flat = torch.full((cap * width + 1,), -1, dtype=torch.int32, device=device)
        self.indices = self.flat[: self.trash]


class ExampleBackend(TorchBackend):
    # No ``name`` here: a backend runs under its spec's name ("example"), whatever it inherits.

    def allocate(self, buffers: MetadataBuffers) -> None:
        super().allocate(buffers)
        cap = buffers.capacity
        width = max(self.config.window_size, self.config.noncausal_index_width)
        # One CSR form per KV-cache group: a group build hands every group its own extra, which the engine
        # reads after the build, so the groups cannot share what they hand out. The scratch they can share.
        self._groups = [_RaggedBuffers(cap, width, self.device) for _ in range(buffers.num_groups)]
        self._cols = torch.arange(width, dtype=torch.int64, device=self.device)
        self._dest = torch.empty(cap * width, dtype=torch.int64, device=self.device)
        self._past = torch.empty(cap * width, dtype=torch.bool, device=self.device)

    def extras(self, metadata: SWAMetadata, buffers: MetadataBuffers) -> tuple[ExampleRaggedRows]:
        # Called after every build and every draft-step update, once per group of a group build, with that
        # group's buffers (``buffers.group_index``), so the CSR form follows the rows.
        out = self._groups[buffers.group_index]
        rows = metadata.num_decode_tokens
        indptr = out.indptr[: rows + 1]
        if rows:
            lens = metadata.decode_swa_lens
            idx = metadata.decode_swa_indices.reshape(rows, -1)
            width = idx.shape[1]
            cols = self._cols[:width]
            dest = self._dest[: rows * width].view(rows, width)
            past = self._past[: rows * width].view(rows, width)
            torch.cumsum(lens, 0, dtype=torch.int32, out=indptr[1:])
            torch.add(indptr[:-1, None], cols, out=dest)  # where each entry of each row goes
            torch.ge(cols, lens[:, None], out=past)
            dest.masked_fill_(past, out.trash)
            out.flat.scatter_(0, dest.view(-1), idx.reshape(-1))
        return (ExampleRaggedRows(indptr, out.indices),)

    def status(self) -> dict[str, str]:
        return {"kernel": "swa_hal torch backend + ragged (CSR) rows (example plugin)"}
