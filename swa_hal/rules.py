"""The guarded build's rules and its record (docs/semantics.md #guarded-builds): one table every backend, launch
contract and the violation watch read.

A guarded build checks, in the build itself, what the host preflight cannot see without a sync (the torch
backend in ``torch_backend/guard.py`` and ``torch_backend/rows.py``, the Triton kernels through
``kernels/rules.py``). A row that breaks a rule is handed out empty, and the first violation found is
recorded in a small device buffer: ``[count, kind, request, value, group]`` (group: g + 1 where a group
build's group g broke the rule, else 0). ``SWAMetadataBuilder.check()`` reads it (one sync, when the engine
chooses) and raises, through ``violation_error``, the error full validation would have raised.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from .config import INT32_LIMIT
from .errors import (
    BatchCapacityError,
    BatchConsistencyError,
    BatchOrderError,
    BatchRangeError,
    BatchValidationError,
    SpeculativeModeError,
)

if TYPE_CHECKING:
    from .config import SWAConfig

# The record's fields, in order: the count of violations found (0: none), the rule broken (a ``Violation``),
# the request (or row) that broke it, the value it reports, and the group (g + 1 where a group build's group
# g broke the rule, else 0).
COUNT, KIND, REQUEST, VALUE, GROUP = range(5)
RECORD_LEN = GROUP + 1
# The kind of a record, or a candidate, that holds no violation (every rule's code is above it).
NO_VIOLATION = 0
# A candidate for the record: the record less its group, which is the build's (one per call).
CANDIDATE_LEN = GROUP


class Violation(enum.IntEnum):
    """The rules a guarded build checks, in the order a row is checked (the first broken one is kept)."""

    QUERY_ORDER = 1  # query_start_loc[r + 1] < query_start_loc[r]
    SEQ_SHORT = 2  # seq_lens[r] < query_len[r]
    REPLAY = 3  # replay_start[r] outside [0, seq_lens[r] - query_len[r]]
    SPAN = 4  # an image span inverted (start > end) or starting at a negative position
    PAGES = 5  # a window reads a page past the block table's width
    BLOCK = 6  # a window reads a block id outside [0, block_limit)
    ROW_WIDTH = 7  # a row needs more entries than its width (a DSpark block too long for its row)
    # Token-slot rows (docs/semantics.md #token-slot-rows); "request" is then the row.
    POOL = 8  # a row's pool index outside req_to_token's rows
    POSITION = 9  # a row reads a position past req_to_token's width
    TOKEN_SLOT = 10  # a token slot outside [-1, len(slot_map))
    CACHE_SLOT = 11  # a cache slot outside [-1, slot_limit)
    # Ring rows (docs/semantics.md #ring-rows); "request" is the row.
    RING_SLOT = 12  # a row's request slot outside the ring's slots
    # Builds again, what the host trusted (13 is checked first at a row, 14 after rule 2).
    PADDING_SLOT = 13  # a row past query_start_loc[R] (padding) holds a slot; the value is the row
    # A request's device offsets disagree with the host's split (max_query_len, the decode part, a padding
    # request past the replay bounds with query tokens).
    HOST_SPLIT = 14
    HOST_SEQ = 15  # a prefill's seq_lens_cpu[r] differs from seq_lens[r] (the chunk plan reads the host copy)
    MODEL_LEN = 16  # seq_lens[r] past max_model_len (checked after rule 2)
    OWN_SLOT = 17  # slot_mapping[t] is not the token's own slot by the block table (checked after 5 and 6)


def block_limit(config: SWAConfig) -> int:
    """Block ids a window may read lie in [0, block_limit): the KV cache's pages when the config knows
    them, else every id whose slots fit FlashMLA's int32 slot encoding."""
    # Capped at INT32_LIMIT so the bound itself is an int32 value (block ids are int32).
    if config.num_kv_blocks is not None:
        return min(config.num_kv_blocks, INT32_LIMIT)
    return min((INT32_LIMIT + 1) // config.block_size, INT32_LIMIT)


def violation_error(
    record: list[int], config: SWAConfig, group_names: Sequence[int] | None = None
) -> BatchValidationError | None:
    """The typed error a recorded violation stands for (the type full validation raises), or None. A
    violation a group build's group g recorded names the group: ``group g``, or ``KV-cache group
    group_names[g]`` where the builder serves an engine that numbers its groups otherwise."""
    count, kind, req, value, group = record
    if count == 0:
        return None
    error = _rule_error(kind, req, value, config)
    if group == 0:
        return error
    g = group - 1
    name = f"KV-cache group {group_names[g]}" if group_names is not None and g < len(group_names) else f"group {g}"
    return type(error)(error.field, f"{name}: {error.constraint}", error.index)


# Each rule's error: its type (the one full validation raises), its field, which number is its index (the
# request ``req``, the next offset ``next`` or the row ``value``), and its message, formatted with ``req``,
# ``next``, ``value``, ``limit`` (``block_limit``) and ``config``.
_ERRORS: dict[int, tuple[type[BatchValidationError], str, str, str]] = {
    Violation.QUERY_ORDER: (
        BatchOrderError,
        "query_start_loc",
        "next",
        "query_start_loc[{next}] is smaller than query_start_loc[{req}] (query length {value}): it must be "
        "non-decreasing",
    ),
    Violation.SEQ_SHORT: (
        BatchRangeError,
        "seq_lens",
        "req",
        "seq_lens[{req}]={value} is shorter than its query length",
    ),
    Violation.REPLAY: (
        BatchRangeError,
        "replay_start",
        "req",
        "replay_start[{req}]={value} is outside [0, seq_lens[{req}] - query_len]",
    ),
    Violation.SPAN: (
        BatchRangeError,
        "image_spans",
        "req",
        "image_spans[{req}]: span {value} is inverted or starts at a negative position",
    ),
    Violation.PAGES: (
        BatchCapacityError,
        "block_table",
        "req",
        "block_table: request {req}'s window reads page {value}, past the table's width",
    ),
    Violation.BLOCK: (
        BatchRangeError,
        "block_table",
        "req",
        "block_table: request {req}'s window reads block id {value}, outside [0, {limit}) "
        "(num_kv_blocks={config.num_kv_blocks})",
    ),
    Violation.ROW_WIDTH: (
        SpeculativeModeError,
        "decode_swa_indices",
        "req",
        "request {req}: its row needs {value} entries, wider than the row; refusing to truncate",
    ),
    Violation.POOL: (BatchRangeError, "pools", "req", "pools[{req}]={value} is not a row of req_to_token"),
    Violation.POSITION: (
        BatchCapacityError,
        "req_to_token",
        "req",
        "req_to_token: row {req}'s window reads position {value}, past the table's width",
    ),
    Violation.TOKEN_SLOT: (
        BatchRangeError,
        "req_to_token",
        "req",
        "req_to_token: row {req}'s window reads token slot {value}, outside [-1, len(slot_map))",
    ),
    Violation.CACHE_SLOT: (
        BatchRangeError,
        "slot_map",
        "req",
        "slot_map: row {req}'s window reads cache slot {value}, outside the cache",
    ),
    Violation.RING_SLOT: (BatchRangeError, "pools", "req", "pools[{req}]={value} is not a request slot of the ring"),
    Violation.PADDING_SLOT: (
        BatchConsistencyError,
        "slot_mapping",
        "value",
        "slot_mapping[{value}] holds a slot but row {value} is past the scheduled tokens (query_start_loc[-1]); "
        "padding rows must be -1",
    ),
    Violation.HOST_SPLIT: (
        BatchConsistencyError,
        "query_start_loc",
        "req",
        "request {req}: its {value} query tokens on the device disagree with the split made from the host "
        "copies (query_start_loc_cpu, max_query_len): a request is at most max_query_len long, a decode at "
        "most max_decode_query_len and inside the decode tokens, a prefill after them, every request inside "
        "num_tokens, and a request past replay_start's bounds (a padding request of the host copy) has none",
    ),
    Violation.HOST_SEQ: (
        BatchConsistencyError,
        "seq_lens_cpu",
        "req",
        "seq_lens_cpu[{req}]={value} differs from seq_lens[{req}] on the device; prefill rows must be exact "
        "(the chunk plan and prefill_seq_lens_cpu read the host copy)",
    ),
    Violation.MODEL_LEN: (
        BatchCapacityError,
        "seq_lens",
        "req",
        "seq_lens[{req}]={value} exceeds max_model_len={config.max_model_len}",
    ),
    Violation.OWN_SLOT: (
        BatchConsistencyError,
        "slot_mapping",
        "value",
        "slot_mapping[{value}] is not the slot block_table gives request {req}'s token at row {value} "
        "(block_size={config.block_size}): a block table made for another page size, or a slot mapping of "
        "another table",
    ),
}


def _rule_error(kind: int, req: int, value: int, config: SWAConfig) -> BatchValidationError:
    """The typed error of rule ``kind`` broken by request (or row) ``req`` with ``value``."""
    where = " (found by a guarded build, which handed the offending rows out empty)"
    if kind not in _ERRORS:
        return BatchValidationError("batch", f"unknown guard violation kind {kind} at request {req}{where}", req)
    error, field, index, message = _ERRORS[kind]
    numbers = {"req": req, "next": req + 1, "value": value}
    text = message.format(**numbers, limit=block_limit(config), config=config)
    return error(field, text + where, numbers[index])


def record_candidate(record: torch.Tensor, found: torch.Tensor, candidate: torch.Tensor) -> None:
    """Record ``candidate`` (count, kind, request, value) where ``found`` (bool [1]) and ``record`` holds no
    violation yet. A token-slot call is no group build: the group entry stays 0 (a record with count 0
    is all zeros). No host sync."""
    head = record[:CANDIDATE_LEN]
    torch.where(record[:1] < found.to(record.dtype), candidate.to(record.dtype), head, out=head)
