"""SWAMetadata: what one build hands the attention layers, and the prefill chunk plan.

Field names follow the engines' builders (they are the contract engines read); the metadata is built
by keyword. Outputs that only one kind of backend produces are not fields: the backend declares
them as typed extras (a small dataclass each) and consumers ask ``metadata.extra(Kind)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import torch

from .errors import BatchCapacityError, BatchDtypeError, BatchShapeError, ConfigError
from .preflight import preflight_tensor

if TYPE_CHECKING:
    from .step_inputs import StepInputs

T = TypeVar("T")


class PrefillChunk(NamedTuple):
    start: int
    end: int
    max_compressed: int
    max_total: int


def prefill_chunk_plan(
    seq_lens: Sequence[int],
    query_lens: Sequence[int],
    *,
    window_size: int,
    max_model_len: int,
    max_num_batched_tokens: int,
    compress_ratio: int,
    chunk_size: int,
    has_compressed: bool | None = None,
) -> list[PrefillChunk]:
    """docs/semantics.md #prefill-metadata: greedy chunks of prefills whose padded area fits ``area_max``.

    A chunk [s, e) keeps growing while (e - s) * (max c + max g) stays within the bound; it always
    holds at least one request. Each chunk is (start, end, max compressed len, max total len).
    ``has_compressed``: whether the layer gathers a compressed cache; None means ``ratio > 1`` (V4);
    V4.1 passes True for its ratio-1 layers.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigError("chunk_size", f"must be an integer >= 1, got {chunk_size!r}")
    if isinstance(compress_ratio, bool) or not isinstance(compress_ratio, int) or compress_ratio < 0:
        raise ConfigError("compress_ratio", f"must be a non-negative integer, got {compress_ratio!r}")
    if has_compressed is None:
        has_compressed = compress_ratio > 1
    if has_compressed and compress_ratio < 1:
        raise ConfigError("compress_ratio", f"{compress_ratio}: a layer with a compressed cache needs a ratio >= 1")
    compressed_cap = math.ceil(max_model_len / compress_ratio) if has_compressed else 0
    area_max = chunk_size * (compressed_cap + window_size + max_num_batched_tokens)
    gathers = [q + min(max(s - q, 0), window_size - 1) for s, q in zip(seq_lens, query_lens)]
    compressed = [s // compress_ratio if has_compressed else 0 for s in seq_lens]
    chunks: list[PrefillChunk] = []
    s, n = 0, len(gathers)
    while s < n:
        nc, g, e = compressed[s], gathers[s], s + 1
        while e < n:
            nc2, g2 = max(nc, compressed[e]), max(g, gathers[e])
            if (e - s + 1) * (nc2 + g2) > area_max:
                break
            nc, g, e = nc2, g2, e + 1
        chunks.append(PrefillChunk(s, e, nc, nc + g))
        s = e
    return chunks


def _tile_sched_of(layer_type: str) -> Any:
    """The property an engine reads ``layer_type``'s planner object through (None: none built)."""
    return property(lambda self: self.tile_sched.get(layer_type))


@dataclasses.dataclass(eq=False, kw_only=True)
class SWAMetadata:
    # The step's inputs, passed through for the consumers.
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    # docs/semantics.md #split
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int
    # #per-token-helpers
    token_to_req_indices: torch.Tensor
    is_valid_token: torch.Tensor
    # #causal-rows / #dspark-rows decode rows: [num_decode_tokens, 1, decode_swa_width] int32 and lens
    decode_swa_indices: torch.Tensor
    decode_swa_lens: torch.Tensor
    decode_swa_width: int
    causal: bool
    max_decode_query_len: int
    # #causal-rows prefill rows [num_prefill_tokens, 1, window + max_image_tokens] (None without prefill tokens)
    prefill_swa_indices: torch.Tensor | None = None
    prefill_swa_lens: torch.Tensor | None = None
    # #prefill-metadata (None without prefills)
    prefill_gather_lens: torch.Tensor | None = None
    prefill_seq_lens: torch.Tensor | None = None
    prefill_seq_lens_cpu: torch.Tensor | None = None
    prefill_query_lens_cpu: torch.Tensor | None = None
    # #bounded-replay: int32 [num_reqs], zeros when the batch has no bound
    replay_start: torch.Tensor
    # #vision-spans: int32 [num_tokens] by absolute token (prefill rows meaningful), None without spans
    prefill_left_visible: torch.Tensor | None = None
    prefill_right_visible: torch.Tensor | None = None
    # Static facts
    block_size: int
    window_size: int
    max_model_len: int
    max_num_batched_tokens: int
    # #layer-types-and-schedulers: every layer type -> a fresh planner object from the backend, or None
    tile_sched: Mapping[str, Any]
    backend: str
    # Backend-declared typed extras (see ``extra``).
    extras: tuple[Any, ...] = ()
    # The step's per-request inputs the build read (``StepInputs``; seq_lens, query_start_loc and its host
    # copy above are its tensors): one object for every group of a build. None for metadata made from an
    # engine's own (an update then reads the fields above).
    inputs: StepInputs | None = None

    @classmethod
    def for_step(
        cls,
        shape: dict[str, Any],
        *,
        inputs: StepInputs,
        replay_start: torch.Tensor,
        block_table: torch.Tensor,
        slot_mapping: torch.Tensor,
        tile_sched: Mapping[str, Any],
        prefill_seq_lens: torch.Tensor | None = None,
        prefill_seq_lens_cpu: torch.Tensor | None = None,
        prefill_query_lens_cpu: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
    ) -> SWAMetadata:
        """The metadata of one step: ``shape`` (``shape_fields``, made once per build shape) holds every
        field that follows from the shape, the step brings the rest (its ``inputs``, the replay bounds the
        build read, group 0's table and slot mapping, planner objects, the prefills' lengths; ``seq_lens``,
        the step's R entries of ``inputs.seq_lens`` where that is longer). The builder's constructor, once
        per step: it skips the keyword constructor's per-field work, which ``shape_fields`` has done (and
        checked) once."""
        fields = shape.copy()  # one block copy; the step's fields overwrite placeholders (no resize)
        fields["inputs"] = inputs
        fields["seq_lens"] = inputs.seq_lens if seq_lens is None else seq_lens
        fields["query_start_loc"] = inputs.query_start_loc
        fields["query_start_loc_cpu"] = inputs.query_start_loc_cpu
        fields["replay_start"] = replay_start
        fields["block_table"] = block_table
        fields["slot_mapping"] = slot_mapping
        fields["tile_sched"] = tile_sched
        if prefill_seq_lens is not None:
            fields["prefill_seq_lens"] = prefill_seq_lens
            fields["prefill_seq_lens_cpu"] = prefill_seq_lens_cpu
            fields["prefill_query_lens_cpu"] = prefill_query_lens_cpu
        new = object.__new__(cls)
        new.__dict__ = fields
        return new

    def for_group(
        self,
        views: Mapping[str, Any],
        *,
        block_table: torch.Tensor,
        slot_mapping: torch.Tensor,
        tile_sched: Mapping[str, Any],
    ) -> SWAMetadata:
        """Another KV-cache group's metadata of the same build (docs/semantics.md #group-builds): this
        metadata's fields, with that group's ``views`` of its fixed buffers (``group_views``), its block
        table and slot mapping, and its own planner objects."""
        new = object.__new__(SWAMetadata)
        new.__dict__ = {
            **self.__dict__,
            **views,
            "block_table": block_table,
            "slot_mapping": slot_mapping,
            "tile_sched": tile_sched,
        }
        return new

    def extra(self, kind: type[T]) -> T | None:
        """The extra of type ``kind`` a backend attached to this build, or None."""
        for item in self.extras:
            if isinstance(item, kind):
                return item
        return None

    def get_prefill_chunk_plan(
        self, compress_ratio: int, chunk_size: int, has_compressed: bool | None = None
    ) -> list[PrefillChunk]:
        """#prefill-metadata chunk plan over this step's prefills, from host copies only (no sync)."""
        if self.num_prefills == 0:
            return []
        assert self.prefill_seq_lens_cpu is not None and self.prefill_query_lens_cpu is not None
        return prefill_chunk_plan(
            self.prefill_seq_lens_cpu.tolist(),
            self.prefill_query_lens_cpu.tolist(),
            window_size=self.window_size,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=self.max_num_batched_tokens,
            compress_ratio=compress_ratio,
            chunk_size=chunk_size,
            has_compressed=has_compressed,
        )

    def preflight_update(self, device_index: int, capacity: int) -> None:
        """The preflight of a draft-step update of this metadata (the O(1) host checks, with the helpers of
        ``preflight.py``): the tensors it reads in place are still what the build checked (an engine may have
        swapped one for another view), and the sizes it launches with are the build's (an engine that rebuilt
        the metadata may claim more decode tokens than its rows hold). ``device_index`` and ``capacity``:
        the builder's."""
        ndt, nd = self.num_decode_tokens, self.num_decodes
        for name, value in (("num_decode_tokens", ndt), ("num_decodes", nd)):
            if value.__class__ is not int:
                raise BatchDtypeError(name, f"{name} must be an int, got {value!r}")
        if self.causal.__class__ is not bool:
            raise BatchDtypeError("causal", f"causal must be a bool, got {self.causal!r}")
        if not 0 <= ndt <= capacity:
            raise BatchCapacityError(
                "num_decode_tokens", f"num_decode_tokens={ndt} is outside [0, {capacity}] (the builder's capacity)"
            )
        rows, lens = self.decode_swa_indices, self.decode_swa_lens
        if rows.shape[0] != ndt or lens.shape[0] != ndt:
            raise BatchShapeError(
                "num_decode_tokens",
                f"num_decode_tokens={ndt}, but the metadata's decode rows hold {rows.shape[0]} rows and lens "
                f"{lens.shape[0]}: an update rewrites the rows its build made",
            )
        num_reqs = self.query_start_loc.shape[0] - 1
        if not 0 <= nd <= num_reqs:
            raise BatchShapeError("num_decodes", f"num_decodes={nd} is outside [0, {num_reqs}] (the requests)")
        preflight_tensor("seq_lens", self.seq_lens, torch.int32, device_index)
        preflight_tensor("query_start_loc", self.query_start_loc, torch.int32, device_index)
        preflight_tensor("block_table", self.block_table, torch.int32, device_index, 2)
        preflight_tensor("slot_mapping", self.slot_mapping, torch.int64, device_index)
        preflight_tensor("replay_start", self.replay_start, torch.int32, device_index)
        if self.seq_lens.shape[0] < num_reqs or self.block_table.shape[0] < num_reqs:
            raise BatchShapeError("seq_lens", f"seq_lens / block_table have fewer rows than the {num_reqs} requests")
        if self.slot_mapping.shape[0] < self.num_decode_tokens:
            raise BatchShapeError(
                "slot_mapping",
                f"slot_mapping has {self.slot_mapping.shape[0]} entries for {self.num_decode_tokens} decode tokens",
            )
        if self.replay_start.shape[0] < num_reqs:
            raise BatchShapeError(
                "replay_start", f"replay_start has {self.replay_start.shape[0]} entries for {num_reqs} requests"
            )

    # Aliases under the engines' names.
    @property
    def prefill_window_size(self) -> int:
        return self.window_size

    @property
    def prefill_max_model_len(self) -> int:
        return self.max_model_len

    @property
    def prefill_max_num_batched_tokens(self) -> int:
        return self.max_num_batched_tokens

    tile_sched_swaonly = _tile_sched_of("swaonly")
    tile_sched_c4a = _tile_sched_of("c4a")
    tile_sched_c128a = _tile_sched_of("c128a")
    tile_sched_c1a = _tile_sched_of("c1a")
    tile_sched_c2a = _tile_sched_of("c2a")


# The fields a step brings (``SWAMetadata.for_step``); every other field follows from the build's shape.
STEP_FIELDS = frozenset(
    (
        "inputs",
        "seq_lens",
        "query_start_loc",
        "query_start_loc_cpu",
        "replay_start",
        "prefill_seq_lens",
        "prefill_seq_lens_cpu",
        "prefill_query_lens_cpu",
        "block_table",
        "slot_mapping",
        "tile_sched",
    )
)
# The fields in which KV-cache groups of one build differ, besides the block table, slot mapping and
# planner objects: each group's views of its own fixed buffers (``SWAMetadata.for_group``).
GROUP_VIEW_FIELDS = frozenset(
    (
        "token_to_req_indices",
        "is_valid_token",
        "decode_swa_indices",
        "decode_swa_lens",
        "prefill_swa_indices",
        "prefill_swa_lens",
    )
)
_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(SWAMetadata) if f.default is not dataclasses.MISSING
}
_SHAPE_FIELDS = frozenset(f.name for f in dataclasses.fields(SWAMetadata)) - STEP_FIELDS


def shape_fields(**fields: Any) -> dict[str, Any]:
    """The fields of a build shape's metadata (views of the fixed buffers, sizes, static facts): every
    field but ``STEP_FIELDS``, the defaulted ones optional. Checked once, when a shape is first built."""
    out = {name: value for name, value in _DEFAULTS.items() if name in _SHAPE_FIELDS}
    out.update(fields)
    if out.keys() != _SHAPE_FIELDS:
        missing, extra = sorted(_SHAPE_FIELDS - out.keys()), sorted(out.keys() - _SHAPE_FIELDS)
        raise TypeError(f"shape_fields: missing {missing}, unexpected {extra}")
    # The step's fields too, as placeholders: a copy of this dict then takes them without growing.
    out.update(dict.fromkeys(sorted(STEP_FIELDS)))
    return out


def group_views(shape: Mapping[str, Any]) -> dict[str, Any]:
    """A group's views of its fixed buffers, from its ``shape_fields`` (``SWAMetadata.for_group``)."""
    return {name: shape[name] for name in GROUP_VIEW_FIELDS}
