"""The host side of a build: its plan (``BuildPlan``), made from host values only, so making it never
synchronises with the device.

``Planner`` makes a build's plan for one builder (docs/semantics.md #split): the split of the step's
requests, the decode rows' width, the decode lens rows to clear, the replay bounds the build reads and the
host seq_lens its guard holds. ``update_plan`` makes a draft-step update's plan from the metadata of the
build it updates (docs/semantics.md #draft-updates), and ``same_build`` checks that the metadata of a
grouped update come from one build. A backend reads the plan beside the batch and the fixed buffers
(``Backend.compute``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from .cache import HostCache, tensor_key
from .config import INT32_LIMIT
from .errors import BatchShapeError
from .preflight import preflight_noncausal
from .split import refuse_host_split, split_decodes_and_prefills
from .step_inputs import StepInputs

if TYPE_CHECKING:
    from .buffers import MetadataBuffers
    from .config import SWAConfig
    from .metadata import SWAMetadata


class BuildPlan(NamedTuple):
    """The host-side facts of one build: the split (docs/semantics.md #split) and where each output goes.

    Everything here comes from host values (the CPU copy of query_start_loc, max_query_len, sizes),
    so computing it never synchronises with the device. What the step's inputs hold (``num_tokens``,
    ``causal``, ``max_query_len``, the tensors) is read from ``inputs``, never copied here. (A NamedTuple: it
    is made on every build; made by keyword.)
    """

    # The step's per-request inputs (for a draft-step update, its decode requests'): what the rows read.
    inputs: StepInputs
    num_reqs: int
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int
    decode_width: int
    # Decode lens rows [num_decode_tokens, decode_lens_clear_end) are zeroed (docs/semantics.md #fixed-buffers).
    decode_lens_clear_end: int
    # The replay bounds the build reads (#bounded-replay), R entries, and hands out as ``md.replay_start``: the
    # step's ``inputs.replay_start`` (cut to R, or padded with zeros past its entries), or zeros where it has none.
    replay_start: torch.Tensor
    # Whether this build works out image visibility (#vision-spans) from ``inputs.image_spans``.
    images: bool = False
    # The query length every request of the decode / prefill part is likely to have (the kernel's
    # cheap owner guess, checked before use; docs/semantics.md #per-token-helpers): host values only.
    decode_guess_len: int = 1
    prefill_guess_len: int = 1
    # The query length the host's split admits for a decode (docs/semantics.md #guarded-builds, rule 14):
    # max_decode_query_len (every request's is at most ``inputs.max_query_len``).
    decode_query_max: int = INT32_LIMIT
    # Rule 15 (docs/semantics.md #guarded-builds): the prefills' seq_lens_cpu where a guarded build holds
    # them against seq_lens, on the build's device (entries [num_decodes, num_reqs) meaningful); None where
    # there is nothing to hold (no prefill, no host copy, an unguarded build).
    host_seq_lens: torch.Tensor | None = None
    # Rules 16 and 17 are a build's: max_model_len, and each row's slot_mapping entry its own slot. A draft-step
    # update checks neither (an engine's draft step may run its drafts past max_model_len, whose tokens it
    # leaves without a slot, and may hand the update the slot mapping it had at the build).
    build_checks: bool = True
    # Rule 14: the requests before ``num_bounds`` have a replay bound; the host copy makes those after them
    # padding (no query tokens, so no bound: docs/semantics.md #bounded-replay), which the device offsets
    # must keep. INT32_LIMIT: every request has one.
    num_bounds: int = INT32_LIMIT
    # Rule 14 in a draft-step update of a build with prefills: the host's split starts the first prefill at
    # num_decode_tokens, so a decode row past the decodes' end on the device is that prefill's, not padding.
    prefill_follows: bool = False


class Planner:
    """Makes the plans of one builder's builds (``plan``), from host values and the builder's fixed buffers:
    it keeps, per KV-cache group, how many decode lens rows earlier builds wrote (a build zeroes the rows past
    its own, docs/semantics.md #fixed-buffers), and the zero bounds of a step without replay bounds."""

    def __init__(
        self, config: SWAConfig, buffers: MetadataBuffers, device: torch.device, guard: bool, cache: HostCache
    ):
        self.config = config
        self.buffers = buffers
        self.device = device
        self.guard = guard
        self.decode_threshold = config.decode_threshold
        self.window_size = config.window_size
        self.max_image_tokens = config.max_image_tokens
        self._cache = cache
        self._lens_high_water = [0] * config.num_kv_groups
        # The version counter of the zero bounds handed out as md.replay_start of a build without bounds.
        self._no_replay_version = buffers.no_replay_start._version

    def plan(self, inputs: StepInputs, num_reqs: int, count: int) -> tuple[BuildPlan, Any]:
        """The plan of a build of ``count`` KV-cache groups whose step inputs passed the preflight
        (``num_reqs`` requests), and the host query lengths when the split read them (None for a step of
        decodes only)."""
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
        width = self.window_size if causal else preflight_noncausal(self.config, inputs.query_start_loc_cpu, mql, nd)
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
            replay = self._cache.head(replay, num_reqs)
        host_seq = None
        if npf and self.guard and inputs.seq_lens_cpu is not None:
            host_seq = self._held_host_seq(inputs.seq_lens_cpu, num_reqs)
        spans = inputs.image_spans
        images = spans is not None and npt > 0 and self.max_image_tokens > 0 and spans.starts.shape[0] > 0
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


def update_plan(metadata: SWAMetadata) -> BuildPlan:
    """The plan of a draft-step update (docs/semantics.md #draft-updates): the decode part of the build
    that made ``metadata``, recomputed from its (advanced) seq_lens and replay bounds. Its requests are the
    decodes alone (``StepInputs.of_update``): a decode token's owner counts the decodes' ends only (the same
    owner as the build's wherever the offsets never decrease), and only they are checked, against the build's
    split (rule 14: a decode row past the decodes' end on the device is the first prefill's where the build had
    prefills, and a decode past the build's replay bounds has no query token)."""
    ndt, mdql = metadata.num_decode_tokens, metadata.max_decode_query_len
    inputs = update_inputs(metadata)
    built = metadata.inputs
    bounds = None if built is None or built.replay_start is None else built.replay_start.shape[0]
    return BuildPlan(
        inputs=inputs,
        num_reqs=metadata.num_decodes,
        num_decodes=metadata.num_decodes,
        num_prefills=0,
        num_decode_tokens=ndt,
        num_prefill_tokens=0,
        decode_width=metadata.decode_swa_width,
        decode_lens_clear_end=ndt,
        replay_start=metadata.replay_start,
        decode_guess_len=mdql,
        decode_query_max=mdql,
        build_checks=False,
        num_bounds=INT32_LIMIT if bounds is None or bounds >= metadata.num_decodes else bounds,
        prefill_follows=metadata.num_prefills > 0,
    )


def update_inputs(metadata: SWAMetadata) -> StepInputs:
    """The inputs of a draft-step update of ``metadata`` (docs/semantics.md #draft-updates): the decode
    requests of its build (views of the metadata's tensors), at their advanced ``seq_lens``, with the
    build's replay bounds and without the prefills' image spans. Every other input is the build's own
    (``metadata.inputs``; metadata an engine made from its own has none, and reads its fields)."""
    nd = metadata.num_decodes
    decodes: dict[str, Any] = dict(
        seq_lens=metadata.seq_lens[:nd],
        query_start_loc=metadata.query_start_loc[: nd + 1],
        query_start_loc_cpu=metadata.query_start_loc_cpu[: nd + 1],
        seq_lens_cpu=None,
        max_query_len=min(metadata.max_decode_query_len, INT32_LIMIT),
        num_tokens=metadata.num_decode_tokens,
        causal=metadata.causal,
        replay_start=metadata.replay_start,
        image_spans=None,
    )
    built = metadata.inputs
    return StepInputs(**decodes) if built is None else built.replace(**decodes)


def same_build(metadatas: Sequence[SWAMetadata]) -> None:
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
