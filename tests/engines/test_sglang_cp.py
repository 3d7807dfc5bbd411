"""SGLang 0.5.23's attention context parallelism (prefill CP) for DeepSeek-V4, with swa_hal's hooks applied by
SGLang's own plugin loader (``make test-sglang``; what the hooks see under CP: docs/engines.md
#context-parallelism).

Every CP rank runs in this process as SGLang's own CP unit tests place theirs: SGLang's strategy
(``init_cp_strategy``, interleave, the one its CUDA and ROCm DeepSeek-V4 backends take) and the rank's place
in the CP group (``get_parallel().override(attn_cp_rank=...)``). Each step goes through SGLang's real code
from the forward batch on: ``is_cp_active``, ``prepare_cp_forward`` (the rank layout and its padding), then
the backend's metadata (the CUDA backend's ``init_forward_metadata``: the causal expansion padded to the
whole step, ``make_core_attn_metadata``, ``apply_cp_reindex``, and the late-layer tail of decoder SWA bounded
replay with its own CP layout and its replay floors padded to the whole tail; ROCm's prefill metadata). On
every rank the metadata equals SGLang's own (its functions put back), every field, bit for bit, over the
paged pool and DeepSeek-V4.1's request window; and SGLang's own all-gather of the ranks' rows
(``gather_kv_cache``, its collective answered in-process) gives back the single-rank metadata of the step.

Also held: V4.1's request window stops SGLang's own build wherever a rank is padded, with or without swa_hal
(``test_request_window_with_cp_padding_stops_sglangs_own_build_with_or_without_swa_hal``); a guard violation
names the row of the whole step on every rank; SGLang runs only extend and mixed steps under CP, none in a
prefill CUDA graph; and the lens hook leaves SGLang's lens where the rows were cut before it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

import sglang_harness as H  # noqa: E402
from sglang.kernels.ops.attention.dsv4.attn_metadata_kernels import late_layer_tail_layout  # noqa: E402
from sglang.srt.layers.attention import deepseek_v4_backend as cuda_module  # noqa: E402
from sglang.srt.layers.attention import deepseek_v4_backend_hip_radix as hip_module  # noqa: E402
from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend  # noqa: E402
from sglang.srt.layers.attention.deepseek_v4_backend_hip_radix import DeepseekV4HipRadixBackend  # noqa: E402
from sglang.srt.layers.cp import bcg as cp_bcg  # noqa: E402
from sglang.srt.layers.cp import interleave  # noqa: E402
from sglang.srt.layers.cp.base import get_cp_strategy, init_cp_strategy  # noqa: E402
from sglang.srt.layers.cp.padding import pad_logical_token_to_physical  # noqa: E402
from sglang.srt.layers.cp.utils import is_cp_active, prepare_cp_forward  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402
from sglang_backends import assert_same, backend, both, kv_pool  # noqa: E402
from sglang_hooks import Originals, loaded_by_sglang  # noqa: E402

from swa_hal.errors import BatchRangeError  # noqa: E402
from swa_hal.integrations import sglang as integ  # noqa: E402

CP_SIZES = (2, 4)
KINDS = ("extend", "chunked", "mixed", "few_tokens", "long", "whole_extend")
STEPS = 2  # random steps per kind, CP size and backend


@pytest.fixture(scope="module")
def hooked():
    originals = Originals()
    originals.restore()  # whatever an earlier module left hooked
    with loaded_by_sglang(originals):
        yield SimpleNamespace(originals=originals)


@pytest.fixture(autouse=True)
def _no_flashmla(monkeypatch):
    # FlashMLA (a CUDA library) is asked for an empty scheduler object after the reindex; not SWA metadata.
    for module in (cuda_module, hip_module):
        monkeypatch.setattr(module, "_create_flashmla_metadata", lambda: None, raising=False)
    # ROCm's page table (not SWA metadata) is one Triton launch of a program per row, slow in the interpreter:
    # its torch statement instead, as its docstring gives it.
    monkeypatch.setattr(
        hip_module,
        "page_table_from_req_to_token",
        lambda req_to_token, req_rows, max_seq_len, page_size: (
            req_to_token[req_rows, :max_seq_len:page_size] // page_size
        ).to(torch.int32),
    )


@contextlib.contextmanager
def cp_rank(size: int, rank: int):
    """This process as rank ``rank`` of a CP group of ``size``, with SGLang's interleave strategy; the
    group's collective is never called on the metadata path (its handle is a stand-in)."""
    init_cp_strategy(enable_prefill_cp=True, cp_size=size, cp_strategy="interleave")
    try:
        with get_parallel().override(**_layout(size, rank), attn_cp_group=object(), enable_cp_tp_group_sharing=False):
            yield
    finally:
        init_cp_strategy(enable_prefill_cp=False, cp_size=1, cp_strategy="interleave")


@contextlib.contextmanager
def single_rank():
    with get_parallel().override(**_layout(1, 0)):
        yield


def _layout(size: int, rank: int) -> dict[str, int]:
    """The ranks and widths of a tensor-parallel group that is one attention-CP group of ``size`` (SGLang's
    DeepSeek-V4 CP: no attention TP or DP; the experts spread over the group), every width SGLang checks the
    layout by set, so it holds whatever ServerArgs the process published before."""
    return dict(
        tp_size=size,
        tp_rank=rank,
        attn_tp_size=1,
        attn_tp_rank=0,
        attn_dp_size=1,
        attn_dp_rank=0,
        attn_cp_size=size,
        attn_cp_rank=rank,
        moe_ep_size=size,
        moe_ep_rank=rank,
        moe_dp_size=1,
        moe_tp_size=1,
    )


# -- steps ---------------------------------------------------------------------------------------------------


class RequestWindowStandIn:
    """The attributes of DeepSeek-V4.1's ``RequestWindow`` the backend reads, and the layouts it activates."""

    def __init__(self, zero_row: int, capacity: int = 256):
        self.zero_row = zero_row
        self.capacity = capacity
        self.activated: list = []

    def activate(self, layout) -> None:
        self.activated.append(layout)


@dataclasses.dataclass
class Step:
    """One CP prefill step: its requests (pool slot, tokens before the step, tokens of the step), the pools,
    and what decides the late-layer tail (prompt logprobs, every hidden state)."""

    kind: str
    mode: ForwardMode
    pool: H.Pool
    slots: list[int]
    prefix: list[int]
    extend: list[int]
    logprob_start: list[int] | None = None
    full_hidden: bool = False

    @property
    def seq(self) -> list[int]:
        return [p + e for p, e in zip(self.prefix, self.extend)]

    def forward_batch(self) -> SimpleNamespace:
        """The fields of SGLang's ``ForwardBatch`` that the CP layout and the backend's metadata read."""
        ext = torch.tensor(self.extend, dtype=torch.int32)
        slots = torch.tensor(self.slots, dtype=torch.int64)
        pos = torch.cat([torch.arange(p, p + e) for p, e in zip(self.prefix, self.extend)])
        rows = slots.repeat_interleave(ext.to(torch.int64))
        n = int(ext.sum())
        return SimpleNamespace(
            forward_mode=self.mode,
            batch_size=len(self.slots),
            input_ids=torch.zeros(n, dtype=torch.int64),
            positions=pos,
            req_pool_indices=slots,
            seq_lens=torch.tensor(self.seq, dtype=torch.int64),
            seq_lens_cpu=torch.tensor(self.seq, dtype=torch.int64),
            extend_seq_lens=ext,
            extend_seq_lens_cpu=list(self.extend),
            extend_start_loc=torch.cumsum(ext, 0) - ext,
            out_cache_loc=self.pool.req_to_token[rows, pos].to(torch.int64),
            attn_cp_metadata=None,
            global_num_tokens_cpu=None,
            max_seq_len_override=None,
            encoder_swa_replay=False,
            encoder_swa_row_floor=None,
            encoder_swa_compress_rows=None,
            spec_info=None,
            return_logprob=self.logprob_start is not None,
            extend_logprob_start_lens_cpu=self.logprob_start,
            capture_hidden_mode=CaptureHiddenMode.FULL if self.full_hidden else CaptureHiddenMode.NULL,
        )


def padded_rows(extend: list[int], whole: list[bool], cp_size: int) -> int:
    """The CP padding rows SGLang adds to a step of these extends and to its late-layer tail: its layouts'
    physical rows (``build_metadata`` and ``pad_logical_token_to_physical``; ``_late_layer_tail_cp_layout``,
    where a tail row belongs to the rank that holds its token) less the real ones."""
    rows, tail_lens, _ = late_layer_tail_layout(
        extend_lens_cpu=extend,
        seq_lens_cpu=extend,
        tail_len=H.SWA_WINDOW,
        device=torch.device("cpu"),
        whole_extend=whole,
    )
    batch = SimpleNamespace(batch_size=len(extend), positions=torch.zeros(sum(extend), dtype=torch.int64))
    with cp_rank(cp_size, 0):
        step = get_cp_strategy().build_metadata(sum(extend), None, list(extend))
        pad_logical_token_to_physical(step)
        tail = object.__new__(DeepseekV4AttnBackend)._late_layer_tail_cp_layout(batch, rows, torch.tensor(tail_lens))
    layouts = (step, tail["cp_metadata"])
    return sum(sum(layout.per_rank_actual_token) - layout.total_seq_lens for layout in layouts)


def cp_step(rng: random.Random, kind: str, cp_size: int, *, unpadded: bool = False) -> Step:
    """A random prefill step of ``kind``: ``extend`` (new prompts), ``chunked`` (chunks after a cached prefix or
    an earlier chunk), ``mixed`` (chunks and one-token decodes, SGLang's mixed chunk), ``few_tokens`` (barely
    ``cp_size`` tokens: every rank padded), ``long`` (chunks longer than the window, so the tail is a part of
    each), ``whole_extend`` (prompt logprobs or every hidden state: some tails are whole extends)."""
    page = rng.choice((128, 256))  # the backend's pages are multiples of 128
    nreq = rng.randint(1, 5)
    slots = rng.sample(range(8), nreq)
    if kind == "few_tokens":
        extend = [1] * nreq
        for _ in range(cp_size + rng.randint(0, 2) - nreq):
            extend[rng.randrange(nreq)] += 1
        prefix = [rng.choice((0, rng.randint(1, 300))) for _ in range(nreq)]
    else:
        extend, prefix = [], []
        for _ in range(nreq):
            if kind == "long":
                e, p = rng.randint(H.SWA_WINDOW + 1, 400), rng.choice((0, rng.randint(1, 500)))
            elif kind == "mixed" and rng.random() < 0.5:
                e, p = 1, rng.randint(1, 700)
            else:
                e = rng.choice((rng.randint(1, 12), H.SWA_WINDOW + rng.randint(-6, 6), rng.randint(1, 300)))
                p = 0 if kind == "extend" else rng.choice((0, rng.randint(1, 600), H.SWA_WINDOW + rng.randint(-4, 4)))
            extend.append(e)
            prefix.append(p)
        extend[-1] += max(0, cp_size - sum(extend))  # CP needs a token per rank at least
    # Which requests' tails are whole extends: prompt logprobs from inside the extend, or every hidden state.
    full_hidden = kind == "whole_extend" and rng.random() < 0.3
    whole = [full_hidden or (kind == "whole_extend" and rng.random() < 0.5) for _ in range(nreq)]
    while unpadded and padded_rows(extend, whole, cp_size):
        extend[rng.randrange(nreq)] += 1
    full = [1] * 8
    keep_from = [0] * 8
    for s, p, e in zip(slots, prefix, extend):
        full[s] = p + e
        # SWA pages wholly below what the step's first token reads may be evicted, as SGLang frees them.
        keep_from[s] = max(0, p - H.SWA_WINDOW)
    pool = H.Pool.make(rng, full, page, keep_from)
    step = Step(kind, ForwardMode.MIXED if kind == "mixed" else ForwardMode.EXTEND, pool, slots, prefix, extend)
    step.full_hidden = full_hidden
    if kind == "whole_extend" and not full_hidden:
        step.logprob_start = [rng.randint(0, e - 1) if w else e for e, w in zip(extend, whole)]
    return step


def _metadata_backend(cls: type, step: Step, **extra) -> DeepseekV4AttnBackend:
    pool = step.pool
    return backend(
        cls,
        pool,
        extra.pop("kv", None) or kv_pool(pool),
        req_to_token_pool=SimpleNamespace(req_to_token=pool.req_to_token),
        has_c4=False,
        has_c128=False,
        mtp_enabled=False,
        topk=0,
        speculative_num_steps=0,
        is_dspark_draft=False,
        **extra,
    )


def cuda_backend(step: Step, *, window: bool) -> DeepseekV4AttnBackend:
    """SGLang's CUDA DeepSeek-V4 backend (CPU tensors take its ops' torch references) over the step's pools,
    with decoder SWA bounded replay on; DeepSeek-V4.1's request window when ``window``."""
    return _metadata_backend(
        DeepseekV4AttnBackend,
        step,
        kv=kv_pool(step.pool, request_window=RequestWindowStandIn(zero_row=7) if window else None),
        hisparse_coordinator=None,
        enable_decoder_swa_bounded_replay=True,
        online_c128_mtp=SimpleNamespace(prepare_forward=lambda *args, **kwargs: 0),
        model_runner=SimpleNamespace(spec_algorithm=SimpleNamespace(is_dspark=lambda: False)),
        _early_verify_metadata_ids=set(),
    )


def hip_backend(step: Step) -> DeepseekV4HipRadixBackend:
    """ROCm's DeepSeek-V4 backend: SGLang runs prefill CP there without DeepSeek-V4.1 and without bounded replay
    (its ``validate_deepseek_v4_cp`` refuses both), so with the paged pool and no tail."""
    return _metadata_backend(
        DeepseekV4HipRadixBackend, step, enable_decoder_swa_bounded_replay=False, is_draft_worker=False
    )


def metadata(made: DeepseekV4AttnBackend, step: Step, *, cp: bool) -> SimpleNamespace:
    """What the backend builds for the step, after SGLang's CP layout (``prepare_cp_forward``) when ``cp``: the
    forward metadata and the tail's (the CUDA backend's ``init_forward_metadata``; ROCm's prefill metadata),
    the request-window layouts activated, and the batch's CP layout."""
    fb = step.forward_batch()
    assert is_cp_active(fb) == cp
    if cp:
        prepare_cp_forward(fb)
    if isinstance(made, DeepseekV4HipRadixBackend):
        # Its prefill metadata, CP branch included, called as its _build_forward_metadata calls it but without
        # the compression metadata (not SWA metadata; Triton kernels, slow in the interpreter).
        main = made.init_forward_metadata_prefill(
            max_seq_len=max(step.seq),
            req_pool_indices=fb.req_pool_indices,
            seq_lens=fb.seq_lens.to(torch.int32),
            seq_lens_cpu=fb.seq_lens_cpu.tolist(),
            out_cache_loc=fb.out_cache_loc,
            num_tokens=sum(step.extend),
            extend_seq_lens=fb.extend_seq_lens,
            extend_seq_lens_cpu=fb.extend_seq_lens_cpu,
            extend_start_loc=fb.extend_start_loc,
            need_compress=False,
            exact_num_tokens=False,
            forward_batch=fb,
        )
        return SimpleNamespace(main=main, tail=None, activated=None, cp=fb.attn_cp_metadata)
    window = made.token_to_kv_pool.request_window
    if window is not None:
        window.activated.clear()
    made.init_forward_metadata(fb)
    return SimpleNamespace(
        main=made.forward_metadata,
        tail=made.tail_forward_metadata,
        activated=None if window is None else list(window.activated),
        cp=fb.attn_cp_metadata,
    )


def every_rank(hooked, made, step: Step, cp_size: int, what) -> list:
    """Each rank's metadata for the step, with swa_hal's hooks; each equal to SGLang's own, every field."""
    ranks = []
    for rank in range(cp_size):
        with cp_rank(cp_size, rank):
            got, want = both(hooked, lambda: metadata(made, step, cp=True))
        assert_same(got, want, (what, rank))
        ranks.append(got)
    return ranks


# -- the ranks together ----------------------------------------------------------------------------------------


def all_gathered(shards: list[torch.Tensor], cp_metadata, monkeypatch) -> torch.Tensor:
    """The ranks' rows in global token order, by SGLang's own all-gather of interleaved CP rows
    (``InterleaveCPStrategy.gather_kv_cache``), its collective answered with the ranks' rows in rank order."""
    with monkeypatch.context() as m:
        m.setattr(interleave, "attn_cp_all_gather_into_tensor", lambda out, local: out.copy_(torch.cat(shards)))
        m.setattr(interleave, "use_symmetric_memory", lambda *args, **kwargs: contextlib.nullcontext())
        m.setattr(interleave, "is_allocation_symmetric", lambda: False)
        with cp_rank(len(shards), 0):
            return get_cp_strategy().gather_kv_cache(shards[0], SimpleNamespace(attn_cp_metadata=cp_metadata))


def assert_ranks_hold_the_single_rank_metadata(ranks: list, single, monkeypatch, what) -> None:
    """Every per-row field the reindex cut (SGLang's own list of them), all-gathered from the ranks as SGLang
    gathers rows, is the single-rank build's field: the step's tokens (main), the tail's rows (tail). The
    request-window layout is not cut: every rank activates the single-rank layout."""
    for part in ("main", "tail"):
        want = getattr(single, part)
        if want is None:
            continue
        core = want.core_attn_metadata
        layout = ranks[0].cp if part == "main" else ranks[0].tail.late_layer_tail.cp_metadata
        names = [*core._CP_REINDEX_FIELDS, *core._CP_REINDEX_OPTIONAL_FIELDS]
        for name in [name for name in names if getattr(core, name, None) is not None]:
            shards = [getattr(getattr(r, part).core_attn_metadata, name) for r in ranks]
            assert_same(all_gathered(shards, layout, monkeypatch), getattr(core, name), (what, part, name))
    for r in ranks:
        assert_same(r.activated, single.activated, (what, "activated"))


# -- the tests ------------------------------------------------------------------------------------------------


# ROCm has no tail under CP, so no whole-extend tails either.
CASES = [(kind, cls) for cls in ("cuda", "cuda_request_window", "hip") for kind in KINDS]
CASES.remove(("whole_extend", "hip"))


@pytest.mark.parametrize("cp_size", CP_SIZES)
@pytest.mark.parametrize("kind, cls", CASES)
def test_every_rank_equals_sglangs_own(hooked, monkeypatch, kind, cls, cp_size):
    rng = random.Random(f"cp-{kind}-{cp_size}-{cls}")
    window = cls == "cuda_request_window"
    for i in range(STEPS):
        # DeepSeek-V4.1's request window under CP runs only where no rank is padded (the test below).
        step = cp_step(rng, kind, cp_size, unpadded=window)
        made = hip_backend(step) if cls == "hip" else cuda_backend(step, window=window)
        ranks = every_rank(hooked, made, step, cp_size, (kind, cp_size, cls, i))
        with single_rank():
            single = metadata(made, step, cp=False)
        assert_ranks_hold_the_single_rank_metadata(ranks, single, monkeypatch, (kind, cp_size, cls, i))


@pytest.mark.parametrize("cp_size", CP_SIZES)
def test_request_window_with_cp_padding_stops_sglangs_own_build_with_or_without_swa_hal(hooked, cp_size):
    """DeepSeek-V4.1's request window under CP where SGLang pads a rank, in the step or in its late-layer tail:
    SGLang 0.5.23's own build stops in ``apply_cp_reindex``'s check, since the layout's write rows
    (``swa_out_cache_loc``, from ``window_layout`` over the padded rows) outnumber the real ones; with swa_hal's
    hooks (which served that layout) it stops at the same check with the same message. Where no rank is
    padded, neither stops."""
    rng = random.Random(f"cp-window-padded-{cp_size}")
    seen = set()
    for kind in ("few_tokens", "chunked", "long"):
        for unpadded in (False, True):
            step = cp_step(rng, kind, cp_size, unpadded=unpadded)
            made = cuda_backend(step, window=True)
            with cp_rank(cp_size, 0):
                got, want = both(hooked, lambda: raised(lambda: metadata(made, step, cp=True)))
            assert got == want, (kind, got, want)
            stopped = want is not None
            assert stopped == (padded_rows(step.extend, [False] * len(step.extend), cp_size) > 0), (kind, want)
            assert not stopped or "global field swa_out_cache_loc" in want, want
            seen.add(stopped)
    assert seen == {False, True}


def raised(call) -> str | None:
    """The message of the assertion ``call`` stopped at, or None."""
    try:
        call()
    except AssertionError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("mode", list(ForwardMode), ids=lambda m: m.name)
def test_only_extend_and_mixed_steps_run_under_cp(mode):
    """What SGLang runs under prefill CP (``is_cp_active``): its extend and mixed steps only, so of swa_hal's
    hooks only the causal rows, the causal lens and V4.1's request-window layout ever see a CP step; decode,
    target verify, draft extend and DSpark draft blocks build their metadata as without CP."""
    fb = SimpleNamespace(forward_mode=mode, input_ids=torch.zeros(8, dtype=torch.int64), extend_seq_lens_cpu=[5, 3])
    with cp_rank(2, 1):
        assert is_cp_active(fb) == (mode in (ForwardMode.EXTEND, ForwardMode.MIXED)), mode


@pytest.mark.parametrize("cp_size", CP_SIZES)
def test_a_guard_violation_names_the_row_of_the_whole_step_on_every_rank(hooked, cp_size):
    """A bad cache slot under one token: every rank's guarded build finds it (each builds every row), and the
    row it names is that token's row in the whole step, whichever rank holds the token."""
    rng = random.Random(f"cp-violation-{cp_size}")
    step = cp_step(rng, "chunked", cp_size)
    while len(step.slots) < 2:
        step = cp_step(rng, "chunked", cp_size)
    # A token of the last request: no row before its own reads its position.
    k = len(step.slots) - 1
    j = rng.randrange(step.extend[k])
    row = sum(step.extend[:k]) + j
    pool = step.pool
    bad = dataclasses.replace(pool, full_to_swa=pool.full_to_swa.clone())
    bad.full_to_swa[pool.req_to_token[step.slots[k], step.prefix[k] + j]] = -7
    step = dataclasses.replace(step, pool=bad)
    made = cuda_backend(step, window=False)
    made.enable_decoder_swa_bounded_replay = False
    adapter = integ.adapter_for(torch.device("cpu"), H.SWA_WINDOW)
    adapter.builder.check()
    for rank in range(cp_size):
        with cp_rank(cp_size, rank):
            metadata(made, step, cp=True)
        with pytest.raises(BatchRangeError) as err:
            adapter.builder.check()
        assert (err.value.field, err.value.index) == ("slot_map", row), (rank, str(err.value))


def test_no_prefill_cuda_graph_runs_a_deepseek_v4_cp_step(monkeypatch):
    """Every CP metadata build is eager: under a CP strategy SGLang replays a prefill CUDA graph only through a
    runner that captured a CP body (``model_runner._prefill_cuda_graph_allows_context_parallel``), which it
    captures only where ``supports_prefill_cp_bcg`` says so, and for DeepSeek-V4's attention backend (``dsv4``)
    it does not (it does for DSA's, the control)."""
    cfg = SimpleNamespace(enable_prefill_cp=True, pp_size=1, attn_cp_size=4, tp_size=4, cp_strategy="interleave")
    monkeypatch.setattr(cp_bcg, "resolving_view", lambda server_args: cfg)
    monkeypatch.setattr(cp_bcg, "resolved_view", lambda server_args: cfg)
    # The strategy's own check of the server (its graph inputs), past the combination: granted.
    monkeypatch.setattr(cp_bcg, "get_cp_bcg_input_type", lambda kind: SimpleNamespace(supports=lambda args: True))
    for backend_name, supported in (("dsv4", False), ("dsa", True)):
        monkeypatch.setattr(cp_bcg, "attention_backends_of", lambda view, name=backend_name: (name, name))
        assert cp_bcg.supports_prefill_cp_bcg(cfg) is supported, backend_name


def test_lens_hook_keeps_sglangs_lens_where_the_rows_were_cut_before_it(hooked):
    """The lens hook replaces SGLang's lens when ``make_core_attn_metadata`` returns, which in 0.5.23 is before
    the CP cut. Should a release cut inside it (``apply_cp_reindex`` before returning), the lens swa_hal built
    for the whole step would no longer fit the rank's rows: the hook then leaves SGLang's own (cut) lens, which
    fit them, instead of handing the rank the whole step's."""
    rng = random.Random("cp-cut-inside")
    step = cp_step(rng, "chunked", 2)
    made = cuda_backend(step, window=False)
    fb = step.forward_batch()
    ext = torch.tensor(step.extend, dtype=torch.int32)
    with cp_rank(2, 1):
        prepare_cp_forward(fb)
        rows = sum(fb.attn_cp_metadata.per_rank_actual_token)
        casual, pools = made.expand_prefill_casually(
            num_tokens=sum(step.extend),
            seq_lens=step.seq,
            extend_seq_lens=step.extend,
            req_pool_indices=fb.req_pool_indices,
            padded_num_tokens=rows,
            seq_lens_tensor=fb.seq_lens,
            extend_seq_lens_tensor=ext,
            extend_start_loc=fb.extend_start_loc,
        )
        kwargs = dict(
            req_to_token=step.pool.req_to_token,
            req_pool_indices_repeated=pools,
            seq_lens_casual=casual,
            max_seq_len=max(step.seq),
            out_loc=fb.out_cache_loc,
            need_compress=False,
            is_prefill=True,
            num_tokens=sum(step.extend),
        )
        sglangs = hooked.originals.entries[integ.TARGET_CORE][2]

        def cut_inside(self, *args, **kw):
            core = sglangs(self, *args, **kw)
            core.apply_cp_reindex(num_tokens=kw["num_tokens"])
            return core

        got = integ.core_attn_metadata_around(cut_inside, made, **kwargs)
        with hooked.originals.sglang_own():
            want = cut_inside(made, **kwargs)
    assert got.swa_topk_lengths.shape[0] == got.swa_page_indices.shape[0] == rows // 2
    assert_same(got, want, "cut inside")
