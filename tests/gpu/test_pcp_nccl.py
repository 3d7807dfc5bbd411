"""Prefill context parallelism over two GPUs (docs/semantics.md #context-parallel-ranks): one process per
GPU in an NCCL group, each building its rank-local batch on its own GPU with a Triton backend and the torch
one, checked against the reference over that batch; the positions and slot-mapping parts all-gathered over
NCCL must give back the global step's own (the checks of tests/test_pcp_ranks.py)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from test_pcp_ranks import KINDS, V41, V41_DSPARK, check_gathered, launch

from swa_hal.testing.pcp import RankJob

pytestmark = pytest.mark.gpu


@pytest.fixture
def two_gpus(monkeypatch):
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs: one NCCL rank per GPU")
    # The spawned ranks inherit this environment: NVLink multicast stays off for NCCL.
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")


@pytest.mark.parametrize(
    "config, kinds, shard",
    [(V41, KINDS, True), (V41_DSPARK, KINDS + ("dspark",), False)],
    ids=["v41-sharded", "dspark-replicated"],
)
def test_nccl_ranks_build_their_own_batches(two_gpus, tmp_path, report, config, kinds, shard):
    world = 2
    job = RankJob(
        config=dataclasses.replace(config, max_num_batched_tokens=256, max_model_len=1024),
        seed=f"pcp-nccl-{config.speculative_method}-{shard}",
        kinds=kinds,
        steps=4 * len(kinds),
        backends=("cuda", "torch"),
        shard_decodes=shard,
        dist_backend="nccl",
        init_method=(tmp_path / "store").as_uri(),
        device="cuda",
    )
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0"
    prefill_rows = check_gathered(job, world, launch(job, world, tmp_path))
    assert prefill_rows > 0, "no step had prefills to cut"
    report(f"{job.steps} steps over 2 NCCL ranks (cuda:0, cuda:1), shard_decodes={shard}: bit-exact, gathers match")
