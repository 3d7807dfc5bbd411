"""What the token-slot and ring rows tests share: the slow model's window of a row, and the random calls
through every backend compared with a slow model."""

from __future__ import annotations

import random

import torch
from helpers import make_builder, strictness

from swa_hal.testing.slot_rows import slot_rows_config


def slow_window(ends, pools, window, i, floors=None, block=0):
    """Row ``i``'s request (its pool or ring slot), the positions its window reads and, for a DSpark row
    with a prefix, its block's head (the block's own entries follow the positions), straight from the
    definition: a causal row reads from its position down to the window's start or its floor; a DSpark row
    reads the last ``window`` positions of its block's prefix, from its request's floor up (none where the
    prefix is negative)."""
    if not block:
        p = ends[i] - 1
        lo = max(p - window + 1, 0, floors[i] if floors is not None else 0)
        return pools[i], list(range(p, lo - 1, -1)), None
    head = i - i % block
    prefix, pool = ends[head] - 1, pools[head]
    if prefix < 0:
        return pool, [], None
    ctx = min(prefix, window)
    if floors is not None:
        ctx = min(ctx, max(prefix - floors[pool], 0))
    return pool, list(range(prefix - ctx, prefix)), head


def assert_random_rows_equal_the_slow_model(backend: str, seed: str, random_call) -> None:
    """Random well-formed calls of ``random_call(rng, window, row dtype) -> (rows, (want rows, want lens))``
    through ``backend`` at windows 8 to 128 equal the slow model's rows and lens, and record nothing."""
    rng = random.Random(seed)
    with strictness(backend):
        for window in (8, 20, 64, 128):
            builder = make_builder(slot_rows_config(window), backend)
            for k in range(6):
                rows, (want_rows, want_lens) = random_call(rng, window, (torch.int32, torch.int64)[k % 2])
                out, lens = builder.build_slot_rows(rows)
                assert lens.tolist() == want_lens, (window, k, rows)
                assert out.tolist() == want_rows, (window, k, rows)
            builder.check()  # well-formed inputs: nothing recorded

