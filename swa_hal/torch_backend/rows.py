"""The torch backend's tuned row fills: the causal and DSpark rows of docs/semantics.md #causal-rows and
#dspark-rows written into the builder's fixed buffers with no per-build allocation the size of the output
(page tables, workspaces and constants kept per shape), and the guard's row checks (rules 5 and 6).

This is the fast path, not the oracle: ``reference.py`` computes the same rows plainly, and the torch backend,
which builds through these, is held bit for bit to it and to the kit's plain loop model. All arithmetic is
int32, like the kernels' (the config and validation keep every position and slot inside int32).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .. import reference
from ..cache import HostCache
from ..rules import Violation

if TYPE_CHECKING:
    from ..plan import BuildPlan

# Row-level rules of a guarded build, as plain ints (the keys of the row fill's constants; the request-level
# rules are the guard's), and the key of a guard candidate that broke no rule (keys are requests, far below it).
PAGES, BLOCK, OWN_SLOT = int(Violation.PAGES), int(Violation.BLOCK), int(Violation.OWN_SLOT)
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
        # ``last_col[l]``: the column of a row's last entry, l - 1 (width - 1, where every entry is -1, for l = 0).
        self.last_col = torch.arange(-1, width, device=device).remainder_(width)


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
        "own_col",
        "own_col_flat",
        "own",
        "own_flat",
        "own_wide",
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
    own_col: torch.Tensor
    own_col_flat: torch.Tensor
    own: torch.Tensor
    own_flat: torch.Tensor
    own_wide: torch.Tensor


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
        # A row's last column and its entry there (``RowProbe.see_own_slots``).
        self.own_col = torch.empty((rows, 1), dtype=torch.int64, device=device)
        self.own = torch.empty((rows, 1), **i32)
        self.own_wide = torch.empty(rows, dtype=torch.int64, device=device)  # for an int64 slot_mapping
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
        v.own_col, v.own, v.own_wide = self.own_col[:rows], self.own[:rows], self.own_wide[:rows]
        v.own_col_flat, v.own_flat = v.own_col.view(-1), v.own.view(-1)
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


class RowGuard:
    """Rules 5 and 6 of a guarded build (docs/semantics.md #guarded-builds), checked while rows are filled.

    A non-empty row that reads a page past the block table's width (5) or a block id outside
    ``[0, limit)`` (6) is emptied, and so is every row whose request's key (the third request term,
    ``guard.py``) says the request broke a request-level rule. Per row, ``kind`` and ``value``
    receive the row's rule and value where it broke one (the first page past the table, or the first
    bad block id; unspecified elsewhere), and ``key`` its request where it broke a rule, else ``NO_KEY``.
    The guard's record takes the lowest key (``guard.py``).

    Rule 17 where the backend sets ``slots`` for a build (the rows' slot_mapping entries, int64 [n]) with
    ``tokens`` (the rows' token indices, the value reported): a row that broke no rule and has entries reads
    its token's own position, whose slot must be its entry (else it is recorded, after rules 5 and 6, and
    keeps its entries).
    """

    __slots__ = ("limit", "kind", "value", "key", "slots", "tokens")

    def __init__(self, limit: int, kind: torch.Tensor, value: torch.Tensor, key: torch.Tensor):
        self.limit = limit
        self.kind, self.value, self.key = kind, value, key
        self.slots: torch.Tensor | None = None
        self.tokens: torch.Tensor | None = None


class RowProbe:
    """What unguarded fills read, for a guarded build that may skip the guard's row work (rules 5 and 6)
    where reading a value costs no sync (the torch backend on the CPU, docs/semantics.md
    #guarded-builds). ``clean`` stays True while every row reads pages inside the block table and block
    ids inside ``[0, limit)``; the test is conservative (it counts empty rows too, and the pages of a
    row's request below its first page that the fill reads and skips: ``_fill_rows``), so True means
    the guarded fill would have emptied no row, and False only that the build must run the full guard.
    Rows that read no position past their request's seq_len need no look at their pages: the request
    test bounds seq_len by the table (``TorchGuard.request_quantities``). Each reduction writes into
    ``found``, read on the host through numpy (the same memory, no further operation)."""

    __slots__ = ("limit", "clean", "block_size", "slots", "lowest", "highest", "last", "found")

    def __init__(self, limit: int, block_size: int):
        self.limit = limit
        self.clean = True
        self.block_size = block_size
        # The rows' slot_mapping entries of the fill under way (rule 17), set by the backend.
        self.slots: torch.Tensor | None = None
        found = torch.zeros(3, dtype=torch.int32)
        self.lowest, self.highest, self.last = found.unbind(0)
        self.found = found.numpy()

    def see_pages(self, last_page: torch.Tensor, table_width: int) -> None:
        """Rule 5: every row's last page inside the table."""
        torch.max(last_page, out=self.last)
        self.clean = self.clean and self.found[2] < table_width

    def see_blocks(self, blocks: torch.Tensor) -> None:
        """Rule 6: every block id the rows' pages hold (a row's pages below its first included) in range."""
        torch.aminmax(blocks, out=(self.lowest, self.highest))
        found = self.found
        self.clean = self.clean and found[0] >= 0 and found[1] < self.limit

    def see_own_slots(self, out: torch.Tensor, lens: torch.Tensor, v: _RowViews, slots: torch.Tensor) -> None:
        """Rule 17 for rows whose last entry is their token's own position (causal rows without image
        visibility, once rules 5 and 6 hold): every row's last entry ``out[i, lens[i] - 1]`` is its
        ``slots`` entry, and a row without entries (-1 throughout) has none (-1). Conservative: a row with
        a slot but no entries (a replay bound past its position) counts as broken. One lookup of each
        row's last column, one gather and one comparison, of one dtype: an int64 slot_mapping is compared
        with the entries widened by a copy, since ``torch.equal`` of two dtypes costs several operations."""
        if not self.clean:
            return
        torch.index_select(v.tables.last_col, 0, lens, out=v.own_col_flat)
        torch.gather(out, 1, v.own_col, out=v.own)
        own = v.own_flat
        if slots.dtype == torch.int64:
            own = v.own_wide.copy_(own)
        self.clean = torch.equal(own, slots)

    def see_slots(
        self, table: torch.Tensor, req: torch.Tensor, pos1: torch.Tensor, lens: torch.Tensor, slots: torch.Tensor
    ) -> None:
        """Rule 17: every row with entries (a valid token's) holds its own slot in ``slots``, by ``table``
        at position ``pos1 - 1`` (rows whose last entry is not their own position: ``see_own_slots``
        otherwise). Through numpy: the same memory without torch's per-op dispatch."""
        if not self.clean:
            return
        block_size = self.block_size
        p = pos1.numpy() - 1
        page = np.clip(p // block_size, 0, table.shape[1] - 1)
        own = table.numpy()[req.numpy(), page].astype(np.int64) * block_size + p % block_size
        self.clean = not bool(((own != slots.numpy()) & (lens.numpy() > 0) & (p >= 0)).any())


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
    past_seq: bool = False,
    own_pos1: torch.Tensor | None = None,
    own_last: bool = False,
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
    (their lens zeroed before the columns are laid out) and reported in ``guard`` (rows that break rule 17
    are reported and keep their entries); the pages below a row's
    first are then left out of its block check. ``lens_in_range``: whether every lens lies in [0, width]
    already. With ``probe``, the blocks are only looked at (``RowProbe``), and the last pages too where rows
    may read past their request's seq_len (``past_seq``: image rows). ``own_pos1``: each row's token
    position + 1, where rule 17 is checked (``RowGuard.slots``, ``RowProbe.slots``); ``own_last``: whether a
    row's last entry is that position (the probe then reads it there).
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
    if probe is not None and past_seq:
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
        if probe.slots is not None and own_pos1 is not None and not own_last:
            probe.see_slots(table, req, own_pos1, lens, probe.slots)
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
        recorded = broken
        if guard.slots is not None and own_pos1 is not None:
            recorded = _own_slot_rule(table, req, own_pos1 - 1, lens, block_size, guard, broken)
        torch.where(recorded, req, ws.c[NO_KEY], out=guard.key)
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
    if probe is not None and own_last and probe.slots is not None:
        probe.see_own_slots(out, kept, v, probe.slots)


def _own_slot_rule(
    table: torch.Tensor,
    req: torch.Tensor,
    pos: torch.Tensor,
    lens: torch.Tensor,
    block_size: int,
    guard: RowGuard,
    broken: torch.Tensor,
) -> torch.Tensor:
    """Rule 17 into ``guard`` (docs/semantics.md #guarded-builds): a row with entries that broke no rule
    (``broken``: rules 5 and 6) reads its token's own position ``pos``, on a page inside the table; its slot
    there must be the row's slot_mapping entry (``guard.slots``), else the row breaks rule 17 (its value:
    the token's row, ``guard.tokens``). Returns the rows to record, ``broken`` and those: a row that breaks
    rule 17 alone keeps its entries (the table and seq_lens define them, inside the cache). A guarded
    build's full path only."""
    assert guard.slots is not None and guard.tokens is not None
    width = table.shape[1]
    page = torch.div(pos, block_size, rounding_mode="floor")
    checked = (lens > 0) & (pos >= 0) & (page < width) & ~broken
    own = table.view(-1).index_select(0, req * width + page.clamp(0, width - 1)).long() * block_size
    bad = checked & (own + (pos - page * block_size) != guard.slots)
    guard.kind.masked_fill_(bad, OWN_SLOT)
    torch.where(bad, guard.tokens, guard.value, out=guard.value)
    return broken | bad


def request_terms(
    plan: BuildPlan,
    window_size: int,
    *,
    causal: bool,
    out: torch.Tensor | None = None,
    workspace: RowWorkspace | None = None,
    ends: torch.Tensor | None = None,
    rows: Sequence[torch.Tensor] | None = None,
) -> torch.Tensor:
    """The per-request terms window rows gather, int32 [TERMS, R] (no host sync): for causal rows
    (S_r - qsl[r + 1], max(replay_start[r], 0)), for DSpark rows (start, lens) = (max(P_r - W, 0),
    S_r - start). A guarded build then empties the requests that broke a rule (``empty_requests``).
    Read from the build's plan: its step inputs (``plan.inputs``; a per-request input is read here, so the
    backend's call of this stays as it is: docs/kernels.md #adding-a-per-request-input) and the bounds it
    chose (``plan.replay_start``, the batch's or the zeros); longer tensors are cut to ``plan.num_reqs``.
    ``ends``: ``query_start_loc[1:]``, ``rows``: ``out``'s rows, when the caller has them."""
    num_reqs, inputs = plan.num_reqs, plan.inputs
    query_start_loc, seq_lens, replay_start = inputs.query_start_loc, inputs.seq_lens, plan.replay_start
    if out is None:
        out = torch.empty((TERMS, num_reqs), dtype=torch.int32, device=seq_lens.device)
    first, second = rows if rows is not None else out.unbind(0)
    ws = workspace
    seq = seq_lens if seq_lens.shape[0] == num_reqs else seq_lens[:num_reqs]
    end = query_start_loc[1 : num_reqs + 1] if ends is None else ends
    if causal:
        torch.sub(seq, end, out=first)
        # The plan's bounds are never None (zeros where the batch has none), and may be longer than R.
        torch.clamp_min(replay_start if replay_start.shape[0] == num_reqs else replay_start[:num_reqs], 0, out=second)
    else:
        query = torch.sub(end, query_start_loc[:num_reqs], out=second)
        start = torch.sub(seq, query, out=first)  # P_r
        start.sub_(window_size if ws is None else ws.c[window_size]).clamp_min_(0)
        torch.sub(seq, start, out=second)
    return out


def gather_lens(plan: BuildPlan, window_size: int, *, out: torch.Tensor) -> None:
    """The prefills' gather lengths (docs/semantics.md #prefill-metadata) into ``out`` [num_prefills], by the
    reference's arithmetic (``reference.prefill_gather_lens``) read from the build's plan as ``request_terms``
    reads it: its step inputs (``plan.inputs``) and the bounds it chose (``plan.replay_start``), so the
    backend's call of this names no input (docs/kernels.md #adding-a-per-request-input)."""
    inputs = plan.inputs
    reference.prefill_gather_lens(
        inputs.seq_lens,
        inputs.query_start_loc,
        plan.num_decodes,
        plan.num_prefills,
        window_size,
        replay_start=plan.replay_start,
        out=out,
    )


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
    """Causal rows (``reference.causal_window_rows``) of the token rows t with owners ``req``, validity ``valid``
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
        probe=probe,
        past_seq=right is not None,
        own_pos1=pos1,
        # Without image visibility a row's entries end at its own position (its lens never reach the width).
        own_last=left is None and right is None,
    )


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
    probe: RowProbe | None = None,
    own_pos1: torch.Tensor | None = None,
) -> None:
    """DSpark rows (``reference.noncausal_window_rows``) of the token rows with owners ``req`` and validity ``valid``,
    from ``request_terms(causal=False)``; into ``out`` [n, width] and ``lens`` [n]. ``own_pos1``: each row's
    token position + 1, where rule 17 is checked."""
    rows, width = out.shape
    v = ws.space(block_size, width).views(rows)
    torch.index_select(terms, 1, req, out=v.terms)
    start, row_lens = v.term
    torch.where(valid, row_lens, ws.c[0], out=lens)
    # A row wider than this is a guarded build's rule 7 (emptied); no input ever gets one handed out.
    lens.clamp_max_(width)
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
        own_pos1=own_pos1,
    )
