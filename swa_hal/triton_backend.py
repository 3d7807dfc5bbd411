"""The shared execution of every Triton backend: one launch per build (docs/semantics.md #per-token-helpers, #causal-rows, #dspark-rows, #prefill-metadata, #fixed-buffers).

Hardware backends subclass ``TritonBackend`` and change only flags (``CLAMP_ADDRESSES``), the
scheduler hook, and post-passes; the kernel source is shared (``kernels/swa_metadata.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from . import jit
from .backend import Backend, BuildPlan
from .envs import env_flag
from .errors import BackendUnavailableError
from .groups import group_rows

if TYPE_CHECKING:
    from .batch import AttentionBatch
    from .buffers import MetadataBuffers
    from .config import SWAConfig
    from .metadata import SWAMetadata
    from .platform import PlatformInfo
    from .slot_rows import SlotRows


def interpreter_on() -> bool:
    return env_flag("TRITON_INTERPRET")


class TritonBackend(Backend):
    name: ClassVar[str] = "triton"
    # SM12x: every lane's address in bounds, masked or not.
    CLAMP_ADDRESSES: ClassVar[bool] = False

    def __init__(self, config: SWAConfig, device: torch.device, platform: PlatformInfo):
        super().__init__(config, device, platform)
        if device.type == "cpu" and not interpreter_on():
            raise BackendUnavailableError(
                f"backend {self.name!r} runs Triton kernels; on a CPU device they need the interpreter: "
                f"set TRITON_INTERPRET=1 before triton is imported"
            )
        try:
            from .kernels.launcher import KernelLauncher
            from .kernels.slot_rows import slot_rows_kernel
            from .kernels.swa_metadata import swa_metadata_kernel
        except ImportError as exc:
            raise BackendUnavailableError(f"backend {self.name!r} needs triton: {exc}") from exc
        self._launch_rows = KernelLauncher(swa_metadata_kernel, device)
        self._launch_slot_rows = KernelLauncher(slot_rows_kernel, device)
        self._slot_keys: dict[tuple[Any, ...], Any] = {}
        self.guard = False
        self._output_addresses: dict[Any, tuple[int, ...]] = {}
        self._fixed_inputs: dict[Any, tuple[int, ...]] = {}
        self._keys: dict[tuple[bool, bool, bool], Any] = {}
        # The group table last written to the device (docs/semantics.md #group-builds): engines keep
        # their per-group block tables and slot mappings in persistent buffers, so it rarely changes.
        self._group_table: tuple[tuple[int, ...], ...] = ()

    supports_group_launch: ClassVar[bool] = True

    def kernel_key(self, causal: bool = True, grouped: bool = False) -> Any:
        """The compile key of a build: causal or DSpark rows, guarded or not (``self.guard``), one
        group or several."""
        key = self._keys.get((causal, self.guard, grouped))
        if key is None:
            key = self._keys[(causal, self.guard, grouped)] = jit.rows_key(
                self.config,
                causal=causal,
                clamp=self.CLAMP_ADDRESSES,
                device_type=self.device.type,
                guard=self.guard,
                grouped=grouped,
            )
        return key

    # -- builds ----------------------------------------------------------------------------------

    def _outputs(self, key: Any, buffers: MetadataBuffers, causal: bool) -> tuple[Any, ...]:
        """The ten output buffers: as tensors until the key has compiled, then as cached addresses
        (the buffers never move, so their addresses are read once)."""
        cache = self._output_addresses
        if key in cache:
            return cache[key]
        outs = (
            buffers.decode_indices if causal else buffers.noncausal_indices,
            buffers.decode_lens,
            buffers.prefill_indices,
            buffers.prefill_lens,
            buffers.token_to_req,
            buffers.is_valid,
            buffers.gather_lens,
            buffers.left_visible,
            buffers.right_visible,
            buffers.violation,
        )
        if self._launch_rows.ready(key):
            cache[key] = tuple(t.data_ptr() for t in outs)
        return outs

    def _launch(
        self,
        causal: bool,
        buffers: MetadataBuffers,
        inputs: tuple[Any, ...],
        num_reqs: int,
        num_tokens: int,
        nd: int,
        npf: int,
        ndt: int,
        npt: int,
        clear_end: int,
        spans: Any,
        groups: int = 1,
        guess: tuple[int, int] = (1, 1),
    ) -> None:
        key = self.kernel_key(causal, groups > 1)
        dec = -(-ndt // key.BLOCK_T)
        pre = -(-npt // key.BLOCK_TP)
        clear = -(-(clear_end - ndt) // jit.CLEAR_BLOCK) if clear_end > ndt else 0
        gather = -(-npf // jit.GATHER_BLOCK)
        qsl, seq_lens, table, slots, replay = inputs
        stride, pages = table.stride(0), table.shape[1]
        outputs = self._output_addresses.get(key)
        if outputs is None:  # not compiled yet: tensors through Triton's JIT
            outputs = self._outputs(key, buffers, causal)
            fixed: tuple[Any, ...] = (
                buffers.no_span_indptr,
                buffers.span_starts,
                buffers.span_ends,
                buffers.group_inputs,
            )
            if spans is not None:
                fixed = (spans.indptr, spans.starts, spans.ends, buffers.group_inputs)
        else:
            # Compiled: every pointer as an address. The builder's own inputs (no spans, the group
            # table) never move, so their addresses are read once.
            inputs = (qsl.data_ptr(), seq_lens.data_ptr(), table.data_ptr(), slots.data_ptr(), replay.data_ptr())
            if spans is None:
                fixed = self._fixed_inputs.get(key)  # type: ignore[assignment]
                if fixed is None:
                    fixed = self._fixed_inputs[key] = (
                        buffers.no_span_indptr.data_ptr(),
                        buffers.span_starts.data_ptr(),
                        buffers.span_ends.data_ptr(),
                        buffers.group_inputs.data_ptr(),
                    )
            else:
                fixed = (
                    spans.indptr.data_ptr(),
                    spans.starts.data_ptr(),
                    spans.ends.data_ptr(),
                    buffers.group_inputs.data_ptr(),
                )
        self._launch_rows(
            key,
            groups * (dec + pre + clear) + gather,
            (
                *outputs,
                *inputs,
                *fixed,
                stride,
                pages,
                num_reqs,
                num_tokens,
                nd,
                npf,
                ndt,
                npt,
                clear_end,
                dec,
                pre,
                clear,
                -(-num_reqs // key.SEARCH_BLOCK),
                groups,
                buffers.capacity,
                *guess,
                0 if spans is None else spans.starts.shape[0],
            ),
            addresses=True,
        )

    def _write_group_table(self, rows: tuple[tuple[int, int, int, int], ...], buffers: MetadataBuffers) -> None:
        """The kernel reads group g's inputs through row g of ``buffers.group_inputs`` (address of the
        block table and of the slot mapping, the table's row stride and width); rewrite it only when
        the engine hands in other tensors (a copy to the device, never inside a steady state)."""
        if rows != self._group_table:
            buffers.group_inputs[: len(rows)].copy_(torch.tensor(rows, dtype=torch.int64))
            self._group_table = rows

    def compute(self, plan: BuildPlan, batch: AttentionBatch, buffers: MetadataBuffers) -> None:
        self._launch_plan(plan, batch, batch.block_table, batch.slot_mapping, buffers, 1)

    def compute_groups(
        self,
        plan: BuildPlan,
        batch: AttentionBatch,
        tables: Sequence[torch.Tensor],
        slots: Sequence[torch.Tensor],
        buffers: MetadataBuffers,
    ) -> None:
        """Every group in one launch (docs/semantics.md #group-builds)."""
        self._write_group_table(plan.group_rows or group_rows(tables, slots), buffers)
        self._launch_plan(plan, batch, tables[0], slots[0], buffers, len(tables))

    def _launch_plan(
        self,
        plan: BuildPlan,
        batch: AttentionBatch,
        table: torch.Tensor,
        slots: torch.Tensor,
        buffers: MetadataBuffers,
        groups: int,
    ) -> None:
        self._launch(
            plan.causal,
            buffers,
            (batch.query_start_loc, batch.seq_lens, table, slots, plan.replay_start),
            plan.num_reqs,
            plan.num_tokens,
            plan.num_decodes,
            plan.num_prefills,
            plan.num_decode_tokens,
            plan.num_prefill_tokens,
            plan.decode_lens_clear_end,
            plan.spans if plan.images else None,
            groups,
            (plan.decode_guess_len, plan.prefill_guess_len),
        )

    def recompute_decode_rows(self, metadata: SWAMetadata, buffers: MetadataBuffers) -> None:
        # The build kernel with its decode programs only: token_to_req, is_valid and the rows.
        ndt = metadata.num_decode_tokens
        self._launch(
            metadata.causal,
            buffers,
            (
                metadata.query_start_loc,
                metadata.seq_lens,
                metadata.block_table,
                metadata.slot_mapping,
                metadata.replay_start,
            ),
            metadata.query_start_loc.shape[0] - 1,
            ndt,
            metadata.num_decodes,
            0,
            ndt,
            0,
            ndt,
            None,
            guess=(metadata.max_decode_query_len, 1),
        )

    def recompute_groups(self, metadatas: Sequence[SWAMetadata], buffers: MetadataBuffers) -> None:
        first = metadatas[0]
        ndt = first.num_decode_tokens
        self._write_group_table(
            group_rows([m.block_table for m in metadatas], [m.slot_mapping for m in metadatas]), buffers
        )
        self._launch(
            first.causal,
            buffers,
            (first.query_start_loc, first.seq_lens, first.block_table, first.slot_mapping, first.replay_start),
            first.query_start_loc.shape[0] - 1,
            ndt,
            first.num_decodes,
            0,
            ndt,
            0,
            ndt,
            None,
            groups=len(metadatas),
            guess=(first.max_decode_query_len, 1),
        )

    # -- token-slot rows ---------------------------------------------------------------------------

    def compute_slot_rows(
        self, rows: SlotRows, out: torch.Tensor, lens: torch.Tensor, record: torch.Tensor, limit: int
    ) -> None:
        """One launch (docs/semantics.md #token-slot-rows, ``kernels/slot_rows.py``)."""
        n = rows.num_rows
        if n == 0:
            return
        floors = record if rows.floors is None else rows.floors
        block_slots = record if rows.block_slots is None else rows.block_slots
        rt, slot_map = rows.req_to_token, rows.slot_map
        inputs = (rows.row_ends, rows.pools, floors, rt, slot_map, block_slots)
        width = out.shape[1]
        spec = (width, rows.block, rows.floors is not None, self.guard, limit, *(t.dtype for t in inputs))
        key = self._slot_keys.get(spec)
        if key is None:
            key = self._slot_keys[spec] = jit.slot_rows_key(
                self.config.window_size,
                width,
                rows.block,
                has_floors=rows.floors is not None,
                guard=self.guard,
                slot_limit=limit,
                clamp=self.CLAMP_ADDRESSES,
                device_type=self.device.type,
                dtypes=tuple(str(t.dtype) for t in inputs),
            )
        self._launch_slot_rows(
            key,
            -(-n // key.BLOCK_T),
            (out, lens, record, *inputs, n, rt.stride(0), rt.shape[1], rt.shape[0], slot_map.shape[0]),
        )

    # -- warmup ----------------------------------------------------------------------------------

    def kernel_keys(self) -> list[Any]:
        causal = (True, False) if self.config.is_dspark else (True,)
        grouped = (False, True) if self.config.num_kv_groups > 1 else (False,)
        return [self.kernel_key(c, g) for g in grouped for c in causal]

    def warmup(self, buffers: MetadataBuffers, progress: Callable[[str], None] | None = None) -> int:
        """Launch every variant once on a one-token batch, into scratch outputs of the same dtypes
        (so live metadata views are never touched). Returns the number of variants."""
        dev = self.device
        i32: dict[str, Any] = dict(dtype=torch.int32, device=dev)
        cfg = self.config
        width = max(cfg.window_size, cfg.noncausal_index_width)
        # One decode request and one prefill request of one token each, every segment non-empty.
        dec_idx = torch.empty((1, 1, width), **i32)
        pre_idx = torch.empty((1, 1, cfg.prefill_index_width), **i32)
        dec_lens, pre_lens, gather = torch.zeros(2, **i32), torch.zeros(1, **i32), torch.zeros(1, **i32)
        t2r, valid = torch.zeros(2, **i32), torch.zeros(2, dtype=torch.bool, device=dev)
        left, right, record = torch.zeros(2, **i32), torch.zeros(2, **i32), torch.zeros(4, **i32)
        qsl, seq, replay = torch.tensor([0, 1, 2], **i32), torch.tensor([1, 1], **i32), torch.zeros(2, **i32)
        indptr, span = torch.tensor([0, 0, 1], **i32), torch.zeros(1, **i32)
        # A group table whose one row is this scratch batch's (grouped variants launch one group).
        table, slots = torch.zeros((2, 1), **i32), torch.tensor([0, 1], dtype=torch.int64, device=dev)
        groups = torch.tensor([[table.data_ptr(), slots.data_ptr(), table.stride(0), 1]], dtype=torch.int64, device=dev)
        count = 0
        for key in self.kernel_keys():
            if progress is not None:
                progress(f"{self.name}: swa_metadata_kernel {key}")
            self._launch_rows(
                key,
                4,
                (
                    dec_idx,
                    dec_lens,
                    pre_idx,
                    pre_lens,
                    t2r,
                    valid,
                    gather,
                    left,
                    right,
                    record,
                    qsl,
                    seq,
                    table,
                    slots,
                    replay,
                    indptr,
                    span,
                    span,
                    groups,
                    table.stride(0),
                    1,
                    2,
                    2,
                    1,
                    1,
                    1,
                    1,
                    2,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                ),
            )
            count += 1
        return count

    def status(self) -> dict[str, str]:
        return {
            "kernel": "swa_metadata_kernel (one launch per build)",
            "clamped addresses": "yes" if self.CLAMP_ADDRESSES else "no",
            "mode": "Triton interpreter (CPU)" if self._launch_rows.interpreted else "compiled",
        }
