"""The launch contract of ``swa_metadata_kernel`` (``swa_metadata.py``): its compile key, the builds a
config can launch, its argument record, and the launch object, which owns the dispatch (docs/semantics.md
#per-token-helpers, #causal-rows, #dspark-rows, #prefill-metadata, #group-builds). Importable without Triton.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..rules import block_limit
from .launch import CompileKey, KeyedLaunch, cdiv, record_fields
from .tiles import next_pow2, tile

if TYPE_CHECKING:
    from ..config import SWAConfig

# Requests compared per step of the owner search: the whole batch in one step up to 512 requests.
MAX_SEARCH_BLOCK = 512
# Rows per lens-clearing program and prefills per gather program: fixed sizes the kernel reads as its own
# constants (not compile-key fields), and the grid divides by.
CLEAR_BLOCK = 1024
GATHER_BLOCK = 256


@dataclasses.dataclass(frozen=True, eq=False)
class RowsKey(CompileKey):
    """The constexprs of ``swa_metadata_kernel``, in signature order."""

    WINDOW: int
    DECODE_WIDTH: int
    PREFILL_WIDTH: int
    BLOCK_SIZE: int
    BLOCK_T: int
    BLOCK_W: int
    BLOCK_TP: int
    BLOCK_WP: int
    SEARCH_BLOCK: int
    MAX_IMAGE: int
    NONCAUSAL: bool
    GUARD: bool
    BLOCK_LIMIT: int
    GROUPED: bool
    CLAMP: bool


@dataclasses.dataclass(slots=True, kw_only=True, eq=False)
class RowsArgs:
    """The runtime arguments of ``swa_metadata_kernel``, in signature order. Pointer fields hold a
    tensor or its address (see ``ROWS_ENGINE``); the rest are host ints. (A backend keeps one record
    per row kind and refills its per-build fields by name for every launch: see ``launch.py``.)"""

    # outputs: the builder's fixed buffers (per-group ones stacked group after group)
    decode_idx_ptr: Any
    decode_lens_ptr: Any
    prefill_idx_ptr: Any
    prefill_lens_ptr: Any
    token_to_req_ptr: Any
    is_valid_ptr: Any
    gather_lens_ptr: Any
    left_ptr: Any
    right_ptr: Any
    violation_ptr: Any
    # inputs: engine tensors, or the builder's zero buffers when the batch has none
    qsl_ptr: Any
    seq_lens_ptr: Any
    # the prefills' host seq_lens on the device (rule 15), or seq_lens itself where none is held
    host_seq_ptr: Any
    block_table_ptr: Any
    slot_mapping_ptr: Any
    replay_ptr: Any
    span_indptr_ptr: Any
    span_starts_ptr: Any
    span_ends_ptr: Any
    group_inputs_ptr: Any
    # host scalars
    bt_stride: int
    max_pages: int
    num_reqs: int
    num_tokens: int
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int
    decode_clear_end: int
    dec_progs: int
    pre_progs: int
    clear_progs: int
    search_chunks: int
    num_groups: int
    group_rows: int
    decode_guess_len: int
    prefill_guess_len: int
    max_query_len: int
    decode_query_max: int
    num_spans: int
    # rule 16's bound (INT32_LIMIT in draft-step updates), and whether rule 17 is checked (1 in builds, 0 in
    # draft-step updates)
    max_model_len: int
    build_checks: int
    # rule 14: the requests with a replay bound (those past them are padding in the host copy, without query
    # tokens), and whether a prefill follows a draft-step update's decodes (1: the decode part has no padding)
    num_bounds: int
    prefill_follows: int

    def programs(self) -> int:
        """The grid: per group its decode, prefill and lens-clearing programs, then the gather programs."""
        return self.num_groups * (self.dec_progs + self.pre_progs + self.clear_progs) + cdiv(
            self.num_prefills, GATHER_BLOCK
        )


_I32, _I64 = torch.int32, torch.int64
# Every pointer field and its dtype (what compilation is specialised on).
ROWS_POINTERS: dict[str, torch.dtype] = {
    **dict.fromkeys(record_fields(RowsArgs)[:20], _I32),
    "is_valid_ptr": torch.bool,
    "slot_mapping_ptr": _I64,
    "group_inputs_ptr": _I64,
}
# Pointer fields that are engine tensors (or span buffers the batch brings): their addresses are read at
# every launch and compilation never assumes their alignment. The other pointer fields are the
# builder's own buffers, which never move.
ROWS_ENGINE = (
    "qsl_ptr",
    "seq_lens_ptr",
    "host_seq_ptr",
    "block_table_ptr",
    "slot_mapping_ptr",
    "replay_ptr",
    "span_indptr_ptr",
    "span_starts_ptr",
    "span_ends_ptr",
)
# Runtime ints: never specialised (value 1, multiples of 16), so one compile per key serves every shape.
ROWS_INTS = [name for name in record_fields(RowsArgs) if name not in ROWS_POINTERS]


def search_block(config: SWAConfig) -> int:
    return min(MAX_SEARCH_BLOCK, next_pow2(max(16, config.max_num_seqs)))


def rows_key(
    config: SWAConfig, *, causal: bool, clamp: bool, device_type: str, guard: bool = False, grouped: bool = False
) -> RowsKey:
    width = config.window_size if causal else config.noncausal_index_width
    block_t, block_w = tile(width, device_type, decode=True)
    block_tp, block_wp = tile(config.prefill_index_width, device_type)
    return RowsKey(
        WINDOW=config.window_size,
        DECODE_WIDTH=width,
        PREFILL_WIDTH=config.prefill_index_width,
        BLOCK_SIZE=config.block_size,
        BLOCK_T=block_t,
        BLOCK_W=block_w,
        BLOCK_TP=block_tp,
        BLOCK_WP=block_wp,
        SEARCH_BLOCK=search_block(config),
        MAX_IMAGE=config.max_image_tokens,
        NONCAUSAL=not causal,
        GUARD=guard,
        BLOCK_LIMIT=block_limit(config),
        GROUPED=grouped,
        CLAMP=clamp,
    )


class RowsFacts(NamedTuple):
    """What a build brings that its compile key depends on (``RowsLaunch.dispatch``)."""

    causal: bool  # causal rows, or DSpark's (docs/semantics.md #dspark-rows)
    guard: bool  # a guarded build (docs/semantics.md #guarded-builds)
    grouped: bool  # two KV-cache groups or more, read through the group table


def rows_facts(config: SWAConfig, guard: bool) -> list[RowsFacts]:
    """Every build a builder with this config can launch: the causal build (draft-step updates launch it
    too, with decode programs only), the DSpark build when DSpark is configured, and both again as group
    builds when the config has more than one KV-cache group."""
    return [
        RowsFacts(causal=causal, guard=guard, grouped=grouped)
        for grouped in ((False, True) if config.num_kv_groups > 1 else (False,))
        for causal in ((True, False) if config.is_dspark else (True,))
    ]


def rows_keys(config: SWAConfig, *, clamp: bool, device_type: str, guard: bool = False) -> list[RowsKey]:
    """The keys of ``rows_facts``, without Triton (``RowsLaunch.warmup_keys`` is the launch's own)."""
    return [
        rows_key(config, clamp=clamp, device_type=device_type, **facts._asdict()) for facts in rows_facts(config, guard)
    ]


class RowsLaunch(KeyedLaunch[RowsKey]):
    """``swa_metadata_kernel``: one launch per build, group build or draft-step update. A call's facts
    are ``RowsFacts``."""

    KERNEL = "swa_hal.kernels.swa_metadata:swa_metadata_kernel"
    Args = RowsArgs
    POINTERS = ROWS_POINTERS
    Facts = RowsFacts
    ENGINE = ROWS_ENGINE

    def dispatch(self, facts: RowsFacts) -> RowsKey:
        return rows_key(self.config, clamp=self.clamp, device_type=self.device_type, **facts._asdict())

    def warmup_facts(self, guard: bool) -> list[RowsFacts]:
        return rows_facts(self.config, guard)
