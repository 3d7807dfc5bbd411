"""The torch backend's guard (docs/semantics.md #guarded-builds): the rules of ``rules.py`` checked by
vectorised torch code, without a host sync.

``TorchGuard`` checks the request-level rules (query_start_loc non-decreasing, seq_len >= query_len, replay
bounds, image spans neither inverted nor negative, seq_len within max_model_len, DSpark row widths, and the
host copies the plan read held against the device values, rules 14 and 15); the row fills
(``rows.RowGuard``) check the rows' (block ids inside ``[0, block_limit)`` and the table's width, each
row's slot mapping the token's own slot). It keeps every request's and row's first broken rule as a
candidate and records the first one in the build's violation record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..cache import HostCache
from ..config import INT32_LIMIT
from ..rules import CANDIDATE_LEN, NO_VIOLATION, RECORD_LEN, Violation
from .rows import NO_KEY

if TYPE_CHECKING:
    from ..batch import ImageSpans
    from ..config import SWAConfig
    from ..plan import BuildPlan


# -- the torch backend's guard -----------------------------------------------------------------------------


class Check(NamedTuple):
    """One request-level rule as the guard checks it: a row of the rules table (``row``) that holds, per
    request, a quantity that is negative where the request breaks the rule; the kind a violation of it records
    and the row of the value it reports; and which builds fill the row (``fill``, one of ``FILLS``; None:
    every build)."""

    row: str
    kind: int
    reports: str
    fill: str | None = None


# The rules a request is checked against, one row each, in the order they are checked: a request's first
# negative quantity is its first broken rule. Adding a rule is a row here, the rows it reports or reads among
# ``VALUES`` and the code that fills it (``TorchGuard.request_quantities``).
CHECKS = (
    Check("QUERY", Violation.QUERY_ORDER, "QUERY"),  # q_r = qsl[r + 1] - qsl[r] < 0
    Check("PREFIX", Violation.SEQ_SHORT, "SEQ"),  # P_r = S_r - q_r < 0 (reports S_r)
    # Rule 16: max_model_len - S_r < 0 (reports S_r). In the CPU's first test, the bound is the lower of
    # max_model_len and the block table's width times the page size: there it also proves rule 5 for rows that
    # read nothing past seq_len (``TorchGuard.request_quantities``).
    Check("MODEL_LEFT", Violation.MODEL_LEN, "SEQ"),
    # Rule 14, the host split's margins (each reports q_r): a request's query against its cap (a decode's
    # min(max_decode_query_len, max_query_len), a prefill's max_query_len), a decode's end against the decode
    # tokens; a prefill's end against num_tokens and its start against the decode tokens (0 for a decode).
    Check("SPLIT_QUERY", Violation.HOST_SPLIT, "QUERY"),  # query margin < 0
    Check("SPLIT_END", Violation.HOST_SPLIT, "QUERY", fill="values"),  # end margin < 0
    Check("SPLIT_BEGIN", Violation.HOST_SPLIT, "QUERY", fill="values"),  # start margin < 0
    # Rule 15: -|seq_lens_cpu[r] - S_r| < 0 for a prefill (reports seq_lens_cpu[r]); 0 for a decode.
    Check("HOST_SAME", Violation.HOST_SEQ, "HOST", fill="held"),
    Check("BOUND", Violation.REPLAY, "BOUND", fill="replay"),  # replay_start[r] < 0
    Check("HEADROOM", Violation.REPLAY, "BOUND", fill="replay"),  # P_r - replay_start[r] < 0 (reports the bound)
    Check("SPAN_BAD", Violation.SPAN, "FIRST_SPAN", fill="spans"),  # -1 where a span of the request is bad
    Check("WIDTH_LEFT", Violation.ROW_WIDTH, "NEED", fill="dspark"),  # width - need < 0 (reports need)
    Check("NONE", NO_VIOLATION, "NONE"),  # always -1: stands for "none"
)
# The rows after the checked ones, with the builds that fill them: the values a violation reports and the
# operands of the first quantities (S, rule 16's bound, rule 14's caps).
VALUES = (("SEQ", None), ("MODEL_LIMIT", None), ("CAP", None), ("FIRST_SPAN", None), ("NEED", None), ("HOST", "held"))
# The fills of rows only some builds write, in the order ``TorchGuard._fill`` takes them: rule 14's ends and
# starts (the full guard's), rule 15's (prefills with a host copy), replay bounds, spans, DSpark widths.
FILLS = ("values", "held", "replay", "spans", "dspark")

# Each row's number in a request count's rules table (int64 [RULE_ROWS, R], ``_RequestViews.rules``, one column
# per request; query_start_loc, R + 1 entries, has its own vector): the checked rows, then ``VALUES``, then
# QUERY_AGAIN, q written a second time. [P; model left; cap - q] = [S; model limit; cap] - [q; S; q] is then one
# subtraction: QUERY, SEQ and QUERY_AGAIN, APART apart, are one strided view, PREFIX to SPLIT_QUERY and SEQ to
# CAP (S, the bound of rule 16 and the query caps of the host's split) contiguous blocks.
ROW = {name: number for number, name in enumerate([c.row for c in CHECKS] + [name for name, _ in VALUES])}
APART = len(CHECKS)
ROW["QUERY_AGAIN"] = ROW["QUERY"] + 2 * APART
RULE_ROWS = ROW["QUERY_AGAIN"] + 1
NONE = ROW["NONE"]
# What that subtraction needs of the tables' order (a rule added among the first four, or a value before CAP,
# would break it): QUERY, then PREFIX, MODEL_LEFT and SPLIT_QUERY first of CHECKS, NONE last; SEQ, MODEL_LIMIT
# and CAP first of VALUES.
assert [c.row for c in CHECKS[:4]] == ["QUERY", "PREFIX", "MODEL_LEFT", "SPLIT_QUERY"] and NONE == APART - 1, CHECKS
assert [name for name, _ in VALUES[:3]] == ["SEQ", "MODEL_LIMIT", "CAP"], VALUES
# Per checked row: the kind it records and the row of the value it reports.
ROW_KINDS = tuple(int(c.kind) for c in CHECKS)
VALUE_ROWS = tuple(ROW[c.reports] for c in CHECKS)
# Per fill, the rows it writes (zeroed before a build that does not fill them reads them).
OPTIONAL_ROWS = tuple(
    tuple(ROW[row] for row, filled in [(c.row, c.fill) for c in CHECKS] + list(VALUES) if filled == fill)
    for fill in FILLS
)
# Rule 16's bound where it is not checked (draft updates): above every int32 seq_lens.
NO_MODEL_LIMIT = 1 << 32


class _RequestViews:
    """One request count's cut of a TorchGuard (made once per count: slices cost as much as small ops).

    Its rules table is its own, not a cut of one table for every count: so the quantities a guarded CPU
    build tests first (``TorchGuard.requests_clean``) are one contiguous block, whose minimum costs a
    fifth of a strided one's. ``filled``: which optional rows the last build of this count filled (``_fill``).
    ``caps``: the split and bound the CAP and MODEL_LIMIT rows hold; ``split``: this build's (num_decodes,
    num_decode_tokens, num_tokens); ``qsl_host``: ``qsl`` read on the host (a CPU guard's, else None)."""

    __slots__ = (
        "filled",
        "flat_quantities",
        "qsl",
        "qsl_host",
        "begin",
        "end",
        "begins",
        "ends",
        "seq",
        "query",
        "prefix",
        "queries",
        "operands",
        "limits",
        "margins",
        "cap",
        "caps",
        "split",
        "split_end",
        "host_same",
        "host",
        "split_begin",
        "split_cuts",
        "split_decodes",
        "bound",
        "headroom",
        "span_bad",
        "first_span",
        "need",
        "width_left",
        "checked",
        "quantities",
        "rules",
        "negative",
        "seen",
        "any",
        "rule",
        "value_row",
        "value_row_2d",
        "value",
        "value_2d",
        "kind",
        "key",
        "reported",
        "broken",
        "arange",
    )

    qsl: torch.Tensor
    qsl_host: Any
    begin: torch.Tensor
    end: torch.Tensor
    begins: torch.Tensor
    ends: torch.Tensor
    seq: torch.Tensor
    query: torch.Tensor
    prefix: torch.Tensor
    queries: torch.Tensor
    operands: torch.Tensor
    limits: torch.Tensor
    margins: torch.Tensor
    cap: torch.Tensor
    caps: tuple[int, int, int, int, int] | None
    split: tuple[int, int, int]
    split_end: torch.Tensor
    host_same: torch.Tensor
    host: torch.Tensor
    split_begin: torch.Tensor
    split_cuts: HostCache
    split_decodes: int
    bound: torch.Tensor
    headroom: torch.Tensor
    span_bad: torch.Tensor
    first_span: torch.Tensor
    need: torch.Tensor
    width_left: torch.Tensor
    checked: torch.Tensor
    quantities: torch.Tensor
    flat_quantities: torch.Tensor
    filled: tuple[bool, ...]
    rules: torch.Tensor
    negative: torch.Tensor
    any: torch.Tensor
    rule: torch.Tensor
    value_row: torch.Tensor
    value_row_2d: torch.Tensor
    value: torch.Tensor
    value_2d: torch.Tensor
    kind: torch.Tensor
    key: torch.Tensor
    reported: torch.Tensor
    broken: torch.Tensor
    arange: torch.Tensor
    seen: torch.Tensor


class TorchGuard:
    """The guard of the torch backend (docs/semantics.md #guarded-builds): vectorised, without a host sync,
    in a few operations per build whatever the number of requests and rows.

    Every request and every token row of a build is a candidate for the record: a column of ``table``
    (int32 [4, 1 + R + T]) holds its ``(1, kind, key, value)``, requests from column 1, then the decode
    rows, then the prefill rows (column 0 stands for none). ``request_quantities`` and ``first_broken`` fill the
    requests' columns (rules 1-4, 7 and 14-16, one pass over ``rules``: the first negative quantity of a
    request is its first broken rule), the row fill
    (``rows.RowGuard``) the rows' (rules 5, 6 and 17). A candidate's key is its request where it broke
    a rule, else ``NO_KEY``; ``record`` keeps the candidate of the lowest key, the first among equal
    keys: the lowest request that broke a rule, with its request-level rule if it broke one, else its
    first broken row.
    """

    def __init__(self, max_reqs: int, max_rows: int, device: torch.device):
        i32: dict[str, Any] = dict(dtype=torch.int32, device=device)
        self.device = device
        # Column 0 stands for "nothing broken": its key is below every unbroken candidate's and its first
        # entry, 0 where every real candidate has 1, keeps the record as it is.
        self.table = torch.zeros((CANDIDATE_LEN, 1 + max_reqs + max_rows), **i32)
        self.table[0, 1:] = 1
        self.table[2] = NO_KEY
        self.table[2, 0] = NO_KEY - 1
        self.negative = torch.empty((NONE + 1, max_reqs), dtype=torch.bool, device=device)
        self.any = torch.empty(max_reqs, dtype=torch.bool, device=device)
        self.seen = torch.empty(max_reqs, dtype=torch.int32, device=device)
        self.rule = torch.empty(max_reqs, dtype=torch.int64, device=device)
        self.value_row = torch.empty(max_reqs, dtype=torch.int64, device=device)
        self.value = torch.empty(max_reqs, dtype=torch.int64, device=device)
        self.broken = torch.empty(max_reqs, dtype=torch.bool, device=device)
        self.arange = torch.arange(max_reqs, **i32)
        self.kinds = torch.tensor(ROW_KINDS, **i32)
        self.value_rows = torch.tensor(VALUE_ROWS, dtype=torch.int64, device=device)
        self.no_key = torch.tensor(NO_KEY, **i32)
        self.zero64 = torch.tensor(0, dtype=torch.int64, device=device)
        self.int32_min = torch.tensor(-INT32_LIMIT - 1, dtype=torch.int64, device=device)
        self.none_row = torch.tensor(NONE, dtype=torch.int64, device=device)
        self.at = torch.zeros(1, dtype=torch.int64, device=device)
        # The first test's minimum (requests_clean), read on the host through numpy (the same memory; the
        # first test runs on the CPU only).
        self.lowest = torch.zeros((), dtype=torch.int64, device=device)
        self._lowest_host: Any = self.lowest.numpy() if device.type == "cpu" else None
        # The chosen candidate, then the build's group (set per call: every candidate of a call shares it).
        self.chosen = torch.zeros((RECORD_LEN, 1), **i32)
        self.chosen_flag, self.chosen_flat = self.chosen[0], self.chosen[:, 0]
        self.chosen_candidate, self.chosen_group = self.chosen[:CANDIDATE_LEN], self.chosen[CANDIDATE_LEN]
        self._group = 0
        self.take = torch.zeros(1, dtype=torch.bool, device=device)
        # A request count's views and rules table: always kept (not a cache the switch turns off: a build
        # reads back, in a later call, the quantities an earlier call wrote there).
        self._views = HostCache(limit=64, enabled=True)
        # Views of the candidates' table, kept as the host cache keeps (swa_hal/cache.py).
        self._row_views = HostCache(limit=64)
        self._record_views = HostCache(limit=64)
        self._record: tuple[torch.Tensor, torch.Tensor] | None = None

    def _request_views(self, num_reqs: int) -> _RequestViews:
        v = self._views.get(num_reqs)
        if v is not None:
            return v
        r = num_reqs
        v = self._views.keep(r, _RequestViews())
        rules = torch.zeros((RULE_ROWS, r), dtype=torch.int64, device=self.device)
        rules[NONE] = -1
        # Rows some earlier build filled that this one may not (replay bounds, spans, DSpark widths): they
        # are zeroed before a build that does not fill them reads them.
        v.filled = (False,) * len(OPTIONAL_ROWS)
        v.qsl = torch.zeros(r + 1, dtype=torch.int64, device=self.device)
        v.qsl_host = v.qsl.numpy() if self.device.type == "cpu" else None
        v.begin, v.end = v.qsl[:r], v.qsl[1 : r + 1]
        v.begins, v.ends = v.begin.expand(2, r), v.end.expand(2, r)
        row = {name: rules[number] for name, number in ROW.items()}
        query, query_again, seq = ROW["QUERY"], ROW["QUERY_AGAIN"], ROW["SEQ"]
        v.seq, v.query, v.prefix = row["SEQ"], row["QUERY"], row["PREFIX"]
        v.queries, v.operands = rules[query : query_again + 1 : 2 * APART], rules[query : query_again + 1 : APART]
        v.limits, v.margins = rules[seq : ROW["CAP"] + 1], rules[ROW["PREFIX"] : ROW["SPLIT_QUERY"] + 1]
        v.cap, v.caps, v.split = row["CAP"], None, (0, 0, 0)
        v.split_end, v.split_begin = row["SPLIT_END"], row["SPLIT_BEGIN"]
        v.host_same, v.host = row["HOST_SAME"], row["HOST"]
        v.split_cuts, v.split_decodes = HostCache(limit=64), 0
        v.bound, v.headroom = row["BOUND"], row["HEADROOM"]
        v.span_bad, v.first_span = row["SPAN_BAD"], row["FIRST_SPAN"]
        v.need, v.width_left = row["NEED"], row["WIDTH_LEFT"]
        v.checked, v.quantities, v.rules = rules[: NONE + 1], rules[:NONE], rules
        v.flat_quantities = v.quantities.view(-1)
        v.negative = self.negative[:, :r]
        v.any, v.rule = self.any[:r], self.rule[:r]
        v.value_row, v.value = self.value_row[:r], self.value[:r]
        v.value_row_2d, v.value_2d = v.value_row[None, :], v.value[None, :]
        v.kind, v.key, v.reported = self.table[1, 1 : r + 1], self.table[2, 1 : r + 1], self.table[3, 1 : r + 1]
        v.broken, v.arange, v.seen = self.broken[:r], self.arange[:r], self.seen[:r]
        return v

    @staticmethod
    def _fill(v: _RequestViews, fills: tuple[bool, ...]) -> None:
        """Zero the optional rows (``OPTIONAL_ROWS``) the last build filled and this one does not
        (``fills``); a build without spans, replay bounds or DSpark rows then reads zeros there."""
        if fills != v.filled:
            for rows, was, now in zip(OPTIONAL_ROWS, v.filled, fills):
                if was and not now:
                    for row in rows:
                        v.rules[row].zero_()
            v.filled = fills

    def request_quantities(
        self, plan: BuildPlan, config: SWAConfig, *, values: bool = True, table_positions: int | None = None
    ) -> None:
        """Rules 1-4, 7, 14, 15 and 16 (per request) for the requests [0, R) of the build's ``plan``: its step
        inputs (``plan.inputs``: query_start_loc [R + 1], seq_lens, causal or DSpark rows, image spans where the
        plan works out images) and the replay bounds it chose (``plan.replay_start``; rule 3 where rows use the
        bound: every request of a causal build, else the prefills, and only where the step has bounds: the
        zeros of a step without any break no rule), rule 14 against the plan's split: every request's checked
        quantities (negative where it breaks a rule), without
        choosing the first broken rule (``first_broken`` does). ``values=False`` (the CPU's first test,
        ``requests_clean``): rule 14's end and start margins are left to ``requests_clean``, which holds
        the host's split against two offsets instead of every request's (the rows read 0).
        ``table_positions`` (the first test's): the block table's width times the page size, which then
        bounds seq_lens with max_model_len in rule 16's row (negative where a request's last page lies past
        the table). Rows that read no position at or past their request's seq_len (all but image rows,
        docs/semantics.md #vision-spans) read no page past the table where it is not negative, so rule 5
        needs no look at their pages (full validation asks the same of every request)."""
        inputs, num_reqs = plan.inputs, plan.num_reqs
        query_start_loc, seq_lens, causal = inputs.query_start_loc, inputs.seq_lens, inputs.causal
        if seq_lens.shape[0] != num_reqs:  # an engine's longer buffer
            seq_lens = seq_lens[:num_reqs]
        replay_start = None
        if inputs.replay_start is not None:
            replay_start = plan.replay_start
            if replay_start.shape[0] != num_reqs:
                replay_start = replay_start[:num_reqs]
        spans = inputs.image_spans if plan.images else None
        v = self._request_views(num_reqs)
        # int64: a difference of int32 inputs never overflows (int32 minus int64 is computed in int64).
        v.qsl.copy_(query_start_loc)
        torch.sub(v.ends, v.begins, out=v.queries)  # q_r, into QUERY and QUERY_AGAIN
        # seq_lens in int64 (S_r is also the value rules 2 and 16 report, and DSpark widths read it), then
        # rule 2's P_r = S_r - q_r, rule 16's limit - S_r and rule 14's cap_r - q_r: one subtraction.
        v.seq.copy_(seq_lens)
        # Rule 16 is a build's rule, not a draft update's.
        limit = config.max_model_len if plan.build_checks else NO_MODEL_LIMIT
        if table_positions is not None:
            limit = min(limit, table_positions)
        self._limits(v, num_reqs, plan, limit)
        torch.sub(v.limits, v.operands, out=v.margins)
        v.split = (plan.num_decodes, plan.num_decode_tokens, inputs.num_tokens)
        checks_spans = spans is not None and config.max_image_tokens > 0 and spans.starts.shape[0] > 0
        # Rule 15: a prefill's host seq_lens (the plan's, on this device) equal to the device's.
        host = plan.host_seq_lens
        held = host is not None and plan.num_decodes < num_reqs
        # Rule 3 holds where rows use the bound: every request of a causal build; the prefills of a DSpark
        # step (its decode rows ignore the bound, docs/semantics.md #dspark-rows; its prefill rows and gather
        # lengths do not), as the kernels' prefill and gather programs check it.
        decodes = 0 if causal else plan.num_decodes
        replay = replay_start is not None and decodes < num_reqs
        self._fill(v, (values, held, replay, checks_spans, not causal))  # the optional rows it fills, as FILLS

        if values:
            self._split_ends(v, num_reqs, plan)
        if held:
            assert host is not None
            v.host.copy_(host[:num_reqs])
            torch.sub(v.host, seq_lens, out=v.host_same).abs_().neg_()
            if plan.num_decodes:
                v.host_same[: plan.num_decodes] = 0
                v.host[: plan.num_decodes] = 0
        if replay:
            assert replay_start is not None
            v.bound.copy_(replay_start)
            torch.sub(v.prefix, v.bound, out=v.headroom)
            if decodes:
                v.bound[:decodes] = 0
                v.headroom[:decodes] = 0
        if checks_spans:
            assert spans is not None
            bad_req, first_span = _span_checks(spans, num_reqs)
            torch.mul(bad_req, -1, out=v.span_bad)
            v.first_span.copy_(first_span)
        if not causal:
            torch.minimum(v.seq, v.query + config.window_size, out=v.need)
            torch.sub(v.need, config.noncausal_index_width, out=v.width_left).neg_()
            # Rule 7 is a DSpark row's: the step's prefill rows are causal rows, which their own width holds
            # whatever q + W is (docs/semantics.md #dspark-rows, vector S3).
            if decodes < num_reqs:
                v.width_left[decodes:] = 0

    @staticmethod
    def _cuts(v: _RequestViews, nd: int) -> tuple[torch.Tensor, ...]:
        """The decode and prefill parts of the rows rule 14 reads and writes (slices cost as much as small
        ops: one set per decode count)."""
        cut = v.split_cuts.get(nd)
        if cut is None:
            end, begin, cap, over_end = v.end, v.begin, v.cap, v.split_end
            cut = v.split_cuts.keep(nd, (
                cap[:nd], cap[nd:], end[:nd], end[nd:], begin[nd:], over_end[:nd], over_end[nd:],
                v.split_begin[:nd], v.split_begin[nd:],
            ))  # fmt: skip
        return cut

    def _limits(self, v: _RequestViews, num_reqs: int, plan: BuildPlan, model_limit: int) -> None:
        """Rule 14's query caps into the CAP row (a decode's min(decode_query_max, max_query_len), a
        prefill's max_query_len, 0 for a request past the replay bounds, which the host copy makes padding)
        and rule 16's bound into MODEL_LIMIT. Host values: rewritten only when they change (a decode-only
        server's never do)."""
        nd, bounds = plan.num_decodes, plan.num_bounds
        # Into int32: a validated build admits an overstated max_query_len of any size (the default path's
        # preflight bounds it by the capacity); INT32_LIMIT still admits every query length.
        cap = min(plan.inputs.max_query_len, INT32_LIMIT)
        caps = (nd, min(plan.decode_query_max, cap), cap, model_limit, bounds)
        old = v.caps
        if caps == old:
            return
        if old is None or caps[:3] != old[:3] or bounds != old[4]:
            cap_dec, cap_pre = self._cuts(v, nd)[:2]
            if nd:
                cap_dec.fill_(caps[1])
            if nd < num_reqs:
                cap_pre.fill_(caps[2])
            if bounds < num_reqs:
                v.cap[bounds:].zero_()
        if old is None or model_limit != old[3]:
            v.rules[ROW["MODEL_LIMIT"]].fill_(model_limit)
        v.caps = caps

    def _split_ends(self, v: _RequestViews, num_reqs: int, plan: BuildPlan) -> None:
        """Rule 14's end and start margins, per request, in place: negative where the device offsets break
        the host's split (the full guard, which names the request). The end margin is written as an excess
        (``end - limit``) and negated: a tensor minus a number is one op, a number minus a tensor two."""
        nd = plan.num_decodes
        _, _, end_dec, end_pre, begin_pre, oe_dec, oe_pre, b_dec, b_pre = self._cuts(v, nd)
        if nd:
            # A decode is inside the decode tokens (so inside num_tokens: the host checked ndt <= T).
            torch.sub(end_dec, plan.num_decode_tokens, out=oe_dec)
        if nd < num_reqs:
            torch.sub(end_pre, plan.inputs.num_tokens, out=oe_pre)
            torch.sub(begin_pre, plan.num_decode_tokens, out=b_pre)
        if v.split_decodes != nd:  # a decode has no start margin: 0 where the last build had a prefill
            b_dec.zero_()
            v.split_decodes = nd
        v.split_end.neg_()

    def requests_clean(self, num_reqs: int) -> bool:
        """Whether no request broke a rule, from ``request_quantities(values=False)``: host reads, so only
        for a device where reading a value costs no sync (the CPU). Rule 14's ends and starts are held
        against two offsets: where no request's query is negative (rule 1, in the same minimum) the
        offsets never decrease, so every decode ends at or before qsl[num_decodes] and every prefill
        starts at or after it and ends at or before qsl[R]."""
        v = self._request_views(num_reqs)
        if num_reqs:
            torch.min(v.flat_quantities, out=self.lowest)
            if self._lowest_host.item() < 0:
                return False
        nd, ndt, num_tokens = v.split
        offsets = v.qsl_host
        decode_end = int(offsets[nd])
        return decode_end <= ndt and (nd == num_reqs or decode_end >= ndt) and int(offsets[num_reqs]) <= num_tokens

    def scheduled(self, num_reqs: int) -> int:
        """query_start_loc[R] of the last ``request_quantities``, read on the host (the CPU): the rows at
        and past it are padding (rule 13)."""
        return int(self._request_views(num_reqs).qsl_host[num_reqs])

    def first_broken(self, num_reqs: int) -> torch.Tensor:
        """After ``request_quantities``: each request's first broken rule into its candidate; returns the
        bool mask [num_reqs] of the requests that broke one (the caller empties their rows:
        ``rows.empty_requests``)."""
        v = self._request_views(num_reqs)
        # A request's first broken rule: the first of its checked quantities that is negative.
        torch.lt(v.checked, self.zero64, out=v.negative)
        torch.max(v.negative, 0, out=(v.any, v.rule))
        torch.index_select(self.kinds, 0, v.rule, out=v.kind)
        torch.index_select(self.value_rows, 0, v.rule, out=v.value_row)
        torch.gather(v.rules, 0, v.value_row_2d, out=v.value_2d)
        torch.maximum(v.value, self.int32_min, out=v.reported)  # only a query length can be below int32
        broken = torch.lt(v.rule, self.none_row, out=v.broken)
        torch.where(broken, v.arange, self.no_key, out=v.key)
        return broken

    def only_seen(self, num_reqs: int, owners: torch.Tensor, valid: torch.Tensor) -> None:
        """Drop the request candidates (``first_broken``) of requests that own no row with a slot: such a
        request hands out nothing, and its rules are checked at its rows with a slot (docs/semantics.md
        #guarded-builds), so no violation is recorded for it. ``owners``/``valid``: every row's owner
        (``token_to_req``) and whether it has a slot. Its rows are still emptied (the mask ``first_broken``
        returned is unchanged)."""
        v = self._request_views(num_reqs)
        v.seen.zero_()
        v.seen.index_add_(0, owners, valid.to(torch.int32))
        torch.where(v.seen > 0, v.key, self.no_key, out=v.key)

    def row_candidates(self, num_reqs: int, offset: int, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The (kind, value, key) columns of token rows [offset, offset + rows) for ``rows.RowGuard``."""
        key = (num_reqs, offset, rows)
        views = self._row_views.get(key)
        if views is None:
            lo = 1 + num_reqs + offset
            views = self._row_views.keep(
                key, (self.table[1, lo : lo + rows], self.table[3, lo : lo + rows], self.table[2, lo : lo + rows])
            )
        return views

    def record(self, record: torch.Tensor, candidates: int, group: int) -> None:
        """Record the candidate of the lowest key among the first ``candidates`` (the build's requests and
        rows) and the build's ``group`` (``MetadataBuffers.record_group``), unless ``record`` already holds
        a violation. No host sync."""
        keys = self._record_views.get(candidates)
        if keys is None:
            keys = self._record_views.keep(candidates, self.table[2, : 1 + candidates])
        if self._record is None or self._record[0] is not record:
            self._record = (record, record[:1])
        torch.argmin(keys, 0, keepdim=True, out=self.at)
        torch.index_select(self.table, 1, self.at, out=self.chosen_candidate)  # (1, kind, request, value)
        if group != self._group:  # a plain build's group (0) never changes: no op
            self.chosen_group.fill_(group)
            self._group = group
        # Taken when the record is empty (count 0) and a candidate broke a rule (not column 0).
        torch.lt(self._record[1], self.chosen_flag, out=self.take)
        torch.where(self.take, self.chosen_flat, record, out=record)


def _span_checks(spans: ImageSpans, num_reqs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rule 4 per request: whether one of its image spans is inverted or starts at a negative position,
    and the first such span (``n``, the span count, where none is). A span that starts before the
    request's new tokens (a prefix-cache hit inside an image), ends after them or holds more than
    max_image_tokens is well formed (docs/semantics.md #vision-spans)."""
    device = spans.starts.device
    i64 = torch.int64
    ptr = spans.indptr[: num_reqs + 1].to(i64)
    n = min(spans.starts.shape[0], spans.ends.shape[0])
    span_ids = torch.arange(n, device=device)
    # Request r's spans are the existing ones in [indptr[r], indptr[r + 1]) (none where the CSR
    # decreases): [R, n] memberships, as the kernels test each span of a block against each row's range.
    mine = (span_ids >= ptr[:num_reqs, None]) & (span_ids < ptr[1:, None])
    a, e = spans.starts[:n].to(i64), spans.ends[:n].to(i64)
    bad = mine & ((a > e) | (a < 0))
    first_span = torch.where(bad, span_ids, n).amin(1) if n else torch.full((num_reqs,), n, dtype=i64, device=device)
    return bad.any(1), first_span
