"""Token-slot rows on the GPU (docs/semantics.md #token-slot-rows): every Triton backend and the torch
build equal the slow model on random calls; one launch per call, no host sync; a captured call replays
with its inputs changed in place; and, where SGLang's dsv4 metadata ops are importable, the rows equal
what SGLang's own Triton kernels return for the same inputs."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from swa_hal import SWAConfig, SWAMetadataBuilder
from swa_hal.slot_rows import SlotRows

pytestmark = pytest.mark.gpu

from helpers import GPU_FORCED, gpu_builder, one_slot_rows_launch_replayed  # noqa: E402
from test_slot_rows import random_call, slow_rows  # noqa: E402

WINDOWS = (20, 64, 128)


def config(window: int) -> SWAConfig:
    return SWAConfig(window_size=window, block_size=64, max_model_len=4096, max_num_batched_tokens=16, max_num_seqs=16)


def builders(window: int) -> dict[str, SWAMetadataBuilder]:
    out = {name: gpu_builder(name, config(window)) for name in GPU_FORCED}
    out["torch"] = SWAMetadataBuilder(config(window), device="cuda", backend="torch")
    return out


def test_random_calls_equal_the_slow_model(report):
    rng = random.Random("gpu-slot-rows")
    calls = 0
    for window in WINDOWS:
        built = builders(window)
        for k in range(24):
            rows, (want_rows, want_lens) = random_call(rng, window, (torch.int32, torch.int64)[k % 2])
            gpu_rows = rows.to("cuda")
            for name, builder in built.items():
                out, lens = builder.build_slot_rows(gpu_rows)
                assert lens.tolist() == want_lens, (name, window, k)
                assert out.tolist() == want_rows, (name, window, k)
            calls += 1
        for builder in built.values():
            builder.check()
    report(f"{calls} random calls x {len(built)} backends bit-exact with the slow model")


def _decode_rows(n: int = 256, window: int = 128) -> SlotRows:
    g = torch.Generator().manual_seed(0)
    positions = 4096
    return SlotRows(
        row_ends=torch.randint(1, positions - 64, (n,), generator=g, dtype=torch.int32).cuda(),
        pools=torch.randperm(n, generator=g).cuda(),
        req_to_token=torch.randperm(n * positions, generator=g).view(n, positions).to(torch.int32).cuda(),
        slot_map=torch.cat([torch.randint(0, 1 << 20, (n * positions,), generator=g), torch.tensor([-1])]).cuda(),
        width=window,
    )


@pytest.mark.parametrize("name", sorted(GPU_FORCED))
def test_one_launch_no_sync_and_graph_replay(name, report):
    builder = gpu_builder(name, config(128))
    rows = _decode_rows()
    out, lens = one_slot_rows_launch_replayed(builder, rows)
    cpu = [t.cpu().tolist() if isinstance(t, torch.Tensor) else t for t in (rows.row_ends, rows.pools)]
    want_rows, want_lens = slow_rows(
        cpu[0], cpu[1], rows.req_to_token.cpu().tolist(), rows.slot_map.cpu().tolist(), 128, 128
    )
    assert lens.tolist() == want_lens and out.tolist() == want_rows
    report(f"{name}: 1 kernel per call, no sync; a captured decode call replays bit-exact after an in-place step")


def test_equal_to_sglangs_own_triton_ops(report):
    ops = pytest.importorskip("sglang.kernels.ops.attention.dsv4.attn_metadata_kernels")
    dspark = pytest.importorskip("sglang.kernels.ops.speculative.dspark.dspark_attn_metadata")
    rng = random.Random("gpu-vs-sglang")
    builder = gpu_builder("cuda", config(128))
    calls = {"causal": 0, "dspark": 0}
    while min(calls.values()) < 40:
        rows, _ = random_call(rng, 128, torch.int32)
        if rows.width != -(-(128 + rows.block) // 64) * 64:
            continue  # SGLang pads rows to a multiple of 64
        # SGLang's Triton kernels index full_to_swa with a token slot of -1 as the element before the
        # mapping (its torch reference reads the trailing -1, as swa_hal does), and read below position 0
        # for a negative floor (SGLang's floors are max(0, ...)): inputs inside SGLang's contract only.
        rows = dataclasses.replace(rows, req_to_token=rows.req_to_token.clamp_min(0))
        if rows.floors is not None and rows.block == 0:
            rows = dataclasses.replace(rows, floors=rows.floors.clamp_min(0))
        rows = rows.to("cuda")
        out, lens = builder.build_slot_rows(rows)
        # What both of SGLang's page-index ops take: the request pool's token slots and the window's layout.
        pages = dict(req_to_token=rows.req_to_token, full_to_swa_mapping=rows.slot_map, swa_window=128,
                     page_index_aligned_size=64)
        if rows.block == 0:
            want = ops.BuildCausalSwaPageIndices.triton(
                **pages, req_pool_indices_repeated=rows.pools.long(), seq_lens_casual=rows.row_ends,
                swa_replay_start=rows.floors,
            )
            assert torch.equal(out, want)
            calls["causal"] += 1
        else:
            gather = dspark.ComputeDsparkWindowGather.triton(
                seq_lens_casual=rows.row_ends,
                req_pool_indices_repeated=rows.pools.long(),
                block_size=rows.block,
                swa_window=128,
                valid_from=rows.floors,
            )
            want, want_lens = dspark.BuildDsparkSwaPageIndices.triton(
                **pages, req_pool_indices_per_request=gather.req_pool_indices_per_request, offsets=gather.offsets,
                invalid=gather.invalid, out_loc=rows.block_slots, context_lens=gather.context_lens,
                block_size=rows.block,
            )
            assert torch.equal(out, want) and torch.equal(lens, want_lens)
            calls["dspark"] += 1
    report(f"equal to SGLang's Triton ops on the GPU: {calls['causal']} causal, {calls['dspark']} DSpark calls")
