"""Per-request inputs longer than the step (docs/semantics.md #inputs): an engine keeps ``seq_lens``, its host copy
and ``replay_start`` in persistent ``max_num_seqs`` buffers and may hand them in whole. The step's R is the host
offsets' request count, and every per-request output holds exactly the step's R entries, as views of the engine's
buffers (no copies): ``md.seq_lens``, ``md.replay_start``, ``md.prefill_seq_lens`` and ``md.prefill_seq_lens_cpu``
(and ``prefill_query_lens_cpu``, ``prefill_gather_lens``), on builds, validated builds, group builds and the
engine adapter, every backend, with the rows of the same step handed in at its own length."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import BACKEND_PLATFORMS, common_metadata, make_builder

from swa_hal import AttentionBatch, PlatformInfo, SWAConfig
from swa_hal.integrations import EngineSWABuilder
from swa_hal.reference import build_reference
from swa_hal.testing.guarded import metadata_differences
from swa_hal.testing.plain_model import plain_differences

CONFIG = SWAConfig(
    window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=6, num_kv_groups=2
)
PERSISTENT = 6  # the engine's buffers: max_num_seqs entries, past R junk


def step() -> AttentionBatch:
    """Vector R1's decode and prefill, then a second prefill (S = 5, q = 2), with replay bounds [8, 5, 0]."""
    return AttentionBatch.from_lists(
        [10, 9, 5], [1, 3, 2], [[7, 3, 2], [5, 6, 1], [4, 8, 9]], block_size=4, replay_start=[8, 5, 0]
    )


def handed_whole(batch: AttentionBatch) -> AttentionBatch:
    """``batch`` with its per-request tensors the first entries of max_num_seqs buffers whose other entries are
    junk an engine left there."""

    def buffer(t: torch.Tensor) -> torch.Tensor:
        whole = torch.full((PERSISTENT,), 77, dtype=t.dtype)
        whole[: t.shape[0]] = t
        return whole

    return batch.replace(
        seq_lens=buffer(batch.seq_lens), seq_lens_cpu=buffer(batch.seq_lens_cpu), replay_start=buffer(batch.replay_start)
    )


def assert_step_outputs(md, whole: AttentionBatch) -> None:
    """Every per-request output has the step's 3 entries, as a view of the engine's buffer."""
    assert md.seq_lens.tolist() == [10, 9, 5] and md.seq_lens.data_ptr() == whole.seq_lens.data_ptr()
    assert md.replay_start.tolist() == [8, 5, 0] and md.replay_start.data_ptr() == whole.replay_start.data_ptr()
    assert md.prefill_seq_lens.tolist() == [9, 5]
    assert md.prefill_seq_lens.data_ptr() == whole.seq_lens[1:].data_ptr()
    assert md.prefill_seq_lens_cpu.tolist() == [9, 5]
    assert md.prefill_seq_lens_cpu.data_ptr() == whole.seq_lens_cpu[1:].data_ptr()
    assert md.prefill_query_lens_cpu.tolist() == [3, 2] and md.prefill_gather_lens.tolist() == [4, 5]


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("backend", sorted(BACKEND_PLATFORMS))
def test_a_build_hands_out_the_steps_requests_only(backend, validate):
    builder = make_builder(CONFIG, backend)
    want = builder.build(step(), validate=validate)
    want = dataclasses.replace(want)  # a snapshot of the fields (the buffers are rewritten by the next build)
    rows = {name: getattr(want, name).clone() for name in ("decode_swa_indices", "prefill_swa_indices", "prefill_swa_lens")}
    whole = handed_whole(step())
    md = builder.build(whole, validate=validate)
    builder.check()
    assert_step_outputs(md, whole)
    for name, value in rows.items():
        assert torch.equal(getattr(md, name), value), name
    assert md.get_prefill_chunk_plan(4, 4) == want.get_prefill_chunk_plan(4, 4)


@pytest.mark.parametrize("backend", sorted(BACKEND_PLATFORMS))
def test_a_group_build_hands_out_the_steps_requests_only(backend):
    builder = make_builder(CONFIG, backend)
    whole = handed_whole(step())
    mds = builder.build_groups(whole, [whole.block_table] * 2, torch.stack([whole.slot_mapping] * 2))
    builder.check()
    for md in mds:
        assert_step_outputs(md, whole)
    assert metadata_differences(mds[1], mds[0]) == []


@pytest.mark.parametrize("backend", sorted(BACKEND_PLATFORMS))
def test_the_engine_adapter_hands_out_the_steps_requests_only(backend):
    platform = PlatformInfo.from_assume(BACKEND_PLATFORMS[backend])
    engine = EngineSWABuilder(CONFIG, "cpu", backend=backend, platform=platform)
    whole = handed_whole(step())
    cm = common_metadata(whole, num_reqs=3)
    md = engine.build(0, cm, replay_start=whole.replay_start)
    engine.builder.check()
    assert_step_outputs(md, whole)


def test_the_reference_and_the_plain_model_read_the_steps_requests_only():
    """The oracles take the same inputs: ``build_reference`` hands out the step's R bounds and the plain model
    reads R off the host offsets, so both give every backend's rows for a step handed in whole."""
    whole = handed_whole(step())
    ref = build_reference(CONFIG, whole)
    assert ref.replay_start.tolist() == [8, 5, 0]
    for backend in sorted(BACKEND_PLATFORMS):
        md = make_builder(CONFIG, backend).build(whole)
        assert not plain_differences(CONFIG, whole, md), backend
        assert torch.equal(md.prefill_swa_indices[:, 0], ref.prefill_indices[:, 0]), backend
        assert md.prefill_gather_lens.tolist() == ref.prefill_gather_lens.tolist(), backend
