"""Random valid batches of every shape the semantics distinguish, for conformance and fuzz tests."""

from __future__ import annotations

import random

import torch

from ..batch import AttentionBatch
from ..config import SWAConfig
from ..scenarios import synthesize_batch

KINDS = ("decode", "mtp", "mixed", "prefill", "padded", "invalid", "short_context", "dspark")


def random_batch(
    config: SWAConfig,
    rng: random.Random,
    kind: str,
    *,
    max_tokens: int | None = None,
    max_reqs: int | None = None,
    max_context: int | None = None,
    extra_pages: int | None = None,
    device: str = "cpu",
    replay: float = 0.3,
    spans: float = 0.7,
    departures: bool = False,
    dspark_prefills: float = 0.5,
) -> AttentionBatch:
    """A valid batch of ``kind`` (one of KINDS) within the config's limits.

    decode: one token per request. mtp: decodes of 1..decode_threshold tokens. mixed: decodes, then
    prefills, with short requests after the first long one (they are prefills too). prefill: only
    prefills. padded: padding rows and zero-length padding requests. invalid: real tokens without a
    slot. short_context: contexts shorter than the window. dspark: a non-causal DSpark draft step, with
    probability ``dspark_prefills`` with prefills after its drafts.
    Block tables are exactly as wide as needed, or a little wider.
    With probability ``replay`` the batch carries replay bounds (docs/semantics.md #bounded-replay)
    anywhere in [0, prefix], the edges favoured; with probability ``spans``, when the config has
    image tokens, prefills carry image spans (#vision-spans): inside the new tokens, straddling their
    start (a prefix-cache hit inside an image, the image's start up to M + W + 2 positions before the
    first new token), longer than M, overlapping ones included. ``departures`` also draws the spans where
    swa_hal departs from the engines' builders on purpose (#engine-parity): spans past the request's last
    position (a chunk that ends inside its image), and, where M > W, spans longer than M + W, whose rows
    need more than the W + M width; without it every span gives the engines' own rows.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown batch kind {kind!r}; known: {', '.join(KINDS)}")
    cap = min(max_tokens or config.max_num_batched_tokens, config.max_num_batched_tokens)
    reqs_cap = min(max_reqs or config.max_num_seqs, config.max_num_seqs)
    ctx_cap = min(max_context or config.max_model_len, config.max_model_len)
    thr = config.decode_threshold
    w = config.window_size

    def context(q: int, short: bool = False) -> int:
        hi = min(ctx_cap, w - 1) if short and w > 1 else ctx_cap
        hi = max(hi, q)
        # Favour the interesting region around the window edge half of the time.
        if rng.random() < 0.5:
            return min(ctx_cap, max(q, rng.randint(max(q, w - 3), max(q, w + 3, 1))))
        return rng.randint(q, hi)

    seqs: list[int] = []
    queries: list[int] = []
    budget = cap

    def add(q: int, short: bool = False) -> bool:
        nonlocal budget
        if len(queries) >= reqs_cap or q > budget or q > ctx_cap:
            return False
        queries.append(q)
        seqs.append(context(q, short))
        budget -= q
        return True

    causal = True
    padding_rows = 0
    padding_reqs = 0
    invalid = 0
    if kind in ("decode", "padded", "invalid", "short_context"):
        for _ in range(rng.randint(1, max(1, min(reqs_cap, cap)))):
            add(1, short=(kind == "short_context"))
    elif kind == "mtp":
        for _ in range(rng.randint(1, max(1, min(reqs_cap, cap // max(1, thr))))):
            add(rng.randint(1, thr))
    elif kind == "dspark":
        if not config.is_dspark:
            raise ValueError("dspark batches need a DSpark config")
        causal = False
        block = min(thr, config.noncausal_index_width - w)
        if block < 1:
            raise ValueError(f"W={w} with {config.num_speculative_tokens} drafts leaves no room in a DSpark row")
        for _ in range(rng.randint(1, max(1, min(reqs_cap, cap // max(1, block))))):
            add(rng.randint(1, max(1, block)))
        # Prefills after the drafts: causal rows, whose q + W may pass the DSpark width.
        if rng.random() < dspark_prefills and thr + 1 <= min(budget, ctx_cap):
            for _ in range(rng.randint(1, 2)):
                add(rng.randint(thr + 1, max(thr + 1, min(budget, ctx_cap, 2 * w + thr))))
        invalid = rng.choice((0, 0, 1, 2))
    elif kind in ("mixed", "prefill"):
        if kind == "mixed":
            for _ in range(rng.randint(1, max(1, min(reqs_cap // 2, cap // 4)))):
                add(rng.randint(1, thr))
        first_long = thr + 1
        if first_long <= budget and first_long <= ctx_cap:
            add(rng.randint(first_long, max(first_long, min(budget, ctx_cap, 4 * w + thr))))
        for _ in range(rng.randint(0, 4)):
            q = rng.randint(1, max(1, min(budget, ctx_cap, 3 * w)))
            add(q)
    if not queries:
        add(1)
    if kind == "dspark" and rng.random() < 0.5 and cap > sum(queries):
        padding_rows = rng.randint(1, cap - sum(queries))
    if kind == "padded":
        padding_reqs = min(rng.randint(1, 3), reqs_cap - len(queries))
        padding_rows = rng.randint(1, max(1, cap - sum(queries))) if cap > sum(queries) else 0
    if kind == "invalid":
        invalid = rng.randint(1, max(1, sum(queries) // 2))
    invalid = min(invalid, sum(queries))
    seqs += [0] * padding_reqs
    queries += [0] * padding_reqs
    replay_start = random_replay(rng, seqs, queries, w) if rng.random() < replay else None
    image_spans = None
    if config.max_image_tokens > 0 and rng.random() < spans:
        image_spans = random_spans(rng, seqs, queries, config.max_image_tokens, window=w, departures=departures)
    return synthesize_batch(
        config,
        seqs,
        queries,
        rng=rng,
        padding_rows=padding_rows,
        invalid_tokens=invalid,
        causal=causal,
        extra_pages=rng.choice((0, 0, 1, 3)) if extra_pages is None else extra_pages,
        device=device,
        replay_start=replay_start,
        image_spans=image_spans,
    )


def random_replay(rng: random.Random, seqs: list[int], queries: list[int], window: int) -> list[int]:
    """One legal replay bound per request (0 <= bound <= prefix), often at the interesting edges:
    0, the prefix itself, and just inside or outside the window of the first new token."""
    out = []
    for s, q in zip(seqs, queries):
        prefix = s - q
        edges = [0, prefix, prefix - window + 1, prefix - window + 2, prefix - 1]
        pick = rng.choice(edges) if rng.random() < 0.6 else rng.randint(0, prefix)
        out.append(min(max(pick, 0), prefix))
    return out


def random_spans(
    rng: random.Random,
    seqs: list[int],
    queries: list[int],
    max_image_tokens: int,
    *,
    window: int = 0,
    departures: bool = False,
) -> dict[int, list[tuple[int, int]]]:
    """Image spans over the new tokens of some requests (docs/semantics.md #vision-spans), sometimes
    overlapping, sometimes crossing the window's edge: inside the new tokens, at most ``max_image_tokens``
    (M) long; straddling the first new token (the image's start up to M + W + 2 positions before it, W =
    ``window``); longer than M. Every span gives the rows the engines' builders give, unless
    ``departures``: then spans also run past the request's last position, and (M > W) grow longer than
    M + W, where a row needs more entries than its W + M width (docs/semantics.md #engine-parity)."""
    m = max_image_tokens
    # The longest span whose rows fit the W + M width: any length when M <= W, M + W otherwise.
    longest = 3 * m if departures or m <= window else m + window
    out: dict[int, list[tuple[int, int]]] = {}
    for r, (s, q) in enumerate(zip(seqs, queries)):
        if q < 2 or rng.random() < 0.3:
            continue
        lo, hi = s - q, s - 1
        spans = []
        for _ in range(rng.randint(1, 3)):
            shape = rng.choice(("inside", "inside", "straddle", "straddle", "long", "past_end"))
            if shape == "straddle" and lo >= 1:
                length = rng.randint(2, max(2, longest))
                a = lo - rng.randint(1, min(length - 1, lo, m + window + 2))
                e = a + length - 1
            elif shape in ("long", "past_end"):
                a = rng.randint(lo, hi)
                e = a + rng.randint(min(m, longest - 1), longest - 1)
                if shape == "past_end" and departures:
                    e = max(e, hi + rng.randint(1, m + 2))
            else:
                a = rng.randint(lo, hi)
                e = a + rng.randint(0, m - 1)
            # Past the last position only with departures (the engines' rows would read unwritten ones).
            spans.append((a, e if departures and rng.random() < 0.5 else max(a, min(hi, e))))
        out[r] = spans
    return out


def advance_decodes(batch: AttentionBatch, num_decodes: int, block_size: int) -> None:
    """An engine's draft step, in place: each of the first ``num_decodes`` requests one position on
    (``seq_lens`` and its host copy), its tokens' slots those of their new positions (``hold_own_slots``;
    docs/semantics.md #draft-updates)."""
    batch.seq_lens[:num_decodes] += 1
    if batch.seq_lens_cpu is not None:
        batch.seq_lens_cpu[:num_decodes] += 1
    hold_own_slots(batch, block_size, num_decodes)


def hold_own_slots(
    batch: AttentionBatch, block_size: int, num_reqs: int | None = None, *, block_table=None, slot_mapping=None
) -> None:
    """Rewrite, in place, the slot of each token of the first ``num_reqs`` requests (all by default) to its
    own slot by the block table at the batch's current ``seq_lens``, where it had a slot and the table a page.
    An engine writes the new tokens' slots with the lengths, and a build holds its slots to its table (rule 17
    of docs/semantics.md #guarded-builds): a test that moves ``seq_lens`` in place moves the slots with them.
    ``block_table`` / ``slot_mapping``: another group's (default: the batch's own)."""
    table = batch.block_table if block_table is None else block_table
    slot_mapping = batch.slot_mapping if slot_mapping is None else slot_mapping
    n = batch.inputs.num_reqs if num_reqs is None else num_reqs
    qsl = batch.query_start_loc_cpu[: n + 1].long()
    rows = int(qsl[-1])
    if rows <= 0:
        return
    ends = qsl[1:]
    req = torch.repeat_interleave(torch.arange(n), ends - qsl[:-1])
    pos = batch.seq_lens[:n].long().cpu()[req] - ends[req] + torch.arange(rows)
    pages = table[:n].long().cpu()
    page = pos // block_size
    inside = (pos >= 0) & (page < pages.shape[1])
    block = pages[req, page.clamp(0, pages.shape[1] - 1)]
    slots = slot_mapping[:rows]
    old = slots.cpu().long()
    keep = (old >= 0) & inside & (block >= 0)
    slots.copy_(torch.where(keep, block * block_size + pos % block_size, old).to(slots.dtype))
