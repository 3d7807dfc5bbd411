"""swa_hal inside vLLM 0.33: DeepSeek-V4 / V4.1 sliding-window metadata from swa_hal's backend.

``register`` is the ``vllm.general_plugins`` entry point (``pyproject.toml``): vLLM calls it in every
process. It makes every DeepSeek-V4 SWA attention backend of vLLM (``DeepseekSparseSWABackend`` and
each platform subclass, V4 and V4.1: FlashMLA, FlashInfer, CPU, ROCm AITER, XPU) hand out a
swa_hal builder from ``get_builder_cls()``.

The swa_hal builder is vLLM's own builder class with swa_hal slotted in *under* the platform
subclass and *over* vLLM's base: its class is ``type(name, (native, SwaHalSparseSWAMetadataBuilder),
{})`` whose method order is ``platform subclass -> (V4.1 builder) -> swa_hal -> vLLM base``. So:

* replaced outright: the base ``DeepseekSparseSWAMetadataBuilder.build`` and
  ``update_draft_decode_metadata`` (every index row, length, split, token_to_req, is_valid, gather
  length and image-visibility value now comes from swa_hal's auto-selected backend, in swa_hal's fixed
  buffers), and the base's window/row buffers (freed; see ``_release_native_row_buffers``);
* wrapped, each keeping what it adds on top of the base: the V4.1 builder (PCP slot chunking,
  ``cache_slot_mapping`` / ``cache_positions``, its layer types), FlashMLA (CUDA graphs ALWAYS),
  FlashInfer (``flashinfer_decode_topk_lens`` / ``_seq_lens``), CPU (its tile-scheduler sentinel),
  ROCm AITER (ragged rows built from swa_hal's dense rows, draft updates off; its gfx942 one-launch
  decode shortcut declines, since the row buffers it would fill are swa_hal's); the
  ``build_tile_scheduler`` of whichever class vLLM picked makes the five ``tile_sched_*`` (vLLM's own
  FlashMLA planner objects, which its kernels consume).

Importing this module imports nothing from vLLM; everything that needs vLLM says so when used.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from typing import Any

import torch

from ..batch import AttentionBatch, ranges_in_step
from ..builder import SWAMetadataBuilder
from ..config import SPECULATIVE_METHODS, SWAConfig
from ..errors import ConfigError, SWAHalError
from ..metadata import SWAMetadata
from ..platform import PlatformInfo
from . import _common

# The vLLM release series this integration is written and tested against (its builders' internals).
SUPPORTED_VLLM_SERIES = (0, 33)
ENV_SWITCH = "SWA_HAL_VLLM"
_SPARSE_SWA = "vllm.v1.attention.backends.mla.sparse_swa"

# A child of vLLM's logger, so the line appears in vLLM's own log format.
log = logging.getLogger("vllm.plugins.swa_hal")


class VllmNotInstalledError(SWAHalError, ImportError):
    """The vLLM integration was used where vLLM is not installed."""


class VllmVersionError(_common.EngineVersionError):
    """The installed vLLM is not a release of the series this integration was built for."""


# -- environment --------------------------------------------------------------------------------


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def vllm_version() -> str | None:
    try:
        return _dist_version("vllm")
    except PackageNotFoundError:
        return None


def enabled(env: dict[str, str] | None = None) -> bool:
    """``SWA_HAL_VLLM`` off (0/false/no/off) leaves vLLM untouched; unset or a true word is on; any other
    value is an error (a typo never silently flips the engine's metadata)."""
    return _common.enabled(ENV_SWITCH, env)


def check_vllm(version: str | None = None) -> str:
    """The installed vLLM's version, or a clear error: not installed, or not a 0.33.x release."""
    if version is None:
        if not vllm_installed():
            raise VllmNotInstalledError(
                "swa_hal.integrations.vllm needs vLLM, which is not installed: pip install 'swa-hal[vllm]'"
            )
        version = vllm_version()
        if version is None:  # importable but without distribution metadata (a source tree on sys.path)
            import vllm

            version = getattr(vllm, "__version__", None) or "unknown"
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(version).release[:2]
    except InvalidVersion:
        release = ()
    if release != SUPPORTED_VLLM_SERIES:
        series = ".".join(map(str, SUPPORTED_VLLM_SERIES)) + ".x"
        raise VllmVersionError("vLLM", version, [series], ENV_SWITCH)
    return version


# -- options for the builders vLLM creates ------------------------------------------------------


@dataclasses.dataclass
class BuilderOptions:
    """Defaults for every swa_hal builder vLLM constructs (vLLM passes only its four arguments).
    ``backend``: a swa_hal backend name (None: ``SWA_HAL_BACKEND``, else auto-selection);
    ``platform``: a PlatformInfo replacing the device probe (tests, ``--assume``);
    ``validate``: full validation on every build (None: ``SWA_HAL_DEBUG``)."""

    backend: str | None = None
    platform: PlatformInfo | None = None
    validate: bool | None = None


options = BuilderOptions()


def configure(
    backend: str | None = None, platform: PlatformInfo | str | None = None, validate: bool | None = None
) -> BuilderOptions:
    """Set the defaults for builders created from now on; returns the previous options."""
    previous = dataclasses.replace(options)
    options.backend = backend
    options.platform = PlatformInfo.from_assume(platform) if isinstance(platform, str) else platform
    options.validate = validate
    return previous


# -- the builder --------------------------------------------------------------------------------

_lock = threading.RLock()
_base_cls: type | None = None
_wrapped: dict[type, type] = {}


def _sparse_swa() -> Any:
    check_vllm()
    import importlib

    return importlib.import_module(_SPARSE_SWA)


def sparse_swa_builder_base() -> type:
    """``SwaHalSparseSWAMetadataBuilder``: vLLM's ``DeepseekSparseSWAMetadataBuilder`` with swa_hal's
    build and draft update (made on first use: it subclasses a vLLM class)."""
    global _base_cls
    with _lock:
        if _base_cls is None:
            _base_cls = _make_base(_sparse_swa())
            _wrapped[_sparse_swa().DeepseekSparseSWAMetadataBuilder] = _base_cls
        return _base_cls


def is_swa_hal_builder(cls: type) -> bool:
    return isinstance(cls, type) and getattr(cls, "swa_hal_native_cls", None) is not None


def native_builder_cls(cls: type) -> type:
    """The vLLM builder class a swa_hal builder class stands in for (itself for any other class)."""
    return getattr(cls, "swa_hal_native_cls", None) or cls


def swa_hal_builder_cls(native: type) -> type:
    """The swa_hal builder for vLLM's builder class ``native`` (cached; any class that is not a
    DeepSeek-V4 SWA builder comes back unchanged)."""
    if is_swa_hal_builder(native):
        return native
    base = sparse_swa_builder_base()
    sparse_swa = _sparse_swa()
    with _lock:
        cls = _wrapped.get(native)
        if cls is not None:
            return cls
        if not (isinstance(native, type) and issubclass(native, sparse_swa.DeepseekSparseSWAMetadataBuilder)):
            return native
        # Unique, importable name: V4 and V4.1 have same-named subclasses in different modules.
        tail = native.__module__.removeprefix("vllm.").replace(".", "_")
        attr = f"SwaHal_{tail}_{native.__qualname__.replace('.', '_')}"
        cls = type(
            native.__name__,
            (native, base),
            {
                "__module__": __name__,
                "__qualname__": attr,
                "__doc__": f"swa_hal rows under vLLM's {native.__module__}.{native.__qualname__}.",
                "swa_hal_native_cls": native,
            },
        )
        cls.__name__ = f"SwaHal{native.__name__}"
        _wrapped[native] = cls
        setattr(sys.modules[__name__], attr, cls)  # so pickle finds it by name
        return cls


def _is_v41(cls: type) -> bool:
    return any(c.__name__ == "DeepseekV41SparseSWAMetadataBuilder" for c in cls.__mro__)


def swa_config_from_vllm(builder: Any) -> SWAConfig:
    """The SWAConfig of a vLLM SWA builder, from the values vLLM's own ``__init__`` derived
    (window, block size, image tokens, drafting, capacities) and the model's compress ratios."""
    vllm_config = builder.vllm_config
    hf_config = vllm_config.model_config.hf_config
    v41 = _is_v41(type(builder))
    if v41:
        ratios = getattr(hf_config, "compress_ratios", None) or [0]
    else:
        from vllm.transformers_utils.deepseek_v4_utils import get_compress_ratios

        ratios = get_compress_ratios(hf_config) or [1]
    spec = vllm_config.speculative_config
    k = int(builder.num_speculative_tokens or 0)
    method = None
    parallel = False
    if k > 0:
        if builder.is_dspark:
            method = "dspark"
        else:
            name = str(getattr(spec, "method", "") or "").lower()
            method = name if name in SPECULATIVE_METHODS else "mtp"
        parallel = bool(getattr(spec, "parallel_drafting", False)) and not bool(
            getattr(vllm_config, "use_v2_model_runner", False)
        )
    cfg = SWAConfig(
        window_size=int(builder.window_size),
        block_size=int(builder.block_size),
        compress_ratios=tuple(int(r) for r in ratios),
        max_model_len=int(builder.max_model_len),
        max_num_batched_tokens=int(builder.max_num_batched_tokens),
        max_num_seqs=int(vllm_config.scheduler_config.max_num_seqs),
        num_speculative_tokens=k,
        parallel_drafting=parallel,
        speculative_method=method,
        head_size=int(builder.head_size),
        model_version="deepseek_v41" if v41 else "deepseek_v4",
        max_image_tokens=int(builder.max_image_tokens),
    )
    if cfg.decode_threshold != builder.decode_threshold:
        raise ConfigError(
            "num_speculative_tokens",
            f"vLLM's decode threshold is {builder.decode_threshold}; swa_hal derives {cfg.decode_threshold} "
            f"from {k} draft tokens (parallel_drafting={parallel}); this drafting setup is not supported",
        )
    if builder.is_dspark and cfg.noncausal_index_width != builder.noncausal_index_width:
        raise ConfigError(
            "num_speculative_tokens",
            f"vLLM's DSpark row width is {builder.noncausal_index_width}; swa_hal's is {cfg.noncausal_index_width}",
        )
    return cfg


def _make_base(sparse_swa: Any) -> type:
    Native: Any = sparse_swa.DeepseekSparseSWAMetadataBuilder
    Metadata: Any = sparse_swa.DeepseekSparseSWAMetadata

    class SwaHalSparseSWAMetadataBuilder(Native):
        """vLLM's DeepSeek-V4 SWA builder whose rows come from a swa_hal ``SWAMetadataBuilder``.

        Same constructor as vLLM's (plus keyword-only ``backend``, ``platform`` and ``validate`` for
        swa_hal; defaults from ``configure``); ``build`` returns vLLM's ``DeepseekSparseSWAMetadata``
        whose tensors are views of swa_hal's fixed buffers and of the step's own inputs.
        """

        swa_hal_native_cls = Native

        def __init__(
            self,
            *args: Any,
            backend: str | None = None,
            platform: PlatformInfo | str | None = None,
            validate: bool | None = None,
            **kwargs: Any,
        ) -> None:
            super().__init__(*args, **kwargs)
            pcp = getattr(self.vllm_config.parallel_config, "prefill_context_parallel_size", 1) or 1
            if pcp > 1:
                # V4.1's PCP build hands the base a rank-local slot mapping shorter than the step's
                # tokens; swa_hal's builder has not been checked against it.
                raise ConfigError(
                    "prefill_context_parallel_size",
                    f"{pcp}: prefill context parallelism is not supported by swa_hal's vLLM plugin yet; "
                    f"set {ENV_SWITCH}=0 to run vLLM's own builders",
                )
            if isinstance(platform, str):
                platform = PlatformInfo.from_assume(platform)
            self.swa_config = swa_config_from_vllm(self)
            self.swa_hal = SWAMetadataBuilder(
                self.swa_config,
                device=self.device,
                backend=backend if backend is not None else options.backend,
                platform=platform if platform is not None else options.platform,
                validate=validate if validate is not None else options.validate,
            )
            self._release_native_row_buffers()
            # vLLM hands out visibility whenever a request lists images, even when none covers the
            # step's new tokens (all zeros then); these stay zero for exactly that case.
            self._no_visibility: tuple[torch.Tensor, torch.Tensor] | None = None
            if self.max_image_tokens > 0:
                zeros = lambda: torch.zeros(self._max_tokens, dtype=torch.int32, device=self.device)  # noqa: E731
                self._no_visibility = (zeros(), zeros())
            if not self.swa_hal.supports_draft_decode_metadata_update:
                self.supports_draft_decode_metadata_update = False

        @property
        def swa_hal_backend(self) -> str:
            return self.swa_hal.backend_name

        def _release_native_row_buffers(self) -> None:
            """vLLM's base allocated its own row buffers; swa_hal's replace them. The per-token
            buffers become swa_hal's (same shapes), the index rows zero-width placeholders, so no
            code path can fill rows outside swa_hal (ROCm's one-launch decode build checks the
            buffer's width and declines)."""
            b = self.swa_hal.buffers
            empty = lambda: torch.empty((self._max_tokens, 1, 0), dtype=torch.int32, device=self.device)  # noqa: E731
            self.decode_swa_indices = empty()
            self.prefill_swa_indices = empty()
            self.decode_swa_indices_noncausal = empty()
            self.token_to_req_indices = b.token_to_req
            self.is_valid_token = b.is_valid
            self.decode_swa_lens = b.decode_lens
            self.prefill_swa_lens = b.prefill_lens
            for name in ("left_visible", "right_visible", "span_indptr", "span_starts", "span_ends"):
                if hasattr(self, name):
                    setattr(self, name, getattr(b, name))

        # -- build --------------------------------------------------------------------------

        def swa_hal_batch(self, cm: Any, replay_start: torch.Tensor | None = None) -> AttentionBatch:
            """The step as a swa_hal batch: views of vLLM's tensors, nothing copied or synchronised
            (image spans go into swa_hal's fixed span buffers, as vLLM uploads them into its own)."""
            num_reqs = cm.num_reqs
            n = cm.num_actual_tokens
            slots = cm.slot_mapping
            if slots.shape[0] != n:
                slots = slots[:n]
            spans = None
            seq_cpu = cm.seq_lens_cpu_upper_bound
            ranges = cm.mm_req_doc_ranges
            if self.max_image_tokens > 0 and ranges and any(ranges.values()):
                ranges = self._step_ranges(ranges, cm.query_start_loc_cpu, seq_cpu, cm.seq_lens, num_reqs)
                if ranges:
                    spans = self.swa_hal.image_spans_from_ranges(ranges, num_reqs)
            seq_lens = cm.seq_lens
            return AttentionBatch(
                seq_lens=seq_lens if seq_lens.shape[0] == num_reqs else seq_lens[:num_reqs],
                query_start_loc=cm.query_start_loc,
                query_start_loc_cpu=cm.query_start_loc_cpu,
                seq_lens_cpu=seq_cpu if seq_cpu is None or seq_cpu.shape[0] == num_reqs else seq_cpu[:num_reqs],
                block_table=cm.block_table_tensor,
                slot_mapping=slots,
                max_query_len=int(cm.max_query_len),
                num_tokens=n,
                causal=bool(cm.causal),
                replay_start=replay_start,
                image_spans=spans,
            )

        @staticmethod
        def _step_ranges(
            ranges: dict[int, list[tuple[int, int]]],
            qsl_cpu: torch.Tensor,
            seq_cpu: torch.Tensor | None,
            seq_lens: torch.Tensor,
            num_reqs: int,
        ) -> dict[int, list[tuple[int, int]]]:
            """The image spans over this step's new tokens (vLLM lists every image of a request)."""
            if seq_cpu is None:
                seq_cpu = seq_lens.cpu()  # only in steps with images, and only without vLLM's host copy
            return ranges_in_step(ranges, qsl_cpu, seq_cpu, num_reqs)

        def build(
            self,
            common_prefix_len: int,
            common_attn_metadata: Any,
            fast_build: bool = False,
            replay_start: torch.Tensor | None = None,
        ) -> Any:
            """vLLM's ``build``: ``common_prefix_len`` and ``fast_build`` are accepted and, as in
            vLLM's builder, unused; ``replay_start`` is each request's lower bound (None: none)."""
            cm = common_attn_metadata
            md = self.swa_hal.build(self.swa_hal_batch(cm, replay_start))
            valid = self._valid_rows(cm.slot_mapping, md.is_valid_token, cm.num_actual_tokens)
            fields = self.swa_hal_fields(md, cm, valid)
            ranges = cm.mm_req_doc_ranges
            if (
                self._no_visibility is not None
                and md.num_prefill_tokens
                and md.prefill_left_visible is None
                and ranges
                and any(ranges.values())
            ):
                n = md.num_decode_tokens + md.num_prefill_tokens
                fields["prefill_left_visible"] = self._no_visibility[0][:n]
                fields["prefill_right_visible"] = self._no_visibility[1][:n]
            return Metadata(**fields)

        def _valid_rows(self, slot_mapping: torch.Tensor, valid: torch.Tensor, n: int) -> torch.Tensor:
            """vLLM's is_valid_token covers every slot row, padding rows past num_actual_tokens too."""
            rows = slot_mapping.shape[0]
            if rows == n:
                return valid
            full = self.swa_hal.buffers.is_valid[:rows]
            torch.ge(slot_mapping[n:], 0, out=full[n:])
            return full

        def swa_hal_fields(self, md: SWAMetadata, cm: Any, valid: torch.Tensor) -> dict[str, Any]:
            """Every field vLLM's base build fills, from swa_hal's metadata (the tile schedulers from
            this class's ``build_tile_scheduler``: vLLM's planner objects, for vLLM's kernels)."""
            tile = self.build_tile_scheduler(md.num_decode_tokens)
            fields: dict[str, Any] = dict(
                seq_lens=cm.seq_lens,
                query_start_loc=cm.query_start_loc,
                query_start_loc_cpu=cm.query_start_loc_cpu,
                block_table=cm.block_table_tensor,
                slot_mapping=cm.slot_mapping,
                is_valid_token=valid,
                token_to_req_indices=md.token_to_req_indices,
                decode_swa_indices=md.decode_swa_indices,
                decode_swa_lens=md.decode_swa_lens,
                decode_swa_width=md.decode_swa_width,
                prefill_swa_indices=md.prefill_swa_indices,
                prefill_swa_lens=md.prefill_swa_lens,
                prefill_left_visible=md.prefill_left_visible,
                prefill_right_visible=md.prefill_right_visible,
                replay_start=md.replay_start,
                block_size=self.block_size,
                num_decodes=md.num_decodes,
                num_prefills=md.num_prefills,
                num_decode_tokens=md.num_decode_tokens,
                num_prefill_tokens=md.num_prefill_tokens,
                max_decode_query_len=md.max_decode_query_len,
                **{f"tile_sched_{kind}": tile.get(kind) for kind in ("swaonly", "c4a", "c128a", "c1a", "c2a")},
            )
            if md.num_prefills:
                fields.update(
                    prefill_seq_lens=md.prefill_seq_lens,
                    prefill_seq_lens_cpu=md.prefill_seq_lens_cpu,
                    prefill_gather_lens=md.prefill_gather_lens,
                    prefill_query_lens_cpu=md.prefill_query_lens_cpu,
                    prefill_window_size=md.window_size,
                    prefill_max_model_len=md.max_model_len,
                    prefill_max_num_batched_tokens=md.max_num_batched_tokens,
                )
            return fields

        # -- speculative decoding -----------------------------------------------------------

        def swa_hal_metadata(self, metadata: Any) -> SWAMetadata:
            """swa_hal's view of a vLLM metadata this builder built (views only), for in-place updates."""
            buffers = self.swa_hal.buffers
            ptr = metadata.decode_swa_indices.untyped_storage().data_ptr()
            causal = ptr == buffers.decode_indices.untyped_storage().data_ptr()
            cfg = self.swa_config
            return SWAMetadata(
                seq_lens=metadata.seq_lens,
                query_start_loc=metadata.query_start_loc,
                query_start_loc_cpu=metadata.query_start_loc_cpu,
                block_table=metadata.block_table,
                slot_mapping=metadata.slot_mapping,
                num_decodes=metadata.num_decodes,
                num_prefills=metadata.num_prefills,
                num_decode_tokens=metadata.num_decode_tokens,
                num_prefill_tokens=metadata.num_prefill_tokens,
                token_to_req_indices=metadata.token_to_req_indices,
                is_valid_token=metadata.is_valid_token,
                decode_swa_indices=metadata.decode_swa_indices,
                decode_swa_lens=metadata.decode_swa_lens,
                decode_swa_width=metadata.decode_swa_width,
                causal=causal,
                max_decode_query_len=metadata.max_decode_query_len,
                replay_start=metadata.replay_start,
                block_size=cfg.block_size,
                window_size=cfg.window_size,
                max_model_len=cfg.max_model_len,
                max_num_batched_tokens=cfg.max_num_batched_tokens,
                tile_sched={},
                backend=self.swa_hal.backend_name,
            )

        def update_draft_decode_metadata(self, metadata: Any) -> None:
            """vLLM's in-place draft-step refresh (capture-safe): swa_hal recomputes token_to_req,
            is_valid and the decode rows and lens (DSpark rows stay DSpark rows) from the advanced
            ``seq_lens``; fresh tile schedulers; FlashInfer's index cache cleared."""
            ndt = metadata.num_decode_tokens
            if ndt == 0:
                return
            self.swa_hal.update_draft_decode_metadata(self.swa_hal_metadata(metadata))
            slots = metadata.slot_mapping
            if slots.shape[0] > ndt and metadata.is_valid_token.shape[0] >= slots.shape[0]:
                torch.ge(slots[ndt:], 0, out=metadata.is_valid_token[ndt : slots.shape[0]])
            tile = self.build_tile_scheduler(ndt)
            for kind in ("swaonly", "c4a", "c128a", "c1a", "c2a"):
                setattr(metadata, f"tile_sched_{kind}", tile.get(kind))
            metadata.flashinfer_sparse_index_cache.clear()

    SwaHalSparseSWAMetadataBuilder.__module__ = __name__
    SwaHalSparseSWAMetadataBuilder.__qualname__ = "SwaHalSparseSWAMetadataBuilder"
    sys.modules[__name__].SwaHalSparseSWAMetadataBuilder = SwaHalSparseSWAMetadataBuilder  # type: ignore[attr-defined]
    return SwaHalSparseSWAMetadataBuilder


# -- the plugin ---------------------------------------------------------------------------------

_registered = False
_patched: list[tuple[type, str, Any]] = []  # (class, attribute, original descriptor or None)


def is_registered() -> bool:
    return _registered


def _all_subclasses(cls: type) -> Iterator[type]:
    seen: set[type] = set()
    stack: list[type] = list(cls.__subclasses__())
    while stack:
        sub = stack.pop()
        if sub not in seen:
            seen.add(sub)
            yield sub
            stack.extend(sub.__subclasses__())


def _patch_backend(backend: type) -> None:
    """Make ``backend.get_builder_cls()`` return the swa_hal builder of whatever vLLM's returns."""
    raw = backend.__dict__.get("get_builder_cls")
    if raw is None or getattr(raw, "__swa_hal__", False):
        return
    if isinstance(raw, staticmethod):
        native = raw.__func__

        def get_builder_cls() -> type:
            return swa_hal_builder_cls(native())

        new: Any = staticmethod(get_builder_cls)
    elif isinstance(raw, classmethod):
        native_cm = raw.__func__

        def get_builder_cls_cm(cls: type) -> type:
            return swa_hal_builder_cls(native_cm(cls))

        new = classmethod(get_builder_cls_cm)
    else:  # a plain function would be an instance method; vLLM never calls it that way
        return
    new.__swa_hal__ = True
    name = "get_builder_cls"
    setattr(backend, name, new)
    _patched.append((backend, name, raw))


def register() -> bool:
    """The ``vllm.general_plugins`` entry point. Idempotent (vLLM calls it in every process).
    Returns whether swa_hal builds vLLM's DeepSeek-V4 SWA metadata in this process."""
    global _registered
    if not enabled():
        log.info(
            "swa_hal: %s=%s, vLLM keeps its own DeepSeek-V4 SWA metadata builders",
            ENV_SWITCH,
            os.environ.get(ENV_SWITCH),
        )
        return False
    with _lock:
        if _registered:
            return True
        version = check_vllm()
        # Choose the backend first: a backend that cannot be chosen (SWA_HAL_BACKEND naming an
        # unknown or unavailable one) stops here, with vLLM untouched.
        backend_name, platform = describe(version)
        sparse_swa = _sparse_swa()
        sparse_swa_builder_base()
        backend = sparse_swa.DeepseekSparseSWABackend
        for cls in (backend, *_all_subclasses(backend)):
            _patch_backend(cls)
        # Platform modules imported later (ROCm, FlashInfer, ...) define their subclasses then.
        original = backend.__dict__.get("__init_subclass__")

        def __init_subclass__(cls: type, **kwargs: Any) -> None:
            if original is not None:
                original.__get__(None, cls)(**kwargs)
            else:
                super(backend, cls).__init_subclass__(**kwargs)
            _patch_backend(cls)

        backend.__init_subclass__ = classmethod(__init_subclass__)
        _patched.append((backend, "__init_subclass__", original))
        _registered = True
    _common.announce(log, "vLLM", version, "builds its DeepSeek-V4/V4.1 SWA metadata", backend_name, platform)
    return True


def unregister() -> None:
    """Give vLLM its own builders back (classes already constructed stay as they are)."""
    global _registered
    with _lock:
        while _patched:
            cls, attr, original = _patched.pop()
            if original is None:
                if attr in cls.__dict__:
                    delattr(cls, attr)
            else:
                setattr(cls, attr, original)
        _registered = False


def describe(version: str | None = None) -> tuple[str, str]:
    """(backend, platform): the swa_hal backend this process's device gets, found without building."""
    return _common.auto_backend(backend=options.backend, platform=options.platform)


def __getattr__(name: str) -> Any:
    # Builder classes are made on demand (they subclass vLLM's); pickle and imports find them here.
    if name == "SwaHalSparseSWAMetadataBuilder":
        return sparse_swa_builder_base()
    if name.startswith("SwaHal_"):
        sparse_swa_builder_base()
        for native in _all_subclasses(_sparse_swa().DeepseekSparseSWAMetadataBuilder):
            cls = swa_hal_builder_cls(native)
            if cls.__qualname__ == name:
                return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
