"""SGLang's own scheduling data path under traffic: every step's rows from SGLang's real ``ScheduleBatch``.

``sglang_traffic.py`` restates SGLang's scheduler around its SWA allocator, from when its batch and cache modules
did not import in the SGLang test environment. With the backend's import chain installed they do, and this
module runs them for real, on the CPU, with no model:

- ``ReqToTokenPool`` (``mem_cache/memory_pool.py``) and the ``SWATokenToKVPoolAllocator`` over its two paged
  allocators (``mem_cache/allocator/swa.py``, over ``sglang_traffic``'s model-free KV pool): every slot;
- ``UnifiedRadixCache`` (``mem_cache/unified_radix_cache.py``) with a full and a SWA component, the prefix cache
  SGLang builds for a hybrid-SWA model (``mem_cache/registry.py``'s ``create_unified_radix_cache``): prefix
  matching, checkpoints of chunks and finished requests, SWA tombstones, eviction under pool pressure;
- ``PrefillAdder`` (``managers/schedule_policy.py``): admission under the token budget, chunked prefill;
- ``ScheduleBatch`` (``managers/schedule_batch.py``): ``init_new``, ``prepare_for_extend``, ``filter_batch``,
  ``merge_batch``, ``check_decode_mem``, ``retract_decode``, ``prepare_for_decode``, which allocate, write
  ``req_to_token`` and free out-of-window SWA slots;
- ``checkpoint_kv_cache`` and ``release_kv_cache`` (``mem_cache/common.py``), as the result processor calls them.

SGLang's ``ServerArgs`` are published for the process (``runtime_context.publish``), as the scheduler does at
start-up. What is restated is the scheduler's glue between these calls (``Scheduler.get_next_batch_to_run``,
``_get_new_batch_prefill_raw``, ``update_running_batch`` and the non-overlap result processing in
``managers/scheduler.py`` and ``scheduler_components/batch_result_processor.py``), each step in the order the
scheduler runs it; the model's sampled token is drawn from the seed. ``Scheduler`` itself does not import there
(docs/engines-internals.md says what it lacks).

Each step's batch gives the rows SGLang's DeepSeek-V4 backend hands its metadata ops: an extend batch's
``prefix_lens`` and ``extend_lens`` (through ``ExpandPrefillCausally``'s layout), a decode batch's ``seq_lens``;
``req_to_token`` and the allocator's ``full_to_swa_index_mapping`` as they are. SGLang's result (its ops' CPU
references) is compared with swa_hal's through the plugin's hooks (``sglang_traffic.TrafficEngine.check``).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import dataclasses
import json
import sys
import tempfile
from array import array
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))

import torchvision_stub  # noqa: E402

torchvision_stub.install()  # before SGLang's configs import (torchvision_stub.py says why)

import sglang_harness as H  # noqa: E402
import sglang_traffic as T  # noqa: E402

W = H.SWA_WINDOW
# A model's config.json for ServerArgs' resolution: a small decoder transformers knows (nothing runs it).
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 1,
    "vocab_size": 50000,
    "max_position_embeddings": 4096,
}


@dataclasses.dataclass(frozen=True)
class Traffic(T.TrafficBase):
    """The engine setup and the requests it is fed (``token_budget``: max_prefill_tokens and
    chunked_prefill_size)."""

    mixed_chunk: bool = False  # --enable-mixed-chunk: a prefill batch carries the running requests' decodes


def _sglang() -> SimpleNamespace:
    """SGLang's modules, imported on first use (they take seconds)."""
    from sglang.srt import runtime_context
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SimpleNamespace(**{k: v for k, v in locals().items()})


class ScheduledEngine(T.TrafficEngine):
    """SGLang's batch, policy, cache and pools, stepped as its scheduler steps them (without overlap)."""

    t: Traffic

    def __init__(self, traffic: Traffic, seed: int, backends: tuple[str, ...] = ("torch", "cuda")):
        super().__init__(traffic, seed, backends)
        S = self.S = _sglang()
        p = traffic.page_size
        # ServerArgs resolve against a model's config.json; a small one stands in for the model (none is loaded).
        self._model_dir = tempfile.TemporaryDirectory(prefix="swa-hal-sglang-model-")
        Path(self._model_dir.name, "config.json").write_text(json.dumps(MODEL_CONFIG))
        args = S.ServerArgs(
            model_path=self._model_dir.name,
            device="cpu",
            page_size=p,
            chunked_prefill_size=traffic.token_budget,
            max_prefill_tokens=traffic.token_budget,
            skip_server_warmup=True,
            enable_mixed_chunk=traffic.mixed_chunk,
        )
        S.runtime_context.publish(args, role="scheduler")
        self.req_to_token_pool = S.ReqToTokenPool(
            size=traffic.req_slots, max_context_len=traffic.max_context, device="cpu", enable_memory_saver=False
        )
        pool_cls, alloc_cls = T._swa_allocator_class()
        self.alloc = alloc_cls(
            traffic.full_tokens // p * p,
            traffic.swa_tokens // p * p,
            p,
            torch.int64,
            "cpu",
            pool_cls(),
            need_sort=False,
            req_to_token_pool=self.req_to_token_pool,
        )
        self.tree_cache = S.UnifiedRadixCache(
            S.CacheInitParams(
                disable=False,
                req_to_token_pool=self.req_to_token_pool,
                token_to_kv_pool_allocator=self.alloc,
                page_size=p,
                chunked_prefill_size=traffic.token_budget,
                sliding_window_size=W,
                tree_components=(S.ComponentType.FULL, S.ComponentType.SWA),
            )
        )
        evict = self.tree_cache.evict_for_alloc

        def counted_evict(params: Any, **kwargs: Any) -> Any:  # the allocator's evictions from the cache, counted
            got = evict(params, **kwargs)
            self.counts["cache_evicted_tokens"] += got.num_tokens_evicted
            self.counts["cache_evicted_swa_tokens"] += got.swa_num_tokens_evicted
            return got

        self.tree_cache.evict_for_alloc = counted_evict  # type: ignore[method-assign]
        # What ScheduleBatch reads of the model config (no model runs).
        self.model_config = SimpleNamespace(
            is_encoder_decoder=False, vocab_size=50000, hf_config=SimpleNamespace(), attention_arch=None
        )
        self.waiting: list[Any] = []
        self.running = S.ScheduleBatch(reqs=[], batch_is_full=False)
        self.chunked_req: Any = None
        self.last_batch: Any = None
        self.new_token_ratio = 0.5
        self.started: set[Any] = set()

    @property
    def req_to_token(self) -> torch.Tensor:  # type: ignore[override]
        return self.req_to_token_pool.req_to_token

    # -- requests ----------------------------------------------------------------------------------------

    def new_request(self, rid: int, prefix_id: int, tokens: list[int], max_new: int) -> Any:
        params = self.S.SamplingParams(max_new_tokens=max_new, temperature=0)
        params.normalize(None)
        return self.S.Req(f"r{rid}", "", array("q", tokens), params, vocab_size=50000)

    # -- the scheduler's loop (managers/scheduler.py, without overlap) --------------------------------------

    def step(self) -> None:
        self.arrive()
        self.merge_last_batch()
        batch = self.get_new_batch_prefill()
        if batch is not None:
            self.run_extend(batch)
            self.last_batch = batch
        elif not self.running.is_empty():
            self.update_running_batch()
            if not self.running.is_empty():
                self.run_decode(self.running)
            self.last_batch = self.running
        self.steps += 1

    def merge_last_batch(self) -> None:
        """``get_next_batch_to_run``: the chunked request's computed KV is checkpointed, and the last extend
        batch (less the chunked request) joins the running batch."""
        S = self.S
        exclude = []
        if self.chunked_req is not None:
            exclude.append(self.chunked_req)
            if self.chunked_req.extend_end > self.chunked_req.prefix_len:
                S.checkpoint_kv_cache(self.chunked_req, self.tree_cache)  # stash_chunked_request
        last = self.last_batch
        if last is not None and last is not self.running and last.forward_mode.is_extend():
            if last.chunked_req is not None:
                exclude.append(last.chunked_req)
            last.filter_batch(reqs_to_exclude=exclude)
            if not last.is_empty():
                if self.running.is_empty():
                    self.running = last
                else:
                    self.running.merge_batch(last)
        self.running.filter_batch()

    def get_new_batch_prefill(self) -> Any:
        """``_get_new_batch_prefill_raw``: the chunked request first, then the waiting queue in order."""
        S = self.S
        t = self.t
        running_bs = len(self.running.reqs)
        if running_bs >= t.req_slots or (not self.waiting and self.chunked_req is None):
            return None
        adder = S.PrefillAdder(
            t.page_size,
            self.tree_cache,
            self.alloc,
            self.running,
            self.new_token_ratio,
            t.token_budget,
            t.token_budget,
            0,
            max_running_requests=t.req_slots,
        )
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting:
            if adder.budget_state() == S.AddReqResult.OTHER:
                break
            if len(adder.can_run_list) + running_bs >= t.req_slots:
                break
            req.init_next_round_input(self.tree_cache)
            res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None, truncation_align_size=None)
            if res != S.AddReqResult.CONTINUE:
                break
        if not adder.can_run_list:
            return None
        admitted = set(adder.can_run_list)
        self.waiting = [r for r in self.waiting if r not in admitted]
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1
        batch = S.ScheduleBatch.init_new(
            adder.can_run_list,
            self.req_to_token_pool,
            self.alloc,
            self.tree_cache,
            self.model_config,
            False,
            S.SpeculativeAlgorithm.NONE,
            chunked_req=self.chunked_req,
        )
        batch.prepare_for_extend()
        batch.decoding_reqs = None
        if self.t.mixed_chunk and not self.running.is_empty():
            # Mixed-style chunked prefill: the decodes ride the prefill batch when the pools hold them.
            self.running.filter_batch()
            if not self.running.is_empty() and self.running.check_decode_mem():
                self.running.prepare_for_decode()
                batch.mix_with_running(self.running)
                batch.decoding_reqs = self.running.reqs
                self.running = S.ScheduleBatch(reqs=[], batch_is_full=self.running.batch_is_full)
                self.counts["mixed_steps"] += 1
        return batch

    def update_running_batch(self) -> None:
        """``update_running_batch``: retract when the pools cannot hold a decode step, then prepare it."""
        batch = self.running
        batch.filter_batch()
        if batch.is_empty():
            return
        if not batch.check_decode_mem():
            retracted, self.new_token_ratio, aborted = batch.retract_decode()
            assert not aborted, aborted
            self.counts["retractions"] += len(retracted)
            self.started.difference_update(retracted)
            self.waiting.extend(retracted)
        if not batch.is_empty():
            batch.prepare_for_decode()

    # -- the forward passes: the metadata built both ways, then a sampled token per request -----------------

    def run_extend(self, batch: Any) -> None:
        seq = batch.seq_lens.tolist()
        ext = list(batch.extend_lens)
        rows = batch.req_pool_indices.tolist()
        casual, rep = H._expand(seq, ext, rows, None, vectorized=self.steps % 2 == 0)
        self.check("extend", casual, rep, seq, rows)
        self.counts["extends"] += 1
        decoding = batch.decoding_reqs or []
        # A request's first extend (or its first after a retraction) that starts past 0 hit the prefix cache.
        hits = [n for req, n in zip(batch.reqs, batch.prefix_lens) if req not in decoding and n and req not in self.started]
        self.started.update(r for r in batch.reqs if r not in decoding)
        self.counts["prefix_hit_tokens"] += sum(hits)
        self.counts["prefix_hits"] += len(hits)
        for req in batch.reqs:
            if req.inflight_middle_chunks > 0:  # a chunk of a longer prompt
                req.inflight_middle_chunks -= 1
                self.counts["chunked_extends"] += 1
                continue
            self.sample(req)
            if req.finished():
                self.S.release_kv_cache(req, self.tree_cache, checkpoint=True)
                self.counts["finished"] += 1
            elif req not in decoding:
                self.S.checkpoint_kv_cache(req, self.tree_cache)

    def run_decode(self, batch: Any) -> None:
        seq = batch.seq_lens.to(torch.int32)
        rows = batch.req_pool_indices.to(torch.int64)
        for s in batch.out_cache_loc.tolist():
            self.counts["slot_reuse"] += s in self.ever_used
            self.ever_used.add(s)
        self.check("decode", seq, rows, seq.tolist(), rows.tolist())
        self.counts["decodes"] += 1
        # Rows whose request SGLang freed SWA slots of, below its window (the full slots stay).
        table = self.req_to_token_pool.req_to_token
        for r, n in zip(rows.tolist(), seq.tolist()):
            if n > W:
                old = table[r, : n - W].to(torch.int64)
                self.counts["rows_past_swa_frees"] += bool((self.alloc.full_to_swa_index_mapping[old] == 0).any())
        for req in batch.reqs:
            self.sample(req)
            if req.finished():
                self.S.release_kv_cache(req, self.tree_cache, checkpoint=True)
                self.counts["finished"] += 1

    def sample(self, req: Any) -> None:
        req.output_ids.append(self.rng.randrange(1, 50000))
        req.update_finish_state()


def run(traffic: Traffic, seed: int, steps: int, backends: tuple[str, ...] = ("torch", "cuda")) -> ScheduledEngine:
    engine = ScheduledEngine(traffic, seed, backends)
    for _ in range(steps):
        engine.step()
    return engine


def main(argv: list[str] | None = None) -> int:
    parser = T.arguments(__doc__.splitlines()[0])
    parser.add_argument("--token-budget", type=int, default=Traffic.token_budget)
    parser.add_argument("--mixed-chunk", action="store_true")
    args = parser.parse_args(argv)
    T.load_plugin()
    traffic = Traffic(
        page_size=args.page_size,
        token_budget=args.token_budget,
        mixed_chunk=args.mixed_chunk,
        triton_every=args.triton_every,
    )
    return T.report(lambda: ScheduledEngine(traffic, args.seed), args.steps, 500)


if __name__ == "__main__":
    sys.exit(main())
