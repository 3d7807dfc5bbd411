"""swa_hal's builder for vLLM 0.33's DeepSeek-V4 / V4.1 sliding-window metadata.

This module imports vLLM. The plugin (``swa_hal.integrations.vllm``, which imports nothing from vLLM)
imports it on first use, after checking vLLM's version; importing it directly checks the version too.

* ``SwaHalSparseSWAMetadataBuilder``: vLLM's ``DeepseekSparseSWAMetadataBuilder`` whose ``build`` and
  ``update_draft_decode_metadata`` come from a swa_hal ``SWAMetadataBuilder``; each build also polls the
  guarded builds' violation record without a sync (``SWAMetadataBuilder.poll_violations``), so a violation
  reaches vLLM's log (or raises, ``SWA_HAL_STRICT=1``) a build later.
* ``swa_hal_builder_cls(native)``: the same under any of vLLM's platform subclasses (V4.1, FlashMLA,
  FlashInfer, CPU, ROCm AITER, ...): ``type(name, (native, SwaHalSparseSWAMetadataBuilder), {})``, whose
  method order is ``platform subclass -> (V4.1 builder) -> swa_hal -> vLLM base``, so each subclass's
  own ``build`` runs on top of swa_hal's and keeps what it adds.
* Inside a model-runner step whose step build serves the builder (``swa_hal.integrations.vllm_step``), its
  group's rows come from that one build of every SWA group, and a draft step's update of them from one
  grouped update; elsewhere (or for inputs not the step's) the builder builds its group alone.
* ``FIELDS`` and ``PREFILL_FIELDS``: the field map between vLLM's ``DeepseekSparseSWAMetadata`` and
  swa_hal's ``SWAMetadata``; ``to_vllm`` and ``from_vllm`` are its two directions.
* The step's batch comes from ``engine.batch_from_common_metadata``, the conversion (and padding rule)
  every engine adapter uses; vLLM's metadata covers the first ``num_actual_tokens`` token rows of it
  (``engine_rows``) and ``is_valid_token`` every slot row, as vLLM's own builder hands them out.
* Prefill context parallelism (V4.1 only): vLLM's V4.1 ``build`` hands swa_hal's the rank-local step (its
  chunk of the gathered slot mapping) and adds ``cache_slot_mapping`` / ``cache_positions`` itself; swa_hal's
  builder is sized for the rank's up to ``2 * max_num_seqs`` request segments
  (docs/semantics.md #context-parallel-ranks).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
from vllm.transformers_utils.deepseek_v4_utils import get_compress_ratios
from vllm.v1.attention.backends.mla.sparse_swa import (
    DeepseekSparseSWAMetadata,
    DeepseekSparseSWAMetadataBuilder,
)

from ..batch import AttentionBatch
from ..builder import SWAMetadataBuilder
from ..config import LAYER_TYPES, SPECULATIVE_METHODS, SWAConfig
from ..envs import env_flag
from ..errors import ConfigError, SWAHalError
from ..metadata import SWAMetadata
from ..platform import PlatformInfo
from . import vllm_shadow, vllm_step
from .aside import drift_reason, engine_call, raised_by_engine, step_aside, unbound
from .engine import batch_from_common_metadata, step_image_spans
from .vllm_common import ENGINE, ENV_SWITCH, all_subclasses, check_vllm, is_swa_hal_builder, log, options

check_vllm()

# -- the field map ------------------------------------------------------------------------------

# (vLLM's DeepseekSparseSWAMetadata field, swa_hal's SWAMetadata field): the fields every build fills.
FIELDS: tuple[tuple[str, str], ...] = (
    # the step's inputs, passed through
    ("seq_lens", "seq_lens"),
    ("query_start_loc", "query_start_loc"),
    ("query_start_loc_cpu", "query_start_loc_cpu"),
    ("block_table", "block_table"),
    ("slot_mapping", "slot_mapping"),
    # docs/semantics.md #split, #per-token-helpers
    ("num_decodes", "num_decodes"),
    ("num_prefills", "num_prefills"),
    ("num_decode_tokens", "num_decode_tokens"),
    ("num_prefill_tokens", "num_prefill_tokens"),
    ("max_decode_query_len", "max_decode_query_len"),
    ("token_to_req_indices", "token_to_req_indices"),
    ("is_valid_token", "is_valid_token"),
    # #causal-rows, #dspark-rows, #vision-spans, #bounded-replay
    ("decode_swa_indices", "decode_swa_indices"),
    ("decode_swa_lens", "decode_swa_lens"),
    ("decode_swa_width", "decode_swa_width"),
    ("prefill_swa_indices", "prefill_swa_indices"),
    ("prefill_swa_lens", "prefill_swa_lens"),
    ("prefill_left_visible", "prefill_left_visible"),
    ("prefill_right_visible", "prefill_right_visible"),
    ("replay_start", "replay_start"),
    ("block_size", "block_size"),
)

# The fields vLLM fills only when the step has prefills (its defaults otherwise: None and 0).
PREFILL_FIELDS: tuple[tuple[str, str], ...] = (
    ("prefill_seq_lens", "prefill_seq_lens"),
    ("prefill_seq_lens_cpu", "prefill_seq_lens_cpu"),
    ("prefill_gather_lens", "prefill_gather_lens"),
    ("prefill_query_lens_cpu", "prefill_query_lens_cpu"),
    ("prefill_window_size", "window_size"),
    ("prefill_max_model_len", "max_model_len"),
    ("prefill_max_num_batched_tokens", "max_num_batched_tokens"),
)


def _pairs(num_prefills: int) -> tuple[tuple[str, str], ...]:
    return FIELDS + PREFILL_FIELDS if num_prefills else FIELDS


def to_vllm(md: SWAMetadata) -> dict[str, Any]:
    """vLLM's metadata fields from swa_hal's metadata (the tile schedulers are not among them: vLLM's
    kernels consume its own planner objects, from the builder's ``build_tile_scheduler``)."""
    return {theirs: getattr(md, ours) for theirs, ours in _pairs(md.num_prefills)}


def from_vllm(metadata: Any) -> dict[str, Any]:
    """swa_hal's metadata fields from vLLM's metadata: the reverse of ``to_vllm``. The static facts a
    decode-only step does not carry (``window_size``, ``max_model_len``, ``max_num_batched_tokens``),
    ``causal``, ``tile_sched`` and ``backend`` are the caller's to add."""
    return {ours: getattr(metadata, theirs) for theirs, ours in _pairs(metadata.num_prefills)}


def engine_rows(md: SWAMetadata, num_tokens: int) -> SWAMetadata:
    """``md`` over the engine's first ``num_tokens`` token rows (vLLM's ``num_actual_tokens``): the
    split, ``token_to_req_indices``, the rows and the visibility cut to them, views only.
    ``is_valid_token`` keeps every slot row, as vLLM's builder hands it out. The batch had every slot
    row (``batch_from_common_metadata``): the rows past ``num_tokens`` are padding rows, which only
    ``is_valid_token`` shows vLLM."""
    ndt, npt = md.num_decode_tokens, md.num_prefill_tokens
    if num_tokens >= ndt + npt:
        return md
    ndt = min(ndt, num_tokens)
    npt = num_tokens - ndt
    changes: dict[str, Any] = dict(
        num_decode_tokens=ndt,
        num_prefill_tokens=npt,
        token_to_req_indices=md.token_to_req_indices[:num_tokens],
        decode_swa_indices=md.decode_swa_indices[:ndt],
        decode_swa_lens=md.decode_swa_lens[:ndt],
    )
    for name in ("prefill_swa_indices", "prefill_swa_lens"):
        rows = getattr(md, name)
        changes[name] = rows[:npt] if rows is not None and npt else None
    for name in ("prefill_left_visible", "prefill_right_visible"):
        visible = getattr(md, name)
        if visible is not None:
            changes[name] = visible[:num_tokens]
    return dataclasses.replace(md, **changes)


# -- fields swa_hal does not know ---------------------------------------------------------------

# The fields of vLLM's ``CommonAttentionMetadata`` in the releases this plugin is tested with (0.33 and 0.34):
# what swa_hal reads of them, and what it knows vLLM's own SWA builder does not read. A field a later
# release adds may change what the rows should be (decode context parallelism's local lengths, say), so a
# build whose metadata sets one steps aside (docs/engines.md #drift).
KNOWN_COMMON_FIELDS = frozenset(
    {
        "query_start_loc",
        "query_start_loc_cpu",
        "seq_lens",
        "num_reqs",
        "num_actual_tokens",
        "max_query_len",
        "max_seq_len",
        "block_table_tensor",
        "slot_mapping",
        "causal",
        "logits_indices_padded",
        "num_logits_indices",
        "max_logits_per_req",
        "encoder_seq_lens",
        "encoder_seq_lens_cpu",
        "dcp_local_seq_lens",
        "dcp_local_seq_lens_cpu_upper_bound",
        "positions",
        "is_prefilling",
        "seq_lens_cpu_upper_bound",
        "req_idx",
        "mm_req_doc_ranges",
        "rswa_prefix_lens",
        "replayssm_decode_base_cpu",
        "_num_computed_tokens_cache",
        "_token_to_req_indices_cache",
    }
)
_unknown_fields: dict[type, tuple[tuple[str, Any], ...]] = {}  # metadata class -> (field, default) not known


def unknown_set_fields(cm: Any) -> list[str]:
    """The fields of ``cm`` (vLLM's common metadata) that are not ``KNOWN_COMMON_FIELDS`` and hold other than
    their default: what a build of it would not know. Looked up once per class: a build of a known class
    pays one dict lookup."""
    cls = type(cm)
    unknown = _unknown_fields.get(cls)
    if unknown is None:
        found = []
        if dataclasses.is_dataclass(cls):
            for f in dataclasses.fields(cls):
                if f.name not in KNOWN_COMMON_FIELDS:
                    default = f.default
                    if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
                        default = f.default_factory()
                    found.append((f.name, default))
        unknown = _unknown_fields[cls] = tuple(found)
    return [name for name, default in unknown if not _is_default(getattr(cm, name, default), default)]


def _is_default(value: Any, default: Any) -> bool:
    if value is default:
        return True
    if default is dataclasses.MISSING or isinstance(value, torch.Tensor) or isinstance(default, torch.Tensor):
        return False
    try:
        return bool(value == default)
    except Exception:  # noqa: BLE001 - a value that does not compare with its default is set
        return False


# -- the builder's config -----------------------------------------------------------------------


def _is_v41(cls: type) -> bool:
    return any(c.__name__ == "DeepseekV41SparseSWAMetadataBuilder" for c in cls.__mro__)


# The prefill context parallel sizes the plugin is checked at against vLLM's V4.1 builder, on every rank.
PCP_SIZES = (2, 4)


def pcp_size(vllm_config: Any) -> int:
    """vLLM's prefill context parallel size (1: none)."""
    return int(getattr(vllm_config.parallel_config, "prefill_context_parallel_size", 1) or 1)


def swa_config_from_vllm(builder: Any) -> SWAConfig:
    """The SWAConfig of a vLLM SWA builder, from the values vLLM's own ``__init__`` derived
    (window, block size, image tokens, drafting, capacities) and the model's compress ratios."""
    vllm_config = builder.vllm_config
    hf_config = vllm_config.model_config.hf_config
    v41 = _is_v41(type(builder))
    if v41:
        ratios = getattr(hf_config, "compress_ratios", None) or [0]
    else:
        ratios = get_compress_ratios(hf_config) or [1]
    spec = vllm_config.speculative_config
    k = int(builder.num_speculative_tokens or 0)
    method = None
    if k > 0:
        if builder.is_dspark:
            method = "dspark"
        else:
            name = str(getattr(spec, "method", "") or "").lower()
            method = name if name in SPECULATIVE_METHODS else "mtp"
    cfg = SWAConfig(
        window_size=int(builder.window_size),
        block_size=int(builder.block_size),
        compress_ratios=tuple(int(r) for r in ratios),
        max_model_len=int(builder.max_model_len),
        max_num_batched_tokens=int(builder.max_num_batched_tokens),
        # Under PCP a rank's batch holds up to two segments of each request (docs/semantics.md
        # #context-parallel-ranks; vLLM's PCPManager sizes its rank-local request buffers the same).
        max_num_seqs=int(vllm_config.scheduler_config.max_num_seqs) * (2 if pcp_size(vllm_config) > 1 else 1),
        num_speculative_tokens=k,
        speculative_method=method,
        # vLLM's own split width, whichever release's rule computed it (docs/semantics.md #split): 0.33
        # widens it under model runner V1's parallel drafting, 0.34 by the drafter's extra slots.
        split_threshold=int(builder.decode_threshold),
        head_size=int(builder.head_size),
        model_version="deepseek_v41" if v41 else "deepseek_v4",
        max_image_tokens=int(builder.max_image_tokens),
    )
    if builder.is_dspark and cfg.noncausal_index_width != builder.noncausal_index_width:
        raise ConfigError(
            "num_speculative_tokens",
            f"vLLM's DSpark row width is {builder.noncausal_index_width}; swa_hal's is {cfg.noncausal_index_width}",
        )
    return cfg


# -- the builder --------------------------------------------------------------------------------


class SwaHalSparseSWAMetadataBuilder(DeepseekSparseSWAMetadataBuilder):
    """vLLM's DeepSeek-V4 SWA builder whose rows come from a swa_hal ``SWAMetadataBuilder``.

    Same constructor as vLLM's (plus keyword-only ``backend``, ``platform`` and ``validate`` for
    swa_hal; defaults from ``swa_hal.integrations.vllm.configure``); ``build`` returns vLLM's
    ``DeepseekSparseSWAMetadata`` whose tensors are views of swa_hal's fixed buffers and of the step's
    own inputs. A call it does not know goes to vLLM's own build (docs/engines.md #drift); while the plugin
    shadows vLLM, vLLM's own build serves and swa_hal's is compared with it (docs/engines.md #shadow-mode).
    """

    # The vLLM class this one stands in for (``swa_hal_builder_cls`` sets it on each platform's).
    swa_hal_native_cls: type = DeepseekSparseSWAMetadataBuilder
    # Why this builder hands every call to vLLM's own code (None: it does not): its set-up met drift.
    swa_hal_aside: str | None = None

    def __init__(
        self,
        *args: Any,
        backend: str | None = None,
        platform: PlatformInfo | str | None = None,
        validate: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        try:
            self._swa_hal_setup(backend, platform, validate)
        except Exception as exc:
            # A setting swa_hal does not serve (a prefill context parallel size it is not checked at, image
            # tokens under V4.1), or an attribute of vLLM's this release no longer has: the builder stays vLLM's
            # own, every call of it (docs/engines.md #drift). SWA_HAL_STRICT=1 raises swa_hal's own error.
            if raised_by_engine(exc) or (isinstance(exc, SWAHalError) and env_flag("SWA_HAL_STRICT")):
                raise
            self.swa_hal_aside = drift_reason(exc)
            step_aside(ENGINE, "builder set-up", self.swa_hal_aside, log)

    def _swa_hal_setup(self, backend: str | None, platform: PlatformInfo | str | None, validate: bool | None) -> None:
        pcp = pcp_size(self.vllm_config)
        if pcp > 1 and (pcp not in PCP_SIZES or not _is_v41(type(self))):
            # Only vLLM's V4.1 builder takes this rank's chunk of the gathered slot mapping before the
            # base build (and only V4.1's FlashMLA SWA backend declares PCP support); a V4 builder
            # would hand swa_hal every rank's rows as its own. Other sizes are untested.
            sizes = " and ".join(map(str, PCP_SIZES))
            raise ConfigError(
                "prefill_context_parallel_size",
                f"{pcp}: prefill context parallelism is supported by swa_hal's vLLM plugin for "
                f"DeepSeek-V4.1 at sizes {sizes} only; set {ENV_SWITCH}=0 to run vLLM's own builders",
            )
        if isinstance(platform, str):
            platform = PlatformInfo.from_assume(platform)
        self.swa_config = swa_config_from_vllm(self)
        # A GroupBuilder: what a step build that serves this group records, its check() and poll read too.
        self.swa_hal = vllm_step.GroupBuilder(
            self.swa_config,
            device=self.device,
            backend=backend if backend is not None else options.backend,
            platform=platform if platform is not None else options.platform,
            validate=validate if validate is not None else options.validate,
            # vLLM's kernels read the planner objects of this class's build_tile_scheduler, never swa_hal's.
            tile_schedulers=False,
        )
        # Guard violations surface in vLLM's log (or raise, SWA_HAL_STRICT=1) a build late, without a
        # sync: nothing in vLLM calls check().
        self.swa_hal.violations.logger = log
        self._poll_violations = self.swa_hal.poll_violations
        # (plan, step group) once a step build serves this builder (swa_hal.integrations.vllm_step).
        self.swa_hal_step: tuple[Any, int] | None = None
        # (vLLM's metadata, swa_hal's) of this builder's latest build: a draft update of that metadata
        # carries the step's own inputs (``SWAMetadata.inputs``), which vLLM's metadata has no field for.
        self._handed: tuple[Any, SWAMetadata] | None = None
        # vLLM hands out visibility whenever a request lists images, even when none covers the
        # step's new tokens (all zeros then); these stay zero for exactly that case.
        self._no_visibility: tuple[torch.Tensor, torch.Tensor] | None = None
        if self.max_image_tokens > 0:
            zeros = lambda: torch.zeros(self._max_tokens, dtype=torch.int32, device=self.device)  # noqa: E731
            self._no_visibility = (zeros(), zeros())
        if not self.swa_hal.supports_draft_decode_metadata_update:
            self.supports_draft_decode_metadata_update = False
        # Last: a set-up that met drift before this point leaves vLLM's own buffers in place.
        self._adopt_native_buffers(shadowing=vllm_shadow.shadowing())

    @property
    def swa_hal_backend(self) -> str:
        return self.swa_hal.backend_name

    def _adopt_native_buffers(self, shadowing: bool) -> None:
        """vLLM's base allocated its own buffers; swa_hal's replace them. The per-token buffers become
        swa_hal's (same shapes). The index rows: serving, zero-width placeholders, so no code path can fill
        rows outside swa_hal (ROCm's one-launch decode build checks the buffer's width and declines), and
        vLLM's own build runs over swa_hal's rows only for a call that steps aside (``_native_rows``);
        shadowing, swa_hal's rows themselves, so vLLM's build (which serves) and swa_hal's (which it is
        compared with) fill the same memory, and the addresses a CUDA graph captured stay the ones a promoted
        swa_hal fills (docs/engines.md #shadow-mode)."""
        b = self.swa_hal.buffers
        self.token_to_req_indices = b.token_to_req
        self.is_valid_token = b.is_valid
        self.decode_swa_lens = b.decode_lens
        self.prefill_swa_lens = b.prefill_lens
        for name in ("left_visible", "right_visible", "span_indptr", "span_starts", "span_ends"):
            if hasattr(self, name):
                setattr(self, name, getattr(b, name))
        self._placeholders = not shadowing
        if shadowing:
            self._set_rows(self._swa_hal_rows())
        else:
            empty = lambda: torch.empty((self._max_tokens, 1, 0), dtype=torch.int32, device=self.device)  # noqa: E731
            self._set_rows((empty(), empty(), empty()))

    def _swa_hal_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """swa_hal's decode, prefill and (DSpark) non-causal row buffers, shaped as vLLM's."""
        b = self.swa_hal.buffers
        return b.decode_indices, b.prefill_indices, b.noncausal_indices if self.is_dspark else None

    def _set_rows(self, rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]) -> None:
        self.decode_swa_indices, self.prefill_swa_indices, self.decode_swa_indices_noncausal = rows

    def _native(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """vLLM's own ``method`` (the base class's) on this call, over swa_hal's row buffers: a builder serving
        with placeholders lends them for the call."""
        native = getattr(super(), method)
        if self.swa_hal_aside is not None or not self._placeholders:
            return native(*args, **kwargs)
        held = (self.decode_swa_indices, self.prefill_swa_indices, self.decode_swa_indices_noncausal)
        self._set_rows(self._swa_hal_rows())
        try:
            return native(*args, **kwargs)
        finally:
            self._set_rows(held)

    # -- build ------------------------------------------------------------------------------

    def swa_hal_batch(self, cm: Any, replay_start: torch.Tensor | None = None) -> AttentionBatch:
        """The step as a swa_hal batch: views of vLLM's tensors, nothing copied or synchronised
        (image spans go into swa_hal's fixed span buffers, as vLLM uploads them into its own)."""
        spans = step_image_spans(self.swa_hal, cm)
        return batch_from_common_metadata(cm, replay_start=replay_start, image_spans=spans)

    def build(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's ``build(common_prefix_len, common_attn_metadata, fast_build=False, replay_start=None)``
        (``swa_hal_build``). A call with arguments it does not know, or whose common metadata sets a field
        it does not know (``unknown_set_fields``), or whose build meets drift, steps aside to vLLM's own
        build; while the plugin shadows vLLM, vLLM's own build serves and swa_hal's is compared with it
        on the shadow's turns (``vllm_shadow``)."""
        why = self.swa_hal_aside or unbound(_BUILD_SIGNATURE, (self, *args), kwargs)
        cm = None
        if why is None:
            cm = _BUILD_SIGNATURE.bind(self, *args, **kwargs).arguments["common_attn_metadata"]
            fields = unknown_set_fields(cm)
            if fields:
                why = f"common metadata fields it does not know are set: {', '.join(fields)}"
        shadowed = lambda shadow: vllm_shadow.shadow_build(self, shadow, cm, args, kwargs)  # noqa: E731
        return self._answer("build", self.swa_hal_build, shadowed, why, args, kwargs)

    def _answer(
        self,
        hook: str,
        serve: Callable[..., Any],
        shadowed: Callable[..., Any],
        why: str | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """One call of vLLM's ``hook``: vLLM's own (``_native``) where ``why`` says swa_hal does not know it or
        ``serve`` meets drift (``swa_hal.integrations.aside``); ``shadowed(shadow)`` while the plugin shadows
        vLLM; else ``serve``'s answer."""
        if why is None:
            shadow = vllm_shadow.current()
            if shadow is not None and shadow.mode != "serve":
                return shadowed(shadow)
            try:
                return serve(*args, **kwargs)
            except SWAHalError:
                raise
            except Exception as exc:
                if raised_by_engine(exc):
                    raise
                why = drift_reason(exc)
        step_aside(ENGINE, hook, why, log)
        return self._native(hook, args, kwargs)

    def swa_hal_build(
        self,
        common_prefix_len: int,
        common_attn_metadata: Any,
        fast_build: bool = False,
        replay_start: torch.Tensor | None = None,
    ) -> Any:
        """swa_hal's answer to vLLM's ``build``: ``common_prefix_len`` and ``fast_build`` are accepted and, as in
        vLLM's builder, unused; ``replay_start`` is each request's lower bound (None: none). Then
        ``poll_violations``: a violation an earlier build recorded is logged (once per kind) or,
        under ``SWA_HAL_STRICT=1``, raised here. Inside a model-runner step whose step build serves this
        builder (``swa_hal.integrations.vllm_step``), the group's rows come from that one build."""
        cm = common_attn_metadata
        step = vllm_step.group_metadata(self, cm, replay_start)
        if step is None:
            md = engine_rows(self.swa_hal.build(self.swa_hal_batch(cm, replay_start)), cm.num_actual_tokens)
        elif step[2] is None:  # the step build refused the step's inputs: this group's own build says why
            md = engine_rows(vllm_step.build_alone(self, step[0], step[1], cm, replay_start), cm.num_actual_tokens)
            step = None
        else:
            md = engine_rows(step[2], cm.num_actual_tokens)
        self._poll_violations()
        fields = to_vllm(md)
        tile = engine_call(self.build_tile_scheduler, md.num_decode_tokens)
        for kind in LAYER_TYPES:
            fields[f"tile_sched_{kind}"] = tile.get(kind)
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
        out = DeepseekSparseSWAMetadata(**fields)
        if step is not None:  # what a draft step's grouped update finds
            step[0].hand_out(step[1], out, md)
        self._handed = (out, md)
        return out

    # -- speculative decoding ---------------------------------------------------------------

    def swa_hal_metadata(self, metadata: Any, hal: SWAMetadataBuilder | None = None) -> SWAMetadata:
        """swa_hal's view of a vLLM metadata this builder built (views only), for in-place updates;
        ``hal``: the swa_hal builder whose buffers it is (default: this builder's own). The metadata of this
        builder's latest build carries that build's own inputs (every one, not only those vLLM's fields
        hold); any other (one vLLM made itself) has none, and an update reads its fields."""
        hal = self.swa_hal if hal is None else hal
        handed = self._handed
        ptr = metadata.decode_swa_indices.untyped_storage().data_ptr()
        cfg = self.swa_config
        fields: dict[str, Any] = dict(
            window_size=cfg.window_size,
            max_model_len=cfg.max_model_len,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
        )
        fields.update(from_vllm(metadata))
        return SWAMetadata(
            **fields,
            causal=ptr == hal.buffers.decode_indices.untyped_storage().data_ptr(),
            tile_sched={},
            backend=hal.backend_name,
            inputs=handed[1].inputs if handed is not None and handed[0] is metadata else None,
        )

    def update_draft_decode_metadata(self, *args: Any, **kwargs: Any) -> None:
        """vLLM's ``update_draft_decode_metadata(metadata)`` (``swa_hal_update_draft``); a call it does not know,
        or one that meets drift, steps aside to vLLM's own update; shadowing, vLLM's own update serves and
        swa_hal's is compared with it on the shadow's turns."""
        why = self.swa_hal_aside or unbound(_UPDATE_SIGNATURE, (self, *args), kwargs)
        metadata = None if why is not None else _UPDATE_SIGNATURE.bind(self, *args, **kwargs).arguments["metadata"]
        shadowed = lambda shadow: vllm_shadow.shadow_update(self, shadow, metadata, args, kwargs)  # noqa: E731
        self._answer("update_draft_decode_metadata", self.swa_hal_update_draft, shadowed, why, args, kwargs)

    def swa_hal_update_draft(self, metadata: Any) -> None:
        """swa_hal's answer to vLLM's in-place draft-step refresh (capture-safe): swa_hal recomputes
        token_to_req, is_valid and the decode rows and lens (DSpark rows stay DSpark rows) from the advanced
        ``seq_lens``; ROCm AITER's ragged decode rows rebuilt from them; fresh tile schedulers;
        FlashInfer's index cache cleared. Metadata of a step build: the draft step's first group updates
        every group of the step in one grouped update (``vllm_step.StepPlan.update_draft``)."""
        ndt = metadata.num_decode_tokens
        if ndt == 0:
            return
        if not vllm_step.update_draft(self, metadata):
            hal = vllm_step.owner(self, metadata)
            hal.update_draft_decode_metadata(self.swa_hal_metadata(metadata, hal))
        slots = metadata.slot_mapping
        if slots.shape[0] > ndt and metadata.is_valid_token.shape[0] >= slots.shape[0]:
            torch.ge(slots[ndt:], 0, out=metadata.is_valid_token[ndt : slots.shape[0]])
        if getattr(metadata, "decode_swa_ragged_indptr", None) is not None:
            self._refresh_ragged_decode_rows(metadata)
        tile = engine_call(self.build_tile_scheduler, ndt)
        for kind in LAYER_TYPES:
            setattr(metadata, f"tile_sched_{kind}", tile.get(kind))
        metadata.flashinfer_sparse_index_cache.clear()

    def _refresh_ragged_decode_rows(self, metadata: Any) -> None:
        """ROCm AITER's ragged (CSR) decode rows, after the dense rows were updated. Its ``build`` makes
        them from the dense rows with ``build_ragged_indices_from_dense`` and copies them into its
        persistent buffers, of which the metadata's two fields are views: the same conversion over the
        updated rows, copied into that same memory, equals a fresh build at the advanced lengths and
        keeps the addresses a captured graph reads. No host sync."""
        from vllm.v1.attention.ops.rocm_aiter_mla_sparse import build_ragged_indices_from_dense

        ndt = metadata.num_decode_tokens
        flat, indptr = build_ragged_indices_from_dense(
            metadata.decode_swa_indices.reshape(ndt, metadata.decode_swa_width), metadata.decode_swa_lens
        )
        metadata.decode_swa_ragged_indptr.copy_(indptr, non_blocking=True)
        if flat.numel():
            metadata.decode_swa_ragged_indices[: flat.numel()].copy_(flat, non_blocking=True)


# The calls the builder knows: vLLM's, as swa_hal answers them.
_BUILD_SIGNATURE = inspect.signature(SwaHalSparseSWAMetadataBuilder.swa_hal_build)
_UPDATE_SIGNATURE = inspect.signature(SwaHalSparseSWAMetadataBuilder.swa_hal_update_draft)


# -- under vLLM's platform subclasses -----------------------------------------------------------

# vLLM's ROCm AITER SWA builders turn in-place draft-step updates off only because vLLM's update leaves
# their ragged decode rows stale; swa_hal's update rebuilds them (``_refresh_ragged_decode_rows``), so the
# swa_hal builder under either turns them back on. Named, not imported: importing a ROCm module reads the
# GPU's architecture.
RAGGED_ROW_BUILDERS = frozenset(
    {
        ("vllm.models.deepseek_v4.amd.rocm", "DeepseekV4ROCMAiterSparseSWAMetadataBuilder"),
        ("vllm.models.deepseek_v41.amd.rocm", "DeepseekV41ROCMAiterSparseSWAMetadataBuilder"),
    }
)


def _draft_updates_off_for_ragged_rows(native: type) -> bool:
    """Whether the class that decides ``native``'s ``supports_draft_decode_metadata_update`` (the
    first in its method order to set it) is one of vLLM's ROCm builders that set it off for their
    ragged rows. A subclass that sets it again keeps its own decision."""
    for cls in native.__mro__:
        if "supports_draft_decode_metadata_update" in cls.__dict__:
            return (cls.__module__, cls.__qualname__) in RAGGED_ROW_BUILDERS
    return False


_lock = threading.Lock()
_wrapped: dict[type, type] = {DeepseekSparseSWAMetadataBuilder: SwaHalSparseSWAMetadataBuilder}


def swa_hal_builder_cls(native: type) -> type:
    """The swa_hal builder for vLLM's builder class ``native`` (cached; any class that is not a
    DeepSeek-V4 SWA builder comes back unchanged): ``native`` over ``SwaHalSparseSWAMetadataBuilder``,
    with a unique name this module resolves (``__getattr__``), so pickle finds it in any process."""
    if is_swa_hal_builder(native):
        return native
    with _lock:
        cls = _wrapped.get(native)
        if cls is not None:
            return cls
        if not (isinstance(native, type) and issubclass(native, DeepseekSparseSWAMetadataBuilder)):
            return native
        # Unique, importable name: V4 and V4.1 have same-named subclasses in different modules.
        tail = native.__module__.removeprefix("vllm.").replace(".", "_")
        attr = f"SwaHal_{tail}_{native.__qualname__.replace('.', '_')}"
        namespace: dict[str, Any] = {
            "__module__": __name__,
            "__qualname__": attr,
            "__doc__": f"swa_hal rows under vLLM's {native.__module__}.{native.__qualname__}.",
            "swa_hal_native_cls": native,
        }
        if _draft_updates_off_for_ragged_rows(native):
            namespace["supports_draft_decode_metadata_update"] = True
        cls = type(native.__name__, (native, SwaHalSparseSWAMetadataBuilder), namespace)
        cls.__name__ = f"SwaHal{native.__name__}"
        _wrapped[native] = cls
        setattr(sys.modules[__name__], attr, cls)
        return cls


def __getattr__(name: str) -> Any:
    # A platform's builder is made on first use; pickle (in another process) asks for it by name.
    if name.startswith("SwaHal_"):
        for native in all_subclasses(DeepseekSparseSWAMetadataBuilder):
            cls = swa_hal_builder_cls(native)
            if cls.__qualname__ == name:
                return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
