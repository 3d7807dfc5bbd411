"""docs/semantics.md #split, #per-token-helpers, #causal-rows, #dspark-rows, #prefill-metadata in plain, vectorized PyTorch: the oracle every backend is tested against.

Each function runs on any torch device, loops over neither tokens nor window entries, and can write
into caller-owned buffers (``out=``, ``workspace=``) so the torch backend builds with no per-build
allocation the size of the output. All arithmetic is int32, like the kernels' (the config and
validation keep every position and slot inside int32).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from .cache import HostCache
from .config import SWAConfig
from .errors import SpeculativeModeError
from .split import Split, split_decodes_and_prefills

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .batch import ImageSpans

__all__ = [
    "RowWorkspace",
    "RowGuard",
    "request_terms",
    "ReferenceResult",
    "token_to_req",
    "valid_tokens",
    "causal_window_rows",
    "noncausal_window_rows",
    "prefill_gather_lens",
    "ragged_rows",
    "image_visibility",
    "has_image_spans",
    "split_decodes_and_prefills",
    "build_reference",
]


# Row-level rules of a guarded build (the request-level ones live in swa_hal/guard.py), and the key of a
# guard candidate that broke no rule (keys are requests, far below it).
PAGES, BLOCK = 5, 6
NO_KEY = 1 << 30
# Rows of the per-request terms (``request_terms``, int32 [TERMS, R]) that window rows gather: causal rows
# take S_r - qsl[r + 1] and max(replay_start[r], 0), DSpark rows their start and lens.
TERMS = 2
# A causal request term that empties every row of its request (a guarded build's request that broke a
# rule): position + 1 is then below -2^29 and the window starts at 0, so no row has entries, and no
# row arithmetic comes near the int32 bounds.
EMPTY_REQUEST = -(1 << 30)


class PageTables:
    """The constants ``_fill_rows`` uses for rows ``width`` wide over pages of ``block_size`` positions.

    A row starting at position s = f * B + o (page f, offset o) touches at most ``pages`` pages,
    f .. f + pages - 1; ``pages * B >= B - 1 + width``, so the row's entries are a window of the
    ``pages * B`` slots of those pages, starting at o. ``keep[l]`` is 1 on the first l columns, else 0.
    """

    def __init__(self, block_size: int, width: int, device: torch.device | str):
        self.pages = pages = (block_size - 1 + width - 1) // block_size + 1
        self.aligned = pages * block_size
        self.steps_down = torch.arange(1 - pages, 1, dtype=torch.int32, device=device)  # k - (pages - 1)
        self.slot_offsets1 = torch.arange(1, block_size + 1, dtype=torch.int32, device=device)  # position % B, + 1
        cols = torch.arange(width, device=device)
        self.keep = (cols[None, :] < torch.arange(width + 1, device=device)[:, None]).to(torch.int32)


class _RowViews:
    """One row count's cut of a ``_RowSpace`` (made once per row count: a slice costs about as much
    as a small operation)."""

    __slots__ = (
        "tables",
        "slots",
        "windows",
        "window_base",
        "pages",
        "blocks",
        "blocks_3d",
        "flat_pages",
        "flat_blocks",
        "clamped",
        "bad",
        "keep",
        "first",
        "first_col",
        "offset",
        "row_base",
        "row_base_col",
        "last_page",
        "last_page_col",
        "page_value",
        "lens_index",
        "block_value",
        "block_value_col",
        "pos",
        "start",
        "off_table",
        "broken",
        "live",
        "first_bad",
        "first_bad_col",
        "terms",
        "term",
    )

    tables: PageTables
    slots: torch.Tensor
    windows: torch.Tensor
    window_base: torch.Tensor
    pages: torch.Tensor
    blocks: torch.Tensor
    blocks_3d: torch.Tensor
    flat_pages: torch.Tensor
    flat_blocks: torch.Tensor
    clamped: torch.Tensor
    bad: torch.Tensor
    keep: torch.Tensor
    first: torch.Tensor
    first_col: torch.Tensor
    offset: torch.Tensor
    row_base: torch.Tensor
    row_base_col: torch.Tensor
    last_page: torch.Tensor
    last_page_col: torch.Tensor
    page_value: torch.Tensor
    lens_index: torch.Tensor
    block_value: torch.Tensor
    block_value_col: torch.Tensor
    pos: torch.Tensor
    start: torch.Tensor
    off_table: torch.Tensor
    broken: torch.Tensor
    live: torch.Tensor
    first_bad: torch.Tensor
    first_bad_col: torch.Tensor
    terms: torch.Tensor
    term: tuple[torch.Tensor, ...]


class _RowSpace:
    """The scratch space of ``_fill_rows`` for up to ``rows`` rows of one (block size, width)."""

    def __init__(self, rows: int, block_size: int, width: int, device: torch.device | str):
        self.tables = tables = PageTables(block_size, width, device)
        pages = tables.pages
        i32: dict[str, Any] = dict(dtype=torch.int32, device=device)
        # Per row: the slots (+ 1) of every position of the pages it touches, pages * B of them.
        # Past the last row, room for one more row's window: a row without entries may start its window
        # up to a page past its own slots (its lens keep none of it).
        self._slot_space = torch.empty(rows * pages * block_size + block_size + width, **i32)
        self.slots = self._slot_space[: rows * pages * block_size].view(rows, pages, block_size)
        self.pages = torch.empty((rows, pages), **i32)
        self.blocks = torch.empty((rows, pages), **i32)
        self.clamped = torch.empty((rows, pages), **i32)
        self.bad = torch.empty((rows, pages), dtype=torch.bool, device=device)
        self.keep = torch.empty((rows, width), **i32)
        self.ints = torch.empty((9, rows), **i32)
        self.terms = torch.empty((TERMS, rows), **i32)
        self.flags = torch.empty((3, rows), dtype=torch.bool, device=device)
        self.first_bad = torch.empty(rows, dtype=torch.int64, device=device)
        # Row i's slots start at i * pages * B; its window at its start's place among them (``_fill_rows``),
        # whose (pages - 1) * B is added here once.
        self.window_base = torch.arange(rows, dtype=torch.int32, device=device) * tables.aligned + (
            tables.aligned - block_size
        )
        self.width = width
        self._views = HostCache(limit=64)

    def views(self, rows: int) -> _RowViews:
        v = self._views.get(rows)
        if v is not None:
            return v
        v = self._views.keep(rows, _RowViews())
        v.tables = self.tables
        v.slots = self.slots[:rows]
        # Every window of ``width`` consecutive slots, as rows (overlapping: a view, no copy).
        flat = self._slot_space
        v.windows = flat.as_strided((flat.shape[0] - self.width + 1, self.width), (1, 1))
        v.window_base = self.window_base[:rows]
        v.pages, v.blocks = self.pages[:rows], self.blocks[:rows]
        v.blocks_3d = v.blocks[:, :, None]
        v.flat_pages, v.flat_blocks = v.pages.view(-1), v.blocks.view(-1)
        v.clamped, v.bad = self.clamped[:rows], self.bad[:rows]
        v.keep = self.keep[:rows]
        ints = self.ints[:, :rows]
        v.first, v.offset, v.row_base, v.last_page, v.page_value, v.lens_index, v.block_value, v.pos, v.start = ints
        v.first_col, v.row_base_col = v.first[:, None], v.row_base[:, None]
        v.last_page_col, v.block_value_col = v.last_page[:, None], v.block_value[:, None]
        v.off_table, v.broken, v.live = self.flags[:, :rows]
        v.first_bad = self.first_bad[:rows]
        v.first_bad_col = v.first_bad[:, None]
        v.terms = self.terms[:, :rows]
        v.term = v.terms.unbind(0)
        return v


class RowWorkspace:
    """Scratch space for ``*_window_rows``: allocated once, reused by every build."""

    def __init__(self, max_rows: int, max_width: int, device: torch.device | str):
        self.device = device
        self.max_rows = max_rows
        # Token rows, and their + 1 (a causal row's position + 1 is its request's term plus t + 1).
        self.arange = torch.arange(max(max_rows, max_width) + 1, dtype=torch.int32, device=device)
        # Kept (swa_hal/cache.py): a space per (block size, width), a constant per (value, dtype).
        self._spaces = HostCache()
        self._constants = HostCache()
        # ``c[value]``: the int32 constant (``const``), looked up in one step.
        self.c = _Constants(device)

    def space(self, block_size: int, width: int) -> _RowSpace:
        space = self._spaces.get((block_size, width))
        if space is None:
            space = self._spaces.keep((block_size, width), _RowSpace(self.max_rows, block_size, width, self.device))
        return space

    def const(self, value: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        """A 0-dim tensor holding ``value``: as an operand it costs less than a Python number, which an
        operation wraps into a tensor of its own (an allocation and a copy) every call."""
        if dtype == torch.int32:
            return self.c[value]
        t = self._constants.get((value, dtype))
        if t is None:
            t = self._constants.keep((value, dtype), torch.tensor(value, dtype=dtype, device=self.device))
        return t


class _Constants(HostCache):
    """int32 0-dim constants by value, made on first use (kept as the host cache keeps: swa_hal/cache.py)."""

    def __init__(self, device: torch.device | str):
        super().__init__()
        self.device = device

    def __missing__(self, value: int) -> torch.Tensor:
        return self.keep(value, torch.tensor(value, dtype=torch.int32, device=self.device))


def _arange(n: int, device: torch.device, workspace: RowWorkspace | None) -> torch.Tensor:
    if workspace is not None:
        return workspace.arange[:n]
    return torch.arange(n, dtype=torch.int32, device=device)


def token_to_req(
    query_start_loc: torch.Tensor,
    num_tokens: int,
    *,
    out: torch.Tensor | None = None,
    workspace: RowWorkspace | None = None,
) -> torch.Tensor:
    """docs/semantics.md #per-token-helpers: the request owning each token row, on the device (no host sync); rows past the
    scheduled tokens map to 0."""
    num_reqs = query_start_loc.shape[0] - 1
    rows = _arange(num_tokens, query_start_loc.device, workspace)
    # The owner of t is the number of request ends at or before t (zero-length requests included): a
    # search of the sorted ends, which are the ends themselves unless the offsets decrease somewhere.
    ends = torch.sort(query_start_loc[1:]).values
    owner = torch.searchsorted(ends, rows, right=True, out_int32=True, out=out)
    # R (past the scheduled tokens) -> 0
    return owner.remainder_(num_reqs if workspace is None else workspace.const(num_reqs))


def valid_tokens(
    slot_mapping: torch.Tensor, *, out: torch.Tensor | None = None, workspace: RowWorkspace | None = None
) -> torch.Tensor:
    """docs/semantics.md #per-token-helpers: a token is valid when it has a KV slot."""
    zero = 0 if workspace is None else workspace.const(0, slot_mapping.dtype)
    return torch.ge(slot_mapping, zero, out=out)


class RowGuard:
    """Rules 5 and 6 of a guarded build (docs/semantics.md #guarded-builds), checked while rows are filled.

    A non-empty row that reads a page past the block table's width (5) or a block id outside
    ``[0, limit)`` (6) is emptied, and so is every row whose request's key (the third request term,
    swa_hal/guard.py) says the request broke a request-level rule. Per row, ``kind`` and ``value``
    receive the row's rule and value where it broke one (the first page past the table, or the first
    bad block id; unspecified elsewhere), and ``key`` its request where it was emptied by a rule, else
    ``NO_KEY``. The guard's record takes the lowest key (guard.py).
    """

    __slots__ = ("limit", "kind", "value", "key")

    def __init__(self, limit: int, kind: torch.Tensor, value: torch.Tensor, key: torch.Tensor):
        self.limit = limit
        self.kind, self.value, self.key = kind, value, key


class RowProbe:
    """What unguarded fills read, for a guarded build that may skip the guard's row work (rules 5 and 6)
    where reading a value costs no sync (the torch backend on the CPU, docs/semantics.md
    #guarded-builds). ``clean`` stays True while every row reads pages inside the block table and block
    ids inside ``[0, limit)``; the test is conservative (it counts empty rows too, and the pages of a
    row's request below its first page that the fill reads and skips: ``_fill_rows``), so True means
    the guarded fill would have emptied no row, and False only that the build must run the full guard."""

    __slots__ = ("limit", "clean")

    def __init__(self, limit: int):
        self.limit = limit
        self.clean = True

    def see_pages(self, last_page: torch.Tensor, table_width: int) -> None:
        """Rule 5: every row's last page inside the table."""
        self.clean = self.clean and int(last_page.max()) < table_width

    def see_blocks(self, blocks: torch.Tensor) -> None:
        """Rule 6: every block id the rows' pages hold (a row's pages below its first included) in range."""
        lowest, highest = torch.aminmax(blocks)
        self.clean = self.clean and int(lowest) >= 0 and int(highest) < self.limit


def _fill_rows(
    block_table: torch.Tensor,
    req: torch.Tensor,
    start: torch.Tensor,
    lens: torch.Tensor,
    block_size: int,
    out: torch.Tensor,
    v: _RowViews,
    ws: RowWorkspace,
    guard: RowGuard | None = None,
    lens_in_range: bool = True,
    probe: RowProbe | None = None,
) -> None:
    """out[i, j] = slot(req[i], start[i] + j) for j < lens[i], else -1 (``start >= 0``).

    Page by page, not entry by entry: a row touches at most ``pages`` pages, so it reads each page's
    block once ([rows, pages] lookups), lays out the slots of those pages, and copies its entries out
    as one window of them (``PageTables``). The pages are the ``pages`` pages that end at the row's last
    page, (start + lens - 1) // B: a row never reads a page past its last, and a shorter row reads pages
    of its request below its first, which it then skips (they hold blocks of earlier positions, where
    the entries past a request's last page may be anything, -1 included). Page reads are clamped into
    the table: a malformed row never reads outside it. With ``guard`` (docs/semantics.md
    #guarded-builds), rows that read past the table or a block id outside ``[0, guard.limit)`` are emptied
    (their lens zeroed before the columns are laid out) and reported in ``guard``; the pages below a row's
    first are then left out of its block check. ``lens_in_range``: whether every lens lies in [0, width]
    already. With ``probe``, the pages' last and blocks are only looked at (``RowProbe``).
    """
    width = out.shape[1]
    t = v.tables
    table = block_table if block_table.is_contiguous() else block_table.contiguous()
    table_width = table.shape[1]
    # The lens the addresses and the kept columns follow (a malformed DSpark length may be negative or
    # too long; the row's own lens are handed out as they are).
    kept = lens if lens_in_range else torch.clamp(lens, 0, width, out=v.lens_index)
    # Integer division is slow on CPUs; a power-of-two page size divides by shifting.
    shift = block_size.bit_length() - 1 if block_size & (block_size - 1) == 0 else None
    # The row's last page (a row without entries: the page before its start, -1 at most below it).
    last = torch.add(start, kept, out=v.last_page).sub_(ws.c[1])
    if shift is not None:
        last.bitwise_right_shift_(ws.c[shift])
    else:
        last.div_(ws.c[block_size], rounding_mode="floor")
    pages = torch.add(v.last_page_col, t.steps_down, out=v.pages)  # last - (pages - 1) .. last
    if probe is not None:
        probe.see_pages(last, table_width)
    if guard is not None:
        # Rule 5 looks at the last page; rule 6 at the blocks the row reads, from its first page on.
        torch.ge(last, ws.c[table_width], out=v.off_table)
        if shift is not None:
            torch.bitwise_right_shift(start, ws.c[shift], out=v.first)
        else:
            torch.div(start, ws.c[block_size], rounding_mode="floor", out=v.first)
        torch.maximum(pages, v.first_col, out=pages)
    # Clamped into the table: a valid batch never needs it, a malformed one must not read outside it.
    pages.clamp_(0, table_width - 1)
    torch.mul(req, ws.c[table_width], out=v.row_base)
    pages.add_(v.row_base_col)  # flat block-table offsets
    blocks = v.blocks
    torch.index_select(table.view(-1), 0, v.flat_pages, out=v.flat_blocks)
    if probe is not None:
        probe.see_blocks(blocks)
    if guard is not None:
        torch.clamp(blocks, 0, guard.limit - 1, out=v.clamped)
        torch.ne(blocks, v.clamped, out=v.bad)
        broken, off_table = v.broken, v.off_table
        torch.max(v.bad, 1, out=(broken, v.first_bad))  # any bad block id, and the first
        torch.gather(blocks, 1, v.first_bad_col, out=v.block_value_col)
        broken.logical_or_(off_table).logical_and_(torch.gt(lens, ws.c[0], out=v.live))
        torch.where(off_table, ws.c[PAGES], ws.c[BLOCK], out=guard.kind)
        page_value = torch.clamp_min(v.first, table_width, out=v.page_value)  # the first page past the table
        torch.where(off_table, page_value, v.block_value, out=guard.value)
        torch.where(broken, req, ws.c[NO_KEY], out=guard.key)
        lens.masked_fill_(broken, ws.c[0])
        if kept is not lens:
            kept.masked_fill_(broken, ws.c[0])
    # Row i's slots (+ 1): block_k * B + (position % B) + 1 for every position of its pages; its
    # entries are the window of them starting at its start's place among them, start - (last - pages +
    # 1) * B (the base carries the + (pages - 1) * B), one row copy each; the columns past its lens are
    # (slot + 1) * 0 - 1.
    torch.add(t.slot_offsets1, v.blocks_3d, alpha=block_size, out=v.slots)
    torch.addcmul(start, last, ws.c[-block_size], out=v.offset)
    starts = torch.add(v.window_base, v.offset, out=v.offset)
    if shift is None:
        # start + lens past int32 wraps; with a power-of-two page the wrapped last page still gives the
        # exact place (all of it is arithmetic mod 2^32), a floor division does not: keep it in the space.
        starts.clamp_(0, v.windows.shape[0] - 1)
    torch.index_select(v.windows, 0, starts, out=out)
    torch.addcmul(ws.c[-1], out, torch.index_select(t.keep, 0, kept, out=v.keep), out=out)


def request_terms(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    num_reqs: int,
    window_size: int,
    *,
    causal: bool,
    replay_start: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    workspace: RowWorkspace | None = None,
    ends: torch.Tensor | None = None,
    rows: Sequence[torch.Tensor] | None = None,
) -> torch.Tensor:
    """The per-request terms window rows gather, int32 [TERMS, R] (no host sync): for causal rows
    (S_r - qsl[r + 1], max(replay_start[r], 0)), for DSpark rows (start, lens) = (max(P_r - W, 0),
    S_r - start). A guarded build then empties the requests that broke a rule (``empty_requests``).
    ``query_start_loc`` [R + 1], ``seq_lens`` and ``replay_start`` [R] (longer ones are cut);
    ``ends``: ``query_start_loc[1:]``, ``rows``: ``out``'s rows, when the caller has them."""
    if out is None:
        out = torch.empty((TERMS, num_reqs), dtype=torch.int32, device=seq_lens.device)
    first, second = rows if rows is not None else out.unbind(0)
    ws = workspace
    seq = seq_lens if seq_lens.shape[0] == num_reqs else seq_lens[:num_reqs]
    end = query_start_loc[1 : num_reqs + 1] if ends is None else ends
    if replay_start is not None and replay_start.shape[0] != num_reqs:
        replay_start = replay_start[:num_reqs]
    if causal:
        torch.sub(seq, end, out=first)
        if replay_start is None:
            second.zero_()
        else:
            torch.clamp_min(replay_start, 0, out=second)
    else:
        query = torch.sub(end, query_start_loc[:num_reqs], out=second)
        start = torch.sub(seq, query, out=first)  # P_r
        start.sub_(window_size if ws is None else ws.c[window_size]).clamp_min_(0)
        torch.sub(seq, start, out=second)
    return out


def empty_requests(
    terms: Sequence[torch.Tensor], broken: torch.Tensor, *, causal: bool, workspace: RowWorkspace
) -> None:
    """Make the terms (the rows of ``request_terms``) of the requests ``broken`` marks (bool [R]) give rows
    without entries: causal terms (EMPTY_REQUEST, 0), DSpark terms lens 0 (docs/semantics.md
    #guarded-builds)."""
    ws = workspace
    if causal:
        torch.where(broken, ws.c[EMPTY_REQUEST], terms[0], out=terms[0])
    torch.where(broken, ws.c[0], terms[1], out=terms[1])


def fill_causal_rows(
    block_table: torch.Tensor,
    req: torch.Tensor,
    valid: torch.Tensor,
    rows1: torch.Tensor,
    terms: torch.Tensor,
    out: torch.Tensor,
    lens: torch.Tensor,
    *,
    window_size: int,
    block_size: int,
    ws: RowWorkspace,
    left: torch.Tensor | None = None,
    right: torch.Tensor | None = None,
    guard: RowGuard | None = None,
    probe: RowProbe | None = None,
) -> None:
    """Causal rows (``causal_window_rows``) of the token rows t with owners ``req``, validity ``valid``
    and ``rows1`` = t + 1 ([n] each), from ``request_terms(causal=True)``; into ``out`` [n, width] and
    ``lens`` [n]."""
    rows, width = out.shape
    v = ws.space(block_size, width).views(rows)
    torch.index_select(terms, 1, req, out=v.terms)
    rel, bound = v.term
    # p + 1 = S_r - qsl[r + 1] + t + 1; the window starts at max(p - W + 1, 0, replay_start[r]).
    pos1 = torch.add(rel, rows1, out=v.pos)
    start = torch.sub(pos1, ws.c[window_size], out=v.start)
    if left is not None:
        start.sub_(torch.sub(left, window_size - 1).clamp_min_(0))
    torch.maximum(start, bound, out=start)  # bound = max(replay_start[r], 0)
    end = pos1 if right is None else pos1 + right
    # lens = end - start, never negative (a replay bound past p leaves an empty row) and never longer
    # than the row: a row that needs more (M > W and an image longer than M + W, or malformed input)
    # keeps its first `width` positions (#vision-spans, #engine-parity). Invalid tokens: empty.
    torch.sub(end, start, out=lens).clamp_(0, width)
    torch.where(valid, lens, ws.c[0], out=lens)
    _fill_rows(block_table, req, start, lens, block_size, out, v, ws, guard, probe=probe)


def fill_dspark_rows(
    block_table: torch.Tensor,
    req: torch.Tensor,
    valid: torch.Tensor,
    terms: torch.Tensor,
    out: torch.Tensor,
    lens: torch.Tensor,
    *,
    block_size: int,
    ws: RowWorkspace,
    guard: RowGuard | None = None,
    check: bool = False,
    window_size: int = 0,
    probe: RowProbe | None = None,
) -> None:
    """DSpark rows (``noncausal_window_rows``) of the token rows with owners ``req`` and validity ``valid``,
    from ``request_terms(causal=False)``; into ``out`` [n, width] and ``lens`` [n]."""
    rows, width = out.shape
    v = ws.space(block_size, width).views(rows)
    torch.index_select(terms, 1, req, out=v.terms)
    start, row_lens = v.term
    torch.where(valid, row_lens, ws.c[0], out=lens)
    if check:
        longest = int(lens.max())
        if longest > width:
            row = int(torch.argmax(lens))
            raise SpeculativeModeError(
                "decode_swa_indices",
                f"DSpark row {row} needs {longest} entries but the non-causal width is {width} "
                f"(window {window_size} + draft block); refusing to truncate",
                row,
            )
    lens.clamp_max_(width)  # unchecked callers still never get a row longer than its width
    # Only malformed input gives a negative length (S_r < 0): it is handed out as it is.
    _fill_rows(
        block_table,
        req,
        start,
        lens,
        block_size,
        out,
        v,
        ws,
        guard,
        lens_in_range=False,
        probe=probe,
    )


def _row_inputs(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    token_to_req: torch.Tensor,
    token_offset: int,
    num_rows: int,
    workspace: RowWorkspace | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    req = token_to_req[token_offset : token_offset + num_rows]
    seq = torch.index_select(seq_lens, 0, req)
    end = torch.index_select(query_start_loc[1:], 0, req)
    rows = _arange(num_rows, seq_lens.device, workspace)
    return req, seq, end, rows


def _row_outputs(
    num_rows: int, width: int, device: torch.device, out_indices: torch.Tensor | None, out_lens: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    if out_indices is None:
        out_indices = torch.empty((num_rows, 1, width), dtype=torch.int32, device=device)
    if out_lens is None:
        out_lens = torch.empty(num_rows, dtype=torch.int32, device=device)
    return out_indices, out_lens


def image_visibility(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    token_to_req: torch.Tensor,
    spans: ImageSpans,
    *,
    token_offset: int,
    num_rows: int,
    max_image_tokens: int,
    out_left: torch.Tensor | None = None,
    out_right: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """docs/semantics.md #vision-spans: how far rows [token_offset, token_offset + num_rows) see
    inside their image span: left = min(p - start, M - 1), right = min(min(end, S_r - 1) - p, M) (never
    past the request's last position, never below 0); 0 / 0 outside every span; where spans overlap, the
    last one listed that contains p wins. A span may start before the request's new tokens, end after
    them and hold more than M tokens."""
    device = seq_lens.device
    if out_left is None:
        out_left = torch.empty(num_rows, dtype=torch.int32, device=device)
    if out_right is None:
        out_right = torch.empty(num_rows, dtype=torch.int32, device=device)
    out_left.zero_()
    out_right.zero_()
    num_spans = min(spans.starts.shape[0], spans.ends.shape[0])
    if num_rows == 0 or num_spans == 0:
        return out_left, out_right
    req, seq, end, rows = _row_inputs(query_start_loc, seq_lens, token_to_req, token_offset, num_rows, None)
    pos = (seq - end + rows + token_offset).long()
    ptr = spans.indptr.long()
    num_reqs = ptr.shape[0] - 1
    span_ids = torch.arange(num_spans, device=device)
    # Request r's spans are the existing ones in [indptr[r], indptr[r + 1]) (none where the CSR decreases).
    owner = req.long().clamp(0, num_reqs - 1)
    mine = (span_ids >= ptr[owner][:, None]) & (span_ids < ptr[owner + 1][:, None])
    starts, ends = spans.starts[:num_spans].long(), spans.ends[:num_spans].long()
    inside = mine & (pos[:, None] >= starts) & (pos[:, None] <= ends)
    # The last listed span containing p: the highest span number among the matches.
    order = torch.arange(1, num_spans + 1, device=device)
    pick = (inside * order).argmax(dim=1)
    hit = inside.any(dim=1)
    left = torch.clamp_max(pos - starts[pick], max_image_tokens - 1)
    # A span past the request's last position (a chunk that ends inside its image) is cut there: no row
    # reaches a position this step has not written. Exact int64 distances; a position past the last one
    # (only where the offsets decrease, a malformed batch) sees nothing to its right.
    last = seq.long() - 1
    right = (torch.minimum(ends[pick], last) - pos).clamp_(0, max_image_tokens)
    out_left.copy_(torch.where(hit, left, 0))
    out_right.copy_(torch.where(hit, right, 0))
    return out_left, out_right


def causal_window_rows(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    token_to_req: torch.Tensor,
    is_valid: torch.Tensor,
    *,
    token_offset: int,
    num_rows: int,
    window_size: int,
    block_size: int,
    replay_start: torch.Tensor | None = None,
    left: torch.Tensor | None = None,
    right: torch.Tensor | None = None,
    width: int | None = None,
    out_indices: torch.Tensor | None = None,
    out_lens: torch.Tensor | None = None,
    workspace: RowWorkspace | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """docs/semantics.md #causal-rows: rows for tokens [token_offset, token_offset + num_rows), from row 0.

    A valid token at position p sees positions max(p - W + 1, 0, replay_start[r]) .. p, oldest
    first (#bounded-replay); inside an image span (``left`` / ``right`` per row, #vision-spans) the
    window reaches further left and past p. The rest of the row is -1; the length is never negative.
    An invalid token gets lens 0 and an all -1 row.
    Returns (indices [num_rows, 1, width], lens [num_rows]); width defaults to W.
    """
    width = window_size if width is None else width
    out_indices, out_lens = _row_outputs(num_rows, width, seq_lens.device, out_indices, out_lens)
    if num_rows == 0:
        return out_indices, out_lens
    ws = workspace if workspace is not None else RowWorkspace(token_offset + num_rows, width, seq_lens.device)
    num_reqs = query_start_loc.shape[0] - 1
    terms = request_terms(
        query_start_loc, seq_lens, num_reqs, window_size, causal=True, replay_start=replay_start, workspace=ws
    )
    rows = slice(token_offset, token_offset + num_rows)
    fill_causal_rows(
        block_table,
        token_to_req[rows],
        is_valid[rows],
        ws.arange[token_offset + 1 : token_offset + num_rows + 1],
        terms,
        out_indices.view(num_rows, width),
        out_lens,
        window_size=window_size,
        block_size=block_size,
        ws=ws,
        left=left,
        right=right,
    )
    return out_indices, out_lens


def noncausal_window_rows(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    token_to_req: torch.Tensor,
    is_valid: torch.Tensor,
    *,
    token_offset: int,
    num_rows: int,
    window_size: int,
    block_size: int,
    width: int,
    out_indices: torch.Tensor | None = None,
    out_lens: torch.Tensor | None = None,
    workspace: RowWorkspace | None = None,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """docs/semantics.md #dspark-rows (DSpark draft rows): every token of request r sees positions
    [max(P_r - W, 0), S_r): the last W context tokens and the whole draft block, future drafts
    included. A row longer than ``width`` raises (``check``) instead of being truncated."""
    out_indices, out_lens = _row_outputs(num_rows, width, seq_lens.device, out_indices, out_lens)
    if num_rows == 0:
        return out_indices, out_lens
    ws = workspace if workspace is not None else RowWorkspace(token_offset + num_rows, width, seq_lens.device)
    num_reqs = query_start_loc.shape[0] - 1
    terms = request_terms(query_start_loc, seq_lens, num_reqs, window_size, causal=False, workspace=ws)
    rows = slice(token_offset, token_offset + num_rows)
    fill_dspark_rows(
        block_table,
        token_to_req[rows],
        is_valid[rows],
        terms,
        out_indices.view(num_rows, width),
        out_lens,
        block_size=block_size,
        ws=ws,
        check=check,
        window_size=window_size,
    )
    return out_indices, out_lens


def prefill_gather_lens(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_decodes: int,
    num_prefills: int,
    window_size: int,
    *,
    replay_start: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """docs/semantics.md #prefill-metadata: gather_len[i] = q_r + min(max(P_r - replay_start[r], 0), W - 1)
    for r = num_decodes + i (#bounded-replay; no bound: replay_start 0)."""
    lo, hi = num_decodes, num_decodes + num_prefills
    query = query_start_loc[lo + 1 : hi + 1] - query_start_loc[lo:hi]
    prefix = seq_lens[lo:hi] - query
    if replay_start is not None:
        prefix = prefix - replay_start[lo:hi]
    return torch.add(query, prefix.clamp_(0, window_size - 1), out=out)


def ragged_rows(indices: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ragged (CSR) form of dense rows: the valid entries of every row concatenated, and
    indptr [rows + 1], the exclusive prefix sum of lens. Synchronises (its length is data)."""
    rows = lens.shape[0]
    indptr = torch.zeros(rows + 1, dtype=torch.int32, device=lens.device)
    torch.cumsum(lens, 0, dtype=torch.int32, out=indptr[1:])
    flat = indices.reshape(rows, indices.shape[-1])
    keep = torch.arange(flat.shape[1], device=lens.device)[None, :] < lens[:, None]
    return flat[keep], indptr


@dataclasses.dataclass(eq=False)
class ReferenceResult:
    """Every output of one build, as fresh tensors."""

    split: Split
    token_to_req: torch.Tensor
    is_valid: torch.Tensor
    decode_indices: torch.Tensor
    decode_lens: torch.Tensor
    decode_width: int
    prefill_indices: torch.Tensor
    prefill_lens: torch.Tensor
    prefill_gather_lens: torch.Tensor | None
    replay_start: torch.Tensor
    # Indexed by absolute token, 0 on decode rows; None unless the config and the batch have spans.
    prefill_left_visible: torch.Tensor | None = None
    prefill_right_visible: torch.Tensor | None = None


def has_image_spans(config: SWAConfig, batch) -> bool:
    """Whether a build computes image visibility: the vision variant and at least one span."""
    spans = batch.image_spans
    return config.max_image_tokens > 0 and spans is not None and spans.starts.shape[0] > 0


def build_reference(config: SWAConfig, batch) -> ReferenceResult:
    """The whole build (docs/semantics.md #split to #prefill-metadata) for one batch, from scratch."""
    split = split_decodes_and_prefills(
        batch.query_start_loc_cpu, batch.max_query_len, batch.num_tokens, config.decode_threshold
    )
    nd, npf, ndt, npt = split
    t2r = token_to_req(batch.query_start_loc, batch.num_tokens)
    valid = valid_tokens(batch.slot_mapping)
    replay = batch.replay_start
    if replay is None:
        replay = torch.zeros_like(batch.seq_lens)
    common: dict[str, Any] = dict(window_size=config.window_size, block_size=config.block_size)
    inputs = (batch.query_start_loc, batch.seq_lens, batch.block_table, t2r, valid)
    if batch.causal:
        dec_idx, dec_lens = causal_window_rows(*inputs, token_offset=0, num_rows=ndt, replay_start=replay, **common)
        width = config.window_size
    else:
        if not config.is_dspark:
            raise SpeculativeModeError(
                "causal", f"causal=False is only legal with DSpark; speculative_method={config.speculative_method!r}"
            )
        width = config.noncausal_index_width
        dec_idx, dec_lens = noncausal_window_rows(*inputs, token_offset=0, num_rows=ndt, width=width, **common)
    left_all = right_all = left = right = None
    if npt and has_image_spans(config, batch):
        left_all = torch.zeros(ndt + npt, dtype=torch.int32, device=batch.seq_lens.device)
        right_all = torch.zeros_like(left_all)
        left, right = image_visibility(
            batch.query_start_loc,
            batch.seq_lens,
            t2r,
            batch.image_spans,
            token_offset=ndt,
            num_rows=npt,
            max_image_tokens=config.max_image_tokens,
            out_left=left_all[ndt:],
            out_right=right_all[ndt:],
        )
    pre_idx, pre_lens = causal_window_rows(
        *inputs,
        token_offset=ndt,
        num_rows=npt,
        replay_start=replay,
        left=left,
        right=right,
        width=config.prefill_index_width,
        **common,
    )
    gather = (
        prefill_gather_lens(batch.seq_lens, batch.query_start_loc, nd, npf, config.window_size, replay_start=replay)
        if npf > 0
        else None
    )
    return ReferenceResult(
        split, t2r, valid, dec_idx, dec_lens, width, pre_idx, pre_lens, gather, replay, left_all, right_all
    )
