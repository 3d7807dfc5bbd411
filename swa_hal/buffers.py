"""The fixed-address output buffers of a builder (docs/semantics.md #fixed-buffers).

Allocated once per builder, sized for everything the config admits (``max_num_batched_tokens`` token
rows, ``max_num_seqs`` requests); every build returns views of them, so a CUDA graph that captured a
build keeps reading the right memory on replay, and no build can write past them.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from .config import SWAConfig
from .rules import RECORD_LEN


class MetadataBuffers:
    """A builder's output buffers on its device, allocated once for everything ``config`` admits.

    Per group (``config.num_kv_groups``; a plain build writes group 0's, which the unprefixed names view):
    ``group_is_valid`` bool [G, T], ``group_decode_indices`` int32 [G, T, 1, W] and ``group_decode_lens``
    [G, T], ``group_prefill_indices`` int32 [G, T, 1, prefill width] and ``group_prefill_lens`` [G, T]
    (T = ``max_num_batched_tokens``, W = ``window_size``); shared by the groups: ``token_to_req`` [T],
    ``gather_lens`` [R] (R = ``max_num_seqs``), the vision variant's visibility and span buffers, and the
    guard's ``violation`` record. DSpark's wider rows (``noncausal_indices``) are allocated on first use.
    Builds hand out views of these (valid until the next build), never copies; a backend writes into them
    and may keep buffers of its own made once in ``allocate()``. ``group(g)`` is group g's set as a
    ``MetadataBuffers`` of its own, for a backend that fills one group at a time.
    """

    def __init__(self, config: SWAConfig, device: torch.device):
        cap = config.max_num_batched_tokens
        seqs = config.max_num_seqs
        w = config.window_size
        i32: dict[str, Any] = dict(dtype=torch.int32, device=device)
        self.config = config
        self.device = device
        self.capacity = cap
        groups = self.num_groups = config.num_kv_groups
        self.token_to_req = torch.zeros(cap, **i32)
        # Per-group outputs (docs/semantics.md #group-builds) are stacked group after group; a plain
        # build writes group 0's.
        self.group_is_valid = torch.zeros((groups, cap), dtype=torch.bool, device=device)
        self.group_decode_indices = torch.full((groups, cap, 1, w), -1, **i32)
        self.group_decode_lens = torch.zeros((groups, cap), **i32)
        self.group_prefill_indices = torch.full((groups, cap, 1, config.prefill_index_width), -1, **i32)
        self.group_prefill_lens = torch.zeros((groups, cap), **i32)
        self.is_valid = self.group_is_valid[0]
        self.decode_indices = self.group_decode_indices[0]
        self.decode_lens = self.group_decode_lens[0]
        self.prefill_indices = self.group_prefill_indices[0]
        self.prefill_lens = self.group_prefill_lens[0]
        # A group build's inputs: per group the block table's and slot mapping's addresses, the
        # table's row stride and its width (written only when an engine hands in other tensors).
        self.group_inputs = torch.zeros((groups, 4), dtype=torch.int64, device=device)
        # Every request may be a prefill (short requests after the first long one are), so one
        # gather length per admitted request, not per token.
        self.gather_lens = torch.zeros(seqs, **i32)
        # The replay bound of a batch that has none: no lower bound (a graph captured without one
        # keeps reading zeros).
        self.no_replay_start = torch.zeros(seqs, **i32)
        # The bounds of a batch whose padding requests have none (fewer bounds than requests), then zeros.
        self.padded_replay_start = torch.zeros(seqs, **i32)
        # A guarded build's copy of its prefills' seq_lens_cpu on the device, which the rows hold against
        # seq_lens (rule 15, docs/semantics.md #guarded-builds); a CPU builder reads the host copy itself.
        self.host_seq_lens = torch.zeros(seqs, **i32)
        # Its staging copy in pageable host memory (a device builder only): a copy from pageable memory has
        # left it when the call returns, so the caller may rewrite its own (pinned) seq_lens_cpu at once.
        self.host_seq_stage = torch.zeros(seqs if device.type != "cpu" else 0, dtype=torch.int32)
        # Vision variant: per-token visibility, and the span CSR of a batch (image_spans_from_ranges).
        # Without spans the kernels read an all-zero indptr: no request has a span.
        images = config.max_image_tokens > 0
        self.left_visible = torch.zeros(cap if images else 1, **i32)
        self.right_visible = torch.zeros(cap if images else 1, **i32)
        self.span_indptr = torch.zeros(seqs + 1, **i32)
        self.span_starts = torch.zeros(cap if images else 1, **i32)
        self.span_ends = torch.zeros(cap if images else 1, **i32)
        self.no_span_indptr = torch.zeros(seqs + 1, **i32)
        # Guarded builds record their first violation here: count, kind, request, value, group
        # (swa_hal/rules.py).
        self.violation = torch.zeros(RECORD_LEN, **i32)
        # DSpark rows are wider than W; allocated on first use (most configs never need them).
        self._noncausal_indices: torch.Tensor | None = None
        # Group views point at the buffers they view (no reference to itself: a cycle would keep a dropped
        # builder's device memory until the garbage collector runs).
        self._root: MetadataBuffers | None = None
        self._group = 0
        # What a violation found in these buffers' rows records as its group: g + 1 in a group build's
        # group g (``in_group_build``), 0 in a plain build.
        self.record_group = 0
        self._group_build_views: dict[int, MetadataBuffers] = {}

    @property
    def group_noncausal_indices(self) -> torch.Tensor:
        root = self._root or self
        if root._noncausal_indices is None:
            width = self.config.noncausal_index_width
            root._noncausal_indices = torch.full(
                (self.num_groups, self.capacity, 1, width), -1, dtype=torch.int32, device=self.device
            )
        return root._noncausal_indices

    @property
    def noncausal_indices(self) -> torch.Tensor:
        return self.group_noncausal_indices[self._group]

    @property
    def group_index(self) -> int:
        """Which KV-cache group's buffers these are (0 for a plain build's)."""
        return self._group

    def decode_rows(self, causal: bool) -> torch.Tensor:
        return self.decode_indices if causal else self.noncausal_indices

    def group(self, g: int) -> MetadataBuffers:
        """Group g's buffers as a MetadataBuffers of their own (shared outputs shared): what a backend
        without one-launch group builds fills, one group at a time."""
        if g == 0:
            return self
        view = copy.copy(self)
        view._root = self
        view.is_valid = self.group_is_valid[g]
        view.decode_indices = self.group_decode_indices[g]
        view.decode_lens = self.group_decode_lens[g]
        view.prefill_indices = self.group_prefill_indices[g]
        view.prefill_lens = self.group_prefill_lens[g]
        view._group = g
        return view

    def in_group_build(self, g: int) -> MetadataBuffers:
        """``group(g)`` as a group build fills it: its violations name the group (``record_group``). Kept:
        a backend without one-launch group builds asks for it per group per build."""
        root = self._root or self
        view = root._group_build_views.get(g)
        if view is None:
            view = root.group(g) if g else copy.copy(root)  # group 0's buffers are the root's own
            view._root = root
            view.record_group = g + 1
            root._group_build_views[g] = view
        return view
