"""vLLM's model runner V2 on the CPU: the step inputs the SWA builders receive, made by vLLM's own code.

``Runner`` is vLLM's ``GPUModelRunner`` (vllm/v1/worker/gpu/model_runner.py) without a model: the object is
vLLM's class, and every step runs vLLM's own methods in the order ``execute_model`` calls them
(``finish_requests``, ``add_requests``, ``update_requests``, ``BlockTables.apply_staged_writes``,
``gather_batch_req_state``, the CUDA-graph dispatch, ``prepare_inputs``, ``prepare_attn`` and the model
state's ``prepare_attn``), over vLLM's own ``RequestState``, ``InputBuffers``, ``BlockTables`` and
``CudaGraphManager``; after the forward, ``postprocess_sampled`` moves the device's computed-token counts
as the sampler's output says. vLLM's Triton kernels among them (the block-table gather that nulls the
entries below a sliding window, the slot mappings, positions and ``seq_lens``) run in Triton's interpreter.
So the inputs carry everything the runner does to them: CUDA-graph padding (FULL steps padded to a
captured request count, PIECEWISE steps to a captured token count), nulled and stale block-table entries,
persistent buffers reused step after step, and host ``seq_lens`` that are upper bounds.

What does not run on a CPU, and what stands in for it:

- Pinned and unified (UVA) host memory need CUDA: ``buffer_utils.is_uva_available`` answers False, so vLLM
  takes its own explicit-copy fallback (``NonUvaBuffer``), as on a platform without UVA.
- No CUDA graph is captured or replayed: ``CudaGraphManager`` is vLLM's, marked captured, and only
  ``dispatch`` runs (its padding decision is all a builder sees of a graph). The capture grid is set on the
  compilation config as a GPU platform would set it (``capture_grid``).
- The model, sampler and drafter do not run: the caller draws the sampled tokens and accepted drafts and
  hands them to ``postprocess_sampled`` (vLLM's ``post_update`` kernel); the runner's per-request workers
  that only the model reads (sampler, LoRA, logprobs, pooling, PP) are vLLM's "absent" values.
- V4.1's model states are vLLM's, made by their own constructors over a model stub
  (``deepseek_v41_model_state``, ``specialized_decode_model_state``): what of them needs CUDA is said there.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import types
from typing import Any

import numpy as np
import torch

CPU = torch.device("cpu")


def use_explicit_copies() -> None:
    """vLLM's UVA buffers on a CPU: its fallback for platforms without UVA (explicit copies), for the rest of
    the process (a CPU has neither pinned nor unified memory, so nothing else here could take the other path)."""
    from vllm.v1.worker.gpu import buffer_utils

    buffer_utils.is_uva_available = lambda: False
    buffer_utils.is_pin_memory_available = lambda: False


def capture_grid(vllm_config: Any, mode: Any, decode_sizes: list[int], token_sizes: list[int]) -> None:
    """The CUDA-graph capture grid on the compilation config, as a GPU platform sets it (the CPU platform
    captures none): uniform-decode graphs of ``decode_sizes`` requests, token-keyed graphs of
    ``token_sizes`` tokens. vLLM 0.34 keeps the two apart; 0.33 has one list of token sizes."""
    cc = vllm_config.compilation_config
    cc.cudagraph_mode = mode
    cc.max_cudagraph_capture_size = max(token_sizes)
    if hasattr(cc, "prefill_cudagraph_capture_token_sizes"):  # vLLM 0.34
        cc.decode_cudagraph_capture_request_sizes = list(decode_sizes)
        cc.prefill_cudagraph_capture_token_sizes = list(token_sizes)
    else:
        cc.cudagraph_capture_sizes = sorted(set(token_sizes))


def cudagraph_manager(vllm_config: Any, mode: Any, decode_query_len: int) -> Any:
    """vLLM's ``CudaGraphManager`` for ``mode``, its graphs marked captured (none is: see the module)."""
    from vllm.platforms import current_platform
    from vllm.v1.worker.gpu import cudagraph_utils

    # The pipeline group (a distributed setup) and the graph pool (CUDA) are all its constructor asks of
    # the platform; a single CPU rank is the first and last.
    rank = types.SimpleNamespace(is_first_rank=True, is_last_rank=True)
    original = cudagraph_utils.get_pp_group, current_platform.get_global_graph_pool
    cudagraph_utils.get_pp_group = lambda: rank
    current_platform.get_global_graph_pool = lambda: None
    try:
        params = inspect.signature(cudagraph_utils.CudaGraphManager.__init__).parameters
        if "decode_query_lens" in params:  # vLLM 0.34: query length -> the most requests of it
            manager = cudagraph_utils.CudaGraphManager(
                vllm_config, CPU, mode, {decode_query_len: vllm_config.scheduler_config.max_num_seqs}
            )
        else:
            manager = cudagraph_utils.CudaGraphManager(vllm_config, CPU, mode, decode_query_len)
    finally:
        cudagraph_utils.get_pp_group, current_platform.get_global_graph_pool = original
    manager._graphs_captured = True
    return manager


def deepseek_v41_model_state(vllm_config: Any, replay_layers: Any | None) -> Any:
    """vLLM's ``DeepseekV41ModelState``, made by its own constructor over a model stub that holds what the
    constructor reads of the model: no engram layers (``token_lookback_depth`` 0) and the decoder replay
    layers ``replay_layers`` (vLLM's ``DecoderReplayLayers``, or None where the model has none).

    What does not run on a CPU:

    - The decoder replay CUDA graphs (``DecoderReplayCudaGraphManager``: breakable PIECEWISE graphs of the
      replay layers) need CUDA graphs; ``cudagraph_decoder_replay`` is off, so the state keeps
      ``replay_cudagraphs`` None and, as vLLM does without them, prepares a replay batch in eager steps
      only (with them, PIECEWISE steps of ``decoder_replay_trim_threshold`` tokens or more break out to a
      replay batch padded to a replay graph's size; the traffic has none of those).
    - ``_warm_up_replay_kernels`` compiles the replay kernels ahead of their first launch (``warmup``):
      the interpreter compiles nothing, and the kernels run at their first launch instead.
    """
    from vllm.models.deepseek_v41.nvidia.model_state import DeepseekV41ModelState

    use_explicit_copies()
    vllm_config.compilation_config.cudagraph_decoder_replay = False
    model = types.SimpleNamespace(token_lookback_depth=0, decoder_replay_layers=replay_layers)
    state = DeepseekV41ModelState(vllm_config, model, None, CPU)
    state._warm_up_replay_kernels = lambda input_batch, slot_mappings: None
    return state


SPECIALIZED_DECODE = "vllm.models.deepseek_v41.nvidia.specialized_decode.runtime"


def specialized_decode_model_state(vllm_config: Any, replay_layers: Any | None) -> Any:
    """vLLM's ``DeepseekV41SpecializedDecodeModelState`` (V4.1's ``decode_backend=latency_specialized``),
    made by its own constructor over the model stub of ``deepseek_v41_model_state``, with its metadata
    graphs recorded and replayed on a CPU (``cpu_metadata_graphs``).

    What does not run on a CPU:

    - The decode executor: ``build_specialized_decode`` (the stub's answers None) builds CuTe DSL and
      FlashInfer kernels over the model's weights, and ``warmup.warm_up`` runs them; its module imports the
      CuTe DSL (``cutlass``), which needs CUDA, so where it does not import a module whose ``warm_up`` does
      nothing stands in for it. The executor runs the forward only: no attention metadata comes from it.
    - CUDA graphs of the metadata builds: see ``cpu_metadata_graphs``.
    """
    import sys

    warmup = f"{SPECIALIZED_DECODE}.warmup"
    try:
        importlib.import_module(warmup)
    except ImportError:
        stub = types.ModuleType(warmup)
        stub.warm_up = lambda decode, vllm_config: None  # type: ignore[attr-defined]
        sys.modules[warmup] = stub
    from vllm.models.deepseek_v41.nvidia.specialized_decode.runtime.model_state import (
        DeepseekV41SpecializedDecodeModelState,
    )

    use_explicit_copies()
    vllm_config.compilation_config.cudagraph_decoder_replay = False
    model = types.SimpleNamespace(
        token_lookback_depth=0, decoder_replay_layers=replay_layers, build_specialized_decode=lambda: None
    )
    state = DeepseekV41SpecializedDecodeModelState(vllm_config, model, None, CPU)
    state._warm_up_replay_kernels = lambda input_batch, slot_mappings: None
    state.graphs = cpu_metadata_graphs(vllm_config, state.graphs._decode_query_len)
    return state


class Recording:
    """A metadata build recorded by ``cpu_metadata_graphs``: ``replay`` runs the recorded build again, with
    the host arguments it was recorded with (the graph key's counts and the capture batch's worst-case
    ``seq_lens``), over the device buffers, which now hold the step's values. A CUDA graph replays the
    kernels at their recorded addresses and the step reads the metadata objects recorded with it, so every
    tensor the build hands out again must be the recorded one, refreshed in place (or hold the recorded
    values): ``stale`` lists the fields that are neither."""

    def __init__(self, build: Any, metadata: dict[str, Any]) -> None:
        self.build = build
        self.metadata = metadata
        self.replays = 0
        self.stale: list[str] = []

    def replay(self) -> None:
        again = self.build()
        self.replays += 1
        for name, recorded in self.metadata.items():
            for field, value in vars(again[name]).items():
                kept = getattr(recorded, field, None)
                if not isinstance(value, torch.Tensor) or not isinstance(kept, torch.Tensor):
                    continue
                same = value.data_ptr() == kept.data_ptr() and value.shape == kept.shape
                if not same and not (value.shape == kept.shape and torch.equal(value.cpu(), kept.cpu())):
                    self.stale.append(f"{name}.{field}")


def cpu_metadata_graphs(vllm_config: Any, decode_query_len: int) -> Any:
    """vLLM's ``AttnMetadataCudaGraphs`` with its recording done on a CPU: ``capture`` is the one method
    that needs CUDA (it records the build into a ``torch.cuda.CUDAGraph`` in the global graph pool); here
    it makes vLLM's warm-up build and its recorded build (both by vLLM's ``_forked_build``, its branches
    built one after the other: see ``cpu_side_streams``) and keeps a ``Recording`` as the graph, whose
    ``replay`` vLLM's own ``replay`` calls. The keys, ``can_record`` and ``replay`` are vLLM's."""
    from vllm.models.deepseek_v41.nvidia.specialized_decode.runtime.metadata_graphs import AttnMetadataCudaGraphs

    class CpuAttnMetadataCudaGraphs(AttnMetadataCudaGraphs):
        def capture(self, key: Any, attn_groups: Any, block_tables: Any, build_fn: Any) -> dict[str, Any]:
            self._forked_build(attn_groups, block_tables, build_fn)
            metadata = self._forked_build(attn_groups, block_tables, build_fn)
            recording = Recording(lambda: self._forked_build(attn_groups, block_tables, build_fn), metadata)
            self._graphs[key] = (recording, metadata)
            return metadata

        def recordings(self) -> list[Recording]:
            return [graph for graph, _ in self._graphs.values()]

    return CpuAttnMetadataCudaGraphs(vllm_config, decode_query_len)


class _NoStream:
    """A CUDA stream on a CPU: work runs where it is issued, in order."""

    def wait_stream(self, other: Any) -> None:
        pass


@contextlib.contextmanager
def cpu_side_streams():
    """vLLM's metadata graphs fork a build's branches onto side CUDA streams (``_forked_build``: the groups
    of each block-table storage on a branch of their own); on a CPU each branch builds where it is issued,
    one after the other in vLLM's branch order (the branches share no written buffer, which is what lets
    vLLM run them at once)."""
    module = importlib.import_module(f"{SPECIALIZED_DECODE}.metadata_graphs")
    cuda = types.SimpleNamespace(Stream=_NoStream, stream=lambda stream: contextlib.nullcontext())
    original = module.torch, module.current_stream
    module.torch = types.SimpleNamespace(cuda=cuda)
    module.current_stream = _NoStream
    try:
        yield
    finally:
        module.torch, module.current_stream = original


class Runner:
    """vLLM's ``GPUModelRunner`` without a model, on the CPU (see the module)."""

    def __init__(self, vllm_config: Any, kv_cache_config: Any, model_state: Any, *, decode_query_len: int) -> None:
        from vllm.v1.kv_cache_interface import SlidingWindowSpec
        from vllm.v1.worker.gpu.block_table import BlockTables
        from vllm.v1.worker.gpu.input_batch import InputBuffers
        from vllm.v1.worker.gpu.lora_utils import LoraState
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner
        from vllm.v1.worker.gpu.states import RequestState

        use_explicit_copies()
        sc = vllm_config.scheduler_config
        r = object.__new__(GPUModelRunner)
        self.runner = r
        r.vllm_config = vllm_config
        r.model_config = vllm_config.model_config
        r.device = CPU
        r.max_num_reqs = sc.max_num_seqs
        r.max_num_tokens = sc.max_num_batched_tokens
        r.max_model_len = vllm_config.model_config.max_model_len
        r.decode_query_len = decode_query_len
        r.req_states = RequestState(
            max_num_reqs=r.max_num_reqs,
            max_model_len=r.max_model_len,
            max_num_batched_tokens=r.max_num_tokens,
            num_speculative_steps=max(decode_query_len - 1, 1),
            vocab_size=1024,
            device=CPU,
        )
        r.input_buffers = InputBuffers(max_num_reqs=r.max_num_reqs, max_num_tokens=r.max_num_tokens, device=CPU)
        # The block tables as vLLM's initialize_kv_cache makes them: a sliding-window group reaches back
        # num_retained_tokens below a request's first scheduled position (older entries are nulled).
        specs = [group.kv_cache_spec for group in kv_cache_config.kv_cache_groups]
        r.block_tables = BlockTables(
            block_sizes=[s.block_size for s in specs],
            max_num_reqs=r.max_num_reqs,
            max_num_batched_tokens=r.max_num_tokens,
            max_num_blocks_per_group=[s.max_num_blocks_per_req(vllm_config, r.max_model_len) for s in specs],
            device=CPU,
            sliding_window_reach=[s.num_retained_tokens if isinstance(s, SlidingWindowSpec) else 0 for s in specs],
        )
        # A text model's state keeps no M-RoPE positions and no prompt embeddings.
        for name in ("rope_state", "prompt_embeds_state"):
            if not hasattr(model_state, name):
                setattr(model_state, name, None)
        r.model_state = model_state
        r.lora_state = LoraState(max_num_reqs=r.max_num_reqs)
        for name in (
            "speculator",
            "adaptive_verification",
            "pooling_runner",
            "pp_handler",
            "encoder_cache",
            "prompt_logprobs_worker",
            "sampler",
            "fast_prefill",
            "pcp_manager",
            "kv_block_zeroer",
        ):
            setattr(r, name, None)
        r.use_pp = False
        r.is_last_pp_rank = False  # the sampler's own state is not kept: nothing samples here
        r.draft_tokens_handler = types.SimpleNamespace(discard=lambda req_id: None)
        self.cudagraphs = cudagraph_manager(
            vllm_config, vllm_config.compilation_config.cudagraph_mode, decode_query_len
        )

    def update(self, out: Any) -> None:
        """The request states from the scheduler's output: finished and preempted requests leave, new ones
        come with their blocks, running ones take their new blocks and host computed-token counts."""
        r = self.runner
        r.finish_requests(out)
        r.add_requests(out)
        r.update_requests(out)
        r.block_tables.apply_staged_writes()

    def prepare(self, out: Any) -> tuple[Any, Any, tuple[torch.Tensor, ...], torch.Tensor]:
        """One step of ``execute_model`` up to the attention metadata: the request states updated from the
        scheduler's output, the batch dispatched to a CUDA graph (or eager), its inputs, block tables and
        slot mappings. Returns (batch descriptor, InputBatch, block tables, slot mappings)."""
        from vllm.v1.worker.gpu.dp_utils import dispatch_cg_and_sync_dp

        r = self.runner
        self.update(out)
        state, uniform = r.gather_batch_req_state(out, False)
        max_query_len = max(out.num_scheduled_tokens.values()) if state.decode_graph_eligible else None
        desc, _ = dispatch_cg_and_sync_dp(
            self.cudagraphs,
            len(out.num_scheduled_tokens),
            state.num_tokens,
            uniform,
            1,
            0,
            max_query_len=max_query_len,
            uniform_decode=uniform == r.decode_query_len,
        )
        batch = r.prepare_inputs(out, state, desc, 0)
        tables, slots = r.prepare_attn(batch)
        return desc, batch, tables, slots

    def postprocess(self, batch: Any, sampled: list[list[int]], rejected: list[int]) -> None:
        """After the forward: vLLM's ``postprocess_sampled`` with the step's draws (per request of the
        batch, in its order, the sampled tokens and the number of rejected drafts)."""
        n = batch.num_reqs
        width = max(1, max(len(s) for s in sampled))
        tokens = torch.zeros(n, width, dtype=torch.int64)
        for i, s in enumerate(sampled):
            tokens[i, : len(s)] = torch.tensor(s, dtype=torch.int64)
        num_sampled = torch.tensor([len(s) for s in sampled], dtype=torch.int32)
        num_rejected = torch.tensor(rejected, dtype=torch.int32)
        self.runner.postprocess_sampled(batch.idx_mapping, tokens, num_sampled, num_rejected, batch.query_start_loc)

    def num_computed_tokens(self) -> np.ndarray:
        """The device's computed-token counts by request slot."""
        return self.runner.req_states.num_computed_tokens.gpu.numpy()


class Drafter:
    """The attention batches of vLLM's autoregressive drafter (MTP), on the CPU.

    After the target's forward, vLLM's drafter (vllm/v1/worker/gpu/spec_decode/autoregressive/speculator.py,
    ``_run_multi_step_decode`` and ``_run_fused_multi_step_decode``) drafts one token per request per step in
    a uniform decode batch of its own: its own CUDA-graph dispatch (``uniform_token_count=1``), its own input
    buffers, prepared by vLLM's ``_prepare_decode_inputs_kernel`` (target_dependent_ar/speculator.py: each
    request's position and ``seq_lens`` one past its accepted tokens, ``query_start_loc`` and ``seq_lens``
    padded for the graph), slot mappings by the target's ``BlockTables`` (padding requests map to no slot),
    metadata from ``Speculator._build_uniform_attn_metadata`` over the drafter's attention groups, and at each
    later draft step the positions and ``seq_lens`` one further and ``_update_draft_decode_metadata``.

    Before its first decode step, the drafter's prefill, by vLLM's own code: ``prepare_prefill_inputs`` (its
    Triton kernel: the target's rows less the rejected drafts, each request's last accepted row) and
    ``TargetDependentARSpeculator._prefill``, which leaves each request's position at its last accepted token.
    What does not run there is the draft model's forward (``_run_model``, stubbed: zero hidden states) and its
    sampler (``sample_draft``, stubbed: token 0); neither reaches a position, a sequence length or a slot.
    The drafter's token inputs (the target's sampled and next prefill tokens) are zeros for the same reason.
    Between draft steps, vLLM's own ``update_draft_inputs`` moves positions and ``seq_lens`` on.
    """

    def __init__(self, runner: Runner, kv_cache_config: Any) -> None:
        from vllm.v1.worker.gpu.input_batch import InputBuffers
        from vllm.v1.worker.gpu.spec_decode.mtp.speculator import MTPSpeculator

        r = runner.runner
        d = object.__new__(MTPSpeculator)  # its methods over its own buffers; no draft model is loaded
        self.speculator = d
        d.block_tables = r.block_tables
        d.input_buffers = InputBuffers(max_num_reqs=r.max_num_reqs, max_num_tokens=r.max_num_tokens, device=CPU)
        d.dcp_size = 1
        d.vllm_config = r.vllm_config  # its max_model_len
        d.draft_max_seq_len = r.max_model_len
        d.max_num_reqs = r.max_num_reqs
        d.kv_cache_config = kv_cache_config
        d.arange_np = np.arange(r.max_num_reqs + 1, dtype=np.int32)
        d.draft_is_prefilling = torch.zeros(r.max_num_reqs, dtype=torch.bool)
        d.attn_groups = []
        self.idx_mapping = torch.full((r.max_num_reqs,), -1, dtype=torch.int64)
        self.sample_src_positions = torch.zeros(r.max_num_reqs, dtype=torch.int64)
        self.draft_tokens = torch.zeros(r.max_num_reqs, 1, dtype=torch.int64)
        # What the drafter's prefill (prepare_prefill_inputs, _prefill) reads and writes besides the buffers.
        d.idx_mapping = self.idx_mapping
        d.sample_src_positions = self.sample_src_positions
        d.draft_tokens = self.draft_tokens
        d.last_token_indices = torch.zeros(r.max_num_reqs, dtype=torch.int64)
        d.current_draft_step = torch.tensor(0, dtype=torch.int64)
        d.hidden_states = torch.zeros(r.max_num_tokens, 1)
        d.pcp_manager = None
        d.temperature = d.seeds = d.draft_logits = None
        d._run_model = self._draft_forward
        d.sample_draft = lambda hidden, *args: torch.zeros(hidden.shape[0], dtype=torch.int64)
        self.last_sampled = torch.zeros(r.max_num_reqs, dtype=torch.int64)
        self.next_prefill_tokens = torch.zeros(r.max_num_reqs, dtype=torch.int32)
        self.runner = runner
        # Its own decode graphs, of one token per request (vLLM's drafter keeps a manager of its own).
        self.cudagraphs = cudagraph_manager(r.vllm_config, r.vllm_config.compilation_config.cudagraph_mode, 1)

    @staticmethod
    def _draft_forward(num_tokens: int, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft model's forward, stubbed: its hidden states (zeros) for ``num_tokens`` rows."""
        hidden = torch.zeros(num_tokens, 1)
        return hidden, hidden

    def prefill(self, batch: Any, num_sampled: list[int], rejected: list[int]) -> None:
        """The drafter's prefill after the target's ``batch`` (per request: its sampled tokens, 0 for a
        partial prefill, and its rejected drafts), by vLLM's ``prepare_prefill_inputs`` and ``_prefill``:
        each request's position left at its last accepted token in the drafter's buffers."""
        from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import prepare_prefill_inputs

        d, n = self.speculator, batch.num_reqs
        self.idx_mapping[:n].copy_(batch.idx_mapping)
        prepare_prefill_inputs(
            d.last_token_indices,
            d.current_draft_step,
            d.input_buffers,
            batch,
            torch.tensor(num_sampled, dtype=torch.int32),
            torch.tensor(rejected, dtype=torch.int32),
            self.last_sampled,
            self.next_prefill_tokens,
            d.max_num_reqs,
        )
        type(d)._prefill(d, n, batch.num_tokens_after_padding, None, None, None)

    def first_step(self, batch: Any, num_sampled: list[int], rejected: list[int]) -> tuple[Any, torch.Tensor]:
        """The drafter's prefill (``prefill``) and first decode step after the target's ``batch``: the step's
        batch descriptor and slot mappings, its inputs in the drafter's buffers."""
        from vllm.v1.worker.gpu.dp_utils import dispatch_cg_and_sync_dp
        from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import _prepare_decode_inputs_kernel

        d, n = self.speculator, batch.num_reqs
        desc, _ = dispatch_cg_and_sync_dp(self.cudagraphs, n, n, 1, 1, 0)
        num_rejected = torch.tensor(rejected, dtype=torch.int32)
        self.prefill(batch, num_sampled, rejected)
        _prepare_decode_inputs_kernel[(n + 1,)](
            self.draft_tokens[:n, 0],
            self.draft_tokens.stride(0),
            batch.seq_lens,
            num_rejected,
            d.input_buffers.input_ids,
            d.input_buffers.positions,
            self.sample_src_positions,
            d.input_buffers.query_start_loc,
            d.input_buffers.seq_lens,
            d.max_model_len,
            d.max_num_reqs,
            BLOCK_SIZE=1024,
            ADVANCE_DRAFT_POSITIONS=True,
        )
        # idx_mapping == -1 marks a row the drafter must not act on (graph padding: no slot).
        self.idx_mapping[:n].copy_(batch.idx_mapping)
        self.idx_mapping[n:].fill_(-1)
        return desc, self.slots(desc, n)

    def slots(self, desc: Any, n: int) -> torch.Tensor:
        d = self.speculator
        return d.block_tables.compute_slot_mappings(
            self.idx_mapping[:n],
            d.input_buffers.query_start_loc[: n + 1],
            d.input_buffers.positions[:n],
            desc.num_tokens,
        )

    def build(self, desc: Any, n: int, seq_lens_cpu_upper_bound: torch.Tensor, attn_groups: Any) -> dict[str, Any]:
        """``_build_uniform_attn_metadata`` for draft step 1 over ``attn_groups``."""
        d = self.speculator
        d.attn_groups = attn_groups
        return d._build_uniform_attn_metadata(
            batch_desc=desc, num_reqs=n, num_query_per_req=1, seq_lens_cpu_upper_bound=seq_lens_cpu_upper_bound, step=1
        )

    def advance(self, desc: Any, n: int, step: int, num_steps: int) -> torch.Tensor:
        """After draft step ``step`` of ``num_steps``: vLLM's ``update_draft_inputs`` (positions and
        ``seq_lens`` one further, clamped at ``max_model_len``; the draft model's tokens and hidden states it
        also moves are zeros here), then the slot mappings anew."""
        from vllm.v1.worker.gpu.spec_decode.target_dependent_ar import speculator

        d = self.speculator
        max_model_len: Any = d.max_model_len
        if "max_model_len_ptr" in speculator._update_draft_inputs_kernel.arg_names:  # vLLM 0.34: a device scalar
            max_model_len = torch.tensor(max_model_len, dtype=torch.int32)
        hidden = torch.zeros(n, 1)
        speculator.update_draft_inputs(
            self.draft_tokens[:n, 0],
            torch.tensor([step], dtype=torch.int32),
            hidden,
            torch.zeros(n, num_steps, dtype=torch.int64),
            torch.zeros_like(hidden),
            d.input_buffers,
            self.sample_src_positions[:n],
            n,
            max_model_len,
            num_steps,
        )
        return self.slots(desc, n)

    def update(self, metadata: dict[str, Any], n: int, attn_groups: Any) -> None:
        """``_update_draft_decode_metadata`` over ``attn_groups``."""
        d = self.speculator
        d.attn_groups = attn_groups
        d._update_draft_decode_metadata(metadata, n)
