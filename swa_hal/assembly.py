"""How a build's metadata is assembled (``MetadataAssembly``): one ``SWAMetadata`` per KV-cache group, from
the build's plan, made of views of the builder's fixed buffers (once per build shape, kept in the host cache),
the step's tensors and the views of them a step hands out, fresh planner objects and the backend's extras
(docs/semantics.md #fixed-buffers, #group-builds).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .cache import HostCache, tensor_key
from .metadata import SWAMetadata, group_views, shape_fields

if TYPE_CHECKING:
    from .buffers import MetadataBuffers
    from .config import SWAConfig
    from .plan import BuildPlan


class MetadataAssembly:
    """A builder's metadata of each build (``metadatas``): one SWAMetadata per KV-cache group, from the
    build's plan, the fixed buffers (``buffers``; ``group_buffers``: each group's), the planner objects
    ``make_schedulers`` makes and the backend's ``extras`` (None: it declares none). What follows from a
    build's shape alone is made once per shape and kept in ``cache``, with the views of the engine's tensors
    a step hands out (the prefills' tails of seq_lens and its host copy)."""

    def __init__(
        self,
        config: SWAConfig,
        buffers: MetadataBuffers,
        group_buffers: Sequence[MetadataBuffers],
        cache: HostCache,
        make_schedulers: Callable[[int], Mapping[str, Any]],
        extras: Callable[[SWAMetadata, MetadataBuffers], tuple[Any, ...]] | None,
        backend_name: str,
    ):
        self.config = config
        self.buffers = buffers
        self._group_buffers = group_buffers
        self._cache = cache
        self._make_schedulers = make_schedulers
        self._extras = extras
        self.backend_name = backend_name

    def metadatas(
        self, plan: BuildPlan, query: Any, tables: Sequence[torch.Tensor], slots: Sequence[torch.Tensor]
    ) -> list[SWAMetadata]:
        """One SWAMetadata per KV-cache group (one for a plain build) of the build ``plan`` planned: group g's
        shape fields (its views of its fixed buffers, sizes, static facts; made once per build shape), the
        step's tensors (``query``: the host query lengths the split read) and group g's block table and
        slot mapping, fresh planner objects and the backend's extras."""
        inputs = plan.inputs
        nd, npf = plan.num_decodes, plan.num_prefills
        max_decode_query_len = plan.decode_query_max
        prefill_seq_lens = prefill_seq_lens_cpu = prefill_query_lens_cpu = None
        if npf:
            seq_cpu = inputs.seq_lens_cpu
            if seq_cpu is None:
                seq_cpu = inputs.seq_lens.cpu()
            prefill_seq_lens, prefill_seq_lens_cpu = self._tails(inputs.seq_lens, seq_cpu, nd, plan.num_reqs)
            prefill_query_lens_cpu = torch.from_numpy(query[nd:])
        groups = len(tables)
        key = (
            "metadata",
            groups,
            inputs.num_tokens,
            nd,
            npf,
            plan.num_decode_tokens,
            plan.num_prefill_tokens,
            inputs.causal,
            plan.images,
            plan.decode_width,
            max_decode_query_len,
        )
        shapes = self._cache.get(key)
        if shapes is None:  # group 0's shape fields, then every other group's views of its own buffers
            made = [self._shape(plan, g, max_decode_query_len) for g in range(groups)]
            shapes = self._cache.keep(key, (made[0], [group_views(shape) for shape in made]))
        shape, views = shapes
        make_schedulers, ndt = self._make_schedulers, plan.num_decode_tokens
        md = SWAMetadata.for_step(
            shape,
            inputs=inputs,
            replay_start=plan.replay_start,
            block_table=tables[0],
            slot_mapping=slots[0],
            tile_sched=make_schedulers(ndt),
            prefill_seq_lens=prefill_seq_lens,
            prefill_seq_lens_cpu=prefill_seq_lens_cpu,
            prefill_query_lens_cpu=prefill_query_lens_cpu,
            # Every per-request output holds the step's R entries (an engine may hand in longer buffers).
            seq_lens=None
            if inputs.seq_lens.shape[0] == plan.num_reqs
            else self._cache.head(inputs.seq_lens, plan.num_reqs),
        )
        extras = self._extras
        if extras is not None:
            md.extras = extras(md, self._group_buffers[0])
        out = [md]
        for g in range(1, groups):
            other = md.for_group(
                views[g], block_table=tables[g], slot_mapping=slots[g], tile_sched=make_schedulers(ndt)
            )
            if extras is not None:
                other.extras = extras(other, self._group_buffers[g])
            out.append(other)
        return out

    def _shape(self, plan: BuildPlan, group: int, max_decode_query_len: int) -> dict[str, Any]:
        """The fields of group ``group``'s metadata that follow from the build's shape alone (views of
        the fixed buffers, sizes, static facts)."""
        cfg = self.config
        ndt, npt, causal, num_tokens = (
            plan.num_decode_tokens,
            plan.num_prefill_tokens,
            plan.inputs.causal,
            plan.inputs.num_tokens,
        )
        b = self._group_buffers[group]
        fields: dict[str, Any] = {}
        if npt:
            fields["prefill_swa_indices"] = b.prefill_indices[:npt]
            fields["prefill_swa_lens"] = b.prefill_lens[:npt]
            if plan.images:
                fields["prefill_left_visible"] = self.buffers.left_visible[:num_tokens]
                fields["prefill_right_visible"] = self.buffers.right_visible[:num_tokens]
        if plan.num_prefills:
            fields["prefill_gather_lens"] = self.buffers.gather_lens[: plan.num_prefills]
        return shape_fields(
            token_to_req_indices=b.token_to_req[:num_tokens],
            is_valid_token=b.is_valid[:num_tokens],
            decode_swa_indices=b.decode_rows(causal)[:ndt],
            decode_swa_lens=b.decode_lens[:ndt],
            num_decodes=plan.num_decodes,
            num_prefills=plan.num_prefills,
            num_decode_tokens=ndt,
            num_prefill_tokens=npt,
            decode_swa_width=plan.decode_width,
            causal=causal,
            max_decode_query_len=max_decode_query_len,
            block_size=cfg.block_size,
            window_size=cfg.window_size,
            max_model_len=cfg.max_model_len,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            backend=self.backend_name,
            **fields,
        )

    def _tails(
        self, seq_lens: torch.Tensor, seq_cpu: torch.Tensor, start: int, end: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``seq_lens[start:end]`` and ``seq_cpu[start:end]`` (``end``: R, the step's requests; an engine
        may hand in longer buffers), reused for the same memory seen the same way (swa_hal/cache.py)."""
        if not start and seq_lens.shape[0] == end and seq_cpu.shape[0] == end:
            return seq_lens, seq_cpu  # every request a prefill: the tails are the tensors themselves
        # seq_lens passed the preflight (int32, unit stride, the builder's device): its address and
        # shape name it; the host copy is unchecked, so it is keyed in full.
        key = ("tails", start, end, seq_lens.data_ptr(), seq_lens.shape, tensor_key(seq_cpu))
        tails = self._cache.get(key)
        if tails is None:
            tails = self._cache.keep(key, (seq_lens[start:end], seq_cpu[start:end]))
        return tails
