"""The ragged (CSR) form of decode rows, in fixed-address buffers: a format, not a vendor. A backend
that wants it owns a ``RaggedRows`` and hands its buffers out as the typed extra ``RaggedDecodeRows``
(``metadata.extra(RaggedDecodeRows)``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from .kernels.launch import cdiv
from .kernels.ragged_launch import IndptrArgs, RaggedArgs, indptr_key, ragged_keys

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
    """A backend's ragged (CSR) decode rows: ``flat`` (every decode row's valid entries, concatenated) and
    ``indptr`` (the exclusive prefix sum of the decode lens), allocated once for the config's capacity and
    refilled in place from the dense rows after every build and draft update, without a host sync; handed
    out as ``RaggedDecodeRows``. ``clamp``: every lane's address kept in bounds (SM12x)."""

    def __init__(self, config: SWAConfig, device: torch.device, *, clamp: bool):
        from .kernels.ragged_launch import IndptrLaunch, RaggedLaunch

        cap = config.max_num_batched_tokens
        width = max(config.window_size, config.noncausal_index_width)
        self.flat = torch.full((cap * width,), -1, dtype=torch.int32, device=device)
        self.indptr = torch.zeros(cap + 1, dtype=torch.int32, device=device)
        self._scan = IndptrLaunch(device)
        self._scatter = RaggedLaunch(device)
        # The buffers' own pointer arguments, read once (they never move).
        self._flat_arg: Any = self._scan.pointer(self.flat)
        self._indptr_arg: Any = self._scan.pointer(self.indptr)
        self.key_indptr = indptr_key(clamp=clamp)
        keys = ragged_keys(config, clamp=clamp, device_type=device.type)
        self.key_causal = keys[0]
        self.key_dspark = keys[1] if len(keys) > 1 else None

    def fill(self, metadata: SWAMetadata) -> RaggedDecodeRows:
        """Refresh indptr and the flat entries from the metadata's decode rows (two launches,
        no allocation, no sync)."""
        ndt = metadata.num_decode_tokens
        out = RaggedDecodeRows(self.flat, self.indptr[: ndt + 1])
        if ndt == 0:
            return out
        lens = metadata.decode_swa_lens
        ptr = self._scan.pointer
        self._scan(self.key_indptr, 1, IndptrArgs(indptr_ptr=self._indptr_arg, lens_ptr=ptr(lens), n_rows=ndt))
        key = self.key_causal if metadata.causal or self.key_dspark is None else self.key_dspark
        args = RaggedArgs(
            ragged_ptr=self._flat_arg,
            indptr_ptr=self._indptr_arg,
            idx_ptr=ptr(metadata.decode_swa_indices),
            lens_ptr=ptr(lens),
            n_rows=ndt,
            capacity=self.flat.shape[0],
        )
        self._scatter(key, cdiv(ndt, key.BLOCK_T), args)
        return out

    def warmup(self) -> int:
        """Compile both kernels' variants (Triton's warmup API; nothing is launched)."""
        keys = [k for k in (self.key_causal, self.key_dspark) if k is not None]
        self._scan.compile(self.key_indptr)
        for key in keys:
            self._scatter.compile(key)
        return 1 + len(keys)
