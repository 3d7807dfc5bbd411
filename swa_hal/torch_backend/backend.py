"""The torch backend: the builds of docs/semantics.md in vectorised PyTorch, writing into the builder's
buffers through the tuned row fills of ``rows.py`` and guarded by ``guard.py`` (the plain oracle they are
held to bit for bit is ``swa_hal/reference.py``).

It runs on any torch device and is the embedded default: the plugin ``swa_hal_torch`` registers it
through the entry-point group like any other backend, and when that entry point is missing (a
source checkout that was never installed) the registry registers this package directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from .. import reference
from ..backend import Availability, Backend, BackendSpec
from ..batch import AttentionBatch
from ..cache import HostCache
from ..hookspecs import hookimpl
from ..plan import BuildPlan, update_plan
from ..rules import Violation, block_limit
from .guard import TorchGuard
from .request_window import build_request_window
from .rows import (
    TERMS,
    RowGuard,
    RowProbe,
    RowWorkspace,
    empty_requests,
    fill_causal_rows,
    fill_dspark_rows,
    gather_lens,
    request_terms,
)
from .slot_rows import build_slot_rows

if TYPE_CHECKING:
    from ..buffers import MetadataBuffers
    from ..metadata import SWAMetadata
    from ..request_window import RequestWindowLayout, RequestWindowRows
    from ..slot_rows import SlotRows


class one_thread:
    """Run the enclosed operations on one torch thread, then restore the caller's thread count.

    Why: a build is a few dozen operations on vectors of hundreds to thousands of elements and matrices
    of at most a few million, too little work per operation for torch's intra-op parallelism to pay:
    every operation that goes parallel wakes torch's other OpenMP threads and ends waiting for all of
    them. Idle, that costs microseconds per operation; when other processes keep the cores busy the
    threads it waits for are descheduled, and the wait is a scheduler time slice: a 2-core decode-256
    build took a steady 40 ms instead of 2 ms (docs/performance.md #cpu). One thread never waits.

    How: torch has no per-call thread count, so the build saves ``torch.get_num_threads()``, calls
    ``torch.set_num_threads(1)`` and restores the count afterwards (about 0.5 us a build). Thread
    safety: both act on the calling thread's OpenMP setting, so another thread's torch work, and another
    builder building on another thread (one builder per thread, docs/semantics.md #guarded-builds),
    keep their own count while a build runs. ``set_num_threads`` also writes process-wide state, which
    this leaves as it found it, except within the build: the count a thread adopts when it first runs
    torch work (a thread that starts using torch during a build starts with one thread), the size of
    the pthreadpool QNNPACK uses, and oneDNN's cache of convolution primitives (cleared). A caller that
    runs with one thread already pays nothing.
    """

    __slots__ = ("threads",)

    def __init__(self) -> None:
        self.threads = 1

    def __enter__(self) -> None:
        self.threads = torch.get_num_threads()
        if self.threads > 1:
            torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        if self.threads > 1:
            torch.set_num_threads(self.threads)


class _Part(NamedTuple):
    """One part of a build's rows (its decodes' or its prefills'): each row's owner, whether it has a slot,
    its position + 1 in the build (``rows1``) and its index (``tokens``), its row and length outputs, its
    image visibility outputs, and its row guard (guarded builds; None otherwise or for an empty part)."""

    req: torch.Tensor
    valid: torch.Tensor
    rows1: torch.Tensor
    tokens: torch.Tensor
    out: torch.Tensor
    lens: torch.Tensor
    left: torch.Tensor
    right: torch.Tensor
    guard: RowGuard | None


class _Shape:
    """Every cut of the fixed buffers (and workspace) one build shape uses, made once per shape: slicing
    costs about as much as a small operation, and a decode-heavy server repeats a few shapes."""

    __slots__ = (
        "t2r",
        "valid",
        "rows",
        "dec",
        "pre",
        "clear",
        "gather",
        "terms",
        "term_rows",
        "prefill_reqs",
        "causal_rows",
        "dspark_rows",
    )

    t2r: torch.Tensor
    valid: torch.Tensor
    rows: torch.Tensor
    dec: _Part
    pre: _Part
    clear: torch.Tensor | None
    gather: torch.Tensor
    terms: dict[bool, torch.Tensor]
    term_rows: dict[bool, tuple[torch.Tensor, ...]]
    prefill_reqs: slice
    # Which per-request terms the build's rows gather: causal terms serve causal decode rows and every prefill
    # row, DSpark decode rows have their own.
    causal_rows: bool
    dspark_rows: bool


class TorchBackend(Backend):
    """The rows of docs/semantics.md, written into the builder's buffers with vectorised torch ops on any
    device: the embedded default. Its builds read device values on the host
    (so it claims no CUDA graphs)."""

    name = "torch"

    # Guarded builds on a device where reading a value costs no sync (the CPU) first build without the
    # guard's selection work and keep that build when a cheap test shows no rule can have broken
    # (docs/semantics.md #guarded-builds); False always runs the full guard (tests compare the two).
    probe_first = True

    def allocate(self, buffers: MetadataBuffers) -> None:
        cfg = self.config
        width = max(cfg.prefill_index_width, cfg.noncausal_index_width)
        self._workspace = RowWorkspace(buffers.capacity, width, self.device)
        seqs = cfg.max_num_seqs
        # The per-request terms the rows gather (request_terms): causal and DSpark rows.
        self._terms = {}
        for causal in (True, False):
            self._terms[causal] = torch.zeros((TERMS, seqs), dtype=torch.int32, device=self.device)
        self._guard = TorchGuard(seqs, buffers.capacity, self.device)
        self._limit = block_limit(cfg)
        self._probe = RowProbe(self._limit, cfg.block_size)
        self._shapes = HostCache(limit=256)  # kept as the host cache keeps (swa_hal/cache.py)

    def _shape(self, plan: BuildPlan, buffers: MetadataBuffers) -> _Shape:
        t, ndt, npt, nreq = plan.inputs.num_tokens, plan.num_decode_tokens, plan.num_prefill_tokens, plan.num_reqs
        causal = plan.inputs.causal
        key = (
            buffers.group_index,
            t,
            ndt,
            npt,
            nreq,
            plan.num_decodes,
            plan.num_prefills,
            plan.decode_lens_clear_end,
            causal,
            plan.images,
        )
        s = self._shapes.get(key)
        if s is not None:
            return s
        s = self._shapes.keep(key, _Shape())
        cfg, ws = self.config, self._workspace
        s.t2r, s.valid, s.rows = buffers.token_to_req[:t], buffers.is_valid[:t], ws.arange[:t]
        dec_width = cfg.window_size if causal else cfg.noncausal_index_width
        guard = self._guard if self.guard else None
        s.dec = _Part(
            s.t2r[:ndt],
            s.valid[:ndt],
            ws.arange[1 : ndt + 1],
            s.rows[:ndt],
            buffers.decode_rows(causal)[:ndt].view(ndt, dec_width),
            buffers.decode_lens[:ndt],
            buffers.left_visible[:ndt],
            buffers.right_visible[:ndt],
            RowGuard(self._limit, *guard.row_candidates(nreq, 0, ndt)) if guard is not None and ndt else None,
        )
        s.pre = _Part(
            s.t2r[ndt:t],
            s.valid[ndt:t],
            ws.arange[ndt + 1 : t + 1],
            s.rows[ndt:t],
            buffers.prefill_indices[:npt].view(npt, cfg.prefill_index_width),
            buffers.prefill_lens[:npt],
            buffers.left_visible[ndt:t],
            buffers.right_visible[ndt:t],
            RowGuard(self._limit, *guard.row_candidates(nreq, ndt, npt)) if guard is not None and npt else None,
        )
        s.clear = buffers.decode_lens[ndt : plan.decode_lens_clear_end] if plan.decode_lens_clear_end > ndt else None
        s.gather = buffers.gather_lens[: plan.num_prefills]
        s.terms = {kind: self._terms[kind][:, :nreq] for kind in (True, False)}
        s.term_rows = {kind: terms.unbind(0) for kind, terms in s.terms.items()}
        s.causal_rows, s.dspark_rows = causal or npt > 0, not causal
        s.prefill_reqs = slice(plan.num_decodes, plan.num_decodes + plan.num_prefills)
        return s

    def _request_terms(self, causal: bool, s: _Shape, plan: BuildPlan, ends: torch.Tensor) -> torch.Tensor:
        terms = s.terms[causal]
        request_terms(
            plan,
            self.config.window_size,
            causal=causal,
            out=terms,
            workspace=self._workspace,
            ends=ends,
            rows=s.term_rows[causal],
        )
        return terms

    def compute(self, plan: BuildPlan, batch: AttentionBatch, buffers: MetadataBuffers) -> None:
        with one_thread():
            self._compute(plan, batch, buffers)

    def _compute(
        self, plan: BuildPlan, batch: AttentionBatch, buffers: MetadataBuffers, following: torch.Tensor | None = None
    ) -> None:
        # The full guard's per-request selection and per-row work cost as much as the build itself. On
        # the CPU a build can afford to read a value, so a guarded build first runs the cheap part of the
        # checks and builds unguarded; only a batch that may break a rule pays for the full guard, which
        # rewrites every output. Both give the same outputs and record (tests/test_guard_probe.py).
        probed = self.guard and self.probe_first and self.device.type == "cpu"
        if probed and self._build(plan, batch, buffers, probe=self._probe):
            return
        self._build(plan, batch, buffers, probe=None, following=following)

    def _build(
        self,
        plan: BuildPlan,
        batch: AttentionBatch,
        buffers: MetadataBuffers,
        probe: RowProbe | None,
        following: torch.Tensor | None = None,
    ) -> bool:
        """One build, in the order of its outputs: owners, per-request terms, decode rows, prefill rows, gather
        lengths. Unguarded without ``probe``, or guarded where the backend is (``self.guard``: the request
        rules, every row's, padding and the record); with ``probe`` (the CPU's first build), unguarded once
        the request test passes, and False (the outputs are partly written) as soon as a rule may have broken.
        ``following``: in a draft-step update of a build with prefills (``plan.prefill_follows``), the first
        prefill's query length on the device."""
        s = self._shape(plan, buffers)
        guard = self.guard and probe is None
        # Whether a row may lie past query_start_loc[R] (padding, whose search finds owner R): unknown
        # unless the probe's request test read query_start_loc[R].
        padded = True
        if probe is not None:
            tested = self._probe_requests(plan, batch)
            if tested is None:
                return False
            padded, probe.clean = tested, True
        ends = batch.query_start_loc[1:]
        self._owners(s, ends, batch.slot_mapping, plan.num_reqs, searched=guard, padded=padded)
        broken = self._requests(plan, s, ends, guard)
        # Rule 17 (builds, not draft updates): each part's rows hold their slot_mapping entries.
        dec_slots, pre_slots = self._own_slot_parts(plan, batch.slot_mapping, guard or probe is not None)
        if plan.num_decode_tokens and not self._decode_rows(plan, batch, s, ends, guard, probe, dec_slots):
            return False
        if s.clear is not None:
            s.clear.zero_()
        if plan.num_prefill_tokens and not self._prefill_rows(plan, batch, s, guard, probe, pre_slots):
            return False
        nreq = plan.num_reqs
        if guard:
            self._empty_padding(s, batch.query_start_loc[nreq], plan.num_decode_tokens, following, nreq)
        if plan.num_prefills:
            gather_lens(plan, self.config.window_size, out=s.gather)
            if broken is not None:
                # A prefill that broke a rule gets gather length 0 (docs/semantics.md #guarded-builds).
                s.gather.masked_fill_(broken[s.prefill_reqs], self._workspace.c[0])
        if guard:
            self._guard.record(
                buffers.violation, nreq + plan.num_decode_tokens + plan.num_prefill_tokens, buffers.record_group
            )
        return True

    def _probe_requests(self, plan: BuildPlan, batch: AttentionBatch) -> bool | None:
        """The CPU's first build's request test (docs/semantics.md #guarded-builds): None where a request may
        have broken a rule, or a padding row holds a slot (rule 13); else whether rows lie past
        query_start_loc[R] (padding rows, read on the host)."""
        cfg, nreq, num_tokens = self.config, plan.num_reqs, plan.inputs.num_tokens
        self._guard.request_quantities(
            plan, cfg, values=False, table_positions=batch.block_table.shape[1] * cfg.block_size
        )
        if not self._guard.requests_clean(nreq):
            return None
        scheduled = self._guard.scheduled(nreq)
        padded = scheduled < num_tokens
        if padded and self._padding_slots(batch, scheduled, num_tokens):
            return None
        return padded

    def _owners(
        self,
        s: _Shape,
        ends: torch.Tensor,
        slot_mapping: torch.Tensor,
        num_reqs: int,
        *,
        searched: bool,
        padded: bool,
    ) -> None:
        """docs/semantics.md #per-token-helpers (reference.token_to_req, reference.valid_tokens). The owner
        is the count of ends at or before t: a guarded build (``searched``) searches the sorted ends, since
        the offsets may decrease (a valid batch's ends are sorted already, which an unguarded build trusts);
        where rows may be ``padded``, their owner R becomes 0 (every owner is then a request)."""
        ws = self._workspace
        torch.searchsorted(torch.sort(ends).values if searched else ends, s.rows, right=True, out_int32=True, out=s.t2r)
        if padded:
            s.t2r.remainder_(ws.c[num_reqs])
        torch.ge(slot_mapping, ws.const(0, slot_mapping.dtype), out=s.valid)

    def _requests(self, plan: BuildPlan, s: _Shape, ends: torch.Tensor, guard: bool) -> torch.Tensor | None:
        """The per-request terms the rows gather: causal terms serve causal decode rows and every prefill row,
        DSpark decode rows have their own. Guarded, the request rules too: returns the requests that broke
        one (bool [R]), whose terms then give rows without entries; None unguarded."""
        causal_rows, dspark_rows = s.causal_rows, s.dspark_rows
        if causal_rows:
            self._request_terms(True, s, plan, ends)
        if dspark_rows:
            self._request_terms(False, s, plan, ends)
        if not guard:
            return None
        nreq, ws = plan.num_reqs, self._workspace
        self._guard.request_quantities(plan, self.config)
        broken = self._guard.first_broken(nreq)
        # A request is checked at its rows with a slot: one without any is recorded by no backend.
        self._guard.only_seen(nreq, s.t2r, s.valid)
        # Every row of a request that broke a rule is handed out empty.
        if causal_rows:
            empty_requests(s.term_rows[True], broken, causal=True, workspace=ws)
        if dspark_rows:
            empty_requests(s.term_rows[False], broken, causal=False, workspace=ws)
        return broken

    @staticmethod
    def _own_slot_parts(
        plan: BuildPlan, slot_mapping: torch.Tensor, checked: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The decode and prefill rows' slot_mapping entries where rule 17 is ``checked`` (a guarded or
        probed build, not a draft update), else None."""
        ndt, npt = plan.num_decode_tokens, plan.num_prefill_tokens
        if not (plan.build_checks and checked):
            return None, None
        dec_slots = (slot_mapping if slot_mapping.shape[0] == ndt else slot_mapping[:ndt]) if ndt else None
        return dec_slots, (slot_mapping[ndt : ndt + npt] if npt else None)

    def _decode_rows(
        self,
        plan: BuildPlan,
        batch: AttentionBatch,
        s: _Shape,
        ends: torch.Tensor,
        guard: bool,
        probe: RowProbe | None,
        slots: torch.Tensor | None,
    ) -> bool:
        """The decode rows and lens (causal or DSpark); False where the probe saw a rule that may have broken."""
        part = s.dec
        row_guard = part.guard if guard else None
        self._own_slots(row_guard, probe, slots, part.tokens)
        if plan.inputs.causal:
            self._fill_causal(batch, s, part, row_guard, probe)
        else:
            # Row widths are checked on the device (rule 7, the guard's request quantities): no sync here.
            own_pos1 = None
            if slots is not None:  # p + 1 = S_r - qsl[r + 1] + t + 1
                nreq, seq = plan.num_reqs, batch.seq_lens
                seq = seq if seq.shape[0] == nreq else seq[:nreq]
                own_pos1 = torch.sub(seq, ends).index_select(0, part.req).add_(part.rows1)
            fill_dspark_rows(
                batch.block_table,
                part.req,
                part.valid,
                s.terms[False],
                part.out,
                part.lens,
                block_size=self.config.block_size,
                ws=self._workspace,
                guard=row_guard,
                probe=probe,
                own_pos1=own_pos1,
            )
        return probe is None or probe.clean

    def _prefill_rows(
        self,
        plan: BuildPlan,
        batch: AttentionBatch,
        s: _Shape,
        guard: bool,
        probe: RowProbe | None,
        slots: torch.Tensor | None,
    ) -> bool:
        """The prefill rows and lens, widened by image visibility where the plan works it out (the decode
        rows' visibility is 0); False where the probe saw a rule that may have broken."""
        part = s.pre
        row_guard = part.guard if guard else None
        self._own_slots(row_guard, probe, slots, part.tokens)
        visible = None
        if plan.images:
            s.dec.left.zero_()
            s.dec.right.zero_()
            visible = reference.image_visibility(
                batch.query_start_loc,
                batch.seq_lens,
                s.t2r,
                plan.inputs.image_spans,  # type: ignore[arg-type]  # plan.images: spans are given
                token_offset=plan.num_decode_tokens,
                num_rows=plan.num_prefill_tokens,
                max_image_tokens=self.config.max_image_tokens,
                out_left=part.left,
                out_right=part.right,
            )
        self._fill_causal(batch, s, part, row_guard, probe, visible)
        return probe is None or probe.clean

    def _fill_causal(
        self,
        batch: AttentionBatch,
        s: _Shape,
        part: _Part,
        row_guard: RowGuard | None,
        probe: RowProbe | None,
        visible: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """``part``'s causal rows, from the causal per-request terms (``visible``: the rows' image
        visibility, left and right, where the build works it out)."""
        left, right = visible if visible is not None else (None, None)
        cfg = self.config
        fill_causal_rows(
            batch.block_table,
            part.req,
            part.valid,
            part.rows1,
            s.terms[True],
            part.out,
            part.lens,
            window_size=cfg.window_size,
            block_size=cfg.block_size,
            ws=self._workspace,
            left=left,
            right=right,
            guard=row_guard,
            probe=probe,
        )

    @staticmethod
    def _own_slots(
        guard: RowGuard | None,
        probe: RowProbe | None,
        slots: torch.Tensor | None,
        tokens: torch.Tensor,
    ) -> None:
        """Point the next fill's rule 17 at ``slots`` (None: not checked) and its rows' ``tokens``."""
        if guard is not None:
            guard.slots, guard.tokens = slots, tokens
        if probe is not None:
            probe.slots = slots

    @staticmethod
    def _padding_slots(batch: AttentionBatch, scheduled: int, num_tokens: int) -> bool:
        """Rule 13 for the CPU's first, unguarded build, where rows [scheduled, num_tokens) are padding
        (``scheduled``: query_start_loc[R], read by the request test): whether one has a slot (a host
        read, free on the CPU). Read through numpy: the same memory, without torch's per-op dispatch."""
        return bool((batch.slot_mapping.numpy()[max(scheduled, 0) : num_tokens] >= 0).any())

    @staticmethod
    def _empty_padding(
        s: _Shape, scheduled: torch.Tensor, ndt: int, following: torch.Tensor | None = None, num_reqs: int = 0
    ) -> None:
        """Rule 13, checked first at every row: a row past query_start_loc[R] (``scheduled``) that holds a slot
        is emptied and becomes a candidate of the record (its request the owner the fill gave it, its
        value the row), whatever else it broke. With ``following`` (a draft-step update of a build with
        prefills, whose decode part has no padding) such a row is the first prefill's, starting inside the
        decode tokens: rule 14 of request ``num_reqs`` (the update's R), its value ``following``, that
        prefill's query."""
        pad = (s.rows >= scheduled) & s.valid
        kind = Violation.PADDING_SLOT if following is None else Violation.HOST_SPLIT
        for part, start in ((s.dec, 0), (s.pre, ndt)):
            n, guard = part.lens.shape[0], part.guard
            if n == 0 or guard is None:
                continue
            mask = pad[start : start + n]
            part.out.masked_fill_(mask[:, None], -1)
            part.lens.masked_fill_(mask, 0)
            guard.kind.masked_fill_(mask, int(kind))
            if following is None:
                torch.where(mask, s.rows[start : start + n], guard.value, out=guard.value)
                torch.where(mask, s.t2r[start : start + n], guard.key, out=guard.key)
            else:
                guard.value.masked_fill_(mask, following.to(guard.value.dtype))
                guard.key.masked_fill_(mask, num_reqs)

    def recompute_decode_rows(self, metadata: SWAMetadata, buffers: MetadataBuffers) -> None:
        # An update rebuilds the decode requests only, so only they are checked: a prefill's violation
        # belongs to the build that handed its rows out (the kernels' decode programs see no prefill).
        plan = update_plan(metadata)
        batch = AttentionBatch(
            inputs=plan.inputs,
            block_table=metadata.block_table,
            slot_mapping=metadata.slot_mapping[: metadata.num_decode_tokens],
        )
        following = None
        if plan.prefill_follows:  # the first prefill's device query (rule 14), read without a sync
            nd, qsl = metadata.num_decodes, metadata.query_start_loc
            following = qsl[nd + 1] - qsl[nd]
        with one_thread():
            self._compute(plan, batch, buffers, following)

    def compute_slot_rows(
        self, rows: SlotRows, out: torch.Tensor, lens: torch.Tensor, record: torch.Tensor, limit: int
    ) -> None:
        with one_thread():
            build_slot_rows(rows, self.config.window_size, out, lens, record, guard=self.guard, limit=limit)

    def compute_request_window(self, rows: RequestWindowRows) -> RequestWindowLayout:
        with one_thread():
            return build_request_window(rows, self.config.window_size)

    def status(self) -> dict[str, str]:
        return {"kernel": "PyTorch (vectorized, any device)"}


TORCH_SPEC = BackendSpec(
    name="torch",
    priority=0,
    factory="swa_hal.torch_backend:TorchBackend",
    is_available=lambda platform: Availability.yes(),
    vendors=("cpu",),
    platforms=("vendor=cpu",),
    summary="pure PyTorch on any device; the fallback everywhere",
    kernels="torch",
)


@hookimpl
def swa_hal_register_backends():
    return [TORCH_SPEC]
