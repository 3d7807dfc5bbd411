"""The ragged (CSR) form of decode rows, in fixed-address buffers: a format, not a vendor. A backend
that wants it owns a ``RaggedRows`` and hands its buffers out as the typed extra ``RaggedDecodeRows``
(``metadata.extra(RaggedDecodeRows)``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from . import jit

if TYPE_CHECKING:
    from .config import SWAConfig
    from .metadata import SWAMetadata


@dataclasses.dataclass(frozen=True)
class RaggedDecodeRows:
    """The decode rows in CSR form.

    ``indices`` is the whole fixed buffer: its first ``indptr[num_decode_tokens]`` entries are the
    valid entries of every decode row, concatenated; the rest is stale (reading that length would
    need a host sync, and graph-captured consumers read it on the device anyway).
    ``indptr`` int32 [num_decode_tokens + 1] is the exclusive prefix sum of the decode lens.
    """

    indices: torch.Tensor
    indptr: torch.Tensor


class RaggedRows:
    def __init__(self, config: SWAConfig, device: torch.device, *, clamp: bool):
        from .kernels.launcher import KernelLauncher
        from .kernels.ragged import ragged_indptr_kernel, ragged_rows_kernel

        cap = config.max_num_batched_tokens
        width = max(config.window_size, config.noncausal_index_width)
        self.flat = torch.full((cap * width,), -1, dtype=torch.int32, device=device)
        self.indptr = torch.zeros(cap + 1, dtype=torch.int32, device=device)
        kind = device.type
        self._scan = KernelLauncher(ragged_indptr_kernel, device)
        self._scatter = KernelLauncher(ragged_rows_kernel, device)
        self.key_indptr = jit.IndptrKey(BLOCK=jit.INDPTR_BLOCK, CLAMP=clamp)
        self.key_causal = jit.ragged_key(config, causal=True, clamp=clamp, device_type=kind)
        self.key_dspark = (
            jit.ragged_key(config, causal=False, clamp=clamp, device_type=kind) if config.is_dspark else None
        )

    def fill(self, metadata: SWAMetadata) -> RaggedDecodeRows:
        """Refresh indptr and the flat entries from the metadata's decode rows (two launches,
        no allocation, no sync)."""
        ndt = metadata.num_decode_tokens
        out = RaggedDecodeRows(self.flat, self.indptr[: ndt + 1])
        if ndt == 0:
            return out
        lens = metadata.decode_swa_lens
        self._scan(self.key_indptr, 1, (self.indptr, lens, ndt))
        key = self.key_causal if metadata.causal or self.key_dspark is None else self.key_dspark
        self._scatter(
            key,
            -(-ndt // key.BLOCK_T),
            (self.flat, self.indptr, metadata.decode_swa_indices, lens, ndt, self.flat.shape[0]),
        )
        return out

    def warmup(self) -> int:
        keys = [k for k in (self.key_causal, self.key_dspark) if k is not None]
        dev = self.flat.device
        lens = torch.zeros(1, dtype=torch.int32, device=dev)
        indptr = torch.zeros(2, dtype=torch.int32, device=dev)
        self._scan(self.key_indptr, 1, (indptr, lens, 1))
        for key in keys:
            rows = torch.full((1, 1, key.WIDTH), -1, dtype=torch.int32, device=dev)
            out = torch.empty(key.WIDTH, dtype=torch.int32, device=dev)
            self._scatter(key, 1, (out, indptr, rows, lens, 1, out.shape[0]))
        return 1 + len(keys)
