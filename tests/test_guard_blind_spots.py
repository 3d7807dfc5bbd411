"""The guard's blind spots (docs/semantics.md #guarded-builds): inputs the fuzz did not draw. Rules 13 and 14,
what the host trusted: a padding row that holds a slot, and device offsets that the split made from the host
copies does not admit (an understated ``max_query_len``, a device ``query_start_loc`` that differs from its host
copy), recorded and emptied by a guarded build of every backend, bit for bit as the torch backend's, where they
used to hand out another request's window silently; full validation raises the same error type for each.
Inputs that lie about their size (a table row shorter than its pages, an empty token table) and host copies
the split cannot use are refused by name; a DSpark step's prefills are held to their replay bounds on every
backend alike.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from helpers import BACKEND_PLATFORMS, make_builder, swept

from swa_hal import AttentionBatch, SWAConfig
from swa_hal import errors as E
from swa_hal.reference import build_reference
from swa_hal.testing.guarded import (
    GUARDED_CONFIG,
    GUARDED_DSPARK_CONFIG,
    malformed_batch,
    metadata_differences,
    reference_builder,
)
from swa_hal.validation import validate_batch

BACKENDS = list(BACKEND_PLATFORMS)
CFG = SWAConfig(
    window_size=4, block_size=4, max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256, num_kv_blocks=64
)
TABLE = [[1, 2, 3, 4], [5, 6, 7, 8]]


def build_and_check(backend: str, batch: AttentionBatch):
    builder = make_builder(CFG, backend)
    md = builder.build(batch)
    try:
        builder.check()
    except E.BatchValidationError as e:
        return md, e
    return md, None


def with_(batch: AttentionBatch, **fields) -> AttentionBatch:
    return dataclasses.replace(batch, **fields)


def set_(t: torch.Tensor, i: int, v: int) -> torch.Tensor:
    t = t.clone()
    t[i] = v
    return t


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_padding_row_with_a_slot_is_emptied_and_recorded(backend):
    # Two decodes and one padding row (past query_start_loc[R] = 2) that holds slot 9: before rule 13 it
    # was handed request 0's window at position 6 (slots 7..10) and nothing was recorded.
    batch = AttentionBatch.from_lists([5, 6], [1, 1], TABLE, num_tokens=3, block_size=4)
    clean, _ = build_and_check(backend, batch)
    md, err = build_and_check(backend, with_(batch, slot_mapping=set_(batch.slot_mapping, 2, 9)))
    assert isinstance(err, E.BatchConsistencyError) and err.field == "slot_mapping" and err.index == 2
    assert md.decode_swa_lens[:3].tolist() == [4, 4, 0]
    assert (md.decode_swa_indices[2] == -1).all()
    # The real rows are the clean build's.
    assert torch.equal(md.decode_swa_indices[:2], clean.decode_swa_indices[:2])
    with pytest.raises(E.BatchConsistencyError, match="padding rows must be -1"):
        validate_batch(with_(batch, slot_mapping=set_(batch.slot_mapping, 2, 9)), CFG, 64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_device_offsets_that_disagree_with_the_host_copy_are_emptied_and_recorded(backend):
    # Host copy [0, 1, 2], device [0, 2, 2]: token 1 belongs to request 1 on the host and to request 0 on the
    # device, whose window it was handed. Request 0 is two tokens long on the device, more than
    # max_query_len = 1 admits.
    batch = AttentionBatch.from_lists([5, 6], [1, 1], TABLE, block_size=4)
    md, err = build_and_check(backend, with_(batch, query_start_loc=set_(batch.query_start_loc, 1, 2)))
    assert isinstance(err, E.BatchConsistencyError) and err.field == "query_start_loc" and err.index == 0
    assert md.decode_swa_lens[:2].tolist() == [0, 0]
    with pytest.raises(E.BatchConsistencyError, match="differs from its host copy"):
        validate_batch(with_(batch, query_start_loc=set_(batch.query_start_loc, 1, 2)), CFG, 64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_understated_max_query_len_empties_the_prefill_it_hid(backend):
    # A prefill of 6 tokens with max_query_len = 1: the host's split makes every request a decode, and the
    # prefill's six tokens used to get decode rows (and no gather length). Now request 1 breaks rule 14.
    batch = AttentionBatch.from_lists([5, 9], [1, 6], TABLE, block_size=4)
    md, err = build_and_check(backend, with_(batch, max_query_len=1))
    assert md.num_prefills == 0
    assert isinstance(err, E.BatchConsistencyError) and err.field == "query_start_loc" and err.index == 1
    assert "6 query tokens" in str(err)
    assert md.decode_swa_lens[:7].tolist() == [4, 0, 0, 0, 0, 0, 0]
    with pytest.raises(E.BatchConsistencyError, match="max_query_len=1"):
        validate_batch(with_(batch, max_query_len=1), CFG, 64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_prefill_that_starts_inside_the_decode_tokens_gets_gather_length_zero(backend):
    # Host copy [0, 1, 5] (a decode, then a prefill from token 1), device [0, 0, 4]: the prefill starts at
    # token 0, inside the decode part the host split off. Its rows are emptied wherever they fall and its
    # gather length is 0, as for every prefill that breaks a rule.
    batch = AttentionBatch.from_lists([5, 9], [1, 4], TABLE, block_size=4)
    device_qsl = torch.tensor([0, 0, 4], dtype=torch.int32)
    md, err = build_and_check(backend, with_(batch, query_start_loc=device_qsl))
    assert (md.num_decodes, md.num_prefills) == (1, 1)
    # Token 4 is now past query_start_loc[R] with a slot too: which of the two is recorded is not specified.
    assert isinstance(err, E.BatchConsistencyError) and err.field in ("query_start_loc", "slot_mapping")
    assert md.prefill_gather_lens.tolist() == [0]
    assert md.decode_swa_lens[:1].tolist() == [0] and md.prefill_swa_lens[:4].tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_draft_update_names_the_offsets_of_a_prefill_that_starts_inside_the_decode_tokens(backend, groups):
    # A decode (q = 2, MTP) and a prefill built from valid offsets [0, 2, 6]; before the draft step the engine's
    # device offsets become [0, 1, 6]: the prefill starts at token 1, inside the decode part. The update's decode
    # row 1 is the prefill's (the build had prefills: its decode part holds no padding), so the record is rule 14
    # of request 1 on query_start_loc (its 5 query tokens), never rule 13 of a padding row on slot_mapping.
    config = dataclasses.replace(GROUPED_CFG, num_speculative_tokens=1, speculative_method="mtp")
    batch = AttentionBatch.from_lists([6, 9], [2, 4], TABLE, block_size=4)
    builder = make_builder(config, backend)
    if groups == 1:
        built = [builder.build(batch)]
    else:
        built = builder.build_groups(batch, [batch.block_table] * 3, [batch.slot_mapping] * 3)
    builder.check()
    assert (built[0].num_decodes, built[0].num_decode_tokens) == (1, 2)
    batch.query_start_loc[1] = 1
    builder.update_draft_decode_metadata(built if groups > 1 else built[0])
    for md in built:
        assert md.decode_swa_lens.tolist() == [4, 0]
    prefix = r"^group \d: " if groups > 1 else "^"
    with pytest.raises(E.BatchConsistencyError, match=prefix + "request 1: its 5 query tokens on the device") as info:
        builder.check()
    assert info.value.field == "query_start_loc" and info.value.index == 1


def test_valid_batches_never_break_the_host_rules():
    # Rules 13 and 14 admit every valid batch: padded, decode-only with max_query_len overstated, mixed.
    for batch in (
        AttentionBatch.from_lists([5, 9], [1, 4], TABLE, num_tokens=8, block_size=4),
        dataclasses.replace(AttentionBatch.from_lists([5, 6], [1, 1], TABLE, block_size=4), max_query_len=7),
        AttentionBatch.from_lists([9, 9], [4, 4], TABLE, block_size=4),
    ):
        validate_batch(batch, CFG, 64)
        for backend in BACKENDS:
            _, err = build_and_check(backend, batch)
            assert err is None, (backend, err)


def test_the_malformed_batches_draw_the_host_classes():
    # The kit's malformed batches (swa_hal.testing.guarded, which the guarded topic and the long fuzz use)
    # reach both rules: padding rows with slots, and offsets the host's split does not admit.
    ref = reference_builder(GUARDED_CONFIG)
    fields = []
    rng = random.Random(5)
    for _ in range(150):
        batch = malformed_batch(rng)
        try:
            ref.build(batch, validate=False)
            ref.check()
        except E.BatchConsistencyError as e:
            fields.append(e.field)
        except E.SWAHalError:
            pass
    assert fields.count("slot_mapping") >= 3 and fields.count("query_start_loc") >= 3, fields


@pytest.mark.parametrize("backend", swept(b for b in BACKENDS if b != "torch"))
def test_host_classes_equal_the_reference_on_every_backend(backend):
    ref = reference_builder(GUARDED_CONFIG)
    builder = make_builder(GUARDED_CONFIG, backend)
    rng = random.Random(11)
    seen = 0
    for _ in range(25):
        batch = malformed_batch(rng)
        try:
            want = ref.build(batch, validate=False)
        except E.SWAHalError:
            continue
        got = builder.build(batch, validate=False)
        assert metadata_differences(got, want) == [], batch
        try:
            ref.check()
            want_err = None
        except E.BatchValidationError as e:
            want_err = e
        try:
            builder.check()
            got_err = None
        except E.BatchValidationError as e:
            got_err = e
        assert (got_err is None) == (want_err is None)
        seen += isinstance(want_err, E.BatchConsistencyError)
    assert seen >= 2


def test_from_lists_refuses_a_table_row_shorter_than_its_pages():
    # Request 1 (S=9, B=4) needs pages 0..2; its row holds two. The slots used to be derived from the -1
    # padding (negative slots), whose rows a guarded build emptied while the prefill kept its gather length.
    with pytest.raises(E.BatchCapacityError, match=r"block_table\[1, 2\]=-1") as info:
        AttentionBatch.from_lists([6, 9], [1, 5], [[1, 2, 5], [3, 4]], block_size=4)
    assert info.value.field == "block_table" and info.value.index == 1
    with pytest.raises(E.BatchCapacityError, match=r"block_table\[0, 0\]=-3"):
        AttentionBatch.from_lists([2], [2], [[-3]], block_size=4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(2, 0), (0, 8), (0, 0)])
def test_token_slot_rows_over_an_empty_table_are_refused_by_shape(backend, shape):
    # Over an empty req_to_token the torch backend handed out lens over rows of -1 and the SM12x kernel's
    # clamped lanes had no address inside the tensor to keep to: the preflight refuses it by shape.
    from swa_hal.slot_rows import SlotRows

    i32 = torch.int32
    rows = SlotRows(
        row_ends=torch.tensor([3, 5], dtype=i32),
        pools=torch.tensor([0, 1], dtype=i32),
        req_to_token=torch.zeros(shape, dtype=i32),
        slot_map=torch.arange(16, dtype=i32),
    )
    with pytest.raises(E.BatchShapeError, match=r"req_to_token has shape") as info:
        make_builder(CFG, backend).build_slot_rows(rows)
    assert info.value.field == "req_to_token"
    empty_map = dataclasses.replace(
        rows, req_to_token=torch.zeros((2, 8), dtype=i32), slot_map=torch.zeros(0, dtype=i32)
    )
    with pytest.raises(E.BatchShapeError, match="slot_map is empty"):
        make_builder(CFG, backend).build_slot_rows(empty_map)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("host", "error", "match"),
    [
        ([1, 2, 6], E.BatchOrderError, r"query_start_loc_cpu\[0\]=1"),  # no decode request, a decode part of 1
        ([0, -5, 6], E.BatchRangeError, "decode part's end at -5"),  # a negative part
    ],
)
def test_a_host_copy_the_split_cannot_use_is_refused(backend, host, error, match):
    # The split takes the decode part's end from the host copy: a copy that does not start at 0 or puts
    # that end outside the batch would give the kernels a negative or oversized part (and a draft update
    # of no request over decode rows). Refused on the host, by name, before any launch.
    batch = AttentionBatch.from_lists([5, 9], [1, 5], TABLE, block_size=4)
    bad = with_(batch, query_start_loc_cpu=torch.tensor(host, dtype=torch.int32))
    with pytest.raises(error, match=match) as info:
        make_builder(CFG, backend).build(bad)
    assert info.value.field == "query_start_loc_cpu"


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "torch"])
def test_a_dspark_steps_prefill_is_held_to_its_replay_bound_on_every_backend(backend):
    # A DSpark step (causal=False) whose prefill has replay_start past its prefix: the kernels' prefill and
    # gather programs refused and recorded it, while the torch build skipped rule 3 for the whole step (its
    # decode rows ignore the bound) and built the prefill's rows and gather length from the bad bound.
    # Requests: a DSpark decode (q = 4) and a prefill (q = 5, S = 9: prefix 4) with replay_start 7.
    config = GUARDED_DSPARK_CONFIG
    batch = AttentionBatch.from_lists(
        [12, 9], [4, 5], [[1, 2, 3], [4, 5, 6]], block_size=4, causal=False, replay_start=[0, 7]
    )
    ref, builder = reference_builder(config), make_builder(config, backend)
    want = ref.build(batch, validate=False)
    got = builder.build(batch, validate=False)
    assert metadata_differences(got, want) == []
    assert want.prefill_gather_lens.tolist() == [0] and want.prefill_swa_lens[:5].tolist() == [0] * 5
    assert want.decode_swa_lens[:4].tolist() != [0] * 4  # the decode's rows ignore the bound
    for b in (ref, builder):
        with pytest.raises(E.BatchRangeError, match=r"replay_start\[1\]=7"):
            b.check()


@pytest.mark.parametrize("backend", swept(b for b in BACKENDS if b != "torch"))
def test_the_dspark_malformed_batches_agree_on_every_backend(backend):
    ref = reference_builder(GUARDED_DSPARK_CONFIG)
    builders = [make_builder(GUARDED_DSPARK_CONFIG, backend)]
    rng = random.Random(1)
    noncausal = 0
    for _ in range(40):
        batch = malformed_batch(rng, GUARDED_DSPARK_CONFIG)
        noncausal += not batch.causal
        try:
            want = ref.build(batch, validate=False)
        except E.SWAHalError as e:
            for b in builders:
                with pytest.raises(type(e)):
                    b.build(batch, validate=False)
            continue
        for b in builders:
            assert metadata_differences(b.build(batch, validate=False), want) == [], batch
    assert noncausal >= 10


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dspark_decode_with_an_inverted_span_is_emptied_on_every_backend(backend):
    # Rule 4 holds for every request, decodes included. A DSpark step's (non-causal) decode rows skipped the
    # span check in the kernels and kept their rows, while the torch build emptied them; both now empty and
    # record them, and hand out zero visibility for decode rows as causal decodes do.
    from swa_hal import ImageSpans

    config = GUARDED_DSPARK_CONFIG
    i32 = torch.int32
    table = [[18, 5, 10, 15, 11, 22, 14, 10, 20, 21], [18, 13, 8, 12, 17, 0, 23, 20, 11, 6]]
    batch = AttentionBatch.from_lists([4, 40], [2, 6], table, block_size=4)
    spans = ImageSpans(torch.tensor([0, 1, 1], dtype=i32), torch.tensor([30], dtype=i32), torch.tensor([18], dtype=i32))
    batch = with_(batch, causal=False, image_spans=spans)
    ref, builder = reference_builder(config), make_builder(config, backend)
    want = ref.build(batch, validate=False)
    got = builder.build(batch, validate=False)
    assert metadata_differences(got, want) == []
    assert got.decode_swa_lens[:2].tolist() == [0, 0]
    for b in (ref, builder):
        with pytest.raises(E.BatchRangeError, match=r"image_spans\[0\]"):
            b.check()


GROUPED_CFG = dataclasses.replace(CFG, num_kv_groups=3)


@pytest.mark.parametrize("backend", swept(BACKENDS))
@pytest.mark.parametrize("broken", [0, 2])
def test_a_violation_in_a_group_build_names_its_group(backend, broken):
    """Only one group's table holds a block id past the cache: check() raises the block rule naming that
    group, and names the engine's number for it where the builder was told how the engine numbers its
    groups; a plain build's violation names no group."""
    batch = AttentionBatch.from_lists([6, 9], [1, 5], TABLE, block_size=4)
    good = batch.block_table
    bad = good.clone()
    bad[1, 1] = CFG.num_kv_blocks + 3
    tables = [bad if g == broken else good for g in range(3)]
    builder = make_builder(GROUPED_CFG, backend)
    builder.build_groups(batch, tables, [batch.slot_mapping] * 3)
    with pytest.raises(E.BatchRangeError, match=rf"^group {broken}: block_table: request 1's window reads block id 67"):
        builder.check()
    builder.violations.group_names = (4, 5, 7)  # the engine's KV-cache groups, as a step plan numbers them
    builder.build_groups(batch, tables, [batch.slot_mapping] * 3)
    with pytest.raises(E.BatchRangeError, match=rf"^KV-cache group {(4, 5, 7)[broken]}: block_table: request 1's"):
        builder.check()
    builder.build(with_(batch, block_table=bad))
    with pytest.raises(E.BatchRangeError, match=r"^block_table: request 1's window reads block id 67"):
        builder.check()


# -- rules 15, 16 and 17 (docs/semantics.md #guarded-builds): the host seq_lens a plan reads, max_model_len and
# the page size of the block table, which only full validation named before.


def raises_naming(expect: tuple[type[E.BatchValidationError], tuple[str, int], str], call) -> None:
    """``call()`` raises ``expect``'s error, naming its (field, index), with a message matching its pattern:
    what full validation raises on the build and ``check()`` after a guarded one."""
    error, where, match = expect
    with pytest.raises(error, match=match) as info:
        call()
    assert (info.value.field, info.value.index) == where


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("validate", [False, True])
def test_a_prefills_host_seq_len_that_disagrees_with_the_device_is_recorded(backend, validate):
    # A decode (S=5) and a prefill (S=9, q=5) whose host copy says 12: the chunk plan and prefill_seq_lens_cpu
    # read the host copy, so the prefill used to be planned as 12 tokens long while its rows were built for 9.
    batch = AttentionBatch.from_lists([5, 9], [1, 5], TABLE, block_size=4)
    bad = with_(batch, seq_lens_cpu=set_(batch.seq_lens_cpu, 1, 12))
    builder = make_builder(CFG, backend)
    expect = E.BatchConsistencyError, ("seq_lens_cpu", 1), r"^seq_lens_cpu\[1\]=12 differs from seq_lens\[1\]"
    if validate:
        raises_naming(expect, lambda: builder.build(bad, validate=True))
        return
    clean = builder.build(batch)
    clean_rows = clean.decode_swa_indices[:1].clone()
    builder.check()
    md = builder.build(bad)
    assert md.prefill_gather_lens.tolist() == [0]
    assert md.prefill_swa_lens[:5].tolist() == [0] * 5 and (md.prefill_swa_indices[:5] == -1).all()
    assert torch.equal(md.decode_swa_indices[:1], clean_rows)  # the decode is not the host copy's business
    raises_naming(expect, builder.check)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_decodes_host_seq_len_is_an_upper_bound_and_not_compared(backend):
    # A decode's host copy may overstate its length (docs/semantics.md #inputs): valid, and nothing is recorded.
    batch = AttentionBatch.from_lists([5, 9], [1, 5], TABLE, block_size=4)
    over = with_(batch, seq_lens_cpu=set_(batch.seq_lens_cpu, 0, 8))
    validate_batch(over, CFG, 64)
    builder = make_builder(CFG, backend)
    md = builder.build(over)
    builder.check()
    assert md.decode_swa_lens[:1].tolist() == [4] and md.prefill_gather_lens.tolist() == [8]


MODEL_LEN_CFG = dataclasses.replace(CFG, max_model_len=16)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("validate", [False, True])
def test_a_seq_len_past_max_model_len_is_recorded(backend, validate):
    # Request 1 (S=18) is two tokens past max_model_len=16; its table row holds its pages, so no other rule
    # saw it and its rows used to be handed out.
    batch = AttentionBatch.from_lists([5, 18], [1, 1], [[1, 2, 3, 4, 9], [5, 6, 7, 8, 10]], block_size=4)
    builder = make_builder(MODEL_LEN_CFG, backend)
    expect = E.BatchCapacityError, ("seq_lens", 1), r"^seq_lens\[1\]=18 exceeds max_model_len=16"
    if validate:
        raises_naming(expect, lambda: builder.build(batch, validate=True))
        return
    md = builder.build(batch)
    assert md.decode_swa_lens[:2].tolist() == [4, 0] and (md.decode_swa_indices[1] == -1).all()
    raises_naming(expect, builder.check)


def table_for_page_size(page_size: int) -> AttentionBatch:
    """A decode (S=6) and a prefill (S=9, q=5) whose table and slot mapping are made for ``page_size``, in a
    table wide enough that no window reads past it (rule 5 cannot see it)."""
    return AttentionBatch.from_lists(
        [6, 9], [1, 5], [[1, 2, 3, 11, 12, 13], [4, 5, 6, 14, 15, 16]], block_size=page_size
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", [2, 8])
@pytest.mark.parametrize("validate", [False, True])
def test_a_table_made_for_another_page_size_is_recorded(backend, page_size, validate):
    batch = table_for_page_size(page_size)  # CFG's pages hold 4 tokens
    builder = make_builder(CFG, backend)
    if validate:
        raises_naming(
            (E.BatchConsistencyError, ("slot_mapping", 0), r"^slot_mapping\[0\]="),
            lambda: builder.build(batch, validate=True),
        )
        return
    md = builder.build(batch)
    # Every row's own slot disagrees with its slot mapping: recorded, and every row is still the one its table
    # and seq_lens give (inside the cache), the reference's: the engine's answer, not an emptied one.
    rows = build_reference(CFG, batch)
    assert md.decode_swa_lens.tolist() == rows.decode_lens.tolist() == [4]
    assert md.prefill_swa_lens.tolist() == rows.prefill_lens.tolist() == [4, 4, 4, 4, 4]
    assert torch.equal(md.decode_swa_indices, rows.decode_indices)
    assert torch.equal(md.prefill_swa_indices, rows.prefill_indices)
    with pytest.raises(E.BatchConsistencyError, match=r"block_size=4\): a block table made for another page size"):
        builder.check()
    want = reference_builder(CFG).build(batch)
    assert metadata_differences(md, want) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_torch_build_records_the_first_row_whose_slot_is_not_its_own(backend):
    # Only token 3 (request 1's third token, position 6) holds another slot: the row is recorded, by the torch
    # backend and by every other (which row a kernel records first is unspecified: one row), and keeps the
    # rows its table gives (docs/semantics.md #guarded-builds: rule 17 empties nothing).
    batch = table_for_page_size(4)
    bad = with_(batch, slot_mapping=set_(batch.slot_mapping, 3, 7))
    builder = make_builder(CFG, backend)
    clean = builder.build(batch)
    clean_rows, clean_lens = clean.prefill_swa_indices.clone(), clean.prefill_swa_lens.tolist()
    md = builder.build(bad)
    assert md.prefill_swa_lens.tolist() == clean_lens == [4, 4, 4, 4, 4]
    assert torch.equal(md.prefill_swa_indices, clean_rows)
    expect = (
        E.BatchConsistencyError,
        ("slot_mapping", 3),
        r"^slot_mapping\[3\] is not the slot block_table gives request 1",
    )
    raises_naming(expect, builder.check)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_group_whose_table_is_made_for_another_page_size_is_named(backend):
    # Group 1's table and slot mapping are made for pages of 8 tokens (the same block ids, other slots).
    batch = table_for_page_size(4)
    other = table_for_page_size(8)
    builder = make_builder(GROUPED_CFG, backend)
    builder.build_groups(batch, [batch.block_table] * 3, [batch.slot_mapping, other.slot_mapping, batch.slot_mapping])
    with pytest.raises(E.BatchConsistencyError, match=r"^group 1: slot_mapping\["):
        builder.check()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_draft_update_does_not_hold_the_slot_mapping_to_the_advanced_positions(backend):
    # Rule 17 is a build's: a draft step that advances seq_lens and hands the update the build's slot mapping
    # (as an engine may) records nothing.
    batch = AttentionBatch.from_lists([5, 6], [1, 1], TABLE, block_size=4)
    builder = make_builder(CFG, backend)
    md = builder.build(batch)
    batch.seq_lens.add_(1)
    builder.update_draft_decode_metadata(md)
    builder.check()
    assert md.decode_swa_lens[:2].tolist() == [4, 4]
