"""On the GPU: after warmup() no build of any shape compiles, and the fast launch path
gives the same bytes as Triton's own launch path."""

from __future__ import annotations

import random

import pytest
import torch

from swa_hal import PlatformInfo, SWAConfig, SWAMetadataBuilder
from swa_hal.kernels.swa_metadata import swa_metadata_kernel
from swa_hal.testing.batches import KINDS, random_batch
from swa_hal.testing.compare import compare_with_reference

from helpers import CONFIGS

pytestmark = pytest.mark.gpu


def compiled_variants() -> int:
    return sum(len(cache[0]) for cache in swa_metadata_kernel.device_caches.values())


@pytest.mark.parametrize("name, assume", [("cuda", None), ("sm12x", "vendor=cuda,capability=12.0")])
def test_no_compilation_after_warmup(name, assume, report):
    config = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash_dspark.yaml")
    platform = PlatformInfo.from_assume(assume) if assume else None
    builder = SWAMetadataBuilder(config, device="cuda", backend=name, platform=platform)
    variants = builder.warmup()
    after_warmup = compiled_variants()
    rng = random.Random(name)
    shapes = 0
    for kind in KINDS:
        for _ in range(12):
            batch = random_batch(config, rng, kind, max_context=65536, device="cuda")
            if rng.random() < 0.5:  # engine tensors as offset views: no alignment specialisation either
                wide = torch.zeros(batch.seq_lens.shape[0] + 1, dtype=torch.int32, device="cuda")
                wide[1:] = batch.seq_lens
                batch.seq_lens = wide[1:]
            md = builder.build(batch)
            if md.causal and md.num_decode_tokens:
                builder.update_draft_decode_metadata(md)
            assert not compare_with_reference(config, batch, md) or not md.causal
            shapes += 1
    # Triton's own launch path (not our cached launcher) with odd sizes must hit the cache too.
    for key in builder.backend.kernel_keys():
        for tokens in (1, 3, 17, 1000):
            args = list(_dummy_args(tokens, key))
            swa_metadata_kernel[(4,)](*args, num_warps=4, **key.constexprs())
    torch.cuda.synchronize()
    assert compiled_variants() == after_warmup, "a build compiled a new kernel variant after warmup()"
    report(f"{name}: warmup prepared {variants} variants; {shapes} builds of random shapes (+ draft updates, "
           f"offset views) and direct Triton launches compiled nothing more ({compiled_variants()} cached)")


def _dummy_args(tokens, key):
    i32 = dict(dtype=torch.int32, device="cuda")
    width = key.DECODE_WIDTH
    dec = torch.empty((tokens, 1, width), **i32)
    lens = torch.zeros(tokens + 1, **i32)
    t2r = torch.zeros(tokens, **i32)
    valid = torch.zeros(tokens, dtype=torch.bool, device="cuda")
    pre = torch.empty((tokens, 1, key.PREFILL_WIDTH), **i32)
    qsl = torch.tensor([0, tokens], **i32)
    seq = torch.tensor([tokens], **i32)
    table = torch.arange(0, tokens + 7, **i32)[None, :]
    slots = torch.arange(tokens, dtype=torch.int64, device="cuda")
    replay, record, indptr = torch.zeros(1, **i32), torch.zeros(4, **i32), torch.zeros(2, **i32)
    groups = torch.tensor([[table.data_ptr(), slots.data_ptr(), table.stride(0), table.shape[1]]],
                          dtype=torch.int64, device="cuda")
    return (dec, lens, pre, lens, t2r, valid, lens, lens, lens, record, qsl, seq, table, slots, replay,
            indptr, lens, lens, groups,
            table.stride(0), table.shape[1], 1, tokens, 1, 0, tokens, 0, tokens, 1, 0, 0, 1, 1, tokens, 1, 1, 0)


def test_fast_launch_path_equals_triton_launch_path(report):
    config = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash.yaml")
    builder = SWAMetadataBuilder(config, device="cuda")
    rng = random.Random(3)
    batch = random_batch(config, rng, "mixed", device="cuda")
    md = builder.build(batch)  # first build: Triton's launch path (compiles)
    first = [t.clone() for t in (md.decode_swa_indices, md.decode_swa_lens, md.prefill_swa_indices, md.prefill_swa_lens)]
    for t in (builder.buffers.decode_indices, builder.buffers.prefill_indices):
        t.fill_(-5)
    md = builder.build(batch)  # second build: the cached launcher
    second = [md.decode_swa_indices, md.decode_swa_lens, md.prefill_swa_indices, md.prefill_swa_lens]
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert not compare_with_reference(config, batch, md)
    report("cached launcher and Triton's launch path wrote identical outputs")


def test_launch_hooks_are_called_and_builds_stay_exact(report):
    """With a profiler's launch hooks installed (proton installs some), compiled launches go through the
    compiled kernel's own runner, which calls them, and still hand it addresses."""
    import triton

    config = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash.yaml")
    builder = SWAMetadataBuilder(config, device="cuda")
    builder.warmup()
    rng = random.Random(4)
    seen = []

    def hook(metadata):
        seen.append(metadata.get()["name"])

    chain = triton.knobs.runtime.launch_enter_hook
    chain.add(hook)
    try:
        for kind in ("decode", "mixed", "prefill"):
            batch = random_batch(config, rng, kind, device="cuda")
            md = builder.build(batch)
            torch.cuda.synchronize()
            assert not compare_with_reference(config, batch, md), kind
    finally:
        chain.remove(hook)
    assert seen.count("swa_metadata_kernel") == 3, seen
    report(f"with a launch hook installed: 3 builds bit-exact, the hook saw {len(seen)} launches")
