"""The shared execution of every Triton backend: one launch per build (docs/semantics.md #per-token-helpers, #causal-rows, #dspark-rows, #prefill-metadata, #fixed-buffers).

Hardware backends subclass ``TritonBackend`` and change only flags (``CLAMP_ADDRESSES``), the
scheduler hook, and post-passes; the kernel source is shared (``kernels/swa_metadata.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from .backend import Backend
from .config import INT32_LIMIT
from .envs import env_flag
from .errors import BackendUnavailableError
from .kernels.launch import CompileKey, KeyedLaunch, record_fields
from .kernels.request_window_launch import RequestWindowArgs
from .kernels.rows_launch import CLEAR_BLOCK, RowsArgs, RowsFacts, RowsKey
from .kernels.slot_rows_launch import SlotRowsArgs
from .plan import BuildPlan, update_plan
from .preflight import GroupInputs, group_rows
from .request_window import RequestWindowLayout

if TYPE_CHECKING:
    from .batch import AttentionBatch, ImageSpans
    from .buffers import MetadataBuffers
    from .config import SWAConfig
    from .metadata import SWAMetadata
    from .platform import PlatformInfo
    from .request_window import RequestWindowRows
    from .slot_rows import SlotRows


def interpreter_on() -> bool:
    return env_flag("TRITON_INTERPRET")


# The rows kernel's pointer arguments that are the builder's own buffers, and for batches without
# image spans its zero span buffers: set once per record (``rows_record``).
OWNED_ROWS_FIELDS = (
    "decode_idx_ptr",
    "decode_lens_ptr",
    "prefill_idx_ptr",
    "prefill_lens_ptr",
    "token_to_req_ptr",
    "is_valid_ptr",
    "gather_lens_ptr",
    "left_ptr",
    "right_ptr",
    "violation_ptr",
    "group_inputs_ptr",
)


def rows_record(buffers: MetadataBuffers, causal: bool, own: Callable[[torch.Tensor], Any]) -> RowsArgs:
    """A rows record whose builder-owned pointer fields hold ``own`` (the launch's ``pointer``) of
    ``buffers`` (they never move, so this is done once) and whose other fields are placeholders until
    ``TritonBackend.rows_args`` fills them."""
    return RowsArgs(
        decode_idx_ptr=own(buffers.decode_indices if causal else buffers.noncausal_indices),
        decode_lens_ptr=own(buffers.decode_lens),
        prefill_idx_ptr=own(buffers.prefill_indices),
        prefill_lens_ptr=own(buffers.prefill_lens),
        token_to_req_ptr=own(buffers.token_to_req),
        is_valid_ptr=own(buffers.is_valid),
        gather_lens_ptr=own(buffers.gather_lens),
        left_ptr=own(buffers.left_visible),
        right_ptr=own(buffers.right_visible),
        violation_ptr=own(buffers.violation),
        qsl_ptr=None,
        seq_lens_ptr=None,
        host_seq_ptr=None,
        block_table_ptr=None,
        slot_mapping_ptr=None,
        replay_ptr=None,
        span_indptr_ptr=None,
        span_starts_ptr=None,
        span_ends_ptr=None,
        group_inputs_ptr=own(buffers.group_inputs),
        bt_stride=0,
        max_pages=0,
        num_reqs=0,
        num_tokens=0,
        num_decodes=0,
        num_prefills=0,
        num_decode_tokens=0,
        num_prefill_tokens=0,
        decode_clear_end=0,
        dec_progs=0,
        pre_progs=0,
        clear_progs=0,
        search_chunks=0,
        num_groups=0,
        group_rows=buffers.capacity,
        decode_guess_len=0,
        prefill_guess_len=0,
        max_query_len=0,
        decode_query_max=0,
        num_spans=0,
        max_model_len=0,
        build_checks=0,
        num_bounds=0,
        prefill_follows=0,
    )


class TritonBackend(Backend):
    """The build every Triton backend shares: one launch of the shared kernels per build, group build or
    draft update, into the builder's buffers, with no host sync. A hardware backend subclasses it and sets
    flags (``CLAMP_ADDRESSES``), its tile schedulers and post-passes; on a CPU it needs the interpreter."""

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
            from .kernels.request_window_launch import RequestWindowLaunch
            from .kernels.rows_launch import RowsLaunch
            from .kernels.slot_rows_launch import SlotRowsLaunch

            # Each launch owns its dispatch (which key a call needs) and its warmup keys.
            self._rows = RowsLaunch(device, config, clamp=self.CLAMP_ADDRESSES)
            self._slot_rows = SlotRowsLaunch(device, config, clamp=self.CLAMP_ADDRESSES)
            self._request_window = RequestWindowLaunch(device, config, clamp=self.CLAMP_ADDRESSES)
        except ImportError as exc:
            raise BackendUnavailableError(f"backend {self.name!r} needs triton: {exc}") from exc
        if self._rows.interpreted:
            from .kernels.interpreter_probe import interpreter_problem

            problem = interpreter_problem()
            if problem is not None:
                raise BackendUnavailableError(f"backend {self.name!r}: {problem}")
        self.guard = False
        self._slot_record = SlotRowsArgs(**dict.fromkeys(record_fields(SlotRowsArgs), 0))
        self._window_record = RequestWindowArgs(**dict.fromkeys(record_fields(RequestWindowArgs), 0))
        self._buffers: MetadataBuffers | None = None
        self._records: dict[bool, RowsArgs] = {}
        self._no_spans: tuple[Any, Any, Any] = (None, None, None)
        # The group table last written to the device (docs/semantics.md #group-builds): engines keep
        # their per-group block tables and slot mappings in persistent buffers, so it rarely changes.
        self._group_table: tuple[tuple[int, ...], ...] = ()

    def allocate(self, buffers: MetadataBuffers) -> None:
        """Read the builder's buffers once: the rows kernel's own pointer arguments, per row kind.
        (Subclasses that allocate more call this first.)"""
        self._buffers = buffers
        own = self._rows.pointer
        kinds = (True, False) if self.config.is_dspark else (True,)
        self._records = {causal: rows_record(buffers, causal, own) for causal in kinds}
        # A batch without image spans reads the builder's zero span buffers.
        self._no_spans = (own(buffers.no_span_indptr), own(buffers.span_starts), own(buffers.span_ends))

    def kernel_key(self, causal: bool = True, grouped: bool = False) -> RowsKey:
        """The compile key of a build: causal or DSpark rows, guarded or not (``self.guard``), one
        group or several (the rows launch's dispatch)."""
        return self._rows.key_for(RowsFacts(causal=causal, guard=self.guard, grouped=grouped))

    # -- builds ----------------------------------------------------------------------------------

    def rows_args(
        self,
        key: RowsKey,
        plan: BuildPlan,
        table: torch.Tensor,
        slots: torch.Tensor,
        buffers: MetadataBuffers,
        groups: int,
    ) -> RowsArgs:
        """The one mapping of a build onto the rows kernel's arguments: the plan's sizes and step inputs
        (``plan.inputs``: the step's, or for a draft-step update its decode requests'), group 0's block
        table and slot mapping (a group build reads the others through the group table) into the record of
        this row kind, whose builder-owned fields were set once. Every other field is set here."""
        inputs = plan.inputs
        ptr = self._rows.pointer
        args = self._records.get(inputs.causal) if buffers is self._buffers else None
        no_spans = self._no_spans
        if args is None:  # buffers this backend was not given (a caller's own): a record of their own
            args = rows_record(buffers, inputs.causal, ptr)
            no_spans = (ptr(buffers.no_span_indptr), ptr(buffers.span_starts), ptr(buffers.span_ends))
        spans: ImageSpans | None = inputs.image_spans if plan.images else None
        if spans is None:
            args.span_indptr_ptr, args.span_starts_ptr, args.span_ends_ptr = no_spans
            args.num_spans = 0
        else:
            args.span_indptr_ptr, args.span_starts_ptr = ptr(spans.indptr), ptr(spans.starts)
            args.span_ends_ptr = ptr(spans.ends)
            args.num_spans = spans.starts.shape[0]
        ndt, npt, clear_end = plan.num_decode_tokens, plan.num_prefill_tokens, plan.decode_lens_clear_end
        args.qsl_ptr = ptr(inputs.query_start_loc)
        args.seq_lens_ptr = ptr(inputs.seq_lens)
        host_seq = plan.host_seq_lens
        args.host_seq_ptr = args.seq_lens_ptr if host_seq is None else ptr(host_seq)
        args.block_table_ptr = ptr(table)
        args.slot_mapping_ptr = ptr(slots)
        args.replay_ptr = ptr(plan.replay_start)
        args.bt_stride = table.stride()[0]
        args.max_pages = table.shape[1]
        args.num_reqs = plan.num_reqs
        args.num_tokens = inputs.num_tokens
        args.num_decodes = plan.num_decodes
        args.num_prefills = plan.num_prefills
        args.num_decode_tokens = ndt
        args.num_prefill_tokens = npt
        args.decode_clear_end = clear_end
        # Program counts (ceiling divisions), written out: this runs on every build.
        args.dec_progs = -(-ndt // key.BLOCK_T)
        args.pre_progs = -(-npt // key.BLOCK_TP)
        args.clear_progs = -(-(clear_end - ndt) // CLEAR_BLOCK) if clear_end > ndt else 0
        args.search_chunks = -(-plan.num_reqs // key.SEARCH_BLOCK)
        args.num_groups = groups
        args.decode_guess_len = plan.decode_guess_len
        args.prefill_guess_len = plan.prefill_guess_len
        # Into int32: a validated build admits an overstated max_query_len of any size (the default path's
        # preflight bounds it by the capacity); INT32_LIMIT still admits every query length.
        args.max_query_len = min(inputs.max_query_len, INT32_LIMIT)
        args.decode_query_max = min(plan.decode_query_max, INT32_LIMIT)
        args.max_model_len = self.config.max_model_len if plan.build_checks else INT32_LIMIT
        args.build_checks = int(plan.build_checks)
        args.num_bounds = min(plan.num_bounds, INT32_LIMIT)
        args.prefill_follows = int(plan.prefill_follows)
        return args

    def _launch(
        self,
        plan: BuildPlan,
        table: torch.Tensor,
        slots: torch.Tensor,
        buffers: MetadataBuffers,
        groups: int = 1,
    ) -> None:
        key = self._rows.key_for((plan.inputs.causal, self.guard, groups > 1))  # RowsFacts' values (KeyedLaunch)
        args = self.rows_args(key, plan, table, slots, buffers, groups)
        self._rows(key, args.programs(), args)

    def _write_group_table(self, rows: tuple[tuple[int, int, int, int], ...], buffers: MetadataBuffers) -> None:
        """The kernel reads group g's inputs through row g of ``buffers.group_inputs`` (address of the
        block table and of the slot mapping, the table's row stride and width); rewrite it only when
        the engine hands in other tensors (a copy to the device, never inside a steady state)."""
        if rows != self._group_table:
            buffers.group_inputs[: len(rows)].copy_(torch.tensor(rows, dtype=torch.int64))
            self._group_table = rows

    def compute(self, plan: BuildPlan, batch: AttentionBatch, buffers: MetadataBuffers) -> None:
        self._launch(plan, batch.block_table, batch.slot_mapping, buffers)

    def compute_several(
        self, plan: BuildPlan, batch: AttentionBatch, groups: GroupInputs, buffers: MetadataBuffers
    ) -> None:
        """Every group in one launch (docs/semantics.md #group-builds), from the group table rows the
        build's preflight made (``groups.rows``)."""
        self._write_group_table(groups.rows, buffers)
        self._launch(plan, groups.tables[0], groups.slots[0], buffers, len(groups.tables))

    def recompute_decode_rows(self, metadata: SWAMetadata, buffers: MetadataBuffers) -> None:
        # The build kernel with its decode programs only: token_to_req, is_valid and the rows.
        self._launch(update_plan(metadata), metadata.block_table, metadata.slot_mapping, buffers)

    def recompute_several(self, metadatas: Sequence[SWAMetadata], buffers: MetadataBuffers) -> None:
        first = metadatas[0]
        self._write_group_table(
            group_rows([m.block_table for m in metadatas], [m.slot_mapping for m in metadatas]), buffers
        )
        self._launch(update_plan(first), first.block_table, first.slot_mapping, buffers, len(metadatas))

    # -- token-slot rows ---------------------------------------------------------------------------

    def compute_slot_rows(
        self, rows: SlotRows, out: torch.Tensor, lens: torch.Tensor, record: torch.Tensor, limit: int
    ) -> None:
        """One launch (docs/semantics.md #token-slot-rows, ``kernels/slot_rows.py``)."""
        n = rows.num_rows
        if n == 0:
            return
        # Absent optional inputs read the record buffer instead (never, with their flag off; ring rows
        # read no table: docs/semantics.md #ring-rows).
        floors = record if rows.floors is None else rows.floors
        block_slots = record if rows.block_slots is None else rows.block_slots
        rt = record[None, :] if rows.req_to_token is None else rows.req_to_token
        slot_map = record if rows.slot_map is None else rows.slot_map
        ring, num_pools = (0, rt.shape[0]) if rows.ring is None else (rows.ring.size, rows.ring.slots)
        dtypes = (rows.row_ends.dtype, rows.pools.dtype, floors.dtype, rt.dtype, slot_map.dtype, block_slots.dtype)
        launch = self._slot_rows
        # SlotRowsFacts' values, in order (KeyedLaunch): width, block, has_floors, ring, guard, slot_limit, dtypes.
        key = launch.key_for((out.shape[1], rows.block, rows.floors is not None, ring, self.guard, limit, dtypes))
        ptr = launch.pointer
        # One record, every field set here by name (a 14-keyword construction per call costs more).
        args = self._slot_record
        args.out_ptr = ptr(out)
        args.lens_ptr = ptr(lens)
        args.violation_ptr = ptr(record)
        args.ends_ptr = ptr(rows.row_ends)
        args.pools_ptr = ptr(rows.pools)
        args.floors_ptr = ptr(floors)
        args.rt_ptr = ptr(rt)
        args.map_ptr = ptr(slot_map)
        args.block_slots_ptr = ptr(block_slots)
        args.n_rows = n
        args.rt_stride = rt.stride()[0]
        args.rt_width = rt.shape[1]
        args.num_pools = num_pools
        args.map_len = slot_map.shape[0]
        launch(key, launch.programs(key, args), args)

    # -- request-window layouts -------------------------------------------------------------------

    def compute_request_window(self, rows: RequestWindowRows) -> RequestWindowLayout:
        """One launch (docs/semantics.md #request-window-layouts, ``kernels/request_window.py``) into
        new tensors."""
        window = self.config.window_size
        n, groups, padded = rows.num_rows, rows.groups(), rows.padded()
        # Absent floors read pos instead (never, with the flag off).
        floors = rows.pos if rows.floors is None else rows.floors
        launch = self._request_window
        # RequestWindowFacts' values, in order (KeyedLaunch): has_floors, dtypes.
        key = launch.key_for((rows.floors is not None, (rows.req.dtype, rows.pos.dtype, floors.dtype)))
        out, block = _new_layout(padded, groups * window, window, self.device)
        # One record, every field set here by name (as the token-slot rows' record); the outputs are one
        # block, whose fields the kernel finds at their places in it.
        args = self._window_record
        ptr = launch.pointer
        args.req_ptr = ptr(rows.req)
        args.pos_ptr = ptr(rows.pos)
        args.floors_ptr = ptr(floors)
        args.out_ptr = ptr(block)
        args.n_rows = n
        args.padded = padded
        args.groups = groups
        args.capacity = rows.capacity
        args.zero_row = rows.zero_row
        args.query_programs = launch.query_programs(key, padded)
        launch(key, launch.programs(key, args), args)
        return out

    # -- warmup ----------------------------------------------------------------------------------

    def launches(self) -> tuple[KeyedLaunch[Any], ...]:
        """Every kernel the engines call through this backend, each with its own dispatch and warmup
        keys: builds (and group builds, draft-step updates), token-slot rows, request-window layouts."""
        return (self._rows, self._slot_rows, self._request_window)

    def warmup_plan(self) -> list[tuple[KeyedLaunch[Any], CompileKey]]:
        """What ``warmup`` compiles, in order: each launch's variants for this config, guarded or not
        as the builder is."""
        return [(launch, key) for launch in self.launches() for key in launch.warmup_keys(self.guard)]

    def kernel_keys(self) -> list[CompileKey]:
        """Every variant this builder can launch (``warmup_plan``'s keys), guarded or not as the builder is."""
        return [key for _, key in self.warmup_plan()]

    def warmup(self, buffers: MetadataBuffers, progress: Callable[[str], None] | None = None) -> int:
        """Compile every variant of ``warmup_plan`` through Triton's warmup API (nothing is launched, no
        buffer is touched). Returns the number of variants."""
        plan = self.warmup_plan()
        for launch, key in plan:
            if progress is not None:
                progress(f"{self.name}: {launch.kernel_name} {key}")
            launch.compile(key)
        return len(plan)

    def status(self) -> dict[str, str]:
        return {
            "kernel": "swa_metadata_kernel (one launch per build)",
            "clamped addresses": "yes" if self.CLAMP_ADDRESSES else "no",
            "mode": "Triton interpreter (CPU)" if self._rows.interpreted else "compiled",
        }


def _new_layout(
    padded: int, history: int, window: int, device: torch.device
) -> tuple[RequestWindowLayout, torch.Tensor]:
    """A request-window layout's output fields, new per call, as views of one new int64 block (returned
    too: the kernel takes its address alone and finds each field at its place, ``_fields`` in
    ``kernels/request_window.py``, which follows this split). An allocation costs about 5 us of host time
    on an H200, a view about 1 (benchmarks/results/h200/host_profile.txt). The int64 fields come first,
    then the int32 and the bool ones, each part starting on an 8-byte boundary."""
    n32, n8 = padded * (window + 2), history + padded
    words32, words8 = -(-n32 // 2), -(-n8 // 8)
    # The int64 fields and the two tails, in one split; a view per field and no more (about 1 us each).
    sizes = [padded, padded, history, history, history, history, 1, words32, words8]
    block = torch.empty(sum(sizes), dtype=torch.int64, device=device)
    req, pos, h_req, h_pos, h_loc, h_src, runs, tail32, tail8 = block.split_with_sizes(sizes)
    write_loc, lengths, indices, *_ = tail32.view(torch.int32).split_with_sizes(
        [padded, padded, padded * window] + [1] * (2 * words32 - n32)
    )
    # One split rather than two slices (a slice costs more than a view of a split there).
    h_valid, commit, _ = tail8.view(torch.bool).split_with_sizes([history, padded, words8 * 8 - n8])
    layout = RequestWindowLayout(
        req=req,
        pos=pos,
        write_loc=write_loc,
        indices=indices.view(padded, window),
        lengths=lengths,
        history_req=h_req,
        history_pos=h_pos,
        history_loc=h_loc,
        history_valid=h_valid,
        history_src=h_src,
        commit_mask=commit,
        size=history + padded,
        runs=runs,
    )
    return layout, block
