"""An obviously-correct model of docs/semantics.md #split, #per-token-helpers, #causal-rows, #dspark-rows, #prefill-metadata: one Python loop per token and per window entry.

Slow on purpose: it exists to check reference.py, which is vectorized and fast.
"""

from __future__ import annotations

import math


def split(query_lens, max_query_len, num_tokens, threshold):
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    r_count = len(query_lens)
    if max_query_len <= threshold:
        return (r_count, 0, num_tokens, 0)
    first = next((r for r, q in enumerate(query_lens) if q > threshold), None)
    if first is None:
        return (r_count, 0, num_tokens, 0)
    return (first, r_count - first, qsl[first], num_tokens - qsl[first])


def slot(table_row, block_size, position):
    return table_row[position // block_size] * block_size + position % block_size


def owner(qsl, t):
    for r in range(len(qsl) - 1):
        if qsl[r] <= t < qsl[r + 1]:
            return r
    return 0


def causal_row(qsl, seq_lens, table, valid, t, window, block_size):
    if not valid[t]:
        return [-1] * window, 0
    r = owner(qsl, t)
    p = seq_lens[r] - (qsl[r + 1] - qsl[r]) + (t - qsl[r])
    start = max(p - window + 1, 0)
    n = p + 1 - start
    row = [slot(table[r], block_size, start + j) for j in range(n)]
    return row + [-1] * (window - n), n


def noncausal_row(qsl, seq_lens, table, valid, t, window, block_size, width):
    if not valid[t]:
        return [-1] * width, 0
    r = owner(qsl, t)
    prefix = seq_lens[r] - (qsl[r + 1] - qsl[r])
    start = max(prefix - window, 0)
    n = seq_lens[r] - start
    assert n <= width
    row = [slot(table[r], block_size, start + j) for j in range(n)]
    return row + [-1] * (width - n), n


def dspark_width(window, drafts):
    return math.ceil((window + drafts) / 64) * 64


def model(config, batch):
    """Every output of a build, as Python lists."""
    seq_lens = batch.seq_lens.cpu().tolist()
    qsl = batch.query_start_loc_cpu.tolist()
    table = batch.block_table.cpu().tolist()
    slots = batch.slot_mapping.cpu().tolist()
    query_lens = [qsl[r + 1] - qsl[r] for r in range(len(seq_lens))]
    t_count = batch.num_tokens
    nd, npf, ndt, npt = split(query_lens, batch.max_query_len, t_count, config.decode_threshold)
    valid = [s >= 0 for s in slots]
    w, b = config.window_size, config.block_size
    t2r = [owner(qsl, t) for t in range(t_count)]
    if batch.causal:
        dec = [causal_row(qsl, seq_lens, table, valid, t, w, b) for t in range(ndt)]
    else:
        width = dspark_width(w, config.num_speculative_tokens)
        dec = [noncausal_row(qsl, seq_lens, table, valid, t, w, b, width) for t in range(ndt)]
    pre = [causal_row(qsl, seq_lens, table, valid, t, w, b) for t in range(ndt, t_count)]
    gather = [query_lens[r] + min(seq_lens[r] - query_lens[r], w - 1) for r in range(nd, nd + npf)]
    return {
        "split": (nd, npf, ndt, npt),
        "token_to_req": t2r,
        "is_valid": valid,
        "decode_indices": [row for row, _ in dec],
        "decode_lens": [n for _, n in dec],
        "prefill_indices": [row for row, _ in pre],
        "prefill_lens": [n for _, n in pre],
        "gather_lens": gather,
    }
