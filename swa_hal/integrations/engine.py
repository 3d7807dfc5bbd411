"""The engine-facing surface of an engine's own SWA metadata builder, over swa_hal.

An engine keeps its per-step ``CommonAttentionMetadata``-like object; ``batch_from_common_metadata``
reads it by field name (no copies, no host syncs; the one conversion, with one rule for padding rows,
that the vLLM plugin uses too), ``step_image_spans`` takes the step's images from it, and
``EngineSWABuilder`` offers the methods the engine already calls: ``build(common_prefix_len, common_attn_metadata, fast_build=False, replay_start=None)``,
``update_draft_decode_metadata``, ``reorder_batch_threshold`` and its CUDA-graph support level.
"""

from __future__ import annotations

import enum
import numbers
import operator
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..batch import AttentionBatch, ImageSpans, check_image_ranges, ranges_in_step
from ..builder import SWAMetadataBuilder
from ..cache import tensor_key
from ..config import SWAConfig
from ..errors import BatchDeviceError, BatchDtypeError, BatchShapeError
from ..metadata import SWAMetadata
from ..platform import PlatformInfo
from ..step_inputs import StepInputs

# The engines' attribute of image ranges, ``{request: [(start, end), ...]}``, named in its errors.
RANGES = "mm_req_doc_ranges"


class CudaGraphSupport(enum.IntEnum):
    """How much of a batch may be captured in a CUDA graph (the engines' usual levels)."""

    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    UNIFORM_BATCH = 2  # decode-only batches with one query length, MTP included
    ALWAYS = 3


def _num_reqs(cm: Any) -> int:
    num_reqs = getattr(cm, "num_reqs", None)
    return int(num_reqs) if num_reqs is not None else cm.query_start_loc_cpu.shape[0] - 1


def _seq_lens_cpu(cm: Any) -> torch.Tensor | None:
    seq_cpu = getattr(cm, "seq_lens_cpu_upper_bound", None)
    return seq_cpu if seq_cpu is not None else getattr(cm, "seq_lens_cpu", None)


def _first(t: torch.Tensor, n: int) -> torch.Tensor:
    return t if t.shape[0] == n else t[:n]


def _integer(name: str, value: Any) -> int:
    """An engine's integer setting of the step as an int: a Python or numpy integer, or a one-element integer
    tensor in host memory. A float, a bool or a meta tensor would otherwise be truncated or fail inside
    ``int()``, so each is refused by name first."""
    if isinstance(value, torch.Tensor):
        if value.is_meta or not value.is_cpu:
            raise BatchDeviceError(name, f"{name} is on {value.device}; it must be a host integer")
        if value.numel() != 1 or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise BatchDtypeError(name, f"{name} must be an integer, got a {value.dtype} tensor {tuple(value.shape)}")
        return int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise BatchDtypeError(name, f"{name} must be an integer, got {value!r}")
    return int(value)


def _flag(name: str, value: Any) -> bool:
    """An engine's flag of the step: ``bool()`` of anything else (a string, a tensor) would decide the rows
    by its truth value, or fail inside it (a meta tensor)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise BatchDtypeError(name, f"{name} must be a bool, got {value!r}")


def step_sources(cm: Any, replay_start: torch.Tensor | None) -> tuple[Any, ...]:
    """The engine's objects a step's inputs are made from, as ``inputs_from_common_metadata`` reads them:
    ``seq_lens``, ``query_start_loc``, ``query_start_loc_cpu``, the host copy of seq_lens
    (``seq_lens_cpu_upper_bound`` or ``seq_lens_cpu``), ``num_reqs``, ``max_query_len``,
    ``num_actual_tokens``, ``causal``, the image ranges (``mm_req_doc_ranges``) and ``replay_start``. Two
    groups of a step whose sources are the same objects (``same_sources``) have the same inputs: the one
    list of what a step shares (a new input read from the engine is read here)."""
    return (
        cm.seq_lens,
        cm.query_start_loc,
        cm.query_start_loc_cpu,
        _seq_lens_cpu(cm),
        getattr(cm, "num_reqs", None),
        cm.max_query_len,
        getattr(cm, "num_actual_tokens", None),
        getattr(cm, "causal", True),
        getattr(cm, RANGES, None),
        replay_start,
    )


def same_sources(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Whether two ``step_sources`` give the same inputs: the same objects (how engines hand them to every
    group), or else, item by item, tensors that are the same memory seen the same way (``tensor_key``)
    and other values that are equal (never a tensor comparison)."""
    return all(map(operator.is_, a, b)) or all(map(_same_source, a, b))


def _same_source(x: Any, y: Any) -> bool:
    if x is y:
        return True
    x_tensor, y_tensor = isinstance(x, torch.Tensor), isinstance(y, torch.Tensor)
    if x_tensor or y_tensor:
        return x_tensor and y_tensor and tensor_key(x) == tensor_key(y)
    return _same_value(x, y)


def _same_value(x: Any, y: Any) -> bool:
    """Equal and of the same type, through lists, tuples and dicts (the image ranges): ``1 == True`` and
    ``4.0 == 4`` in Python, but a group whose ``causal`` is 1 or whose ``max_query_len`` is 4.0 must not
    take the inputs of a group whose values are right, or it would pass where it is refused built alone."""
    if type(x) is not type(y):
        return False
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(map(_same_value, x, y))
    if isinstance(x, dict):  # in order: the same ranges listed in another order only build alone
        return _same_value(list(x.items()), list(y.items()))
    return bool(x == y)


def inputs_from_common_metadata(
    cm: Any,
    *,
    replay_start: torch.Tensor | None = None,
    image_spans: ImageSpans | None = None,
    sources: tuple[Any, ...] | None = None,
) -> StepInputs:
    """The step's inputs from an engine's per-step common metadata (``sources``: its ``step_sources``, when
    the caller has them), sharing the engine's tensors (nothing is copied or synchronised); the rules of
    ``batch_from_common_metadata``. ``image_spans`` are the spans ``step_image_spans`` made from the
    image ranges."""
    seq_lens, qsl, qsl_cpu, seq_cpu, num_reqs, max_query_len, actual, causal, _, replay = (
        step_sources(cm, replay_start) if sources is None else sources
    )
    num_tokens = cm.slot_mapping.shape[0]
    if actual is not None:
        actual = _integer("num_actual_tokens", actual)
        if actual > num_tokens:
            raise BatchShapeError(
                "num_actual_tokens", f"num_actual_tokens={actual} exceeds the slot_mapping's {num_tokens} rows"
            )
    num_reqs = int(num_reqs) if num_reqs is not None else qsl_cpu.shape[0] - 1
    return StepInputs(
        seq_lens=_first(seq_lens, num_reqs),
        query_start_loc=qsl,
        query_start_loc_cpu=qsl_cpu,
        seq_lens_cpu=None if seq_cpu is None else _first(seq_cpu, num_reqs),
        max_query_len=_integer("max_query_len", max_query_len),
        num_tokens=num_tokens,
        causal=_flag("causal", causal),
        replay_start=replay,
        image_spans=image_spans,
    )


def batch_from_common_metadata(
    cm: Any, *, replay_start: torch.Tensor | None = None, image_spans: ImageSpans | None = None
) -> AttentionBatch:
    """An AttentionBatch that shares the engine's tensors (nothing is copied or synchronised): the one
    conversion of an engine's per-step common metadata, used by ``EngineSWABuilder`` and by the vLLM
    plugin alike.

    Reads ``seq_lens``, ``seq_lens_cpu_upper_bound`` (or ``seq_lens_cpu``), ``query_start_loc``,
    ``query_start_loc_cpu``, ``block_table_tensor``, ``slot_mapping``, ``max_query_len``, and, where the
    engine has them, ``num_reqs`` (R; else ``len(query_start_loc) - 1``), ``num_actual_tokens`` and
    ``causal`` (default True). ``seq_lens`` and its host copy are cut to R rows when longer (views).
    ``replay_start`` and ``image_spans`` pass through (docs/semantics.md #bounded-replay, #vision-spans;
    ``step_image_spans`` makes the spans from the engine's image ranges).

    Padding rows, one rule for every engine: the token rows T of the batch are all the rows of the slot
    mapping (``slot_mapping.shape[0]``), and the rows past the scheduled tokens, ``t >= query_start_loc[R]``,
    are padding rows as docs/semantics.md defines them (#inputs: T may exceed the scheduled tokens by
    padding rows; #split: they go with the prefills, or are decode rows when every request is a decode;
    #per-token-helpers: ``token_to_req_indices`` maps them to request 0, ``is_valid_token`` is
    ``slot_mapping >= 0``; vector C2). The engine marks them with slot -1 (full validation rejects any
    other slot there), so they are invalid tokens whose rows are empty: lens 0, every entry -1.
    ``num_actual_tokens`` decides no row: engines differ on whether it counts the padding (vLLM's does;
    others count the scheduled tokens), so it is only checked to be at most T. Every row the engine's
    slot mapping has is therefore written by the build, none left to an earlier build's values in the
    fixed buffers; an engine whose metadata covers only its first ``num_actual_tokens`` rows (vLLM's)
    takes the first rows of the outputs.
    """
    inputs = inputs_from_common_metadata(cm, replay_start=replay_start, image_spans=image_spans)
    return AttentionBatch(inputs=inputs, block_table=cm.block_table_tensor, slot_mapping=cm.slot_mapping)


def step_image_spans(builder: SWAMetadataBuilder, cm: Any) -> ImageSpans | None:
    """The step's image spans from ``cm.mm_req_doc_ranges`` (``{request: [(start, end), ...]}``), in the
    builder's fixed span buffers; None when the model is not the vision variant or no image lies over
    the step's new tokens. Engines list every image of a request (prefilled by an earlier chunk, or
    still to come); only those over this step's tokens are spans of the batch (docs/semantics.md
    #vision-spans)."""
    ranges = getattr(cm, RANGES, None)
    if not ranges or builder.config.max_image_tokens <= 0:
        return None
    num_reqs = _num_reqs(cm)
    # Malformed ranges are a BatchValidationError naming the request and the range, checked before any
    # host copy of seq_lens is made.
    ranges = check_image_ranges(ranges, num_reqs, RANGES)
    if not any(ranges.values()):
        return None
    seq_cpu = _seq_lens_cpu(cm)
    if seq_cpu is None:
        seq_cpu = cm.seq_lens.cpu()  # only in steps with images, and only without a host copy
    step = ranges_in_step(ranges, cm.query_start_loc_cpu, seq_cpu, num_reqs, RANGES)
    return builder.image_spans_from_ranges(step, num_reqs) if step else None


class EngineSWABuilder:
    """An engine's SWA metadata builder surface, delegating to SWAMetadataBuilder (docs/engines.md,
    "Using swa_hal in an engine without a plugin").

    ``config``/``device``: the model and engine configuration and the device the builds run on.
    ``backend``: a swa_hal backend name (None: ``SWA_HAL_BACKEND``, else auto-selection); ``platform``:
    replaces the device probe; ``validate``: full validation on every build (None: ``SWA_HAL_DEBUG``).
    The underlying ``SWAMetadataBuilder`` is ``self.builder`` (``check()``, ``build_groups``, ...). Make one
    per device and thread, at start-up, and keep it: a captured CUDA graph reads its fixed buffers.
    """

    cudagraph_support = CudaGraphSupport.UNIFORM_BATCH
    # The builder needs decodes first and nothing more: it asks for no reordering.
    reorder_batch_threshold: int | None = None

    def __init__(
        self,
        config: SWAConfig,
        device: str | torch.device,
        *,
        backend: str | None = None,
        platform: PlatformInfo | None = None,
        validate: bool | None = None,
    ):
        self.builder = SWAMetadataBuilder(config, device=device, backend=backend, platform=platform, validate=validate)

    @classmethod
    def from_hf_config(
        cls, hf_config: Mapping[str, Any] | str | Any, device: str | torch.device, **engine_settings: Any
    ):
        """A builder for the model whose Hugging Face config is ``hf_config`` (a dict, a ``config.json`` or its
        folder, or a loaded config object), in DeepSeek's format or the upstream one (docs/semantics.md
        #model-configs), with the engine's settings (``block_size``, ``max_num_batched_tokens``,
        ``max_num_seqs``, speculative settings; see ``SWAConfig.from_hf_config``); ``backend=`` forces a
        swa_hal backend."""
        backend = engine_settings.pop("backend", None)
        return cls(SWAConfig.from_hf_config(hf_config, **engine_settings), device, backend=backend)

    @property
    def decode_threshold(self) -> int:
        """The longest query that still counts as a decode (docs/semantics.md #split)."""
        return self.builder.decode_threshold

    @property
    def supports_draft_decode_metadata_update(self) -> bool:
        """Whether ``update_draft_decode_metadata`` is available on this builder's backend."""
        return self.builder.supports_draft_decode_metadata_update

    @property
    def backend_name(self) -> str:
        """The swa_hal backend that builds (``swa-hal info`` explains the choice)."""
        return self.builder.backend_name

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: Any,
        fast_build: bool = False,
        replay_start: torch.Tensor | None = None,
    ) -> SWAMetadata:
        """Build this step's metadata. ``common_prefix_len`` and ``fast_build`` are accepted for the
        engine's interface; sliding-window rows have no cascade prefix and one build path.
        ``replay_start``: each request's lower bound on the window (None: none). Image spans are read
        from ``common_attn_metadata.mm_req_doc_ranges`` (``{request: [(start, end), ...]}``) when the
        model is the vision variant and the step has prefill tokens."""
        cm = common_attn_metadata
        spans = step_image_spans(self.builder, cm)
        batch = batch_from_common_metadata(cm, replay_start=replay_start, image_spans=spans)
        return self.builder.build(batch)

    def build_for_cudagraph_capture(self, common_attn_metadata: Any) -> SWAMetadata:
        """The build an engine runs while capturing a CUDA graph: ``build(0, common_attn_metadata)``."""
        return self.build(0, common_attn_metadata)

    def update_draft_decode_metadata(self, metadata: SWAMetadata) -> None:
        """After the engine advanced ``seq_lens`` (and the slot mapping) in place by one draft step, rewrite
        the decode rows of ``metadata`` in place; no host sync, no allocation, safe under graph capture
        (docs/semantics.md #draft-updates)."""
        self.builder.update_draft_decode_metadata(metadata)

    def warmup(self) -> int:
        """Compile every kernel variant this configuration can launch, so no build compiles mid-serving;
        returns the number of variants prepared (0 for a backend without kernels to compile)."""
        return self.builder.warmup()
