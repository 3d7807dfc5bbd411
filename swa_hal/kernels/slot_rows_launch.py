"""The launch contract of ``slot_rows_kernel`` (``slot_rows.py``; docs/semantics.md #token-slot-rows):
its compile key, the calls a config can make, its argument record and launch object, which owns the
dispatch. Importable without Triton.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..config import dspark_index_width
from ..slot_rows import slot_limit
from .launch import DtypesKey, KeyedLaunch, cdiv, record_fields
from .tiles import tile

if TYPE_CHECKING:
    from ..config import SWAConfig


SLOT_ROWS_INPUTS = ("ends_ptr", "pools_ptr", "floors_ptr", "rt_ptr", "map_ptr", "block_slots_ptr")


@dataclasses.dataclass(frozen=True, eq=False)
class SlotRowsKey(DtypesKey):
    """The constexprs of ``slot_rows_kernel``, and the dtypes of the engine's inputs its compilation is
    specialised on (``dtypes``: ends, pools, floors, req_to_token, slot map, block slots). ``RING``: the
    ring's rows per request slot (docs/semantics.md #ring-rows), 0 for paged rows."""

    WINDOW: int
    WIDTH: int
    BLOCK_N: int
    HAS_FLOORS: bool
    RING: int
    BLOCK_T: int
    BLOCK_W: int
    GUARD: bool
    SLOT_LIMIT: int
    CLAMP: bool
    dtypes: tuple[torch.dtype, ...] = ()

    INPUTS = SLOT_ROWS_INPUTS


@dataclasses.dataclass(slots=True, kw_only=True, eq=False)
class SlotRowsArgs:
    """The runtime arguments of ``slot_rows_kernel``, in signature order."""

    out_ptr: Any
    lens_ptr: Any
    violation_ptr: Any
    ends_ptr: Any
    pools_ptr: Any
    floors_ptr: Any
    rt_ptr: Any
    map_ptr: Any
    block_slots_ptr: Any
    n_rows: int
    rt_stride: int
    rt_width: int
    num_pools: int
    map_len: int


SLOT_ROWS_POINTERS: dict[str, torch.dtype] = dict.fromkeys(record_fields(SlotRowsArgs)[:9], torch.int32)
# Every pointer is read at every launch: the outputs may be the engine's tensors too
# (``build_slot_rows(out=..., lens=...)``), and absent optional inputs read the violation record.
SLOT_ROWS_ENGINE = ("out_ptr", "lens_ptr", "violation_ptr", *SLOT_ROWS_INPUTS)
SLOT_ROWS_INTS = [name for name in record_fields(SlotRowsArgs) if name not in SLOT_ROWS_POINTERS]


def slot_rows_key(
    window: int,
    width: int,
    block: int,
    *,
    has_floors: bool,
    guard: bool,
    slot_limit: int,
    clamp: bool,
    device_type: str,
    dtypes: tuple[torch.dtype, ...],
    ring: int = 0,
) -> SlotRowsKey:
    # Rows of one token each, two dependent gathers per entry: latency-bound like decode rows.
    block_t, block_w = tile(width, device_type, decode=True)
    return SlotRowsKey(
        WINDOW=window,
        WIDTH=width,
        BLOCK_N=block,
        HAS_FLOORS=has_floors,
        RING=ring,
        BLOCK_T=block_t,
        BLOCK_W=block_w,
        GUARD=guard,
        SLOT_LIMIT=slot_limit,
        CLAMP=clamp,
        dtypes=dtypes,
    )


class SlotRowsFacts(NamedTuple):
    """What a token-slot call brings that its compile key depends on: ``slot_rows_key``'s arguments
    besides the window, the clamping and the device type (the config's and the backend's)."""

    width: int  # the rows' width
    block: int  # DSpark's block of draft tokens per request (0: causal rows)
    has_floors: bool
    ring: int  # the ring's size in slots (0: rows over the paged pool)
    guard: bool
    slot_limit: int
    dtypes: tuple[torch.dtype, ...]  # row ends, pools, floors, req_to_token, slot map, block slots


_I32, _I64 = torch.int32, torch.int64
# Absent inputs read the violation record (int32) in their place (``TritonBackend.compute_slot_rows``).
_ABSENT = _I32


def slot_rows_facts(config: SWAConfig, guard: bool) -> list[SlotRowsFacts]:
    """The token-slot calls an engine with this config makes (SGLang's, ``integrations/sglang.py``),
    inputs in SGLang's dtypes: ends int32, pool rows int64, ``req_to_token`` int32, ``full_to_swa`` int64.

    * causal rows (``BuildCausalSwaPageIndices``), ``align(W, 64)`` wide, with no floors or with
      ``swa_replay_start`` as int32 or int64 (the replay paths compute it from either);
    * with DSpark, blocks of the draft's ``num_speculative_tokens`` (SGLang's ``speculative_num_draft_tokens
      - 1``), ``align(W + N, 64)`` wide, with or without ``valid_from`` (int64): over the paged pool (the
      block's own slots, ``out_loc``, int64) and over the draft's per-request ring, whose size is SGLang's
      ``get_draft_swa_ring_size``: ``W + N`` rounded up to whole pages.

    Rows of another alignment (``page_index_aligned_size``) or ring are compiled at their first call."""
    limit, window = slot_limit(config), config.window_size
    causal_width = dspark_index_width(window, 0)
    facts = [
        SlotRowsFacts(
            width=causal_width,
            block=0,
            has_floors=floors is not None,
            ring=0,
            guard=guard,
            slot_limit=limit,
            dtypes=(_I32, _I64, floors or _ABSENT, _I32, _I64, _ABSENT),
        )
        for floors in (None, _I32, _I64)
    ]
    if config.is_dspark:
        block = config.num_speculative_tokens
        width = dspark_index_width(window, block)
        ring_size = cdiv(window + block, config.block_size) * config.block_size
        for floors in (None, _I64):
            floor = floors or _ABSENT
            # Over the paged pool (reading the block's own slots), then over the draft's ring.
            for ring, read in ((0, (_I32, _I64, _I64)), (ring_size, (_ABSENT, _ABSENT, _ABSENT))):
                facts.append(
                    SlotRowsFacts(
                        width=width,
                        block=block,
                        has_floors=floors is not None,
                        ring=ring,
                        guard=guard,
                        slot_limit=limit,
                        dtypes=(_I32, _I64, floor, *read),
                    )
                )
    return facts


class SlotRowsLaunch(KeyedLaunch[SlotRowsKey]):
    """``slot_rows_kernel``: one launch per ``build_slot_rows``. A call's facts are ``SlotRowsFacts``."""

    KERNEL = "swa_hal.kernels.slot_rows:slot_rows_kernel"
    Args = SlotRowsArgs
    POINTERS = SLOT_ROWS_POINTERS
    Facts = SlotRowsFacts
    ENGINE = SLOT_ROWS_ENGINE

    def dispatch(self, facts: SlotRowsFacts) -> SlotRowsKey:
        return slot_rows_key(self.config.window_size, clamp=self.clamp, device_type=self.device_type, **facts._asdict())

    def warmup_facts(self, guard: bool) -> list[SlotRowsFacts]:
        return slot_rows_facts(self.config, guard)

    @staticmethod
    def programs(key: SlotRowsKey, args: SlotRowsArgs) -> int:
        return cdiv(args.n_rows, key.BLOCK_T)
