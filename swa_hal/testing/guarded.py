"""Conformance topic: guarded output (docs/semantics.md #guarded-builds). A guarded build of a malformed
batch hands out exactly what the torch backend's hands out on the CPU, bit for bit (rows, lens, gather lengths,
per-token helpers, visibility arrays), and records a violation exactly when the reference does. Checked
for ``build``, ``build_groups`` (views of one storage and disagreeing structures included), single and
grouped draft updates, ``build_slot_rows`` (paged and ring rows), ``build_request_window`` and each entry
point's settings at their bounds, on a handful of fixed malformed inputs drawn from a seeded RNG, against
a torch builder of the same config; and validated builds of valid steps in the forms the default path takes
(``validated_case``), which build what the default path builds."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import random
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar, NamedTuple

import torch

from ..batch import AttentionBatch, ImageSpans
from ..builder import SWAMetadataBuilder
from ..config import MAX_ROW_WIDTH, SWAConfig
from ..errors import BatchValidationError, SWAHalError
from ..metadata import SWAMetadata
from ..platform import PlatformInfo
from ..request_window import RequestWindowRows, preflight_request_window
from ..slot_ring import SlotRing
from ..slot_rows import SlotRows, preflight_slot_rows, slot_limit
from ..split import split_decodes_and_prefills
from .batches import random_batch
from .fixtures import BackendFixtures, Target
from .request_windows import WINDOW_KINDS, window_case
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
# DSpark with a window at its row's edge (W = 61, three parallel drafts: a decode of up to 7 tokens in a row of
# 64): a row fits or not by its device length, and a decode's seq_lens_cpu, only an upper bound, may say it does
# not (docs/semantics.md #dspark-rows). A larger cache, so that valid steps of this window fit it.
GUARDED_DSPARK_EDGE_CONFIG = dataclasses.replace(
    GUARDED_DSPARK_CONFIG, window_size=61, parallel_drafting=True, num_kv_blocks=200, max_image_tokens=0
)
# The SWAMetadata fields that are not outputs of the build (host objects, names; the step inputs, whose
# tensors are compared as the metadata's seq_lens, query_start_loc and its host copy).
_NOT_COMPARED = {"tile_sched", "backend", "extras", "inputs"}


def reference_builder(config: SWAConfig, **kw: Any) -> SWAMetadataBuilder:
    """The torch backend on the CPU, guarded (the default): what guarded output is compared with."""
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
    host copy (the split is made from the host copy); a prefill's seq_lens_cpu that differs from seq_lens, a
    seq_len past max_model_len, and slot mappings that are each token's own slot by the table (most
    batches, so the other rules' rows are built), made for another page size, or off at one token; padding
    requests past shorter replay bounds that the device offsets give tokens, per-request inputs handed in as
    longer buffers, and a DSpark step's decodes with host seq_lens only an upper bound (``BATCH_CLASSES``,
    counted in ``DRAWN``)."""
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
    if config.window_size > 40:  # contexts around the window's edge too
        seqs = [s if rng.random() < 0.5 else q + rng.randint(config.window_size - 8, config.window_size + 8)
                for s, q in zip(seqs, queries)]  # fmt: skip
    if rng.random() < 0.1:
        seqs[rng.randrange(num_reqs)] = config.max_model_len + rng.randint(1, 9)
        DRAWN["batch seq_len past max_model_len"] += 1
    width = rng.randint(1, 12)
    table = [[rng.randint(-2, 30) for _ in range(width)] for _ in range(num_reqs)]
    slots = [rng.randint(-1, 90) for _ in range(num_tokens)]
    if rng.random() < 0.6:  # each token's own slot (rule 17), by this page size or another
        page = config.block_size
        if rng.random() < 0.2:
            page = rng.choice([p for p in (page // 2, page * 2) if p > 0])
            DRAWN["batch slots of another page size"] += 1
        slots = own_slots(qsl, seqs, table, slots, page)
        if rng.random() < 0.3:
            slots[rng.randrange(num_tokens)] = rng.randint(0, 90)
            DRAWN["batch one slot not its own"] += 1
    host_seqs = None
    if rng.random() < 0.25:  # the host copy the chunk plan reads disagrees with the device (rule 15)
        host_seqs = list(seqs)
        r = rng.randrange(num_reqs)
        host_seqs[r] = max(0, host_seqs[r] + rng.choice((-3, -1, 1, 4)))
        DRAWN["batch seq_lens_cpu differs"] += 1
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
    elif num_reqs > 1 and rng.random() < 0.15:
        # Replay bounds for the first requests only: the host copy makes the others padding requests (no query
        # tokens, so no bound), which the device offsets may still give tokens (rule 14).
        bounded = rng.randint(0, num_reqs - 1)
        host_qsl = qsl[: bounded + 1] + [qsl[bounded]] * (num_reqs - bounded)
        replay = [rng.randint(-2, 45) for _ in range(bounded)] if replay is None else replay[:bounded]
        DRAWN["batch padding the device contradicts"] += 1
    spans = (span_ptr, starts, ends)
    causal = not (config.is_dspark and rng.random() < 0.7)  # a DSpark step: non-causal decode rows
    if not causal and rng.random() < 0.5:
        # A DSpark step's decodes with their host seq_lens only an upper bound, as async scheduling hands them in.
        host_seqs = list(seqs if host_seqs is None else host_seqs)
        for r, q in enumerate(queries):
            if q <= config.decode_threshold:
                host_seqs[r] += rng.randint(0, 30)
        DRAWN["batch DSpark host upper bounds"] += 1
    persistent = 0
    if rng.random() < 0.15:  # per-request inputs handed in as an engine's longer buffers
        persistent = rng.randint(1, 4)
        DRAWN["batch per-request buffers longer than R"] += 1
    batch = make_batch(
        qsl, seqs, table, slots, rng.randint(0, 8), num_tokens, replay, spans, host_qsl=host_qsl, host_seqs=host_seqs,
        persistent=[rng.randint(-5, 200) for _ in range(persistent)],
    )  # fmt: skip
    return batch if causal else batch.replace(causal=False)


# The classes of ``malformed_batch`` that rules 15-17 catch (docs/semantics.md #guarded-builds), as ``DRAWN`` names them.
BATCH_CLASSES = (
    "batch seq_len past max_model_len",
    "batch slots of another page size",
    "batch one slot not its own",
    "batch seq_lens_cpu differs",
    "batch padding the device contradicts",
    "batch per-request buffers longer than R",
)


def own_slots(qsl: list[int], seqs: list[int], table: list[list[int]], slots: list[int], page: int) -> list[int]:
    """``slots`` with each token of a request whose offsets ascend given its own slot, ``table[r][p // page] *
    page + p % page`` (padding rows and tokens whose page lies outside the row keep theirs); with ``page`` the
    config's block size these are the slots rule 17 expects."""
    out = list(slots)
    for r in range(len(seqs)):
        for t in range(max(qsl[r], 0), min(qsl[r + 1], len(out))):
            p = seqs[r] - qsl[r + 1] + t
            k = p // page
            if out[t] >= 0 and p >= 0 and k < len(table[r]) and table[r][k] >= 0:
                out[t] = table[r][k] * page + p % page
    return out


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
    host_seqs: list[int] | None = None,
    persistent: list[int] | None = None,
) -> AttentionBatch:
    """A batch of exactly these values (no validation): ``image_spans`` is ``(indptr, starts, ends)``,
    dropped when it has no span; ``host_qsl`` and ``host_seqs`` are query_start_loc's and seq_lens' host
    copies where they differ; ``persistent``: values past the requests' that seq_lens, its host copy and
    replay_start (where it has one per request) carry on, as an engine's longer buffers do."""

    def t32(v: list[int] | list[list[int]]) -> torch.Tensor:
        return torch.tensor(v, dtype=torch.int32)

    more = persistent or []
    qsl_t = t32(qsl)
    spans = None
    if image_spans is not None and image_spans[1]:
        spans = ImageSpans(t32(image_spans[0]), t32(image_spans[1]), t32(image_spans[2]))
    if replay is not None and len(replay) == len(seqs):
        replay = replay + more
    return AttentionBatch(
        seq_lens=t32(seqs + more),
        query_start_loc=qsl_t,
        query_start_loc_cpu=qsl_t.clone() if host_qsl is None else t32(host_qsl),
        seq_lens_cpu=t32((seqs if host_seqs is None else host_seqs) + more),
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


# The empty pools a token-slot call may be handed (``malformed_slot_rows``).
EMPTY_POOLS = ("req_to_token without rows", "req_to_token without columns", "slot_map empty")


def malformed_slot_rows(rng: random.Random, window: int, limit: int, empty_pools: bool = True) -> SlotRows:
    """A random token-slot rows call (``random_slot_rows``) with some values broken: pool indices past
    ``req_to_token``, rows reading past its width, token slots past ``slot_map``, cache slots past
    ``limit``; now and then an empty pool (``req_to_token`` without rows or columns, an empty ``slot_map``),
    which every backend refuses by shape as the reference does (not where ``empty_pools`` is False)."""
    rows = random_slot_rows(rng, window, rng.choice((torch.int32, torch.int64)))
    assert rows.req_to_token is not None and rows.slot_map is not None, "random_slot_rows gives paged rows"
    if empty_pools and rng.random() < 0.05:
        empty = rng.choice(EMPTY_POOLS)
        DRAWN[f"slot_rows {empty}"] += 1
        rt, slot_map = rows.req_to_token, rows.slot_map
        if empty == "req_to_token without rows":
            rt = rt[:0]
        elif empty == "req_to_token without columns":
            rt = rt[:, :0]
        else:
            slot_map = slot_map[:0]
        return dataclasses.replace(rows, req_to_token=rt.clone(), slot_map=slot_map.clone())
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


def _fits(t: torch.Tensor, value: int) -> int:
    """``value`` held inside ``t``'s dtype (a shifted edge value would not fit it)."""
    info = torch.iinfo(t.dtype)
    return min(max(value, info.min), info.max)


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


class Draw(NamedTuple):
    """What every ``*_case`` function takes: one malformed input's draw. ``builder``, the backend's, and
    ``ref``, a torch builder of the same config; the seeded ``rng``; the ``device`` the backend's inputs are
    moved to; ``k``, the case's number in its report; ``strict(extra=...)``, a context the backend's calls run
    in (``interpreter.address_strict``), given the tensors a kernel reaches through a table of addresses."""

    builder: SWAMetadataBuilder
    ref: SWAMetadataBuilder
    rng: random.Random
    device: torch.device
    k: int
    strict: Callable[..., AbstractContextManager[Any]] = unchecked


def build_case(draw: Draw) -> list[str]:
    """One malformed batch (``malformed_batch``) through ``build`` and two draft-step updates
    of ``builder`` and of the reference ``ref``: what differs (empty: nothing), each naming the case."""
    builder, ref, rng, device, k, strict = draw
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


def group_case(draw: Draw) -> list[str]:
    """One malformed batch with ``num_kv_groups`` malformed groups (``malformed_groups``) through
    ``build_groups`` and one grouped draft-step update: what differs from the reference. Now and then
    (``SHARED_VIEWS``) the groups' inputs are views of one storage (``shared_group_case``), or
    (``MISMATCHED``) structures that disagree with the batch or the config (``mismatched_groups``): refused
    with the reference's typed error naming the same field, or built alike."""
    builder, ref, rng, device, k, strict = draw
    groups = ref.config.num_kv_groups
    batch = malformed_batch(rng)
    tables, slots = malformed_groups(rng, batch, groups)
    roll = rng.random()
    if roll < SHARED_VIEWS:
        return shared_group_case(builder, ref, rng, batch, tables, slots, device, k, strict)
    what = "listed"
    if roll < SHARED_VIEWS + MISMATCHED:
        what = rng.choice(MISMATCHES)
        tables, slots = mismatched_groups(rng, what, batch, tables, slots)
    DRAWN[f"groups {what}"] += 1
    moved = batch.to(device)
    dev_tables, dev_slots = [_to(t, device) for t in tables], [_to(s, device) for s in slots]
    want, want_error = attempt_named(ref.build_groups, batch, tables, slots, validate=False)
    with strict(extra=dev_tables + dev_slots):
        got, error = attempt_named(builder.build_groups, moved, dev_tables, dev_slots, validate=False)
    where = f"malformed group batch {k} [{what}] ({batch_summary(batch)})"
    if error != want_error or (want_error is not None and not issubclass(want_error[0], SWAHalError)):
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


def validated_case(draw: Draw) -> list[str]:
    """One valid step in the forms the default path takes (``engine_forms``: per-request inputs as longer
    buffers, decodes' host seq_lens an upper bound, a DSpark step's among them, an overstated max_query_len of
    any size, replay bounds that stop at the padding requests), built with full validation by the backend and
    by the reference: both build it, equal to the reference's default build of it, and record nothing (a
    validated build refuses nothing the default path takes, docs/semantics.md #inputs).
    Now and then (``UNTYPED``) one input has a type the default path refuses: every build, validated or not,
    raises the default path's typed error, naming the same field."""
    builder, ref, rng, device, k, strict = draw
    config = ref.config
    batch = engine_forms(rng, config)
    where = f"validated step {k} ({batch_summary(batch)})"
    capacity = ref.buffers.capacity
    if rng.random() < 0.2:
        what = rng.choice(sorted(UNTYPED))
        DRAWN[f"validated untyped {what}"] += 1
        field, value = UNTYPED[what]
        taken = batch.replace(max_query_len=min(batch.max_query_len, capacity))  # every other input one it takes
        answers = [
            attempt_named(ref.build, taken.replace(**{field: value(taken)}), validate=v)[1] for v in (False, True)
        ]
        moved = taken.to(device)
        with strict():
            answers += [
                attempt_named(builder.build, moved.replace(**{field: value(moved)}), validate=v)[1]
                for v in (False, True)
            ]
        if answers[0] is None or not issubclass(answers[0][0], SWAHalError) or answers.count(answers[0]) != 4:
            return [f"{where}, {what}: default, validated (reference), default, validated (backend): {answers}"]
        return []
    default = batch.replace(max_query_len=min(batch.max_query_len, capacity))
    want, want_error = attempt_named(ref.build, default, validate=False)
    if want_error is not None or recorded(ref):
        return [f"{where}: the reference's default build of a valid step raised {want_error} or recorded a violation"]
    want_v, want_v_error = attempt_named(ref.build, batch, validate=True)
    if want_v_error is not None:
        return [f"{where}: the reference's validated build refused a step its default build takes: {want_v_error}"]
    problems = [f"{where}: validated reference vs default: {p}" for p in metadata_differences(want_v, want)]
    moved = batch.to(device)
    with strict():
        got, error = attempt_named(builder.build, moved, validate=True)
    if error is not None:
        return [*problems, f"{where}: the backend's validated build raised {error}"]
    return problems + _compared(where, got, want_v, builder, ref)


def engine_forms(rng: random.Random, config: SWAConfig) -> AttentionBatch:
    """A random valid step (``random_batch``, its block ids inside the config's cache) in forms an engine hands in
    and the default path takes, each drawn now and then (``DRAWN``): seq_lens, its host copy and the replay
    bounds as longer buffers (junk past R); the decodes' seq_lens_cpu an upper bound of their seq_lens (vLLM's
    async scheduling), in DSpark steps too; max_query_len overstated, up to 2^64; a padded step's replay bounds
    stopping at its padding requests."""
    # Padded steps (their padding requests may go without bounds) and DSpark steps twice as often.
    kinds = ["decode", "mtp", "mixed", "prefill", "padded", "padded"] + (["dspark"] * 2 if config.is_dspark else [])
    kind = rng.choice(kinds)
    reqs = min(3, config.max_num_seqs)
    context = config.max_model_len
    if config.num_kv_blocks is not None:  # every page's id below the cache's: the table's pool holds them all
        context = min(context, config.block_size * max(1, (config.num_kv_blocks - 8) // (reqs + 3)))
    batch = random_batch(config, rng, kind, max_reqs=reqs, max_context=context, extra_pages=0, replay=0.6, spans=0.8)
    num_reqs = batch.inputs.num_reqs
    qsl_cpu = batch.query_start_loc_cpu
    if batch.replay_start is not None and rng.random() < 0.8:
        queries = (qsl_cpu[1:] - qsl_cpu[:-1]).tolist()
        padding = next((r for r in range(num_reqs) if not any(queries[r:])), num_reqs)
        if padding < num_reqs:  # the bounds of the real requests only (docs/semantics.md #bounded-replay)
            batch = batch.replace(replay_start=batch.replay_start[:padding].clone())
            DRAWN["validated padding requests without bounds"] += 1
    if rng.random() < 0.5:
        split = split_decodes_and_prefills(qsl_cpu, batch.max_query_len, batch.num_tokens, config.decode_threshold)
        host = batch.seq_lens_cpu.clone()
        host[: split.num_decodes] += torch.tensor(
            [rng.randint(0, 40) for _ in range(split.num_decodes)], dtype=host.dtype
        )
        batch = batch.replace(seq_lens_cpu=host)
        DRAWN["validated DSpark host upper bounds" if not batch.causal else "validated host upper bounds"] += 1
    if rng.random() < 0.4:
        extra = rng.randint(1, 4)

        def longer(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None or t.shape[0] != num_reqs:
                return t
            return torch.cat([t, torch.tensor([rng.randint(-5, 300) for _ in range(extra)], dtype=t.dtype)])

        batch = batch.replace(
            seq_lens=longer(batch.seq_lens),
            seq_lens_cpu=longer(batch.seq_lens_cpu),
            replay_start=longer(batch.replay_start),
        )
        DRAWN["validated per-request buffers longer than R"] += 1
    if rng.random() < 0.4:
        mql = batch.max_query_len
        batch = batch.replace(max_query_len=rng.choice((mql + rng.randint(1, 8), 2**31, 2**63 - 1, 2**63, 2**64)))
        DRAWN["validated overstated max_query_len"] += 1
    return batch


# Inputs in a form the default path refuses by type (docs/semantics.md #guarded-builds, the O(1) preflight): the
# field, and the value it takes in place of the batch's.
UNTYPED: dict[str, tuple[str, Callable[[AttentionBatch], Any]]] = {
    "image_spans as a dict": ("image_spans", lambda b: {0: [(0, 1)]}),
    "image_spans as a tuple": ("image_spans", lambda b: ((0, 1), (0,), (1,))),
    "max_query_len a float": ("max_query_len", lambda b: float(b.max_query_len)),
    "max_query_len a bool": ("max_query_len", lambda b: True),
    "max_query_len negative": ("max_query_len", lambda b: -1),
    "num_tokens a bool": ("num_tokens", lambda b: True),
    "causal an int": ("causal", lambda b: int(b.causal)),
    "seq_lens_cpu a list": ("seq_lens_cpu", lambda b: b.seq_lens_cpu.tolist()),
    "seq_lens_cpu int64": ("seq_lens_cpu", lambda b: b.seq_lens_cpu.long()),
    "query_start_loc_cpu int64": ("query_start_loc_cpu", lambda b: b.query_start_loc_cpu.long()),
    "replay_start int64": ("replay_start", lambda b: torch.zeros(b.inputs.num_reqs, dtype=torch.int64)),
}


# How often a group case draws views of one storage, and structures that disagree (the rest: the
# listed malformed groups, which keep most of the budget).
SHARED_VIEWS, MISMATCHED = 0.15, 0.15
# What ``mismatched_groups`` draws.
MISMATCHES = (
    "fewer tables",
    "more slot mappings",
    "too many groups",
    "short table",
    "short slots",
    "table dtype",
    "slots dtype",
    "table device",
    "narrow rows",
)
# The draws of the cases since the last ``DRAWN.clear()``, by class: the fuzz prints them and the tests
# count them, so a class cannot silently stop being drawn.
DRAWN: collections.Counter[str] = collections.Counter()


def attempt_named(
    fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> tuple[Any, tuple[type[BaseException], str | None] | None]:
    """``fn(*args, **kwargs)``'s result, or the type and field of whatever it raised: an untyped error (not
    an ``SWAHalError``) is answered too, with no field, so a case reports it rather than stopping the run."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - an untyped error is a finding to report, not a crash
        return None, (type(exc), getattr(exc, "field", None))


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    # A meta tensor stands for "another device" wherever the builder runs: it stays one.
    return t if t.is_meta else t.to(device)


def mismatched_groups(
    rng: random.Random, what: str, batch: AttentionBatch, tables: list[torch.Tensor], slots: list[torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Group inputs that disagree with the batch or the config, as a buggy engine might hand them in
    (``what``, one of ``MISMATCHES``): a table or slot mapping missing or extra, more groups than
    ``num_kv_groups``, a table with fewer rows than requests, a slot mapping shorter than the tokens, a table
    or slot mapping of another dtype or on another device (meta), table rows narrower than the requests'
    pages (a width-1 view of the same rows: rule 5, recorded, no error)."""
    tables, slots = list(tables), list(slots)
    g = rng.randrange(len(tables))
    if what == "fewer tables":
        tables.pop(g)
    elif what == "more slot mappings":
        slots.append(slots[g].clone())
    elif what == "too many groups":
        tables.append(tables[g].clone())
        slots.append(slots[g].clone())
    elif what == "short table":
        tables[g] = tables[g][: max(0, tables[g].shape[0] - rng.randint(1, 2))]
    elif what == "short slots":
        slots[g] = slots[g][: max(0, batch.num_tokens - rng.randint(1, 2))]
    elif what == "table dtype":
        tables[g] = tables[g].to(rng.choice((torch.int64, torch.int16, torch.float32)))
    elif what == "slots dtype":
        slots[g] = slots[g].to(rng.choice((torch.int32, torch.float64)))
    elif what == "table device":
        tables[g] = tables[g].to("meta")
    else:
        tables[g] = tables[g][:, :1]
    return tables, slots


# Layouts of the groups' block tables over one int32 storage (``shared_layout``): stacked [G, R, P];
# stacked with every group at the same address (group stride 0); listed views at the same address with
# other row strides and widths; one tensor reused by every group; a row-prefix slice at the same address
# as the full table (equal shapes, another row stride); transposed (no unit inner stride: refused).
TABLE_LAYOUTS = ("stacked", "stacked aliased", "listed strides", "listed reused", "prefix slice", "transposed")
# Layouts of the slot mappings over one int64 storage: stacked [G, T]; stacked with group stride 0; one
# tensor reused by every group; listed views at the same address; every other entry (refused).
SLOT_LAYOUTS = ("stacked", "stacked aliased", "listed reused", "listed views", "strided")

Layout = Callable[[torch.Tensor, torch.Tensor], tuple[Any, Any]]


def shared_layout(rng: random.Random, groups: int, num_reqs: int, num_tokens: int) -> tuple[str, Layout]:
    """A drawn pair of table and slot-mapping layouts (``TABLE_LAYOUTS``, ``SLOT_LAYOUTS``) as a function of
    the two storages (so the same views can be made on any device), and its name."""
    tab, slo = rng.choice(TABLE_LAYOUTS), rng.choice(SLOT_LAYOUTS)
    r, widths = max(num_reqs, 1), [rng.randint(1, 6) for _ in range(groups)]
    strides = [w + rng.randint(0, 3) for w in widths]
    p = widths[0]

    def tables(store: torch.Tensor) -> Any:
        if tab == "stacked":
            return store[: groups * r * p].view(groups, r, p)
        if tab == "stacked aliased":
            return store.as_strided((groups, r, p), (0, p, 1))
        if tab == "listed strides":
            return [store.as_strided((r, w), (s, 1)) for w, s in zip(widths, strides)]
        if tab == "listed reused":
            return [store[: r * p].view(r, p)] * groups
        if tab == "prefix slice":
            return [store[: r * strides[g]].view(r, strides[g])[:, :p] for g in range(groups)]
        return [store[: r * p].view(p, r).t()] * groups

    def slot_mappings(store: torch.Tensor) -> Any:
        if slo == "stacked":
            return store[: groups * num_tokens].view(groups, num_tokens)
        if slo == "stacked aliased":
            return store.as_strided((groups, num_tokens), (0, 1))
        if slo == "listed reused":
            return [store[:num_tokens]] * groups
        if slo == "listed views":
            return [store.as_strided((num_tokens,), (1,)) for _ in range(groups)]
        return [store.as_strided((num_tokens,), (2,))] * groups

    return f"tables {tab}, slots {slo}", lambda t, s: (tables(t), slot_mappings(s))


def shared_group_case(
    builder: SWAMetadataBuilder,
    ref: SWAMetadataBuilder,
    rng: random.Random,
    batch: AttentionBatch,
    tables: list[torch.Tensor],
    slots: list[torch.Tensor],
    device: torch.device,
    k: int,
    strict: Callable[..., AbstractContextManager[Any]],
) -> list[str]:
    """Group inputs that are views of one storage (``shared_layout``): two ``build_groups`` calls over the
    same two storages with two drawn layouts, so a view at an address the builder has seen, with another
    stride or shape, follows one that was kept. Each call is compared with the reference, and the
    reference with a fresh reference builder given contiguous copies (no view, no address seen before): a
    view must get its own rows, or the reference's typed refusal."""
    groups = ref.config.num_kv_groups
    num_reqs = batch.query_start_loc_cpu.shape[0] - 1
    need = groups * max(num_reqs, 1) * 9 + 64
    values = torch.cat([t.reshape(-1) for t in tables]).tolist() or [0]
    table_store = torch.tensor([values[i % len(values)] for i in range(need)], dtype=torch.int32)
    own = torch.cat(slots).tolist()
    slot_store = torch.tensor([own[i % len(own)] for i in range(2 * groups * batch.num_tokens + 2)])
    dev_stores = (table_store.to(device), slot_store.to(device))
    moved = batch.to(device)
    for call in range(2):
        name, layout = shared_layout(rng, groups, num_reqs, batch.num_tokens)
        for part in name.split(", "):
            DRAWN[f"groups shared {part}"] += 1
        views, dev_views = layout(table_store, slot_store), layout(*dev_stores)
        where = f"shared-storage group batch {k}, call {call + 1} ({name}; {batch_summary(batch)})"
        want, want_error = attempt_named(ref.build_groups, batch, *views, validate=False)
        with strict(extra=list(dev_stores)):
            got, error = attempt_named(builder.build_groups, moved, *dev_views, validate=False)
        if error != want_error or (want_error is not None and not issubclass(want_error[0], SWAHalError)):
            return [f"{where}: the backend raised {error}, the reference {want_error}"]
        if want is None:
            continue
        fresh = reference_builder(ref.config)
        copies = [[v.contiguous().clone() for v in (x if isinstance(x, list) else x.unbind(0))] for x in views]
        fresh_want = fresh.build_groups(batch, copies[0], copies[1], validate=False)
        problems = [
            f"{where}: the reference differs from a fresh reference of contiguous copies, group {g}: {p}"
            for g, (a, b) in enumerate(zip(want, fresh_want))
            for p in metadata_differences(a, b)
        ]
        want_recorded = recorded(ref)
        if want_recorded != recorded(fresh):
            problems.append(f"{where}: only one of the reference and a fresh reference recorded a violation")
        problems += _compared_groups(where, got, want, builder, ref, want_recorded)
        if problems:
            return problems
    return []


def slot_rows_case(draw: Draw) -> list[str]:
    """One malformed token-slot rows call (``malformed_slot_rows``) of the builders' config (made by
    ``guarded_slot_rows_config``): what differs from the reference."""
    builder, ref, rng, device, k, strict = draw
    config = ref.config
    rows = malformed_slot_rows(rng, config.window_size, slot_limit(config))
    where = f"malformed token-slot rows call {k} (window {config.window_size}, block {rows.block})"
    return _slot_call_differences(builder, ref, rows, device, where, strict)


def ring_rows_case(draw: Draw) -> list[str]:
    """One malformed ring-rows call (``malformed_ring_rows``) of the builders' config (made by
    ``guarded_slot_rows_config``): what differs from the reference."""
    builder, ref, rng, device, k, strict = draw
    config = ref.config
    rows = malformed_ring_rows(rng, config.window_size)
    where = f"malformed ring rows call {k} (window {config.window_size}, block {rows.block}, ring {rows.ring})"
    return _slot_call_differences(builder, ref, rows, device, where, strict)


def request_window_case(draw: Draw) -> list[str]:
    """One malformed request-window call (``malformed_request_window``) of the builders' window, unvalidated:
    every layout field (and ``runs``) equal to the reference's, or the reference's typed error."""
    builder, ref, rng, device, k, strict = draw
    rows = malformed_request_window(rng, ref.config.window_size)
    DRAWN["request_window"] += 1
    where = f"malformed request-window call {k} (window {ref.config.window_size}, {rows})"
    return _request_window_differences(builder, ref, rows, device, where, strict)


def malformed_request_window(rng: random.Random, window: int) -> RequestWindowRows:
    """A random V4.1 step (``window_case``, any kind, now and then more runs than groups) with some values
    broken: positions that do not ascend within a run, negative positions and request slots, floors past
    the positions, at the edges of their dtype, ``padded_rows`` below the rows."""
    case = window_case(rng, rng.choice(WINDOW_KINDS), window=window, overfull=rng.random() < 0.2)
    req, pos = case.req.clone(), case.pos.clone()
    floor = None if case.floor is None else case.floor.clone()
    n = pos.shape[0]
    for _ in range(rng.randint(1, 3)):
        what = rng.randrange(4)
        i = rng.randrange(n)
        if what == 0:
            pos[i] = rng.choice((-1, -window, _fits(pos, int(pos[i]) - rng.randint(1, 5)), *_extremes(pos)))
        elif what == 1:
            req[i] = rng.choice((-1, 12 + rng.randint(0, 3), *_extremes(req)))
        elif what == 2 and floor is not None:
            floor[i] = rng.choice((-3, _fits(floor, int(pos[i]) + rng.randint(1, 9)), *_extremes(floor)))
        else:
            pos[i], pos[(i + 1) % n] = pos[(i + 1) % n].clone(), pos[i].clone()
    padded = rng.randint(0, n) if rng.random() < 0.1 else case.padded_rows
    return dataclasses.replace(case, req=req, pos=pos, floor=floor, padded_rows=padded).rows()


def _request_window_differences(
    builder: SWAMetadataBuilder,
    ref: SWAMetadataBuilder,
    rows: RequestWindowRows,
    device: torch.device,
    where: str,
    strict: Callable[..., AbstractContextManager[Any]],
) -> list[str]:
    want, want_error = attempt_named(ref.build_request_window, rows, validate=False)
    with strict():
        got, error = attempt_named(builder.build_request_window, rows.to(device), validate=False)
    if error != want_error or (want_error is not None and not issubclass(want_error[0], SWAHalError)):
        return [f"{where}: the backend raised {error}, the reference {want_error}"]
    if want is None:
        return []
    problems = []
    for name in (*want.FIELDS, "runs"):
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(b, torch.Tensor):
            a = a.cpu()
            same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        else:
            same = a == b
        if not same:
            problems.append(f"{where}: {name} differ: backend {_brief(a)}, reference {_brief(b)}")
    return problems


def _brief(v: Any) -> str:
    return _show(v)[:300] if isinstance(v, torch.Tensor) else repr(v)


# The settings case's geometry: no cache given (slot_limit 2^31, so a ring of 2^30 rows fits) and a short
# window (rows stay cheap at every bound).
SETTINGS_CONFIG = SWAConfig(
    window_size=4, block_size=64, max_model_len=4096, max_num_batched_tokens=16, max_num_seqs=16
)
# Outputs past this many entries are not allocated: an in-bound setting that would need more is checked
# by the entry point's lazy part only (the config's construction, the call's O(1) preflight).
CHEAP_ENTRIES = 1 << 16
# The bounds' shared values: the widest row a kernel holds, int32 and int64.
_ROW, _I32, _I64 = MAX_ROW_WIDTH, 2**31 - 1, 2**63 - 1
# Each entry point's settings: (entry, setting) -> the field its error names.
SETTINGS = {
    ("config", "window_size"): "window_size",
    ("config", "max_image_tokens"): "max_image_tokens",
    ("config", "max_num_batched_tokens"): "max_num_batched_tokens",
    ("request_window", "zero_row"): "zero_row",
    ("request_window", "capacity"): "capacity",
    ("request_window", "num_groups"): "num_groups",
    ("request_window", "padded_rows"): "padded_rows",
    ("ring", "size"): "ring",
    ("ring", "slots"): "ring",
    ("slot_rows", "block"): "block",
    ("slot_rows", "width"): "width",
}
# The config a setting is varied from: a row of 128 (so the token bound is 2^31 / 128 = 2^24) and one token
# for the row widths (so the product bound stays out of the way).
_CONFIG_BASE = dict(block_size=64, max_model_len=4096, max_num_seqs=16, window_size=128, max_num_batched_tokens=1)


def settings_case(draw: Draw) -> list[str]:
    """One setting of one entry point (``SETTINGS``: the config's row widths and token rows, the
    request-window scalars, the ring's size and slots, the token-slot rows' block and width) at a value
    drawn just inside or just outside its documented bound (``setting_bounds``), or at 2^31 - 1, 2^31,
    2^63 - 1, a negative value, a bool or a float. Outside: the reference raises a typed error naming the
    setting, and the backend the same type naming the same field. Inside: both accept it, and a call is
    built and compared with the reference where its outputs are cheap (``CHEAP_ENTRIES``); where they are
    not (a window of 2^20, a workspace of 2^31 rows), only the lazy part is checked (the config's
    construction, the O(1) preflight), no buffer is allocated. The builders' config is ``SETTINGS_CONFIG``
    (or any config without a cache)."""
    builder, ref, rng, device, k, strict = draw
    entry, setting = rng.choice(sorted(SETTINGS))
    field = SETTINGS[entry, setting]
    window = ref.config.window_size
    base = _settings_base(rng, entry, setting, window, ref.config)
    lo, hi = setting_bounds(entry, setting, window, base, ref.config)
    # Half the draws inside (a bound, or a value near the low one), half outside (past a bound, or a value
    # of int32 / int64 edge, sign or type that lies outside).
    extremes = [
        v for v in (lo - 1, hi + 1, _I32, _I32 + 1, _I64, -1, True, 8.0) if not lo <= v <= hi or type(v) is not int
    ]
    inside_values = (lo, hi, rng.randint(lo, min(hi, lo + 12)))
    value = rng.choice(inside_values) if rng.random() < 0.5 else rng.choice(extremes)
    inside = type(value) is int and lo <= value <= hi
    DRAWN[f"settings {entry}.{setting} {'inside' if inside else 'outside'}"] += 1
    where = f"setting {entry}.{setting}={value!r} (bounds [{lo}, {hi}]), case {k}"
    if entry == "config":
        made, made_error = attempt_named(SWAConfig, **{**_CONFIG_BASE, setting: value})
        return _settled(where, inside, field, made_error) or _config_build(builder, rng, device, k, setting, value)
    call = _with_setting(entry, setting, value, base)
    want_error = attempt_named(_preflight, entry, call, ref)[1]
    problems = _settled(where, inside, field, want_error)
    if problems or (inside and not _cheap(entry, call, window)):
        return problems  # the reference's lazy answer decided; nothing cheap to build
    if entry == "request_window":
        return _request_window_differences(builder, ref, call, device, where, strict)
    return _slot_call_differences(builder, ref, call, device, where, strict, named=True)


def setting_bounds(entry: str, setting: str, window: int, base: Any, config: SWAConfig) -> tuple[int, int]:
    """The documented bounds of a setting, the other settings of ``base`` fixed (docs/semantics.md
    #request-window-layouts, #ring-rows, #token-slot-rows; the config's in ``SWAConfig``): row widths at
    most 2^20, token rows x widest row at most 2^31, ``zero_row`` an int64, a ring of ``[window + block,
    2^30]`` rows whose slots reach no further than the cache, a request-window workspace inside int32."""
    if entry == "config":
        return {"window_size": (1, _ROW), "max_image_tokens": (0, _ROW - 128), "max_num_batched_tokens": (1, 2**24)}[
            setting
        ]
    if entry == "request_window":
        if setting == "zero_row":
            return 0, _I64
        if setting == "capacity":
            return window, _I32
        if setting == "num_groups":
            return 1, (_I32 - base.padded()) // window
        return 0, _I32 - base.groups() * window
    reach = min(slot_limit(config), _I32 + 1)
    if entry == "ring":
        if setting == "size":
            return window + base.block, min(2**30, reach // base.ring.slots)
        return 1, reach // base.ring.size
    if setting == "block":
        return 0, _ROW - window
    return window + base.block, _ROW


def _settings_base(rng: random.Random, entry: str, setting: str, window: int, config: SWAConfig) -> Any:
    # The call a setting is varied in: a malformed one of the entry point (so an in-bound value builds a
    # malformed call); token-slot rows' block is varied over no rows (any block divides them).
    if entry == "request_window":
        return malformed_request_window(rng, window)
    if entry == "ring":
        # A ring long enough for its rows (malformed_ring_rows now and then draws a short one), so the
        # setting varied is the only one out of bounds.
        rows = malformed_ring_rows(rng, window)
        assert rows.ring is not None, "malformed_ring_rows gives ring rows"
        # DSpark floors are per ring slot: where the slots vary they are dropped (more slots than floors is
        # refused by the floors' shape, another setting's bound).
        floors = None if setting == "slots" and rows.block else rows.floors
        ring = SlotRing(max(rows.ring.size, window + rows.block), rows.ring.slots)
        return dataclasses.replace(rows, ring=ring, floors=floors)
    # Slot values inside int32 whatever the config's cache (a limit of 2^31 would not fit an int32 map).
    rows = malformed_slot_rows(rng, window, min(slot_limit(config), 1 << 20), empty_pools=False)
    if setting == "block":
        assert rows.req_to_token is not None, "malformed_slot_rows gives paged rows"
        empty = rows.row_ends[:0]
        rows = dataclasses.replace(
            rows, row_ends=empty, pools=rows.pools[:0], floors=None, block_slots=empty, width=None
        )
    return rows


def _with_setting(entry: str, setting: str, value: Any, base: Any) -> Any:
    if entry == "ring":
        ring = base.ring
        size, slots = (value, ring.slots) if setting == "size" else (ring.size, value)
        return dataclasses.replace(base, ring=SlotRing(size, slots))
    return dataclasses.replace(base, **{setting: value})


def _preflight(entry: str, call: Any, ref: SWAMetadataBuilder) -> None:
    """The entry point's O(1) host checks alone (what every backend runs before allocating anything)."""
    if entry == "request_window":
        preflight_request_window(call, ref.config.window_size, ref.device)
    else:
        preflight_slot_rows(call, ref.config.window_size, ref.device, slot_limit(ref.config))


def _cheap(entry: str, call: Any, window: int) -> bool:
    if entry == "request_window":
        return call.groups() * window + call.padded() <= CHEAP_ENTRIES
    return call.num_rows * call.row_width(window) <= CHEAP_ENTRIES


def _settled(where: str, inside: bool, field: str, error: tuple[type[BaseException], str | None] | None) -> list[str]:
    """Whether the reference's answer is the documented one: accepted inside the bounds, outside a typed
    error naming the setting."""
    if inside and error is not None:
        return [f"{where}: inside the bounds, the reference raised {error}"]
    if not inside and (
        error is None or not issubclass(error[0], SWAHalError) or error[1] not in _NAMES.get(field, {field})
    ):
        return [f"{where}: outside the bounds, the reference raised {error}, not a typed error naming {field}"]
    return []


# The request window's workspace (groups x W + padded rows inside int32) bounds two settings at once: its
# error names the padding where the groups and the live rows fit on their own, else the groups, and gives
# both values (docs/semantics.md #request-window-layouts).
_NAMES = dict.fromkeys(("num_groups", "padded_rows"), {"num_groups", "padded_rows"})


def _config_build(
    builder: SWAMetadataBuilder, rng: random.Random, device: torch.device, k: int, setting: str, value: Any
) -> list[str]:
    """An in-bound config value that keeps the guarded geometry cheap, through one malformed build on the
    backend and the reference (each of that config); nothing otherwise (the config is lazy, its buffers
    are the builders')."""
    if type(value) is not int or not 1 <= value <= 64 or setting == "max_num_batched_tokens":
        return []
    config, error = attempt_named(dataclasses.replace, GUARDED_CONFIG, **{setting: value})
    if error is not None:
        return []
    ours = SWAMetadataBuilder(config, device=device, backend=builder.backend_name, platform=builder.platform)
    return build_case(Draw(ours, reference_builder(config), rng, device, k))


def _slot_call_differences(
    builder: SWAMetadataBuilder,
    ref: SWAMetadataBuilder,
    rows: SlotRows,
    device: torch.device,
    where: str,
    strict: Callable[..., AbstractContextManager[Any]],
    named: bool = False,
) -> list[str]:
    """``named``: errors compared by type and field, untyped ones answered (the settings case); else by the
    type of a validation error."""
    tried = attempt_named if named else attempt
    want, want_error = tried(ref.build_slot_rows, rows)
    with strict():
        got, error = tried(builder.build_slot_rows, rows.to(device))
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
    where: str,
    got: list[SWAMetadata],
    want: list[SWAMetadata],
    builder: SWAMetadataBuilder,
    ref: SWAMetadataBuilder,
    want_recorded: bool | None = None,
) -> list[str]:
    """What differs between the two builds' groups, and whether only one recorded a violation
    (``want_recorded``: the reference's answer where it was already read)."""
    problems = [
        f"{where}, group {g}: {p}" for g, (a, b) in enumerate(zip(got, want)) for p in metadata_differences(a, b)
    ]
    if recorded(builder) != (recorded(ref) if want_recorded is None else want_recorded):
        problems.append(f"{where}: only one of the two recorded a violation")
    return problems


# The token-slot rows windows the cases cover (a row shorter and one longer than a page of 16).
SLOT_ROW_WINDOWS = (8, 20)
SLOT_ROW_CONFIGS = tuple(guarded_slot_rows_config(window) for window in SLOT_ROW_WINDOWS)


def _guarded_test(case: Callable[[Draw], list[str]], seed: str, *configs: SWAConfig) -> Callable[..., None]:
    """A test of ``GuardedOutputTests``: for each of ``configs``, its ``guarded_cases`` malformed inputs
    through ``case``, the backend's builder against a torch builder, drawn from ``seed`` formatted with the
    backend's ``name`` and the config's ``window``."""

    def test(
        self: GuardedOutputTests, name: str, make_builder: Callable[..., SWAMetadataBuilder], target: Target
    ) -> None:
        for config in configs:
            builder, ref = make_builder(config), reference_builder(config)
            rng = random.Random(seed.format(name=name, window=config.window_size))
            for k in range(self.guarded_cases):
                problems = case(Draw(builder, ref, rng, target.device, k))
                assert not problems, "; ".join(problems)

    return test


class GuardedOutputTests(BackendFixtures):
    """Seeded malformed inputs through every guarded entry point, compared with a torch builder."""

    # Malformed inputs per test and config (each runs every entry point it covers).
    guarded_cases: ClassVar[int] = 6

    test_guarded_builds_equal_the_reference = _guarded_test(build_case, "guarded-build-{name}", GUARDED_CONFIG)
    test_guarded_dspark_builds_equal_the_reference = _guarded_test(
        build_case, "guarded-dspark-{name}", GUARDED_DSPARK_CONFIG, GUARDED_DSPARK_EDGE_CONFIG
    )
    test_validated_builds_take_what_default_builds_take = _guarded_test(
        validated_case, "guarded-validated-{name}-{window}", GUARDED_CONFIG, GUARDED_DSPARK_EDGE_CONFIG
    )
    test_guarded_group_builds_equal_the_reference = _guarded_test(group_case, "guarded-groups-{name}", GUARDED_CONFIG)
    test_guarded_slot_rows_equal_the_reference = _guarded_test(
        slot_rows_case, "guarded-slot-rows-{name}-{window}", *SLOT_ROW_CONFIGS
    )
    test_guarded_ring_rows_equal_the_reference = _guarded_test(
        ring_rows_case, "guarded-ring-rows-{name}-{window}", *SLOT_ROW_CONFIGS
    )
    test_guarded_request_windows_equal_the_reference = _guarded_test(
        request_window_case, "guarded-request-window-{name}-{window}", *SLOT_ROW_CONFIGS
    )
    test_guarded_settings_at_their_bounds_equal_the_reference = _guarded_test(
        settings_case, "guarded-settings-{name}-{window}", SETTINGS_CONFIG, SLOT_ROW_CONFIGS[0]
    )


def batch_summary(batch: AttentionBatch) -> str:
    spans = batch.image_spans
    return (
        f"qsl={batch.query_start_loc_cpu.tolist()} seq={batch.seq_lens_cpu.tolist() if batch.seq_lens_cpu is not None else None} "
        f"table={batch.block_table.tolist()} slots={batch.slot_mapping.tolist()} max_query_len={batch.max_query_len} "
        f"num_tokens={batch.num_tokens} replay={None if batch.replay_start is None else batch.replay_start.tolist()} "
        f"spans={None if spans is None else (spans.indptr.tolist(), spans.starts.tolist(), spans.ends.tolist())}"
    )
