"""The example backend: swa_hal's reference backend plus a post-pass, the typical vendor shape."""

from __future__ import annotations

import torch

from swa_hal.reference_backend import TorchBackend


class ExampleBackend(TorchBackend):
    name = "example"

    def allocate(self, buffers) -> None:
        super().allocate(buffers)
        cap, width = buffers.capacity, max(self.config.window_size, self.config.noncausal_index_width)
        # Fixed buffers, like every swa_hal output: consumers may capture their addresses.
        self._indptr = torch.zeros(cap + 1, dtype=torch.int32, device=self.device)
        self._flat = torch.full((cap * width,), -1, dtype=torch.int32, device=self.device)
        self._cols = torch.arange(width, dtype=torch.int32, device=self.device)

    def post_process(self, metadata, buffers):
        self._ragged(metadata)
        return metadata

    def recompute_decode_rows(self, metadata, buffers) -> None:
        super().recompute_decode_rows(metadata, buffers)
        self._ragged(metadata)

    def _ragged(self, metadata) -> None:
        rows = metadata.num_decode_tokens
        lens = metadata.decode_swa_lens
        indptr = self._indptr[: rows + 1]
        torch.cumsum(lens, 0, dtype=torch.int32, out=indptr[1:])
        if rows:
            idx = metadata.decode_swa_indices.reshape(rows, -1)
            keep = self._cols[: idx.shape[1]][None, :] < lens[:, None]
            dest = (indptr[:-1, None] + self._cols[: idx.shape[1]][None, :])[keep]
            self._flat[dest.long()] = idx[keep]
        metadata.decode_swa_indptr = indptr
        metadata.decode_swa_ragged_indices = self._flat

    def status(self) -> dict[str, str]:
        return {"kernel": "swa_hal reference + ragged post-pass (example plugin)"}
