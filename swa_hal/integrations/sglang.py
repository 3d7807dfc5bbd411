"""swa_hal inside SGLang: the SWA indices and lens of SGLang's DeepSeek-V4 attention backend, built
by swa_hal (docs/engines.md, "Using swa_hal in SGLang").

SGLang 0.5.23 builds them with its own ops (``BuildCausalSwaPageIndices`` for causal rows: decode,
extend and mixed batches, target verify, draft extend, late-layer tails; ``ComputeDsparkWindowGather`` +
``BuildDsparkSwaPageIndices`` for DSpark draft blocks of the paged SWA pool; ``BuildDsparkSwaRingIndices``
for those of the per-request SWA ring, ``swa_req_ring_size``). This module gives the same rows and lens
from swa_hal's auto-selected backend, and installs itself through SGLang's plugin framework: the entry
point ``swa_hal`` of the group ``sglang.srt.plugins`` (select it with ``SGLANG_PLUGINS=swa_hal``; turn it
off with ``SWA_HAL_SGLANG=0``) registers seven AROUND hooks (``HOOKS``) with
``sglang.srt.plugins.hook_registry.HookRegistry``. One gives DeepSeek-V4.1's request-window layout
(``window_layout``, docs/semantics.md #request-window-layouts) from ``SWAMetadataBuilder.build_request_window``;
one the ring's DSpark rows (docs/semantics.md #ring-rows) from ``build_slot_rows`` with a ``SlotRing``. Each has
SGLang's own function to hand a call it does not know to (docs/engines.md #drift), and on a release outside the
tested set each lets SGLang's code serve while swa_hal's answer is compared with it (docs/engines.md #shadow-mode).

SGLang's inputs are exactly swa_hal's token-slot rows (docs/semantics.md #token-slot-rows): one row per
query token given by its position (``seq_lens_casual - 1``), its request-pool row and its floor
(``swa_replay_start``, or DSpark's per-request ``valid_from``), slots read through ``req_to_token``
and ``full_to_swa_index_mapping``. So a call is one ``SWAMetadataBuilder.build_slot_rows``: one kernel
launch on the Triton backends, newest first for causal rows, context then block for DSpark, no host
synchronisation and no translation pass. SGLang keeps the returned tensors in its metadata (the main
and the late-layer-tail metadata of one step live side by side), so they are new tensors on every
call, as SGLang's own ops return. Under SGLang's prefill context parallelism every rank calls the hooks
with the whole step's rows, padded, and keeps its own rows of the results afterwards (docs/engines.md
#context-parallelism): nothing here depends on the rank.

SGLang never calls ``check()``, so each call also polls the guarded builds' violation record without a
sync (``SWAMetadataBuilder.poll_violations``, ``swa_hal.violations.ViolationWatch``): a violation a call
recorded is logged through this module's logger (once per kind, naming the field, the row and the value)
by a later call, or raised there under ``SWA_HAL_STRICT=1``.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import logging
import numbers
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from ..builder import SWAMetadataBuilder
from ..cache import HostCache
from ..config import INT32_LIMIT, MAX_ROW_WIDTH, SWAConfig
from ..errors import BatchDeviceError, BatchDtypeError, ConfigError, DeviceError, SWAHalError
from ..platform import PlatformInfo, probe_platform
from ..request_window import DEFAULT_CAPACITY, RequestWindowLayout, RequestWindowRows
from ..slot_ring import MAX_RING_SIZE, SlotRing
from ..slot_rows import SlotRows
from ._common import InstallOnce, announce, auto_backend, enabled, gate_mode, kept_log
from .aside import around, attempt, engine_call, signature_gaps, step_aside
from .shadow import Check, Shadow, fields_of

# A child of SGLang's plugin logger, so the line appears in SGLang's own log format.
log = logging.getLogger("sglang.srt.plugins.swa_hal")

ENGINE = "SGLang"
DISTRIBUTION = "sglang"
SUPPORTED_VERSIONS = ("0.5.23",)
SWITCH = "SWA_HAL_SGLANG"
# SGLang's constants (sglang/srt/layers/attention/deepseek_v4_backend.py).
SGLANG_SWA_WINDOW = 128
SGLANG_PAGE_INDEX_ALIGNED_SIZE = 64

_OPS = "sglang.kernels.ops.attention.dsv4.attn_metadata_kernels"
_DSPARK_OPS = "sglang.kernels.ops.speculative.dspark.dspark_attn_metadata"
_BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend"
TARGET_CAUSAL = f"{_OPS}.BuildCausalSwaPageIndices.execute"
TARGET_CORE = f"{_BACKEND}.DeepseekV4AttnBackend.make_core_attn_metadata"
TARGET_DSPARK = f"{_BACKEND}.DeepseekV4AttnBackend.get_dspark_swa_page_indices"
# The per-request SWA ring's DSpark rows: what get_dspark_swa_page_indices calls for a ring pool.
TARGET_DSPARK_RING = f"{_DSPARK_OPS}.BuildDsparkSwaRingIndices.execute"
# DeepSeek-V4.1's request window: the layout both V4 attention backends (and the idle forward) build.
_REQUEST_WINDOW = "sglang.srt.mem_cache.dsv41_request_window"
TARGET_WINDOW = f"{_REQUEST_WINDOW}.window_layout"
# ROCm's DeepSeek-V4 backend: its plain causal rows come from its own method (no op call), and it takes its
# DSpark method as a class attribute copied from the CUDA backend when its module is imported, so a module
# imported before SGLang applies the hooks would keep SGLang's own; both are hooked on the HIP class itself.
_HIP_BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend_hip_radix"
TARGET_HIP_CAUSAL = f"{_HIP_BACKEND}.DeepseekV4HipRadixBackend.get_swa_page_indices"
TARGET_HIP_DSPARK = f"{_HIP_BACKEND}.DeepseekV4HipRadixBackend.get_dspark_swa_page_indices"
TARGETS = (
    TARGET_CAUSAL,
    TARGET_CORE,
    TARGET_DSPARK,
    TARGET_DSPARK_RING,
    TARGET_WINDOW,
    TARGET_HIP_CAUSAL,
    TARGET_HIP_DSPARK,
)
# What each hook serves, for the start-up line.
TARGET_NAMES = {
    TARGET_CAUSAL: "causal rows",
    TARGET_CORE: "causal lens",
    TARGET_DSPARK: "DSpark paged rows",
    TARGET_DSPARK_RING: "DSpark ring rows",
    TARGET_WINDOW: "V4.1 request-window layouts",
    TARGET_HIP_CAUSAL: "ROCm causal rows",
    TARGET_HIP_DSPARK: "ROCm DSpark rows",
}


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


def _setting(name: str, value: Any, high: int = MAX_ROW_WIDTH) -> int:
    """An adapter setting (the window, the row alignment, the DSpark block size, the ring's sizes): an
    integer in ``[1, high]``, else a ConfigError naming it. 0 would divide by zero (the alignment) or
    silently give causal rows (the block); every one of them sizes a row or a ring, which the kernels bound
    (``MAX_ROW_WIDTH``, ``MAX_RING_SIZE``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ConfigError(name, f"must be a positive integer, got {value!r}")
    if int(value) > high:
        raise ConfigError(name, f"must be at most {high}, got {value!r}")
    return int(value)


def _engine_device(name: str, t: Any) -> torch.device:
    """The device of the tensor a hook builds for (SGLang's own), refused up front where no build can run:
    a meta tensor holds no data, so a builder there would have nowhere to write (and fail deep inside)."""
    if not isinstance(t, torch.Tensor):
        raise BatchDtypeError(name, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_meta:
        raise BatchDeviceError(name, f"{name} is a meta tensor (shapes only, no data): no build can read it")
    return t.device


class SGLangSWAIndices:
    """SGLang's DeepSeek-V4 SWA indices and lens, from swa_hal, for one device and window.

    ``backend``/``platform`` go to ``SWAMetadataBuilder`` (None: ``SWA_HAL_BACKEND`` or
    auto-selection). The builder is made on first use; it keeps no per-call state beyond the guard's
    violation record, which every call polls (``check()`` reads it with a sync)."""

    def __init__(
        self,
        window_size: int = SGLANG_SWA_WINDOW,
        device: str | torch.device = "cpu",
        *,
        backend: str | None = None,
        platform: PlatformInfo | None = None,
        validate: bool | None = None,
    ):
        self.window_size = _setting("window_size", window_size)
        # The causal row width at SGLang's default alignment: what nearly every call asks for, checked once.
        self._causal_width = _align(self.window_size, SGLANG_PAGE_INDEX_ALIGNED_SIZE)
        # Checked here, not at the first call that makes the builder: a device no build can run on is named
        # where the adapter is made.
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise DeviceError(f"device {device!r} is not a torch device ({' '.join(str(exc).split())})") from None
        if self.device.type == "meta":
            raise DeviceError(f"device {str(self.device)!r} holds no data (meta tensors have shapes only)")
        self.backend = backend
        self.platform = platform
        self.validate = validate
        self._builder: SWAMetadataBuilder | None = None
        self._lock = threading.Lock()

    @property
    def builder(self) -> SWAMetadataBuilder:
        got = self._builder
        if got is None:
            with self._lock:
                got = self._builder
                if got is None:
                    w = self.window_size
                    # Token-slot rows use the builder's window, guard and backend only: its own
                    # buffers (for block-table builds) are kept minimal.
                    cfg = SWAConfig(
                        window_size=w, block_size=64, max_model_len=w + 64, max_num_batched_tokens=1, max_num_seqs=1
                    )
                    got = SWAMetadataBuilder(
                        cfg, device=self.device, backend=self.backend, platform=self.platform, validate=self.validate
                    )
                    # Violations go to SGLang's log (this module's logger, a child of its plugin logger).
                    got.violations.logger = log
                    self._builder = got
        return got

    @property
    def backend_name(self) -> str:
        return self.builder.backend_name

    def causal(self, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """What ``BuildCausalSwaPageIndices`` returns (int32 [n, ceil(W / align) * align], newest
        first, -1 after) and the lens SGLang's backend pairs with it: ``min(p + 1, W)``, floored by
        ``swa_replay_start`` (per row) to ``p - floor + 1``. Rows with a negative position (draft-extend
        padding) get lens 0 where SGLang's own lens go negative. Takes ``causal_rows``'s inputs."""
        return self._build(self.causal_rows(**inputs))

    def causal_rows(
        self,
        *,
        req_to_token: torch.Tensor,
        full_to_swa: torch.Tensor,
        req_pool_indices_repeated: torch.Tensor,
        seq_lens_casual: torch.Tensor,
        swa_replay_start: torch.Tensor | None = None,
        page_index_aligned_size: int = SGLANG_PAGE_INDEX_ALIGNED_SIZE,
    ) -> SlotRows:
        """The token-slot rows ``causal`` builds: SGLang's causal-op arguments as a ``SlotRows``."""
        # The type before the comparison: 64.0 or a numpy scalar compares equal to 64 but is no alignment.
        if type(page_index_aligned_size) is int and page_index_aligned_size == SGLANG_PAGE_INDEX_ALIGNED_SIZE:
            width = self._causal_width
        else:
            width = _align(self.window_size, _setting("page_index_aligned_size", page_index_aligned_size))
        return SlotRows(
            row_ends=seq_lens_casual,
            pools=req_pool_indices_repeated,
            req_to_token=req_to_token,
            slot_map=full_to_swa,
            floors=swa_replay_start,
            width=width,
        )

    def dspark(self, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """What ``DeepseekV4AttnBackend.get_dspark_swa_page_indices`` returns (paged SWA pool): for each
        draft block of ``block_size`` rows, the context positions ``[prefix - ctx, prefix)`` ascending,
        ``ctx = min(prefix, W)`` (and at most ``prefix - valid_from[pool]``), then the slots of the
        block's own tokens (``out_loc``); width ``ceil_align(W + block_size, align)``; lens
        ``ctx + block_size``. Takes ``dspark_rows``'s inputs."""
        return self._build(self.dspark_rows(**inputs))

    def dspark_rows(
        self,
        *,
        req_to_token: torch.Tensor,
        full_to_swa: torch.Tensor,
        seq_lens_casual: torch.Tensor,
        req_pool_indices_repeated: torch.Tensor,
        out_loc: torch.Tensor,
        block_size: int,
        valid_from: torch.Tensor | None = None,
        page_index_aligned_size: int = SGLANG_PAGE_INDEX_ALIGNED_SIZE,
    ) -> SlotRows:
        """The token-slot rows ``dspark`` builds: SGLang's DSpark arguments as a ``SlotRows``."""
        n = seq_lens_casual.shape[0]
        block = _setting("block_size", block_size)
        align = _setting("page_index_aligned_size", page_index_aligned_size)
        return SlotRows(
            row_ends=seq_lens_casual,
            pools=req_pool_indices_repeated,
            req_to_token=req_to_token,
            slot_map=full_to_swa,
            floors=valid_from,
            block=block,
            block_slots=out_loc[:n],
            width=_align(self.window_size + block, align),
        )

    def dspark_ring(self, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """What ``BuildDsparkSwaRingIndices`` returns (the per-request SWA ring, docs/semantics.md
        #ring-rows): each draft block's context ``[prefix - ctx, prefix)`` then its own positions, each at
        ring row ``slot * ring_size + position % ring_size``, ``ctx = min(prefix, W, prefix -
        valid_from[slot])`` (at least 0); width ``ceil_align(W + block_size, align)``; lens ``ctx +
        block_size``. A guarded build empties a block whose slot is outside the ring. Takes
        ``dspark_ring_rows``'s inputs."""
        return self._build(self.dspark_ring_rows(**inputs))

    def dspark_ring_rows(
        self,
        *,
        seq_lens_casual: torch.Tensor,
        req_pool_indices_repeated: torch.Tensor,
        valid_from: torch.Tensor | None,
        ring_size: int,
        block_size: int,
        num_slots: int | None = None,
        page_index_aligned_size: int = SGLANG_PAGE_INDEX_ALIGNED_SIZE,
    ) -> SlotRows:
        """The ring rows ``dspark_ring`` builds: SGLang's ring-op arguments as a ``SlotRows``. ``num_slots``:
        the ring's request slots (default: one per ``valid_from`` entry, as SGLang sizes both by
        ``num_req_slots``)."""
        n = seq_lens_casual.shape[0]
        block = _setting("block_size", block_size)
        size = _setting("ring_size", ring_size, MAX_RING_SIZE)
        align = _setting("page_index_aligned_size", page_index_aligned_size)
        if num_slots is None:
            if not isinstance(valid_from, torch.Tensor):
                raise ConfigError("num_slots", "the ring's request slots are unknown: pass num_slots or valid_from")
            num_slots = valid_from.shape[0]
        return SlotRows(
            row_ends=seq_lens_casual,
            pools=req_pool_indices_repeated[:n],
            floors=valid_from,
            block=block,
            width=_align(self.window_size + block, align),
            ring=SlotRing(size=size, slots=_setting("num_slots", num_slots, INT32_LIMIT + 1)),
        )

    def _build(self, rows: SlotRows) -> tuple[torch.Tensor, torch.Tensor]:
        """One build, then the poll that surfaces what an earlier build recorded: a warning per kind in
        SGLang's log, or the typed error raised under ``SWA_HAL_STRICT=1``. The poll never syncs, so
        a violation shows up one call late (on a GPU, at a later poll that looks: ``SWA_HAL_POLL_EVERY``)."""
        builder = self.builder
        out = builder.build_slot_rows(rows)
        builder.poll_violations()
        return out

    def window_layout(
        self,
        req: torch.Tensor,
        pos: torch.Tensor,
        *,
        zero_row: int,
        capacity: int = DEFAULT_CAPACITY,
        floor: torch.Tensor | None = None,
        num_groups: int | None = None,
        padded_rows: int | None = None,
    ) -> RequestWindowLayout:
        """What SGLang's DeepSeek-V4.1 ``window_layout`` returns (docs/semantics.md
        #request-window-layouts), for this adapter's window: every ``WindowLayout`` field, plus ``runs``."""
        rows = RequestWindowRows(
            req, pos, zero_row, capacity=capacity, floors=floor, num_groups=num_groups, padded_rows=padded_rows
        )
        return self.builder.build_request_window(rows)


# -- the adapters the hooks use ------------------------------------------------------------------------


class _Settings:
    backend: str | None = None
    platform: PlatformInfo | None = None


_settings = _Settings()
_adapters: dict[tuple[int, str, int, int], SGLangSWAIndices] = {}
_adapters_lock = threading.Lock()


def sglang_platform(device: torch.device | None = None) -> PlatformInfo | None:
    """swa_hal's platform for the platform SGLang runs on, where swa_hal's own probe of ``device`` would
    not say it; None: that probe decides. SGLang's DeepSeek-V4 backend picks its XPU attention kernels by
    ``sglang.srt.utils.is_xpu()``, and on XPU its dsv4 metadata ops take their torch references (their
    Triton paths run for CUDA tensors only). So the same check picks swa_hal's ``xpu`` backend: the rows
    SGLang's XPU kernels read come from swa_hal's Triton kernel, whatever device the probe sees."""
    try:
        from sglang.srt.utils import is_xpu
    except ImportError:  # no SGLang (swa_hal's own tests, direct use): the probe decides
        return None
    if not is_xpu():
        return None
    plat = probe_platform(device)
    return plat if plat.vendor == "xpu" else dataclasses.replace(plat, vendor="xpu")


def _platform(device: torch.device | None = None) -> PlatformInfo | None:
    """The platform the adapters and the start-up line use: ``configure``'s, else SGLang's."""
    return _settings.platform if _settings.platform is not None else sglang_platform(device)


def configure(*, backend: str | None = None, platform: PlatformInfo | None = None) -> None:
    """Settings for the adapters the hooks create from now on (tests force a backend this way;
    ``SWA_HAL_BACKEND`` does the same for a server). Forgets the adapters made so far."""
    _settings.backend = backend
    _settings.platform = platform
    reset_adapters()


def reset_adapters() -> None:
    with _adapters_lock:
        _adapters.clear()


def adapter_for(device: torch.device, window_size: int = SGLANG_SWA_WINDOW) -> SGLangSWAIndices:
    """The adapter of this thread for ``device`` and ``window_size``. One per thread: a builder's fixed
    buffers serve one build at a time, and SGLang may prepare metadata on a second thread. Adapters
    are never dropped, so a CUDA graph that captured one keeps reading live buffers."""
    window_size = _setting("window_size", window_size)
    key = (threading.get_ident(), device.type, -1 if device.index is None else device.index, window_size)
    got = _adapters.get(key)
    if got is None:
        with _adapters_lock:
            got = _adapters.get(key)
            if got is None:
                got = _adapters[key] = SGLangSWAIndices(
                    window_size,
                    device,
                    backend=_settings.backend,
                    platform=_platform(device),
                )
    return got


# -- the hooks -----------------------------------------------------------------------------------------
#
# Every hook is an AROUND hook, so it has SGLang's own code to hand a call to: a call it does not know (an
# argument, an attribute it reads) steps aside to it (``swa_hal.integrations.aside``, docs/engines.md #drift),
# and in shadow mode SGLang's code serves every call while swa_hal builds beside it on the shadow's turns
# (``swa_hal.integrations.shadow``, docs/engines.md #shadow-mode).

# The plugin's shadow, while it shadows SGLang (None: swa_hal serves, or the plugin is not installed).
_shadow: Shadow | None = None


def shadow_report() -> dict[str, Any] | None:
    """What the shadow of this process did (``Shadow.report``), or None when the plugin does not shadow."""
    return None if _shadow is None else _shadow.report()


def _serving() -> bool:
    return _shadow is None or _shadow.mode == "serve"


class _CoreCall:
    """What the causal op's hook leaves for the hook of the ``make_core_attn_metadata`` call it runs in:
    serving, swa_hal's lens of each op call (the method pairs them with the indices); shadowing, each op
    call's arguments and SGLang's indices, which the method's hook compares with its lens in one go."""

    __slots__ = ("lens", "ops")

    def __init__(self) -> None:
        self.lens: list[torch.Tensor] = []
        self.ops: list[tuple[tuple[Any, ...], dict[str, Any], torch.Tensor]] = []


_CORE_CALL: contextvars.ContextVar[_CoreCall | None] = contextvars.ContextVar("swa_hal_sglang_core", default=None)


def causal_rows(
    original: Callable[..., Any],
    cls: Any,
    *,
    req_to_token: torch.Tensor,
    full_to_swa_mapping: torch.Tensor,
    req_pool_indices_repeated: torch.Tensor,
    seq_lens_casual: torch.Tensor,
    swa_window: int,
    page_index_aligned_size: int,
    swa_replay_start: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """swa_hal's answer to a ``BuildCausalSwaPageIndices.execute`` call: its rows, newest first, and the lens
    SGLang's backend pairs with them. Its parameters are the op's, the ones a call must match."""
    adapter = adapter_for(_engine_device("seq_lens_casual", seq_lens_casual), swa_window)
    return adapter.causal(
        req_to_token=req_to_token,
        full_to_swa=full_to_swa_mapping,
        req_pool_indices_repeated=req_pool_indices_repeated,
        seq_lens_casual=seq_lens_casual,
        swa_replay_start=swa_replay_start,
        page_index_aligned_size=page_index_aligned_size,
    )


_CAUSAL_SIGNATURE = inspect.signature(causal_rows)


def causal_execute(original: Callable[..., Any], cls: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """AROUND hook of ``BuildCausalSwaPageIndices.execute``: swa_hal's rows, newest first (its lens go to the
    ``make_core_attn_metadata`` hook). Shadowing, SGLang's rows, compared on the shadow's turns: by the method's
    hook with the lens, or here for a call outside it."""
    core = _CORE_CALL.get()
    shadow = _shadow
    if shadow is None or shadow.mode == "serve":
        served, got = attempt(causal_rows, _CAUSAL_SIGNATURE, original, (cls, *args), kwargs)
        if served:
            indices, lens = got
            if core is not None:
                core.lens.append(lens)
            return indices
        step_aside(ENGINE, TARGET_NAMES[TARGET_CAUSAL], got, log)
        return original(cls, *args, **kwargs)
    want = original(cls, *args, **kwargs)
    if shadow.mode == "shadow":
        if core is not None:
            core.ops.append(((cls, *args), kwargs, want))
        else:
            call = shadow.turn()
            if call is not None:
                _compare_causal(shadow, call, original, (cls, *args), kwargs, want, None)
    return want


def _compare_causal(
    shadow: Shadow,
    call: int,
    original: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    indices: torch.Tensor,
    lens: torch.Tensor | None,
) -> None:
    """Compare SGLang's causal rows (and the lens its method paired with them) with swa_hal's. SGLang's lens
    of a row with a negative position (draft-extend padding) are negative, swa_hal's 0 (docs/engines.md
    #shadow-mode): compared at 0."""
    name = TARGET_NAMES[TARGET_CAUSAL]
    try:
        served, got = attempt(causal_rows, _CAUSAL_SIGNATURE, original, args, kwargs)
    except SWAHalError as exc:
        shadow.refused(call, name, exc)
        return
    if not served:
        step_aside(ENGINE, name, got, log)
        return
    checks = [Check("swa_page_indices", indices, got[0])]
    if lens is not None:
        checks.append(Check("swa_topk_lengths", lens.clamp_min(0), got[1]))
    shadow.compare(call, name, checks)


_core_signature = HostCache()  # SGLang's method -> its signature, read once


@around(ENGINE, TARGET_NAMES[TARGET_CORE], log)
def core_attn_metadata_around(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of ``DeepseekV4AttnBackend.make_core_attn_metadata``: on the causal path (no request
    window, no DSpark block) the lens SGLang's metadata carries are the ones swa_hal built with the indices;
    shadowing, the causal op's rows and these lens are compared with swa_hal's."""
    shadow = _shadow
    if shadow is not None and shadow.mode == "off":
        return original(self, *args, **kwargs)
    sig = _core_signature.get(original)
    if sig is None:
        sig = _core_signature.keep(original, inspect.signature(getattr(original, "func", original)))
    bound = sig.bind(self, *args, **kwargs)
    if (
        bound.arguments.get("dspark_block_size") is not None
        or getattr(self.token_to_kv_pool, "request_window", None) is not None
    ):
        return original(self, *args, **kwargs)
    calls = _CoreCall()
    token = _CORE_CALL.set(calls)
    try:
        core = original(self, *args, **kwargs)
    finally:
        _CORE_CALL.reset(token)
    # The lens fit the rows they were built with: not the rank's rows of a step SGLang has already cut to
    # them (docs/engines.md #context-parallelism), where SGLang's own cut lens stay (and are not compared).
    lens = core.swa_topk_lengths
    if shadow is None or shadow.mode == "serve":
        if len(calls.lens) == 1 and calls.lens[0].shape == lens.shape:
            core.swa_topk_lengths = calls.lens[0]
    elif len(calls.ops) == 1:
        call = shadow.turn()
        if call is not None:
            op_args, op_kwargs, indices = calls.ops[0]
            same_rows = lens.shape[:1] == indices.shape[:1]
            _compare_causal(shadow, call, original, op_args, op_kwargs, indices, lens if same_rows else None)
    return core


def _shadowed(target: str, compare: Callable[[Any, Any], list[Check]]) -> Callable[[Any], Any]:
    """The AROUND hook of ``target`` made of ``serve``, swa_hal's answer to its calls: while swa_hal serves,
    ``serve``'s answer (stepping aside on drift); while it shadows, SGLang's, compared on the shadow's turns
    with ``serve``'s by ``compare(SGLang's, swa_hal's)`` (its checks). ``serve`` answers a call that is not
    swa_hal's to build by returning ``NOT_OURS``: SGLang's code serves it, and nothing is compared."""

    def decorate(serve: Callable[..., Any]) -> Callable[..., Any]:
        name = TARGET_NAMES[target]
        served = around(ENGINE, name, log)(serve)
        signature = inspect.signature(serve)

        @functools.wraps(serve)
        def hooked(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            shadow = _shadow
            if shadow is None or shadow.mode == "serve":
                got = served(original, *args, **kwargs)
                return original(*args, **kwargs) if got is NOT_OURS else got
            want = original(*args, **kwargs)
            call = shadow.turn()
            if call is not None:
                try:
                    ok, got = attempt(serve, signature, original, args, kwargs)
                except SWAHalError as exc:
                    shadow.refused(call, name, exc)
                    return want
                if not ok:
                    step_aside(ENGINE, name, got, log)
                elif got is not NOT_OURS:
                    shadow.compare(call, name, compare(want, got))
            return want

        return hooked

    return decorate


# What a hook's serving function returns for a call that is not swa_hal's to build (a DSpark call of the
# per-request ring, whose op has a hook of its own).
NOT_OURS = object()


def _rows_and_lens(want: tuple[torch.Tensor, torch.Tensor], got: tuple[torch.Tensor, torch.Tensor]) -> list[Check]:
    return [Check("swa_page_indices", want[0], got[0]), Check("swa_topk_lengths", want[1], got[1])]


def _rows(want: torch.Tensor, got: torch.Tensor) -> list[Check]:
    return [Check("swa_page_indices", want, got)]


def _layout(want: Any, got: Any) -> list[Check]:
    """Every field of SGLang's ``WindowLayout``."""
    return [Check(name, value, getattr(got, name)) for name, value in fields_of(want).items()]


def dspark_rows(
    original: Callable[..., Any],
    self: Any,
    *,
    seq_lens_casual: torch.Tensor,
    req_pool_indices_repeated: torch.Tensor,
    out_loc: torch.Tensor,
    block_size: int,
) -> Any:
    """swa_hal's answer to ``DeepseekV4AttnBackend.get_dspark_swa_page_indices`` (and the ROCm backend's copy;
    their hooks ``dspark_indices_around`` and ``hip_dspark_indices_around``): its DSpark rows for the paged SWA
    pool. For the per-request SWA ring SGLang's method runs, and the op it calls,
    ``BuildDsparkSwaRingIndices.execute``, is hooked itself (``dspark_ring_execute``)."""
    pool = self.token_to_kv_pool
    if getattr(pool, "swa_req_ring_size", None) is not None:
        return NOT_OURS
    module = sys.modules.get(type(self).__module__)
    window = getattr(module, "SWA_WINDOW", SGLANG_SWA_WINDOW)
    align = getattr(module, "PAGE_INDEX_ALIGNED_SIZE", SGLANG_PAGE_INDEX_ALIGNED_SIZE)
    adapter = adapter_for(_engine_device("seq_lens_casual", seq_lens_casual), window)
    return adapter.dspark(
        req_to_token=self.req_to_token,
        full_to_swa=pool.full_to_swa_index_mapping,
        seq_lens_casual=seq_lens_casual,
        req_pool_indices_repeated=req_pool_indices_repeated,
        out_loc=out_loc,
        block_size=block_size,
        valid_from=getattr(pool, "swa_valid_from", None),
        page_index_aligned_size=align,
    )


dspark_indices_around = _shadowed(TARGET_DSPARK, _rows_and_lens)(dspark_rows)
hip_dspark_indices_around = _shadowed(TARGET_HIP_DSPARK, _rows_and_lens)(dspark_rows)


@_shadowed(TARGET_DSPARK_RING, _rows_and_lens)
def dspark_ring_execute(
    original: Callable[..., Any],
    cls: Any,
    *,
    seq_lens_casual: torch.Tensor,
    req_pool_indices_repeated: torch.Tensor,
    valid_from: torch.Tensor | None,
    ring_size: int,
    block_size: int,
    swa_window: int,
    page_index_aligned_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """AROUND hook of ``BuildDsparkSwaRingIndices.execute``: swa_hal's ring rows and lens (docs/semantics.md
    #ring-rows). The ring's request slots are ``valid_from``'s entries: SGLang keeps one per request slot of the
    ring (``swa_valid_from``, ``num_req_slots`` long), and its own op reads it for every block."""
    adapter = adapter_for(_engine_device("seq_lens_casual", seq_lens_casual), swa_window)
    return adapter.dspark_ring(
        seq_lens_casual=seq_lens_casual,
        req_pool_indices_repeated=req_pool_indices_repeated,
        valid_from=valid_from,
        ring_size=ring_size,
        block_size=block_size,
        page_index_aligned_size=page_index_aligned_size,
    )


@_shadowed(TARGET_HIP_CAUSAL, _rows)
def hip_causal_indices_around(
    original: Callable[..., Any],
    self: Any,
    seq_lens_casual: torch.Tensor,
    req_pool_indices_repeated: torch.Tensor,
) -> torch.Tensor:
    """AROUND hook of ROCm's ``DeepseekV4HipRadixBackend.get_swa_page_indices``: its plain causal rows (no
    replay floor; the backend pairs them with ``min(seq_lens_casual, W)``) from swa_hal, newest first, -1
    past the window, int32 [n, ceil_align(W, align)]: what its gather through ``req_to_token`` and
    ``full_to_swa_index_mapping`` gives (the backend pads it to that width)."""
    module = sys.modules.get(type(self).__module__)
    window = getattr(module, "SWA_WINDOW", SGLANG_SWA_WINDOW)
    align = getattr(module, "PAGE_INDEX_ALIGNED_SIZE", SGLANG_PAGE_INDEX_ALIGNED_SIZE)
    adapter = adapter_for(_engine_device("seq_lens_casual", seq_lens_casual), window)
    indices, _ = adapter.causal(
        req_to_token=self.req_to_token,
        full_to_swa=self.token_to_kv_pool.full_to_swa_index_mapping,
        req_pool_indices_repeated=req_pool_indices_repeated,
        seq_lens_casual=seq_lens_casual,
        page_index_aligned_size=align,
    )
    return indices


@_shadowed(TARGET_WINDOW, _layout)
def window_layout_around(
    original: Callable[..., Any],
    req: torch.Tensor,
    pos: torch.Tensor,
    *,
    zero_row: int,
    window: int = SGLANG_SWA_WINDOW,
    capacity: int = DEFAULT_CAPACITY,
    floor: torch.Tensor | None = None,
    num_groups: int | None = None,
    padded_rows: int | None = None,
) -> Any:
    """AROUND hook of DeepSeek-V4.1's ``window_layout``: swa_hal's layout (docs/semantics.md
    #request-window-layouts), as SGLang's ``WindowLayout``, on every device (SGLang itself takes its
    Triton op on CUDA, a torch path of small ops elsewhere). SGLang's invariant
    ``dsv41.window_groups_fit`` is checked as its CUDA path checks it (its own ``expect``, its level,
    not while capturing a graph), now on every device; ``dsv41.swa_history_present`` stays where SGLang
    checks it, on the history rows this layout names."""
    device = _engine_device("pos", pos)
    module = sys.modules[_REQUEST_WINDOW]
    got = adapter_for(device, window).window_layout(
        req, pos, zero_row=zero_row, capacity=capacity, floor=floor, num_groups=num_groups, padded_rows=padded_rows
    )
    if num_groups is not None and module.resolve_level() >= module.InvariantCheckLevel.WARN and not module._capturing():
        # The same predicate as SGLang's (its last row's run < num_groups), from the count the build
        # already holds on the device: no host sync. SGLang's own check: what it raises is SGLang's answer.
        engine_call(module.expect, module._WINDOW_GROUPS_FIT, got.runs <= num_groups, msg="request runs")
    return module.WindowLayout(**got.fields())


# The hook of every target (each an AROUND hook).
HOOKS: dict[str, Callable[..., Any]] = {
    TARGET_CAUSAL: causal_execute,
    TARGET_CORE: core_attn_metadata_around,
    TARGET_DSPARK: dspark_indices_around,
    TARGET_DSPARK_RING: dspark_ring_execute,
    TARGET_WINDOW: window_layout_around,
    TARGET_HIP_CAUSAL: hip_causal_indices_around,
    TARGET_HIP_DSPARK: hip_dspark_indices_around,
}

# -- the plugin ----------------------------------------------------------------------------------------

_install_once = InstallOnce()


def target_problem(target: str) -> str | None:
    """Why SGLang's hook registry cannot apply a hook to ``target`` in this process (its module does not
    import, or lacks the attribute), or None when it can. The registry resolves a target this way when it
    applies the hooks, right after the plugins load; it logs a failure and goes on, so the plugin asks first
    and says which of its hooks will not take effect."""
    import pkgutil

    owner, attr = target.rsplit(".", 1)
    try:
        getattr(pkgutil.resolve_name(owner), attr)
    except Exception as exc:  # what the registry would meet: any import error of SGLang's module chain
        return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return None


def hooks_detail(problems: dict[str, str | None]) -> str:
    """The start-up line's account of the hooks: each one applied, or failed with the reason."""
    failed = {t: why for t, why in problems.items() if why is not None}
    if not failed:
        return f"all {len(problems)} hooks applied ({', '.join(TARGET_NAMES[t] for t in problems)})"
    applied = ", ".join(TARGET_NAMES[t] for t in problems if t not in failed) or "none"
    reasons = "; ".join(f"{TARGET_NAMES[t]} ({t}: {why})" for t, why in failed.items())
    return (
        f"{len(failed)} of {len(problems)} hooks FAILED, SGLang's own code serves them: {reasons}; applied: {applied}"
    )


def _own(target: str) -> Any:
    """SGLang's own function of ``target`` (under any hook registry's wrappers), or None where it does not
    resolve."""
    import pkgutil

    owner_path, attr = target.rsplit(".", 1)
    try:
        owner = pkgutil.resolve_name(owner_path)
        raw = owner.__dict__[attr] if isinstance(owner, type) and attr in owner.__dict__ else getattr(owner, attr)
    except Exception:  # noqa: BLE001 - reported by target_problem
        return None
    func: Any = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
    while getattr(func, "__wrapped__", None) is not None:
        func = func.__wrapped__
    params = inspect.signature(func).parameters.values()
    if isinstance(owner, type) and all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name == "cls" for p in params):
        # SGLang's ops dispatch ``execute(cls, *args, **kwargs)`` to their ``torch`` (or ``triton``) method,
        # whose parameters are the op's.
        reference = owner.__dict__.get("torch")
        if isinstance(reference, (classmethod, staticmethod)):
            return reference.__func__
    return func


# The function whose parameters each hook knows (its first parameter, the original, is the hook's own).
_SERVES: dict[str, Callable[..., Any]] = {
    TARGET_CAUSAL: causal_rows,
    TARGET_DSPARK: dspark_rows,
    TARGET_HIP_DSPARK: dspark_rows,
}


def hook_gaps() -> dict[str, str]:
    """Per hook whose SGLang function takes other parameters than the hook knows: what differs
    (``aside.signature_gaps``). Calls that pass what a hook does not know step aside to SGLang's code
    (docs/engines.md #drift); the start-up line and ``swa-hal info --engine sglang`` say so ahead of them."""
    gaps = {}
    for target, hook in HOOKS.items():
        own = _own(target)
        if own is not None:
            why = signature_gaps(own, _SERVES.get(target, hook))
            if why is not None:
                gaps[target] = why
    return gaps


def _install(mode: str, version: str) -> str:
    """Register the hooks (SGLang's loader applies them right after the plugins load) in ``mode``: ``serve``,
    or ``shadow`` (SGLang serves; swa_hal compares, ``swa_hal.integrations.shadow``). Returns the start-up line."""
    global _shadow
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    # Select first: a backend that cannot start is an error before SGLang is touched.
    name, where = auto_backend(backend=_settings.backend, platform=_platform())
    _shadow = Shadow(ENGINE, log) if mode == "shadow" else None
    for target, hook in HOOKS.items():
        HookRegistry.register(target, hook, HookType.AROUND)
    problems = {target: target_problem(target) for target in TARGETS}
    if mode == "shadow":
        s = _shadow.settings if _shadow is not None else None
        what = (
            f"shadow mode: SGLang serves its DeepSeek-V4 SWA rows, swa_hal builds beside it and compares (the first "
            f"{s.steps if s else '?'} calls, then one in {s.every if s else '?'}"
            + (", then serves after as many equal ones" if s and s.promote else "")
            + ")"
        )
    else:
        what = "DeepSeek-V4 SWA indices and lens (paged and per-request ring), V4.1 request-window layouts"
    detail = hooks_detail(problems)
    gaps = hook_gaps()
    if gaps:
        detail += "; calls these hooks do not know step aside to SGLang's code: " + "; ".join(
            f"{TARGET_NAMES[t]} ({why})" for t, why in gaps.items()
        )
    level = logging.WARNING if any(problems.values()) or gaps else logging.INFO
    return announce(log, ENGINE, version, what, name, where, detail, level=level)


def plugin_report() -> dict[str, Any]:
    """Whether the plugin is active in this environment, found as SGLang finds it: its entry point, SGLang's
    ``SGLANG_PLUGINS`` filter, swa_hal's switch, then SGLang's own loader (``sglang.srt.plugins.load_plugins``,
    what every SGLang process runs); its start-up line, its mode (serving or shadowing), the hooks whose SGLang
    functions take parameters they do not know, and the calls of this process that stepped aside.
    ``swa-hal info --engine sglang`` prints it (docs/engines.md #is-it-active)."""
    from importlib import metadata

    from ._common import installed_version
    from .aside import stepped_aside

    report: dict[str, Any] = {"engine": "sglang", "supported": list(SUPPORTED_VERSIONS), "active": False}
    version = installed_version(DISTRIBUTION)
    report["version"] = version
    eps = [ep for ep in metadata.entry_points(group="sglang.srt.plugins") if ep.name == "swa_hal"]
    report["entry_point"] = eps[0].value if eps else None
    allowed = os.environ.get("SGLANG_PLUGINS")
    report["engine_plugins"] = ("SGLANG_PLUGINS", allowed)
    report["switch"] = {SWITCH: os.environ.get(SWITCH), "on": enabled(SWITCH)}
    reason = None
    if version is None:
        reason = "SGLang is not installed in this environment"
    elif not eps:
        reason = "no sglang.srt.plugins entry point named swa_hal: swa-hal is not installed as a distribution here"
    elif allowed and "swa_hal" not in {x.strip() for x in allowed.split(",")}:
        reason = f"SGLANG_PLUGINS={allowed!r} does not name swa_hal, so SGLang does not load it"
    elif not enabled(SWITCH):
        reason = f"{SWITCH}={os.environ.get(SWITCH)}: the plugin leaves SGLang its own code"
    messages: list[str] = []
    if version is not None and reason is None:
        loader_said: list[str] = []
        with kept_log(log, messages), kept_log(logging.getLogger("sglang.srt.plugins"), loader_said):
            try:
                import sglang.srt.plugins as loader

                loader.load_plugins()
            except Exception as exc:  # noqa: BLE001 - what SGLang's own start-up would have raised, reported
                reason = f"sglang.srt.plugins.load_plugins() raised {type(exc).__name__}: {exc}"
        # The loader logs a plugin that failed to load or run, and goes on: said here as the plugin's.
        messages += [line for line in loader_said if line.startswith(("ERROR", "WARNING")) and "swa_hal" in line]
    startup = [m.split(" ", 1)[1] for m in messages if m.startswith(("INFO swa_hal ", "WARNING swa_hal "))]
    report["startup"] = startup[0] if startup else (_install_once._result if _install_once.done else None)
    report["messages"] = [m for m in messages if not m.split(" ", 1)[-1].startswith("swa_hal ")]
    report["registered"] = _install_once.done
    if report["registered"]:
        report["active"] = True
        report["mode"] = "shadow" if _shadow is not None and _shadow.mode != "serve" else "serve"
        report["shadow"] = shadow_report()
        report["hook_gaps"] = {TARGET_NAMES[t]: why for t, why in hook_gaps().items()}
    elif reason is None:
        reason = "the plugin loaded but did not register" + (f": {report['messages'][0]}" if report["messages"] else "")
    report["stepped_aside"] = stepped_aside(ENGINE)
    report["reason"] = reason
    return report


def load_plugin() -> str | None:
    """The ``sglang.srt.plugins`` entry point. Registers the hooks once per process (SGLang's loader
    applies them), logs one line naming the swa_hal backend, and returns it. ``SWA_HAL_SGLANG=0``
    leaves SGLang untouched (returns None); a release outside the tested set is shadowed, with one warning
    (``SWA_HAL_SGLANG=shadow`` shadows a tested one; ``SWA_HAL_STRICT=1``: an EngineVersionError instead;
    ``SWA_HAL_FORCE_ENGINE=1``: serves it anyway; docs/engines.md #releases-outside-the-tested-set)."""
    mode, version = gate_mode(log, ENGINE, DISTRIBUTION, SUPPORTED_VERSIONS, switch=SWITCH)
    if mode == "off" or version is None:
        log.debug("swa_hal: %s=%s, SGLang left untouched", SWITCH, os.environ.get(SWITCH))
        return None
    return _install_once(lambda: _install(mode, version))
