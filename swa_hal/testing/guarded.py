"""Conformance topic: guarded output (docs/semantics.md #guarded-builds). A guarded build of a malformed
batch hands out exactly what the torch reference hands out, bit for bit (rows, lens, gather lengths,
per-token helpers, visibility arrays), and records a violation exactly when the reference does. Checked
for ``build``, ``build_groups``, single and grouped draft updates and ``build_slot_rows`` (paged and ring
rows), on a handful of fixed malformed inputs drawn from a seeded RNG, against a torch builder of the same
config."""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch

from ..batch import AttentionBatch, ImageSpans
from ..builder import SWAMetadataBuilder
from ..config import SWAConfig
from ..errors import BatchValidationError
from ..metadata import SWAMetadata
from ..platform import PlatformInfo
from ..slot_ring import SlotRing
from ..slot_rows import SlotRows, slot_limit
from .fixtures import BackendFixtures, Target
from .slot_rows import random_ring_rows, random_slot_rows, slot_rows_config

# A small geometry whose malformed batches reach every rule of docs/semantics.md #guarded-builds.
GUARDED_CONFIG = SWAConfig(
    window_size=5,
    block_size=4,
    max_model_len=128,
    max_num_batched_tokens=48,
    max_num_seqs=6,
    num_speculative_tokens=1,
    speculative_method="mtp",
    num_kv_blocks=24,
    max_image_tokens=3,
    num_kv_groups=3,
)
# The same geometry with DSpark drafting: its steps may be non-causal, and their prefills read replay bounds
# that their decode rows ignore (docs/semantics.md #dspark-rows).
GUARDED_DSPARK_CONFIG = dataclasses.replace(GUARDED_CONFIG, speculative_method="dspark", num_speculative_tokens=3)
# The SWAMetadata fields that are not outputs of the build (host objects, names).
_NOT_COMPARED = {"tile_sched", "backend", "extras"}


def reference_builder(config: SWAConfig, **kw: Any) -> SWAMetadataBuilder:
    """The torch reference on the CPU, guarded (the default)."""
    return SWAMetadataBuilder(
        config, device="cpu", backend="torch", platform=PlatformInfo.from_assume("vendor=cpu"), **kw
    )


def metadata_differences(got: SWAMetadata, want: SWAMetadata) -> list[str]:
    """Every field of ``want`` that ``got`` has and that differs: tensors bit for bit (shape, dtype and
    values, on the CPU), everything else by equality. Backend extras are not compared (the reference has
    none)."""
    problems = []
    for name, value in vars(want).items():
        if name in _NOT_COMPARED or name not in vars(got):
            continue
        other = vars(got)[name]
        if isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor):
            a, b = other.detach().cpu(), value.detach().cpu()
            if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
                problems.append(f"{name}: backend {_show(a)}, reference {_show(b)}")
        elif isinstance(value, torch.Tensor) or isinstance(other, torch.Tensor):
            problems.append(f"{name}: backend {other!r}, reference {value!r}")
        elif other != value:
            problems.append(f"{name}: backend {other!r}, reference {value!r}")
    return problems


def _show(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {t.dtype} {t.tolist()}"


def recorded(builder: SWAMetadataBuilder) -> bool:
    """Whether the builder recorded a violation since the last check (and clears it): whether ``check()``
    raises a validation error."""
    try:
        builder.check()
    except BatchValidationError:
        return True
    return False


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, type[BaseException] | None]:
    """``fn(*args, **kwargs)``'s result, or the type of the validation error it raised (the host preflight's
    answer)."""
    try:
        return fn(*args, **kwargs), None
    except BatchValidationError as exc:
        return None, type(exc)


def malformed_batch(rng: random.Random, config: SWAConfig = GUARDED_CONFIG) -> AttentionBatch:
    """A structurally plausible batch (it passes the host preflight of ``config``) with malformed values:
    decreasing offsets, short sequences, out-of-range block ids, bad replay bounds and image spans (a CSR
    that decreases or points past its spans), requests without query tokens, tokens without slots, padding
    rows with slots, a max_query_len below the longest query and device offsets that differ from their
    host copy (the split is made from the host copy)."""
    num_reqs = rng.randint(1, min(5, config.max_num_seqs))
    queries = [rng.randint(0, 7) for _ in range(num_reqs)]
    qsl = [0]
    for q in queries:
        qsl.append(qsl[-1] + q)
    if rng.random() < 0.4:  # break monotonicity somewhere
        i = rng.randint(1, num_reqs)
        qsl[i] = max(0, qsl[i] - rng.randint(1, 9))
    num_tokens = max(1, max(qsl)) + rng.randint(0, 3)
    seqs = [max(0, q + rng.randint(-3, 40)) for q in queries]
    width = rng.randint(1, 12)
    table = [[rng.randint(-2, 30) for _ in range(width)] for _ in range(num_reqs)]
    slots = [rng.randint(-1, 90) for _ in range(num_tokens)]
    replay = [rng.randint(-2, 45) for _ in range(num_reqs)] if rng.random() < 0.5 else None
    n_spans = rng.randint(0, 3) if config.max_image_tokens else 0
    span_ptr = [rng.randint(0, n_spans + 3) for _ in range(num_reqs + 1)]
    if rng.random() < 0.5:
        span_ptr = sorted(span_ptr)
        span_ptr[0] = 0
    starts = [rng.randint(-1, 45) for _ in range(n_spans)]
    ends = [rng.randint(-1, 45) for _ in range(n_spans)]
    host_qsl = None
    if rng.random() < 0.3:  # the host copy the split is made from disagrees with the device offsets
        host_qsl = list(qsl)
        i = rng.randint(0, num_reqs)
        host_qsl[i] = max(0, min(num_tokens, host_qsl[i] + rng.choice((-2, -1, 1, 2))))
    spans = (span_ptr, starts, ends)
    causal = not (config.is_dspark and rng.random() < 0.7)  # a DSpark step: non-causal decode rows
    batch = make_batch(qsl, seqs, table, slots, rng.randint(0, 8), num_tokens, replay, spans, host_qsl=host_qsl)
    return batch if causal else dataclasses.replace(batch, causal=False)


def make_batch(
    qsl: list[int],
    seqs: list[int],
    table: list[list[int]],
    slots: list[int],
    max_query_len: int,
    num_tokens: int,
    replay: list[int] | None = None,
    image_spans: tuple[list[int], list[int], list[int]] | None = None,
    *,
    host_qsl: list[int] | None = None,
) -> AttentionBatch:
    """A batch of exactly these values (no validation): ``image_spans`` is ``(indptr, starts, ends)``,
    dropped when it has no span; ``host_qsl`` is query_start_loc's host copy where it differs."""

    def t32(v: list[int] | list[list[int]]) -> torch.Tensor:
        return torch.tensor(v, dtype=torch.int32)

    qsl_t = t32(qsl)
    spans = None
    if image_spans is not None and image_spans[1]:
        spans = ImageSpans(t32(image_spans[0]), t32(image_spans[1]), t32(image_spans[2]))
    return AttentionBatch(
        seq_lens=t32(seqs),
        query_start_loc=qsl_t,
        query_start_loc_cpu=qsl_t.clone() if host_qsl is None else t32(host_qsl),
        seq_lens_cpu=t32(seqs),
        block_table=t32(table) if table and table[0] else torch.zeros((len(seqs), 0), dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        max_query_len=max_query_len,
        num_tokens=num_tokens,
        causal=True,
        replay_start=None if replay is None else t32(replay),
        image_spans=spans,
    )


def malformed_groups(
    rng: random.Random, batch: AttentionBatch, groups: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The batch's own table and slots, then ``groups - 1`` other groups' of other widths and values, as
    malformed as the batch's (block ids past the cache, negative ones, tables too narrow)."""
    tables, slots = [batch.block_table], [batch.slot_mapping]
    num_reqs = batch.query_start_loc_cpu.shape[0] - 1
    for _ in range(groups - 1):
        width = rng.randint(1, 12)
        table = [[rng.randint(-2, 30) for _ in range(width)] for _ in range(num_reqs)]
        tables.append(torch.tensor(table, dtype=torch.int32))
        # The same tokens without a slot in every group (as an engine's groups have).
        own = [rng.randint(0, 90) for _ in range(batch.num_tokens)]
        slots.append(torch.where(batch.slot_mapping.cpu() >= 0, torch.tensor(own, dtype=torch.int64), -1))
    return tables, slots


def draft_step(rng: random.Random, batch: AttentionBatch, md: SWAMetadata) -> None:
    """The engine's draft step, in place, as a buggy engine might do it: the decode requests' seq_lens
    advance by one, or by a random amount that can make a sequence shorter than its query."""
    n = md.num_decodes
    if not n:
        return
    if rng.random() < 0.5:
        delta = torch.ones(n, dtype=torch.int32)
    else:
        delta = torch.tensor([rng.randint(-4, 6) for _ in range(n)], dtype=torch.int32)
    batch.seq_lens[:n] += delta.to(batch.seq_lens.device)
    if batch.seq_lens_cpu is not None:
        batch.seq_lens_cpu[:n] += delta


def malformed_slot_rows(rng: random.Random, window: int, limit: int) -> SlotRows:
    """A random token-slot rows call (``random_slot_rows``) with some values broken: pool indices past
    ``req_to_token``, rows reading past its width, token slots past ``slot_map``, cache slots past
    ``limit``."""
    rows = random_slot_rows(rng, window, rng.choice((torch.int32, torch.int64)))
    assert rows.req_to_token is not None and rows.slot_map is not None, "random_slot_rows gives paged rows"
    pools, rt = rows.pools.clone(), rows.req_to_token.clone()
    ends, slot_map = rows.row_ends.clone(), rows.slot_map.clone()
    block_slots = None if rows.block_slots is None else rows.block_slots.clone()
    for _ in range(rng.randint(1, 3)):
        what = rng.randrange(5)
        if what == 0:
            pools[rng.randrange(pools.shape[0])] = rng.choice((-1, rt.shape[0], rt.shape[0] + 3))
        elif what == 1:
            ends[rng.randrange(ends.shape[0])] = rt.shape[1] + rng.randint(1, 4)
        elif what == 2:
            rt.view(-1)[rng.randrange(rt.numel())] = rng.choice((-2, slot_map.shape[0], slot_map.shape[0] + 7))
        elif what == 3:
            slot_map[rng.randrange(slot_map.shape[0])] = rng.choice((-5, limit, limit + 9))
        elif block_slots is not None:
            block_slots[rng.randrange(block_slots.shape[0])] = rng.choice((-3, slot_map.shape[0]))
        else:
            ends[rng.randrange(ends.shape[0])] = rng.randint(-3, 2)
    return dataclasses.replace(
        rows, pools=pools, req_to_token=rt, row_ends=ends, slot_map=slot_map, block_slots=block_slots
    )


def _extremes(t: torch.Tensor) -> tuple[int, ...]:
    """Values at the edges of ``t``'s dtype, and past int32 where it holds them."""
    if t.dtype == torch.int64:
        return (-(2**63), 2**63 - 1, 2**40 + 3, -(2**31) - 1, 2**31 + 7)
    return (-(2**31), 2**31 - 1)


def malformed_ring_rows(rng: random.Random, window: int) -> SlotRows:
    """A random ring-rows call (``random_ring_rows``) with some values broken: request slots outside the
    ring (rule 12), row ends and floors anywhere, at the edges of their dtype and past int32 (ring positions
    have no width to pass: those rows are valid and must be exact), now and then a ring too short for its
    rows (the host preflight refuses it)."""
    rows = random_ring_rows(rng, window, rng.choice((torch.int32, torch.int64)))
    assert rows.ring is not None, "random_ring_rows gives ring rows"
    slots = rows.ring.slots
    pools, ends = rows.pools.clone(), rows.row_ends.clone()
    floors = None if rows.floors is None else rows.floors.clone()
    for _ in range(rng.randint(1, 3)):
        what = rng.randrange(4)
        if what == 0:
            pools[rng.randrange(pools.shape[0])] = rng.choice((-1, slots, slots + 3, *_extremes(pools)[:2]))
        elif what == 1:
            ends[rng.randrange(ends.shape[0])] = rng.choice((rng.randint(-3, 2), *_extremes(ends)))
        elif floors is not None:
            floors[rng.randrange(floors.shape[0])] = rng.choice((-5, *_extremes(floors)))
        else:
            pools[rng.randrange(pools.shape[0])] = rng.choice((-2, slots + 1))
    ring = rows.ring
    if rng.random() < 0.05:
        ring = SlotRing(window + rows.block - 1, slots)
    return dataclasses.replace(rows, pools=pools, row_ends=ends, floors=floors, ring=ring)


def guarded_slot_rows_config(window: int) -> SWAConfig:
    """A token-slot rows config that knows its cache (so rule 11 has a bound)."""
    return slot_rows_config(window, num_kv_blocks=80)


def unchecked(extra: Any = ()) -> AbstractContextManager[Any]:
    """No check: the default ``strict`` of the ``*_case`` functions."""
    return contextlib.nullcontext()


def build_case(
    builder: SWAMetadataBuilder,
    ref: SWAMetadataBuilder,
    rng: random.Random,
    device: torch.device,
    k: int,
    strict: Callable[..., AbstractContextManager[Any]] = unchecked,
) -> list[str]:
    """One malformed batch (``malformed_batch``) through ``build`` and two draft-step updates
    of ``builder`` and of the reference ``ref``: what differs (empty: nothing), each naming the case.
    ``strict(extra=...)``: a context the backend's calls run in (``interpreter.address_strict``), given the
    tensors a kernel reaches through a table of addresses; the ``*_case`` functions all take it."""
    batch = malformed_batch(rng, ref.config)
    want, want_error = attempt(ref.build, batch, validate=False)
    moved = batch.to(device)
    with strict():
        got, error = attempt(builder.build, moved, validate=False)
    where = f"malformed batch {k} ({batch_summary(batch)})"
    if error != want_error:
        return [f"{where}: the backend raised {error}, the reference {want_error}"]
    if want is None:
        return []
    problems = _compared(where, got, want, builder, ref)
    if problems or not got.num_decode_tokens or not builder.supports_draft_decode_metadata_update:
        return problems
    for step in range(2):  # draft steps on the metadata just compared
        got_update, want_update = _draft_updates(builder, ref, rng, batch, moved, got, want, want, strict())
        at = f"{where}, draft step {step + 1}"
        if got_update != want_update:
            return [f"{at}: the backend raised {got_update}, the reference {want_update}"]
        problems = _compared(at, got, want, builder, ref)
        if problems:
            return problems
    return []


def group_case(
    builder: SWAMetadataBuilder,
    ref: SWAMetadataBuilder,
    rng: random.Random,
    device: torch.device,
    k: int,
    strict: Callable[..., AbstractContextManager[Any]] = unchecked,
) -> list[str]:
    """One malformed batch with ``num_kv_groups`` malformed groups (``malformed_groups``) through
    ``build_groups`` and one grouped draft-step update: what differs from the reference."""
    groups = ref.config.num_kv_groups
    batch = malformed_batch(rng)
    tables, slots = malformed_groups(rng, batch, groups)
    moved = batch.to(device)
    dev_tables, dev_slots = [t.to(device) for t in tables], [s.to(device) for s in slots]
    want, want_error = attempt(ref.build_groups, batch, tables, slots, validate=False)
    with strict(extra=dev_tables + dev_slots):
        got, error = attempt(builder.build_groups, moved, dev_tables, dev_slots, validate=False)
    where = f"malformed group batch {k} ({batch_summary(batch)})"
    if error != want_error:
        return [f"{where}: the backend raised {error}, the reference {want_error}"]
    if want is None:
        return []
    problems = _compared_groups(where, got, want, builder, ref)
    if problems or not want[0].num_decode_tokens or not builder.supports_draft_decode_metadata_update:
        return problems
    checked = strict(extra=dev_tables + dev_slots)
    got_update, want_update = _draft_updates(builder, ref, rng, batch, moved, got, want, want[0], checked)
    if got_update != want_update:
        return [f"{where}, draft step: the backend raised {got_update}, the reference {want_update}"]
    return _compared_groups(f"{where} after a draft step", got, want, builder, ref)


def slot_rows_case(
    builder: SWAMetadataBuilder,
    ref: SWAMetadataBuilder,
    rng: random.Random,
    device: torch.device,
    k: int,
    strict: Callable[..., AbstractContextManager[Any]] = unchecked,
) -> list[str]:
    """One malformed token-slot rows call (``malformed_slot_rows``) of the builders' config (made by
    ``guarded_slot_rows_config``): what differs from the reference."""
    config = ref.config
    rows = malformed_slot_rows(rng, config.window_size, slot_limit(config))
    where = f"malformed token-slot rows call {k} (window {config.window_size}, block {rows.block})"
    return _slot_call_differences(builder, ref, rows, device, where, strict)


def ring_rows_case(
    builder: SWAMetadataBuilder,
    ref: SWAMetadataBuilder,
    rng: random.Random,
    device: torch.device,
    k: int,
    strict: Callable[..., AbstractContextManager[Any]] = unchecked,
) -> list[str]:
    """One malformed ring-rows call (``malformed_ring_rows``) of the builders' config (made by
    ``guarded_slot_rows_config``): what differs from the reference."""
    config = ref.config
    rows = malformed_ring_rows(rng, config.window_size)
    where = f"malformed ring rows call {k} (window {config.window_size}, block {rows.block}, ring {rows.ring})"
    return _slot_call_differences(builder, ref, rows, device, where, strict)


def _slot_call_differences(
    builder: SWAMetadataBuilder,
    ref: SWAMetadataBuilder,
    rows: SlotRows,
    device: torch.device,
    where: str,
    strict: Callable[..., AbstractContextManager[Any]],
) -> list[str]:
    want, want_error = attempt(ref.build_slot_rows, rows)
    with strict():
        got, error = attempt(builder.build_slot_rows, rows.to(device))
    if error != want_error:
        return [f"{where}: the backend raised {error}, the reference {want_error}"]
    if want is None:
        return []
    problems = []
    for what, a, b in (("rows", got[0], want[0]), ("lens", got[1], want[1])):
        a = a.cpu()
        if not torch.equal(a, b):
            problems.append(f"{where}: {what} differ: backend {a.tolist()}, reference {b.tolist()}")
    if recorded(builder) != recorded(ref):
        problems.append(f"{where}: only one of the two recorded a violation")
    return problems


def _draft_updates(
    builder: SWAMetadataBuilder,
    ref: SWAMetadataBuilder,
    rng: random.Random,
    batch: AttentionBatch,
    moved: AttentionBatch,
    got: Any,
    want: Any,
    decodes: SWAMetadata,
    checked: AbstractContextManager[Any],
) -> tuple[type[BaseException] | None, type[BaseException] | None]:
    """The engine's draft step on ``batch`` (``decodes`` says which requests decode), copied to the
    backend's ``moved`` batch, then both builders' in-place updates (the backend's inside ``checked``):
    the validation error each raised, or None."""
    draft_step(rng, batch, decodes)
    if moved.seq_lens is not batch.seq_lens:
        moved.seq_lens.copy_(batch.seq_lens)
    with checked:
        got_update = attempt(builder.update_draft_decode_metadata, got)[1]
    return got_update, attempt(ref.update_draft_decode_metadata, want)[1]


def _compared(
    where: str, got: SWAMetadata, want: SWAMetadata, builder: SWAMetadataBuilder, ref: SWAMetadataBuilder
) -> list[str]:
    problems = [f"{where}: {p}" for p in metadata_differences(got, want)]
    if recorded(builder) != recorded(ref):
        problems.append(f"{where}: only one of the two recorded a violation")
    return problems


def _compared_groups(
    where: str, got: list[SWAMetadata], want: list[SWAMetadata], builder: SWAMetadataBuilder, ref: SWAMetadataBuilder
) -> list[str]:
    problems = [
        f"{where}, group {g}: {p}" for g, (a, b) in enumerate(zip(got, want)) for p in metadata_differences(a, b)
    ]
    if recorded(builder) != recorded(ref):
        problems.append(f"{where}: only one of the two recorded a violation")
    return problems


# The token-slot rows windows the cases cover (a row shorter and one longer than a page of 16).
SLOT_ROW_WINDOWS = (8, 20)


class GuardedOutputTests(BackendFixtures):
    """Seeded malformed inputs through every guarded entry point, compared with a torch builder."""

    # Malformed inputs per test (each runs every entry point it covers).
    guarded_cases: ClassVar[int] = 6

    def _run(
        self,
        case: Callable[..., list[str]],
        config: SWAConfig,
        seed: str,
        make_builder: Callable[..., SWAMetadataBuilder],
        target: Target,
    ) -> None:
        builder, ref = make_builder(config), reference_builder(config)
        rng = random.Random(seed)
        for k in range(self.guarded_cases):
            problems = case(builder, ref, rng, target.device, k)
            assert not problems, "; ".join(problems)

    def test_guarded_builds_equal_the_reference(
        self, name: str, make_builder: Callable[..., SWAMetadataBuilder], target: Target
    ) -> None:
        self._run(build_case, GUARDED_CONFIG, f"guarded-build-{name}", make_builder, target)

    def test_guarded_dspark_builds_equal_the_reference(
        self, name: str, make_builder: Callable[..., SWAMetadataBuilder], target: Target
    ) -> None:
        self._run(build_case, GUARDED_DSPARK_CONFIG, f"guarded-dspark-{name}", make_builder, target)

    def test_guarded_group_builds_equal_the_reference(
        self, name: str, make_builder: Callable[..., SWAMetadataBuilder], target: Target
    ) -> None:
        self._run(group_case, GUARDED_CONFIG, f"guarded-groups-{name}", make_builder, target)

    def test_guarded_slot_rows_equal_the_reference(
        self, name: str, make_builder: Callable[..., SWAMetadataBuilder], target: Target
    ) -> None:
        for window in SLOT_ROW_WINDOWS:
            config = guarded_slot_rows_config(window)
            self._run(slot_rows_case, config, f"guarded-slot-rows-{name}-{window}", make_builder, target)

    def test_guarded_ring_rows_equal_the_reference(
        self, name: str, make_builder: Callable[..., SWAMetadataBuilder], target: Target
    ) -> None:
        for window in SLOT_ROW_WINDOWS:
            config = guarded_slot_rows_config(window)
            self._run(ring_rows_case, config, f"guarded-ring-rows-{name}-{window}", make_builder, target)


def batch_summary(batch: AttentionBatch) -> str:
    spans = batch.image_spans
    return (
        f"qsl={batch.query_start_loc_cpu.tolist()} seq={batch.seq_lens_cpu.tolist() if batch.seq_lens_cpu is not None else None} "
        f"table={batch.block_table.tolist()} slots={batch.slot_mapping.tolist()} max_query_len={batch.max_query_len} "
        f"num_tokens={batch.num_tokens} replay={None if batch.replay_start is None else batch.replay_start.tolist()} "
        f"spans={None if spans is None else (spans.indptr.tolist(), spans.starts.tolist(), spans.ends.tolist())}"
    )
