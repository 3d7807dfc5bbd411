"""The builder: fixed buffers, views, lens tails, GPU tiling in the interpreter, defaults."""

from __future__ import annotations

import contextlib
import random

import pytest
import torch

from helpers import BACKEND_PLATFORMS, TRITON_BACKENDS, make_builder, swept
from swa_hal import AttentionBatch, BatchValidationError, LAYER_TYPES, SWAConfig
from swa_hal.testing import CONFORMANCE_CONFIGS, address_strict, compare_with_reference, random_batch

CFG = CONFORMANCE_CONFIGS["w4b4_mtp"]


def base(t: torch.Tensor) -> int:
    """Address of the storage a tensor views (an empty view's own data_ptr() is 0)."""
    return t.untyped_storage().data_ptr()


@pytest.mark.parametrize("backend", list(BACKEND_PLATFORMS))
def test_outputs_are_views_of_fixed_buffers_and_lens_tail_is_zero(backend):
    builder = make_builder(CFG, backend)
    buf = builder.buffers
    rng = random.Random(backend)
    sizes = []
    for kind in ("prefill", "mixed", "decode", "padded", "mtp", "decode"):
        batch = random_batch(CFG, rng, kind)
        md = builder.build(batch)
        sizes.append(md.num_decode_tokens)
        assert base(md.decode_swa_indices) == base(buf.decode_indices)
        assert base(md.decode_swa_lens) == base(buf.decode_lens)
        assert base(md.token_to_req_indices) == base(buf.token_to_req)
        assert base(md.is_valid_token) == base(buf.is_valid)
        if md.num_prefill_tokens:
            assert base(md.prefill_swa_indices) == base(buf.prefill_indices)
        if md.num_prefills:
            assert base(md.prefill_gather_lens) == base(buf.gather_lens)
        assert int(buf.decode_lens[md.num_decode_tokens :].abs().sum()) == 0, f"stale lens after {kind}"
        assert not compare_with_reference(CFG, batch, md)
    assert len(set(sizes)) > 2  # the sizes really changed between builds


def test_optional_fields_and_scheduler_slots():
    builder = make_builder(CFG, "torch")
    md = builder.build(AttentionBatch.from_lists([5, 7], [1, 2], [[0, 1], [2, 3]], block_size=4))
    assert md.num_prefills == 0 and md.prefill_swa_indices is None and md.prefill_gather_lens is None
    assert md.prefill_seq_lens is None and md.get_prefill_chunk_plan(4, 1) == []
    assert set(md.tile_sched) == set(LAYER_TYPES) and all(v is None for v in md.tile_sched.values())
    assert md.tile_sched_swaonly is None and md.backend == "torch"
    assert (md.window_size, md.block_size, md.prefill_window_size) == (4, 4, 4)


def test_max_decode_query_len_and_threshold():
    builder = make_builder(CFG, "torch")  # 1 MTP draft: threshold 2
    assert builder.decode_threshold == 2 and builder.reorder_batch_threshold is None
    md = builder.build(AttentionBatch.from_lists([5, 7], [2, 6], [[0, 1], [2, 3]], block_size=4))
    assert (md.num_decodes, md.max_decode_query_len) == (1, 2)
    md = builder.build(AttentionBatch.from_lists([5], [1], [[0, 1]], block_size=4))
    assert md.max_decode_query_len == 1


@pytest.mark.parametrize("backend", swept(TRITON_BACKENDS))
def test_gpu_tiling_in_the_interpreter(backend, monkeypatch):
    """GPU-sized tiles on the CPU (2048 entries per prefill program, 512 per decode program), so their program boundaries run too."""
    monkeypatch.setenv("SWA_HAL_TILE_ELEMS", "2048")
    monkeypatch.setenv("SWA_HAL_DECODE_TILE_ELEMS", "512")
    config = CONFORMANCE_CONFIGS["v4"]
    builder = make_builder(config, backend)
    key = builder.backend.kernel_key()
    assert (key.BLOCK_T, key.BLOCK_TP) == (4, 16)
    rng = random.Random(backend)
    strict = address_strict() if backend == "sm12x" else contextlib.nullcontext()
    with strict:
        for kind in ("mixed", "padded", "prefill"):
            batch = random_batch(config, rng, kind, max_tokens=300)
            assert not compare_with_reference(config, batch, builder.build(batch))


@pytest.mark.parametrize("backend", swept(TRITON_BACKENDS))
@pytest.mark.parametrize("queries", [[1] * 6, [3, 20, 17]], ids=["decodes", "prefills"])
def test_padding_rows_fill_whole_programs(backend, queries, monkeypatch):
    """Rows past the scheduled tokens map to request 0 (docs/semantics.md #per-token-helpers): decode programs
    load its values with their owner check, prefill programs leave padding rows to the owner search.
    With GPU tiles, 42 padding rows fill whole programs of either kind."""
    from swa_hal.scenarios import synthesize_batch

    monkeypatch.setenv("SWA_HAL_TILE_ELEMS", "2048")
    monkeypatch.setenv("SWA_HAL_DECODE_TILE_ELEMS", "512")
    config = CONFORMANCE_CONFIGS["v4"]
    builder = make_builder(config, backend)
    rng = random.Random(7)
    batch = synthesize_batch(config, [rng.randint(40, 900) for _ in queries], queries, rng=rng, padding_rows=42)
    assert batch.num_tokens == sum(queries) + 42
    strict = address_strict() if backend == "sm12x" else contextlib.nullcontext()
    with strict:
        md = builder.build(batch)
    assert not compare_with_reference(config, batch, md)
    pad = torch.arange(sum(queries), batch.num_tokens)
    assert bool((md.token_to_req_indices[pad] == 0).all())
    builder.check()  # a valid batch: nothing recorded


def test_validation_default_follows_debug_mode(monkeypatch):
    bad = AttentionBatch.from_lists([3], [2], [[0]], block_size=4)
    bad.seq_lens.fill_(1)
    assert not make_builder(CFG, "torch").validate
    monkeypatch.setenv("SWA_HAL_DEBUG", "1")
    builder = make_builder(CFG, "torch")
    assert builder.validate
    with pytest.raises(BatchValidationError, match=r"seq_lens\[0\]=1 is shorter than its query length 2"):
        builder.build(bad)


def test_hot_path_guards_run_without_validation():
    builder = make_builder(CFG, "cuda")
    batch = AttentionBatch.from_lists([3], [2], [[0]], block_size=4)
    wrong = AttentionBatch(**{**batch.__dict__, "slot_mapping": batch.slot_mapping.to(torch.int32)})
    with pytest.raises(BatchValidationError, match="slot_mapping has dtype torch.int32; expected torch.int64"):
        builder.build(wrong, validate=False)
    big = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=4)
    with pytest.raises(BatchValidationError, match="num_tokens=6 exceeds the builder's capacity"):
        make_builder(big, "cuda").build(AttentionBatch.from_lists([6], [6], [[0, 1]], block_size=4), validate=False)


def test_update_refuses_foreign_metadata():
    a, b = make_builder(CFG, "torch"), make_builder(CFG, "torch")
    md = a.build(AttentionBatch.from_lists([5], [1], [[0, 1]], block_size=4))
    with pytest.raises(ValueError, match="not built by this builder"):
        b.update_draft_decode_metadata(md)


def test_warmup_prepares_every_variant():
    config = CONFORMANCE_CONFIGS["w7b3_dspark"]
    seen = []
    builder = make_builder(config, "sm12x")
    # Rows: causal (draft-step updates launch the same variant) and DSpark; token-slot rows as SGLang calls
    # them: causal without floors and with int32 or int64 floors, DSpark paged and over the draft ring, with
    # and without valid_from; request-window layouts with and without floors, int32 or int64 inputs.
    assert builder.warmup(seen.append) == 2 + 7 + 4 and len(seen) == 13
    rocm = make_builder(config, "rocm")
    assert rocm.warmup() == 13 + 3  # plus indptr and the two ragged widths



@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_owner_search_over_several_chunks(backend, monkeypatch):
    """More requests than one search step compares: the multi-step path of the owner search."""
    from swa_hal.kernels import rows_launch

    monkeypatch.setattr(rows_launch, "MAX_SEARCH_BLOCK", 16)
    config = CONFORMANCE_CONFIGS["w12b8_parallel"]  # up to 16 requests
    wide = SWAConfig(**{**config.to_dict(), "max_num_seqs": 60, "compress_ratios": config.compress_ratios})
    builder = make_builder(wide, backend)
    assert builder.backend.kernel_key().SEARCH_BLOCK == 16
    rng = random.Random(backend)
    strict = address_strict() if backend == "sm12x" else contextlib.nullcontext()
    from swa_hal.scenarios import synthesize_batch

    batches = [synthesize_batch(wide, [rng.randint(1, 400) for _ in range(50)], [1] * 30 + [2] * 18 + [0, 0],
                                rng=rng, padding_rows=5, invalid_tokens=3)]
    batches += [random_batch(wide, rng, kind, max_reqs=60) for kind in ("mixed", "padded", "mtp")]
    with strict:
        for batch in batches:
            assert not compare_with_reference(wide, batch, builder.build(batch))
    assert batches[0].seq_lens.shape[0] == 50  # four search steps of 16


def test_metadata_fields_are_the_dataclass_fields():
    """SWAMetadata.for_step assembles a step's metadata from its shape and step fields: every build, plain
    or grouped, hands out exactly the dataclass's fields."""
    import dataclasses

    from swa_hal.metadata import SWAMetadata

    config = dataclasses.replace(CONFORMANCE_CONFIGS["w4b4_mtp"], num_kv_groups=2)
    builder = make_builder(config, "torch")
    rng = random.Random(8)
    fields = {f.name for f in dataclasses.fields(SWAMetadata)}
    for kind in ("decode", "mixed", "prefill"):
        batch = random_batch(config, rng, kind)
        mds = [builder.build(batch), *builder.build_groups(batch, [batch.block_table] * 2, [batch.slot_mapping] * 2)]
        for md in mds:
            assert set(vars(md)) == fields, (kind, set(vars(md)) ^ fields)
