"""The plain model, and the conformance topic that holds a backend to it: an obviously-correct model of
docs/semantics.md #split, #per-token-helpers, #causal-rows, #bounded-replay, #vision-spans, #dspark-rows and
#prefill-metadata, one Python loop per token and per window entry, for valid batches.

Slow on purpose, and apart from the fast paths: ``swa_hal.reference`` (the vectorised reference every other
topic compares with) is checked against it in this repository's tests, and ``PlainModelTests`` compares a
backend's own builds with it directly, so a backend is judged by a model that shares no code with the
torch backend's tuned path.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any

from .fixtures import BackendFixtures, MakeBatch, MakeBuilder

if TYPE_CHECKING:
    from ..batch import AttentionBatch
    from ..config import SWAConfig
    from ..metadata import SWAMetadata


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


def position(qsl, seq_lens, t):
    r = owner(qsl, t)
    return seq_lens[r] - (qsl[r + 1] - qsl[r]) + (t - qsl[r])


def visibility(qsl, seq_lens, spans, t, max_image):
    """(left, right) of token t: from the last listed span of its request that holds its position. The
    span may start before the request's new tokens and hold more than max_image tokens; the token sees
    no further right than the request's last position, seq_lens[r] - 1."""
    r, p = owner(qsl, t), position(qsl, seq_lens, t)
    last = seq_lens[r] - 1
    left = right = 0
    for a, e in spans.get(r, []):
        if a <= p <= e:
            left = min(p - a, max_image - 1)
            right = max(min(min(e, last) - p, max_image), 0)
    return left, right


def causal_row(qsl, seq_lens, table, valid, t, window, block_size, replay, width=None, left=0, right=0):
    width = window if width is None else width
    if not valid[t]:
        return [-1] * width, 0
    r = owner(qsl, t)
    p = position(qsl, seq_lens, t)
    start = max(p - (window - 1) - max(left - (window - 1), 0), 0)
    start = max(start, replay[r])
    n = max(p + right + 1 - start, 0)
    # A row that needs more entries than its width (an image longer than M + W when M > W) keeps the
    # first `width` of its positions.
    n = min(n, width)
    row = [slot(table[r], block_size, start + j) for j in range(n)]
    return row + [-1] * (width - n), n


def noncausal_row(qsl, seq_lens, table, valid, t, window, block_size, width):
    if not valid[t]:
        return [-1] * width, 0
    r = owner(qsl, t)
    prefix = seq_lens[r] - (qsl[r + 1] - qsl[r])
    start = max(prefix - window, 0)
    n = seq_lens[r] - start
    assert n <= width, f"DSpark row {t} needs {n} entries, wider than its {width} (a valid batch never does)"
    row = [slot(table[r], block_size, start + j) for j in range(n)]
    return row + [-1] * (width - n), n


def dspark_width(window, drafts):
    return math.ceil((window + drafts) / 64) * 64


def model(config: SWAConfig, batch: AttentionBatch) -> dict[str, Any]:
    """Every output of a build, as Python lists."""
    qsl = batch.query_start_loc_cpu.tolist()
    # R is the host offsets' request count; longer per-request inputs are read for their first R entries.
    seq_lens = batch.seq_lens.cpu().tolist()[: len(qsl) - 1]
    table = batch.block_table.cpu().tolist()
    slots = batch.slot_mapping.cpu().tolist()
    query_lens = [qsl[r + 1] - qsl[r] for r in range(len(seq_lens))]
    t_count = batch.num_tokens
    nd, npf, ndt, npt = split(query_lens, batch.max_query_len, t_count, config.decode_threshold)
    valid = [s >= 0 for s in slots]
    w, b = config.window_size, config.block_size
    t2r = [owner(qsl, t) for t in range(t_count)]
    # No bounds, or none past the bounds given (padding requests, #bounded-replay): 0.
    bounds = [] if batch.replay_start is None else batch.replay_start.cpu().tolist()[: len(seq_lens)]
    replay = bounds + [0] * (len(seq_lens) - len(bounds))
    spans = {}
    if batch.image_spans is not None:
        ptr = batch.image_spans.indptr.cpu().tolist()
        starts, ends = batch.image_spans.starts.cpu().tolist(), batch.image_spans.ends.cpu().tolist()
        spans = {r: list(zip(starts[ptr[r] : ptr[r + 1]], ends[ptr[r] : ptr[r + 1]])) for r in range(len(seq_lens))}
    m = config.max_image_tokens
    images = m > 0 and any(spans.values()) and npt > 0
    if batch.causal:
        dec = [causal_row(qsl, seq_lens, table, valid, t, w, b, replay) for t in range(ndt)]
    else:
        width = dspark_width(w, config.num_speculative_tokens)
        dec = [noncausal_row(qsl, seq_lens, table, valid, t, w, b, width) for t in range(ndt)]
    vis = [visibility(qsl, seq_lens, spans, t, m) if images else (0, 0) for t in range(ndt, t_count)]
    pre = [
        causal_row(qsl, seq_lens, table, valid, t, w, b, replay, w + m, *lr) for t, lr in zip(range(ndt, t_count), vis)
    ]
    gather = [query_lens[r] + min(max(seq_lens[r] - query_lens[r] - replay[r], 0), w - 1) for r in range(nd, nd + npf)]
    return {
        "split": (nd, npf, ndt, npt),
        "token_to_req": t2r,
        "is_valid": valid,
        "decode_indices": [row for row, _ in dec],
        "decode_lens": [n for _, n in dec],
        "prefill_indices": [row for row, _ in pre],
        "prefill_lens": [n for _, n in pre],
        "gather_lens": gather,
        "left_visible": [0] * ndt + [lv for lv, _ in vis] if images else None,
        "right_visible": [0] * ndt + [rv for _, rv in vis] if images else None,
    }


def plain_differences(config: SWAConfig, batch: AttentionBatch, md: SWAMetadata) -> list[str]:
    """Every output of ``md`` that differs from the plain model's for ``batch`` (empty: equal). The visibility
    arrays are compared at the prefill rows, where they are meaningful."""
    want = model(config, batch)
    split = (md.num_decodes, md.num_prefills, md.num_decode_tokens, md.num_prefill_tokens)
    if split != want["split"]:
        return [f"split: got {split}, plain model {want['split']}"]
    ndt, t = md.num_decode_tokens, batch.num_tokens
    got: dict[str, Any] = {
        "token_to_req": md.token_to_req_indices[:t].tolist(),
        "is_valid": md.is_valid_token[:t].tolist(),
        "decode_indices": _rows(md.decode_swa_indices, ndt),
        "decode_lens": md.decode_swa_lens[:ndt].tolist(),
        "prefill_indices": _rows(md.prefill_swa_indices, md.num_prefill_tokens),
        "prefill_lens": [] if md.prefill_swa_lens is None else md.prefill_swa_lens.tolist(),
        "gather_lens": [] if md.prefill_gather_lens is None else md.prefill_gather_lens.tolist(),
    }
    for key, value in (("left_visible", md.prefill_left_visible), ("right_visible", md.prefill_right_visible)):
        expected = want[key]
        seen = None if value is None else value[ndt:t].tolist()
        if expected is None:  # no image reaches a prefill row: nothing visible beyond the window
            got[key] = None if seen is None or not any(seen) else [0] * ndt + seen
        else:
            want[key] = expected[ndt:]
            got[key] = seen
    return [f"{key}: got {got[key]}, plain model {want[key]}" for key in got if got[key] != want[key]]


def _rows(t: Any, n: int) -> list[list[int]]:
    return [] if t is None or n == 0 else t[:n].reshape(n, t.shape[-1]).tolist()


class PlainModelTests(BackendFixtures):
    """Every config of ``configs`` with every batch kind it allows: a few random valid batches (replay bounds
    and image spans on most of them) built by the backend equal the plain model, output by output."""

    def test_random_batches_match_the_plain_model(
        self, name: str, make_builder: MakeBuilder, make_batch: MakeBatch, config_name: str, kind: str
    ) -> None:
        config = self.configs[config_name]
        builder = make_builder(config)
        rng = random.Random(f"plain-{name}-{config_name}-{kind}")
        for i in range(2):
            batch = make_batch(config, rng, kind, replay=0.8, spans=1.0)
            problems = plain_differences(config, batch, builder.build(batch))
            assert not problems, f"{kind} batch {i} ({batch.num_tokens} tokens): " + "; ".join(problems)
