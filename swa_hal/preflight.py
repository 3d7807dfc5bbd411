"""Preflight: the O(1) host checks every build, update and token-slot build runs before its launch.

They read host facts only (dtypes, devices, dimensions, strides, sizes, capacity), never a device
value, so they cost a few attribute reads and never synchronise. They keep every kernel launch inside
its inputs and outputs; the rules that need the data are checked by full validation
(``validation.py``, on request) or by the build itself when it is guarded (``guard.py``,
docs/semantics.md #guarded-builds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .config import INT32_LIMIT
from .errors import BatchCapacityError, BatchDeviceError, BatchDtypeError, BatchShapeError

if TYPE_CHECKING:
    from .batch import AttentionBatch
    from .config import SWAConfig
    from .metadata import SWAMetadata


def _refuse(name: str, t: object, want: torch.dtype, device_index: int, ndim: int) -> None:
    """Name the first broken rule of a preflight-checked input (the slow path of ``preflight_batch``)."""
    if not isinstance(t, torch.Tensor):
        raise BatchDtypeError(name, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != want:
        raise BatchDtypeError(name, f"{name} has dtype {t.dtype}; expected {want}")
    if t.get_device() != device_index or (device_index < 0 and t.is_meta):
        raise BatchDeviceError(name, f"{name} is on {t.device}; the builder's device index is {device_index}")
    if t.dim() != ndim:
        raise BatchShapeError(name, f"{name} has {t.dim()} dimensions {tuple(t.shape)}; expected {ndim}")
    raise BatchShapeError(name, f"{name} must be contiguous (stride {tuple(t.stride())})")


# ``get_device()`` is -1 for the CPU and for meta tensors alike, and a meta tensor has no data (a kernel
# would read address 0, torch raises an untyped error): a CPU builder also refuses meta tensors. A GPU
# builder's index already refuses them, so the check costs it one comparison.
META = "a CPU builder refuses meta tensors"


def preflight_tensor(name: str, t: object, want: torch.dtype, device_index: int, ndim: int = 1) -> None:
    # Kernels read these with unit strides from raw addresses: a view with another stride, another
    # dtype or another device would be read as garbage, so it is refused before any launch.
    # (Runs on every build: the common case is one comparison of a few cheap attributes.)
    try:
        ok = (
            t.dtype is want  # type: ignore[attr-defined]
            and t.get_device() == device_index  # type: ignore[attr-defined]
            and (device_index >= 0 or not t.is_meta)  # type: ignore[attr-defined]  # see META
            and t.dim() == ndim  # type: ignore[attr-defined]
        )
    except AttributeError:
        ok = False
    if not ok or (t.stride()[-1] != 1 and t.shape[-1] > 1):  # type: ignore[attr-defined]
        _refuse(name, t, want, device_index, ndim)


def refuse_host_copy(name: str, t: object) -> None:
    """A host copy of the batch (``query_start_loc_cpu``, ``seq_lens_cpu``) must be a tensor in host memory."""
    if not isinstance(t, torch.Tensor):
        raise BatchDtypeError(name, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_cpu:
        raise BatchDeviceError(name, f"{name} is on {t.device}; a host copy must be a CPU tensor")


def refuse_table_reach(field: str, num_reqs: int, row_stride: int, width: int) -> None:
    """The kernels address a block table's entries with int32 offsets (``req * row_stride + page``), so
    the last request's row must end below 2^31 entries from the table's start (docs/semantics.md
    #guarded-builds, int32 edges); a table that reaches further is refused. O(1), shapes only."""
    if (num_reqs - 1) * row_stride + width > INT32_LIMIT:
        raise BatchCapacityError(
            field,
            f"{field}: {num_reqs} rows {row_stride} entries apart reach past 2^31 - 1 entries, beyond the "
            "kernels' int32 offsets",
        )


def preflight_batch(batch: AttentionBatch, config: SWAConfig, capacity: int, device_index: int) -> None:
    """Host-only, O(1) checks that keep every kernel launch inside its inputs and outputs; cheap
    enough for every build (docs/semantics.md #guarded-builds). Reads no device value.

    ``device_index`` is the builder's ``tensor.get_device()`` value (-1 for the CPU): kernels are
    launched with raw addresses, so a tensor on another device must be refused here.
    """
    seq_lens, qsl, table, slots = batch.seq_lens, batch.query_start_loc, batch.block_table, batch.slot_mapping
    # The common case in one expression over attributes read once (this runs on every build);
    # on any failure the per-tensor checks below name the broken rule.
    i32 = torch.int32
    try:
        qs, ss, ts, ls = qsl.shape, seq_lens.shape, table.shape, slots.shape
        ok = (
            seq_lens.dtype is i32
            and qsl.dtype is i32
            and table.dtype is i32
            and slots.dtype is torch.int64
            and seq_lens.get_device() == device_index
            and qsl.get_device() == device_index
            and table.get_device() == device_index
            and slots.get_device() == device_index
            and (device_index >= 0 or not (seq_lens.is_meta or qsl.is_meta or table.is_meta or slots.is_meta))  # META
            and len(qs) == 1
            and len(ss) == 1
            and len(ts) == 2
            and len(ls) == 1
            and qsl.is_contiguous()  # 1-D: unit stride, or at most one element
            and seq_lens.is_contiguous()
            and slots.is_contiguous()
            # stride()[1], not stride(1): torch parses an argument at a cost of two attribute reads
            and ((tst := table.stride())[1] == 1 or ts[1] <= 1)
            and (qs[0] - 2) * tst[0] + ts[1] <= INT32_LIMIT  # the table's reach (refuse_table_reach)
        )
    except AttributeError:
        ok = False
    if not ok:
        preflight_tensor("seq_lens", seq_lens, i32, device_index)
        preflight_tensor("query_start_loc", qsl, i32, device_index)
        preflight_tensor("block_table", table, i32, device_index, 2)
        preflight_tensor("slot_mapping", slots, torch.int64, device_index)
        qs, ss, ts, ls, tst = qsl.shape, seq_lens.shape, table.shape, slots.shape, table.stride()
    num_tokens = batch.num_tokens
    if num_tokens.__class__ is not int:
        raise BatchDtypeError("num_tokens", f"num_tokens must be an int, got {num_tokens!r}")
    if num_tokens > capacity:
        raise BatchCapacityError(
            "num_tokens", f"num_tokens={num_tokens} exceeds the builder's capacity (max_num_batched_tokens={capacity})"
        )
    if num_tokens < 1:
        raise BatchShapeError("num_tokens", f"num_tokens={num_tokens}: the batch is empty")
    mql = batch.max_query_len
    if mql.__class__ is not int or mql < 0 or mql > capacity:
        raise BatchDtypeError("max_query_len", f"max_query_len must be an int in [0, {capacity}], got {mql!r}")
    if batch.causal.__class__ is not bool:
        raise BatchDtypeError("causal", f"causal must be a bool, got {batch.causal!r}")
    qsl_cpu = batch.query_start_loc_cpu
    seq_cpu = batch.seq_lens_cpu
    # The plan reads the host copies as numpy arrays: one on another device (a meta tensor, a GPU copy)
    # would fail there with an untyped error, so it is refused by name first.
    try:
        host_ok = qsl_cpu.is_cpu and (seq_cpu is None or seq_cpu.is_cpu)
    except AttributeError:
        host_ok = False
    if not host_ok:
        refuse_host_copy("query_start_loc_cpu", qsl_cpu)
        if seq_cpu is not None:
            refuse_host_copy("seq_lens_cpu", seq_cpu)
    num_reqs = qsl_cpu.shape[0] - 1
    if num_reqs < 1:
        raise BatchShapeError("query_start_loc_cpu", "query_start_loc_cpu has no request: the batch is empty")
    if num_reqs > config.max_num_seqs:
        raise BatchCapacityError("seq_lens", f"seq_lens has {num_reqs} requests; max_num_seqs is {config.max_num_seqs}")
    if qs[0] != num_reqs + 1:
        raise BatchShapeError(
            "query_start_loc", f"query_start_loc has {qs[0]} entries; query_start_loc_cpu has {num_reqs + 1}"
        )
    if ss[0] < num_reqs:
        raise BatchShapeError("seq_lens", f"seq_lens has {ss[0]} entries for {num_reqs} requests")
    if ts[0] < num_reqs or ts[1] < 1:
        raise BatchShapeError(
            "block_table",
            f"block_table {tuple(ts)} has too few rows or no page column for {num_reqs} requests",
        )
    if not ok:  # the fast check covered the table's reach
        refuse_table_reach("block_table", num_reqs, tst[0], ts[1])
    if ls[0] != num_tokens:
        raise BatchShapeError("slot_mapping", f"slot_mapping has {ls[0]} entries; num_tokens is {num_tokens}")
    replay = batch.replay_start
    if replay is not None:
        preflight_tensor("replay_start", replay, torch.int32, device_index)
        if replay.shape[0] < num_reqs:
            raise BatchShapeError("replay_start", f"replay_start has {replay.shape[0]} entries for {num_reqs} requests")
    spans = batch.image_spans
    if spans is not None:
        preflight_tensor("image_spans.indptr", spans.indptr, torch.int32, device_index)
        preflight_tensor("image_spans.starts", spans.starts, torch.int32, device_index)
        preflight_tensor("image_spans.ends", spans.ends, torch.int32, device_index)
        if spans.indptr.shape[0] < num_reqs + 1:
            raise BatchShapeError(
                "image_spans.indptr",
                f"image_spans.indptr has {spans.indptr.shape[0]} entries; expected num_reqs + 1 = {num_reqs + 1}",
            )
        if spans.ends.shape[0] != spans.starts.shape[0]:
            raise BatchShapeError(
                "image_spans.ends",
                f"image_spans.ends has {spans.ends.shape[0]} entries but starts has {spans.starts.shape[0]}",
            )


def preflight_update(metadata: SWAMetadata, device_index: int, capacity: int) -> None:
    """The preflight of a draft-step update: the tensors it reads in place are still what the build
    checked (an engine may have swapped one for another view), and the sizes it launches with are the
    build's (an engine that rebuilt the metadata may claim more decode tokens than its rows hold)."""
    ndt, nd = metadata.num_decode_tokens, metadata.num_decodes
    for name, value in (("num_decode_tokens", ndt), ("num_decodes", nd)):
        if value.__class__ is not int:
            raise BatchDtypeError(name, f"{name} must be an int, got {value!r}")
    if metadata.causal.__class__ is not bool:
        raise BatchDtypeError("causal", f"causal must be a bool, got {metadata.causal!r}")
    if not 0 <= ndt <= capacity:
        raise BatchCapacityError(
            "num_decode_tokens", f"num_decode_tokens={ndt} is outside [0, {capacity}] (the builder's capacity)"
        )
    rows, lens = metadata.decode_swa_indices, metadata.decode_swa_lens
    if rows.shape[0] != ndt or lens.shape[0] != ndt:
        raise BatchShapeError(
            "num_decode_tokens",
            f"num_decode_tokens={ndt}, but the metadata's decode rows hold {rows.shape[0]} rows and lens "
            f"{lens.shape[0]}: an update rewrites the rows its build made",
        )
    num_reqs = metadata.query_start_loc.shape[0] - 1
    if not 0 <= nd <= num_reqs:
        raise BatchShapeError("num_decodes", f"num_decodes={nd} is outside [0, {num_reqs}] (the requests)")
    preflight_tensor("seq_lens", metadata.seq_lens, torch.int32, device_index)
    preflight_tensor("query_start_loc", metadata.query_start_loc, torch.int32, device_index)
    preflight_tensor("block_table", metadata.block_table, torch.int32, device_index, 2)
    preflight_tensor("slot_mapping", metadata.slot_mapping, torch.int64, device_index)
    preflight_tensor("replay_start", metadata.replay_start, torch.int32, device_index)
    if metadata.seq_lens.shape[0] < num_reqs or metadata.block_table.shape[0] < num_reqs:
        raise BatchShapeError("seq_lens", f"seq_lens / block_table have fewer rows than the {num_reqs} requests")
    if metadata.slot_mapping.shape[0] < metadata.num_decode_tokens:
        raise BatchShapeError(
            "slot_mapping",
            f"slot_mapping has {metadata.slot_mapping.shape[0]} entries for {metadata.num_decode_tokens} decode tokens",
        )
    if metadata.replay_start.shape[0] < num_reqs:
        raise BatchShapeError(
            "replay_start", f"replay_start has {metadata.replay_start.shape[0]} entries for {num_reqs} requests"
        )
