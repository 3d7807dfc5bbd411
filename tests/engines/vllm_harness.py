"""Real vLLM 0.33 / 0.34 objects for the engine tests: a VllmConfig per model variant, the SWA KV-cache spec,
CommonAttentionMetadata from swa_hal's random batches, and field-by-field comparison of metadata.

Imported only after conftest.py set TRITON_INTERPRET=1, CUDA_VISIBLE_DEVICES="" and
VLLM_TARGET_DEVICE=cpu (vLLM's CPU platform; its Triton kernels run in the interpreter).
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from swa_hal import AttentionBatch, SWAConfig
from swa_hal.integrations import vllm_shadow
from swa_hal.testing.batches import random_batch

# What the parity tests covered: batches by kind, with replay bounds, with image spans, draft updates.
COUNTS: Counter[str] = Counter()


def vllm_series() -> tuple[int, int]:
    """The installed vLLM's (major, minor): the tests state each release's own behaviour where they differ."""
    from importlib.metadata import version

    from packaging.version import Version

    major, minor = Version(version("vllm")).release[:2]
    return major, minor


SERIES = vllm_series()
V034 = SERIES >= (0, 34)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One model + engine setup: what a VllmConfig is made from."""

    name: str
    window: int
    block_size: int
    version: str = "deepseek_v4"  # or "deepseek_v41"
    compress_ratios: tuple[int, ...] = (0, 4, 128, 4)
    spec_tokens: int = 0
    dspark: bool = False
    max_image_tokens: int = 0
    max_num_seqs: int = 16
    max_model_len: int = 1024


VARIANTS = {
    v.name: v
    for v in (
        Variant("v4_w8b4", window=8, block_size=4),
        Variant("v4_mtp2_w6b8", window=6, block_size=8, spec_tokens=2),
        Variant("v4_dspark3_w5b4", window=5, block_size=4, spec_tokens=3, dspark=True),
        Variant("v4_vision_w6b4", window=6, block_size=4, max_image_tokens=5, spec_tokens=1),
        Variant("v4_vision_w4b2", window=4, block_size=2, max_image_tokens=9),
        Variant("v41_w8b4", window=8, block_size=4, version="deepseek_v41", compress_ratios=(0, 1, 2, 1)),
        Variant(
            "v41_mtp1_w7b16", window=7, block_size=16, version="deepseek_v41", compress_ratios=(0, 2), spec_tokens=1
        ),
    )
}


class SpecStub:
    """The speculative-config fields the SWA builders read (a real SpeculativeConfig needs a draft
    model on disk); assigned onto a real VllmConfig. ``method`` is any of vLLM's method names;
    ``max_num_new_slots_for_drafting`` (vLLM 0.34) comes from vLLM's own speculator config class for it."""

    def __init__(self, k: int, dspark: bool, method: str | None = None, parallel_drafting: bool = False):
        self.num_speculative_tokens = k
        self.method = method or ("dspark" if dspark else "mtp")
        self.custom_method = None
        self.parallel_drafting = parallel_drafting
        self.enable_adaptive_verification = False
        self._dspark = dspark

    def use_dspark(self) -> bool:
        return self._dspark

    @property
    def max_num_new_slots_for_drafting(self) -> int:
        from vllm.v1.worker.gpu.spec_decode.speculator_config import get_method_config_class

        return get_method_config_class(self)(self).max_num_new_slots_for_drafting


def make_vllm_config(variant: Variant, tmp: Path) -> Any:
    from vllm.config import ModelConfig, SchedulerConfig, VllmConfig

    hf = {
        "model_type": "deepseek_v4",
        "architectures": ["DeepseekV4ForCausalLM"],
        "sliding_window": variant.window,
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "head_dim": 512,
        "max_position_embeddings": 4096,
        "vocab_size": 1000,
    }
    if variant.version == "deepseek_v4":
        hf["compress_ratios"] = list(variant.compress_ratios)
    else:
        hf["compress_ratios"] = [0, 0, 0, 0]  # transformers' V4 config only knows 0/4/128; set below
    folder = tmp / variant.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf))
    model = ModelConfig(
        model=str(folder), tokenizer=str(folder), skip_tokenizer_init=True, max_model_len=variant.max_model_len
    )
    cfg = VllmConfig(
        model_config=model,
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=256,
            max_num_seqs=variant.max_num_seqs,
            max_model_len=variant.max_model_len,
            is_encoder_decoder=False,
        ),
    )
    if variant.version == "deepseek_v41":
        # V4.1 checkpoints carry compress_ratios (0/1/2) directly; the V4.1 builders read that attribute.
        model.hf_config.compress_ratios = list(variant.compress_ratios)
    if variant.max_image_tokens:
        # The vision variant's text config (set after loading: a text-only architecture is what
        # ModelConfig can resolve without the vision tower's weights).
        model.hf_config.vision_n_layers = 2
        model.hf_config.vision_max_n_token = variant.max_image_tokens
    if variant.spec_tokens:
        object.__setattr__(cfg, "speculative_config", SpecStub(variant.spec_tokens, variant.dspark))
    return cfg


def make_kv_spec(variant: Variant) -> Any:
    from vllm.v1.kv_cache_interface import SlidingWindowMLASpec

    return SlidingWindowMLASpec(
        block_size=variant.block_size,
        num_kv_heads=1,
        head_size=512,
        dtype=torch.bfloat16,
        # vLLM's SWA cache layer declares "deepseek_v4" for both versions (DeepseekV4SWACache).
        sliding_window=variant.window,
        model_version="deepseek_v4",
    )


def swa_config_for(variant: Variant, vllm_config: Any) -> SWAConfig:
    """The swa_hal config of the same setup (to draw random batches within its limits)."""
    return SWAConfig(
        window_size=variant.window,
        block_size=variant.block_size,
        compress_ratios=variant.compress_ratios if variant.version == "deepseek_v4" else variant.compress_ratios,
        max_model_len=variant.max_model_len,
        max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
        max_num_seqs=variant.max_num_seqs,
        num_speculative_tokens=variant.spec_tokens,
        speculative_method=("dspark" if variant.dspark else "mtp") if variant.spec_tokens else None,
        model_version=variant.version,
        max_image_tokens=variant.max_image_tokens,
    )


def common_metadata(
    batch: AttentionBatch,
    *,
    num_actual_tokens: int | None = None,
    image_ranges: dict[int, list[tuple[int, int]]] | None = None,
    **extra: Any,
) -> Any:
    """vLLM's CommonAttentionMetadata over the batch's own tensors (no copies); ``extra`` sets further
    fields (``positions``, ``is_prefilling``, ``slot_mapping``, ...)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    num_reqs = batch.query_start_loc_cpu.shape[0] - 1
    seq_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens.cpu()
    fields: dict[str, Any] = dict(
        query_start_loc=batch.query_start_loc,
        query_start_loc_cpu=batch.query_start_loc_cpu,
        seq_lens=batch.seq_lens,
        seq_lens_cpu_upper_bound=seq_cpu,
        num_reqs=num_reqs,
        num_actual_tokens=batch.num_tokens if num_actual_tokens is None else num_actual_tokens,
        max_query_len=batch.max_query_len,
        max_seq_len=int(seq_cpu.max()) if num_reqs else 0,
        block_table_tensor=batch.block_table,
        slot_mapping=batch.slot_mapping,
        causal=batch.causal,
        mm_req_doc_ranges=image_ranges,
    )
    fields.update(extra)
    return CommonAttentionMetadata(**fields)


def draw(cfg: SWAConfig, rng: random.Random, kind: str, **kw: Any) -> tuple[AttentionBatch, dict | None]:
    """A random batch of ``kind`` plus its image ranges in vLLM's ``mm_req_doc_ranges`` form."""
    limits: dict[str, Any] = dict(max_tokens=64, max_reqs=cfg.max_num_seqs, max_context=400)
    batch = random_batch(cfg, rng, kind, **{**limits, **kw})
    ranges = None
    spans = batch.image_spans
    if spans is not None:
        indptr, starts, ends = spans.indptr.tolist(), spans.starts.tolist(), spans.ends.tolist()
        ranges = {
            r: list(zip(starts[indptr[r] : indptr[r + 1]], ends[indptr[r] : indptr[r + 1]]))
            for r in range(len(indptr) - 1)
            if indptr[r + 1] > indptr[r]
        }
        # vLLM lists every image of a request, the ones earlier chunks prefilled and the ones still to
        # come, not only those over this step's new tokens.
        qsl, seqs = batch.query_start_loc_cpu.tolist(), batch.seq_lens_cpu.tolist()
        m = cfg.max_image_tokens
        for r in range(len(qsl) - 1):
            first = seqs[r] - (qsl[r + 1] - qsl[r])
            if rng.random() < 0.5 and first >= 2:
                a = rng.randint(0, first - 2)
                ranges.setdefault(r, []).insert(0, (a, min(first - 1, a + rng.randint(0, m - 1))))
            if rng.random() < 0.3:
                a = seqs[r] + rng.randint(0, 5)
                ranges.setdefault(r, []).append((a, a + rng.randint(0, m - 1)))
        COUNTS["whole_prompt_image_ranges"] += 1
    return batch, ranges


# -- prefill context parallelism ----------------------------------------------------------------


@dataclasses.dataclass
class PCPRank:
    """One PCP rank's view of a step, as vLLM's model runner hands it to the SWA builders.

    ``batch``: the rank-local batch with the rank's own token rows (the rank-th of P equal parts of
    ``gathered_slots``), what swa_hal builds from; ``cm_kwargs``: the rank's further CommonAttentionMetadata
    fields (with ``num_actual_tokens``), whose ``slot_mapping`` is the whole gathered one (vLLM's V4.1
    builder chunks it itself)."""

    rank: int
    batch: AttentionBatch
    gathered_slots: torch.Tensor
    positions: torch.Tensor
    num_actual_tokens: int
    cm_kwargs: dict[str, Any]


def pcp_partition(
    batch: AttentionBatch,
    pcp: int,
    *,
    decode_threshold: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    shard_decode_requests: bool = True,
    dcp: int = 1,
) -> list[PCPRank]:
    """The global ``batch`` cut into ``pcp`` rank-local batches by vLLM's own ``PCPManager.partition_batch``
    (DualChunkSwap: each prefill in 2P chunks, rank r holding chunks r and 2P-1-r; decodes, and with DCP
    short prefills, on one owner or replicated), its gathered slot mapping
    (``_convert_to_gathered_slot_mappings``: rank-major, P equal parts, -1 where the rank does not write)
    and each rank's block table rows and replay bounds as vLLM's runner and V4.1 model state make them.

    The global batch's requests before the first query longer than ``decode_threshold`` are its decodes
    (not prefilling), the rest its prefills (prefilling to their seq_len); its slot mapping's scheduled
    rows are the global slot mapping. PCP=1's padding rows do not exist here: vLLM pads each rank itself.
    """
    import numpy as np
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu.input_batch import InputBatch
    from vllm.v1.worker.gpu.pcp_manager import PCPManager

    qsl = batch.query_start_loc_cpu.to(torch.int64)
    num_reqs = qsl.shape[0] - 1
    num_tokens = int(qsl[-1])
    seq_lens = (batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens).cpu().to(torch.int64)
    qlens = (qsl[1:] - qsl[:-1]).numpy().astype(np.int32)
    computed = (seq_lens.numpy() - qlens).astype(np.int32)
    long = np.flatnonzero(qlens > decode_threshold)
    first_prefill = int(long[0]) if long.size else num_reqs
    is_prefilling = np.arange(num_reqs) >= first_prefill
    prefill_len = np.where(is_prefilling, seq_lens.numpy(), computed).astype(np.int32)
    req = torch.repeat_interleave(torch.arange(num_reqs), qsl[1:] - qsl[:-1])
    positions = (torch.arange(num_tokens) - qsl[req] + torch.from_numpy(computed).to(torch.int64)[req]).to(torch.int64)
    idx_np = np.arange(num_reqs, dtype=np.intp)
    global_batch = InputBatch(
        req_ids=[f"r{i}" for i in range(num_reqs)],
        num_reqs=num_reqs,
        num_reqs_after_padding=num_reqs,
        idx_mapping=torch.from_numpy(idx_np.astype(np.int64)),
        idx_mapping_np=idx_np,
        expanded_idx_mapping=torch.from_numpy(idx_np.astype(np.int64)),
        expanded_local_pos=torch.zeros(num_reqs, dtype=torch.int32),
        num_scheduled_tokens=qlens,
        num_tokens=num_tokens,
        num_tokens_after_padding=num_tokens,
        num_draft_tokens=0,
        num_draft_tokens_per_req=None,
        query_start_loc=qsl.to(torch.int32),
        query_start_loc_np=qsl.numpy().astype(np.int32),
        seq_lens=seq_lens.to(torch.int32),
        seq_lens_cpu_upper_bound=seq_lens.to(torch.int32),
        dcp_local_seq_lens=None,
        num_computed_tokens_np=computed,
        prefill_len_np=prefill_len,
        num_computed_prefill_tokens_np=np.minimum(computed, prefill_len),
        is_prefilling_np=is_prefilling,
        has_prefill=bool(is_prefilling.any()),
        decode_graph_eligible=not bool(is_prefilling.any()),
        input_ids=torch.zeros(num_tokens, dtype=torch.int32),
        positions=positions,
        is_padding=torch.zeros(num_tokens, dtype=torch.bool),
        logits_indices=qsl[1:].to(torch.int32) - 1,
        cu_num_logits=torch.arange(num_reqs + 1, dtype=torch.int32),
        cu_num_logits_np=np.arange(num_reqs + 1, dtype=np.int32),
        has_structured_output_reqs=False,
        prompt_lens=None,
    )
    desc = type("Desc", (), {"cg_mode": CUDAGraphMode.NONE, "num_tokens": 0, "num_reqs": 0})()
    global_slots = batch.slot_mapping[:num_tokens].to(torch.int64).view(1, -1)
    replay = batch.replay_start
    ranks = []
    for rank in range(pcp):
        mgr = PCPManager(
            pcp,
            rank,
            torch.device("cpu"),
            shard_decode_requests,
            max_num_reqs=max_num_seqs,
            max_num_tokens=max_num_batched_tokens,
            dcp_world_size=dcp,
        )
        local = mgr.partition_batch(global_batch, desc)
        gathered = mgr._convert_to_gathered_slot_mappings(global_slots)[0].clone()
        n = local.num_reqs
        idx = torch.from_numpy(local.idx_mapping_np[:n].astype(np.int64))
        block_table = batch.block_table.index_select(0, idx)
        # vLLM's V4.1 model state: a rank's request segments carry their request's bound when prefilling.
        local_replay = None
        if replay is not None:
            local_replay = torch.where(torch.from_numpy(local.is_prefilling_np[:n].copy()), replay.cpu()[idx], 0).to(
                torch.int32
            )
        own = gathered.chunk(pcp)[rank]
        seq_cpu = local.seq_lens_cpu_upper_bound[:n]
        rank_batch = AttentionBatch(
            seq_lens=local.seq_lens[:n],
            query_start_loc=local.query_start_loc[: n + 1],
            query_start_loc_cpu=torch.from_numpy(local.query_start_loc_np[: n + 1].copy()),
            seq_lens_cpu=seq_cpu,
            block_table=block_table,
            slot_mapping=own,
            max_query_len=int(local.num_scheduled_tokens.max()),
            num_tokens=own.shape[0],
            causal=batch.causal,
            replay_start=local_replay,
        )
        cm_kwargs = dict(
            slot_mapping=gathered,
            positions=local.positions,
            is_prefilling=torch.from_numpy(local.is_prefilling_np[:n].copy()),
        )
        ranks.append(PCPRank(rank, rank_batch, gathered, local.positions, local.num_tokens, cm_kwargs))
    assert all(r.gathered_slots.shape == ranks[0].gathered_slots.shape for r in ranks)
    assert all(torch.equal(r.gathered_slots, ranks[0].gathered_slots) for r in ranks)
    return ranks


class FakePCPGroup:
    """vLLM's PCP group coordinator as the V4.1 builder uses it (``rank_in_group``, ``world_size``,
    ``all_gather(t, dim=0)``), for one rank of a one-process test: the all-gather hands back every
    rank's ``positions`` in rank order, after checking it was given this rank's own."""

    def __init__(self, rank: int, positions: list[torch.Tensor]):
        self.rank_in_group = rank
        self.world_size = len(positions)
        self.positions = positions
        self.gathers = 0

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        assert dim == 0 and torch.equal(t, self.positions[self.rank_in_group])
        self.gathers += 1
        return torch.cat(self.positions, dim=0)


def import_rocm_modules() -> tuple[Any, Any]:
    """vLLM's ROCm AITER modules (V4, V4.1). ``vllm.platforms.rocm`` reads the GPU's architecture when
    imported (amdsmi, then torch.cuda); on this CPU-only torch it is told gfx942 for that one call.
    Nothing else of the ROCm platform is used: the builders' code is plain Triton and torch."""
    import importlib
    import sys
    import types
    from unittest import mock

    if "vllm.platforms.rocm" not in sys.modules:
        props = types.SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-")
        with mock.patch.object(torch.cuda, "get_device_properties", lambda *a, **k: props):
            importlib.import_module("vllm.platforms.rocm")
    return (
        importlib.import_module("vllm.models.deepseek_v4.amd.rocm"),
        importlib.import_module("vllm.models.deepseek_v41.amd.rocm"),
    )


# -- comparison ---------------------------------------------------------------------------------


def _t(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def same_memory(a: Any, b: Any) -> bool:
    """The same tensor, or two views of the same memory (vLLM's V4.1 builder takes its PCP slot chunk
    with a fresh view at each build)."""
    if a is b:
        return True
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


# The flag each release's ROCm AITER SWA builder reads before it builds the aiter prefill's ragged rows:
# vLLM 0.34 renamed V4's to ``_use_aiter_sparse_mla_prefill`` (set only at <= 64 heads per rank); V4.1's
# and 0.33's are ``_use_aiter_sparse_mla``. On this CPU both are off; the tests turn them on.
ROCM_PREFILL_GATES = ("_use_aiter_sparse_mla_prefill", "_use_aiter_sparse_mla")


def is_rocm_builder(builder: Any) -> bool:
    return any("ROCMAiter" in c.__name__ for c in type(builder).__mro__)


def force_rocm_ragged_prefill(*builders: Any) -> None:
    """Turn on the ragged prefill rows of ROCm AITER builders (other builders are left alone). A ROCm
    builder with none of the known flags fails here: a renamed gate must not silently untest the rows."""
    for builder in builders:
        if not is_rocm_builder(builder):
            continue
        gate = next((g for g in ROCM_PREFILL_GATES if hasattr(builder, g)), None)
        assert gate is not None, f"{type(builder).__name__} has none of {ROCM_PREFILL_GATES}"
        setattr(builder, gate, True)


def snapshot(metadata: Any) -> Any:
    """A copy of a builder's metadata whose tensors are its own (a builder's next build rewrites the fixed
    buffers its metadata views)."""
    import copy

    out = copy.copy(metadata)
    for name, value in vars(metadata).items():
        if isinstance(value, torch.Tensor):
            setattr(out, name, value.clone())
    return out


def compare(
    native: Any,
    ours: Any,
    batch: AttentionBatch,
    *,
    chunk_ratios: tuple[int, ...] = (1, 4, 128),
    has_compressed: tuple[bool | None, ...] = (None,),
    fresh: tuple[str, ...] = (),
) -> list[str]:
    """Every field vLLM's builder fills, compared where it is defined: rows and lens of valid tokens,
    the split, token_to_req and is_valid of valid tokens, gather lens, replay bounds, image
    visibility on prefill rows, the tile-scheduler slots (same presence and type) and chunk plans.
    Returns the differences (empty: equal)."""
    diffs: list[str] = []

    def check(name: str, a: Any, b: Any) -> None:
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            if a is None or b is None:
                diffs.append(f"{name}: {a!r} vs {b!r}")
            elif tuple(a.shape) != tuple(b.shape) or not torch.equal(_t(a).cpu(), _t(b).cpu()):
                diffs.append(
                    f"{name}: shapes {tuple(a.shape)} vs {tuple(b.shape)}\n  native {a.tolist()}\n  swa_hal {b.tolist()}"
                )
        elif a != b:
            diffs.append(f"{name}: {a!r} vs {b!r}")

    # The split and static facts, and the step's own inputs: the lists the plugin's shadow mode compares too.
    for f in vllm_shadow.SCALAR_FIELDS:
        check(f, getattr(native, f), getattr(ours, f))
    for f in vllm_shadow.INPUT_FIELDS:
        if f in fresh:  # each build was handed a tensor of its own (vLLM's drafter makes one per build)
            check(f, getattr(native, f), getattr(ours, f))
        elif not same_memory(getattr(native, f), getattr(ours, f)):
            diffs.append(f"{f}: not the step's own tensor")
    ndt, npt = native.num_decode_tokens, native.num_prefill_tokens
    n = ndt + npt
    rows = batch.slot_mapping.shape[0]
    valid = batch.slot_mapping >= 0
    check("is_valid_token", native.is_valid_token[:rows], ours.is_valid_token[:rows])
    vn = valid[:n]
    check("token_to_req_indices[valid]", native.token_to_req_indices[:n][vn], ours.token_to_req_indices[:n][vn])
    for part, lo, hi in (("decode", 0, ndt), ("prefill", ndt, n)):
        idx_n, idx_o = getattr(native, f"{part}_swa_indices"), getattr(ours, f"{part}_swa_indices")
        len_n, len_o = getattr(native, f"{part}_swa_lens"), getattr(ours, f"{part}_swa_lens")
        if hi == lo:
            if part == "prefill":
                check("prefill_swa_indices is None", idx_n is None, idx_o is None)
            continue
        check(f"{part}_swa_indices.shape", tuple(idx_n.shape), tuple(idx_o.shape))
        m = valid[lo:hi]
        check(f"{part}_swa_lens[valid]", len_n[: hi - lo][m], len_o[: hi - lo][m])
        check(f"{part}_swa_lens[padding]", len_n[: hi - lo][~m], len_o[: hi - lo][~m])
        check(f"{part}_swa_indices[padding]", idx_n[: hi - lo][~m], idx_o[: hi - lo][~m])
        check(f"{part}_swa_indices[valid]", idx_n[: hi - lo][m], idx_o[: hi - lo][m])
    num_reqs = batch.query_start_loc_cpu.shape[0] - 1
    bounds = min(num_reqs, native.replay_start.shape[0])
    check("replay_start", native.replay_start[:bounds], ours.replay_start[:bounds])
    # A padded step's padding requests past vLLM's bounds have none: swa_hal's metadata holds one zero per
    # padding request there, where vLLM's keeps the shorter tensor (docs/semantics.md #bounded-replay).
    check(
        "replay_start[padding requests]",
        torch.zeros(num_reqs - bounds, dtype=torch.int32),
        ours.replay_start[bounds:num_reqs],
    )
    for f in ("prefill_seq_lens", "prefill_seq_lens_cpu", "prefill_gather_lens", "prefill_query_lens_cpu"):
        a, b = getattr(native, f), getattr(ours, f)
        if a is None or b is None:
            check(f + " is None", a is None, b is None)
        else:
            check(f, a[: native.num_prefills], b[: native.num_prefills])
    for f in ("prefill_left_visible", "prefill_right_visible"):
        a, b = getattr(native, f), getattr(ours, f)
        if a is None or b is None:
            check(f + " is None", a is None, b is None)
        else:
            m = valid[ndt:n]
            check(f, a[ndt:n][m], b[ndt:n][m])
    for kind in ("swaonly", "c4a", "c128a", "c1a", "c2a"):
        a, b = getattr(native, f"tile_sched_{kind}"), getattr(ours, f"tile_sched_{kind}")
        check(f"tile_sched_{kind}", type(a), type(b))
        if a is not None and a is b:
            diffs.append(f"tile_sched_{kind}: shared object")
    for f in ("flashinfer_decode_topk_lens", "flashinfer_decode_seq_lens"):
        a, b = getattr(native, f), getattr(ours, f)
        if a is None or b is None:
            check(f + " is None", a is None, b is None)
        else:
            m = valid[:ndt]
            check(f, a[:ndt][m], b[:ndt][m])
    if hasattr(native, "prefill_swa_ragged_indptr") and npt:  # a ROCm build with prefills: the forced rows
        check("prefill_swa_ragged_indptr built", native.prefill_swa_ragged_indptr is not None, True)
    for part, rows_ in (("decode", ndt), ("prefill", npt)):  # ROCm AITER's ragged rows
        indptr_n = getattr(native, f"{part}_swa_ragged_indptr", None)
        indptr_o = getattr(ours, f"{part}_swa_ragged_indptr", None)
        if indptr_n is None or indptr_o is None:
            check(f"{part}_swa_ragged_indptr is None", indptr_n is None, indptr_o is None)
            continue
        check(f"{part}_swa_ragged_indptr", indptr_n[: rows_ + 1], indptr_o[: rows_ + 1])
        nnz = int(indptr_n[rows_])
        check(
            f"{part}_swa_ragged_indices",
            getattr(native, f"{part}_swa_ragged_indices")[:nnz],
            getattr(ours, f"{part}_swa_ragged_indices")[:nnz],
        )
    check("flashinfer_sparse_index_cache", native.flashinfer_sparse_index_cache, ours.flashinfer_sparse_index_cache)
    for f in ("cache_slot_mapping", "cache_positions"):
        check(f + " is None", getattr(native, f) is None, getattr(ours, f) is None)
    for ratio in chunk_ratios:
        for hc in has_compressed:
            for chunk in (1, 2, 7):
                check(
                    f"chunk_plan({ratio},{chunk},{hc})",
                    native.get_prefill_chunk_plan(ratio, chunk, hc),
                    [tuple(c) for c in ours.get_prefill_chunk_plan(ratio, chunk, hc)],
                )
    return diffs


# -- model-runner steps (model runner V2's prepare_attn) ----------------------------------------


@dataclasses.dataclass
class StepLayout:
    """A step's KV-cache groups: ``num_kv_groups`` in all (vLLM's [G, T] slot-mapping rows), the SWA
    ones at ``swa`` (the others have no attention group here: vLLM's loop skips them, their rows stay)."""

    num_kv_groups: int
    swa: tuple[int, ...]


def random_layout(rng: random.Random, num_swa: int, form: str = "any") -> StepLayout:
    """``num_swa`` SWA groups: ``all`` the groups; ``even``: every other group; ``any``: among up to two
    other groups, anywhere (evenly spaced or not)."""
    if form == "all":
        return StepLayout(num_swa, tuple(range(num_swa)))
    if form == "even":
        start = rng.randint(0, 1)
        return StepLayout(start + 2 * num_swa - 1 + rng.randint(0, 1), tuple(range(start, start + 2 * num_swa, 2)))
    total = num_swa + rng.randint(0, 2)
    return StepLayout(total, tuple(sorted(rng.sample(range(total), num_swa))))


def attention_groups(builders: list[Any], layout: StepLayout, spec: Any, backend: Any = None) -> list[list[Any]]:
    """vLLM's attention groups for the layout: SWA group ``layout.swa[j]`` built by ``builders[j]``, of the
    attention ``backend`` class (whose ``get_builder_cls`` makes the builders of a copy of the group, as
    vLLM's ``AttentionGroup.create_metadata_builders`` does); None: the builder's class stands in for it."""
    from vllm.v1.worker.utils import AttentionGroup

    groups: list[list[Any]] = [[] for _ in range(layout.num_kv_groups)]
    for j, (i, b) in enumerate(zip(layout.swa, builders)):
        cls = backend if backend is not None else type(b)
        groups[i] = [AttentionGroup(cls, [f"model.layers.{j}.attn.swa_cache"], spec, i, metadata_builders=[b])]
    return groups


def token_positions(batch: AttentionBatch) -> torch.Tensor:
    """Each token row's position (padding rows: 0)."""
    qsl = batch.query_start_loc_cpu.tolist()
    seqs = (batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens).tolist()
    pos = torch.zeros(batch.slot_mapping.shape[0], dtype=torch.int64)
    for r in range(len(qsl) - 1):
        q = qsl[r + 1] - qsl[r]
        pos[qsl[r] : qsl[r + 1]] = torch.arange(seqs[r] - q, seqs[r])
    return pos


def step_inputs(
    batch: AttentionBatch, layout: StepLayout, block_size: int, rng: random.Random, *, extra_tokens: int = 0
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """vLLM's step inputs for the batch: a block table per KV-cache group (the first SWA group's is the
    batch's, every other one random pages, some wider) and the groups' slot mappings stacked in one
    [G, T + extra_tokens] buffer, of which the step gets the first T columns (as vLLM slices its
    buffer). Each group's slots follow its own table; a token without a slot has none in any group."""
    positions = token_positions(batch)
    qsl = batch.query_start_loc_cpu.tolist()
    t = batch.slot_mapping.shape[0]
    rows, width = batch.block_table.shape
    buffer = torch.full((layout.num_kv_groups, t + extra_tokens), -1, dtype=torch.int64)
    tables = []
    for i in range(layout.num_kv_groups):
        if i == layout.swa[0]:
            table = batch.block_table
        else:
            wide = width + rng.randint(0, 2)
            table = torch.tensor([[rng.randint(0, 999) for _ in range(wide)] for _ in range(rows)], dtype=torch.int32)
        tables.append(table)
        slots = buffer[i, :t]
        if i == layout.swa[0]:
            slots.copy_(batch.slot_mapping)
            continue
        for r in range(len(qsl) - 1):
            for tok in range(qsl[r], qsl[r + 1]):
                if batch.slot_mapping[tok] >= 0:
                    p = int(positions[tok])
                    slots[tok] = int(table[r, p // block_size]) * block_size + p % block_size
    return tuple(tables), buffer[:, :t]


def model_state(version: str, vllm_config: Any, *, window: int = 0, cacheable: tuple[int, ...] = ()) -> Any:
    """vLLM's model state of the model version, as far as ``prepare_attn`` reads it: V4's the default one,
    V4.1's its own (``DeepseekV41ModelState``: replay bounds from its per-request table, the replayed slots
    of the ``cacheable`` groups padded within ``window`` by its kernel, then the default build)."""
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    fields: dict[str, Any] = dict(
        model_config=vllm_config.model_config, supports_mm_inputs=False, encoder_cache=None, device=torch.device("cpu")
    )
    if version != "deepseek_v41":
        state = object.__new__(DefaultModelState)
    else:
        from vllm.models.deepseek_v41.nvidia.model_state import DeepseekV41ModelState

        state = object.__new__(DeepseekV41ModelState)
        seqs = vllm_config.scheduler_config.max_num_seqs
        fields.update(
            pcp_size=1,
            decoder_replay_layers=None,
            _replay=(window, torch.tensor(cacheable, dtype=torch.int32)),
            _replay_start_np=np.zeros(seqs, dtype=np.int32),
            _replay_start=torch.zeros(seqs, dtype=torch.int32),
        )

        def upload(values: Any, num_reqs: int) -> torch.Tensor:  # its staging pool is pinned CUDA memory
            out = state._replay_start[:num_reqs]
            out.copy_(torch.from_numpy(values))
            return out

        fields["_upload_replay_start"] = upload
    for name, value in fields.items():
        object.__setattr__(state, name, value)
    return state


def input_batch(batch: AttentionBatch, num_tokens: int, decode_threshold: int, positions: torch.Tensor) -> Any:
    """The fields of vLLM's InputBatch that ``prepare_attn`` reads, for the batch (requests after the first
    query longer than the decode threshold are prefilling)."""
    import types

    qsl_np = batch.query_start_loc_cpu.numpy().astype(np.int32)
    qlens = np.diff(qsl_np)
    long = np.flatnonzero(qlens > decode_threshold)
    num_reqs = len(qlens)
    first = int(long[0]) if long.size else num_reqs
    seq_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens
    return types.SimpleNamespace(
        req_ids=[f"r{i}" for i in range(num_reqs)],
        num_reqs=num_reqs,
        num_reqs_after_padding=num_reqs,
        num_tokens=num_tokens,
        num_tokens_after_padding=num_tokens,
        query_start_loc=batch.query_start_loc,
        query_start_loc_np=qsl_np,
        max_query_len=batch.max_query_len,
        num_scheduled_tokens=qlens,
        seq_lens=batch.seq_lens,
        seq_lens_cpu_upper_bound=seq_cpu,
        pcp=None,
        dcp_local_seq_lens=None,
        positions=positions,
        is_prefilling_np=np.arange(num_reqs) >= first,
        prompt_lens=None,
        idx_mapping_np=np.arange(num_reqs),
        fast_prefill=None,
    )


def kv_cache_config(layout: StepLayout) -> Any:
    """vLLM's KVCacheConfig as ``build_attn_metadata`` reads it (its groups, counted)."""
    import types

    return types.SimpleNamespace(kv_cache_groups=[None] * layout.num_kv_groups)


def prepare_attn(
    state: Any,
    ib: Any,
    block_tables: tuple[torch.Tensor, ...],
    slot_mappings: torch.Tensor,
    attn_groups: list[list[Any]],
    layout: StepLayout,
    replay_start: torch.Tensor | None,
    *,
    for_capture: bool = False,
    full: bool = False,
) -> dict[str, Any]:
    """vLLM's ``prepare_attn`` of the model state (the V4 one hands the builders ``replay_start`` as the V4.1
    one does; the V4.1 one makes its own from its table, filled here from ``replay_start``), eager or
    (``full``, ``for_capture``) a FULL-graph step."""
    from vllm.config import CUDAGraphMode
    from vllm.models.deepseek_v41.nvidia.model_state import DeepseekV41ModelState, ReplayAttnMetadata

    mode = CUDAGraphMode.FULL if for_capture or full else CUDAGraphMode.NONE
    extra: dict[str, Any] = {}
    if isinstance(state, DeepseekV41ModelState):
        state._replay_start_np[:] = 0
        if replay_start is not None:
            state._replay_start_np[: replay_start.shape[0]] = replay_start.numpy()
    elif replay_start is not None:
        extra["model_specific_attn_metadata"] = ReplayAttnMetadata(replay_start)
    return type(state).prepare_attn(
        state,
        ib,
        mode,
        block_tables,
        slot_mappings,
        attn_groups,
        kv_cache_config(layout),
        for_capture=for_capture,
        **extra,
    )


def moved_tokens(batch: AttentionBatch) -> Iterator[tuple[int, int, int]]:
    """What vLLM's drafter does between draft steps, in place: one more position per real request, whose
    tokens it then yields as (request, token, new position) for the caller to move their slots."""
    qsl = batch.query_start_loc_cpu.tolist()
    for r in range(len(qsl) - 1):
        q = qsl[r + 1] - qsl[r]
        if q == 0:
            continue
        batch.seq_lens[r] += 1
        seq = int(batch.seq_lens[r])
        for i in range(q):
            yield r, qsl[r] + i, seq - q + i


def advance_draft_step_groups(batch: AttentionBatch, tables: Any, slots: torch.Tensor, block_size: int) -> None:
    """A draft step (``moved_tokens``) for every group: each group's slots of the moved tokens through its
    own table (no slot stays none)."""
    for r, t, pos in moved_tokens(batch):
        for g in range(slots.shape[0]):
            if slots[g, t] >= 0:
                slots[g, t] = int(tables[g][r, pos // block_size]) * block_size + pos % block_size
