"""A step's per-request inputs as one object (swa_hal/step_inputs.py; docs/kernels.md, "A new per-request
input"): made and checked once per step, carried unchanged by the batch, the plan and the metadata, and
compared by identity wherever groups of one step meet."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch
from helpers import make_builder

from swa_hal import SWAConfig
from swa_hal import errors as E
from swa_hal.batch import AttentionBatch
from swa_hal.integrations.engine import (
    batch_from_common_metadata,
    inputs_from_common_metadata,
    same_sources,
    step_sources,
)
from swa_hal.plan import update_inputs
from swa_hal.step_inputs import FIELDS, StepInputs
from swa_hal.testing.batches import random_batch
from swa_hal.testing.groups import other_groups
from swa_hal.validation import validate_batch

CONFIG = SWAConfig(
    window_size=4, block_size=4, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=8,
    num_speculative_tokens=1, speculative_method="mtp", num_kv_groups=3, max_image_tokens=4,
)


def a_batch(seed: int = 0, kind: str = "mixed") -> AttentionBatch:
    return random_batch(CONFIG, random.Random(seed), kind)


def test_a_batch_is_its_inputs_and_one_groups_table():
    batch = a_batch()
    assert isinstance(batch.inputs, StepInputs)
    # The inputs' fields read through the batch, and a batch made from the fields equals one made from inputs.
    for name in FIELDS:
        assert getattr(batch, name) is getattr(batch.inputs, name)
    again = AttentionBatch(**{name: getattr(batch, name) for name in FIELDS},
                           block_table=batch.block_table, slot_mapping=batch.slot_mapping)
    assert again.inputs == tuple(batch.inputs)  # field by field the same objects
    # One group's batch of the same step carries the same inputs object.
    other = batch.with_group(batch.block_table.clone(), batch.slot_mapping.clone())
    assert other.inputs is batch.inputs


def test_replacing_an_input_makes_new_inputs_and_setting_one_is_refused():
    batch = a_batch()
    replaced = dataclasses.replace(batch, max_query_len=batch.max_query_len + 1)
    assert replaced.inputs is not batch.inputs and replaced.max_query_len == batch.max_query_len + 1
    assert replaced.block_table is batch.block_table and batch.inputs.max_query_len == replaced.max_query_len - 1
    assert batch.replace(causal=False).causal is False and batch.causal is True
    with pytest.raises(AttributeError, match=r"^seq_lens is one of the step's inputs .*dataclasses.replace"):
        batch.seq_lens = batch.seq_lens.clone()
    # An in-place update reads as a set of the same object, and is allowed.
    before = batch.seq_lens.clone()
    batch.seq_lens += 1
    assert torch.equal(batch.seq_lens, before + 1)


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_every_group_of_a_build_carries_the_steps_inputs(backend):
    builder = make_builder(CONFIG, backend)
    batch = a_batch(1)
    tables, slots = other_groups(CONFIG, batch, 3, random.Random(1))
    mds = builder.build_groups(batch, tables, slots)
    assert all(md.inputs is batch.inputs for md in mds)
    assert all(md.seq_lens is batch.inputs.seq_lens and md.query_start_loc is batch.inputs.query_start_loc for md in mds)
    assert builder.build(batch).inputs is batch.inputs


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_a_grouped_update_refuses_metadata_of_two_builds(backend):
    builder = make_builder(CONFIG, backend)
    batch = a_batch(2, "decode")
    tables, slots = other_groups(CONFIG, batch, 2, random.Random(2))
    first = builder.build_groups(batch, tables, slots)
    # The same tensors, other inputs objects: not one build, whatever the values say.
    second = builder.build_groups(dataclasses.replace(batch, causal=True), tables, slots)
    with pytest.raises(E.BatchShapeError, match=r"^update_draft_decode_metadata: metadata 1's step inputs are not group 0's") as info:
        builder.update_draft_decode_metadata([first[0], second[1]])
    assert info.value.field == "inputs" and info.value.index == 1


def test_a_draft_updates_inputs_are_its_builds_decodes():
    builder = make_builder(CONFIG, "torch")
    batch = a_batch(3, "mixed")
    md = builder.build(batch)
    decodes = update_inputs(md)
    nd = md.num_decodes
    assert decodes.num_tokens == md.num_decode_tokens and decodes.seq_lens.shape[0] == nd
    assert decodes.query_start_loc.shape[0] == nd + 1 and decodes.image_spans is None
    assert decodes.replay_start is md.replay_start and decodes.causal is md.causal
    # Metadata made from an engine's own fields (no inputs) gives the same decode inputs.
    engine_made = dataclasses.replace(md, inputs=None)
    assert tuple(map(repr, update_inputs(engine_made))) == tuple(map(repr, decodes))


BAD = {
    "seq_lens": ("a list", E.BatchDtypeError),
    "query_start_loc": (torch.zeros(3, dtype=torch.int64), E.BatchDtypeError),
    "query_start_loc_cpu": ("a list", E.BatchDtypeError),
    "seq_lens_cpu": ("a list", E.BatchDtypeError),
    "max_query_len": (2.0, E.BatchDtypeError),
    "num_tokens": (True, E.BatchDtypeError),
    "causal": (1, E.BatchDtypeError),
    "replay_start": (torch.zeros(3, dtype=torch.int64), E.BatchDtypeError),
    "image_spans": ({0: [(0, 1)]}, E.BatchDtypeError),
}


def test_the_table_of_bad_inputs_covers_every_field():
    assert set(BAD) == set(FIELDS)


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("backend", ["torch", "cuda"])
@pytest.mark.parametrize("field", list(BAD))
def test_the_preflight_names_every_input(field, backend, validate):
    """Every field of StepInputs is checked by its O(1) preflight, by name (a new input is one field and
    one preflight line: this fails until the line is written), on the default path and on a validated build,
    which types everything the default path types."""
    batch = a_batch(4, "prefill")
    value, error = BAD[field]
    inputs = batch.inputs.replace(**{field: value})
    with pytest.raises(error, match=rf"^{field}\b"):
        inputs.preflight(CONFIG, CONFIG.max_num_batched_tokens, -1)
    builder = make_builder(CONFIG, backend)
    bad = AttentionBatch(inputs=inputs, block_table=batch.block_table, slot_mapping=batch.slot_mapping)
    with pytest.raises(error, match=rf"^{field}\b"):
        builder.build(bad, validate=validate)


@pytest.mark.parametrize("spans", [{1: [(3, 5)]}, ((0, 0, 1), (3,), (5,))], ids=["dict", "tuple"])
def test_image_ranges_in_place_of_image_spans_are_typed_by_full_validation_too(spans):
    batch = a_batch(4, "prefill").replace(image_spans=spans)
    with pytest.raises(E.BatchDtypeError, match=r"^image_spans must be an ImageSpans \(indptr, starts, ends\), got"):
        validate_batch(batch, CONFIG)


@pytest.mark.parametrize("value", [2**31, 2**63 - 1, 2**63, 2**64])
@pytest.mark.parametrize("backend", ["torch", "cuda", "sm12x"])
def test_a_validated_build_takes_an_overstated_max_query_len_of_any_size(backend, value):
    """Full validation holds max_query_len to the queries, not to the capacity the default path's preflight
    bounds it by: a validated build takes any overstatement, and every backend builds what it builds for the
    true bound (the guard's caps are int32)."""
    batch = a_batch(6, "mixed")
    builder = make_builder(CONFIG, backend)
    want = builder.build(batch, validate=True)
    rows = [t.clone() for t in (want.decode_swa_indices, want.decode_swa_lens, want.prefill_swa_lens)]
    with pytest.raises(E.BatchDtypeError, match=r"^max_query_len must be an int in \[0, 64\]"):
        builder.build(batch.replace(max_query_len=value))
    md = builder.build(batch.replace(max_query_len=value), validate=True)
    builder.check()
    assert (md.num_decodes, md.num_prefills) == (want.num_decodes, want.num_prefills)
    for got, expected in zip((md.decode_swa_indices, md.decode_swa_lens, md.prefill_swa_lens), rows):
        assert torch.equal(got, expected)


def common_metadata(batch: AttentionBatch, **changes) -> SimpleNamespace:
    cm = SimpleNamespace(
        seq_lens=batch.seq_lens, seq_lens_cpu_upper_bound=batch.seq_lens_cpu, query_start_loc=batch.query_start_loc,
        query_start_loc_cpu=batch.query_start_loc_cpu, block_table_tensor=batch.block_table,
        slot_mapping=batch.slot_mapping, max_query_len=batch.max_query_len, num_reqs=batch.num_reqs,
        num_actual_tokens=batch.num_tokens, causal=True, mm_req_doc_ranges=None,
    )
    vars(cm).update(changes)
    return cm


def test_step_sources_decide_whether_two_groups_share_a_steps_inputs():
    batch = a_batch(5)
    cm = common_metadata(batch)
    same = step_sources(cm, None)
    assert same_sources(same, step_sources(common_metadata(batch), None))
    # Another view of the same memory, seen the same way, is the same input; a copy is not.
    view = common_metadata(batch, seq_lens=batch.seq_lens[:])
    assert same_sources(same, step_sources(view, None))
    assert not same_sources(same, step_sources(common_metadata(batch, seq_lens=batch.seq_lens.clone()), None))
    # Every other source, changed alone, makes other inputs.
    for name, value in (
        ("query_start_loc_cpu", batch.query_start_loc_cpu.clone()),
        ("max_query_len", batch.max_query_len + 1),
        ("num_actual_tokens", batch.num_tokens - 1),
        ("causal", False),
        ("mm_req_doc_ranges", {0: [(0, 1)]}),
    ):
        assert not same_sources(same, step_sources(common_metadata(batch, **{name: value}), None)), name
    replay = torch.zeros(batch.num_reqs, dtype=torch.int32)
    assert not same_sources(same, step_sources(cm, replay))


def test_the_conversion_reads_its_inputs_from_the_step_sources():
    batch = a_batch(6)
    cm = common_metadata(batch)
    inputs = inputs_from_common_metadata(cm, sources=step_sources(cm, None))
    converted = batch_from_common_metadata(cm)
    for name in FIELDS:
        a, b = getattr(inputs, name), getattr(converted.inputs, name)
        assert a is b or a == b, name
    # What the sources say is what the inputs hold (the conversion reads nothing else for them).
    other = common_metadata(batch, max_query_len=batch.max_query_len + 3)
    assert inputs_from_common_metadata(cm, sources=step_sources(other, None)).max_query_len == batch.max_query_len + 3
