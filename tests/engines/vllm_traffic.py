"""vLLM's own scheduler and model runner drive the SWA builders: engine traffic without a model.

vLLM's real ``AsyncScheduler`` (or ``Scheduler``) and ``KVCacheManager`` run on the CPU with prefix caching,
chunked prefill under a small token budget, preemption under a small KV pool, MTP drafts and, for a vision
variant, images in the shared prefixes (cache hits that end inside an image, images back to back); sampled
tokens and draft acceptance are drawn from a seed, and with async scheduling (the default, as in vLLM 0.34) the
scheduler takes each step's output one step late, as vLLM's engine core with its batch queue does. Each step's
``SchedulerOutput`` becomes the model runner's inputs by vLLM's own model runner V2 (``vllm_runner.Runner``: its
request states, persistent block tables, CUDA-graph dispatch and padding, slot mappings, positions,
``query_start_loc`` and ``seq_lens``); the step's metadata is built through the model state's ``prepare_attn``
by vLLM's own SWA builder and by swa_hal's builder for it (the torch backend every step, a Triton backend in the
interpreter every ``triton_every`` steps), and every field is compared (``vllm_harness.compare``); on MTP steps
with two or more drafts, vLLM's drafter's own batches follow (``vllm_runner.Drafter``), built and updated by both.
DSpark drafts come from a real ``SpeculativeConfig`` too. A hybrid layout puts a prefix-cacheable group
beside several SWA groups (each with its own block table; swa_hal builds them in one step build, every one
compared); with V4.1 its SWA groups declare bounded replay, so the scheduler hands out ``replay_start``, and
vLLM's own V4.1 model state (its decoder replay layers on) prepares the replay sub-batch of every eager step,
whose metadata both builders build and which is compared too; under V4.1's specialized decode, FULL
uniform-decode steps replay the metadata builds recorded at start-up.

A long run: ``python tests/engines/vllm_traffic.py --suite 5000 --triton-every 0 --no-overflow-checks`` (in a vLLM
test environment) runs 5,000 steps of every traffic of ``SUITE``; ``--steps N --variant ...`` runs one. Each
prints the steps, what the traffic contained and every difference.
"""

from __future__ import annotations

import os

# vLLM on its CPU platform, before anything imports it (as the engine tests set it).
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import argparse
import contextlib
import dataclasses
import random
import sys
import tempfile
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))

import vllm_harness as H  # noqa: E402
import vllm_runner as R  # noqa: E402

from swa_hal import AttentionBatch  # noqa: E402
from swa_hal.integrations import vllm as integ  # noqa: E402

CPU = torch.device("cpu")
TRITON_PLATFORM = "vendor=cuda,capability=9.0"
LAYER = "model.layers.0.attn.swa_cache"  # the first SWA group's layer (group j's: model.layers.{j}.attn.swa_cache)
CACHEABLE_LAYER = "model.layers.0.attn.compressed_cache"


# The harness's variants, and DeepSeek-V4's own geometry (W = 128, 64-token SWA blocks) with one MTP draft.
VARIANTS = {
    **H.VARIANTS,
    "v4_mtp1_w128b64": H.Variant("v4_mtp1_w128b64", window=128, block_size=64, spec_tokens=1, max_model_len=4096),
}


@dataclasses.dataclass(frozen=True)
class Traffic:
    """The engine setup and the requests it is fed."""

    variant: str = "v4_mtp2_w6b8"
    num_blocks: int = 16  # the KV pool, blocks of the variant's size: small enough to preempt
    token_budget: int = 24  # max_num_batched_tokens: prompts longer than it are chunked
    max_num_seqs: int = 8
    num_prefixes: int = 2  # prompts share one of these prefixes (prefix-cache hits)
    prefix_len: tuple[int, int] = (12, 90)
    suffix_len: tuple[int, int] = (0, 40)
    max_tokens: tuple[int, int] = (20, 80)  # long decodes: running requests outgrow the pool
    arrivals: float = 0.6  # a new request arrives in a step with this probability (two at most)
    max_waiting: int = 6
    triton_every: int = 8  # the Triton backend builds every n-th step (the interpreter is slow)
    images: int = 0  # images in each shared prefix (a vision variant): hits may end inside one
    adjacent_images: float = 0.0  # the chance that an image starts where the previous one ends
    encoder_budget: int = 64  # the encoder's token budget and cache (the CPU platform's vision stub has none)
    # SWA KV-cache groups of the one SWA spec: vLLM's hybrid allocator splits a model's many SWA layers into
    # groups of equal size, each with its own block table; swa_hal builds a step's groups in one launch.
    swa_groups: int = 1
    # A prefix-cacheable group beside the SWA groups (the compressed cache of a hybrid model, group 0). With
    # V4.1 it makes the SWA groups bounded-replay ones, as vLLM's V4.1 attention declares them
    # (cache_config.swa_bounded_replay, on by default): the scheduler then rewinds a prefix hit by one
    # window and hands the request its replay_start.
    cacheable_group: bool = False
    spec_tokens: int | None = None  # MTP drafts in place of the variant's own (None: the variant's)
    # vLLM's CUDA-graph mode (CUDAGraphMode's name): the default pads uniform decode steps to a FULL graph's
    # request count and other steps to a PIECEWISE graph's token count; FULL pads every step's requests.
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    # vLLM's engine core with its batch queue (two steps in flight), as vLLM 0.34 runs by default.
    async_scheduling: bool = True
    # The largest token-keyed CUDA graph (0: the token budget): steps of more tokens run eagerly, as a
    # step past vLLM's max_cudagraph_capture_size does.
    max_capture_tokens: int = 0
    # V4.1 with bounded replay: the model's decoder replay layers (vLLM's ``DecoderReplayLayers``; here every
    # SWA group's layer, the first group's being the last KV source): in eager steps vLLM's V4.1 model
    # state prepares their sub-batch of each prefill's last window rows (``_prepare_replay_batch``), with
    # attention groups and builders of its own, and both builders' metadata of it is compared.
    decoder_replay: bool = True
    # V4.1 with bounded replay under its specialized decode (``decode_backend=latency_specialized``): vLLM's
    # DeepseekV41SpecializedDecodeModelState, FlashInfer's SWA builder (the one that decode runs), the
    # metadata builds of FULL uniform-decode steps recorded at start-up and replayed on those steps.
    specialized_decode: bool = False


class Engine:
    """vLLM's scheduler and KV-cache manager with the model runner's request state, and the builders."""

    def __init__(self, traffic: Traffic, seed: int, tmp: Path, backends: tuple[str, ...] = ("torch", "cuda")):
        from vllm.config import SpeculativeConfig
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        self.traffic = traffic
        self.rng = random.Random(seed)
        v = dataclasses.replace(VARIANTS[traffic.variant], max_num_seqs=traffic.max_num_seqs)
        if traffic.spec_tokens is not None:
            v = dataclasses.replace(v, spec_tokens=traffic.spec_tokens)
        self.variant = v
        vc = H.make_vllm_config(dataclasses.replace(v, spec_tokens=0), tmp)
        if v.spec_tokens:
            # A real config: MTP's draft model is the target's own MTP layers, DeepSeek-V4 DSpark's the target
            # checkpoint with DSpark's draft architecture (both read from the config file only).
            spec = SpeculativeConfig(
                method="dspark" if v.dspark else "mtp",
                num_speculative_tokens=v.spec_tokens,
                target_model_config=vc.model_config,
                target_parallel_config=vc.parallel_config,
            )
            object.__setattr__(vc, "speculative_config", spec)
        # The CPU platform forces 256-token blocks on DeepSeek-V4; the variant's small blocks are the point.
        vc.cache_config.block_size = v.block_size
        vc.cache_config.enable_prefix_caching = True
        vc.cache_config.prefix_caching_hash_algo = "sha256"  # its NONE_HASH seed is fixed: reproducible runs
        vc.cache_config.num_gpu_blocks = traffic.num_blocks
        vc.scheduler_config.max_num_batched_tokens = traffic.token_budget
        vc.scheduler_config.enable_chunked_prefill = True
        # vLLM's CUDA and ROCm platforms force this for a vision prefix-LM (an image's tokens are prefilled in
        # one chunk); the CPU platform does not, so it is set as those engines run. Prefix-cache hits can
        # still end inside an image.
        vc.scheduler_config.disable_chunked_mm_input = bool(traffic.images)
        self.vc = vc
        self.kv_spec = H.make_kv_spec(v)
        self.kv_config: Any = None  # set with the groups below
        self.bounded_replay = traffic.cacheable_group and v.version == "deepseek_v41"
        if self.bounded_replay:
            self.kv_spec = dataclasses.replace(self.kv_spec, bounded_replay=True)
        n = traffic.swa_groups
        self.swa_layers = [f"model.layers.{j}.attn.swa_cache" for j in range(n)]
        groups = [KVCacheGroupSpec([name], self.kv_spec) for name in self.swa_layers]
        if traffic.cacheable_group:
            from vllm.v1.kv_cache_interface import FullAttentionSpec

            # Its blocks and hashes are what the scheduler reads of it; no builder here builds it.
            full = FullAttentionSpec(block_size=v.block_size, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
            groups.insert(0, KVCacheGroupSpec([CACHEABLE_LAYER], full))
        kv_config = KVCacheConfig(
            num_blocks=traffic.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups, hash_block_size=v.block_size
        )
        self.kv_config = kv_config
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        # As vLLM's engine core makes it: with the config's hash lookahead (a drafter's, on some releases).
        self.block_hasher = get_request_block_hasher(v.block_size, hash_fn, vc.num_hash_lookahead_tokens)
        # vLLM 0.34's default: async scheduling (the engine core schedules a step before the last one's output
        # is back; a request's drafts are placeholders until then, and its host computed-token count an upper
        # bound), with vLLM's AsyncScheduler.
        vc.scheduler_config.async_scheduling = traffic.async_scheduling
        scheduler_cls = Scheduler
        if traffic.async_scheduling:
            from vllm.v1.core.sched.async_scheduler import AsyncScheduler

            scheduler_cls = AsyncScheduler
        self.scheduler = scheduler_cls(
            vc, kv_config, StructuredOutputManager(vc), block_size=v.block_size, hash_block_size=v.block_size
        )
        self.pending: tuple[Any, Any] | None = None  # async: the step whose output the scheduler awaits
        if traffic.images:
            from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

            self.scheduler.max_num_encoder_input_tokens = traffic.encoder_budget
            self.scheduler.encoder_cache_manager = EncoderCacheManager(cache_size=traffic.encoder_budget)
        # vLLM's model runner V2: verification/decode rows of this query length lead the batch.
        self.decode_query_len = 1 + v.spec_tokens
        self.cfg = H.swa_config_for(v, vc)
        self.width = -(-v.max_model_len // v.block_size)  # the block table's columns (max_model_len's blocks)
        first = int(traffic.cacheable_group)
        self.layout = H.StepLayout(len(groups), tuple(range(first, first + n)))
        self.counts: Counter[str] = Counter()
        self.prefixes = [
            [self.rng.randint(1, 999) for _ in range(self.rng.randint(*traffic.prefix_len))]
            for _ in range(traffic.num_prefixes)
        ]
        # Each prefix's images: (offset, length, identifier); the same image in every prompt of the prefix.
        self.images = []
        for f, prefix in enumerate(self.prefixes):
            spans, at = [], self.rng.randint(0, 6)
            for j in range(traffic.images):
                # As vLLM's DeepSeek-V4 processor lays an image out (models/deepseek_v4/common/mm_preprocess.py,
                # build_image_block): a compressor-alignment pad to one before a multiple of 4, then the
                # image's tokens, at most vision_max_n_token in all.
                pad = 3 - at % 4
                length = pad + self.rng.randint(1, max(1, v.max_image_tokens - 3))
                if at + length > len(prefix):
                    break
                spans.append((at, length, f"image-{f}-{j}"))
                # Images back to back (the next one starts where this one ends), or text between them.
                at += length + (0 if self.rng.random() < traffic.adjacent_images else self.rng.randint(1, 12))
                self.counts["adjacent_images"] += at == spans[-1][0] + length
            self.images.append(spans)
        self.reqs: dict[str, dict[str, Any]] = {}  # the model runner's request state
        self.seen: set[str] = set()
        self.next_id = 0
        self.diffs: list[str] = []
        # This step's requests whose image range starts before their chunk (a prefix-cache hit inside an image).
        self.into_chunk: list[tuple[str, int, tuple[int, int]]] = []
        self.backends = backends
        # vLLM's CUDA-graph grid as a GPU platform captures it (the CPU platform captures none), in the shape
        # of vLLM's default grid: uniform decode graphs of 1, 2, 4, 8, ... requests, token-keyed graphs of 1, 2,
        # 4 and every 8 tokens up to the token budget.
        from vllm.config import CUDAGraphMode

        R.capture_grid(
            vc,
            CUDAGraphMode[traffic.cudagraph_mode],
            [n for n in (1, 2, 4, 8, 16) if n <= traffic.max_num_seqs],
            sorted(
                n
                for n in {1, 2, 4, *range(8, traffic.token_budget, 8), traffic.token_budget}
                if n <= (traffic.max_capture_tokens or traffic.token_budget)
            ),
        )
        self._make_builders()
        self.runner = R.Runner(vc, kv_config, self.state, decode_query_len=self.decode_query_len)
        self.drafter = R.Drafter(self.runner, kv_config) if self.drafts else None
        if traffic.specialized_decode:
            # At start-up (vLLM's capture_inner_cudagraphs, after the forward's graphs): the metadata build of
            # every uniform-decode shape the FULL decode graphs serve, recorded on the runner's persistent
            # input buffers, block tables and slot mappings (vllm_runner.cpu_metadata_graphs).
            r = self.runner.runner
            for side, state in self.states.items():
                groups = self.native_groups if side == "native" else self.ours[side][1]
                with self.builder_options(side):
                    type(state).capture_inner_cudagraphs(state, r.input_buffers, r.block_tables, groups, kv_config)

    def _make_builders(self) -> None:
        from vllm.v1.attention.backends.mla import sparse_swa

        native_cls = sparse_swa.DeepseekSparseSWAMetadataBuilder
        native_backend = our_backend = None
        if self.variant.version == "deepseek_v41":
            # The builder of V4.1's default (FlashMLA) SWA backend on NVIDIA GPUs (FlashInfer's under the
            # specialized decode), and that backend, whose get_builder_cls (patched by the plugin: swa_hal's
            # builder) makes the builders of the copies of the groups that V4.1's model state keeps for its
            # decoder replay sub-batch. vLLM's own builders are made the same way, by a backend that hands
            # out vLLM's builder, as without the plugin.
            from vllm.models.deepseek_v41.nvidia import flashinfer_sparse, flashmla

            native_cls = flashmla.DeepseekSparseSWAFlashMLAMetadataBuilder
            our_backend = flashmla.DeepseekSparseSWAFlashMLABackend
            if self.traffic.specialized_decode:
                native_cls = flashinfer_sparse.DeepseekSparseSWAFlashInferMetadataBuilder
                our_backend = flashinfer_sparse.DeepseekSparseSWAFlashInferBackend
            native_backend = type("VllmFlashMLASWABackend", (), {"get_builder_cls": staticmethod(lambda: native_cls)})
        ours_cls = integ.swa_hal_builder_cls(native_cls)
        natives = [native_cls(self.kv_spec, [name], self.vc, CPU) for name in self.swa_layers]
        self.native_groups = H.attention_groups(natives, self.layout, self.kv_spec, native_backend)
        self.ours = {}
        for b in self.backends:
            kw = {"backend": b, **({"platform": TRITON_PLATFORM} if b != "torch" else {})}
            ours = [ours_cls(self.kv_spec, [name], self.vc, CPU, **kw) for name in self.swa_layers]
            self.ours[b] = (ours, H.attention_groups(ours, self.layout, self.kv_spec, our_backend))
        # The MTP drafter's own attention layers, and so builders of its own (its batches are not the target's).
        self.drafts = self.variant.spec_tokens > 1 and not self.variant.dspark
        if self.drafts:
            draft = [native_cls(self.kv_spec, [name], self.vc, CPU) for name in self.swa_layers]
            self.native_draft_groups = H.attention_groups(draft, self.layout, self.kv_spec)
            self.our_draft_groups = {}
            for b in self.backends:
                kw = {"backend": b, **({"platform": TRITON_PLATFORM} if b != "torch" else {})}
                ours = [ours_cls(self.kv_spec, [name], self.vc, CPU, **kw) for name in self.swa_layers]
                self.our_draft_groups[b] = H.attention_groups(ours, self.layout, self.kv_spec)
        # V4.1 with bounded replay: vLLM's own DeepseekV41ModelState (vllm_runner.deepseek_v41_model_state),
        # which reads the window it replays and the prefix-cacheable groups whose replayed slots it pads from
        # the KV-cache config on first use. One per builder family: a state keeps the replay sub-batch's
        # attention groups (copies of the first groups it is handed, with builders of their own) and the
        # sub-batch it last prepared. Their per-request tables (replay starts, rows kept whole) are the
        # runner's one state's, which add_request fills.
        self.replay_layers = self.bounded_replay and self.traffic.decoder_replay
        self.states: dict[str, Any] = {}
        if self.bounded_replay:
            from vllm.models.deepseek_v41.decoder_replay_layers import DecoderReplayLayers

            for side in ("native", *self.backends):
                layers = None
                if self.replay_layers:
                    # No forward runs: the layers' run and KV-write callables are never called.
                    layers = DecoderReplayLayers(
                        self.variant.window, None, None, set(self.swa_layers), self.swa_layers[0]
                    )
                make = (
                    R.specialized_decode_model_state if self.traffic.specialized_decode else R.deepseek_v41_model_state
                )
                self.states[side] = make(self.vc, layers)
            self.state = self.states["native"]
            for state in self.states.values():
                state._replay_start_np = self.state._replay_start_np
                if self.replay_layers:
                    state._keeps_rows_np = self.state._keeps_rows_np
        else:
            self.state = H.model_state(self.variant.version, self.vc)
        if self.traffic.images:
            self._vision_state()

    def _vision_state(self) -> None:
        """vLLM's default model state as a DeepSeek-V4 vision model has it: its ``prepare_attn`` computes the
        step's ``mm_req_doc_ranges`` itself (vllm/v1/worker/gpu/model_states/default.py) from the encoder
        cache's features by request, the model's clamp and leading-pad settings
        (vllm/models/deepseek_v4/common/vl_model.py, read from its class) and the window."""
        from vllm.models.deepseek_v4.common.vl_model import DeepseekV4ForConditionalGeneration as VL

        real = self.vc.model_config

        class ModelConfig:  # the CPU platform's text-only model config, as a vision prefix-LM
            is_mm_prefix_lm = True
            hf_text_config = real.hf_text_config

            def get_sliding_window(self) -> int | None:
                return real.get_sliding_window()

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        model = types.SimpleNamespace(
            mm_prefix_clamp_sliding_window=VL.mm_prefix_clamp_sliding_window,
            mm_prefix_span_leading_pad_modulus=VL.mm_prefix_span_leading_pad_modulus,
        )
        self.encoder_cache = types.SimpleNamespace(mm_features={})
        for name, value in dict(
            model_config=ModelConfig(), supports_mm_inputs=True, encoder_cache=self.encoder_cache, model=model
        ).items():
            object.__setattr__(self.state, name, value)

    # -- requests ---------------------------------------------------------------------------------

    def add_requests(self) -> None:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        t, rng = self.traffic, self.rng
        waiting = len(self.scheduler.waiting) + len(getattr(self.scheduler, "kv_holding_waiting", ()))
        for _ in range(2):
            if waiting >= t.max_waiting or rng.random() >= t.arrivals:
                continue
            family = rng.randrange(len(self.prefixes))
            prefix = self.prefixes[family]
            cut = len(prefix) if rng.random() < 0.6 else rng.randint(1, len(prefix))
            # A prompt holds its prefix's images that fit whole before the cut.
            images = [(a, n, name) for a, n, name in self.images[family] if a + n <= cut]
            prompt = prefix[:cut] + [rng.randint(1, 999) for _ in range(rng.randint(*t.suffix_len))]
            params = SamplingParams(max_tokens=rng.randint(*t.max_tokens), ignore_eos=True)
            rid = f"req-{self.next_id}"
            self.next_id += 1
            self.scheduler.add_request(
                Request(
                    rid,
                    prompt,
                    params,
                    None,
                    mm_features=[self._feature(*image) for image in images] or None,
                    block_hasher=self.block_hasher,
                    arrival_time=float(self.next_id),
                )
            )
            waiting += 1
            self.counts["requests"] += 1

    @staticmethod
    def _feature(offset: int, length: int, name: str) -> Any:
        from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

        # No encoder runs: the scheduler and the ranges read the identifier (the block hashes' image key)
        # and the placeholder's position only.
        return MultiModalFeatureSpec(
            data=None,
            modality="image",
            identifier=name,
            mm_position=PlaceholderRange(offset=offset, length=length),
            mm_hash=name,
        )

    # -- the model runner's side ------------------------------------------------------------------

    def _update_states(self, out: Any) -> None:
        """vLLM's model runner V2 ``update_requests``: finished and preempted requests leave, new (and, in
        0.34, resumed) ones bring their block ids and prefill length, running ones append new blocks."""
        for rid in out.finished_req_ids:
            self.reqs.pop(rid, None)
        for rid in out.preempted_req_ids or ():
            self.reqs.pop(rid, None)
        for new in out.scheduled_new_reqs:
            prefill = new.prefill_token_ids if new.prefill_token_ids is not None else new.prompt_token_ids
            self.reqs[new.req_id] = dict(
                blocks=[list(b) for b in new.block_ids],
                prefill_len=len(prefill),
                computed=new.num_computed_tokens,
                replay_start=getattr(new, "replay_start", 0),
                mm=list(new.mm_features or ()),
            )
            if new.req_id in self.seen:
                self.counts["resumed_after_preemption"] += 1
            elif new.num_computed_tokens > 0:
                self.counts["prefix_cache_hits"] += 1
                self.counts["prefix_cache_hit_tokens"] += new.num_computed_tokens
                c = new.num_computed_tokens
                if any(f.mm_position.offset < c < f.mm_position.offset + f.mm_position.length for f in new.mm_features):
                    self.counts["prefix_cache_hits_inside_image"] += 1
            self.seen.add(new.req_id)
        cached = out.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set())
        for i, rid in enumerate(cached.req_ids):
            st = self.reqs[rid]
            blocks = cached.new_block_ids[i]
            if rid in resumed:  # 0.33's resumed requests: the block table anew, all their tokens to prefill
                st["blocks"] = [list(b) for b in blocks]
                st["prefill_len"] = len(cached.all_token_ids[rid])
                self.counts["resumed_after_preemption"] += 1
            elif blocks is not None:
                for g, b in enumerate(blocks):
                    st["blocks"][g].extend(b)
            st["computed"] = cached.num_computed_tokens[i]

    def inputs(self, out: Any) -> tuple[AttentionBatch, Any, Any, tuple[torch.Tensor, ...], torch.Tensor, list[str]]:
        """The step's inputs as vLLM's model runner V2 makes them, by vLLM's own code (``vllm_runner``): its
        request order, persistent block tables (entries below the window nulled, entries past a request's
        blocks left from earlier steps), slot mappings, positions, ``query_start_loc`` and ``seq_lens``, padded
        to the CUDA graph the batch dispatches to. Returns the builders' view of the first SWA group (what
        ``prepare_attn`` hands them: padded sizes on FULL steps), vLLM's batch descriptor and InputBatch,
        the block tables and slot mappings, and the request ids in batch order."""
        from vllm.config import CUDAGraphMode

        desc, ib, tables, slots = self.runner.prepare(out)
        full = desc.cg_mode == CUDAGraphMode.FULL
        n = ib.num_reqs_after_padding if full else ib.num_reqs
        num_tokens = ib.num_tokens_after_padding if full else ib.num_tokens
        first = self.layout.swa[0]
        qsl_np = ib.query_start_loc_np[: n + 1]
        batch = AttentionBatch(
            seq_lens=ib.seq_lens[:n],
            query_start_loc=ib.query_start_loc[: n + 1],
            query_start_loc_cpu=torch.from_numpy(qsl_np),
            seq_lens_cpu=ib.seq_lens_cpu_upper_bound[:n],
            block_table=tables[first],
            slot_mapping=slots[first],
            max_query_len=int(np.diff(qsl_np).max()),
            num_tokens=num_tokens,
            causal=True,
        )
        if self.traffic.images:
            self.encoder_cache.mm_features = {r: self.reqs[r]["mm"] for r in ib.req_ids}
        self._count_runner(desc, ib, tables, slots)
        return batch, desc, ib, tables, slots, list(ib.req_ids)

    def _count_runner(self, desc: Any, ib: Any, tables: tuple[torch.Tensor, ...], slots: torch.Tensor) -> None:
        """What vLLM's runner did to this step's inputs: padding, nulled and stale table entries, host
        upper bounds above the device's sequence lengths."""
        from vllm.config import CUDAGraphMode

        c = self.counts
        c[f"cudagraph:{desc.cg_mode.name}"] += 1
        if desc.cg_mode == CUDAGraphMode.FULL and ib.num_reqs_after_padding > ib.num_reqs:
            c["padded_full_steps"] += 1
            c["padded_full_requests"] += ib.num_reqs_after_padding - ib.num_reqs
        if desc.cg_mode == CUDAGraphMode.PIECEWISE and ib.num_tokens_after_padding > ib.num_tokens:
            c["padded_piecewise_steps"] += 1
            c["padded_piecewise_tokens"] += ib.num_tokens_after_padding - ib.num_tokens
        bs = self.variant.block_size
        computed = ib.num_computed_tokens_np
        for g in self.layout.swa:
            for i, r in enumerate(ib.req_ids):
                row = tables[g][i].tolist()
                blocks = self.reqs[r]["blocks"][g]
                held = len(blocks)
                nulled = sum(1 for j in range(min(held, computed[i] // bs)) if row[j] == 0 and blocks[j] != 0)
                c["nulled_table_entries"] += nulled
                c["stale_table_entries"] += sum(1 for v in row[held:] if v != 0)
        upper = ib.seq_lens_cpu_upper_bound[: ib.num_reqs].numpy()
        c["host_upper_bound_rows"] += int((upper > ib.seq_lens[: ib.num_reqs].numpy()).sum())

    def chunk_ends_inside_image(self, ids: list[str], ib: Any) -> bool:
        """Whether a request's chunk ends inside one of its images (an image range ``[a, e]`` holding its
        last position ``S - 1`` with ``e > S - 1``), as vLLM's ``prepare_attn`` makes the ranges."""
        ranges = self._ranges(ids)
        seqs = ib.seq_lens_cpu_upper_bound[: ib.num_reqs].tolist()
        return any(a <= seqs[i] - 1 < e for i in range(len(ids)) for a, e in ranges.get(i, ()))

    def _ranges(self, ids: list[str]) -> dict[int, list[tuple[int, int]]]:
        from vllm.v1.attention.backends.utils import compute_mm_prefix_ranges

        model = self.state.model
        return compute_mm_prefix_ranges(
            [self.reqs[r]["mm"] for r in ids],
            sliding_window=self.variant.window,
            clamp_sliding_window=model.mm_prefix_clamp_sliding_window,
            span_pad=model.mm_prefix_span_leading_pad_modulus,
        )

    @contextlib.contextmanager
    def ranges_cut_at(self, ib: Any):
        """vLLM's ``prepare_attn`` with every image range it computes cut at its request's last position."""
        from vllm.v1.worker.gpu.model_states import default

        original = default.compute_mm_prefix_ranges
        last = [s - 1 for s in ib.seq_lens_cpu_upper_bound[: ib.num_reqs].tolist()]

        def cut(*args: Any, **kwargs: Any) -> dict[int, list[tuple[int, int]]]:
            ranges = original(*args, **kwargs)
            return {i: [(a, min(e, last[i])) if a <= last[i] else (a, e) for a, e in rs] for i, rs in ranges.items()}

        default.compute_mm_prefix_ranges = cut
        try:
            yield
        finally:
            default.compute_mm_prefix_ranges = original

    def spans_into_chunk(self, ids: list[str]) -> list[tuple[str, int, tuple[int, int]]]:
        """The requests whose image range (as vLLM's ``prepare_attn`` makes it) starts before their chunk and
        reaches into it: a prefix-cache hit, or an earlier chunk, ending inside an image."""
        from vllm.v1.attention.backends.utils import compute_mm_prefix_ranges

        model = self.state.model
        ranges = compute_mm_prefix_ranges(
            [self.reqs[r]["mm"] for r in ids],
            sliding_window=self.variant.window,
            clamp_sliding_window=model.mm_prefix_clamp_sliding_window,
            span_pad=model.mm_prefix_span_leading_pad_modulus,
        )
        out = []
        for i, r in enumerate(ids):
            first = self.reqs[r]["computed"]
            out += [(r, first, (a, b)) for a, b in ranges.get(i, ()) if a < first <= b]
        return out

    # -- a step -----------------------------------------------------------------------------------

    def build_and_compare(self, step: int, out: Any) -> None:
        batch, desc, ib, tables, slots, ids = self.inputs(out)
        self.batch, self.desc = ib, desc
        want = self.native_build(desc, ib, tables, slots)
        md = want[LAYER]
        c = self.counts
        c["steps"] += 1
        c["tokens"] += ib.num_tokens
        if self.bounded_replay and ib.num_reqs_after_padding > ib.num_reqs and desc.cg_mode.name == "FULL":
            c["padded_full_replay_steps"] += 1  # vLLM hands in fewer replay bounds than requests
        c["decode_rows"] += md.num_decode_tokens
        c["prefill_rows"] += md.num_prefill_tokens
        c["mixed_steps"] += md.num_decodes > 0 and md.num_prefills > 0
        spec = out.scheduled_spec_decode_tokens
        c["draft_steps"] += bool(spec)
        c["draft_tokens"] += sum(len(d) for d in spec.values())
        for i, r in enumerate(ids):
            st, q = self.reqs[r], int(ib.num_scheduled_tokens[i])
            if ib.is_prefilling_np[i] and st["computed"] + q < st["prefill_len"]:
                c["chunked_prefill_chunks"] += 1  # a prefill that continues in a later step
            if ib.is_prefilling_np[i] and st["computed"] > 0:
                c["prefills_after_context"] += 1  # a later chunk, a resumed request or one after a cache hit
        if self.bounded_replay:
            self._count_replay(ids, ib)
        if self.replay_layers:
            self._count_replay_batch(ib)
        # The specialized decode replays a recorded build on FULL uniform-decode steps: its metadata is the
        # recording's, whose host offsets are the capture batch's own tensor (the key fixes their values).
        replayed = self.traffic.specialized_decode and self.state.graphs.key(ib, desc.cg_mode) is not None
        c["metadata_graph_steps"] += replayed
        fresh = ("query_start_loc_cpu",) if replayed else ()
        c["multi_group_steps"] += len(self.layout.swa) >= 2
        gots = {}
        self.into_chunk = []
        if self.traffic.images:
            c["image_rows_visible_steps"] += md.prefill_left_visible is not None and bool(
                (md.prefill_left_visible > 0).any()
            )
            self.into_chunk = self.spans_into_chunk(ids)
            c["steps_with_span_into_chunk"] += bool(self.into_chunk)
        # A chunk that ends inside an image: vLLM's builder widens the image's rows to positions no step has
        # written yet, swa_hal stops them at the request's last position (docs/semantics.md #vision-spans,
        # "Rows stop at the last written position"). What swa_hal must equal there is vLLM's own builder
        # handed the same ranges cut at each request's last position.
        cut = self.traffic.images and self.chunk_ends_inside_image(ids, ib)
        uncut = want
        if cut:
            uncut = {name: H.snapshot(md) for name, md in want.items()}  # the next build reuses its buffers
            with self.ranges_cut_at(ib):
                want = self.native_build(desc, ib, tables, slots)
            c["chunks_ending_inside_image"] += 1
        for backend, (_, groups) in self.ours.items():
            if backend != "torch" and step % self.traffic.triton_every:
                continue
            gots[backend] = self.prepare_attn(desc, ib, tables, slots, groups, backend)
            self._record(step, backend, "build", ids, self.compare(want, gots[backend], batch, tables, slots, fresh))
            if self.replay_layers:
                self._compare_replay_batch(step, backend, ids, ib, tables)
            if cut and backend == "torch":
                c["chunk_inside_image_rows_differ"] += bool(self.compare(uncut, gots[backend], batch, tables, slots))
            c[f"builds:{backend}"] += 1
            if self.traffic.specialized_decode:
                self._check_recordings(step, backend, ids)
            if len(self.layout.swa) >= 2 and integ.step_builds_active():
                # swa_hal's step path: one build for all of the step's SWA groups (its plan holds them all); none
                # while the plugin shadows vLLM (docs/engines.md #shadow-mode).
                plan = self.ours[backend][0][0].swa_hal_step[0]
                c[f"step_builds:{backend}"] += plan.builder is not None and plan.kv_ids == self.layout.swa

    def native_build(self, desc: Any, ib: Any, tables: Any, slots: torch.Tensor) -> dict[str, Any]:
        """vLLM's builders' metadata for the step. vLLM's builder asserts when the step's requests list more
        image ranges than its span buffers hold (``max_num_batched_tokens``: it uploads every range of every
        request, past and future images included), where swa_hal builds (docs/engines.md, "Differences from
        vLLM's builder"); there the expected values are vLLM's builder's with span buffers that hold them."""
        try:
            return self.prepare_attn(desc, ib, tables, slots, self.native_groups)
        except AssertionError:
            if not self.traffic.images:
                raise
        self.counts["vllm_span_capacity_asserts"] += 1
        builders = [b for groups in self.native_groups for g in groups for b in g.metadata_builders]
        kept = [(b.span_starts, b.span_ends) for b in builders]
        for b in builders:
            b.span_starts = torch.zeros(b.span_starts.shape[0] * 16, dtype=torch.int32)
            b.span_ends = torch.zeros_like(b.span_starts)
        try:
            return self.prepare_attn(desc, ib, tables, slots, self.native_groups)
        finally:
            for b, (starts, ends) in zip(builders, kept):
                b.span_starts, b.span_ends = starts, ends

    def prepare_attn(
        self, desc: Any, ib: Any, tables: Any, slots: torch.Tensor, groups: Any, side: str = "native"
    ) -> dict[str, Any]:
        """The model state's ``prepare_attn`` as ``execute_model`` calls it, in the dispatched graph's mode
        (V4.1's state gathers the batch's replay bounds from its per-request table itself, and prepares its
        decoder replay sub-batch). Builders it creates for swa_hal's side (the sub-batch's) take that side's
        backend from the plugin's options (``configure``), as a user sets them."""
        state = self.states.get(side, self.state)
        kv = self.kv_config if self.bounded_replay else H.kv_cache_config(self.layout)
        with self.builder_options(side):
            return type(state).prepare_attn(state, ib, desc.cg_mode, tables, slots, groups, kv)

    @contextlib.contextmanager
    def builder_options(self, side: str):
        """swa_hal's builders that vLLM creates from now on take ``side``'s backend (the plugin's
        ``configure``); vLLM's side leaves the options as they are."""
        if side == "native":
            yield
            return
        previous = integ.configure(backend=side, platform=TRITON_PLATFORM if side != "torch" else None)
        try:
            yield
        finally:
            integ.configure(backend=previous.backend, platform=previous.platform, validate=previous.validate)

    def compare(
        self, want: dict[str, Any], got: dict[str, Any], batch: AttentionBatch, tables, slots, fresh=()
    ) -> list[str]:
        """Every SWA group's metadata, each against its own block table and slot mapping."""
        diffs = []
        for name, g in zip(self.swa_layers, self.layout.swa):
            view = dataclasses.replace(batch, block_table=tables[g], slot_mapping=slots[g])
            prefix = f"group {g}: " if len(self.swa_layers) > 1 else ""
            diffs += [prefix + d for d in H.compare(want[name], got[name], view, fresh=fresh, **self.chunk_args())]
        return diffs

    def _check_recordings(self, step: int, backend: str, ids: list[str]) -> None:
        """The specialized decode's recorded metadata builds replayed so far on each side, and any field a
        replay would have left stale (vllm_runner.Recording): a difference on swa_hal's side, counted on
        vLLM's."""
        for side in ("native", backend):
            recordings = self.states[side].graphs.recordings()
            self.counts[f"metadata_graph_replays:{side}"] = sum(r.replays for r in recordings)
            stale = [field for r in recordings for field in r.stale]
            for r in recordings:
                r.stale.clear()
            if side == "native":
                self.counts["metadata_graph_stale_fields:native"] += len(stale)
            elif stale:
                self._record(step, side, "metadata graph replay", ids, [f"stale after replay: {stale}"])

    def _count_replay_batch(self, ib: Any) -> None:
        """The decoder replay sub-batch vLLM's V4.1 model state prepared for this step, if any: its
        requests trimmed to their last window rows, and those whose window KV start it raised above the
        scheduler's replay start (a trimmed request holds no replay-layer KV below its kept rows)."""
        state, c = self.states["native"], self.counts
        if state.decoder_replay_layers.replay_batch is None:
            return
        n = ib.num_reqs
        kept = np.diff(state._kept_query_start_loc[: n + 1].numpy())
        query = np.diff(ib.query_start_loc_np[: n + 1])
        c["replay_batches"] += 1
        c["replay_batch_rows"] += int(kept.sum())
        c["replay_batch_trimmed_requests"] += int((kept < query).sum())
        c["replay_batch_raised_kv_starts"] += int((state._kept_kv_start[:n] > state._replay_start[:n]).sum())

    def _compare_replay_batch(self, step: int, backend: str, ids: list[str], ib: Any, tables: Any) -> None:
        """The decoder replay sub-batch's metadata (its forward context's), vLLM's builders' against
        swa_hal's, over the sub-batch's rows, query offsets and slot mappings."""
        want = self.states["native"].decoder_replay_layers.replay_batch
        got = self.states[backend].decoder_replay_layers.replay_batch
        if want is None or got is None:
            if (want is None) != (got is None):
                self._record(step, backend, "replay batch", ids, [f"replay batch: {want!r} vs {got!r}"])
            return
        state, n = self.states["native"], ib.num_reqs
        num = int(want.rows.numel())
        qsl = state._kept_query_start_loc[: n + 1].clone()
        slots = state._kept_slot_mappings[:, :num]
        view = AttentionBatch(
            seq_lens=ib.seq_lens[:n],
            query_start_loc=qsl,
            query_start_loc_cpu=qsl,
            seq_lens_cpu=ib.seq_lens_cpu_upper_bound[:n],
            block_table=tables[self.layout.swa[0]],
            slot_mapping=slots[self.layout.swa[0]],
            max_query_len=int(np.diff(qsl.numpy()).max()),
            num_tokens=num,
            causal=True,
        )
        # Each state hands its builders the sub-batch's offsets and slot mappings in buffers of its own.
        fresh = ("query_start_loc", "query_start_loc_cpu", "slot_mapping")
        diffs = self.compare(
            want.forward_context.attn_metadata, got.forward_context.attn_metadata, view, tables, slots, fresh
        )
        self._record(step, backend, "replay batch", ids, diffs)
        self.counts[f"replay_batch_builds:{backend}"] += 1
        # The sub-batch's builders, made by vLLM (create_metadata_builders on each group's backend): vLLM's
        # own on its side, swa_hal's of this backend on the other (the replay groups and the first layer's).
        for side, ours in (("native", False), (backend, True)):
            made = [
                b
                for kept in self.states[side]._replay_attn_groups
                for groups in kept
                for group in groups
                for b in group.metadata_builders
            ]
            right = [integ.is_swa_hal_builder(type(b)) == ours for b in made]
            if ours:
                right = [integ.is_swa_hal_builder(type(b)) and b.swa_hal.backend_name == backend for b in made]
            self.counts[f"replay_batch_builders:{side}"] = len(made) if all(right) else -len(made)

    def _count_replay(self, ids: list[str], ib: Any) -> None:
        """Prefills with a replay bound: the first token's window reaching below it (the builders clamp it:
        the cached window KV below the bound is not rebuilt), and later chunks of a replayed hit."""
        c, w = self.counts, self.variant.window
        seen = False
        for i, r in enumerate(ids):
            bound, computed = self.reqs[r]["replay_start"], self.reqs[r]["computed"]
            if not ib.is_prefilling_np[i] or bound <= 0:
                continue
            seen = True
            c["replay_prefills"] += 1
            c["replay_clamped_prefills"] += computed - (w - 1) < bound
            c["replay_later_chunks"] += computed > bound
        c["replay_steps"] += seen

    def chunk_args(self) -> dict[str, Any]:
        if self.variant.version == "deepseek_v41":
            return dict(chunk_ratios=(1, 2), has_compressed=(True, False))
        return dict(chunk_ratios=(1, 4, 128), has_compressed=(None,))

    def _draft_steps(self, step: int, num_sampled: list[int], rejected: list[int]) -> None:
        """vLLM's MTP drafter after the target's forward (``vllm_runner.Drafter``): its own uniform decode
        batch of the step's requests, built by vLLM's builders and swa_hal's for the drafter's layers, then
        moved one position per draft step and updated in place (``update_draft_decode_metadata``), every
        group compared after the build and after each update. DSpark drafts all in one forward."""
        ib, d, c = self.batch, self.drafter, self.counts
        n = ib.num_reqs
        desc, slots = d.first_step(ib, num_sampled, rejected)
        padded = desc.num_reqs or n
        c["drafter_batches"] += 1
        c["drafter_padded_requests"] += padded - n
        backends = [b for b in self.backends if b == "torch" or step % self.traffic.triton_every == 0]
        bound = ib.seq_lens_cpu_upper_bound
        want = d.build(desc, n, bound, self.native_draft_groups)
        gots = {b: d.build(desc, n, bound, self.our_draft_groups[b]) for b in backends}
        tables = tuple(t[:padded] for t in self.runner.runner.block_tables.input_block_tables)
        fresh = ("query_start_loc_cpu",)  # _build_attn_metadata makes one for each build
        for k in range(1, self.variant.spec_tokens):
            if k > 1:
                slots = d.advance(desc, n, k - 1, self.variant.spec_tokens)
            d.update(want, n, self.native_draft_groups)
            view = self._draft_view(desc, n, tables)
            for b, got in gots.items():
                d.update(got, n, self.our_draft_groups[b])
                self._record(
                    step, b, f"drafter step {k}", list(ib.req_ids), self.compare(want, got, view, tables, slots, fresh)
                )
                c[f"drafter_updates:{b}"] += 1

    def _draft_view(self, desc: Any, n: int, tables: tuple[torch.Tensor, ...]) -> AttentionBatch:
        """The drafter's batch as its builders see it (padded sizes on a FULL step)."""
        from vllm.config import CUDAGraphMode

        buffers = self.drafter.speculator.input_buffers
        padded = desc.num_reqs or n
        qsl = buffers.query_start_loc[: padded + 1].clone()
        first = self.layout.swa[0]
        return AttentionBatch(
            seq_lens=buffers.seq_lens[:padded],
            query_start_loc=qsl,
            query_start_loc_cpu=qsl,
            seq_lens_cpu=None,
            block_table=tables[first],
            slot_mapping=self.runner.runner.block_tables.slot_mappings[first, : desc.num_tokens],
            max_query_len=1,
            num_tokens=desc.num_tokens if desc.cg_mode == CUDAGraphMode.FULL else n,
            causal=True,
        )

    def _record(self, step: int, backend: str, what: str, ids: list[str], diffs: list[str]) -> None:
        """Every difference is one, steps whose image range starts before its request's chunk included (swa_hal
        builds vLLM's rows for those: docs/semantics.md #vision-spans)."""
        if not diffs:
            return
        text = f"step {step} {backend} {what} (requests {ids}):\n  " + "\n  ".join(diffs)
        if self.into_chunk:
            spans = ", ".join(f"{r} chunk from {first}, range {ab}" for r, first, ab in self.into_chunk)
            text += f"\n  image range into the chunk: {spans}"
        self.counts["differences"] += 1
        self.diffs.append(text)

    def sample(self, out: Any) -> Any:
        """The model's output, drawn: a token per request that reached its end (a partial prefill's is
        dropped, as vLLM's runner drops it), plus the accepted drafts; the runner's side of it (its device
        counts, the drafter's batches). Returns vLLM's ModelRunnerOutput for the scheduler."""
        from vllm.v1.outputs import ModelRunnerOutput

        ib, c = self.batch, self.counts
        spec = out.scheduled_spec_decode_tokens
        sampled, rejected = [], []
        for i, rid in enumerate(ib.req_ids):
            drafts = len(spec.get(rid, ()))
            q = int(ib.num_scheduled_tokens[i])
            partial = ib.is_prefilling_np[i] and ib.num_computed_tokens_np[i] + q - drafts < ib.prefill_len_np[i]
            if partial:
                sampled.append([])
                rejected.append(0)
                continue
            accepted = self.rng.randint(0, drafts)
            rejected.append(drafts - accepted)
            c["accepted_drafts"] += accepted
            c["rejected_drafts"] += drafts - accepted
            sampled.append([self.rng.randint(1, 999) for _ in range(accepted + 1)])
        # The runner's side: its device counts move by each request's query length less its rejected drafts.
        self.runner.postprocess(ib, sampled, rejected)
        if self.drafter is not None and spec:
            self._draft_steps(self.step_index, [len(s) for s in sampled], rejected)
        ids = list(ib.req_ids)
        kw = {"req_id_to_index": {r: i for i, r in enumerate(ids)}} if not H.V034 else {}  # 0.34 derives it
        return ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, **kw)

    def update_scheduler(self, out: Any, mro: Any) -> None:
        """The scheduler takes a step's output. In sync scheduling the drafts of the next step follow (vLLM's
        runner hands them over); async scheduling keeps them on the device (the scheduler holds placeholders)."""
        from vllm.v1.outputs import DraftTokenIds

        self.scheduler.update_from_output(out, mro)
        k = self.variant.spec_tokens
        if k and not self.traffic.async_scheduling:
            running = [r for r, s in zip(mro.req_ids, mro.sampled_token_ids) if s and r in self.scheduler.requests]
            drafts = [[self.rng.randint(1, 999) for _ in range(k)] for _ in running]
            self.scheduler.update_draft_token_ids(DraftTokenIds(running, drafts))

    def finish_pending(self) -> None:
        """Async scheduling: the engine core takes the oldest step's output (vLLM's step_with_batch_queue)."""
        if self.pending is not None:
            self.update_scheduler(*self.pending)
            self.pending = None

    def step(self, step: int) -> bool:
        """One pass of vLLM's engine core: schedule, run the runner, and hand the scheduler an output (with
        async scheduling, the previous step's: the scheduler schedules each step before the last one's
        output is back)."""
        self.add_requests()
        out = self.scheduler.schedule()
        self._update_states(out)
        self.counts["preemptions"] += len(out.preempted_req_ids or ())
        if not out.num_scheduled_tokens:
            self.runner.update(out)  # execute_model still updates the request states
            self.counts["empty_steps"] += 1
            self.finish_pending()
            return False
        self.step_index = step
        self.build_and_compare(step, out)
        mro = self.sample(out)
        if self.traffic.async_scheduling:
            self.finish_pending()
            self.pending = (out, mro)
        else:
            self.update_scheduler(out, mro)
        return True


@contextlib.contextmanager
def planner_stub():
    """FlashMLA's planner needs CUDA; the builders only create one fresh planner object per layer type."""
    from vllm.v1.attention.backends.mla import sparse_swa
    from vllm.v1.attention.ops.flashmla import FlashMLASchedMeta

    original = sparse_swa.get_mla_metadata
    sparse_swa.get_mla_metadata = lambda *a, **k: (FlashMLASchedMeta(), None)
    try:
        yield
    finally:
        sparse_swa.get_mla_metadata = original


def run(
    traffic: Traffic, steps: int, seed: int, *, backends: tuple[str, ...] = ("torch", "cuda"), tmp: Path | None = None
) -> Engine:
    """``steps`` scheduler steps of ``traffic`` (steps that schedule nothing do not count)."""
    integ.register()  # the plugin as vLLM loads it: swa_hal's step builds hook prepare_attn
    with contextlib.ExitStack() as stack:
        if tmp is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        stack.enter_context(planner_stub())
        stack.enter_context(R.cpu_side_streams())
        engine = Engine(traffic, seed, tmp, backends)
        done = idle = 0
        while done < steps:
            if engine.step(done):
                done += 1
                idle = 0
            else:
                idle += 1
                assert idle < 50, f"the scheduler scheduled nothing for 50 steps: {dict(engine.counts)}"
    return engine


# The long run's traffic (``--suite STEPS``): every runner behaviour on (async scheduling, CUDA-graph padding,
# nulled and stale tables, the drafter's batches, eager steps past the largest token graph) across DeepSeek-V4
# and V4.1 (its decoder replay sub-batches, its specialized decode's recorded metadata builds), no drafts and
# MTP with 1 to 4 drafts, DSpark, V4's own geometry and vision with adjacent images and images longer than
# the window.
SUITE = {
    "plain": Traffic(variant="v4_w8b4", num_blocks=20, max_tokens=(20, 80), arrivals=0.9),
    "mtp2": Traffic(variant="v4_mtp2_w6b8"),
    "mtp3": Traffic(variant="v4_mtp2_w6b8", spec_tokens=3, num_blocks=20),
    "mtp4": Traffic(variant="v4_mtp2_w6b8", spec_tokens=4, num_blocks=24),
    "v4_geometry": Traffic(
        variant="v4_mtp1_w128b64",
        num_blocks=32,
        token_budget=512,
        prefix_len=(150, 700),
        suffix_len=(0, 300),
        max_tokens=(40, 200),
    ),
    "v41_replay": Traffic(
        variant="v41_w8b4", spec_tokens=2, swa_groups=2, cacheable_group=True, num_blocks=96, max_capture_tokens=16
    ),
    "v41_specialized_decode": Traffic(
        variant="v41_w8b4",
        spec_tokens=2,
        swa_groups=2,
        cacheable_group=True,
        num_blocks=96,
        max_capture_tokens=16,
        specialized_decode=True,
    ),
    "v41_full_graphs": Traffic(
        variant="v41_w8b4", spec_tokens=1, swa_groups=2, cacheable_group=True, num_blocks=96, cudagraph_mode="FULL"
    ),
    "dspark": Traffic(variant="v4_dspark3_w5b4", swa_groups=2, cacheable_group=True, num_blocks=160),
    "vision": Traffic(variant="v4_vision_w6b4", images=3, num_blocks=48, num_prefixes=1, adjacent_images=0.5),
    "vision_long_images": Traffic(
        variant="v4_vision_w4b2",
        spec_tokens=1,
        images=6,
        adjacent_images=0.7,
        num_blocks=96,
        num_prefixes=1,
        prefix_len=(60, 90),
    ),
}


def interpreter_checks(on: bool) -> None:
    """Triton's interpreter with or without its int32 overflow checks (every later launch)."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=on)


def summary(engine: Engine, seconds: float) -> str:
    c = engine.counts
    lines = [
        f"vLLM traffic {engine.traffic.variant}: {c['steps']} steps in {seconds:.0f} s",
        "  " + ", ".join(f"{k}={v}" for k, v in sorted(c.items())),
        f"  differences: {len(engine.diffs)}",
    ]
    lines += ["  " + d for d in engine.diffs[:20]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--variant", default=Traffic.variant, choices=sorted(VARIANTS))
    p.add_argument("--num-blocks", type=int, default=Traffic.num_blocks)
    p.add_argument("--token-budget", type=int, default=Traffic.token_budget)
    p.add_argument("--images", type=int, default=0, help="images per shared prefix (a vision variant)")
    p.add_argument("--adjacent-images", type=float, default=0.0, help="chance an image follows the last directly")
    p.add_argument("--num-prefixes", type=int, default=Traffic.num_prefixes)
    p.add_argument("--triton-every", type=int, default=Traffic.triton_every, help="0: the torch backend only")
    p.add_argument("--spec-tokens", type=int, default=None, help="MTP drafts in place of the variant's")
    p.add_argument("--swa-groups", type=int, default=Traffic.swa_groups, help="SWA KV-cache groups of one spec")
    p.add_argument(
        "--cacheable-group",
        action="store_true",
        help="a prefix-cacheable group beside the SWA groups (with a V4.1 variant: bounded replay)",
    )
    p.add_argument("--cudagraph-mode", default=Traffic.cudagraph_mode, help="vLLM's CUDAGraphMode, by name")
    p.add_argument("--sync-scheduling", action="store_true", help="vLLM's synchronous scheduler (no batch queue)")
    p.add_argument(
        "--no-overflow-checks",
        action="store_true",
        help="Triton's interpreter skips its int32 overflow checks: about twice as fast; vLLM's kernel is the expected "
        "output, not under test, and swa_hal's kernels keep theirs in the test suite",
    )
    p.add_argument("--suite", type=int, default=0, metavar="STEPS", help="STEPS steps of every traffic of SUITE")
    p.add_argument("--only", default="", help="with --suite: these of its traffics (comma-separated names)")
    a = p.parse_args(argv)
    if a.no_overflow_checks:
        interpreter_checks(False)
    backends = ("torch", "cuda") if a.triton_every else ("torch",)
    if a.suite:
        total: Counter[str] = Counter()
        for name, traffic in SUITE.items():
            if a.only and name not in a.only.split(","):
                continue
            traffic = dataclasses.replace(traffic, triton_every=max(a.triton_every, 1))
            start = time.monotonic()
            engine = run(traffic, a.suite, a.seed, backends=backends)
            print(f"[{name}] " + summary(engine, time.monotonic() - start), flush=True)
            total.update(engine.counts)
            total["differences"] += len(engine.diffs)
        print("suite: " + ", ".join(f"{k}={v}" for k, v in sorted(total.items())))
        return 1 if total["differences"] else 0
    traffic = Traffic(
        variant=a.variant,
        num_blocks=a.num_blocks,
        token_budget=a.token_budget,
        images=a.images,
        adjacent_images=a.adjacent_images,
        num_prefixes=a.num_prefixes,
        triton_every=max(a.triton_every, 1),
        swa_groups=a.swa_groups,
        spec_tokens=a.spec_tokens,
        cacheable_group=a.cacheable_group,
        cudagraph_mode=a.cudagraph_mode,
        async_scheduling=not a.sync_scheduling,
    )
    start = time.monotonic()
    engine = run(traffic, a.steps, a.seed, backends=backends)
    print(summary(engine, time.monotonic() - start))
    return 1 if engine.diffs else 0


if __name__ == "__main__":
    sys.exit(main())
