"""The CUDA backend's FlashMLA scheduler objects (docs/semantics.md #layer-types-and-schedulers), with a stand-in flash_mla module."""

from __future__ import annotations

import importlib.abc
import json
import sys
import types

import pytest

from helpers import make_builder
from swa_hal import AttentionBatch, PlatformInfo, SWAConfig, SWAMetadataBuilder
from swa_hal.config import LAYER_TYPES

CFG = SWAConfig(window_size=4, block_size=4, compress_ratios=(0, 4, 0), max_model_len=64,
                max_num_batched_tokens=32, max_num_seqs=4, num_speculative_tokens=1, speculative_method="mtp")


class FakeSchedMeta:
    made = 0

    def __init__(self):
        FakeSchedMeta.made += 1
        self.have_initialized = False


@pytest.fixture
def fake_flash_mla(monkeypatch):
    module = types.ModuleType("flash_mla")
    module.get_mla_metadata = lambda *a, **k: (FakeSchedMeta(), None)
    monkeypatch.setitem(sys.modules, "flash_mla", module)
    FakeSchedMeta.made = 0
    return module


def decode_batch():
    return AttentionBatch.from_lists([6, 3], [2, 1], [[7, 3], [5]], block_size=4)


def test_one_fresh_object_per_present_layer_type(fake_flash_mla):
    builder = make_builder(CFG, "cuda")
    md1 = builder.build(decode_batch())
    assert isinstance(md1.tile_sched["swaonly"], FakeSchedMeta) and isinstance(md1.tile_sched["c4a"], FakeSchedMeta)
    assert md1.tile_sched["c128a"] is None  # no C128A layer in this model
    md2 = builder.build(decode_batch())
    assert md2.tile_sched["swaonly"] is not md1.tile_sched["swaonly"]
    assert md2.tile_sched["c4a"] is not md1.tile_sched["c4a"]
    assert FakeSchedMeta.made == 4


def test_no_objects_without_decode_tokens(fake_flash_mla):
    md = make_builder(CFG, "cuda").build(AttentionBatch.from_lists([9], [9], [[1, 2, 3]], block_size=4))
    assert md.num_decode_tokens == 0 and all(v is None for v in md.tile_sched.values())
    assert FakeSchedMeta.made == 0


def test_draft_update_replaces_the_objects(fake_flash_mla):
    builder = make_builder(CFG, "cuda")
    batch = AttentionBatch.from_lists([6, 3], [2, 1], [[7, 3], [5, 9]], block_size=4)
    md = builder.build(batch)
    before = dict(md.tile_sched)
    batch.seq_lens += 1
    builder.update_draft_decode_metadata(md)
    assert md.tile_sched["swaonly"] is not before["swaonly"] and md.tile_sched["c4a"] is not before["c4a"]


def test_a_builder_without_planner_objects_makes_none(fake_flash_mla):
    """``tile_schedulers=False`` (an engine with planner objects of its own, as vLLM's builders): a build
    and a draft update hand out None for every type, and no FlashMLA object is made."""
    builder = make_builder(CFG, "cuda", validate=True, tile_schedulers=False)
    batch = AttentionBatch.from_lists([6, 3], [2, 1], [[7, 3], [5, 9]], block_size=4)
    md = builder.build(batch)
    assert md.num_decode_tokens and set(md.tile_sched) == set(LAYER_TYPES)
    assert all(v is None for v in md.tile_sched.values())
    batch.seq_lens += 1
    builder.update_draft_decode_metadata(md)
    assert all(v is None for v in md.tile_sched.values())
    assert FakeSchedMeta.made == 0
    # The same builder with objects makes them (the stand-in module is in place).
    assert make_builder(CFG, "cuda").build(batch).tile_sched["swaonly"] is not None and FakeSchedMeta.made == 1


@pytest.mark.parametrize("backend", ["torch", "sm12x", "rocm", "xpu"])
def test_other_platforms_get_none(fake_flash_mla, backend):
    md = make_builder(CFG, backend).build(decode_batch())
    assert all(v is None for v in md.tile_sched.values())


def test_sm100_gets_objects(fake_flash_mla):
    builder = SWAMetadataBuilder(CFG, backend="cuda", platform=PlatformInfo.from_assume("vendor=cuda,capability=10.0"))
    assert builder.build(decode_batch()).tile_sched["swaonly"] is not None


def test_missing_flash_mla_keeps_building_and_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_mla", None)  # import raises ImportError
    builder = make_builder(CFG, "cuda")
    md = builder.build(decode_batch())
    assert md.decode_swa_lens.tolist() == [4, 4, 3]
    assert all(v is None for v in md.tile_sched.values())
    assert "flash_mla is not importable (ModuleNotFoundError" in builder.backend.status()["tile scheduler"]


class _BrokenLibraryFinder(importlib.abc.MetaPathFinder):
    """Imitates a wheel whose extension cannot load its CUDA libraries: the import raises OSError."""

    def find_spec(self, name, path, target=None):
        if name == "flash_mla":
            raise OSError("libcuda.so.1: cannot open shared object file: No such file or directory")
        return None


def test_oserror_at_import_is_contained(monkeypatch):
    monkeypatch.delitem(sys.modules, "flash_mla", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_BrokenLibraryFinder()] + sys.meta_path)
    builder = make_builder(CFG, "cuda")
    assert all(v is None for v in builder.build(decode_batch()).tile_sched.values())
    assert "OSError: libcuda.so.1" in builder.backend.status()["tile scheduler"]


def test_info_reports_the_reason(monkeypatch, capsys):
    from swa_hal.cli import main

    monkeypatch.setitem(sys.modules, "flash_mla", None)
    assert main(["info", "--json", "--status", "--assume", "vendor=cuda,capability=9.0"]) == 0
    status = json.loads(capsys.readouterr().out)["backend_status"]
    assert status["tile scheduler"].startswith("none: flash_mla is not importable")
