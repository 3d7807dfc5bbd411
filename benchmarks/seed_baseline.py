"""The baseline: an engine's original launch sequence for this metadata, re-implemented here with
straightforward kernels.

Per build that engine code does, in order: token_to_req by
repeat_interleave into a buffer, ``is_valid.copy_(slot_mapping >= 0)``, a fill of the decode-lens
tail, one window-rows kernel launch for the decode rows and one for the prefill rows (one program per
token, reading token_to_req and is_valid back from their buffers), a gather-lens kernel into a fresh
allocation, host-side slicing for the prefill metadata, and fresh scheduler objects. This module
does the same steps with its own straightforward kernels so the benchmark can time both in one run.
On the CPU the baseline is the straightforward vectorized PyTorch version (fresh int64 temporaries).
"""

from __future__ import annotations

from typing import Any

import torch

from swa_hal.config import LAYER_TYPES, SWAConfig
from swa_hal.split import split_decodes_and_prefills


def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def window_rows_kernel(out_idx, out_stride, out_lens, window, qsl, seq_lens, t2r, is_valid, table,
                           table_stride, block_size, token_offset, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        t = row + token_offset
        r = tl.load(t2r + t)
        valid = tl.load(is_valid + t)
        pos = tl.load(seq_lens + r) - tl.load(qsl + r + 1) + t
        start = tl.maximum(pos - window + 1, 0)
        n = tl.where(valid, pos + 1 - start, 0)
        j = tl.arange(0, BLOCK)
        live = j < n
        p = start + j
        block = tl.load(table + r * table_stride + p // block_size, mask=live, other=0)
        tl.store(out_idx + row * out_stride + j, tl.where(live, block * block_size + p % block_size, -1), mask=j < window)
        tl.store(out_lens + row, n)

    @triton.jit
    def gather_lens_kernel(out, seq_lens, qsl, num_prefills, num_decodes, window, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        m = i < num_prefills
        r = num_decodes + tl.minimum(i, num_prefills - 1)
        q = tl.load(qsl + r + 1, mask=m, other=0) - tl.load(qsl + r, mask=m, other=0)
        seq = tl.load(seq_lens + r, mask=m, other=0)
        tl.store(out + i, q + tl.minimum(seq - q, window - 1), mask=m)

    return window_rows_kernel, gather_lens_kernel


class SeedSequenceBuilder:
    """The seed's per-build launch sequence on a GPU (straightforward Triton kernels)."""

    def __init__(self, config: SWAConfig, device: torch.device, new_scheduler=None):
        self.config = config
        self.device = device
        cap, w = config.max_num_batched_tokens, config.window_size
        i32 = dict(dtype=torch.int32, device=device)
        self.arange = torch.arange(config.max_num_seqs, **i32)
        self.token_to_req = torch.zeros(cap, **i32)
        self.is_valid = torch.zeros(cap, dtype=torch.bool, device=device)
        self.decode_indices = torch.zeros((cap, 1, w), **i32)
        self.decode_lens = torch.zeros(cap, **i32)
        self.prefill_indices = torch.zeros((cap, 1, w), **i32)
        self.prefill_lens = torch.zeros(cap, **i32)
        self.rows_kernel, self.gather_kernel = _kernels()
        self.new_scheduler = new_scheduler
        self.block = 1 << (w - 1).bit_length()

    def build(self, batch) -> dict[str, Any]:
        cfg = self.config
        t = batch.num_tokens
        qsl_cpu = batch.query_start_loc_cpu
        query_cpu = qsl_cpu[1:] - qsl_cpu[:-1]
        nd, npf, ndt, npt = split_decodes_and_prefills(qsl_cpu, batch.max_query_len, t, cfg.decode_threshold)
        r = qsl_cpu.shape[0] - 1
        real = int(qsl_cpu[-1])
        query = batch.query_start_loc[1:] - batch.query_start_loc[:-1]
        self.token_to_req[:real].copy_(torch.repeat_interleave(self.arange[:r], query, output_size=real))
        self.token_to_req[real:t].fill_(0)
        is_valid = self.is_valid[:t]
        is_valid.copy_(batch.slot_mapping >= 0)
        out: dict[str, Any] = {"split": (nd, npf, ndt, npt)}
        if ndt:
            self.decode_lens[ndt:] = 0
            self.rows_kernel[(ndt,)](
                self.decode_indices, self.decode_indices.stride(0), self.decode_lens, cfg.window_size,
                batch.query_start_loc, batch.seq_lens, self.token_to_req, is_valid, batch.block_table,
                batch.block_table.stride(0), cfg.block_size, 0, BLOCK=self.block,
            )
        if npt:
            self.rows_kernel[(npt,)](
                self.prefill_indices, self.prefill_indices.stride(0), self.prefill_lens, cfg.window_size,
                batch.query_start_loc, batch.seq_lens, self.token_to_req, is_valid, batch.block_table,
                batch.block_table.stride(0), cfg.block_size, ndt, BLOCK=self.block,
            )
        if npf:
            gather = torch.empty(npf, dtype=torch.int32, device=self.device)
            self.gather_kernel[(1,)](gather, batch.seq_lens, batch.query_start_loc, npf, nd, cfg.window_size,
                                     BLOCK=1 << max(0, (npf - 1).bit_length()))
            out.update(
                prefill_gather_lens=gather,
                prefill_seq_lens=batch.seq_lens[nd:],
                prefill_seq_lens_cpu=batch.seq_lens_cpu[nd:],
                prefill_query_lens_cpu=query_cpu[nd:].to(torch.int32),
            )
        sched = dict.fromkeys(LAYER_TYPES)
        if ndt and self.new_scheduler is not None:
            for kind in cfg.layer_types:
                sched[kind] = self.new_scheduler()
        out.update(
            token_to_req=self.token_to_req[:t], is_valid=is_valid,
            decode_indices=self.decode_indices[:ndt], decode_lens=self.decode_lens[:ndt],
            prefill_indices=self.prefill_indices[:npt] if npt else None,
            prefill_lens=self.prefill_lens[:npt] if npt else None, tile_sched=sched,
        )
        return out


class NaiveTorchBuilder:
    """A straightforward vectorized PyTorch build: fresh int64 temporaries, advanced indexing."""

    def __init__(self, config: SWAConfig, device: torch.device):
        self.config = config
        self.device = device

    def _rows(self, batch, t2r, valid, lo, hi):
        cfg = self.config
        t = torch.arange(lo, hi, device=self.device)
        r = t2r[lo:hi].long()
        qsl = batch.query_start_loc.long()
        pos = batch.seq_lens.long()[r] - qsl[r + 1] + t
        start = (pos - cfg.window_size + 1).clamp(min=0)
        lens = torch.where(valid[lo:hi], pos + 1 - start, torch.zeros_like(pos))
        p = start[:, None] + torch.arange(cfg.window_size, device=self.device)[None, :]
        live = torch.arange(cfg.window_size, device=self.device)[None, :] < lens[:, None]
        page = torch.where(live, p // cfg.block_size, torch.zeros_like(p))
        block = batch.block_table.long()[r[:, None], page]
        idx = torch.where(live, block * cfg.block_size + p % cfg.block_size, torch.full_like(p, -1))
        return idx.to(torch.int32).unsqueeze(1), lens.to(torch.int32)

    def build(self, batch) -> dict[str, Any]:
        cfg = self.config
        t = batch.num_tokens
        qsl_cpu = batch.query_start_loc_cpu
        nd, npf, ndt, npt = split_decodes_and_prefills(qsl_cpu, batch.max_query_len, t, cfg.decode_threshold)
        r = qsl_cpu.shape[0] - 1
        query = (batch.query_start_loc[1:] - batch.query_start_loc[:-1]).long()
        t2r = torch.zeros(t, dtype=torch.int64, device=self.device)
        real = int(qsl_cpu[-1])
        t2r[:real] = torch.repeat_interleave(torch.arange(r, device=self.device), query, output_size=real)
        valid = batch.slot_mapping >= 0
        dec = self._rows(batch, t2r, valid, 0, ndt)
        pre = self._rows(batch, t2r, valid, ndt, t)
        out = {"split": (nd, npf, ndt, npt), "token_to_req": t2r.to(torch.int32), "is_valid": valid,
               "decode_indices": dec[0], "decode_lens": dec[1], "prefill_indices": pre[0], "prefill_lens": pre[1]}
        if npf:
            q = query[nd:]
            out["prefill_gather_lens"] = (q + (batch.seq_lens[nd:].long() - q).clamp(max=cfg.window_size - 1)).to(torch.int32)
        return out
