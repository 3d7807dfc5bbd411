"""Preflight: the O(1) host checks a build and a draft-step update run before their launch, and the group
table a group build's checked inputs make.

They read host facts only (dtypes, devices, dimensions, strides, sizes, capacity), never a device
value, so they cost a few attribute reads and never synchronise. They keep every kernel launch inside
its inputs and outputs; the rules that need the data are checked by full validation
(``validation.py``, on request) or by the build itself when it is guarded (``rules.py``,
docs/semantics.md #guarded-builds). The step's per-request inputs check themselves
(``StepInputs.preflight``, with the helpers here), and so does the metadata a draft update reads
(``SWAMetadata.preflight_update``); the checks here are those of each KV-cache group's inputs and the
DSpark rows' host check of a build's plan (``preflight_noncausal``). Token-slot, ring and request-window
calls check their own inputs (``slot_rows.py``, ``slot_ring.py``, ``request_window.py``).

Group inputs (docs/semantics.md #group-builds): each KV-cache group's block table and slot mapping,
handed in as two lists of tensors, stacked in one tensor each, or as a list of block tables with the slot
mappings stacked (the layout vLLM's model runner keeps: one table per group, of its own width, and one
[G, T] slot-mapping buffer), checked and described as the rows of the kernel's group table. A single
build's table and slot mapping are a group of one. The stacked form is the cheap one: its host checks
look at two tensors whatever the number of groups, and its per-group views and table rows are made once
per buffer and kept in the builder's cache (swa_hal/cache.py; an engine keeps its group tables in
persistent buffers, so a step finds them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from .config import INT32_LIMIT
from .errors import BatchCapacityError, BatchDeviceError, BatchDtypeError, BatchShapeError, SpeculativeModeError

if TYPE_CHECKING:
    from .cache import HostCache
    from .config import SWAConfig


def _refuse(name: str, t: object, want: torch.dtype, device_index: int, ndim: int) -> None:
    """Name the first broken rule of a preflight-checked input (the slow path of the fast checks)."""
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
    """A host copy of the batch (``query_start_loc_cpu``, ``seq_lens_cpu``) must be a 1-D int32 tensor in host
    memory, as its device tensor is: the split and the chunk plan read it as numbers (a float or int64 copy gives
    another split, a [R+1, 1] copy other offsets)."""
    if not isinstance(t, torch.Tensor):
        raise BatchDtypeError(name, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_cpu:
        raise BatchDeviceError(name, f"{name} is on {t.device}; a host copy must be a CPU tensor")
    if t.dtype is not torch.int32:
        raise BatchDtypeError(name, f"{name} has dtype {t.dtype}; a host copy must be int32, as its device tensor")
    if t.dim() != 1:
        raise BatchShapeError(name, f"{name} has shape {tuple(t.shape)}; a host copy must be 1-D")


def refuse_untyped_spans(spans: object) -> None:
    """``image_spans`` must be an ``ImageSpans`` (its ``indptr``, ``starts`` and ``ends``): a dict or a tuple of
    ranges (the form ``AttentionBatch.from_lists`` and the engines take) is refused by name, not read."""
    if not all(hasattr(spans, name) for name in ("indptr", "starts", "ends")):
        raise BatchDtypeError(
            "image_spans",
            f"image_spans must be an ImageSpans (indptr, starts, ends), got {type(spans).__name__}",
        )


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


def check_unbounded_padding(num_bounds: int, num_reqs: int, query_start_loc_cpu: torch.Tensor) -> None:
    """docs/semantics.md #bounded-replay: ``replay_start`` may stop before the last request only where every
    request after it is a padding request (no query tokens), as in a CUDA-graph step padded to a captured
    request count. Two host reads; raises ``BatchShapeError`` naming the first request past the bounds that
    has query tokens."""
    qsl = query_start_loc_cpu
    if qsl[num_bounds] == qsl[num_reqs]:
        return
    query = (qsl[num_bounds + 1 : num_reqs + 1] - qsl[num_bounds:num_reqs]).tolist()
    first = num_bounds + next(i for i, q in enumerate(query) if q != 0)
    raise BatchShapeError(
        "replay_start",
        f"replay_start has {num_bounds} entries for {num_reqs} requests, and request {first} past them has "
        f"{query[first - num_bounds]} query tokens: only padding requests (no query tokens) may go without a bound",
        first,
    )


# -- group inputs ------------------------------------------------------------------------------------

# Address of group g's block table, address of its slot mapping, the table's row stride and width
# (in elements): one row of the group table the kernel reads.
GroupRow = tuple[int, int, int, int]


def preflight_noncausal(
    config: SWAConfig, query_start_loc_cpu: torch.Tensor, max_query_len: int, num_decodes: int
) -> int:
    """A step's DSpark rows (docs/semantics.md #dspark-rows), its first ``num_decodes`` requests' (the host's
    split of ``query_start_loc_cpu``): only legal with DSpark, and never truncated. A decode's
    row needs min(q_r + W, S_r) entries, and its host ``seq_lens_cpu`` is only an upper bound of S_r
    (vLLM's async scheduling hands in one): the host refuses only a row that cannot fit whatever S_r is,
    q_r > width (S_r >= q_r); every other row too wide is the device's to find (rule 7 of a guarded
    build: emptied and recorded), never a refusal of a step that may be valid. Returns the decode rows' width
    (``config.noncausal_index_width``)."""
    cfg = config
    if not cfg.is_dspark:
        raise SpeculativeModeError(
            "causal",
            f"causal=False is only legal with DSpark drafting; speculative_method={cfg.speculative_method!r}",
        )
    width = cfg.noncausal_index_width
    if min(max_query_len, cfg.decode_threshold) > width and num_decodes:
        qsl_cpu = query_start_loc_cpu.numpy()
        query = np.diff(qsl_cpu[: num_decodes + 1]).astype(np.int64)
        over = np.flatnonzero(query > width)
        if over.size:
            r = int(over[0])
            raise SpeculativeModeError(
                "query_start_loc",
                f"request {r}: its DSpark row needs at least its {int(query[r])} query tokens, wider than the "
                f"non-causal width {width}; refusing to truncate",
                r,
            )
    return width


class GroupInputs(NamedTuple):
    """A build's checked per-group inputs: each group's block table and slot mapping and, where there are
    several, each one's row of the kernel's group table (a single build has none: its one group is read
    directly). ``named``: whether errors name the group (a ``build_groups`` call's, even of one group; a
    single build's are named as the batch's own fields)."""

    tables: Sequence[torch.Tensor]
    slots: Sequence[torch.Tensor]
    rows: tuple[GroupRow, ...]
    named: bool = True


# A single build's table and slot mapping, as errors name them.
SINGLE = ("block_table", "slot_mapping")


def single_group(
    table: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_reqs: int,
    num_tokens: int,
    device_index: int,
    max_groups: int,
    cache: HostCache,
) -> GroupInputs:
    """A single build's block table and slot mapping (the batch's own) checked and described as a group
    of one: ``group_inputs``'s signature, so a build takes either without a branch."""
    check_group(table, slot_mapping, num_reqs, num_tokens, device_index, names=SINGLE)
    return GroupInputs((table,), (slot_mapping,), (), False)


def group_inputs(
    block_tables: Sequence[torch.Tensor] | torch.Tensor,
    slot_mappings: Sequence[torch.Tensor] | torch.Tensor,
    num_reqs: int,
    num_tokens: int,
    device_index: int,
    max_groups: int,
    cache: HostCache,
) -> GroupInputs:
    """Check a group build's per-group inputs (the step's are ``StepInputs.preflight``'s) and describe
    them. ``block_tables``: a list of int32 [R', P_g] tensors, or one int32 [G, R', P] tensor;
    ``slot_mappings``: a list of int64 [T] tensors, or one int64 [G, T] tensor (with listed tables too).
    Host facts only. (A single build's table and slot mapping: ``single_group``.)"""
    if isinstance(slot_mappings, torch.Tensor) and not isinstance(block_tables, torch.Tensor):
        found = _mixed(block_tables, slot_mappings, num_reqs, num_tokens, device_index, cache)
    elif isinstance(block_tables, torch.Tensor) or isinstance(slot_mappings, torch.Tensor):
        found = _stacked(block_tables, slot_mappings, num_reqs, num_tokens, device_index, cache)
    else:
        _count(len(block_tables), len(slot_mappings))
        found = _listed(block_tables, slot_mappings, num_reqs, num_tokens, device_index)
    if len(found.rows) > max_groups:
        raise BatchCapacityError(
            "block_tables",
            f"{len(found.rows)} groups; the config's num_kv_groups is {max_groups} "
            f"(the builder keeps that many sets of buffers)",
        )
    return found


def _count(tables: int, slots: int) -> None:
    if tables != slots or tables < 1:
        raise BatchShapeError(
            "slot_mappings",
            f"{slots} slot mappings for {tables} block tables; "
            f"a group build needs one of each per group, at least one group",
        )


def check_group(
    table: Any,
    slot_mapping: Any,
    num_reqs: int,
    num_tokens: int,
    device_index: int,
    g: int = 0,
    names: tuple[str, str] | None = None,
) -> tuple[int, int]:
    """Check one group's block table and slot mapping (a single build's, named ``names``, or listed group
    ``g``'s, named ``block_tables[g]`` and ``slot_mappings[g]``); returns the table's row stride and width.
    Every rule (shapes included) is one expression, so a good group costs one branch."""
    try:
        ts, tst, ss = table.shape, table.stride(), slot_mapping.shape
        ok = (
            table.dtype is torch.int32
            and slot_mapping.dtype is torch.int64
            and table.get_device() == device_index
            and slot_mapping.get_device() == device_index
            and (device_index >= 0 or not (table.is_meta or slot_mapping.is_meta))  # META
            and len(ts) == 2
            and len(ss) == 1
            and ts[0] >= num_reqs
            and ss[0] == num_tokens
            and (ts[1] == 1 or (ts[1] > 1 and tst[1] == 1))
            and slot_mapping.is_contiguous()  # 1-D: unit stride, or at most one element
            and (num_reqs - 1) * tst[0] + ts[1] <= INT32_LIMIT  # refuse_table_reach
        )
    except AttributeError:
        ok = False
    if not ok:
        table_name, slots_name = names or (f"block_tables[{g}]", f"slot_mappings[{g}]")
        _refuse_listed(g, table_name, slots_name, table, slot_mapping, num_reqs, num_tokens, device_index)
    return tst[0], ts[1]


def _listed(
    tables: Sequence[Any], slots: Sequence[Any], num_reqs: int, num_tokens: int, device_index: int
) -> GroupInputs:
    rows: list[GroupRow] = []
    for g, (table, slot_mapping) in enumerate(zip(tables, slots)):
        stride, width = check_group(table, slot_mapping, num_reqs, num_tokens, device_index, g)
        rows.append((table.data_ptr(), slot_mapping.data_ptr(), stride, width))
    return GroupInputs(tables, slots, tuple(rows))


def _mixed(
    tables: Sequence[Any], slots: torch.Tensor, num_reqs: int, num_tokens: int, device_index: int, cache: HostCache
) -> GroupInputs:
    """Listed block tables, stacked slot mappings: the tables checked as listed ones, the slot mappings as
    one stacked tensor, whose per-group views and addresses are kept (``_unbound``)."""
    i64 = torch.int64
    ss, sst = slots.shape, slots.stride()
    ok = (
        slots.dtype is i64
        and slots.get_device() == device_index
        and (device_index >= 0 or not slots.is_meta)  # META
        and len(ss) == 2
        and (ss[1] <= 1 or sst[1] == 1)
    )
    if not ok:  # name the broken rule
        preflight_tensor("slot_mappings", slots, i64, device_index, 2)
    _count(len(tables), ss[0])
    if ss[1] != num_tokens:
        raise BatchShapeError(
            "slot_mappings", f"slot_mappings has {ss[1]} entries per group; num_tokens is {num_tokens}"
        )
    slot_views, slot_addresses = _unbound(cache, (slots.data_ptr(), ss, sst), slots)
    i32 = torch.int32
    rows: list[GroupRow] = []
    for g, table in enumerate(tables):
        try:
            ts, tst = table.shape, table.stride()
            ok = (
                table.dtype is i32
                and table.get_device() == device_index
                and (device_index >= 0 or not table.is_meta)  # META
                and len(ts) == 2
                and ts[0] >= num_reqs
                and (ts[1] == 1 or (ts[1] > 1 and tst[1] == 1))
                and (num_reqs - 1) * tst[0] + ts[1] <= INT32_LIMIT  # refuse_table_reach
            )
        except AttributeError:
            ok = False
        if not ok:
            preflight_tensor(f"block_tables[{g}]", table, i32, device_index, 2)
            _shapes(f"block_tables[{g}]", table.shape, "slot_mappings", num_tokens, num_reqs, num_tokens)
            refuse_table_reach(f"block_tables[{g}]", num_reqs, table.stride()[0], table.shape[1])
            raise AssertionError(f"group {g}: block table refused by the fast check but by no rule")  # pragma: no cover
        rows.append((table.data_ptr(), slot_addresses[g], tst[0], ts[1]))
    return GroupInputs(tables, slot_views, tuple(rows))


def _refuse_listed(
    g: int,
    table_name: str,
    slots_name: str,
    table: Any,
    slot_mapping: Any,
    num_reqs: int,
    num_tokens: int,
    device_index: int,
) -> None:
    """Raise the error naming the first rule group g's listed inputs break (named ``table_name`` and
    ``slots_name``)."""
    preflight_tensor(table_name, table, torch.int32, device_index, 2)
    preflight_tensor(slots_name, slot_mapping, torch.int64, device_index)
    _shapes(table_name, table.shape, slots_name, slot_mapping.shape[0], num_reqs, num_tokens)
    refuse_table_reach(table_name, num_reqs, table.stride()[0], table.shape[1])
    raise AssertionError(f"group {g}: inputs refused by the fast check but by no rule")  # pragma: no cover


def _stacked(
    tables: Any, slots: Any, num_reqs: int, num_tokens: int, device_index: int, cache: HostCache
) -> GroupInputs:
    if not isinstance(tables, torch.Tensor) or not isinstance(slots, torch.Tensor):
        raise BatchShapeError(
            "slot_mappings",
            "stacked group inputs: block_tables [G, R, P] and slot_mappings [G, T] must both be tensors",
        )
    i32, i64 = torch.int32, torch.int64
    ts, tst, ss, sst = tables.shape, tables.stride(), slots.shape, slots.stride()
    ok = (
        tables.dtype is i32
        and slots.dtype is i64
        and tables.get_device() == device_index
        and slots.get_device() == device_index
        and (device_index >= 0 or not (tables.is_meta or slots.is_meta))  # META
        and len(ts) == 3
        and len(ss) == 2
        and (ts[2] <= 1 or tst[2] == 1)
        and (ss[1] <= 1 or sst[1] == 1)
    )
    if not ok:  # name the broken rule
        preflight_tensor("block_tables", tables, i32, device_index, 3)
        preflight_tensor("slot_mappings", slots, i64, device_index, 2)
    _count(ts[0], ss[0])
    _shapes("block_tables", ts, "slot_mappings", ss[1], num_reqs, num_tokens)
    refuse_table_reach("block_tables", num_reqs, tst[1], ts[2])
    # An engine hands in a slice of its buffers per step ([:, :num_reqs], [:, :num_tokens]): tables and
    # slot mappings are kept apart (their lengths vary independently), each pair's rows once more.
    # Identity keys (swa_hal/cache.py) from the shapes and strides read above; the checks fixed the
    # dtypes and the device.
    tkey, skey = (tables.data_ptr(), ts, tst), (slots.data_ptr(), ss, sst)
    found = cache.get(("group pair", tkey, skey))
    if found is None:
        table_views, table_addresses = _unbound(cache, tkey, tables)
        slot_views, slot_addresses = _unbound(cache, skey, slots)
        rows = tuple((t, s, tst[1], ts[2]) for t, s in zip(table_addresses, slot_addresses))
        found = cache.keep(("group pair", tkey, skey), GroupInputs(table_views, slot_views, rows))
    return found


def _unbound(cache: HostCache, key: Any, stacked: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], tuple[int, ...]]:
    """Each group's view of ``stacked`` and its address (kept: the views hold the memory alive)."""
    found = cache.get(("group views", key))
    if found is None:
        step = stacked.stride()[0] * stacked.element_size()
        address = stacked.data_ptr()
        found = cache.keep(
            ("group views", key), (stacked.unbind(0), tuple(address + g * step for g in range(stacked.shape[0])))
        )
    return found


def group_rows(tables: Sequence[torch.Tensor], slots: Sequence[torch.Tensor]) -> tuple[GroupRow, ...]:
    """The group table's rows for these (already checked) tensors."""
    return tuple((t.data_ptr(), s.data_ptr(), t.stride()[0], t.shape[1]) for t, s in zip(tables, slots))


def _shapes(table_name: str, ts: Sequence[int], slots_name: str, n_slots: int, num_reqs: int, num_tokens: int) -> None:
    """A group's table has a row per request and a page column; its slot mapping an entry per token.
    (``ts``: the table's shape, the stacked one's [G, R', P] or a listed one's [R', P].)"""
    if ts[-2] < num_reqs or ts[-1] < 1:
        raise BatchShapeError(
            table_name, f"{table_name} {tuple(ts)} has too few rows or no page column for {num_reqs} requests"
        )
    if n_slots != num_tokens:
        raise BatchShapeError(slots_name, f"{slots_name} has {n_slots} entries; num_tokens is {num_tokens}")
