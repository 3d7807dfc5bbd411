"""ROCm: the shared kernels, then the ragged form of the decode rows as a post-pass."""

from swa_hal.ragged import RaggedRows
from swa_hal.triton_backend import TritonBackend


class RocmBackend(TritonBackend):
    name = "rocm"

    def allocate(self, buffers) -> None:
        self._ragged = RaggedRows(self.config, self.device, clamp=self.CLAMP_ADDRESSES)
        buffers.extra["ragged"] = self._ragged

    def post_process(self, metadata, buffers):
        self._ragged.fill(metadata)
        return metadata

    def recompute_decode_rows(self, metadata, buffers) -> None:
        super().recompute_decode_rows(metadata, buffers)
        # The ragged form is derived from the rows just rewritten, so refresh it in place too.
        self._ragged.fill(metadata)

    def warmup(self, buffers, progress=None) -> int:
        count = super().warmup(buffers, progress)
        if progress is not None:
            progress("rocm: ragged_indptr_kernel, ragged_rows_kernel")
        return count + self._ragged.warmup()
