"""Prefill context parallelism over real ranks (docs/semantics.md #context-parallel-ranks).

``partition`` cuts one global step into the rank-local batches of ``C`` ranks; ``check_rank`` builds one
rank's batch and compares it with the reference over that batch (the rule of the section: the reference has
no PCP rule of its own). Plain torch on the host, so the same code drives a gloo test and an NCCL script.
"""

from __future__ import annotations

import dataclasses
import numbers

import torch

from ..batch import AttentionBatch
from ..config import SWAConfig
from ..errors import ConfigError


@dataclasses.dataclass(eq=False)
class RankBatch:
    """One rank's part of a step.

    ``batch``: the rank-local batch (its segments, decodes first; ``T`` rows, -1 where it does not write).
    ``positions`` int64 [T]: each row's position (0 on padding rows). ``segments``: (global request,
    first position, length) per rank request. ``gathered_slots`` int64 [C * T]: the step's gathered slot
    mapping, the same on every rank; part ``rank`` is ``batch.slot_mapping``.
    """

    rank: int
    batch: AttentionBatch
    positions: torch.Tensor
    segments: list[tuple[int, int, int]]
    gathered_slots: torch.Tensor


def rank_config(config: SWAConfig) -> SWAConfig:
    """A rank holds up to two segments of each request, so its builder takes twice the engine's requests."""
    return dataclasses.replace(config, max_num_seqs=2 * config.max_num_seqs)


def global_positions(batch: AttentionBatch) -> torch.Tensor:
    """int64 [qsl[R]]: each real row's position, ``S_r - q_r + i`` (the step's own, before any partition)."""
    qsl = batch.query_start_loc_cpu.to(torch.int64)
    seq = _host_seq_lens(batch)
    qlen = qsl[1:] - qsl[:-1]
    req = torch.repeat_interleave(torch.arange(qlen.shape[0]), qlen)
    return torch.arange(int(qsl[-1])) - qsl[req] + (seq - qlen)[req]


def partition(
    batch: AttentionBatch, num_ranks: int, *, decode_threshold: int, shard_decodes: bool = True
) -> list[RankBatch]:
    """The step ``batch`` cut over ``num_ranks`` ranks as vLLM's PCP partitions it.

    The requests before the first query longer than ``decode_threshold`` are decodes, the rest prefills.
    A prefill is cut into ``2C`` chunks of ``ceil(q / 2C)`` tokens and rank ``k`` holds chunks ``k`` and
    ``2C-1-k`` (an empty chunk is no segment). A decode is one segment: with ``shard_decodes`` on rank
    ``n % C`` for the ``n``-th non-empty decode, else on every rank, written by rank 0 only. Requests with
    no tokens (and padding rows past ``qsl[R]``) belong to no rank.

    ``num_ranks`` and ``decode_threshold`` are positive integers, else a ConfigError naming them: 0 ranks
    would divide by zero, -1 would give no rank at all, and ``True`` would pass for one rank.
    """
    for name, value in (("num_ranks", num_ranks), ("decode_threshold", decode_threshold)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ConfigError(name, f"must be a positive integer, got {value!r}")
    c = int(num_ranks)
    qsl = batch.query_start_loc_cpu.to(torch.int64).tolist()
    seq = _host_seq_lens(batch).tolist()
    num_reqs = len(qsl) - 1
    qlens = [qsl[r + 1] - qsl[r] for r in range(num_reqs)]
    first_prefill = next((r for r in range(num_reqs) if qlens[r] > decode_threshold), num_reqs)
    slots = batch.slot_mapping.cpu().to(torch.int64)
    # Per rank: (request, offset in the request's query, length, writes) for decodes, then prefills.
    decodes: list[list[tuple[int, int, int, bool]]] = [[] for _ in range(c)]
    prefills: list[list[tuple[int, int, int, bool]]] = [[] for _ in range(c)]
    owned = 0
    for r in range(num_reqs):
        q = qlens[r]
        if q == 0:
            continue
        if r < first_prefill:
            if shard_decodes:
                decodes[owned % c].append((r, 0, q, True))
            else:
                for k in range(c):
                    decodes[k].append((r, 0, q, k == 0))
            owned += 1
            continue
        size = -(-q // (2 * c))
        for k in range(c):
            for chunk in (k, 2 * c - 1 - k):
                start = chunk * size
                if start < q:
                    prefills[k].append((r, start, min(size, q - start), True))
    per_rank = [decodes[k] + prefills[k] for k in range(c)]
    t = max(1, max(sum(s[2] for s in segs) for segs in per_rank))
    gathered = torch.full((c * t,), -1, dtype=torch.int64)
    out = []
    for k, segs in enumerate(per_rank):
        own = gathered[k * t : (k + 1) * t]
        positions = torch.zeros(t, dtype=torch.int64)
        rows = [0]
        seg_info = []
        for r, start, n, writes in segs:
            lo = rows[-1]
            first = seq[r] - qlens[r] + start
            positions[lo : lo + n] = torch.arange(first, first + n)
            if writes:
                own[lo : lo + n] = slots[qsl[r] + start : qsl[r] + start + n]
            rows.append(lo + n)
            seg_info.append((r, first, n))
        if not segs:  # one empty request: rank-local batches are never without requests
            seg_info.append((0, seq[0] - qlens[0], 0))
            rows.append(0)
        req = torch.tensor([s[0] for s in seg_info], dtype=torch.int64)
        seg_lens = torch.tensor([s[1] + s[2] for s in seg_info], dtype=torch.int32)
        replay = None
        if batch.replay_start is not None:
            # vLLM's V4.1 model state: a segment keeps its request's bound while the request prefills.
            prefilling = (req >= first_prefill).to(torch.int32)
            replay = (batch.replay_start.cpu()[req] * prefilling).to(torch.int32)
        dev = batch.device
        qsl_t = torch.tensor(rows, dtype=torch.int32)
        rank_batch = AttentionBatch(
            seq_lens=seg_lens.to(dev),
            query_start_loc=qsl_t.to(dev),
            query_start_loc_cpu=qsl_t,
            seq_lens_cpu=seg_lens.clone(),
            block_table=batch.block_table.index_select(0, req.to(batch.block_table.device)),
            slot_mapping=own.clone().to(dev),
            max_query_len=max(s[2] for s in seg_info),
            num_tokens=t,
            causal=batch.causal,
            replay_start=None if replay is None else replay.to(dev),
        )
        out.append(RankBatch(k, rank_batch, positions, seg_info, gathered))
    return out


def rank_positions(batch: AttentionBatch) -> torch.Tensor:
    """int64 [T]: a rank batch's row positions from its own qsl and S_r (0 on padding rows)."""
    pos = global_positions(batch)
    return torch.cat([pos, torch.zeros(batch.num_tokens - pos.shape[0], dtype=torch.int64)])


def check_rank(
    config: SWAConfig, rank: RankBatch, *, backend: str = "torch", device: str = "cpu", platform: str | None = None
) -> list[str]:
    """Build ``rank``'s batch with a builder of ``backend`` under the rank config and return every
    difference from the reference over the same batch, plus any disagreement between the partition's
    positions and those the rank batch itself implies (empty: the rank is right). ``platform``: an
    assumed platform (``PlatformInfo.from_assume``), to run a Triton backend in the interpreter on the host."""
    from ..builder import SWAMetadataBuilder
    from ..compare import compare_with_reference
    from ..platform import PlatformInfo

    cfg = rank_config(config)
    batch = rank.batch if torch.device(device) == rank.batch.device else rank.batch.to(device)
    assumed = PlatformInfo.from_assume(platform) if platform else None
    md = SWAMetadataBuilder(cfg, device=device, backend=backend, platform=assumed).build(batch)
    diffs = [f"rank {rank.rank} ({backend}): {d}" for d in compare_with_reference(cfg, batch, md)]
    if not torch.equal(rank_positions(rank.batch), rank.positions):
        diffs.append(f"rank {rank.rank}: positions {rank.positions.tolist()} disagree with its batch")
    return diffs


def _host_seq_lens(batch: AttentionBatch) -> torch.Tensor:
    seq = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens
    return seq.cpu().to(torch.int64)


@dataclasses.dataclass(frozen=True)
class RankJob:
    """What one process of a PCP test runs: ``steps`` random global steps of ``config`` drawn from
    ``random.Random(seed)`` (the same on every rank), each ``kinds[i % len(kinds)]``, built with each of
    ``backends`` (with its assumed platform from ``platforms``, if any). ``dist_backend``/``init_method``
    set up the process group; ``device`` is a rank's device ("cuda" means ``cuda:<rank>``)."""

    config: SWAConfig
    seed: str
    kinds: tuple[str, ...]
    steps: int
    backends: tuple[str, ...]
    shard_decodes: bool
    dist_backend: str
    init_method: str
    device: str = "cpu"
    max_tokens: int | None = None
    platforms: tuple[tuple[str, str], ...] = ()


def draw_steps(job: RankJob) -> list[AttentionBatch]:
    """The job's global steps (every rank, and the parent that checks them, draws the same)."""
    import random

    from .batches import random_batch

    rng = random.Random(job.seed)
    return [
        random_batch(job.config, rng, job.kinds[i % len(job.kinds)], max_tokens=job.max_tokens, replay=0.5)
        for i in range(job.steps)
    ]


def run_rank(rank: int, world: int, job: RankJob, out_path: str) -> None:
    """One rank of a PCP process group: per step, partition the global step, check its own batch against
    the reference with every backend, and all-gather its positions and its slot-mapping part over the real
    group. Writes ``{"diffs", "steps": [(held rows, gathered positions, gathered slots)]}`` or
    ``{"error": traceback}`` to ``out_path`` (``torch.save``), for the parent to assert on."""
    import traceback

    import torch.distributed as dist

    result: dict[str, object]
    try:
        torch.set_num_threads(1)
        device = f"cuda:{rank}" if job.device == "cuda" else job.device
        if job.device == "cuda":
            torch.cuda.set_device(rank)
        dist.init_process_group(job.dist_backend, init_method=job.init_method, rank=rank, world_size=world)
        diffs: list[str] = []
        steps = []
        for i, batch in enumerate(draw_steps(job)):
            mine = partition(
                batch, world, decode_threshold=job.config.decode_threshold, shard_decodes=job.shard_decodes
            )
            mine_rank = mine[rank]
            for backend in job.backends:
                diffs += [
                    f"step {i}: {d}"
                    for d in check_rank(
                        job.config, mine_rank, backend=backend, device=device, platform=dict(job.platforms).get(backend)
                    )
                ]
            # The engine's all-gathers: each rank contributes what it holds, nothing else.
            own_slots = mine_rank.batch.slot_mapping.to(device)
            own_pos = mine_rank.positions.to(device)
            got_slots = [torch.empty_like(own_slots) for _ in range(world)]
            got_pos = [torch.empty_like(own_pos) for _ in range(world)]
            dist.all_gather(got_slots, own_slots)
            dist.all_gather(got_pos, own_pos)
            held = int(mine_rank.batch.query_start_loc_cpu[-1])
            steps.append((held, torch.cat(got_pos).cpu(), torch.cat(got_slots).cpu()))
        dist.barrier()
        result = {"diffs": diffs, "steps": steps}
    except BaseException:  # noqa: BLE001 - sent to the parent, which fails the test with it
        result = {"error": f"rank {rank}:\n{traceback.format_exc()}"}
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    torch.save(result, out_path)
