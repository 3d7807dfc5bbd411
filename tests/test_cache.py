"""The host cache (swa_hal/cache.py): the build paths give the same outputs with the cache off
(SWA_HAL_CACHE=0) as with it on, and a cached view is never handed out for a tensor seen another way
(docs/kernels.md #the-host-cache)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from helpers import make_builder

from swa_hal import SWAConfig
from swa_hal.cache import HostCache, tensor_key
from swa_hal.testing.batches import KINDS, random_batch
from swa_hal.testing.groups import other_groups, stacked
from swa_hal.testing.slot_rows import random_slot_rows

CONFIG = SWAConfig(window_size=5, block_size=2, max_model_len=128, max_num_batched_tokens=64, max_num_seqs=8,
                   max_image_tokens=4, num_speculative_tokens=1, speculative_method="mtp", num_kv_groups=3)
DSPARK = SWAConfig(window_size=7, block_size=3, max_model_len=300, max_num_batched_tokens=96, max_num_seqs=10,
                   num_speculative_tokens=5, speculative_method="dspark", num_kv_groups=2)


def _tensors(md) -> dict[str, torch.Tensor]:
    out = {}
    for f in dataclasses.fields(md):
        value = getattr(md, f.name)
        if isinstance(value, torch.Tensor):
            out[f.name] = value.clone()
    return out


def _run_paths(config: SWAConfig, backend: str, seed: int) -> list:
    """Every build path on the same inputs, twice each (the second build finds what the first kept)."""
    builder = make_builder(config, backend)
    rng = random.Random(seed)
    outputs: list = []
    for kind in KINDS:
        if kind == "dspark" and not config.is_dspark:
            continue
        batch = random_batch(config, rng, kind)
        for _ in range(2):
            md = builder.build(batch)
            outputs.append((kind, "build", _tensors(md)))
            if md.num_decode_tokens:
                batch.seq_lens[: md.num_decodes] += 1  # the engine's draft step, in place
                builder.update_draft_decode_metadata(md)
                outputs.append((kind, "update", _tensors(md)))
        tables, slots = other_groups(config, batch, config.num_kv_groups, rng)
        for form, (t, s) in (("listed", (tables, slots)), ("stacked", stacked(tables, slots))):
            for _ in range(2):
                mds = builder.build_groups(batch, t, s)
                outputs.append((kind, form, [_tensors(m) for m in mds]))
    for _ in range(3):
        rows = random_slot_rows(rng, config.window_size)
        outputs.append(("slot rows", "build", [t.clone() for t in builder.build_slot_rows(rows)]))
    return outputs


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


# The Triton backends' host path on one config in make test, on the other in the sweep (tests/helpers.py).
@pytest.mark.parametrize(
    "config, backend",
    [
        pytest.param(CONFIG, "torch", id="torch-vision_mtp"),
        pytest.param(DSPARK, "torch", id="torch-dspark"),
        pytest.param(CONFIG, "cuda", id="cuda-vision_mtp"),
        pytest.param(DSPARK, "cuda", id="cuda-dspark", marks=pytest.mark.sweep),
    ],
)
def test_build_paths_equal_with_the_cache_off_and_on(config, backend, monkeypatch):
    monkeypatch.setenv("SWA_HAL_CACHE", "1")
    on = _run_paths(config, backend, 11)
    monkeypatch.setenv("SWA_HAL_CACHE", "0")
    off = _run_paths(config, backend, 11)
    assert len(on) == len(off)
    for (kind, path, a), (_, _, b) in zip(on, off):
        assert _same(a, b), (kind, path)


def test_the_switch_keeps_nothing(monkeypatch):
    monkeypatch.setenv("SWA_HAL_CACHE", "0")
    builder = make_builder(CONFIG, "torch")
    batch = random_batch(CONFIG, random.Random(2), "mixed")
    builder.build(batch)
    assert not builder._cache.enabled and len(builder._cache) == 0
    assert _kept(builder) == {name: 0 for name in _kept(builder)}
    monkeypatch.setenv("SWA_HAL_CACHE", "1")
    builder = make_builder(CONFIG, "torch")
    builder.build(batch)
    assert builder._cache.enabled and len(builder._cache) > 0
    kept = _kept(builder)
    assert all(n for name, n in kept.items() if name != "record views"), kept  # a clean build records nothing


def _kept(builder) -> dict[str, int]:
    """The entries the torch backend's caches of views hold (its shapes, row and record views, the row
    fills' views and constants): every one of them goes through HostCache, so the switch reaches it."""
    backend = builder.backend
    space = next(iter(backend._workspace._spaces.values()), None) if backend._workspace._spaces else None
    return {
        "shapes": len(backend._shapes),
        "row views": len(backend._guard._row_views),
        "record views": len(backend._guard._record_views),
        "spaces": len(backend._workspace._spaces),
        "row fill views": 0 if space is None else len(space._views),
    }


def test_one_bound():
    cache = HostCache(limit=3, enabled=True)
    for i in range(10):
        cache.keep(i, i)
        assert len(cache) <= 3
    assert cache.get(9) == 9


def test_identity_keys_see_strides_dtypes_and_devices():
    """A tensor seen with another stride, dtype or shape over the same memory is another key: a strided
    seq_lens_cpu must not hand a later build the view cached for a contiguous one."""
    base = torch.arange(12, dtype=torch.int32)
    keys = {tensor_key(base), tensor_key(base[::2]), tensor_key(base.view(torch.float32)),
            tensor_key(base.view(3, 4)), tensor_key(base[:6])}
    assert len(keys) == 5
    builder = make_builder(CONFIG, "torch")
    rng = random.Random(4)
    for _ in range(20):
        batch = random_batch(CONFIG, rng, "mixed")
        md = builder.build(batch)
        if md.num_prefills:
            break
    assert md.num_prefills and batch.seq_lens_cpu is not None
    n = batch.seq_lens_cpu.shape[0]
    expected = batch.seq_lens_cpu[md.num_decodes:].clone()
    # One host buffer seen two ways at the same address and length: with stride 2, then contiguous.
    wide = torch.zeros(2 * n, dtype=torch.int32)
    wide[::2] = batch.seq_lens_cpu
    assert torch.equal(builder.build(dataclasses.replace(batch, seq_lens_cpu=wide[::2])).prefill_seq_lens_cpu,
                       expected)
    wide[:n] = batch.seq_lens_cpu
    assert torch.equal(builder.build(dataclasses.replace(batch, seq_lens_cpu=wide[:n])).prefill_seq_lens_cpu,
                       expected)
