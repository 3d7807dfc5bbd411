"""End to end on a Hopper GPU: swa_hal's decode rows and lens drive FlashMLA's sparse decode over
a DeepSeek-V4 MODEL1 FP8 SWA cache, and the output matches attention over exactly each token's window.
Also shows why every build gets fresh scheduler objects: a plan reused after the lens changed is stale.
"""

from __future__ import annotations

import random

import pytest
import torch

from swa_hal import SWAConfig, SWAMetadataBuilder
from swa_hal.scenarios import synthesize_batch
from swa_hal.testing import model1

from helpers import CONFIGS

pytestmark = pytest.mark.gpu



@pytest.fixture
def flash_mla():
    return pytest.importorskip("flash_mla", reason="FlashMLA is not installed (pip install '.[flashmla]' in a clone of swa_hal)")

HEADS = 64


def make_cache(num_pages: int, block: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    kv = torch.randn((num_pages, block, model1.HEAD_DIM), generator=gen, device="cuda", dtype=torch.float32)
    kv = (kv * 0.5).to(torch.bfloat16)
    cache = model1.quantize(kv)
    return cache, model1.dequantize(cache)


def run_flash_mla(flash_mla, q, cache, md, sched):
    out, _ = flash_mla.flash_mla_with_kvcache(
        q, cache, None, None, model1.HEAD_DIM, sched, None,
        is_fp8_kvcache=True, indices=md.decode_swa_indices, topk_length=md.decode_swa_lens,
    )
    return out


def rel_err(out, ref):
    return float((out.float() - ref).norm() / ref.norm().clamp_min(1e-12))


def mixed_batch(config, rng, seq_lo, seq_hi, num_decodes=48):
    seqs = [rng.randint(seq_lo, seq_hi) for _ in range(num_decodes)] + [600, 300]
    queries = [1] * num_decodes + [200, 300]
    return synthesize_batch(config, seqs, queries, rng=rng, padding_rows=8, invalid_tokens=3, device="cuda")


def test_sparse_decode_matches_windowed_attention(flash_mla, report):
    config = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash.yaml")
    builder = SWAMetadataBuilder(config, device="cuda")
    assert builder.backend_name == "cuda"
    rng = random.Random(0)
    batch = mixed_batch(config, rng, 1, 3000)
    md = builder.build(batch, validate=True)
    assert md.num_prefills == 2 and md.num_decode_tokens == 48
    sched = md.tile_sched["swaonly"]
    assert sched is not None and type(sched).__name__ == "FlashMLASchedMeta" and not sched.have_initialized
    pages = int(batch.block_table.max()) + 1
    cache, kv = make_cache(pages, config.block_size, seed=1)
    q = (torch.randn((md.num_decode_tokens, 1, HEADS, model1.HEAD_DIM), device="cuda") * 0.5).to(torch.bfloat16)
    out = run_flash_mla(flash_mla, q, cache, md, sched)
    ref = model1.reference_sparse_attention(q, kv, md.decode_swa_indices, md.decode_swa_lens, config.block_size)
    live = md.decode_swa_lens > 0
    err = rel_err(out[live], ref[live])
    empty = out[~live]
    assert err < 1e-2, f"relative error {err:.2e}"
    assert int((~live).sum()) >= 1 and bool((empty == 0).all()), "rows with lens 0 must give zeros"
    report(f"FlashMLA sparse decode over swa_hal rows: {int(live.sum())} rows, relative error {err:.2e} "
           f"(bound 1e-2); {int((~live).sum())} invalid rows all zero; h_q={HEADS}, W={config.window_size}, "
           f"B={config.block_size}, MODEL1 fp8 cache of {pages} pages")


def test_fresh_schedulers_every_build_and_stale_plan_differs(flash_mla, report):
    config = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash.yaml")
    builder = SWAMetadataBuilder(config, device="cuda")
    rng = random.Random(2)
    num = 64
    # Step 1: short contexts (windows of 1..8 tokens); step 2: the same batch size, full windows.
    short = synthesize_batch(config, [rng.randint(1, 8) for _ in range(num)], [1] * num, rng=rng, device="cuda")
    long = synthesize_batch(config, [rng.randint(2000, 4000) for _ in range(num)], [1] * num, rng=rng, device="cuda")
    pages = max(int(short.block_table.max()), int(long.block_table.max())) + 1
    cache, kv = make_cache(pages, config.block_size, seed=3)
    q = (torch.randn((num, 1, HEADS, model1.HEAD_DIM), device="cuda") * 0.5).to(torch.bfloat16)

    md1 = builder.build(short)
    old = md1.tile_sched["swaonly"]
    run_flash_mla(flash_mla, q, cache, md1, old)  # plans for the short lens
    assert old.have_initialized
    md2 = builder.build(long)
    fresh = md2.tile_sched["swaonly"]
    assert fresh is not old and not fresh.have_initialized
    assert all(v is None or (v is not md1.tile_sched[k]) for k, v in md2.tile_sched.items())
    good = run_flash_mla(flash_mla, q, cache, md2, fresh)
    stale = run_flash_mla(flash_mla, q, cache, md2, old)
    ref = model1.reference_sparse_attention(q, kv, md2.decode_swa_indices, md2.decode_swa_lens, config.block_size)
    good_err, stale_err = rel_err(good, ref), rel_err(stale, ref)
    assert good_err < 1e-2
    assert stale_err > 10 * good_err and stale_err > 1e-2, (good_err, stale_err)
    report(f"fresh scheduler: relative error {good_err:.2e}; plan reused from a build with shorter lens: "
           f"{stale_err:.2e} (stale)")


def test_draft_update_hands_out_fresh_schedulers(flash_mla, report):
    config = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash_mtp.yaml")
    builder = SWAMetadataBuilder(config, device="cuda")
    rng = random.Random(4)
    batch = synthesize_batch(config, [rng.randint(3, 5000) for _ in range(32)], [3] * 32, rng=rng,
                             extra_pages=1, device="cuda")
    md = builder.build(batch)
    before = dict(md.tile_sched)
    batch.seq_lens += 1
    builder.update_draft_decode_metadata(md)
    assert all(md.tile_sched[k] is not before[k] for k in config.layer_types)
    report("update_draft_decode_metadata replaced every scheduler object: " + ", ".join(config.layer_types))
