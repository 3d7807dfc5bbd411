"""On the GPU: rule 15 holds a prefill's host ``seq_lens_cpu`` against the device ``seq_lens``
(docs/semantics.md #guarded-builds) from the builder's own copy of the host values. An engine hands that
copy in pinned memory and rewrites it for its next step while the GPU is still behind: the build must have
read it by the time it returns (no false record, no emptied rows), and, on a Triton backend, without waiting for the stream."""

from __future__ import annotations

import time

import pytest
import torch

from swa_hal import AttentionBatch, SWAConfig, SWAMetadataBuilder
from swa_hal.reference import build_reference

pytestmark = pytest.mark.gpu

CONFIG = SWAConfig(window_size=8, block_size=4, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=8)
BUSY_S = 0.2  # how long the stream is kept busy before the build's copy


def prefill_batch() -> AttentionBatch:
    """A decode and two prefills; the host copies live in pinned memory, as an engine's do."""
    seqs, queries = [20, 12, 30], [1, 5, 7]
    tables = [[r * 8 + p for p in range(8)] for r in range(3)]
    batch = AttentionBatch.from_lists(seqs, queries, tables, block_size=CONFIG.block_size).to("cuda")
    return batch.replace(
        query_start_loc_cpu=batch.query_start_loc_cpu.pin_memory(), seq_lens_cpu=batch.seq_lens_cpu.pin_memory()
    )


@pytest.mark.parametrize("backend", ["cuda", "torch"])
def test_a_pinned_host_copy_rewritten_after_the_build_records_nothing(backend, report):
    builder = SWAMetadataBuilder(CONFIG, device="cuda", backend=backend)
    batch = prefill_batch()
    ref = build_reference(CONFIG, batch.to("cpu"))
    builder.build(batch)  # compile and allocate first
    torch.cuda.synchronize()
    cycles = int(BUSY_S * torch.cuda.get_device_properties(0).clock_rate * 1e3)  # clock_rate is in kHz
    torch.cuda._sleep(cycles)  # the stream is busy for about BUSY_S: the build's copy waits behind it
    start = time.perf_counter()
    md = builder.build(batch)
    host_s = time.perf_counter() - start
    batch.seq_lens_cpu.fill_(1)  # the engine's next step, before the stream reached the copy
    torch.cuda.synchronize()
    builder.check()  # would raise rule 15 (seq_lens_cpu) had the copy read the rewritten values
    assert torch.equal(md.prefill_swa_lens.cpu(), ref.prefill_lens)
    assert torch.equal(md.prefill_swa_indices.cpu(), ref.prefill_indices)
    if (
        backend != "torch"
    ):  # the torch backend's prefill build may read device values (docs/semantics.md #fixed-buffers)
        assert host_s < BUSY_S / 2, f"the build waited for the stream: {host_s * 1e3:.1f} ms"
    report(
        f"{backend}: a build behind {BUSY_S * 1e3:.0f} ms of stream work returned in {host_s * 1e3:.2f} ms; "
        "its pinned host copy rewritten at once, nothing recorded, rows equal to the reference"
    )
