"""The MODEL1 FP8 cache writer used by the FlashMLA end-to-end test: layout and values."""

from __future__ import annotations

import torch

from swa_hal.testing import model1


def test_page_geometry():
    assert model1.TOKEN_BYTES == 584
    assert model1.page_bytes(64) == 65 * 576  # 64 * 584 = 37376 bytes, padded to a multiple of 576
    assert model1.page_bytes(1) == 2 * 576


def test_view_shape_strides_and_byte_layout():
    torch.manual_seed(0)
    pages, block = 3, 4
    kv = (torch.randn(pages, block, 512) * 3).to(torch.bfloat16)
    cache = model1.quantize(kv)
    assert cache.dtype == torch.float8_e4m3fn
    assert cache.shape == (pages, block, 1, 584)
    assert cache.stride() == (model1.page_bytes(block), 584, 584, 1)
    raw = torch.as_strided(cache, (pages, model1.page_bytes(block)), (cache.stride(0), 1)).view(torch.uint8)
    p, t = 2, 3
    rope = raw[p, t * 576 + 448 : t * 576 + 576].contiguous().view(torch.bfloat16)
    assert torch.equal(rope, kv[p, t, 448:])
    exps = raw[p, block * 576 + t * 8 : block * 576 + t * 8 + 7].to(torch.int32)
    amax = kv[p, t, :448].float().view(7, 64).abs().amax(-1)
    # UE8M0: the smallest power of two with amax / scale <= 448
    scale = torch.exp2(exps.float() - 127)
    assert bool((amax / scale <= 448).all()) and bool((amax / (scale / 2) > 448).all() | (amax < 1e-3).all())


def test_round_trip_is_within_e4m3_precision():
    torch.manual_seed(1)
    kv = torch.randn(2, 64, 512).to(torch.bfloat16)
    back = model1.dequantize(model1.quantize(kv))
    nope_err = ((back[..., :448] - kv[..., :448].float()).norm() / kv[..., :448].float().norm()).item()
    assert nope_err < 0.05
    assert torch.equal(back[..., 448:], kv[..., 448:].float())


def test_reference_attention_over_a_window():
    torch.manual_seed(2)
    kv = torch.randn(2, 4, 512)
    q = torch.randn(3, 1, 2, 512)
    indices = torch.tensor([[[5, 6, -1]], [[0, -1, -1]], [[-1, -1, -1]]], dtype=torch.int32)
    lens = torch.tensor([2, 1, 0], dtype=torch.int32)
    out = model1.reference_sparse_attention(q, kv, indices, lens, 4)
    keys = kv.reshape(-1, 512)[[5, 6]]
    want = torch.softmax(q[0, 0] @ keys.T * 512 ** -0.5, dim=-1) @ keys
    assert torch.allclose(out[0, 0], want, atol=1e-5)
    assert torch.allclose(out[1, 0], kv.reshape(-1, 512)[0].expand(2, 512), atol=1e-6)  # one key: itself
    assert bool((out[2] == 0).all())
