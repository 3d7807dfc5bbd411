#!/usr/bin/env python
"""The torch backend's DSpark ring rows on the CPU (docs/semantics.md #ring-rows): the median host time of
one ``build_slot_rows`` of 64 blocks of 4 rows (W = 128, a ring of 136 rows per request slot), for the
tree given, so two trees can be run in turn and compared pair by pair:

    for i in $(seq 9); do python benchmarks/cpu_ring_rows.py .; python benchmarks/cpu_ring_rows.py BEFORE; done
"""

from __future__ import annotations

import statistics
import sys
import time

tree = sys.argv[1] if len(sys.argv) > 1 else "."
sys.path[:0] = [tree, f"{tree}/backends"]

import torch  # noqa: E402

from swa_hal import SlotRing, SlotRows, SWAConfig, SWAMetadataBuilder  # noqa: E402

torch.set_num_threads(1)
config = SWAConfig(window_size=128, block_size=64, max_model_len=4096, max_num_batched_tokens=1024, max_num_seqs=256)
builder = SWAMetadataBuilder(config, device="cpu", backend="torch", validate=False)
g = torch.Generator().manual_seed(0)
blocks, block = 64, 4
prefix = torch.randint(1, 1 << 20, (blocks, 1), generator=g)
rows = SlotRows(
    row_ends=(prefix + torch.arange(block)).view(-1),
    pools=torch.arange(blocks).repeat_interleave(block),
    block=block,
    width=192,
    ring=SlotRing(size=136, slots=blocks),
)
for _ in range(50):
    builder.build_slot_rows(rows)
times = []
for _ in range(1000):
    t = time.perf_counter()
    builder.build_slot_rows(rows)
    times.append(time.perf_counter() - t)
print(f"{tree} {statistics.median(times) * 1e6:.1f} us")
