"""On a machine with two or more GPUs: builders on different GPUs in one process, whatever the current
device; one thread per GPU; a graph captured on a non-current device (docs/semantics.md #platforms)."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from swa_hal import SWAConfig, SWAMetadataBuilder
from swa_hal.compare import compare_with_reference
from swa_hal.testing.batches import random_batch

pytestmark = pytest.mark.gpu

CONFIG = SWAConfig(window_size=128, block_size=64, compress_ratios=(0, 4, 128), max_model_len=65536,
                   max_num_batched_tokens=8192, max_num_seqs=256, num_speculative_tokens=1, speculative_method="mtp",
                   num_kv_groups=2)


@pytest.fixture
def two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (run on a two-GPU machine)")
    return [torch.device("cuda", 0), torch.device("cuda", 1)]


def test_builders_on_two_gpus_used_alternately(two_gpus, report):
    torch.cuda.set_device(0)
    builders = [SWAMetadataBuilder(CONFIG, device=d) for d in two_gpus]
    rng = random.Random(0)
    checked = 0
    for i in range(40):
        g = i % 2
        # The current device is deliberately the other GPU half of the time.
        torch.cuda.set_device(1 - g if i % 4 < 2 else g)
        batch = random_batch(CONFIG, rng, ("decode", "mtp", "mixed", "padded")[i % 4], max_tokens=4096,
                             device=two_gpus[g], replay=0.5)
        md = builders[g].build(batch)
        assert md.decode_swa_lens.device == two_gpus[g]
        torch.cuda.synchronize(two_gpus[g])
        assert compare_with_reference(CONFIG, batch, md) == [], i
        checked += 1
    torch.cuda.set_device(0)
    report(f"{checked} builds alternating between cuda:0 and cuda:1 with either device current, bit-exact")


def test_one_thread_per_gpu(two_gpus, report):
    errors, done = [], []

    def work(device):
        try:
            builder = SWAMetadataBuilder(CONFIG, device=device)  # this thread's current device stays 0
            rng = random.Random(str(device))
            for i in range(20):
                batch = random_batch(CONFIG, rng, ("decode", "mixed")[i % 2], max_tokens=4096, device=device)
                md = builder.build(batch)
                torch.cuda.synchronize(device)
                assert compare_with_reference(CONFIG, batch, md) == [], (device, i)
                done.append(device)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(d,)) for d in two_gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(done) == 40
    report("one thread per GPU: 20 builds each on cuda:0 and cuda:1 at once, bit-exact")


def test_graph_captured_on_a_non_current_device(two_gpus, report):
    torch.cuda.set_device(0)
    device = two_gpus[1]
    builder = SWAMetadataBuilder(CONFIG, device=device)
    builder.warmup()
    rng = random.Random(3)
    batch = random_batch(CONFIG, rng, "decode", max_tokens=256, extra_pages=2, device=device, replay=0.0)
    md = builder.build(batch)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(device):
        stream = torch.cuda.Stream(device)
        with torch.cuda.graph(graph, stream=stream):
            builder.build(batch)
    for step in range(3):
        batch.seq_lens.add_(1)
        batch.seq_lens_cpu.add_(1)
        graph.replay()
        torch.cuda.synchronize(device)
        assert compare_with_reference(CONFIG, batch, md) == [], step
    assert torch.cuda.current_device() == 0
    report("a decode build on cuda:1 captured and replayed 3 times while cuda:0 was current, bit-exact")
