"""Ring rows on the GPU (docs/semantics.md #ring-rows): every Triton backend, natively, equals the torch build
(on the CPU) bit for bit on random calls, well-formed and malformed (guarded output and the record alike);
one launch per call, no host sync; a captured call replays with its inputs changed in place; and, where
SGLang's DSpark ops are importable, the DSpark ring rows equal its ``BuildDsparkSwaRingIndices`` on the GPU."""

from __future__ import annotations

import random

import pytest
import torch

from swa_hal import SlotRing, SlotRows, SWAConfig
from swa_hal.errors import BatchValidationError
from swa_hal.testing import random_ring_rows
from swa_hal.testing.guarded import malformed_ring_rows, recorded, reference_builder

pytestmark = pytest.mark.gpu

from helpers import GPU_FORCED, gpu_builder, one_slot_rows_launch_replayed  # noqa: E402
from test_slot_ring import slow_ring_rows  # noqa: E402

WINDOWS = (8, 20, 128)


def config(window: int) -> SWAConfig:
    return SWAConfig(window_size=window, block_size=64, max_model_len=4096, max_num_batched_tokens=16, max_num_seqs=16)


def test_random_ring_rows_equal_the_torch_build(report):
    rng = random.Random("gpu-ring-rows")
    calls = 0
    for window in WINDOWS:
        ref = reference_builder(config(window))
        built = {name: gpu_builder(name, config(window)) for name in GPU_FORCED}
        for k in range(32):
            rows = random_ring_rows(rng, window, (torch.int32, torch.int64)[k % 2])
            want_rows, want_lens = ref.build_slot_rows(rows)
            gpu_rows = rows.to("cuda")
            for name, builder in built.items():
                out, lens = builder.build_slot_rows(gpu_rows)
                assert torch.equal(lens.cpu(), want_lens), (name, window, k)
                assert torch.equal(out.cpu(), want_rows), (name, window, k)
            calls += 1
        for builder in built.values():
            builder.check()
    report(f"{calls} random ring calls x {len(GPU_FORCED)} Triton backends bit-exact with the torch build")


def test_malformed_ring_rows_equal_the_torch_build(report):
    """Guarded output on the GPU: rows, lens and whether a violation was recorded, as the torch build. A
    sample: nearly every call compiles a kernel of its own (dtypes, widths, ring sizes), and the long run
    (benchmarks/fuzz_guarded.py --entries ring_rows, 5000 calls per backend) covers the rest."""
    cases = 0
    for window in (8, 20):
        cfg = config(window)
        ref = reference_builder(cfg)
        for name in GPU_FORCED:
            builder = gpu_builder(name, cfg)
            rng = random.Random(f"gpu-malformed-ring-{name}-{window}")
            for k in range(60):
                rows = malformed_ring_rows(rng, window)
                try:
                    want = ref.build_slot_rows(rows)
                except BatchValidationError as exc:  # the host preflight's: the backend's must be the same
                    with pytest.raises(type(exc)):
                        builder.build_slot_rows(rows.to("cuda"))
                    continue
                got = builder.build_slot_rows(rows.to("cuda"))
                assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1]), (name, window, k)
                assert recorded(builder) == recorded(ref), (name, window, k)
                cases += 1
    report(f"{cases} malformed ring calls bit-exact with the torch build, records included")


def _decode_rows(n: int = 256, window: int = 128) -> SlotRows:
    g = torch.Generator().manual_seed(0)
    return SlotRows(
        row_ends=torch.randint(1, 1 << 20, (n,), generator=g, dtype=torch.int32).cuda(),
        pools=torch.randperm(n, generator=g).cuda(),
        width=window,
        ring=SlotRing(size=window + 8, slots=n),
    )


@pytest.mark.parametrize("name", sorted(GPU_FORCED))
def test_one_launch_no_sync_and_graph_replay(name, report):
    builder = gpu_builder(name, config(128))
    rows = _decode_rows()
    out, lens = one_slot_rows_launch_replayed(builder, rows)
    want_rows, want_lens = slow_ring_rows(rows.row_ends.cpu().tolist(), rows.pools.cpu().tolist(), 136, 128, 128)
    assert lens.tolist() == want_lens and out.tolist() == want_rows
    report(f"{name}: 1 kernel per ring call, no sync; a captured decode call replays bit-exact after an in-place step")


def test_equal_to_sglangs_ring_op_on_the_gpu(report):
    dspark = pytest.importorskip("sglang.kernels.ops.speculative.dspark.dspark_attn_metadata")
    rng = random.Random("gpu-ring-vs-sglang")
    builder = gpu_builder("cuda", config(128))
    calls = 0
    while calls < 40:
        rows = random_ring_rows(rng, 128, torch.int32)
        if rows.block == 0 or rows.width != -(-(128 + rows.block) // 64) * 64:
            continue  # SGLang's ring op builds DSpark blocks, padded to a multiple of 64
        assert rows.ring is not None
        floors = rows.floors if rows.floors is not None else torch.zeros(rows.ring.slots, dtype=torch.int64)
        rows = SlotRows(rows.row_ends, rows.pools, floors=floors, block=rows.block, width=rows.width, ring=rows.ring)
        rows = rows.to("cuda")
        out, lens = builder.build_slot_rows(rows)
        want, want_lens = dspark.BuildDsparkSwaRingIndices.torch(
            seq_lens_casual=rows.row_ends,
            req_pool_indices_repeated=rows.pools.long(),
            valid_from=rows.floors.long(),
            ring_size=rows.ring.size,
            block_size=rows.block,
            swa_window=128,
            page_index_aligned_size=64,
        )
        assert torch.equal(out, want) and torch.equal(lens, want_lens)
        calls += 1
    report(f"equal to SGLang's BuildDsparkSwaRingIndices on the GPU: {calls} DSpark ring calls")
