"""ROCm: the shared kernels, then the ragged (CSR) form of the decode rows as a typed extra."""

from __future__ import annotations

from swa_hal.ragged import RaggedRows
from swa_hal.triton_backend import TritonBackend


class RocmBackend(TritonBackend):
    name = "rocm"

    def allocate(self, buffers) -> None:
        super().allocate(buffers)
        # One ragged form per KV-cache group (docs/semantics.md #group-builds).
        self._ragged = [
            RaggedRows(self.config, self.device, clamp=self.CLAMP_ADDRESSES) for _ in range(buffers.num_groups)
        ]

    def extras(self, metadata, buffers) -> tuple:
        # Derived from the rows just written, after every build and every draft-step update.
        return (self._ragged[buffers.group_index].fill(metadata),)

    def warmup(self, buffers, progress=None) -> int:
        count = super().warmup(buffers, progress)
        if progress is not None:
            progress("rocm: ragged_indptr_kernel, ragged_rows_kernel")
        return count + self._ragged[0].warmup()
