"""SWAMetadataBuilder: fixed buffers, the decode/prefill split, and one call into the backend.

The host side of a build reads only host values (the CPU query_start_loc, sizes), so a decode-only
build never synchronises and can be captured in a CUDA graph (docs/semantics.md #fixed-buffers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .backend import Backend, BuildPlan
from .batch import AttentionBatch, ImageSpans, spans_to_csr
from .buffers import MetadataBuffers
from .builder_lock import BuilderLock, OnDevice
from .cache import HostCache, tensor_key
from .config import INT32_LIMIT, SWAConfig
from .envs import env_flag, env_switch
from .errors import (
    BatchCapacityError,
    BatchDeviceError,
    BatchDtypeError,
    BatchShapeError,
    BatchValidationError,
    ConfigError,
    SpeculativeModeError,
)
from .metadata import SWAMetadata, group_views, shape_fields
from .platform import PlatformInfo, probe_platform
from .plugins import PluginRegistry
from .preflight import GroupInputs, group_inputs, preflight_tensor, single_group
from .request_window import (
    RequestWindowLayout,
    RequestWindowRows,
    preflight_request_window,
    validate_request_window,
)
from .rules import violation_error
from .schedulers import no_schedulers
from .selection import select_backend
from .slot_rows import SlotRows, check_outputs, new_slot_rows_outputs, preflight_slot_rows, slot_limit
from .split import refuse_host_split, split_decodes_and_prefills
from .step_inputs import StepInputs
from .validation import validate_batch
from .violations import ViolationWatch


def debug_mode() -> bool:
    return env_flag("SWA_HAL_DEBUG")


def guard_default() -> bool:
    """Guarded builds unless ``SWA_HAL_GUARD`` is set to a false word."""
    return env_switch("SWA_HAL_GUARD")


def builder_device(device: Any) -> torch.device:
    """``device`` as the torch.device a builder runs on (``cuda`` with its index), or a ``DeviceError``
    naming it where no build can run: not a device name torch knows, ``meta`` (no data), or a CUDA or XPU
    device this torch cannot reach (a CPU-only build, no device visible, an index past the last device).
    Checked up front: torch's own error for the last kind is an AssertionError from deep inside its lazy
    initialisation, which names neither the device nor what to do."""
    from .errors import DeviceError

    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise DeviceError(f"device {device!r} is not a torch device ({' '.join(str(exc).split())})") from None
    if device.type == "meta":
        raise DeviceError(
            f"device {str(device)!r} holds no data (meta tensors have shapes only), so a builder has nowhere "
            f"to write its outputs: use the engine's device (cpu, cuda, cuda:1, ...)"
        )
    if device.type in ("cuda", "xpu"):
        module = getattr(torch, device.type, None)
        count = module.device_count() if module is not None and module.is_available() else 0
        if count == 0:
            kind = device.type.upper()
            if device.type == "cuda" and not (torch.version.cuda or torch.version.hip):
                why = f"this torch ({torch.__version__}) was built without CUDA support"
            else:
                why = f"no {kind} device is visible to this process (or this torch was built without {kind} support)"
            raise DeviceError(f"device {str(device)!r}: {why}; build on 'cpu', or on a device this torch can reach")
        if device.index is not None and device.index >= count:
            raise DeviceError(
                f"device {str(device)!r}: there are {count} {device.type.upper()} device(s) here "
                f"(indices 0 to {count - 1})"
            )
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def _argument(name: str, value: Any, kind: type) -> None:
    """A TypeError naming the argument, the type it takes and what was given (``build(None)`` would
    otherwise fail inside the build with an AttributeError about an attribute it never mentioned)."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__module__}.{kind.__qualname__}, got {type(value).__name__}")


class SWAMetadataBuilder:
    """Builds SWAMetadata for one model and engine configuration, on one device.

    backend: a backend name, or None for ``SWA_HAL_BACKEND`` / auto-selection.
    platform: replaces the probe (tests, ``--assume``).
    validate: run the full, syncing validation on every build; default: ``SWA_HAL_DEBUG=1``.
        The O(1) host preflight (dtypes, devices, lengths, strides, capacity) always runs.
    guard: guarded builds (docs/semantics.md #guarded-builds): the build itself checks what needs the
        data, hands offending rows out empty and records the first violation for ``check()``;
        default on, ``SWA_HAL_GUARD=0`` turns it off.
    tile_schedulers: hand out the backend's planner objects in ``tile_sched`` (default); False for an
        engine that makes its own (vLLM's builders do), whose ``tile_sched`` is then None for every type.

    One builder serves one thread at a time (entering it from two threads at once raises
    ``ConcurrentBuildError``); give each thread, or each GPU, its own builder.
    """

    # The builder asks the engine for no reordering beyond "decodes first" (the engines' own rule).
    reorder_batch_threshold: int | None = None

    def __init__(
        self,
        config: SWAConfig,
        device: str | torch.device = "cpu",
        backend: str | None = None,
        platform: PlatformInfo | None = None,
        *,
        registry: PluginRegistry | None = None,
        validate: bool | None = None,
        guard: bool | None = None,
        tile_schedulers: bool = True,
    ):
        """Select and start the backend (``backend``, else ``SWA_HAL_BACKEND``, else the platform's best;
        an explicit request never falls back) and allocate the fixed output buffers for everything
        ``config`` admits. ``device`` is where the engine's tensors live (``"cpu"``, ``"cuda"``,
        ``"cuda:1"``); ``platform``, ``registry``, ``validate``, ``guard`` and ``tile_schedulers`` as in the
        class docstring.
        Raises ``BackendNotFoundError`` / ``BackendUnavailableError`` when no backend can start
        (``BackendStartError`` when the chosen one's factory or ``allocate()`` raised, and it was
        requested by name, or ``SWA_HAL_STRICT=1`` is set, or no candidate started), and ``DeviceError``
        for a device no build can run on (not a torch device, or ``meta``)."""
        self.config = config
        # Switches are bools (None: the environment's default): a truthy string such as "no" must not
        # quietly turn the guard, validation or the planner objects on.
        for name, value, optional in (
            ("validate", validate, True),
            ("guard", guard, True),
            ("tile_schedulers", tile_schedulers, False),
        ):
            if value.__class__ is not bool and not (optional and value is None):
                raise ConfigError(name, f"must be a bool{' or None' if optional else ''}, got {value!r}")
        # The device is checked before any selection or allocation, so a device no build can run on is
        # named here instead of failing deep inside the first allocation or read-back.
        device = builder_device(device)
        self.device = device
        self.platform = platform if platform is not None else probe_platform(device)
        self.selection = select_backend(backend, self.platform, registry=registry)
        self.buffers = MetadataBuffers(config, device)
        # The backend's allocate(buffers) runs inside create, under the same rule as its factory.
        self.backend = self.selection.create(config, device, self.buffers)
        self.backend_name: str = self.backend.name
        self.validate = debug_mode() if validate is None else validate
        self.guard = guard_default() if guard is None else guard
        self.backend.guard = self.guard
        self.tile_schedulers = tile_schedulers
        self._make_schedulers = self.backend.make_tile_schedulers if tile_schedulers else no_schedulers
        self._device_index = -1 if device.type == "cpu" else (device.index or 0)
        # Every entry point holds it: one call at a time, on the builder's GPU.
        self._lock = BuilderLock(self._device_index)
        self.decode_threshold = config.decode_threshold
        self._group_buffers = [self.buffers.group(g) for g in range(config.num_kv_groups)]
        self._lens_high_water = [0] * config.num_kv_groups
        # The version counter of the zero bounds handed out as md.replay_start of a build without bounds.
        self._no_replay_version = self.buffers.no_replay_start._version
        # Views of the fixed buffers by build shape, and objects derived from engine tensors by their
        # identity (swa_hal/cache.py): what a build would otherwise make again every step.
        self._cache = HostCache()
        self._slot_limit = slot_limit(config)
        # Most backends declare no extras: then a build skips the call (metadata's default is ()).
        self._has_extras = type(self.backend).extras is not Backend.extras
        # Reads the violation record a build late, without a sync (``poll_violations``).
        self.violations = ViolationWatch(self.buffers.violation, config)

    # -- build -----------------------------------------------------------------------------------

    def build(self, batch: AttentionBatch, validate: bool | None = None) -> SWAMetadata:
        """The step's metadata (docs/semantics.md): split, per-token helpers, decode and prefill rows and
        lens, prefill gather lengths, fresh planner objects; views of the fixed buffers, valid until the
        next build. One launch on the Triton backends, no host sync. ``validate`` overrides the builder's
        setting for this build (full validation syncs); the O(1) preflight always runs, and a guarded
        build records what it emptied for ``check()``."""
        with self._lock("build"):
            _argument("batch", batch, AttentionBatch)
            return self._build(batch, validate, single_group, batch.block_table, batch.slot_mapping)[0]

    def check(self) -> None:
        """Raise the error of the first violation a guarded build recorded since the last check, as
        full validation would have (docs/semantics.md #guarded-builds); then clear the record.
        Reads a small device buffer: one host sync, when the engine chooses. A violation
        ``poll_violations`` already took off the device counts (it was recorded first). Holds the
        builder's lock (a build running meanwhile could record into the buffer this clears)."""
        with self._lock("check"):
            first = self.violations.take()
            record = self.buffers.violation
            values = record.tolist()
            if values[0]:
                record.zero_()
        if first is not None:
            values = first
        if not values[0]:
            return
        error = violation_error(values, self.config, self.violations.group_names)
        if error is not None:
            raise error

    def poll_violations(self) -> None:
        """Surface guard violations without a sync (``swa_hal.violations.ViolationWatch``): call once per
        build, after it. Logs a warning per kind of violation the previous poll saw (the typed error
        ``check()`` would raise, naming the field, request and value), or raises that error under
        ``SWA_HAL_STRICT=1``; nothing during CUDA graph capture, nothing when builds are not guarded. On a
        GPU only every ``SWA_HAL_POLL_EVERY``-th call (default 16) looks, since looking costs more host
        time than a build: a violation surfaces within about twice that many builds."""
        if not self.guard:
            return
        with self._lock("poll_violations"):
            if self.violations.due():  # on a GPU, every SWA_HAL_POLL_EVERY-th build looks
                self.violations.poll()

    def build_groups(
        self,
        batch: AttentionBatch,
        block_tables: Sequence[torch.Tensor] | torch.Tensor,
        slot_mappings: Sequence[torch.Tensor] | torch.Tensor,
        validate: bool | None = None,
    ) -> list[SWAMetadata]:
        """One build per SWA KV-cache group of a step (docs/semantics.md #group-builds), in one launch
        on the Triton backends: the groups share ``batch.inputs`` (seq_lens, query_start_loc, replay
        bounds, image spans, ...); group g has its own ``block_tables[g]`` and ``slot_mappings[g]``, given
        as lists of tensors or stacked (int32 [G, R', P] and int64 [G, T]; the cheaper form on the host).
        Returns one SWAMetadata per group, each a view of that group's fixed buffers
        (``batch.block_table`` and ``batch.slot_mapping`` are not read). Needs
        ``SWAConfig.num_kv_groups >= G``."""
        with self._lock("build_groups"):
            _argument("batch", batch, AttentionBatch)
            return self._build(batch, validate, group_inputs, block_tables, slot_mappings)

    def _build(
        self,
        batch: AttentionBatch,
        validate: bool | None,
        find_groups: Callable[..., GroupInputs],
        block_tables: Sequence[torch.Tensor] | torch.Tensor,
        slot_mappings: Sequence[torch.Tensor] | torch.Tensor,
    ) -> list[SWAMetadata]:
        """A build of every KV-cache group of a step; a single build is a group build of one (its groups
        found by ``preflight.single_group``, a group build's by ``preflight.group_inputs``: one signature).
        The step's inputs are checked once, then each group's: the O(1) preflight, or full validation (it
        syncs) of each group's batch, naming the group where the build names its groups."""
        inputs = batch.inputs
        full = validate if validate is not None else self.validate
        # A validated build runs the same O(1) preflight first, so it types every input the default path
        # types and refuses nothing that path takes (docs/semantics.md #inputs).
        num_reqs = inputs.preflight(self.config, self.buffers.capacity, self._device_index, validated=bool(full))
        found = find_groups(
            block_tables,
            slot_mappings,
            num_reqs,
            inputs.num_tokens,
            self._device_index,
            self.config.num_kv_groups,
            self._cache,
        )
        tables, slots = found.tables, found.slots
        first = batch.with_group(tables[0], slots[0])
        if full:
            for g, (t, s) in enumerate(zip(tables, slots)):
                try:
                    self._validate(batch.with_group(t, s))
                except BatchValidationError as exc:
                    if not found.named:
                        raise
                    raise type(exc)(exc.field, f"group {g}: {exc.constraint}", exc.index) from exc
        plan, query = self._plan(inputs, num_reqs, len(tables))
        self.backend.compute_groups(plan, first, found, self.buffers)
        return self._metadatas(inputs, plan, query, tables, slots)

    def _validate(self, batch: AttentionBatch) -> None:
        """Full validation of one group's batch (it syncs)."""
        validate_batch(batch, self.config, self.buffers.capacity)
        seq_lens = batch.inputs.seq_lens
        if seq_lens.device != self.device:
            raise BatchDeviceError("seq_lens", f"seq_lens is on {seq_lens.device}; the builder is on {self.device}")

    def build_slot_rows(
        self, rows: SlotRows, *, out: torch.Tensor | None = None, lens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token-slot rows (docs/semantics.md #token-slot-rows): the window rows of engines that
        address their cache through ``req_to_token`` and a slot map (SGLang), one row per query token,
        in one launch on the Triton backends, without a host sync. Returns ``(indices, lens)``
        (int32 [n, width] and [n]): into ``out``/``lens`` when given, else into new tensors. Guarded
        builds record violations for ``check()`` as ``build`` does."""
        _argument("rows", rows, SlotRows)
        width = preflight_slot_rows(rows, self.config.window_size, self.device, self._slot_limit)
        n = rows.num_rows
        if out is None and lens is None:
            out, lens = new_slot_rows_outputs(n, width, self.device)
        else:
            if out is None:
                out = torch.empty((n, width), dtype=torch.int32, device=self.device)
            if lens is None:
                lens = torch.empty(n, dtype=torch.int32, device=self.device)
            check_outputs(out, lens, n, width, self.device)
        with self._lock("build_slot_rows"):
            self.backend.compute_slot_rows(rows, out, lens, self.buffers.violation, self._slot_limit)
        return out, lens

    def build_request_window(self, rows: RequestWindowRows, validate: bool | None = None) -> RequestWindowLayout:
        """A request-window layout (docs/semantics.md #request-window-layouts): DeepSeek-V4.1's window
        rows over a per-request workspace of history rows, all of SGLang's ``WindowLayout`` fields, in
        new tensors, without a host sync. ``validate`` (default: the builder's) also checks the rules
        that need the data (a host sync): the runs fit ``num_groups``, positions ascend within a run."""
        _argument("rows", rows, RequestWindowRows)
        preflight_request_window(rows, self.config.window_size, self.device)
        if validate if validate is not None else self.validate:
            validate_request_window(rows)
        with self._lock("build_request_window"):
            return self.backend.compute_request_window(rows)

    def _plan(self, inputs: StepInputs, num_reqs: int, count: int) -> tuple[BuildPlan, Any]:
        """The host side of a build of ``count`` KV-cache groups: the split (docs/semantics.md #split) from
        host values only."""
        num_tokens = inputs.num_tokens
        mql = inputs.max_query_len
        threshold = self.decode_threshold
        nd, npf, ndt, npt = num_reqs, 0, num_tokens, 0
        query = None
        # The kernel guesses each token's request from a common query length (and checks it).
        dec_guess, pre_guess = mql, 1
        if mql > threshold:
            qsl = self._host_array(inputs.query_start_loc_cpu)
            query = qsl[1:] - qsl[:-1]
            nd, npf, ndt, npt = split_decodes_and_prefills(qsl, mql, num_tokens, threshold, query)
            if qsl[0] != 0 or not 0 <= ndt <= num_tokens:
                # The rows' ranges come from this split: a host copy that does not start at 0, or whose
                # decode part ends outside the batch, would give a negative or oversized part.
                refuse_host_split(qsl, ndt, num_tokens)
            dec_guess, pre_guess = int(query[0]), (int(query[nd]) if nd < num_reqs else 1)
        causal = inputs.causal
        width = self.config.window_size if causal else self._noncausal_width(inputs, nd)
        # Decode lens rows ever written, per group; a build zeroes [num_decode_tokens, that) (#fixed-buffers).
        high = self._lens_high_water
        if count == 1:  # one group, one mark (the loop below costs a single build 0.5 us)
            clear_end = high[0]
            if ndt > clear_end:
                high[0] = ndt
        else:
            clear_end = max(high[:count])
            for g in range(count):
                if ndt > high[g]:
                    high[g] = ndt
        replay = inputs.replay_start
        num_bounds = INT32_LIMIT
        if replay is None:
            zeros = self.buffers.no_replay_start
            if zeros._version != self._no_replay_version:
                # A caller wrote into the md.replay_start an earlier build handed out (every in-place torch
                # write bumps the counter): zero it again before a kernel reads it (#fixed-buffers).
                zeros.zero_()
                self._no_replay_version = zeros._version
            replay = self._cache.get(("replay", num_reqs))
            if replay is None:
                replay = self._cache.keep(("replay", num_reqs), self.buffers.no_replay_start[:num_reqs])
        elif replay.shape[0] < num_reqs:
            # Padding requests past the bounds have none (docs/semantics.md #bounded-replay; preflight checked
            # that they have no tokens in the host copy, and the guard holds the device offsets to it, rule 14):
            # the bounds and zeros in a buffer every such build rewrites, on the device and without a sync, so
            # a captured graph replays it.
            num_bounds = replay.shape[0]
            padded = self.buffers.padded_replay_start[:num_reqs]
            padded[:num_bounds].copy_(replay)
            padded[num_bounds:].zero_()
            replay = padded
        elif replay.shape[0] > num_reqs:
            # An engine's persistent buffer handed in whole: md.replay_start holds the step's R bounds.
            replay = self._head(replay, num_reqs)
        host_seq = None
        if npf and self.guard and inputs.seq_lens_cpu is not None:
            host_seq = self._held_host_seq(inputs.seq_lens_cpu, num_reqs)
        spans = inputs.image_spans
        images = spans is not None and npt > 0 and self.config.max_image_tokens > 0 and spans.starts.shape[0] > 0
        plan = BuildPlan(
            inputs=inputs,
            num_reqs=num_reqs,
            num_decodes=nd,
            num_prefills=npf,
            num_decode_tokens=ndt,
            num_prefill_tokens=npt,
            decode_width=width,
            decode_lens_clear_end=clear_end,
            replay_start=replay,
            images=images,
            decode_guess_len=dec_guess,
            prefill_guess_len=pre_guess,
            decode_query_max=min(mql, threshold),
            host_seq_lens=host_seq,
            num_bounds=num_bounds,
        )
        return plan, query

    def _held_host_seq(self, seq_cpu: torch.Tensor, num_reqs: int) -> torch.Tensor | None:
        """The host copy of seq_lens where the guard's rows read it (rule 15, docs/semantics.md #guarded-builds):
        copied into the builder's buffer in stream order, without a sync (a memory copy on a CPU builder),
        so the kernels read a buffer of the builder's, never the caller's host memory; none during CUDA
        graph capture, where a copy from host memory cannot be recorded: rule 15 is then not checked.
        A device builder stages the values in pageable memory of its own first: a non-blocking copy from
        an engine's pinned buffer would read it when the stream gets there, after the engine may have
        rewritten it for its next step (a false record, rows emptied); one from pageable memory has read
        it by the time the call returns."""
        held = self.buffers.host_seq_lens[:num_reqs]
        if self.device.type == "cpu":
            held.copy_(seq_cpu[:num_reqs])
            return held
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        stage = self.buffers.host_seq_stage[:num_reqs]
        stage.copy_(seq_cpu[:num_reqs])
        held.copy_(stage, non_blocking=True)
        return held

    def _host_array(self, t: torch.Tensor) -> np.ndarray:
        """``t.numpy()``, reused for the same memory seen the same way (swa_hal/cache.py)."""
        key = ("numpy", tensor_key(t))
        arr = self._cache.get(key)
        return arr if arr is not None else self._cache.keep(key, t.numpy())

    def _metadatas(
        self,
        inputs: StepInputs,
        plan: BuildPlan,
        query: Any,
        tables: Sequence[torch.Tensor],
        slots: Sequence[torch.Tensor],
    ) -> list[SWAMetadata]:
        """One SWAMetadata per KV-cache group (one for a plain build): group g's shape fields (its views
        of its fixed buffers, sizes, static facts; made once per build shape), the step's tensors and
        group g's block table and slot mapping, fresh planner objects and the backend's extras."""
        nd, npf = plan.num_decodes, plan.num_prefills
        max_decode_query_len = plan.decode_query_max
        prefill_seq_lens = prefill_seq_lens_cpu = prefill_query_lens_cpu = None
        if npf:
            seq_cpu = inputs.seq_lens_cpu
            if seq_cpu is None:
                seq_cpu = inputs.seq_lens.cpu()
            prefill_seq_lens, prefill_seq_lens_cpu = self._tails(inputs.seq_lens, seq_cpu, nd, plan.num_reqs)
            prefill_query_lens_cpu = torch.from_numpy(query[nd:])
        groups = len(tables)
        key = (
            "metadata",
            groups,
            inputs.num_tokens,
            nd,
            npf,
            plan.num_decode_tokens,
            plan.num_prefill_tokens,
            inputs.causal,
            plan.images,
            plan.decode_width,
            max_decode_query_len,
        )
        shapes = self._cache.get(key)
        if shapes is None:  # group 0's shape fields, then every other group's views of its own buffers
            made = [self._shape(plan, g, max_decode_query_len) for g in range(groups)]
            shapes = self._cache.keep(key, (made[0], [group_views(shape) for shape in made]))
        shape, views = shapes
        make_schedulers, ndt = self._make_schedulers, plan.num_decode_tokens
        md = SWAMetadata.for_step(
            shape,
            inputs=inputs,
            replay_start=plan.replay_start,
            block_table=tables[0],
            slot_mapping=slots[0],
            tile_sched=make_schedulers(ndt),
            prefill_seq_lens=prefill_seq_lens,
            prefill_seq_lens_cpu=prefill_seq_lens_cpu,
            prefill_query_lens_cpu=prefill_query_lens_cpu,
            # Every per-request output holds the step's R entries (an engine may hand in longer buffers).
            seq_lens=None if inputs.seq_lens.shape[0] == plan.num_reqs else self._head(inputs.seq_lens, plan.num_reqs),
        )
        extras = self.backend.extras if self._has_extras else None
        if extras is not None:
            md.extras = extras(md, self._group_buffers[0])
        out = [md]
        for g in range(1, groups):
            other = md.for_group(
                views[g], block_table=tables[g], slot_mapping=slots[g], tile_sched=make_schedulers(ndt)
            )
            if extras is not None:
                other.extras = extras(other, self._group_buffers[g])
            out.append(other)
        return out

    def _shape(self, plan: BuildPlan, group: int, max_decode_query_len: int) -> dict[str, Any]:
        """The fields of group ``group``'s metadata that follow from the build's shape alone (views of
        the fixed buffers, sizes, static facts)."""
        cfg = self.config
        ndt, npt, causal, num_tokens = (
            plan.num_decode_tokens,
            plan.num_prefill_tokens,
            plan.inputs.causal,
            plan.inputs.num_tokens,
        )
        b = self._group_buffers[group]
        fields: dict[str, Any] = {}
        if npt:
            fields["prefill_swa_indices"] = b.prefill_indices[:npt]
            fields["prefill_swa_lens"] = b.prefill_lens[:npt]
            if plan.images:
                fields["prefill_left_visible"] = self.buffers.left_visible[:num_tokens]
                fields["prefill_right_visible"] = self.buffers.right_visible[:num_tokens]
        if plan.num_prefills:
            fields["prefill_gather_lens"] = self.buffers.gather_lens[: plan.num_prefills]
        return shape_fields(
            token_to_req_indices=b.token_to_req[:num_tokens],
            is_valid_token=b.is_valid[:num_tokens],
            decode_swa_indices=b.decode_rows(causal)[:ndt],
            decode_swa_lens=b.decode_lens[:ndt],
            num_decodes=plan.num_decodes,
            num_prefills=plan.num_prefills,
            num_decode_tokens=ndt,
            num_prefill_tokens=npt,
            decode_swa_width=plan.decode_width,
            causal=causal,
            max_decode_query_len=max_decode_query_len,
            block_size=cfg.block_size,
            window_size=cfg.window_size,
            max_model_len=cfg.max_model_len,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            backend=self.backend_name,
            **fields,
        )

    def image_spans_from_ranges(self, ranges: Mapping[int, Sequence[tuple[int, int]]], num_reqs: int) -> ImageSpans:
        """Copy ``{request: [(start, end), ...]}`` (inclusive positions, the form engines keep) into
        the builder's fixed span buffers and return them as the batch's ``image_spans``."""
        indptr, starts, ends = spans_to_csr(ranges, num_reqs)
        buffers = self.buffers
        if len(starts) > buffers.span_starts.shape[0] or num_reqs + 1 > buffers.span_indptr.shape[0]:
            raise BatchCapacityError(
                "image_spans",
                f"{len(starts)} spans over {num_reqs} requests exceed the span buffers "
                f"(max_num_batched_tokens={self.config.max_num_batched_tokens}, max_image_tokens="
                f"{self.config.max_image_tokens}, max_num_seqs={self.config.max_num_seqs})",
            )
        n = len(starts)
        # The span buffers are the builder's: a build reading them meanwhile would see half-written spans.
        with self._lock("image_spans_from_ranges"):
            buffers.span_indptr[: num_reqs + 1].copy_(torch.tensor(indptr, dtype=torch.int32), non_blocking=True)
            if n:
                buffers.span_starts[:n].copy_(torch.tensor(starts, dtype=torch.int32), non_blocking=True)
                buffers.span_ends[:n].copy_(torch.tensor(ends, dtype=torch.int32), non_blocking=True)
        return ImageSpans(buffers.span_indptr[: num_reqs + 1], buffers.span_starts[:n], buffers.span_ends[:n])

    def _noncausal_width(self, inputs: StepInputs, num_decodes: int) -> int:
        """DSpark rows (docs/semantics.md #dspark-rows): only legal with DSpark, and never truncated. A decode's
        row needs min(q_r + W, S_r) entries, and its host ``seq_lens_cpu`` is only an upper bound of S_r
        (vLLM's async scheduling hands in one): the host refuses only a row that cannot fit whatever S_r is,
        q_r > width (S_r >= q_r); every other row too wide is the device's to find (rule 7 of a guarded
        build: emptied and recorded), never a refusal of a step that may be valid."""
        cfg = self.config
        if not cfg.is_dspark:
            raise SpeculativeModeError(
                "causal",
                f"causal=False is only legal with DSpark drafting; speculative_method={cfg.speculative_method!r}",
            )
        width = cfg.noncausal_index_width
        if min(inputs.max_query_len, self.decode_threshold) > width and num_decodes:
            qsl_cpu = inputs.query_start_loc_cpu.numpy()
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

    def _tails(
        self, seq_lens: torch.Tensor, seq_cpu: torch.Tensor, start: int, end: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``seq_lens[start:end]`` and ``seq_cpu[start:end]`` (``end``: R, the step's requests; an engine
        may hand in longer buffers), reused for the same memory seen the same way (swa_hal/cache.py)."""
        if not start and seq_lens.shape[0] == end and seq_cpu.shape[0] == end:
            return seq_lens, seq_cpu  # every request a prefill: the tails are the tensors themselves
        # seq_lens passed the preflight (int32, unit stride, the builder's device): its address and
        # shape name it; the host copy is unchecked, so it is keyed in full.
        key = ("tails", start, end, seq_lens.data_ptr(), seq_lens.shape, tensor_key(seq_cpu))
        tails = self._cache.get(key)
        if tails is None:
            tails = self._cache.keep(key, (seq_lens[start:end], seq_cpu[start:end]))
        return tails

    def _head(self, t: torch.Tensor, n: int) -> torch.Tensor:
        """``t[:n]`` of a per-request input longer than the step's ``n`` requests (an engine's persistent
        buffer), reused for the same memory seen the same way (swa_hal/cache.py)."""
        key = ("head", n, tensor_key(t))
        head = self._cache.get(key)
        return head if head is not None else self._cache.keep(key, t[:n])

    # -- speculative decoding --------------------------------------------------------------------

    @property
    def supports_draft_decode_metadata_update(self) -> bool:
        """Whether ``update_draft_decode_metadata`` works on this backend (docs/semantics.md #draft-updates)."""
        return self.backend.supports_draft_decode_metadata_update

    def update_draft_decode_metadata(self, metadata: SWAMetadata | Sequence[SWAMetadata]) -> None:
        """docs/semantics.md #draft-updates: after the engine advanced ``seq_lens`` in place by one
        draft step, recompute token_to_req, is_valid and the decode rows and lens in place (causal
        rows honour ``metadata.replay_start``; DSpark rows are recomputed as DSpark rows) and hand
        out fresh scheduler objects. No host sync, no allocation: safe inside CUDA graph capture.
        A list (what ``build_groups`` returned) updates every group, in one launch on Triton backends."""
        if not isinstance(metadata, SWAMetadata):
            if not isinstance(metadata, Sequence) or not all(isinstance(md, SWAMetadata) for md in metadata):
                raise TypeError(
                    f"metadata must be an SWAMetadata or a list of them (what build_groups returned), got "
                    f"{type(metadata).__name__}"
                )
            self._update_groups(list(metadata))
            return
        if metadata.num_decode_tokens == 0:
            return
        if not self.backend.supports_draft_decode_metadata_update:
            raise NotImplementedError(f"backend {self.backend_name!r} does not support in-place draft-step updates")
        g = self._group_of(metadata, "metadata")
        with self._lock("update_draft_decode_metadata"):
            preflight_update(metadata, self._device_index, self.buffers.capacity)
            buffers = self._group_buffers[g]
            self.backend.recompute_decode_rows(metadata, buffers)
            metadata.tile_sched = self._make_schedulers(metadata.num_decode_tokens)
            metadata.extras = self.backend.extras(metadata, buffers)

    def _group_of(self, metadata: SWAMetadata, name: str) -> int:
        """The KV-cache group whose buffers ``metadata``'s decode rows are: an update writes that group's
        buffers (a single update of group g's metadata updates group g)."""
        try:
            lens, rows = metadata.decode_swa_lens.data_ptr(), metadata.decode_swa_indices.data_ptr()
            causal = metadata.causal
        except AttributeError:
            raise TypeError(f"update_draft_decode_metadata: {name} is not an SWAMetadata") from None
        for g, buffers in enumerate(self._group_buffers):
            if lens == buffers.decode_lens.data_ptr():
                if rows != buffers.decode_rows(bool(causal)).data_ptr():
                    raise ValueError(
                        f"update_draft_decode_metadata: {name}'s decode rows are not group {g}'s "
                        f"{'causal' if causal else 'DSpark'} rows (causal={causal!r} does not match its build)"
                    )
                return g
        raise ValueError(f"update_draft_decode_metadata: {name} was not built by this builder")

    def _update_groups(self, metadatas: list[SWAMetadata]) -> None:
        if not metadatas or metadatas[0].num_decode_tokens == 0:
            return
        if not self.backend.supports_draft_decode_metadata_update:
            raise NotImplementedError(f"backend {self.backend_name!r} does not support in-place draft-step updates")
        for g, md in enumerate(metadatas):
            if self._group_of(md, f"metadata {g}") != g:
                raise ValueError(
                    f"update_draft_decode_metadata: metadata {g} is not group {g} of a build_groups() of this builder"
                )
        _same_build(metadatas)
        with self._lock("update_draft_decode_metadata"):
            for md in metadatas:
                preflight_update(md, self._device_index, self.buffers.capacity)
            self.backend.recompute_groups(metadatas, self.buffers)
            for g, md in enumerate(metadatas):
                md.tile_sched = self._make_schedulers(md.num_decode_tokens)
                md.extras = self.backend.extras(md, self._group_buffers[g])

    # -- warmup ----------------------------------------------------------------------------------

    def warmup(self, progress: Callable[[str], None] | None = None) -> int:
        """Compile every kernel variant this config can launch (see ``kernels/launch.py``), so no build of any
        shape up to capacity compiles afterwards. Returns the number of variants prepared."""
        with OnDevice(self._device_index):  # not under the build lock: its own instance
            return self.backend.warmup(self.buffers, progress)


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


def _same_build(metadatas: Sequence[SWAMetadata]) -> None:
    """A grouped update launches every group with group 0's sizes and reads every group's step inputs
    as group 0's: the metadata must come from one build_groups() (one ``inputs`` object, the same split),
    or a group would be read and written past what its build made."""
    first = metadatas[0]
    for g, md in enumerate(metadatas[1:], 1):
        if first.inputs is None or md.inputs is not first.inputs:
            raise BatchShapeError(
                "inputs",
                f"update_draft_decode_metadata: metadata {g}'s step inputs are not group 0's: a grouped update "
                f"takes the metadata of one build_groups() (its groups share the step's inputs)",
                g,
            )
        for field in ("num_decode_tokens", "num_decodes", "causal", "max_decode_query_len"):
            if getattr(md, field) != getattr(first, field):
                raise BatchShapeError(
                    field,
                    f"update_draft_decode_metadata: metadata {g} has {field}={getattr(md, field)!r}, "
                    f"group 0 {getattr(first, field)!r}: a grouped update takes the metadata of one build_groups()",
                    g,
                )
