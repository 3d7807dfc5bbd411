"""Step builds: every SWA KV-cache group of a vLLM model-runner step in one ``build_groups``.

vLLM's model runner V2 builds a step's attention metadata in ``ModelState.prepare_attn``, which holds
every group's block table (a tuple, one table per KV-cache group) and the stacked slot mappings
(int64 [G, T]) and then calls each group's builder in turn (``build_attn_metadata``). The plugin wraps
``DefaultModelState.prepare_attn``; every model state that builds through it (the DeepSeek-V4.1 one
calls it after padding the replayed slots, with the same ``replay_start``) opens a ``Step`` for the
call. The first swa_hal SWA builder the loop reaches builds every SWA group of the step at once, from
its own ``CommonAttentionMetadata`` (the step's shared tensors) and the step's tables and slot mappings;
every SWA builder of the step, that one included, then hands out its group's metadata from that build.

A builder takes its group's metadata from the step build only when its inputs are exactly the ones the
build used: the step's inputs made from the same engine objects (``engine.step_sources``, the one list of
what a step's groups share: query offsets, sequence lengths and their host copies, token counts,
causality, image ranges, replay bounds), and its group's own block table and slot-mapping row (the same
memory seen the same way: ``cache.tensor_key``). Anything else (a table vLLM mapped to kernel blocks, a slot
mapping a PCP rank chunked, a second call with other inputs) builds that group on its own, as it does
without step builds.

Diagnostics stay with the group: the swa_hal builder vLLM's builder of a group holds (``GroupBuilder``)
reports the guard violations of the step builds that served its group (``check()``, ``poll_violations``),
and a step build that refuses its inputs builds nothing: every group of the step then builds alone, so
an error is raised in the call of the group whose input it is, naming vLLM's KV-cache group.

The step build lives in a ``StepPlan``'s own ``SWAMetadataBuilder`` (one set of fixed buffers per
group), made once per set of SWA builders: the path a step takes depends only on the builders and the
layout of vLLM's persistent buffers, so a CUDA graph captured through it replays through it.

vLLM's drafters build their draft steps outside ``prepare_attn``, with ``build_attn_metadata`` itself
(``vllm.v1.worker.gpu.spec_decode.speculator``, with the same inputs: every group's table, the stacked
slot mappings); the plugin wraps that module's name for it the same way, so draft steps (DSpark's
non-causal ones among them) are step builds too.

Draft-step updates: vLLM's drafter updates each group's metadata in turn, every group once per draft
step (``update_draft_decode_metadata``). The first group of a draft step updates every group of the
step build in one grouped update; the others find theirs done (``StepPlan.update_draft``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import threading
from collections import OrderedDict
from typing import Any

import torch

from ..batch import AttentionBatch
from ..builder import SWAMetadataBuilder
from ..cache import HostCache, tensor_key
from ..errors import BatchShapeError, BatchValidationError
from ..metadata import SWAMetadata
from .aside import drift_reason, step_aside
from .engine import inputs_from_common_metadata, same_sources, step_image_spans, step_sources
from .vllm_common import ENGINE, is_swa_hal_builder, log

MODEL_STATE_MODULE = "vllm.v1.worker.gpu.model_states.default"
# vLLM's drafters build their draft steps' metadata through this module's ``build_attn_metadata``.
DRAFTER_MODULE = "vllm.v1.worker.gpu.spec_decode.speculator"
# The parameters a step build reads from a ``build_attn_metadata`` call (all keywords in the drafter's).
BUILD_PARAMS = ("attn_groups", "block_tables", "slot_mappings", "ubatch_idx")
# Those of them a call must pass (vLLM's function has no default for them).
STEP_KEYWORDS = frozenset(BUILD_PARAMS[:3])
# The parameters of the prepare_attn the hook wraps, in order (vLLM 0.33's DefaultModelState).
PREPARE_ATTN_PARAMS = (
    "self",
    "input_batch",
    "cudagraph_mode",
    "block_tables",
    "slot_mappings",
    "attn_groups",
    "kv_cache_config",
    "for_capture",
    "ubatch_idx",
    "model_specific_attn_metadata",
)


# Kept slot-mapping row views per plan (one per token count seen; past this many, made anew).
ROW_VIEWS = 1024


# -- the builder vLLM's builder holds ------------------------------------------------------------


class GroupBuilder(SWAMetadataBuilder):
    """The swa_hal builder of one vLLM SWA builder (``builder.swa_hal``, the one an engine checks): its
    group's own builds, and the step builds that serve its group (``steps``, each plan's builder), whose
    violation records it reads as its own. An engine asked this builder for the group's rows, whichever
    builder ran the build, so ``check()`` and ``poll_violations`` answer for all of them."""

    steps: tuple[SWAMetadataBuilder, ...] = ()

    def serve(self, step_builder: SWAMetadataBuilder) -> None:
        """``step_builder`` builds this group's rows in steps from now on."""
        if not any(b is step_builder for b in self.steps):
            self.steps = (*self.steps, step_builder)

    def check(self) -> None:
        """``SWAMetadataBuilder.check`` over this builder's record, then each step builder's: the first
        violation found is raised (a step build's record is the step's, so the first check of any of its
        groups' builders raises it); records not read yet keep theirs for the next check."""
        super().check()
        for step_builder in self.steps:
            step_builder.check()

    def poll_violations(self) -> None:
        """``SWAMetadataBuilder.poll_violations`` over this builder's record and each step builder's, without
        a sync: every builder of a step polls the step's record, so a violation a step build recorded
        surfaces at the next build of any of them, a step build or not."""
        super().poll_violations()
        for step_builder in self.steps:
            step_builder.poll_violations()


def kv_group_error(exc: BatchValidationError, kv_group: int) -> BatchValidationError:
    """``exc``, raised by a group's own build after its step build refused the step's inputs, naming the
    group as vLLM numbers it (its place in ``block_tables`` and ``slot_mappings``)."""
    return type(exc)(exc.field, f"KV-cache group {kv_group}: {exc.constraint}", exc.index)


# -- the plan: which builders a step build serves ------------------------------------------------


class StepPlan:
    """The SWA groups of one set of attention groups (one microbatch's builders): ``kv_ids`` the
    KV-cache group of each step group, ``builder`` the step build's ``SWAMetadataBuilder`` (None: these
    groups build on their own), and the latest step build, for draft updates."""

    def __init__(
        self, members: dict[int, tuple[Any, int]], kv_ids: tuple[int, ...], builder: SWAMetadataBuilder | None
    ):
        self.members = members  # id(vLLM builder) -> (builder, step group)
        self.kv_ids = kv_ids
        self.builder = builder
        self.slot_rows: slice | None = None
        if builder is not None and len(kv_ids) > 1:
            gaps = {b - a for a, b in zip(kv_ids, kv_ids[1:])}
            if len(gaps) == 1:  # evenly spaced groups: one strided view of the [G, T] buffer
                self.slot_rows = slice(kv_ids[0], kv_ids[-1] + 1, gaps.pop())
        # The latest step build's handed-out metadata, per step group: (vLLM's, swa_hal's), and which
        # groups the current draft step has updated.
        self.handed: list[tuple[Any, SWAMetadata] | None] = [None] * len(kv_ids)
        self.updated: set[int] = set()
        # SWA groups not evenly spaced: their slot-mapping rows, per view of vLLM's buffer (a step's
        # [:, :T]), made once per token count rather than every step.
        self._rows = HostCache(limit=ROW_VIEWS)

    def inputs(self, block_tables: Any, slot_mappings: torch.Tensor) -> tuple[Any, Any]:
        """The step build's tables and slot mappings, in vLLM's layout: the tuple of tables as it is when
        every group is an SWA group, and the slot mappings as a view of vLLM's [G, T] buffer whenever the
        SWA groups are evenly spaced in it."""
        ids = self.kv_ids
        if len(block_tables) == len(ids) and ids[0] == 0 and self.slot_rows == slice(0, len(ids), 1):
            return block_tables, slot_mappings
        tables = tuple(block_tables[i] for i in ids)
        if self.slot_rows is not None:
            return tables, slot_mappings[self.slot_rows]
        key = tensor_key(slot_mappings)
        rows = self._rows.get(key)
        if rows is None:
            rows = self._rows.keep(key, [slot_mappings[i] for i in ids])
        return tables, rows

    def hand_out(self, g: int, vllm_metadata: Any, metadata: SWAMetadata) -> None:
        self.handed[g] = (vllm_metadata, metadata)

    def update_draft(self, g: int, vllm_metadata: Any) -> bool:
        """Update step group g's decode rows for a draft step, if vLLM's ``vllm_metadata`` is what the latest
        step build handed out for it (False: not this plan's to update). The first group of a draft step
        updates them all in one grouped update; a group called again starts the next draft step."""
        entry = self.handed[g]
        if entry is None or entry[0] is not vllm_metadata or self.builder is None:
            return False
        # vLLM updates every group once per draft step, in group order: a group not yet updated and
        # after the ones that were is part of the current draft step, already done.
        if self.updated and g not in self.updated and g > max(self.updated):
            self.updated.add(g)
            return True
        self.updated = {g}
        complete = [e[1] for e in self.handed if e is not None]
        if len(complete) == len(self.handed):
            self.builder.update_draft_decode_metadata(complete)
        else:  # a group whose builder handed out nothing this step: update this group alone
            self.updated = set()
            self.builder.update_draft_decode_metadata(entry[1])
        return True


def _swa_builders(attn_groups: Any, ubatch_idx: int) -> list[tuple[int, Any, Any]]:
    """(KV-cache group, attention group, builder) of every swa_hal SWA builder, in vLLM's build order.
    Told by their class's marker, not by the builder class: vllm_builder imports this module."""
    found = []
    for i, groups in enumerate(attn_groups):
        for group in groups:
            builders = getattr(group, "metadata_builders", ())
            builder = builders[ubatch_idx] if len(builders) > ubatch_idx else None
            # A builder whose set-up stepped aside (docs/engines.md #drift) builds as vLLM's own does.
            if is_swa_hal_builder(type(builder)) and getattr(builder, "swa_hal_aside", None) is None:
                found.append((i, group, builder))
    return found


def _make_plan(found: list[tuple[int, Any, Any]]) -> StepPlan:
    """A step build for these builders, or a plan that builds none (``builder`` None): fewer than two SWA
    KV-cache groups (one group's build is already one launch), a group whose tables vLLM maps to
    kernel blocks per build (the step could not read them first), or builders of different setups."""
    kv_ids = tuple(sorted({i for i, _, _ in found}))
    g_of = {i: g for g, i in enumerate(kv_ids)}
    members = {id(b): (b, g_of[i]) for i, _, b in found}
    if len(kv_ids) < 2:
        return StepPlan(members, kv_ids, None)
    first: Any = found[0][2]
    usable = all(getattr(group, "kernel_block_size", None) is None for _, group, _ in found) and all(
        b.swa_config == first.swa_config
        and b.swa_hal.backend_name == first.swa_hal.backend_name
        and b.device == first.device
        for _, _, b in found
    )
    builder = None
    if usable:
        hal = first.swa_hal
        builder = SWAMetadataBuilder(
            dataclasses.replace(first.swa_config, num_kv_groups=len(kv_ids)),
            device=first.device,
            # The backend the groups' own builders started (an explicit name: the same one, no fallback).
            backend=hal.backend_name,
            platform=hal.platform,
            validate=hal.validate,
            guard=hal.guard,
            tile_schedulers=hal.tile_schedulers,
        )
        builder.violations.logger = log
        # A violation the step recorded names vLLM's KV-cache group, not its place in the step's groups.
        builder.violations.group_names = kv_ids
        # Every builder of the step polls the step's record (``GroupBuilder.poll_violations``): on a GPU it
        # is looked at as often per step as a group's own record, at every ``every``-th step.
        builder.violations.every *= len(members)
    return StepPlan(members, kv_ids, builder)


class Plans:
    """The plans, found by the identity of vLLM's (persistent) attention-group lists; a list seen for
    the first time (vLLM's V4.1 recorded decode builds hand in a fresh filtered list per branch) is
    matched by its builders, so each set of builders gets one plan, one set of buffers."""

    LISTS = 16

    def __init__(self) -> None:
        self._by_list: OrderedDict[tuple[int, int], tuple[Any, StepPlan]] = OrderedDict()
        self._by_builders: dict[tuple[int, ...], StepPlan] = {}
        self._lock = threading.Lock()

    def get(self, attn_groups: Any, ubatch_idx: int) -> StepPlan:
        key = (id(attn_groups), ubatch_idx)
        found = self._by_list.get(key)
        if found is not None and found[0] is attn_groups:
            return found[1]
        with self._lock:
            swa = _swa_builders(attn_groups, ubatch_idx)
            bkey = tuple(id(b) for _, _, b in swa)
            plan = self._by_builders.get(bkey)
            if plan is None or any(plan.members.get(id(b), (None,))[0] is not b for _, _, b in swa):
                plan = self._by_builders[bkey] = _make_plan(swa)
            self._by_list[key] = (attn_groups, plan)
            while len(self._by_list) > self.LISTS:
                self._by_list.popitem(last=False)
            if plan.builder is not None:
                for b, g in plan.members.values():
                    b.swa_hal_step = (plan, g)
                    b.swa_hal.serve(plan.builder)
            return plan

    def clear(self) -> None:
        with self._lock:
            self._by_list.clear()
            self._by_builders.clear()


plans = Plans()


# -- one prepare_attn call --------------------------------------------------------------------


class Step:
    """One ``prepare_attn`` call's step build: made by the first SWA builder vLLM calls, handed out to each.

    Every builder of the step asks once, so what each ask checks is kept small: where the slot-mapping
    rows lie is read once per step, and the shared inputs are compared by identity first (vLLM hands
    every group the same objects), by their identity keys and values only when an object differs.

    A step build that refuses its inputs (a ``BatchValidationError``) builds nothing: every group of the
    step then builds alone (``metadata`` answers None for its rows), so each error is raised by the call
    of the group whose input it is, as without step builds, naming the group (``kv_group_error``)."""

    __slots__ = ("plan", "block_tables", "slot_mappings", "built", "sources", "versions", "_rows")

    def __init__(self, plan: StepPlan, block_tables: Any, slot_mappings: Any):
        self.plan = plan
        self.block_tables = block_tables
        self.slot_mappings = slot_mappings
        self.built: list[SWAMetadata] | None = None
        self.sources: tuple[Any, ...] | None = None  # the building call's ``engine.step_sources``
        self.versions: tuple[int | None, ...] = ()  # their tensors' version counters, then the layout's
        # Group i's slot-mapping row is the [G, T] buffer's row i: its ``tensor_key`` is the buffer's, with
        # the address rows[0] + i * rows[1] and the shape and strides of a row.
        ptr, shape, strides, dtype, device = tensor_key(slot_mappings)
        self._rows = (ptr, strides[0] * slot_mappings.element_size(), shape[1:], strides[1:], dtype, device)

    def metadata(
        self, builder: Any, cm: Any, replay_start: torch.Tensor | None
    ) -> tuple[int, SWAMetadata | None] | None:
        """(step group, its metadata) for ``builder``'s build of ``cm`` (building every group on the first
        call), or None: not one of this step's groups, or not its inputs (the builder builds alone); the
        metadata is None where the step build refused the step's inputs (the group builds alone, its
        errors named by its KV-cache group). The inputs are ``cm``'s block table (the step's own object
        for the group), its slot-mapping row (the group's row of the step's [G, T] buffer, by
        ``tensor_key``) and the step's inputs (their ``engine.step_sources``, by ``engine.same_sources``)."""
        plan = self.plan
        member = plan.members.get(id(builder))
        if member is None:
            return None
        g = member[1]
        i = plan.kv_ids[g]
        first, step, shape, strides, dtype, device = self._rows
        if not (
            member[0] is builder
            and cm.block_table_tensor is self.block_tables[i]
            and tensor_key(cm.slot_mapping) == (first + i * step, shape, strides, dtype, device)
        ):
            return None
        built = self.built
        sources = step_sources(cm, replay_start)
        if self.sources is None:
            self.sources = sources
            self.versions = _versions(sources, self.block_tables, self.slot_mappings)
            plan.handed = [None] * len(plan.kv_ids)
            plan.updated = set()
            hal = plan.builder
            assert hal is not None
            tables, slots = plan.inputs(self.block_tables, self.slot_mappings)
            try:
                spans = step_image_spans(hal, cm)
                inputs = inputs_from_common_metadata(cm, image_spans=spans, sources=sources)
                batch = AttentionBatch(inputs=inputs, block_table=cm.block_table_tensor, slot_mapping=cm.slot_mapping)
                built = self.built = hal.build_groups(batch, tables, slots)
            except BatchValidationError:
                # Which group's input broke the rule, the step build's error does not say in vLLM's terms
                # (a place among the step's groups); each group's own build does, in its own call.
                return g, None
        elif (
            not same_sources(sources, self.sources)
            or _versions(sources, self.block_tables, self.slot_mappings) != self.versions
        ):
            # Other inputs, or the same tensors changed in place since the step build read them (every
            # in-place torch write bumps a tensor's version counter): this group builds alone, from what
            # its tensors hold now (docs/engines.md, step builds).
            return None
        return g, None if built is None else built[g]


def _versions(sources: tuple[Any, ...], block_tables: Any, slot_mappings: torch.Tensor) -> tuple[int | None, ...]:
    """The version counters of a step's input tensors (None for what is not a tensor): an O(1) read per
    tensor that tells whether any of them was written in place since."""
    return (
        *(x._version if isinstance(x, torch.Tensor) else None for x in sources),
        *(t._version for t in block_tables),
        slot_mappings._version,
    )


_active = threading.local()  # microbatches build their metadata from threads of their own


def current() -> Step | None:
    stack = getattr(_active, "stack", None)
    return stack[-1] if stack else None


class opened:
    """The step of one ``prepare_attn`` call, current on this thread while it runs (calls nest: the
    V4.1 replay batch's builds run after the step's, each its own step)."""

    __slots__ = ("step",)

    def __init__(self, step: Step | None):
        self.step = step

    def __enter__(self) -> Step | None:
        stack = getattr(_active, "stack", None)
        if stack is None:
            stack = _active.stack = []
        stack.append(self.step)
        return self.step

    def __exit__(self, *exc: object) -> None:
        _active.stack.pop()


def open_step(block_tables: Any, slot_mappings: Any, attn_groups: Any, ubatch_idx: int) -> opened:
    """The step of a ``prepare_attn`` call with these inputs (a step that builds nothing for a plan
    without a step build, or for inputs not in vLLM's layout). Raises ``BatchShapeError`` where the
    call's tables or slot-mapping rows lack a KV-cache group its attention groups build."""
    if not isinstance(slot_mappings, torch.Tensor) or slot_mappings.dim() != 2:
        return opened(None)
    plan = plans.get(attn_groups, ubatch_idx)
    if plan.builder is None:
        return opened(None)
    try:
        num_tables = len(block_tables)
    except TypeError:  # not vLLM's tuple of tables: each group builds alone
        return opened(None)
    num_rows = slot_mappings.shape[0]
    last = plan.kv_ids[-1]
    if last >= num_tables or last >= num_rows:
        _refuse_layout(plan.kv_ids, num_tables, num_rows)
    if num_tables != num_rows:
        return opened(None)
    return opened(Step(plan, block_tables, slot_mappings))


def _step_or_none(block_tables: Any, slot_mappings: Any, attn_groups: Any, ubatch_idx: int) -> opened:
    """``open_step`` as the hooks call it: a layout it cannot read (an attribute of vLLM's attention groups or
    builders that this release no longer has) opens no step, so every group builds on its own (drift, counted
    and logged once); swa_hal's typed errors (a table missing for a group) are raised as ever."""
    try:
        return open_step(block_tables, slot_mappings, attn_groups, ubatch_idx)
    except BatchValidationError:
        raise
    except Exception as exc:  # noqa: BLE001 - vLLM's call goes on, group by group
        step_aside(ENGINE, "prepare_attn (step builds)", drift_reason(exc), log)
        return opened(None)


def _refuse_layout(kv_ids: tuple[int, ...], num_tables: int, num_rows: int) -> None:
    """Raise the error naming the first KV-cache group of the plan the call's inputs have no entry for."""
    for name, have, what in (("block_tables", num_tables, "tables"), ("slot_mappings", num_rows, "rows")):
        missing = [i for i in kv_ids if i >= have]
        if missing:
            i = missing[0]
            raise BatchShapeError(
                name,
                f"{name} has {have} {what}, so no {name}[{i}]; the step's attention groups build KV-cache "
                f"group {i} (SWA groups {list(kv_ids)}): one entry per KV-cache group, each group's at its index",
                i,
            )


# -- the builders' side -----------------------------------------------------------------------


def group_metadata(
    builder: Any, cm: Any, replay_start: torch.Tensor | None
) -> tuple[StepPlan, int, SWAMetadata | None] | None:
    """(plan, step group, metadata) when the current step build serves ``builder``'s build of ``cm``;
    metadata None: the step build refused the step's inputs, the group builds alone (``build_alone``)."""
    step = current()
    if step is None:
        return None
    found = step.metadata(builder, cm, replay_start)
    if found is None:
        return None
    return step.plan, found[0], found[1]


def build_alone(builder: Any, plan: StepPlan, g: int, cm: Any, replay_start: torch.Tensor | None) -> SWAMetadata:
    """Step group ``g``'s build of ``cm`` in its own builder, after its step build refused the step's
    inputs: an error it raises names the group's KV-cache group."""
    try:
        return builder.swa_hal.build(builder.swa_hal_batch(cm, replay_start))
    except BatchValidationError as exc:
        raise kv_group_error(exc, plan.kv_ids[g]) from exc


def update_draft(builder: Any, vllm_metadata: Any) -> bool:
    """Whether a step build's update covered ``builder``'s draft update of ``vllm_metadata``."""
    found = getattr(builder, "swa_hal_step", None)
    return found is not None and found[0].update_draft(found[1], vllm_metadata)


def owner(builder: Any, vllm_metadata: Any) -> SWAMetadataBuilder:
    """The swa_hal builder whose buffers ``vllm_metadata``'s decode rows are: a step build's, or the
    group's own."""
    found = getattr(builder, "swa_hal_step", None)
    if found is not None and found[0].builder is not None:
        hal = found[0].builder
        lens = vllm_metadata.decode_swa_lens.untyped_storage().data_ptr()
        if lens == hal.buffers.group_decode_lens.untyped_storage().data_ptr():
            return hal
    return builder.swa_hal


# -- the hook -----------------------------------------------------------------------------------


def install(patched: list[tuple[Any, str, Any]]) -> bool:
    """Wrap vLLM's ``DefaultModelState.prepare_attn`` (once; the original goes into ``patched`` for
    ``unregister``). False where there is no such hook: a vLLM without model runner V2's model states,
    or whose ``prepare_attn`` takes other parameters (each group then builds on its own)."""
    try:
        module = importlib.import_module(MODEL_STATE_MODULE)
        cls = module.DefaultModelState
        original = cls.__dict__["prepare_attn"]
    except Exception as exc:  # noqa: BLE001 - vLLM calls the plugin unguarded
        log.debug("swa_hal: no step hook (%s does not import: %r)", MODEL_STATE_MODULE, exc)
        return False
    if getattr(original, "__swa_hal__", False):
        return True
    params = tuple(inspect.signature(original).parameters)
    if params != PREPARE_ATTN_PARAMS:
        # A newer vLLM's prepare_attn: every group builds on its own, as vLLM calls its builders (drift).
        unknown = [p for p in params if p not in PREPARE_ATTN_PARAMS]
        gone = [p for p in PREPARE_ATTN_PARAMS if p not in params]
        step_aside(
            ENGINE,
            "prepare_attn (step builds)",
            f"parameters it does not know: {', '.join(unknown) or 'none'}; gone: {', '.join(gone) or 'none'}",
            log,
        )
        return False

    def prepare_attn(
        self: Any,
        input_batch: Any,
        cudagraph_mode: Any,
        block_tables: Any,
        slot_mappings: Any,
        attn_groups: Any,
        kv_cache_config: Any,
        for_capture: bool = False,
        ubatch_idx: int = 0,
        model_specific_attn_metadata: Any = None,
    ) -> Any:
        with _step_or_none(block_tables, slot_mappings, attn_groups, ubatch_idx):
            return original(
                self,
                input_batch,
                cudagraph_mode,
                block_tables,
                slot_mappings,
                attn_groups,
                kv_cache_config,
                for_capture,
                ubatch_idx,
                model_specific_attn_metadata,
            )

    prepare_attn.__swa_hal__ = True  # type: ignore[attr-defined]
    prepare_attn.__wrapped__ = original  # type: ignore[attr-defined]
    prepare_attn.__doc__ = original.__doc__
    cls.prepare_attn = prepare_attn
    patched.append((cls, "prepare_attn", original))
    _install_drafter(patched)
    return True


def _install_drafter(patched: list[tuple[Any, str, Any]]) -> None:
    """The drafters' step builds: vLLM's speculator builds each draft step's metadata with
    ``build_attn_metadata`` (by keyword: every group's block table, the stacked slot mappings, the groups),
    outside any ``prepare_attn``; its module's name for it is wrapped the same way. Without it (another
    vLLM), draft steps build group by group."""
    try:
        module: Any = importlib.import_module(DRAFTER_MODULE)
        original = module.build_attn_metadata
    except Exception as exc:  # noqa: BLE001 - vLLM calls the plugin unguarded
        log.debug("swa_hal: no drafter step builds (%s does not import: %r)", DRAFTER_MODULE, exc)
        return
    if getattr(original, "__swa_hal__", False):
        return
    gone = [p for p in BUILD_PARAMS if p not in inspect.signature(original).parameters]
    if gone:
        step_aside(ENGINE, "build_attn_metadata (drafter step builds)", f"parameters gone: {', '.join(gone)}", log)
        return

    def build_attn_metadata(*args: Any, **kwargs: Any) -> Any:
        # The drafter passes keywords only; anything else (positional arguments, a step input left out)
        # builds as vLLM does, which also answers a call it cannot take.
        if args or not STEP_KEYWORDS <= kwargs.keys():
            missing = sorted(STEP_KEYWORDS - kwargs.keys())
            why = f"{len(args)} positional arguments" if args else f"no {', '.join(missing)}"
            step_aside(ENGINE, "build_attn_metadata (drafter step builds)", f"a call it does not know: {why}", log)
            return original(*args, **kwargs)
        with _step_or_none(
            kwargs["block_tables"], kwargs["slot_mappings"], kwargs["attn_groups"], kwargs.get("ubatch_idx", 0)
        ):
            return original(**kwargs)

    build_attn_metadata.__swa_hal__ = True  # type: ignore[attr-defined]
    build_attn_metadata.__wrapped__ = original  # type: ignore[attr-defined]
    build_attn_metadata.__doc__ = original.__doc__
    module.build_attn_metadata = build_attn_metadata
    patched.append((module, "build_attn_metadata", original))
