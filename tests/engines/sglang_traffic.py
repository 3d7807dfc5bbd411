"""SGLang's SWA allocator under scheduler-driven traffic: DeepSeek-V4 SWA metadata without a model.

This driver restates SGLang 0.5.23's scheduler around its SWA allocator; ``sglang_schedule_traffic.py`` runs
SGLang's own ``ScheduleBatch``, ``PrefillAdder``, ``ReqToTokenPool`` and ``UnifiedRadixCache`` instead, which
import in the SGLang test environment now that the backend's import chain is installed. This one keeps what the
real batch cannot drive without a draft model: target-verify steps. What runs for real here: SGLang's SWA
allocator ``SWATokenToKVPoolAllocator`` (``sglang/srt/mem_cache/allocator/swa.py``) over its two
``PagedTokenToKVPoolAllocator``s (``allocator/paged.py``): every slot, the full-to-SWA mapping, every free and
every SWA tombstone below come from it. It is handed a model-free KV pool (``BaseSWAKVPool``'s attributes,
``base_swa_memory_pool.py``, restated where that module does not import). Restated from SGLang's code:
``ReqToTokenPool`` (``mem_cache/memory_pool.py``: row 0 is padding, rows 1.. are handed out), the scheduler's
choices (``managers/schedule_policy.py``'s ``PrefillAdder``: FIFO under a token budget, chunked prefill, admission
only while the allocator has the pages), decode retraction when the pools run out (``ScheduleBatch.retract_decode``
in ``managers/schedule_batch.py``), the out-of-window SWA release of running requests
(``free_swa_out_of_window_slots``, ``mem_cache/common.py``, with the prefix-sharing threshold) and a radix cache of
shared prompt prefixes: a finished prefill inserts its page-aligned prefix, whose SWA below the last
``ceil_align(max(W, page), page)`` tokens is tombstoned (``free_swa``, as the SWA radix cache does), later prompts
reuse its slots, unreferenced prefixes are evicted when the pools run short.

Each step's ``req_to_token`` rows, the allocator's ``full_to_swa_index_mapping``, seq lens and extend/prefix lens
become the inputs SGLang's DeepSeek-V4 backend hands its metadata ops (``ExpandPrefillCausally`` for extend
batches; decode and target-verify rows as ``sglang_harness.causal_case`` lays them out), and SGLang's result
(``sglang_harness.sglang_causal``: its ops' CPU references) is compared field by field with swa_hal's through the
plugin path (the hooked ``BuildCausalSwaPageIndices.execute`` inside ``core_attn_metadata_around``): the torch
backend every step, a Triton backend in the interpreter every ``triton_every`` steps. Every row must also read a
live SWA slot for each position its lens cover, which checks the restated eviction against the allocator's state.

A long run: ``python tests/engines/sglang_traffic.py --steps 20000 --seed 1`` (in the SGLang test environment,
``SGLANG_PLUGINS=swa_hal``) prints the steps, what the traffic contained and every difference.
"""

from __future__ import annotations

import os

# SGLang's ops on the CPU, swa_hal's Triton kernels in the interpreter (as the engine tests set it).
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import argparse
import dataclasses
import random
import sys
import time
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

import sglang_harness as H  # noqa: E402
from helpers import BACKEND_PLATFORMS  # noqa: E402
from sglang.kernels.ops.attention.dsv4.attn_metadata_kernels import BuildCausalSwaPageIndices  # noqa: E402

from swa_hal import PlatformInfo  # noqa: E402
from swa_hal.integrations import sglang as integ  # noqa: E402

W = H.SWA_WINDOW
_BASE_SWA = "sglang.srt.mem_cache.base_swa_memory_pool"


def _swa_allocator_class() -> tuple[type, type]:
    """SGLang's ``SWATokenToKVPoolAllocator``. Its module needs ``BaseSWAKVPool`` only for an isinstance check;
    where that module cannot import (its ``memory_pool`` import), the class is restated with the attributes the
    allocator reads."""
    try:
        __import__(_BASE_SWA)
    except ImportError:
        sys.modules.pop(_BASE_SWA, None)
        stub = types.ModuleType(_BASE_SWA)

        class BaseSWAKVPool:  # base_swa_memory_pool.py, without the KVCache base and abstract methods
            swa_kv_pool: Any = None
            swa_req_ring_size: int | None = None
            request_window: Any = None
            swa_uses_full_indices = False

        stub.BaseSWAKVPool = BaseSWAKVPool  # type: ignore[attr-defined]
        sys.modules[_BASE_SWA] = stub
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_swa_memory_pool import BaseSWAKVPool

    def register_mapping(self: Any, mapping: torch.Tensor) -> None:  # SWAKVPool's (swa_memory_pool.py)
        self.full_to_swa_index_mapping = mapping

    def translate(self: Any, kv_indices: torch.Tensor) -> torch.Tensor:  # SWAKVPool's (-1 maps to -1)
        return self.full_to_swa_index_mapping[kv_indices]

    def no_buffers(self: Any) -> None:  # no KV buffers: the allocator only hands out slots
        pass

    attrs = {"register_mapping": register_mapping, "translate_loc_from_full_to_swa": translate, "__init__": no_buffers}
    pool = type("ModelFreeSWAKVPool", (BaseSWAKVPool,), attrs)
    # Where SGLang's own BaseSWAKVPool imports (with the backend's dependencies installed) it is abstract over
    # the KV buffers' accessors, which the allocator never calls: none of them is provided, so none may be.
    pool.__abstractmethods__ = frozenset()
    return pool, SWATokenToKVPoolAllocator


def _ceil_align(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclasses.dataclass(frozen=True)
class TrafficBase:
    """The engine setup and the requests it is fed, as both traffic drivers take them (``Traffic`` here,
    ``sglang_schedule_traffic.Traffic``)."""

    page_size: int = 64
    full_tokens: int = 2560  # the full KV pool
    swa_tokens: int = 1536  # the SWA pool: smaller, so SWA pressure retracts requests
    req_slots: int = 8  # ReqToTokenPool rows (plus SGLang's padding row 0)
    max_context: int = 1024
    token_budget: int = 96  # chunked_prefill_size: longer prompts are chunked
    num_prefixes: int = 4  # prompts share one of these prefixes (radix-cache hits)
    prefix_len: tuple[int, int] = (70, 300)
    suffix_len: tuple[int, int] = (1, 60)
    max_tokens: tuple[int, int] = (10, 160)  # long decodes: requests slide past the window
    arrivals: float = 0.5
    max_waiting: int = 6
    triton_every: int = 8


@dataclasses.dataclass(frozen=True)
class Traffic(TrafficBase):
    """The engine setup and the requests it is fed."""

    spec_steps: int = 3  # draft tokens per target-verify step (0: plain decode)
    verify_share: float = 0.4  # the share of decode steps that are target-verify steps


@dataclasses.dataclass
class Req:
    rid: int
    tokens: list[int]  # the prompt, then what it generated (retraction re-prefills all of it)
    max_new: int
    generated: int = 0
    pool_idx: int = 0
    seq_len: int = 0  # tokens with KV in the pools
    node: Any = None  # the cached prefix it holds (a radix-cache lock)
    protected: int = 0  # cache_protected_len: below it the slots are the cache's
    evicted: int = 0  # the SWA eviction cursor (req.kv's evicted seqlen)
    prefix_id: int = -1
    prefix_len: int = 0


@dataclasses.dataclass
class Node:
    """A cached prompt prefix: its key and the full-pool slots of its page-aligned tokens."""

    key: tuple[int, ...]
    slots: torch.Tensor
    refs: int = 0


class TrafficEngine:
    """What both traffic drivers share: the seeded request stream (the shared prompt prefixes, then arrivals
    drawn from the same generator in the same order), the counters and each step's comparison with SGLang.
    A driver holds ``waiting``, ``req_to_token`` and the SWA allocator ``alloc``, makes its requests in
    ``new_request`` and runs ``step``."""

    waiting: list[Any]
    req_to_token: torch.Tensor
    alloc: Any

    def __init__(self, traffic: TrafficBase, seed: int, backends: tuple[str, ...]):
        self.t = traffic
        self.rng = random.Random(seed)
        self.backends = backends
        self.prefixes = [
            [self.rng.randrange(1, 50000) for _ in range(self.rng.randint(*traffic.prefix_len))]
            for _ in range(traffic.num_prefixes)
        ]
        self.counts: Counter[str] = Counter()
        self.diffs: list[str] = []
        self.steps = 0
        self.next_rid = 0
        self.ever_used: set[int] = set()

    def step(self) -> None:
        raise NotImplementedError

    def new_request(self, rid: int, prefix_id: int, tokens: list[int], max_new: int) -> Any:
        """The driver's request for ``tokens``: shared prefix ``prefix_id``, then a suffix of its own."""
        raise NotImplementedError

    # -- requests ----------------------------------------------------------------------------------------

    def arrive(self) -> None:
        for _ in range(2):
            if self.rng.random() >= self.t.arrivals or len(self.waiting) >= self.t.max_waiting:
                return
            k = self.rng.randrange(self.t.num_prefixes)
            suffix = [self.rng.randrange(1, 50000) for _ in range(self.rng.randint(*self.t.suffix_len))]
            max_new = self.rng.randint(*self.t.max_tokens)
            self.waiting.append(self.new_request(self.next_rid, k, self.prefixes[k] + suffix, max_new))
            self.next_rid += 1
            self.counts["arrivals"] += 1

    # -- the comparison ---------------------------------------------------------------------------------------

    def check(self, kind: str, casual: torch.Tensor, rep: torch.Tensor, seq: list[int], rows: list[int]) -> None:
        """The step's rows (``rows``: the batch's ``req_to_token`` rows, ``seq`` their lens) from SGLang's ops and
        through swa_hal, compared."""
        lens = [0] * self.req_to_token.shape[0]
        for row, n in zip(rows, seq):
            lens[row] = n
        pool = H.Pool(self.req_to_token.clone(), self.alloc.full_to_swa_index_mapping.clone(), lens, self.t.page_size)
        case = H.CausalCase(kind, pool, W, rep, casual.to(torch.int32))
        want = H.sglang_causal(case)
        backends = [self.backends[0]]
        if len(self.backends) > 1 and self.t.triton_every and self.steps % self.t.triton_every == 0:
            backends += self.backends[1:]
        for backend in backends:
            _use_backend(backend)
            got = through_swa_hal(case)
            for field in ("swa_page_indices", "swa_topk_lengths"):
                a, b = getattr(got, field), getattr(want, field)
                if a.shape != b.shape or not torch.equal(a.to(torch.int64), b.to(torch.int64)):
                    self.diffs.append(f"step {self.steps} {kind} {backend}: {field} differs")
            self.counts[f"builds_{backend}"] += 1
        _use_backend(self.backends[0])
        # Each position the lens cover reads a live SWA slot (none evicted, none the padding slot 0).
        cols = torch.arange(want.swa_page_indices.shape[1])[None, :]
        covered = cols < want.swa_topk_lengths.to(torch.int64)[:, None]
        dead = covered & (want.swa_page_indices <= 0)
        if bool(dead.any()):
            self.diffs.append(f"step {self.steps} {kind}: SGLang's rows read {int(dead.sum())} evicted slots")
        self.counts["rows"] += casual.shape[0]


class Engine(TrafficEngine):
    """SGLang's SWA allocator driven by the restated scheduler; each step's metadata built both ways."""

    t: Traffic

    def __init__(self, traffic: Traffic, seed: int, backends: tuple[str, ...] = ("torch", "cuda")):
        super().__init__(traffic, seed, backends)
        pool_cls, alloc_cls = _swa_allocator_class()
        p = traffic.page_size
        kv = pool_cls()
        self.alloc = alloc_cls(
            traffic.full_tokens // p * p, traffic.swa_tokens // p * p, p, torch.int64, "cpu", kv, False
        )
        self.req_to_token = torch.zeros((traffic.req_slots + 1, traffic.max_context), dtype=torch.int32)
        self.free_rows = list(range(1, traffic.req_slots + 1))
        self.cache: dict[tuple[int, ...], Node] = {}
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked: Req | None = None

    # -- requests ----------------------------------------------------------------------------------------

    def new_request(self, rid: int, prefix_id: int, tokens: list[int], max_new: int) -> Req:
        return Req(rid, tokens, max_new, prefix_id=prefix_id, prefix_len=len(self.prefixes[prefix_id]))

    def _match(self, req: Req) -> Node | None:
        """The radix cache's match: the longest cached prefix of the prompt, leaving a token to extend."""
        best = None
        for node in self.cache.values():
            n = len(node.key)
            if n < len(req.tokens) and tuple(req.tokens[:n]) == node.key and (best is None or n > len(best.key)):
                best = node
        return best

    def _evict_cache(self, pages: int) -> bool:
        """Frees unreferenced cached prefixes (oldest first) until ``pages`` pages of each pool are free."""
        for key in list(self.cache):
            if self.alloc.new_pages_available(pages, pages):
                return True
            node = self.cache[key]
            if node.refs == 0:
                del self.cache[key]
                self.alloc.free(node.slots)
                self.counts["cache_evictions"] += 1
        return self.alloc.new_pages_available(pages, pages)

    def _release(self, req: Req, upto: int) -> None:
        """Frees the request's own slots ``[protected, upto)`` (SWA peers first, as ``free`` does), drops its
        cache lock and its row."""
        own = self.req_to_token[req.pool_idx, req.protected : _ceil_align(upto, self.t.page_size)].to(torch.int64)
        own = own[own > 0]
        if own.numel():
            self.alloc.free(own)
        if req.node is not None:
            req.node.refs -= 1
            req.node = None
        self.req_to_token[req.pool_idx] = 0
        self.free_rows.append(req.pool_idx)
        req.pool_idx = 0

    def _alloc_extend(self, reqs: list[Req], ext: list[int]) -> bool:
        prefix = torch.tensor([r.seq_len for r in reqs], dtype=torch.int64)
        seq = prefix + torch.tensor(ext, dtype=torch.int64)
        last = torch.tensor(
            [int(self.req_to_token[r.pool_idx, r.seq_len - 1]) if r.seq_len else -1 for r in reqs], dtype=torch.int64
        )
        got = self.alloc.alloc_extend(prefix, prefix, seq, seq, last, int(sum(ext)))
        if got is None:
            return False
        off = 0
        for r, n in zip(reqs, ext):
            slots = got[off : off + n]
            reused = sum(int(s) in self.ever_used for s in slots.tolist())
            self.counts["slot_reuse"] += reused
            self.ever_used.update(slots.tolist())
            self.req_to_token[r.pool_idx, r.seq_len : r.seq_len + n] = slots.to(torch.int32)
            off += n
        return True

    def _pages(self, reqs: list[Req], ext: list[int]) -> int:
        p = self.t.page_size
        return sum(_ceil_align(r.seq_len + n, p) // p - _ceil_align(r.seq_len, p) // p for r, n in zip(reqs, ext))

    # -- the scheduler (PrefillAdder, restated) ------------------------------------------------------------------

    def schedule_prefill(self) -> tuple[list[Req], list[int]]:
        budget = self.t.token_budget
        pages = 0  # what the requests admitted so far take
        reqs: list[Req] = []
        ext: list[int] = []
        queue = ([self.chunked] if self.chunked is not None else []) + list(self.waiting)
        for req in queue:
            if budget <= 0:
                break
            if req is not self.chunked:
                if not self.free_rows:
                    break
                node = self._match(req)
                req.pool_idx = self.free_rows.pop(0)
                if node is not None:
                    n = len(node.key)
                    self.req_to_token[req.pool_idx, :n] = node.slots.to(torch.int32)
                    req.seq_len = req.protected = req.evicted = n
                    req.node = node
                    node.refs += 1
            n = min(budget, len(req.tokens) - req.seq_len)
            need = pages + self._pages([req], [n])
            if not self.alloc.new_pages_available(need, need):
                if not self._evict_cache(need):
                    if req is not self.chunked:
                        self._release(req, req.seq_len)
                        req.seq_len = req.protected = req.evicted = 0
                    break
            if req is not self.chunked:
                self.waiting.remove(req)
                if req.node is not None:
                    self.counts["prefix_hits"] += 1
                    self.counts["prefix_hit_tokens"] += req.protected
            reqs.append(req)
            ext.append(n)
            budget -= n
            pages = need
        return reqs, ext

    def retract(self) -> None:
        """``retract_decode``: the newest running request gives its slots back and waits to re-prefill."""
        req = self.running.pop()
        self._release(req, req.seq_len)
        req.seq_len = req.protected = req.evicted = 0
        self.waiting.insert(0, req)
        self.counts["retractions"] += 1

    def evict_swa(self, req: Req) -> None:
        """``free_swa_out_of_window_slots`` with prefix sharing: keep ``ceil_align(max(W, page), page)``."""
        p = self.t.page_size
        pre_len = req.seq_len - 1
        if pre_len - W < req.evicted + 1:
            return
        new = max(req.evicted, pre_len - _ceil_align(max(W, p), p)) // p * p
        if new > req.evicted:
            slots = self.req_to_token[req.pool_idx, req.evicted : new].to(torch.int64)
            self.alloc.free_swa_segment(slots, start_pos=req.evicted)
            self.counts["swa_evicted_tokens"] += new - req.evicted
            req.evicted = new

    def insert(self, req: Req) -> None:
        """``cache_unfinished_req`` after the prefill covering the shared prefix: its page-aligned part goes
        into the cache (already there: the request keeps its own copy), SWA below the kept tail tombstoned."""
        p = self.t.page_size
        n = req.prefix_len // p * p
        key = tuple(req.tokens[:n])
        if n <= req.protected or key in self.cache:
            return
        slots = self.req_to_token[req.pool_idx, :n].to(torch.int64).clone()
        dead = max(0, n - _ceil_align(max(W, p), p)) // p * p
        if dead > req.protected:
            self.alloc.free_swa(slots[req.protected : dead])
        node = Node(key, slots, refs=1)
        if req.node is not None:
            req.node.refs -= 1
        self.cache[key] = node
        req.node, req.protected, req.evicted = node, n, max(req.evicted, n)
        self.counts["cache_inserts"] += 1

    # -- a step -------------------------------------------------------------------------------------------------

    def step(self) -> None:
        self.arrive()
        reqs, ext = self.schedule_prefill()
        if reqs:
            self.run_extend(reqs, ext)
        elif self.running:
            self.run_decode()
        self.steps += 1

    def run_extend(self, reqs: list[Req], ext: list[int]) -> None:
        if not self._alloc_extend(reqs, ext):
            raise AssertionError("the scheduler admitted an extend the allocator cannot hold")
        prefix = [r.seq_len for r in reqs]
        for r, n in zip(reqs, ext):
            r.seq_len += n
        seq = [r.seq_len for r in reqs]
        casual, rep = H._expand(seq, ext, [r.pool_idx for r in reqs], None, vectorized=self.steps % 2 == 0)
        self.check("extend", casual, rep, seq, [r.pool_idx for r in reqs])
        self.counts["extends"] += 1
        self.chunked = None
        for r, pre in zip(reqs, prefix):
            if pre > r.protected or r.seq_len < len(r.tokens):
                self.counts["chunked_extends"] += 1
            if r.seq_len < len(r.tokens):
                self.chunked = r
                continue
            self.insert(r)
            self.running.append(r)

    def run_decode(self) -> None:
        spec = self.t.spec_steps if self.t.spec_steps and self.rng.random() < self.t.verify_share else 0
        q = spec or 1
        while self.running:
            need = self._pages(self.running, [q] * len(self.running))
            if self.alloc.new_pages_available(need, need) or self._evict_cache(need):
                break
            self.retract()
        if not self.running:
            return
        reqs = list(self.running)
        for r in reqs:
            if r.seq_len + q > self.t.max_context:
                raise AssertionError("max_context too small for the traffic")
        if spec:
            ok = self._alloc_extend(reqs, [q] * len(reqs))
        else:
            seq = torch.tensor([r.seq_len + 1 for r in reqs], dtype=torch.int64)
            last = torch.tensor([int(self.req_to_token[r.pool_idx, r.seq_len - 1]) for r in reqs])
            got = self.alloc.alloc_decode(seq, seq, last)
            ok = got is not None
            if ok:
                for r, s in zip(reqs, got.tolist()):
                    self.counts["slot_reuse"] += s in self.ever_used
                    self.ever_used.add(s)
                    self.req_to_token[r.pool_idx, r.seq_len] = s
        if not ok:
            raise AssertionError("the allocator refused a decode its free pages allowed")
        seq_t = torch.tensor([r.seq_len + q for r in reqs], dtype=torch.int32)
        casual = (seq_t[:, None] + torch.arange(-q + 1, 1, dtype=torch.int32)).flatten()
        rep = torch.tensor([r.pool_idx for r in reqs], dtype=torch.int64).repeat_interleave(q)
        kind = "target_verify" if spec else "decode"
        self.check(kind, casual, rep, [r.seq_len + q for r in reqs], [r.pool_idx for r in reqs])
        self.counts["verifies" if spec else "decodes"] += 1
        for r in reqs:
            # Accepted drafts (at least one token: the verified one); rejected slots stay allocated in their
            # page and are overwritten by the next step, as the last page of an EAGLE request is.
            accept = self.rng.randint(1, q) if spec else 1
            r.seq_len += accept
            r.generated += accept
            r.tokens += [self.rng.randrange(1, 50000) for _ in range(accept)]
            if spec and accept < q:
                self.counts["rejected_drafts"] += q - accept
                # Rejected slots in the accepted tokens' last page stay (the next step overwrites them); whole
                # pages past it go back, or the next allocation, starting a page there, would strand them.
                keep = _ceil_align(r.seq_len, self.t.page_size)
                spill = self.req_to_token[r.pool_idx, keep : r.seq_len - accept + q].to(torch.int64)
                if spill.numel():
                    self.alloc.free(spill)
                    self.req_to_token[r.pool_idx, keep : r.seq_len - accept + q] = 0
                    self.counts["rejected_page_frees"] += 1
            if r.generated >= r.max_new or r.seq_len + self.t.spec_steps + 1 >= self.t.max_context:
                self.running.remove(r)
                self._release(r, r.seq_len)
                self.counts["finished"] += 1
            else:
                self.evict_swa(r)


def _use_backend(backend: str) -> None:
    plat = None if backend == "torch" else PlatformInfo.from_assume(BACKEND_PLATFORMS[backend])
    if (integ._settings.backend, integ._settings.platform) != (backend, plat):
        integ.configure(backend=backend, platform=plat)


def through_swa_hal(case: H.CausalCase) -> SimpleNamespace:
    """``make_core_attn_metadata``'s causal branch under swa_hal's hooks: the hooked op inside the AROUND hook."""
    backend_self = SimpleNamespace(token_to_kv_pool=SimpleNamespace(request_window=None))

    def original(self: Any, c: H.CausalCase, dspark_block_size: int | None = None) -> SimpleNamespace:
        return H.sglang_causal_branch(c, BuildCausalSwaPageIndices.execute)

    return integ.core_attn_metadata_around(original, backend_self, case)


def plugin_loaded() -> bool:
    return getattr(BuildCausalSwaPageIndices.__dict__["execute"].__func__, "__wrapped__", None) is not None


def load_plugin() -> None:
    """SGLang's own plugin loader (``SGLANG_PLUGINS=swa_hal``), unless it already ran in this process."""
    if plugin_loaded():
        return
    import sglang.srt.plugins as sgl_plugins

    os.environ["SGLANG_PLUGINS"] = "swa_hal"
    sgl_plugins._plugins_loaded = False
    sgl_plugins.load_plugins()
    if not plugin_loaded():
        raise AssertionError("SGLang's loader did not hook BuildCausalSwaPageIndices.execute")


def run(traffic: Traffic, seed: int, steps: int, backends: tuple[str, ...] = ("torch", "cuda")) -> Engine:
    engine = Engine(traffic, seed, backends)
    for _ in range(steps):
        engine.step()
    return engine


def summary(engine: TrafficEngine, seconds: float) -> str:
    counts = ", ".join(f"{k}={v}" for k, v in sorted(engine.counts.items()))
    return f"{engine.steps} steps in {seconds:.1f}s: {counts}; differences: {len(engine.diffs)}"


def report(make_engine: Callable[[], TrafficEngine], steps: int, every: int) -> int:
    """A long run from the command line: the counts every ``every`` steps and at the end, then every
    difference; 1 if there was one."""
    start = time.perf_counter()
    engine = make_engine()
    for i in range(steps):
        engine.step()
        if (i + 1) % every == 0:
            print(summary(engine, time.perf_counter() - start), flush=True)
    print(summary(engine, time.perf_counter() - start))
    for line in engine.diffs:
        print(line)
    return 1 if engine.diffs else 0


def arguments(description: str) -> argparse.ArgumentParser:
    """The command line both traffic drivers take (a driver adds its own options)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--page-size", type=int, default=TrafficBase.page_size)
    parser.add_argument("--triton-every", type=int, default=TrafficBase.triton_every)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__.splitlines()[0]).parse_args(argv)
    load_plugin()
    traffic = Traffic(page_size=args.page_size, triton_every=args.triton_every)
    return report(lambda: Engine(traffic, args.seed), args.steps, 1000)


if __name__ == "__main__":
    sys.exit(main())
