"""DeepSeek-V4 SWA KV cache in FlashMLA's "MODEL1" FP8 layout (docs/semantics.md #flashmla-consumer), for end-to-end tests.

Per token: 448 NoPE values in e4m3 (7 tiles of 64, each with a UE8M0 scale: ``scale = 2^(byte - 127)``)
and 64 bf16 RoPE values: 584 bytes. A page of B tokens stores the B data rows (576 bytes each: 448
NoPE bytes, then 128 RoPE bytes) first, then the B scale rows (8 bytes each: 7 exponents and one pad
byte), and is padded to a multiple of 576 bytes. FlashMLA takes the cache as a ``[pages, B, 1, 584]``
float8 view with ``stride(0)`` = padded page bytes and ``stride(1)`` = 584. K = V = the 512 dequantized
values (NoPE then RoPE).
"""

from __future__ import annotations

import torch

D_NOPE = 448
D_ROPE = 64
HEAD_DIM = D_NOPE + D_ROPE  # 512
TILE = 64
TILES = D_NOPE // TILE  # 7
DATA_BYTES = D_NOPE + 2 * D_ROPE  # 576
SCALE_BYTES = TILES + 1  # 8
TOKEN_BYTES = DATA_BYTES + SCALE_BYTES  # 584
E4M3_MAX = 448.0


def page_bytes(block_size: int) -> int:
    return -(-block_size * TOKEN_BYTES // DATA_BYTES) * DATA_BYTES


def quantize(kv: torch.Tensor) -> torch.Tensor:
    """[pages, B, 512] bf16 -> the MODEL1 cache as a [pages, B, 1, 584] float8_e4m3fn strided view."""
    pages, block, dim = kv.shape
    assert dim == HEAD_DIM, f"expected {HEAD_DIM} values per token, got {dim}"
    raw = torch.zeros((pages, page_bytes(block)), dtype=torch.uint8, device=kv.device)
    data = raw[:, : block * DATA_BYTES].view(pages, block, DATA_BYTES)
    scales = raw[:, block * DATA_BYTES : block * TOKEN_BYTES].view(pages, block, SCALE_BYTES)
    nope = kv[..., :D_NOPE].float().view(pages, block, TILES, TILE)
    amax = nope.abs().amax(dim=-1).clamp_min(1e-4)
    # UE8M0: the power of two at or above amax / 448, so every value fits e4m3 after scaling.
    exponent = torch.ceil(torch.log2(amax / E4M3_MAX)).clamp(-127, 127)
    scale = torch.exp2(exponent)
    codes = (nope / scale[..., None]).to(torch.float8_e4m3fn)
    data[..., :D_NOPE] = codes.view(pages, block, D_NOPE).view(torch.uint8)
    data[..., D_NOPE:] = (
        kv[..., D_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8).view(pages, block, 2 * D_ROPE)
    )
    scales[..., :TILES] = (exponent + 127).to(torch.uint8)
    return torch.as_strided(
        raw.view(torch.float8_e4m3fn), (pages, block, 1, TOKEN_BYTES), (page_bytes(block), TOKEN_BYTES, TOKEN_BYTES, 1)
    )


def dequantize(cache: torch.Tensor) -> torch.Tensor:
    """The MODEL1 cache -> [pages, B, 512] float32, exactly the values FlashMLA attends over."""
    pages, block = cache.shape[0], cache.shape[1]
    raw = torch.as_strided(cache, (pages, page_bytes(block)), (cache.stride(0), 1)).view(torch.uint8)
    data = raw[:, : block * DATA_BYTES].reshape(pages, block, DATA_BYTES)
    exps = raw[:, block * DATA_BYTES : block * TOKEN_BYTES].reshape(pages, block, SCALE_BYTES)[..., :TILES]
    scale = torch.exp2(exps.float() - 127.0)
    nope = data[..., :D_NOPE].contiguous().view(torch.float8_e4m3fn).float().view(pages, block, TILES, TILE)
    rope = data[..., D_NOPE:].contiguous().view(torch.bfloat16).float()
    return torch.cat([(nope * scale[..., None]).view(pages, block, D_NOPE), rope], dim=-1)


def reference_sparse_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    lens: torch.Tensor,
    block_size: int,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """Attention of each query row over exactly its window: q [T, 1, H, 512], kv [pages, B, 512]
    (dequantized), indices [T, 1, W] slots, lens [T]. A row with lens 0 gives zeros (FlashMLA's empty
    result). Returns float32 [T, 1, H, 512]."""
    scale = HEAD_DIM**-0.5 if softmax_scale is None else softmax_scale
    flat = kv.reshape(-1, HEAD_DIM).float()
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for t in range(q.shape[0]):
        n = int(lens[t])
        if n == 0:
            continue
        slots = indices[t, 0, :n].long()
        keys = flat[slots]  # [n, 512], K = V
        scores = (q[t, 0].float() @ keys.T) * scale  # [H, n]
        out[t, 0] = torch.softmax(scores, dim=-1) @ keys
    return out
