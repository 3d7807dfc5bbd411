"""reference.py against the slow per-token model, on random batches of every kind."""

from __future__ import annotations

import random
import time

import pytest
import torch

from swa_hal.testing.plain_model import model
from swa_hal import SWAConfig
from swa_hal.reference import build_reference, ragged_rows
from swa_hal.scenarios import synthesize_batch
from swa_hal.testing.batches import random_batch
from swa_hal.testing.fixtures import cases

CONFIGS = {
    "w4b4_mtp1": SWAConfig(window_size=4, block_size=4, max_model_len=512, max_num_batched_tokens=96,
                           max_num_seqs=12, num_speculative_tokens=1, speculative_method="mtp"),
    "w5b1": SWAConfig(window_size=5, block_size=1, max_model_len=128, max_num_batched_tokens=64, max_num_seqs=8),
    "w1b16": SWAConfig(window_size=1, block_size=16, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=8),
    "w12b8_parallel": SWAConfig(window_size=12, block_size=8, max_model_len=512, max_num_batched_tokens=128,
                                max_num_seqs=16, num_speculative_tokens=2, parallel_drafting=True,
                                speculative_method="mtp"),
    "w7b3_dspark": SWAConfig(window_size=7, block_size=3, max_model_len=300, max_num_batched_tokens=96,
                             max_num_seqs=10, num_speculative_tokens=5, speculative_method="dspark"),
    # The vision variant: images longer than the window (M > W) and shorter (M < W).
    "w4b4_vision_m6": SWAConfig(window_size=4, block_size=4, max_model_len=256, max_num_batched_tokens=96,
                                max_num_seqs=8, max_image_tokens=6),
    "w9b2_vision_m3_mtp": SWAConfig(window_size=9, block_size=2, max_model_len=256, max_num_batched_tokens=96,
                                    max_num_seqs=8, max_image_tokens=3, num_speculative_tokens=1,
                                    speculative_method="mtp"),
    "w6b4_v41": SWAConfig(window_size=6, block_size=4, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=8,
                          model_version="deepseek_v41", compress_ratios=(0, 1, 2)),
}


def rows(t):
    return t.reshape(t.shape[0], t.shape[-1]).tolist()




@pytest.mark.parametrize("name, kind", cases(CONFIGS))
def test_reference_matches_slow_model(name, kind):
    config = CONFIGS[name]
    rng = random.Random(f"{name}-{kind}")
    for i in range(6):
        # Every other batch carries replay bounds; image spans whenever the config has images.
        batch = random_batch(config, rng, kind, replay=float(i % 2), spans=1.0, departures=True)
        got = build_reference(config, batch)
        want = model(config, batch)
        assert tuple(got.split) == want["split"]
        assert got.token_to_req.tolist() == want["token_to_req"]
        assert got.is_valid.tolist() == want["is_valid"]
        assert rows(got.decode_indices) == want["decode_indices"]
        assert got.decode_lens.tolist() == want["decode_lens"]
        assert rows(got.prefill_indices) == want["prefill_indices"]
        assert got.prefill_lens.tolist() == want["prefill_lens"]
        assert (got.prefill_gather_lens.tolist() if got.prefill_gather_lens is not None else []) == want["gather_lens"]
        assert got.decode_indices.dtype == torch.int32 and got.decode_lens.dtype == torch.int32
        for key, value in (("left_visible", got.prefill_left_visible), ("right_visible", got.prefill_right_visible)):
            assert (value.tolist() if value is not None else None) == want[key]


def test_ragged_rows_concatenates_valid_entries():
    idx = torch.tensor([[[5, 6, -1]], [[-1, -1, -1]], [[7, 8, 9]]], dtype=torch.int32)
    lens = torch.tensor([2, 0, 3], dtype=torch.int32)
    flat, indptr = ragged_rows(idx, lens)
    assert flat.tolist() == [5, 6, 7, 8, 9]
    assert indptr.tolist() == [0, 2, 2, 5]


def test_reference_is_fast_on_a_16k_token_batch():
    config = SWAConfig(window_size=128, block_size=64, max_model_len=65536, max_num_batched_tokens=16384)
    batch = synthesize_batch(config, [4096] * 8, [2048] * 8, rng=random.Random(0))
    build_reference(config, batch)  # warm the allocator
    t0 = time.perf_counter()
    out = build_reference(config, batch)
    elapsed = time.perf_counter() - t0
    assert out.split.num_prefill_tokens == 16384
    assert elapsed < 1.0, f"16384-token reference build took {elapsed:.2f} s"
