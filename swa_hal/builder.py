"""SWAMetadataBuilder: the entry points of every build, each the same few steps over one backend.

A build runs the O(1) preflight of its inputs (``step_inputs.py``, ``preflight.py``) or full validation
(``validation.py``), makes its plan from host values (``plan.py``: the split, the bounds the build reads),
calls the backend once (``backend.py``: one launch on the Triton backends) and hands out its metadata, views
of the fixed buffers (``metadata.py``, ``buffers.py``). The host side reads only host values (the CPU
query_start_loc, sizes), so a decode-only build never synchronises and can be captured in a CUDA graph
(docs/semantics.md #fixed-buffers). Token-slot rows, request-window layouts and draft-step updates take the
same steps with their own checks; the builder owns the lock, the violation record and the warmup.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .assembly import MetadataAssembly
from .backend import Backend
from .batch import AttentionBatch, ImageSpans, spans_to_csr
from .buffers import MetadataBuffers
from .builder_lock import BuilderLock, OnDevice
from .cache import HostCache
from .config import SWAConfig
from .envs import env_flag, env_switch
from .errors import BatchCapacityError, BatchDeviceError, BatchValidationError, ConfigError
from .metadata import SWAMetadata
from .plan import Planner, same_build
from .platform import PlatformInfo, builder_device, probe_platform
from .plugins import PluginRegistry
from .preflight import GroupInputs, group_inputs, single_group
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
from .validation import validate_batch
from .violations import ViolationWatch


def debug_mode() -> bool:
    return env_flag("SWA_HAL_DEBUG")


def guard_default() -> bool:
    """Guarded builds unless ``SWA_HAL_GUARD`` is set to a false word."""
    return env_switch("SWA_HAL_GUARD")


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
        # Views of the fixed buffers by build shape, and objects derived from engine tensors by their
        # identity (swa_hal/cache.py): what a build would otherwise make again every step.
        self._cache = HostCache()
        self._slot_limit = slot_limit(config)
        # A build's host side (swa_hal/plan.py) and its metadata (swa_hal/metadata.py), called through their
        # bound methods. Most backends declare no extras: then a build skips the call (metadata's default is ()).
        self._plan = Planner(config, self.buffers, device, self.guard, self._cache).plan
        extras = self.backend.extras if type(self.backend).extras is not Backend.extras else None
        self._metadatas = MetadataAssembly(
            config, self.buffers, self._group_buffers, self._cache, self._make_schedulers, extras, self.backend_name
        ).metadatas
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
        return self._metadatas(plan, query, tables, slots)

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

    # -- speculative decoding --------------------------------------------------------------------

    @property
    def supports_draft_decode_metadata_update(self) -> bool:
        """Whether ``update_draft_decode_metadata`` works on this backend (docs/semantics.md #draft-updates)."""
        return self.backend.supports_draft_decode_metadata_update

    def update_draft_decode_metadata(self, metadata: SWAMetadata | Sequence[SWAMetadata]) -> None:
        """docs/semantics.md #draft-updates: after the engine advanced ``seq_lens`` in place by one
        draft step, recompute token_to_req, is_valid and the decode rows and lens in place (causal
        rows honour the build's replay bounds; DSpark rows are recomputed as DSpark rows) and hand
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
            metadata.preflight_update(self._device_index, self.buffers.capacity)
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
        same_build(metadatas)
        with self._lock("update_draft_decode_metadata"):
            for md in metadatas:
                md.preflight_update(self._device_index, self.buffers.capacity)
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
