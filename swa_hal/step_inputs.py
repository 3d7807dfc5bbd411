"""StepInputs: a step's per-request inputs (docs/semantics.md #inputs), made and checked once per step.

Every KV-cache group of a step reads the same per-request inputs: the query offsets, the sequence
lengths, their host copies, the query-length bound, causality, the replay bounds and the image spans.
They travel as one frozen object: a batch is these inputs plus one group's block table and slot
mapping (``AttentionBatch``), a build's plan and metadata carry them unchanged, and the vLLM step path
hands a group the step's rows only when its inputs come from the same engine objects (compared by
identity first, then item by item: ``integrations.engine.same_sources``) that no one changed in place
since (their version counters). A new per-request input is one field here and one line in ``preflight``; the other
files it touches are listed in docs/kernels.md, "Adding a per-request input".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from .errors import BatchCapacityError, BatchDtypeError, BatchShapeError
from .preflight import check_unbounded_padding, preflight_tensor, refuse_host_copy, refuse_untyped_spans

if TYPE_CHECKING:
    from .config import SWAConfig
    from .spans import ImageSpans


class StepInputs(NamedTuple):
    """A step's per-request inputs, decodes first (docs/semantics.md #inputs).

    Device tensors: ``seq_lens`` int32 [R], ``query_start_loc`` int32 [R+1]. Host copies:
    ``query_start_loc_cpu`` int32 [R+1], ``seq_lens_cpu`` int32 [R] or None (exact for prefill rows,
    an upper bound for decode rows). ``max_query_len`` bounds every request's query length; ``num_tokens``
    is T, the token rows (the scheduled tokens and any padding rows after them). ``causal``: causal rows,
    or DSpark's non-causal ones. ``replay_start`` int32 [R] (device): each request's lower bound on the
    window (docs/semantics.md #bounded-replay; None: no bound); ``image_spans``: the vision variant's
    spans (#vision-spans; None: none).

    Immutable (a NamedTuple: made once per step, cheaply). A grouped draft update tells the metadata of
    one build by this object's identity (``is``): the same inputs are the same object, never a
    comparison of tensor values.
    """

    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor | None
    max_query_len: int
    num_tokens: int
    causal: bool = True
    replay_start: torch.Tensor | None = None
    image_spans: ImageSpans | None = None

    @property
    def num_reqs(self) -> int:
        return self.query_start_loc_cpu.shape[0] - 1

    def replace(self, **changes: Any) -> StepInputs:
        """These inputs with ``changes`` (a new object: inputs are never changed in place)."""
        return self._replace(**changes)

    def to(self, device: str | torch.device) -> StepInputs:
        """The same inputs with their device tensors on ``device`` (host copies stay on the CPU)."""
        return self.replace(
            seq_lens=self.seq_lens.to(device),
            query_start_loc=self.query_start_loc.to(device),
            replay_start=None if self.replay_start is None else self.replay_start.to(device),
            image_spans=None if self.image_spans is None else self.image_spans.to(device),
        )

    def preflight(self, config: SWAConfig, capacity: int, device_index: int, validated: bool = False) -> int:
        """Host-only, O(1) checks of these inputs that keep every kernel launch inside them (docs/semantics.md
        #guarded-builds); reads no device value. Returns the number of requests R. The block tables and slot
        mappings are checked with them by the build (``preflight.group_inputs``). A ``validated`` build runs
        them too, so it types everything the default path types, and admits an overstated ``max_query_len``
        of any size (full validation holds it to the queries instead of the capacity)."""
        seq_lens, qsl = self.seq_lens, self.query_start_loc
        i32 = torch.int32
        # The common case in one expression over attributes read once (this runs on every step);
        # on any failure the per-tensor checks below name the broken rule.
        try:
            qs, ss = qsl.shape, seq_lens.shape
            ok = (
                seq_lens.dtype is i32
                and qsl.dtype is i32
                and seq_lens.get_device() == device_index
                and qsl.get_device() == device_index
                and (device_index >= 0 or not (seq_lens.is_meta or qsl.is_meta))  # preflight.META
                and len(qs) == 1
                and len(ss) == 1
                and qsl.is_contiguous()  # 1-D: unit stride, or at most one element
                and seq_lens.is_contiguous()
            )
        except AttributeError:
            ok = False
        if not ok:
            preflight_tensor("seq_lens", seq_lens, i32, device_index)
            preflight_tensor("query_start_loc", qsl, i32, device_index)
            qs, ss = qsl.shape, seq_lens.shape
        num_tokens = self.num_tokens
        if num_tokens.__class__ is not int:
            raise BatchDtypeError("num_tokens", f"num_tokens must be an int, got {num_tokens!r}")
        if num_tokens > capacity:
            raise BatchCapacityError(
                "num_tokens",
                f"num_tokens={num_tokens} exceeds the builder's capacity (max_num_batched_tokens={capacity})",
            )
        if num_tokens < 1:
            raise BatchShapeError("num_tokens", f"num_tokens={num_tokens}: the batch is empty")
        mql = self.max_query_len
        if mql.__class__ is not int or mql < 0 or (mql > capacity and not validated):
            bound = "a non-negative int" if validated else f"an int in [0, {capacity}]"
            raise BatchDtypeError("max_query_len", f"max_query_len must be {bound}, got {mql!r}")
        if self.causal.__class__ is not bool:
            raise BatchDtypeError("causal", f"causal must be a bool, got {self.causal!r}")
        qsl_cpu, seq_cpu = self.query_start_loc_cpu, self.seq_lens_cpu
        # The plan reads the host copies as numpy arrays: one on another device (a meta tensor, a GPU copy)
        # would fail there with an untyped error, so it is refused by name first.
        try:
            host_ok = (
                qsl_cpu.is_cpu
                and qsl_cpu.dtype is i32
                and qsl_cpu.dim() == 1
                and (seq_cpu is None or (seq_cpu.is_cpu and seq_cpu.dtype is i32 and seq_cpu.dim() == 1))
            )
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
            raise BatchCapacityError(
                "seq_lens", f"seq_lens has {num_reqs} requests; max_num_seqs is {config.max_num_seqs}"
            )
        if qs[0] != num_reqs + 1:
            raise BatchShapeError(
                "query_start_loc", f"query_start_loc has {qs[0]} entries; query_start_loc_cpu has {num_reqs + 1}"
            )
        if ss[0] < num_reqs:
            raise BatchShapeError("seq_lens", f"seq_lens has {ss[0]} entries for {num_reqs} requests")
        if seq_cpu is not None and seq_cpu.shape[0] < num_reqs:  # the plan would drop the last prefills
            raise BatchShapeError(
                "seq_lens_cpu", f"seq_lens_cpu has {seq_cpu.shape[0]} entries for {num_reqs} requests"
            )
        replay = self.replay_start
        if replay is not None:
            preflight_tensor("replay_start", replay, i32, device_index)
            if replay.shape[0] < num_reqs:
                check_unbounded_padding(replay.shape[0], num_reqs, qsl_cpu)
        spans = self.image_spans
        if spans is not None:
            refuse_untyped_spans(spans)
            preflight_tensor("image_spans.indptr", spans.indptr, i32, device_index)
            preflight_tensor("image_spans.starts", spans.starts, i32, device_index)
            preflight_tensor("image_spans.ends", spans.ends, i32, device_index)
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
        return num_reqs


# The field names, in order: what a batch reads through to.
FIELDS = StepInputs._fields
