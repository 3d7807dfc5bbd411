"""SGLang 0.5.23 state and batches for the engine tests: a request pool (``req_to_token``) and a
full-to-SWA slot mapping laid out the way SGLang's paged SWA allocator lays them out, the per-row
inputs SGLang's DeepSeek-V4 backend hands its metadata ops in each forward mode, and SGLang's own
results for them (its ops' CPU references, composed as the backend composes them).

Imported only after conftest.py set TRITON_INTERPRET=1 and CUDA_VISIBLE_DEVICES="".
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from types import SimpleNamespace
from typing import Any

import torch
from sglang.kernels.ops.attention.dsv4.attn_metadata_kernels import (
    BuildCausalSwaPageIndices,
    BuildPageTablePositions,
    ExpandPrefillCausally,
    late_layer_tail_layout,
)
from sglang.kernels.ops.speculative.dspark.dspark_attn_metadata import (
    BuildBlockSeqLensCausal,
    BuildDsparkSwaPageIndices,
    BuildDsparkSwaRingIndices,
    ComputeDsparkWindowGather,
    swa_ring_rows,
)

from swa_hal.testing.request_windows import WINDOW_KINDS, WindowCase, window_case, window_runs  # noqa: F401

SWA_WINDOW = 128  # sglang/srt/layers/attention/deepseek_v4_backend.py
ALIGN = 64  # PAGE_INDEX_ALIGNED_SIZE there

# What the parity tests covered, by kind of batch and backend.
COUNTS: Counter[str] = Counter()


@dataclasses.dataclass
class Pool:
    """SGLang's token pools for a few requests: ``req_to_token[slot, pos]`` (full-pool slots, int32)
    and ``full_to_swa`` (int64, one trailing -1). Both pools page in step: position p of a request
    sits at ``full_page * P + p % P`` and ``swa_page * P + p % P`` (P = page size), pages handed out
    in random order; SWA pages wholly below a request's window may be evicted (mapping 0)."""

    req_to_token: torch.Tensor
    full_to_swa: torch.Tensor
    seq_lens: list[int]  # per pool slot: the tokens it has now (this step's included)
    page_size: int

    @classmethod
    def make(cls, rng: random.Random, seq_lens: list[int], page_size: int, keep_from: list[int]) -> Pool:
        """``keep_from[s]``: the lowest position of slot s that this step reads; SWA pages wholly
        below it may be evicted."""
        slots = len(seq_lens)
        ctx = max(max(seq_lens), 1)
        pages_per = -(-ctx // page_size) + 1
        ctx = pages_per * page_size
        total_pages = slots * pages_per + 1  # page 0 is SGLang's padding page
        full_pages = list(range(1, total_pages))
        swa_pages = list(range(1, total_pages))
        rng.shuffle(full_pages)
        rng.shuffle(swa_pages)
        req_to_token = torch.zeros((slots, ctx), dtype=torch.int32)
        full_to_swa = torch.zeros(total_pages * page_size + page_size + 1, dtype=torch.int64)
        full_to_swa[-1] = -1
        offs = torch.arange(page_size)
        for s in range(slots):
            evict = rng.random() < 0.5
            for k in range(pages_per):
                fp, sp = full_pages.pop(), swa_pages.pop()
                req_to_token[s, k * page_size : (k + 1) * page_size] = (fp * page_size + offs).to(torch.int32)
                if evict and (k + 1) * page_size <= keep_from[s]:
                    continue  # evicted: the mapping reads 0, as after SGLang's free_swa
                full_to_swa[fp * page_size + offs] = sp * page_size + offs
        return cls(req_to_token, full_to_swa, seq_lens, page_size)


@dataclasses.dataclass
class CausalCase:
    """The inputs of one ``BuildCausalSwaPageIndices`` call (and of the backend's lens around it)."""

    kind: str
    pool: Pool
    window: int
    req_pool_indices_repeated: torch.Tensor
    seq_lens_casual: torch.Tensor
    swa_replay_start: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return self.seq_lens_casual.shape[0]

    def op_kwargs(self) -> dict[str, Any]:
        return dict(
            req_to_token=self.pool.req_to_token,
            full_to_swa_mapping=self.pool.full_to_swa,
            req_pool_indices_repeated=self.req_pool_indices_repeated,
            seq_lens_casual=self.seq_lens_casual,
            swa_window=self.window,
            page_index_aligned_size=ALIGN,
            swa_replay_start=self.swa_replay_start,
        )


@dataclasses.dataclass
class DsparkCase:
    """The inputs of one ``get_dspark_swa_page_indices`` call on a paged SWA pool."""

    kind: str
    pool: Pool
    window: int
    block_size: int
    req_pool_indices_repeated: torch.Tensor
    seq_lens_casual: torch.Tensor
    out_loc: torch.Tensor
    valid_from: torch.Tensor | None

    @property
    def rows(self) -> int:
        return self.seq_lens_casual.shape[0]


# -- SGLang's own results ------------------------------------------------------------------------------


def sglang_causal_branch(case: CausalCase, build_indices: Any) -> SimpleNamespace:
    """The causal branch of ``DeepseekV4AttnBackend.make_core_attn_metadata`` (SGLang 0.5.23), on the
    CPU: the page-table op, then ``build_indices`` (SGLang's op, or the hooked one), then the lens:
    ``min(seq_lens_casual, W)``, floored to ``p - floor + 1`` (clamped at 0) when there is a floor."""
    prep = BuildPageTablePositions.torch(
        req_to_token=case.pool.req_to_token,
        req_pool_indices_repeated=case.req_pool_indices_repeated,
        seq_lens_casual=case.seq_lens_casual,
        max_seq_len=case.pool.req_to_token.shape[1],
        page_size=case.pool.page_size,
        swa_window=case.window,
    )
    kwargs = case.op_kwargs()
    kwargs["seq_lens_casual"] = prep.seq_lens_casual
    indices = build_indices(**kwargs)
    lens = prep.swa_topk_lengths
    if case.swa_replay_start is not None:
        floored = prep.positions_casual - case.swa_replay_start.to(prep.positions_casual.dtype) + 1
        lens = torch.minimum(lens, floored.clamp_min(0).to(lens.dtype))
    return SimpleNamespace(swa_page_indices=indices, swa_topk_lengths=lens)


def sglang_causal(case: CausalCase) -> SimpleNamespace:
    """SGLang's own rows and lens (its torch reference of the op)."""
    return sglang_causal_branch(case, BuildCausalSwaPageIndices.torch)


def sglang_causal_cuda_path(case: CausalCase) -> SimpleNamespace:
    """SGLang's rows and lens on its CUDA path: its Triton kernel (here in the interpreter), which the op
    dispatches to for CUDA tensors only."""
    return sglang_causal_branch(case, BuildCausalSwaPageIndices.triton)


def sglang_dspark(case: DsparkCase, *, path: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """``get_dspark_swa_page_indices`` of the paged pool, as the backend composes SGLang's ops: their torch
    references (``path="torch"``, what CPU and XPU tensors get) or their Triton kernels (``"triton"``, the
    CUDA path)."""
    gather = getattr(ComputeDsparkWindowGather, path)(
        seq_lens_casual=case.seq_lens_casual,
        req_pool_indices_repeated=case.req_pool_indices_repeated,
        block_size=case.block_size,
        swa_window=case.window,
        valid_from=case.valid_from,
    )
    return getattr(BuildDsparkSwaPageIndices, path)(
        req_to_token=case.pool.req_to_token,
        full_to_swa_mapping=case.pool.full_to_swa,
        req_pool_indices_per_request=gather.req_pool_indices_per_request,
        offsets=gather.offsets,
        invalid=gather.invalid,
        out_loc=case.out_loc[: gather.num_q],
        context_lens=gather.context_lens,
        block_size=case.block_size,
        swa_window=case.window,
        page_index_aligned_size=ALIGN,
    )


def backend_stand_in(case: DsparkCase, *, ring: bool = False) -> SimpleNamespace:
    """The attributes of ``DeepseekV4AttnBackend`` its DSpark hook reads."""
    kv = SimpleNamespace(
        full_to_swa_index_mapping=case.pool.full_to_swa,
        swa_valid_from=case.valid_from,
        swa_req_ring_size=64 if ring else None,
        request_window=None,
    )
    return SimpleNamespace(req_to_token=case.pool.req_to_token, token_to_kv_pool=kv)


# -- batches ------------------------------------------------------------------------------------------------


def _expand(seq_lens: list[int], extend: list[int], pool_idx: list[int], padded: int | None, vectorized: bool):
    """SGLang's ExpandPrefillCausally (CPU reference): one row per extend token, then padding rows."""
    num_tokens = sum(extend)
    ext = torch.tensor(extend, dtype=torch.int32)
    res = ExpandPrefillCausally.torch(
        req_pool_indices=torch.tensor(pool_idx, dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        extend_seq_lens=ext,
        extend_start_loc=(torch.cumsum(ext, 0) - ext) if vectorized else None,
        seq_lens_cpu=seq_lens,
        extend_seq_lens_cpu=extend,
        num_tokens=num_tokens,
        padded_num_tokens=padded,
    )
    return res.seq_lens_casual, res.req_pool_indices_repeated


def _lens(rng: random.Random, n: int, lo: int, hi: int) -> list[int]:
    """Sequence lengths, biased to the interesting edges (around the window and the pages)."""
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.25:
            out.append(rng.randint(lo, min(hi, lo + 12)))
        elif r < 0.5:
            out.append(min(hi, max(lo, SWA_WINDOW + rng.randint(-6, 6))))
        else:
            out.append(rng.randint(lo, hi))
    return out


def causal_case(rng: random.Random, kind: str, *, window: int = SWA_WINDOW) -> CausalCase:
    """One random batch of ``kind``: decode, decode_padded, extend, mixed, extend_padded, target_verify,
    draft_extend, replay (per-row floors), late_tail (the late layers' tail rows and floors)."""
    page = rng.choice((128, 256))
    nreq = rng.randint(1, 6)
    slots = rng.sample(range(8), nreq)
    floor = None
    if kind in ("decode", "decode_padded"):
        seq = _lens(rng, nreq, 1, 700)
        extend = [1] * nreq
    elif kind == "target_verify":
        draft = rng.choice((2, 4, 8))
        seq = [s + draft for s in _lens(rng, nreq, 1, 700)]
        extend = [draft] * nreq
    elif kind == "draft_extend":
        draft = rng.choice((2, 3, 4))
        seq = _lens(rng, nreq, draft, 700)
        extend = [draft] * nreq
    else:
        seq, extend = [], []
        for _ in range(nreq):
            if kind == "mixed" and rng.random() < 0.5:
                s = rng.randint(1, 700)
                seq.append(s)
                extend.append(1)
            else:
                q = rng.randint(1, 96)
                seq.append(q + rng.choice((0, rng.randint(0, 600))))
                extend.append(q)
    keep_from = [0] * 8
    for s, n, slot in zip(seq, extend, slots):
        keep_from[slot] = max(0, s - n - window + 1)
    full_seq = [0] * 8
    for s, slot in zip(seq, slots):
        full_seq[slot] = s
    if kind == "decode_padded":
        # The decode graph pads requests with seq_len 1 at pool slot 0 (get_cuda_graph_seq_len_fill_value).
        pad = rng.randint(1, 5)
        seq, extend, slots = seq + [1] * pad, extend + [1] * pad, slots + [0] * pad
        keep_from[0] = 0
    if kind == "draft_extend" and rng.random() < 0.7:
        # DP padding: seq_len 1 requests with the same draft length (positions below 0).
        pad = rng.randint(1, 3)
        seq, extend, slots = seq + [1] * pad, extend + [extend[0]] * pad, slots + [0] * pad
        keep_from[0] = 0
    pool = Pool.make(rng, [max(s, 1) for s in full_seq], page, keep_from)
    if kind in ("decode", "decode_padded", "target_verify", "draft_extend"):
        q = extend[0] if kind != "decode" and kind != "decode_padded" else 1
        seq_t = torch.tensor(seq, dtype=torch.int32)
        casual = (seq_t[:, None] + torch.arange(-q + 1, 1, dtype=torch.int32)).flatten()
        rep = torch.tensor(slots, dtype=torch.int64).repeat_interleave(q)
    elif kind == "late_tail":
        whole = [rng.random() < 0.2 for _ in seq] if rng.random() < 0.3 else None
        token_idx, tail_lens, floor = late_layer_tail_layout(
            extend_lens_cpu=extend,
            seq_lens_cpu=seq,
            tail_len=window,
            device=torch.device("cpu"),
            whole_extend=whole,
        )
        casual, rep = _expand(seq, tail_lens, slots, None, True)
    else:
        total = sum(extend)
        padded = total + rng.randint(1, 9) if kind == "extend_padded" else None
        # Padding rows read position 0 of the last request (evicted or not, both sides read slot 0).
        casual, rep = _expand(seq, extend, slots, padded, vectorized=rng.random() < 0.5)
    if kind == "replay":
        pos = casual.to(torch.int64) - 1
        floor = torch.clamp(pos - torch.randint(-3, window + 8, pos.shape), min=0).to(torch.int32)
        # Mostly one floor per request (bounded replay), sometimes per row, sometimes past p.
        if rng.random() < 0.5:
            floor = torch.where(torch.rand(pos.shape) < 0.05, pos.to(torch.int32) + 2, floor)
    return CausalCase(kind, pool, window, rep, casual.to(torch.int32), floor)


CAUSAL_KINDS = (
    "decode",
    "decode_padded",
    "extend",
    "mixed",
    "extend_padded",
    "target_verify",
    "draft_extend",
    "replay",
    "late_tail",
)


def dspark_case(rng: random.Random, *, with_valid_from: bool, window: int = SWA_WINDOW) -> DsparkCase:
    """A DSpark draft-block batch: prefix lengths, gamma tokens per block, the block's slots (SGLang's
    verify window gathers them from req_to_token) and, optionally, the pool's per-slot valid_from."""
    page = rng.choice((128, 256))
    gamma = rng.choice((3, 7, 15))
    nreq = rng.randint(1, 6)
    slots = rng.sample(range(8), nreq)
    prefix = _lens(rng, nreq, 0, 700)
    full_seq = [1] * 8
    keep_from = [0] * 8
    for p, slot in zip(prefix, slots):
        full_seq[slot] = p + gamma
        keep_from[slot] = max(0, p - window)
    pool = Pool.make(rng, full_seq, page, keep_from)
    casual, rep = _expand([p + gamma for p in prefix], [gamma] * nreq, slots, None, True)
    pos = torch.tensor(prefix, dtype=torch.int64)[:, None] + torch.arange(gamma)
    out_loc = pool.req_to_token[torch.tensor(slots)[:, None], pos].reshape(-1).to(torch.int64)
    valid_from = None
    if with_valid_from:
        valid_from = torch.tensor(
            [rng.choice((0, rng.randint(0, max(full_seq[s], 1)), full_seq[s] + 5)) for s in range(8)], dtype=torch.int64
        )
    return DsparkCase(
        "dspark_valid_from" if with_valid_from else "dspark",
        pool,
        window,
        gamma,
        rep,
        casual.to(torch.int32),
        out_loc,
        valid_from,
    )


# -- the per-request SWA ring --------------------------------------------------------------------------------

RING_KINDS = ("ring_verify", "ring_draft", "ring_padded", "ring_floors", "ring_restart")
RING_COUNTS: Counter[str] = Counter()


@dataclasses.dataclass
class RingCase:
    """The inputs of one ``BuildDsparkSwaRingIndices`` call: the DSpark draft's per-request SWA ring
    (``swa_req_ring_size`` rows per request slot, ``num_slots`` slots, ``swa_valid_from`` per slot)."""

    kind: str
    window: int
    block_size: int
    ring_size: int
    req_pool_indices_repeated: torch.Tensor
    seq_lens_casual: torch.Tensor
    valid_from: torch.Tensor

    @property
    def rows(self) -> int:
        return self.seq_lens_casual.shape[0]

    @property
    def num_slots(self) -> int:
        return self.valid_from.shape[0]

    def op_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``BuildDsparkSwaRingIndices``: these fields under their own names, the window
        and SGLang's alignment."""
        named = ("seq_lens_casual", "req_pool_indices_repeated", "valid_from", "ring_size", "block_size")
        return {**{f: getattr(self, f) for f in named}, "swa_window": self.window, "page_index_aligned_size": ALIGN}

    def pool(self) -> SimpleNamespace:
        """The attributes of SGLang's ring pool (DeepSeekV4TokenToKVPool) the backend reads."""
        return SimpleNamespace(
            swa_req_ring_size=self.ring_size,
            swa_valid_from=self.valid_from,
            num_req_slots=self.num_slots,
            request_window=None,
            full_to_swa_index_mapping=None,  # SGLang's allocator leaves it unwritten for a ring pool
        )


def ring_case(rng: random.Random, kind: str, *, window: int = SWA_WINDOW) -> RingCase:
    """One DSpark step over the per-request ring. ``ring_verify``: the draft backend's target-verify rows
    (blocks of ``draft_token_num``); ``ring_draft``: draft blocks of gamma; ``ring_padded``: a CUDA graph's
    padded requests (``seq_len = 1`` at request slot 0, SGLang's fill value); ``ring_floors``: ``valid_from``
    inside the window (the ring restarted at a cached prefix); ``ring_restart``: ``valid_from`` at or past
    the prefix (no context, only the block). Positions run far past the ring, so every window wraps."""
    block = rng.choice((2, 4, 8)) if kind == "ring_verify" else rng.choice((3, 7, 15))
    # get_draft_swa_ring_size: ceil_div(W + max draft tokens, page) * page rows per slot.
    page = rng.choice((64, 128, 256))
    ring_size = -(-(window + block + rng.choice((0, 0, 1, 4))) // page) * page
    num_slots = rng.randint(2, 12)  # max_num_reqs + 1
    nreq = rng.randint(1, min(6, num_slots - 1))
    slots = rng.sample(range(1, num_slots), nreq)
    prefix = [
        rng.choice((0, rng.randint(0, 3 * ring_size))) if rng.random() < 0.2 else p for p in _lens(rng, nreq, 1, 3000)
    ]
    valid_from = [0] * num_slots
    for s, p in zip(slots, prefix):
        if kind == "ring_floors" or (kind == "ring_verify" and rng.random() < 0.3):
            valid_from[s] = rng.choice((rng.randint(0, p), max(p - rng.randint(0, window), 0)))
        elif kind == "ring_restart":
            valid_from[s] = p + rng.choice((0, 0, rng.randint(1, 50)))
    if kind == "ring_padded":
        pad = rng.randint(1, 4)
        prefix, slots = prefix + [1] * pad, slots + [0] * pad
    # BuildBlockSeqLensCausal: block row j of a request with seq_len S sits at position S + j.
    casual = BuildBlockSeqLensCausal.torch(
        seq_lens=torch.tensor(prefix, dtype=torch.int32), block_size=block, device=torch.device("cpu")
    )
    rep = torch.tensor(slots, dtype=torch.int64).repeat_interleave(block)
    return RingCase(kind, window, block, ring_size, rep, casual, torch.tensor(valid_from, dtype=torch.int64))


def sglang_ring(case: RingCase) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's ring rows and lens: ``BuildDsparkSwaRingIndices``'s torch path (its only one: the op runs it
    on every device)."""
    return BuildDsparkSwaRingIndices.torch(**case.op_kwargs())


def sglang_ring_write_rows(case: RingCase) -> torch.Tensor:
    """Where SGLang writes each draft row's SWA key (``DeepseekV4AttnBackend._dspark_swa_ring_out_cache_loc``):
    ring row of the row's own position ``seq_lens_casual - 1``."""
    return swa_ring_rows(case.req_pool_indices_repeated, case.seq_lens_casual.to(torch.int64) - 1, case.ring_size).to(
        torch.int32
    )


def sglang_ring_method(case: RingCase) -> Any:
    """SGLang's ``get_dspark_swa_page_indices`` on a ring pool, its body as in 0.5.23 (the backend class
    does not import without the GPU stack): the ring branch calls the op (hooked or not)."""

    def method(self: Any, *, seq_lens_casual, req_pool_indices_repeated, out_loc, block_size):
        pool = self.token_to_kv_pool
        assert pool.swa_req_ring_size is not None
        return BuildDsparkSwaRingIndices.execute(
            seq_lens_casual=seq_lens_casual,
            req_pool_indices_repeated=req_pool_indices_repeated,
            valid_from=pool.swa_valid_from,
            ring_size=pool.swa_req_ring_size,
            block_size=block_size,
            swa_window=case.window,
            page_index_aligned_size=ALIGN,
        )

    return method


RING_STREAM_KINDS = ("decode", "target_verify", "extend", "padded")


@dataclasses.dataclass
class RingStreamCase:
    """The inputs of one ``write_v4_paged_decode_indices`` call (SGLang's unified-KV ring on ROCm): each
    token's request (``batch_id``, -1 for a CUDA graph's padding tokens), its request's ring slot and its
    position; the ring has ``win + spec_extra`` rows per slot (get_swa_ring_size)."""

    kind: str
    window: int
    ring_size: int
    num_slots: int
    state_slot: torch.Tensor  # [bs] int32
    batch_id: torch.Tensor  # [T] int32
    positions: torch.Tensor  # [T] int32


def ring_stream_case(rng: random.Random, kind: str, *, window: int = SWA_WINDOW) -> RingStreamCase:
    draft = rng.choice((2, 4, 8))
    ring_size = window + rng.choice((0, draft - 1))
    num_slots = rng.randint(2, 12)
    bs = rng.randint(1, min(6, num_slots))
    state_slot = rng.sample(range(num_slots), bs)
    batch_id: list[int] = []
    positions: list[int] = []
    for b, seq in enumerate(_lens(rng, bs, 1, 3000)):
        q = {"decode": 1, "target_verify": draft, "padded": 1}.get(kind) or rng.randint(1, min(96, seq))
        seq = max(seq, q)
        batch_id += [b] * q
        positions += range(seq - q, seq)
    if kind == "padded":
        pad = rng.randint(1, 5)
        batch_id += [-1] * pad
        positions += [0] * pad
    return RingStreamCase(
        kind,
        window,
        ring_size,
        num_slots,
        torch.tensor(state_slot, dtype=torch.int32),
        torch.tensor(batch_id, dtype=torch.int32),
        torch.tensor(positions, dtype=torch.int32),
    )


def sglang_ring_stream(case: RingStreamCase) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's ragged SWA stream (its Triton kernel, here in the interpreter): the flat ring rows of each
    token's window, oldest first, and their ``indptr`` (each real token ``min(position + 1, win)`` long, as
    the kernel's contract says; a padding token none)."""
    from sglang.kernels.ops.attention.dsv4.unified_kv_kernels.paged_decode_indices import (
        write_v4_paged_decode_indices,
    )

    real = case.batch_id >= 0
    n = torch.where(real, torch.clamp(case.positions + 1, max=case.window), 0)
    indptr = torch.zeros(n.shape[0] + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(n, 0)
    total = int(indptr[-1])
    streams = [torch.full((total,), -7, dtype=torch.int32) for _ in range(3)]
    write_v4_paged_decode_indices(
        state_slot_per_seq=case.state_slot, batch_id_per_token=case.batch_id, positions=case.positions,
        # The three streams (SWA, CSA, HCA) share the offsets; only the SWA one is compared.
        swa_indptr=indptr, csa_indptr=indptr, hca_indptr=indptr,
        swa_indices=streams[0], csa_indices=streams[1], hca_indices=streams[2],
        T=n.shape[0], win=case.window, ring_stride=case.ring_size,
    )
    return streams[0], indptr


# -- DeepSeek-V4.1 request-window layouts ---------------------------------------------------------------------

# The random V4.1 steps are swa_hal.testing.request_windows' (imported above; benchmarks/sglang_window.py runs them
# on a GPU).
WINDOW_COUNTS: Counter[str] = Counter()


def sglang_window_torch(case: WindowCase) -> Any:
    """SGLang's ``window_layout`` on the CPU: its torch path (every device but CUDA takes it)."""
    from sglang.srt.mem_cache.dsv41_request_window import window_layout

    original = getattr(window_layout, "__wrapped__", window_layout)  # SGLang's own, under any hook
    return original(case.req, case.pos, **case.kwargs())


def sglang_window_triton(case: WindowCase) -> dict[str, Any]:
    """SGLang's Triton op ``build_window_layout`` (its CUDA path), here through the interpreter, with the
    run scans its CUDA path computes first."""
    from sglang.kernels.ops.kvcache.dsv41_window_layout import build_window_layout
    from sglang.srt.mem_cache.dsv41_request_window import _first_row_offsets

    group, first, last = _first_row_offsets(case.req)
    return build_window_layout(case.req, case.pos, group, first, last, **case.kwargs())


# -- malformed steps ------------------------------------------------------------------------------------------


def decode_step(seed: int = 5) -> CausalCase:
    """A clean decode step of two requests (pool slots 0 and 1, 300 and 40 tokens, nothing evicted):
    row 0 reads slot 0's positions 172..299, row 1 slot 1's positions 0..39, no slot read twice."""
    rng = random.Random(seed)
    pool = Pool.make(rng, [300, 40] + [1] * 6, 128, [0] * 8)
    seq = torch.tensor([300, 40], dtype=torch.int32)
    return CausalCase("decode", pool, SWA_WINDOW, torch.tensor([0, 1]), seq)


def corrupt(case: CausalCase, *, swa_slot: int | None = None, token_slot: int | None = None) -> CausalCase:
    """``case`` with one bad entry under the newest token of its last row: that token's SWA slot in
    ``full_to_swa`` set to ``swa_slot``, or its full-pool slot in ``req_to_token`` to ``token_slot``
    (both pools are copied; ``case`` keeps its own)."""
    pos = int(case.seq_lens_casual[-1]) - 1
    pool_row = int(case.req_pool_indices_repeated[-1])
    req_to_token, full_to_swa = case.pool.req_to_token.clone(), case.pool.full_to_swa.clone()
    if swa_slot is not None:
        full_to_swa[int(req_to_token[pool_row, pos])] = swa_slot
    if token_slot is not None:
        req_to_token[pool_row, pos] = token_slot
    pool = dataclasses.replace(case.pool, req_to_token=req_to_token, full_to_swa=full_to_swa)
    return dataclasses.replace(case, pool=pool)
