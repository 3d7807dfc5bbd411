"""Guarded builds and the default path's safety (docs/semantics.md #guarded-builds): with validation
off, malformed input gives a typed error or output whose every index is -1 or inside the KV cache;
``check()`` raises what full validation would have raised."""

from __future__ import annotations

import dataclasses
import random
import re
import threading

import pytest
import torch
from helpers import BACKEND_PLATFORMS, TRITON_BACKENDS, assert_check_names, fuzz_settings, make_builder, swept
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from swa_hal import AttentionBatch, ImageSpans, SWAConfig
from swa_hal import errors as E
from swa_hal.rules import Violation, block_limit
from swa_hal.slot_rows import slot_limit
from swa_hal.testing.guarded import (
    GUARDED_CONFIG,
    attempt,
    batch_summary,
    guarded_slot_rows_config,
    make_batch,
    malformed_slot_rows,
    metadata_differences,
    recorded,
)
from swa_hal.testing.interpreter import address_strict
from swa_hal.validation import validate_batch

BACKENDS = list(BACKEND_PLATFORMS)
# SM12x's guarded output is held in make test by the kit's guarded topics (tests/test_conformance_builtin.py); its
# runs of the longer guarded fuzzes below (the kernels' logic as cuda's, clamped) are a sweep.
SM12X_FUZZ = ("sm12x",)
CFG = SWAConfig(
    window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=32, max_num_seqs=6,
    num_speculative_tokens=1, speculative_method="mtp", num_kv_blocks=16, max_image_tokens=4,
)


def base() -> AttentionBatch:
    """A decode (S=6, q=1) and a prefill (S=9, q=5; new positions 4..8)."""
    return AttentionBatch.from_lists([6, 9], [1, 5], [[1, 2], [3, 4, 5]], block_size=4)


def set_(t: torch.Tensor, i, v) -> torch.Tensor:
    t = t.clone()
    t[i] = v
    return t


def spans(indptr, starts, ends) -> ImageSpans:
    t = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    return ImageSpans(t(indptr), t(starts), t(ends))


# kind, the malformed batch, the error full validation raises (type, field)
MALFORMED = [
    (
        "block id past the cache",
        lambda b: dataclasses.replace(b, block_table=set_(b.block_table, (1, 1), 16)),
        E.BatchRangeError,
        "block_table",
    ),
    (
        "negative block id",
        lambda b: dataclasses.replace(b, block_table=set_(b.block_table, (0, 1), -3)),
        E.BatchRangeError,
        "block_table",
    ),
    (
        "seq_len shorter than its query",
        lambda b: dataclasses.replace(b, seq_lens=set_(b.seq_lens, 1, 3)),
        E.BatchRangeError,
        "seq_lens",
    ),
    (
        "replay bound past the prefix",
        lambda b: dataclasses.replace(b, replay_start=torch.tensor([0, 7], dtype=torch.int32)),
        E.BatchRangeError,
        "replay_start",
    ),
    (
        "inverted image span",
        lambda b: dataclasses.replace(b, image_spans=spans([0, 0, 1], [7], [5])),
        E.BatchRangeError,
        "image_spans",
    ),
    (
        "window past the block table",
        lambda b: dataclasses.replace(b, block_table=b.block_table[:, :2].contiguous()),
        E.BatchCapacityError,
        "block_table",
    ),
]


def assert_inside_cache(md, config: SWAConfig) -> None:
    slots = (
        config.num_kv_blocks * config.block_size if config.num_kv_blocks else block_limit(config) * config.block_size
    )
    for name in ("decode_swa_indices", "prefill_swa_indices"):
        rows = getattr(md, name)
        if rows is None:
            continue
        bad = (rows != -1) & ((rows < 0) | (rows >= slots))
        assert not bool(bad.any()), f"{name} hands out a slot outside the KV cache: {rows[bad][:4].tolist()}"
    for lens, width in ((md.decode_swa_lens, md.decode_swa_width), (md.prefill_swa_lens, config.prefill_index_width)):
        if lens is not None:
            assert bool(((lens >= 0) & (lens <= width)).all())


@pytest.mark.parametrize("backend", swept(BACKENDS))
@pytest.mark.parametrize("kind, make, exc, field", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_guarded_build_empties_the_rows_and_check_raises_what_validation_raises(backend, kind, make, exc, field):
    bad = make(base())
    with pytest.raises(exc) as validated:
        validate_batch(bad, CFG)
    assert validated.value.field.split("[")[0] == field
    builder = make_builder(CFG, backend)  # guarded by default
    strict = address_strict() if backend == "sm12x" else _null()
    with strict:
        md = builder.build(bad, validate=False)
    assert_inside_cache(md, CFG)
    with pytest.raises(exc) as checked:
        builder.check()
    assert checked.value.field == field and "guarded build" in str(checked.value)
    builder.check()  # the record was cleared: nothing to raise now
    # The same builder then builds a good batch exactly.
    good = builder.build(base())
    assert good.decode_swa_lens.tolist() == [4] and good.prefill_swa_lens.tolist() == [4, 4, 4, 4, 4]
    builder.check()


@pytest.mark.parametrize("backend", BACKENDS)
def test_several_broken_rows_record_one_of_them(backend):
    """Two rules broken by two requests in one build: both requests' rows are emptied, the record holds one
    of the two violations (which one is not specified: the kernels' rows record with per-row atomics), and
    one check() raises it and clears the record."""
    b = base()
    bad = dataclasses.replace(b, block_table=set_(b.block_table, (0, 1), 16), seq_lens=set_(b.seq_lens, 1, 3))
    builder = make_builder(CFG, backend)
    md = builder.build(bad, validate=False)
    assert md.decode_swa_lens.tolist() == [0] and md.prefill_swa_lens.tolist() == [0] * 5
    assert builder.buffers.violation[0].item() > 0
    with pytest.raises(E.BatchRangeError) as checked:
        builder.check()
    assert checked.value.field in ("block_table", "seq_lens")
    assert builder.buffers.violation.tolist() == [0, 0, 0, 0, 0]
    builder.check()


def test_the_torch_build_records_the_lowest_request():
    """docs/semantics.md #guarded-builds: with several broken requests the torch build records the lowest
    one, its request-level rule before its rows' (here request 0's block id, not request 1's seq_len)."""
    b = base()
    bad = dataclasses.replace(b, block_table=set_(b.block_table, (0, 1), 16), seq_lens=set_(b.seq_lens, 1, 3))
    builder = make_builder(CFG, "torch")
    builder.build(bad, validate=False)
    count, kind, request, value, group = builder.buffers.violation.tolist()
    assert count > 0 and (kind, request, value, group) == (6, 0, 16, 0)
    # A later build with another broken request leaves the first violation recorded.
    builder.build(dataclasses.replace(b, seq_lens=set_(b.seq_lens, 1, 3)), validate=False)
    assert builder.buffers.violation.tolist()[1:] == [6, 0, 16, 0]
    with pytest.raises(E.BatchRangeError, match="block id 16"):
        builder.check()


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_id_that_would_overflow_int32_slots_is_caught_without_num_kv_blocks(backend):
    config = dataclasses.replace(CFG, num_kv_blocks=None)
    bad = dataclasses.replace(base(), block_table=set_(base().block_table, (0, 1), 2**29))
    builder = make_builder(config, backend)
    md = builder.build(bad)
    assert md.decode_swa_lens.tolist() == [0] and bool((md.decode_swa_indices == -1).all())
    with pytest.raises(E.BatchRangeError, match=r"block id 536870912, outside \[0, 536870912\)"):
        builder.check()


@pytest.mark.parametrize("backend", BACKENDS)
def test_unguarded_builds_record_nothing(backend):
    bad = dataclasses.replace(base(), seq_lens=set_(base().seq_lens, 1, 3))
    builder = make_builder(CFG, backend, guard=False)
    builder.build(bad)
    builder.check()  # nothing recorded, nothing raised
    assert builder.buffers.violation.tolist() == [0, 0, 0, 0, 0]


def test_guard_follows_the_environment(monkeypatch):
    monkeypatch.setenv("SWA_HAL_GUARD", "0")
    assert make_builder(CFG, "torch").guard is False
    monkeypatch.setenv("SWA_HAL_GUARD", "1")
    assert make_builder(CFG, "torch").guard is True


# -- the O(1) host preflight ----------------------------------------------------------------------------------


def on_meta(t: torch.Tensor | None) -> torch.Tensor:
    """A tensor of ``t``'s shape and dtype on the meta device (no data), zeros of int32 [2] for None."""
    if t is None:
        return torch.empty(2, dtype=torch.int32, device="meta")
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def cut(field: str, n: int):
    """A batch edit: ``field`` cut to its first ``n`` entries."""
    return lambda b: dataclasses.replace(b, **{field: getattr(b, field)[:n]})


HOST = [
    (
        "strided seq_lens",
        lambda b: dataclasses.replace(b, seq_lens=torch.tensor([6, 0, 9, 0], dtype=torch.int32)[::2]),
        E.BatchShapeError,
        r"^seq_lens must be contiguous",
    ),
    (
        "expanded query_start_loc",
        lambda b: dataclasses.replace(b, query_start_loc=torch.tensor([0], dtype=torch.int32).expand(3)),
        E.BatchShapeError,
        r"^query_start_loc must be contiguous",
    ),
    ("short seq_lens", cut("seq_lens", 1), E.BatchShapeError, r"^seq_lens has 1 entries for 2 requests"),
    ("short block table", cut("block_table", 1), E.BatchShapeError, r"^block_table \(1, 3\) has too few rows"),
    ("query_start_loc length", cut("query_start_loc", 2), E.BatchShapeError, r"^query_start_loc has 2 entries; query_start_loc_cpu has 3"),
    ("slot_mapping length", cut("slot_mapping", 3), E.BatchShapeError, r"^slot_mapping has 3 entries; num_tokens is 6"),
    (
        "column-strided block table",
        lambda b: dataclasses.replace(b, block_table=b.block_table.t().contiguous().t()),
        E.BatchShapeError,
        r"^block_table must be contiguous",
    ),
    (
        "num_tokens not an int",
        lambda b: dataclasses.replace(b, num_tokens=6.0),
        E.BatchDtypeError,
        r"^num_tokens must be an int",
    ),
    (
        "max_query_len out of range",
        lambda b: dataclasses.replace(b, max_query_len=10**6),
        E.BatchDtypeError,
        r"^max_query_len must be an int in \[0, 32\]",
    ),
    ("causal not a bool", lambda b: dataclasses.replace(b, causal=1), E.BatchDtypeError, r"^causal must be a bool"),
    (
        "replay_start dtype",
        lambda b: dataclasses.replace(b, replay_start=torch.zeros(2, dtype=torch.int64)),
        E.BatchDtypeError,
        r"^replay_start has dtype torch.int64",
    ),
    (
        "short span indptr",
        lambda b: dataclasses.replace(b, image_spans=spans([0, 0], [], [])),
        E.BatchShapeError,
        r"^image_spans.indptr has 2 entries",
    ),
] + [
    # get_device() is -1 for meta tensors as for the CPU; a meta tensor has no data (swa_hal/preflight.py META).
    (
        f"meta {field}",
        lambda b, field=field: dataclasses.replace(b, **{field: on_meta(getattr(b, field))}),
        E.BatchDeviceError,
        rf"^{field} is on meta; the builder's device index is -1",
    )
    for field in ("seq_lens", "query_start_loc", "block_table", "slot_mapping", "replay_start")
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind, make, exc, message", HOST, ids=[h[0] for h in HOST])
def test_host_guard_refuses_before_any_launch(backend, kind, make, exc, message):
    builder = make_builder(CFG, backend)
    with pytest.raises(exc, match=message):
        builder.build(make(base()), validate=False)


@pytest.mark.parametrize("backend", ["torch", "cuda"])
@pytest.mark.parametrize("form", ["listed", "mixed", "stacked"])
def test_group_builds_refuse_meta_tensors_on_a_cpu_builder(backend, form):
    builder = make_builder(dataclasses.replace(CFG, num_kv_groups=2), backend)
    b = base()
    tables, slots = [b.block_table, on_meta(b.block_table)], [b.slot_mapping, b.slot_mapping]
    field = "block_tables[1]"
    if form == "mixed":
        tables, slots, field = [b.block_table] * 2, on_meta(torch.stack([b.slot_mapping] * 2)), "slot_mappings"
    elif form == "stacked":
        tables, slots, field = on_meta(torch.stack([b.block_table] * 2)), torch.stack([b.slot_mapping] * 2), "block_tables"
    with pytest.raises(E.BatchDeviceError, match=rf"^{re.escape(field)} is on meta"):
        builder.build_groups(b, tables, slots)


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_draft_updates_are_guarded_too(backend):
    builder = make_builder(CFG, backend)
    batch = AttentionBatch.from_lists([6, 7], [1, 1], [[1, 2], [3, 4]], block_size=4)
    md = builder.build(batch)
    md.replay_start = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(E.BatchDtypeError, match="^replay_start has dtype torch.int64"):
        builder.update_draft_decode_metadata(md)


def test_more_prefills_than_token_rows_stay_inside_the_gather_buffer():
    # max_num_batched_tokens < max_num_seqs, and more prefills (short ones after the first long one,
    # zero-token ones too) than token rows: the gather-lens buffer holds one entry per admitted request.
    config = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=4, max_num_seqs=8)
    batch = AttentionBatch.from_lists(
        [4, 1, 1, 0, 0, 0], [2, 1, 1, 0, 0, 0], [[1], [2], [3], [4], [5], [6]], block_size=4
    )
    validate_batch(batch, config)
    for backend in BACKENDS:
        builder = make_builder(config, backend)
        md = builder.build(batch)
        assert md.num_prefills == 6 and md.prefill_gather_lens.tolist() == [4, 1, 1, 0, 0, 0]
        assert builder.buffers.gather_lens.shape[0] == 8


# -- threads ----------------------------------------------------------------------------------------------


def test_one_builder_entered_from_two_threads_raises():
    builder = make_builder(CFG, "torch")
    errors: list[BaseException] = []
    builder._lock.lock.acquire()  # a build is running on another thread
    try:
        thread = threading.Thread(target=lambda: _catch(errors, lambda: builder.build(base())))
        thread.start()
        thread.join()
    finally:
        builder._lock.lock.release()
    assert len(errors) == 1 and isinstance(errors[0], E.ConcurrentBuildError)
    assert "one build at a time" in str(errors[0])
    assert builder.build(base()).decode_swa_lens.tolist() == [4]  # usable again afterwards


def test_one_builder_per_thread_builds_correctly():
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        builder = make_builder(CFG, "torch")
        for _ in range(20):
            results[i] = builder.build(base()).prefill_swa_lens.tolist()

    threads = [threading.Thread(target=lambda i=i: _catch(errors, lambda: work(i))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(v == [4, 4, 4, 4, 4] for v in results.values()) and len(results) == 4


def test_torch_builds_run_on_one_thread_and_restore_the_callers_count():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Threads(TorchDispatchMode):
        seen: set[int] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.add(torch.get_num_threads())
            return func(*args, **(kwargs or {}))

    builder = make_builder(CFG, "torch")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        spy = Threads()
        with spy:
            builder.build(base())
        assert torch.get_num_threads() == 2
        assert 1 in spy.seen
    finally:
        torch.set_num_threads(before)


def _catch(errors: list[BaseException], fn) -> None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        errors.append(exc)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# -- fuzzing the default path ------------------------------------------------------------------------------

# The kit's guarded-output geometry (swa_hal.testing.guarded), one KV-cache group.
FUZZ = dataclasses.replace(GUARDED_CONFIG, num_kv_groups=1)


@st.composite
def malformed_batches(draw):
    """Structurally plausible batches (they pass the host preflight) with malformed values: decreasing
    offsets, short sequences, out-of-range block ids, bad replay bounds and spans, requests without query
    tokens, tokens without slots."""
    num_reqs = draw(st.integers(1, 5))
    queries = draw(st.lists(st.integers(0, 7), min_size=num_reqs, max_size=num_reqs))
    qsl = [0]
    for q in queries:
        qsl.append(qsl[-1] + q)
    if draw(st.booleans()):  # break monotonicity somewhere
        i = draw(st.integers(1, num_reqs))
        qsl[i] = max(0, qsl[i] - draw(st.integers(1, 9)))
    num_tokens = max(1, max(qsl)) + draw(st.integers(0, 3))
    seqs = [max(0, q + draw(st.integers(-3, 40))) for q in queries]
    width = draw(st.integers(1, 12))
    table = [[draw(st.integers(-2, 30)) for _ in range(width)] for _ in range(num_reqs)]
    slots = [draw(st.integers(-1, 90)) for _ in range(num_tokens)]
    replay = [draw(st.integers(-2, 45)) for _ in range(num_reqs)] if draw(st.booleans()) else None
    n_spans = draw(st.integers(0, 3))
    # A CSR that can point past its spans or run backwards (the kernels must read only spans that exist).
    span_ptr = draw(st.lists(st.integers(0, n_spans + 3), min_size=num_reqs + 1, max_size=num_reqs + 1))
    if draw(st.booleans()):
        span_ptr = sorted(span_ptr)
        span_ptr[0] = 0
    starts = [draw(st.integers(-1, 45)) for _ in range(n_spans)]
    ends = [draw(st.integers(-1, 45)) for _ in range(n_spans)]
    t32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    qsl_t = t32(qsl)
    return AttentionBatch(
        seq_lens=t32(seqs),
        query_start_loc=qsl_t,
        query_start_loc_cpu=qsl_t.clone(),
        seq_lens_cpu=t32(seqs),
        block_table=t32(table),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        max_query_len=draw(st.integers(0, 8)),
        num_tokens=num_tokens,
        causal=True,
        replay_start=None if replay is None else t32(replay),
        image_spans=ImageSpans(t32(span_ptr), t32(starts), t32(ends)) if n_spans else None,
    )


BUILDERS: dict[str, object] = {}


@fuzz_settings()
@given(batch=malformed_batches(), backend=st.sampled_from(BACKENDS))
def test_fuzz_malformed_batches_on_the_default_path(batch, backend):
    builder = BUILDERS.get(backend) or BUILDERS.setdefault(backend, make_builder(FUZZ, backend))
    note(
        f"backend={backend} qsl={batch.query_start_loc.tolist()} seq={batch.seq_lens.tolist()} "
        f"table={batch.block_table.tolist()} replay={batch.replay_start}"
    )
    # Every lane in bounds on the clamping backend; every active lane on the others.
    with address_strict(active_only=backend != "sm12x"):
        try:
            md = builder.build(batch, validate=False)
        except E.BatchValidationError:
            return  # a typed error is an acceptable answer
    assert_inside_cache(md, FUZZ)
    try:
        builder.check()
    except E.BatchValidationError:
        pass


# -- guarded output equals the reference (docs/semantics.md #guarded-builds) ---------------------------------

GROUPED = GUARDED_CONFIG
PARITY = fuzz_settings(25, HealthCheck.differing_executors)
# A group example builds and updates three groups through the interpreter: a third of the examples keeps
# make test's time (SWA_HAL_FUZZ_EXAMPLES raises both).
GROUP_PARITY = settings(PARITY, max_examples=max(1, PARITY.max_examples // 3))
PAIRS: dict[tuple[str, str], tuple[object, object]] = {}


def pair(config: SWAConfig, backend: str, key: str):
    """A builder of ``backend`` and a torch builder of ``config``, reused across examples (their record is
    cleared by every comparison)."""
    found = PAIRS.get((key, backend))
    if found is None:
        found = PAIRS.setdefault((key, backend), (make_builder(config, backend), make_builder(config, "torch")))
    return found


def assert_same_guarded_output(got, want, what: str) -> None:
    problems = metadata_differences(got, want)
    assert not problems, f"{what}: " + "; ".join(problems)


def assert_same_record(builder, ref, what: str) -> None:
    """Both recorded a violation, or neither; then both records are cleared."""
    mine, theirs = recorded(builder), recorded(ref)
    said = {True: "recorded", False: "did not record"}
    assert mine == theirs, f"{what}: the backend {said[mine]} a violation, the reference {said[theirs]} one"


@pytest.mark.parametrize("backend", swept(TRITON_BACKENDS, also=SM12X_FUZZ))
@PARITY
@given(batch=malformed_batches(), steps=st.lists(st.integers(-4, 6), min_size=0, max_size=2))
def test_fuzz_guarded_builds_and_draft_updates_equal_the_reference(backend, batch, steps):
    builder, ref = pair(FUZZ, backend, "build")
    recorded(builder), recorded(ref)  # a failed example may have left a record
    note(batch_summary(batch))
    got, error = attempt(lambda: builder.build(batch, validate=False))
    want, want_error = attempt(lambda: ref.build(batch, validate=False))
    assert error == want_error
    if want is None:
        return
    assert_same_guarded_output(got, want, "build")
    assert_same_record(builder, ref, "build")
    for step, delta in enumerate(steps):  # draft steps: both metadata read the same seq_lens
        if not want.num_decodes:
            break
        batch.seq_lens[: want.num_decodes] += delta
        batch.seq_lens_cpu[: want.num_decodes] += delta
        got_error = attempt(lambda: builder.update_draft_decode_metadata(got))[1]
        assert got_error == attempt(lambda: ref.update_draft_decode_metadata(want))[1]
        assert_same_guarded_output(got, want, f"draft step {step + 1} (seq_lens += {delta})")
        assert_same_record(builder, ref, f"draft step {step + 1}")


@st.composite
def other_tables(draw, batch: AttentionBatch, groups: int):
    """``groups - 1`` more groups' tables (of their own widths, as malformed as the batch's) and slots."""
    num_reqs = batch.query_start_loc_cpu.shape[0] - 1
    tables, slots = [batch.block_table], [batch.slot_mapping]
    for _ in range(groups - 1):
        width = draw(st.integers(1, 12))
        rows = [[draw(st.integers(-2, 30)) for _ in range(width)] for _ in range(num_reqs)]
        tables.append(torch.tensor(rows, dtype=torch.int32))
        own = torch.tensor([draw(st.integers(0, 90)) for _ in range(batch.num_tokens)], dtype=torch.int64)
        slots.append(torch.where(batch.slot_mapping >= 0, own, -1))  # every group's invalid tokens are the same
    return tables, slots


@pytest.mark.parametrize("backend", swept(TRITON_BACKENDS, also=SM12X_FUZZ))
@GROUP_PARITY
@given(data=st.data())
def test_fuzz_guarded_group_builds_and_updates_equal_the_reference(backend, data):
    builder, ref = pair(GROUPED, backend, "groups")
    recorded(builder), recorded(ref)  # a failed example may have left a record
    batch = data.draw(malformed_batches())
    tables, slots = data.draw(other_tables(batch, GROUPED.num_kv_groups))
    note(batch_summary(batch) + f" tables={[t.tolist() for t in tables]}")
    got, error = attempt(lambda: builder.build_groups(batch, tables, slots, validate=False))
    want, want_error = attempt(lambda: ref.build_groups(batch, tables, slots, validate=False))
    assert error == want_error
    if want is None:
        return
    for g in range(len(want)):
        assert_same_guarded_output(got[g], want[g], f"group {g}")
    assert_same_record(builder, ref, "build_groups")
    if not want[0].num_decodes:
        return
    delta = data.draw(st.integers(-4, 6))
    batch.seq_lens[: want[0].num_decodes] += delta
    batch.seq_lens_cpu[: want[0].num_decodes] += delta
    got_error = attempt(lambda: builder.update_draft_decode_metadata(got))[1]
    assert got_error == attempt(lambda: ref.update_draft_decode_metadata(want))[1]
    for g in range(len(want)):
        assert_same_guarded_output(got[g], want[g], f"group {g} after a draft step (seq_lens += {delta})")
    assert_same_record(builder, ref, "grouped draft step")


@pytest.mark.parametrize("backend", swept(TRITON_BACKENDS))
@PARITY
@given(seed=st.integers(0, 2**32 - 1), window=st.sampled_from((4, 8, 20)))
def test_fuzz_guarded_slot_rows_equal_the_reference(backend, seed, window):
    config = guarded_slot_rows_config(window)
    builder, ref = pair(config, backend, f"slot-rows-{window}")
    recorded(builder), recorded(ref)  # a failed example may have left a record
    rows = malformed_slot_rows(random.Random(seed), window, slot_limit(config))
    got, error = attempt(lambda: builder.build_slot_rows(rows))
    want, want_error = attempt(lambda: ref.build_slot_rows(rows))
    assert error == want_error
    if want is None:
        return
    assert torch.equal(got[1], want[1]), f"lens: backend {got[1].tolist()}, reference {want[1].tolist()}"
    assert torch.equal(got[0], want[0]), f"rows: backend {got[0].tolist()}, reference {want[0].tolist()}"
    assert_same_record(builder, ref, "build_slot_rows")


# Each of these once differed between the kernels and the reference (the fix is named after the test).


def _pair(backend: str, config: SWAConfig = FUZZ):
    return make_builder(config, backend), make_builder(config, "torch")


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_a_prefill_whose_span_breaks_rule_4_gets_gather_length_0(backend):
    """The kernels' gather programs check rule 4 too (they handed this prefill a gather length of 9)."""
    # One prefill, S=21, q=5: new positions 16..20; the span 41..23 is inverted (a span that merely lies past the
    # new tokens is well formed: docs/semantics.md #vision-spans).
    batch = make_batch([0, 5], [21], [[14, 17, 9, 24, 0, 18]], [62, 71, 65, 4, 14], 6, 5, None, ([0, 1], [41], [23]))
    builder, ref = _pair(backend)
    md, want = builder.build(batch, validate=False), ref.build(batch, validate=False)
    assert want.prefill_gather_lens.tolist() == [0] and md.prefill_gather_lens.tolist() == [0]
    assert md.prefill_swa_lens.tolist() == [0] * 5
    assert metadata_differences(md, want) == []
    assert_check_names("image_spans", builder, ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_prefill_without_tokens_whose_span_breaks_rule_4_gathers_nothing_and_is_not_recorded(backend):
    """docs/semantics.md #guarded-builds: a broken request that owns no row with a slot records nothing. The
    kernels' gather programs recorded this one (they see every prefill, not its rows)."""
    # Request 0: q=3, S=7 (prefix 4, W=5): gather 3 + min(4, W - 1) = 7. Request 1: no new token (q=0) and
    # one span, 45..18, inverted: broken, so gather length 0, but it owns no row.
    # Its tokens hold their own slots (rule 17): positions 4..6 on page 1, block 2.
    batch = make_batch([0, 3, 3], [7, 9], [[1, 2, 3], [4, 5, 6]], [8, 9, 10], 3, 3, None, ([0, 0, 1], [45], [18]))
    builder, ref = _pair(backend)
    md, want = builder.build(batch, validate=False), ref.build(batch, validate=False)
    assert want.prefill_gather_lens.tolist() == [7, 0] and md.prefill_gather_lens.tolist() == [7, 0]
    assert metadata_differences(md, want) == []
    for b in (builder, ref):
        assert b.buffers.violation.tolist() == [0, 0, 0, 0, 0]
        b.check()


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_a_decode_whose_span_breaks_rule_4_is_emptied(backend):
    """The kernels' decode programs check rule 4 when the model has image spans (they filled this row)."""
    # Request 0 a decode (S=6, q=1: new position 5) whose span 4..2 is inverted.
    batch = dataclasses.replace(base(), image_spans=spans([0, 1, 1], [4], [2]))
    builder, ref = _pair(backend)
    md, want = builder.build(batch, validate=False), ref.build(batch, validate=False)
    assert want.decode_swa_lens.tolist() == [0] and md.decode_swa_lens.tolist() == [0]
    assert bool((md.decode_swa_indices == -1).all())
    assert md.prefill_swa_lens.tolist() == [5] * 5  # the prefill (W=5) is intact
    assert metadata_differences(md, want) == []
    assert_check_names("image_spans", builder, ref)


@pytest.mark.parametrize("backend", ["torch", *TRITON_BACKENDS])
def test_a_draft_update_checks_only_the_decode_requests(backend):
    """The torch update re-recorded the broken prefill's violation, which the update does not touch (the
    kernels' update, decode programs only, never saw it)."""
    bad = dataclasses.replace(base(), seq_lens=set_(base().seq_lens, 1, 3))  # the prefill: S=3 < q=5
    bad.seq_lens_cpu[1] = 3
    builder = make_builder(FUZZ, backend)
    md = builder.build(bad, validate=False)
    with pytest.raises(E.BatchRangeError):
        builder.check()
    bad.seq_lens[0] += 1
    builder.update_draft_decode_metadata(md)
    assert md.decode_swa_lens.tolist() == [5]
    assert builder.buffers.violation.tolist() == [0, 0, 0, 0, 0]
    builder.check()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "qsl, seqs, slots, recorded_request",
    [
        # Request 0 (S=0 < q=1) has only a token without a slot: it hands out nothing and is not recorded.
        # (Slotted tokens of valid requests hold their own slots, rule 17: request 1's position 8 is slot 24.)
        ([0, 1, 2], [0, 9], [-1, 24], None),
        # Request 0 (q=0, S=-1): no token at all; request 1 (S=1 < q=2) has a slotted token: it is recorded.
        ([0, 0, 2], [-1, 1], [5, -1], 1),
        # Request 1's only token has no slot, request 0 is valid: nothing is recorded.
        ([0, 1, 2], [4, 0], [7, -1], None),
    ],
)
def test_a_broken_request_is_recorded_only_at_a_row_with_a_slot(backend, qsl, seqs, slots, recorded_request):
    """docs/semantics.md #guarded-builds: a request's rules are checked at its rows with a slot, so one
    without any is emptied (it hands out nothing) but recorded by no backend."""
    builder, ref = _pair(backend)
    batch = make_batch(qsl, seqs, [[1, 2, 3], [4, 5, 6]], slots, 2, len(slots))
    md, want = builder.build(batch, validate=False), ref.build(batch, validate=False)
    assert metadata_differences(md, want) == []
    for b in (builder, ref):
        record = b.buffers.violation.tolist()
        if recorded_request is None:
            assert record == [0, 0, 0, 0, 0]
        else:
            assert record[0] >= 1 and record[1:3] == [int(Violation.SEQ_SHORT), recorded_request]
        recorded(b)


# Where the offsets or the span CSR decrease (docs/semantics.md #guarded-builds), expected values derived by
# hand; these gave different outputs on the kernels and the reference before both took the same rule.


@pytest.mark.parametrize("backend", BACKENDS)
def test_where_query_start_loc_decreases_a_token_belongs_to_the_count_of_ends_before_it(backend):
    # Ends 2, 8, 6: tokens 0-1 have no end at or before them (request 0), 2-5 one (1), 6-7 two (ends 2 and
    # 6: request 2), 8-9 all three (R: request 0). The guess shortcut took tokens 6-7 for request 1.
    batch = make_batch([0, 2, 8, 6], [36, 6, 29], [[0, 3, 25, 24], [2, 13, 3, 25], [1, 5, 12, 1]], list(range(10)), 1, 10)
    builder, ref = _pair(backend)
    md, want = builder.build(batch, validate=False), ref.build(batch, validate=False)
    assert md.token_to_req_indices[:10].tolist() == [0, 0, 1, 1, 1, 1, 2, 2, 0, 0]
    assert metadata_differences(md, want) == []
    # Request 2 (end 6 below its start 8) broke rule 1 and owns tokens 6-7: recorded, its rows empty.
    assert recorded(builder) and recorded(ref)
    assert md.decode_swa_lens[6:8].tolist() == [0, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_where_the_span_csr_decreases_each_request_has_the_spans_of_its_own_range(backend):
    # indptr 4, 1, 3 over 2 spans: request 0 owns [4, 1), nothing; request 1 owns [1, 3) of the spans that
    # exist, span 1 (-1..39), which starts at a negative position (rule 4): request 1 is broken, request 0 sees
    # no span. The reference gave span 1 to request 0 (a binary search of the unsorted ends).
    batch = make_batch(
        [0, 4, 10],
        [41, 12],
        [[2, 23, 14, 13, 30, 12], [4, 27, 0, 4, -2, 28]],
        [28, 56, 46, 4, 36, 28, 14, 5, 23, 75, 73, 23],
        5,
        12,
        None,
        ([4, 1, 3], [41, -1], [5, 39]),
    )
    builder, ref = _pair(backend)
    md, want = builder.build(batch, validate=False), ref.build(batch, validate=False)
    assert metadata_differences(md, want) == []
    m = FUZZ.max_image_tokens
    # Request 1's new positions 6..11 lie inside span 1: left min(p + 1, M - 1), right min(min(39, S - 1) - p, M)
    # with S - 1 = 11 (no row sees past the request's last position).
    assert md.prefill_left_visible[4:10].tolist() == [min(p + 1, m - 1) for p in range(6, 12)]
    assert md.prefill_right_visible[4:10].tolist() == [min(11 - p, m) for p in range(6, 12)]
    assert md.prefill_left_visible[:4].tolist() == [0] * 4 and md.prefill_right_visible[:4].tolist() == [0] * 4
    assert md.prefill_gather_lens.tolist()[-1] == 0  # the broken prefill gathers nothing
    assert recorded(builder) and recorded(ref)
