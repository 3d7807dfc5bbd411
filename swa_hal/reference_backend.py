"""The pure-PyTorch backend: the reference itself, writing into the builder's buffers.

It runs on any torch device and is the embedded default: the plugin ``swa_hal_torch`` registers it
through the entry-point group like any other backend, and when that entry point is missing (a
source checkout that was never installed) the registry registers this module directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from . import reference
from .backend import Availability, Backend, BackendSpec, BuildPlan
from .guard import block_limit, torch_guard
from .hookspecs import hookimpl

if TYPE_CHECKING:
    from .batch import AttentionBatch
    from .buffers import MetadataBuffers
    from .metadata import SWAMetadata


class TorchBackend(Backend):
    name = "torch"

    def allocate(self, buffers: MetadataBuffers) -> None:
        width = max(self.config.prefill_index_width, self.config.noncausal_index_width)
        self._workspace = reference.RowWorkspace(buffers.capacity, width, self.device)

    def _row_guard(self, rows: int) -> reference.RowGuard | None:
        return reference.RowGuard(rows, block_limit(self.config), self.device) if self.guard else None

    def _decode_rows(
        self,
        causal: bool,
        inputs: tuple,
        ndt: int,
        width: int,
        replay: torch.Tensor,
        buffers: MetadataBuffers,
        guard: reference.RowGuard | None,
    ) -> None:
        common: dict[str, Any] = dict(
            window_size=self.config.window_size,
            block_size=self.config.block_size,
            workspace=self._workspace,
            token_offset=0,
            num_rows=ndt,
            out_lens=buffers.decode_lens[:ndt],
            guard=guard,
        )
        if causal:
            reference.causal_window_rows(
                *inputs, replay_start=replay, out_indices=buffers.decode_indices[:ndt], **common
            )
        else:
            # The builder checked the row widths on the host already: no device sync here.
            reference.noncausal_window_rows(
                *inputs, width=width, check=False, out_indices=buffers.noncausal_indices[:ndt], **common
            )

    def compute(self, plan: BuildPlan, batch: AttentionBatch, buffers: MetadataBuffers) -> None:
        ws = self._workspace
        cfg = self.config
        t, ndt, npt = plan.num_tokens, plan.num_decode_tokens, plan.num_prefill_tokens
        t2r = reference.token_to_req(batch.query_start_loc, t, out=buffers.token_to_req[:t], workspace=ws)
        valid = reference.valid_tokens(batch.slot_mapping, out=buffers.is_valid[:t])
        inputs = (batch.query_start_loc, batch.seq_lens, batch.block_table, t2r, valid)
        dec_guard, pre_guard = self._row_guard(ndt), self._row_guard(npt)
        if ndt:
            self._decode_rows(plan.causal, inputs, ndt, plan.decode_width, plan.replay_start, buffers, dec_guard)
        if plan.decode_lens_clear_end > ndt:
            buffers.decode_lens[ndt : plan.decode_lens_clear_end].zero_()
        if npt:
            left = right = None
            if plan.images:
                buffers.left_visible[:ndt].zero_()
                buffers.right_visible[:ndt].zero_()
                left, right = reference.image_visibility(
                    batch.query_start_loc,
                    batch.seq_lens,
                    t2r,
                    plan.spans,  # type: ignore[arg-type]  # plan.images: spans are given
                    token_offset=ndt,
                    num_rows=npt,
                    max_image_tokens=cfg.max_image_tokens,
                    out_left=buffers.left_visible[ndt:t],
                    out_right=buffers.right_visible[ndt:t],
                )
            reference.causal_window_rows(
                *inputs,
                token_offset=ndt,
                num_rows=npt,
                replay_start=plan.replay_start,
                left=left,
                right=right,
                width=cfg.prefill_index_width,
                window_size=cfg.window_size,
                block_size=cfg.block_size,
                out_indices=buffers.prefill_indices[:npt],
                out_lens=buffers.prefill_lens[:npt],
                workspace=ws,
                guard=pre_guard,
            )
        if plan.num_prefills:
            reference.prefill_gather_lens(
                batch.seq_lens,
                batch.query_start_loc,
                plan.num_decodes,
                plan.num_prefills,
                cfg.window_size,
                replay_start=plan.replay_start,
                out=buffers.gather_lens[: plan.num_prefills],
            )
        if self.guard:
            row_guards = [(g, t2r[lo : lo + n]) for g, lo, n in ((dec_guard, 0, ndt), (pre_guard, ndt, npt)) if n]
            broken = torch_guard(
                cfg,
                batch.query_start_loc,
                batch.seq_lens,
                batch.block_table,
                plan.replay_start,
                plan.spans if plan.images else None,
                plan.num_reqs,
                buffers.violation,
                causal=plan.causal,
                row_guards=row_guards,  # type: ignore[arg-type]  # guarded: every RowGuard is set
            )
            self._empty_broken(broken, t2r, ndt, npt, plan.causal, buffers)
            if plan.num_prefills:
                gather = buffers.gather_lens[: plan.num_prefills]
                gather.masked_fill_(broken[plan.num_decodes : plan.num_decodes + plan.num_prefills], 0)

    def _empty_broken(
        self, broken: torch.Tensor, t2r: torch.Tensor, ndt: int, npt: int, causal: bool, buffers: MetadataBuffers
    ) -> None:
        """Rows of requests that broke a guarded rule are handed out empty (docs/semantics.md #guarded-builds)."""
        row_broken = torch.index_select(broken, 0, t2r[: ndt + npt])
        if ndt:
            rows = buffers.decode_indices if causal else buffers.noncausal_indices
            rows[:ndt].masked_fill_(row_broken[:ndt, None, None], -1)
            buffers.decode_lens[:ndt].masked_fill_(row_broken[:ndt], 0)
        if npt:
            buffers.prefill_indices[:npt].masked_fill_(row_broken[ndt:, None, None], -1)
            buffers.prefill_lens[:npt].masked_fill_(row_broken[ndt:], 0)

    def recompute_decode_rows(self, metadata: SWAMetadata, buffers: MetadataBuffers) -> None:
        ndt = metadata.num_decode_tokens
        t2r = reference.token_to_req(
            metadata.query_start_loc, ndt, out=buffers.token_to_req[:ndt], workspace=self._workspace
        )
        valid = reference.valid_tokens(metadata.slot_mapping[:ndt], out=buffers.is_valid[:ndt])
        inputs = (metadata.query_start_loc, metadata.seq_lens, metadata.block_table, t2r, valid)
        guard = self._row_guard(ndt)
        self._decode_rows(
            metadata.causal, inputs, ndt, metadata.decode_swa_width, metadata.replay_start, buffers, guard
        )
        if self.guard:
            num_reqs = metadata.query_start_loc.shape[0] - 1
            broken = torch_guard(
                self.config,
                metadata.query_start_loc,
                metadata.seq_lens,
                metadata.block_table,
                metadata.replay_start,
                None,
                num_reqs,
                buffers.violation,
                causal=metadata.causal,
                row_guards=[(guard, t2r)],  # type: ignore[list-item]  # guarded: the RowGuard is set
            )
            self._empty_broken(broken, t2r, ndt, 0, metadata.causal, buffers)

    def status(self) -> dict[str, str]:
        return {"kernel": "PyTorch reference (vectorized, any device)"}


TORCH_SPEC = BackendSpec(
    name="torch",
    priority=0,
    factory="swa_hal.reference_backend:TorchBackend",
    is_available=lambda platform: Availability.yes(),
    vendors=("cpu",),
    platforms=("vendor=cpu",),
    summary="pure-PyTorch reference on any device; the fallback everywhere",
    kernels="torch",
)


@hookimpl
def swa_hal_register_backends():
    return [TORCH_SPEC]
