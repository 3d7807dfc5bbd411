"""docs/semantics.md #split: split a decodes-first batch into decodes and prefills, from host data only."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .errors import BatchOrderError, BatchRangeError


class Split(NamedTuple):
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int


def split_decodes_and_prefills(
    query_start_loc_cpu: np.ndarray | object,
    max_query_len: int,
    num_tokens: int,
    decode_threshold: int,
    query_lens: np.ndarray | None = None,
) -> Split:
    """Requests before the first one longer than ``decode_threshold`` are decodes; the rest
    (short ones after it too) are prefills. Padding rows go with the last group.

    ``query_lens`` (the differences of query_start_loc) may be passed when the caller has them.
    """
    qsl = query_start_loc_cpu if isinstance(query_start_loc_cpu, np.ndarray) else query_start_loc_cpu.numpy()  # type: ignore[attr-defined]
    num_reqs = qsl.shape[0] - 1
    if max_query_len <= decode_threshold:
        return Split(num_reqs, 0, num_tokens, 0)
    if query_lens is None:
        query_lens = qsl[1:] - qsl[:-1]
    longer = query_lens > decode_threshold
    first = int(longer.argmax())
    if not longer[first]:
        # max_query_len overstated the batch: every request is in fact a decode.
        return Split(num_reqs, 0, num_tokens, 0)
    decode_tokens = int(qsl[first])
    return Split(first, num_reqs - first, decode_tokens, num_tokens - decode_tokens)


def refuse_host_split(qsl: np.ndarray, num_decode_tokens: int, num_tokens: int) -> None:
    """The typed error for a host copy of query_start_loc the split cannot use (docs/semantics.md #split)."""
    if qsl[0] != 0:
        raise BatchOrderError("query_start_loc_cpu", f"query_start_loc_cpu[0]={int(qsl[0])}; it must start at 0", 0)
    raise BatchRangeError(
        "query_start_loc_cpu",
        f"query_start_loc_cpu puts the decode part's end at {num_decode_tokens}, outside [0, num_tokens={num_tokens}]",
    )
