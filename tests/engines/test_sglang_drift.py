"""Drift and shadow mode in SGLang (docs/engines.md #drift, #shadow-mode), ``make test-sglang``.

Drift: every hook of the plugin is handed a call of a newer SGLang (an argument it does not know, an argument
renamed, an attribute of SGLang's it reads that is gone): SGLang's own code answers, no exception reaches
SGLang, one warning names the hook and what it did not know, ``stepped_aside()`` counts the calls;
``SWA_HAL_STRICT=1`` raises ``EngineDriftError`` instead. The drifted SGLang functions are SGLang's own with
the newer signature (they accept and drop the new argument), so the answer that must come back is SGLang's.

Shadow mode: SGLang's own code serves every call; swa_hal's is compared with it on the shadow's turns. Equal
calls count towards a promotion; a planted difference (a row one off, a shifted replay bound) is found on the
call it is planted in, turns swa_hal off and is logged once with the field and entry; a refusal of swa_hal's
where SGLang served is a difference too.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

import sglang_harness as H  # noqa: E402
from sglang.kernels.ops.attention.dsv4.attn_metadata_kernels import BuildCausalSwaPageIndices  # noqa: E402
from sglang.kernels.ops.speculative.dspark.dspark_attn_metadata import BuildDsparkSwaRingIndices  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # noqa: E402
from sglang_hooks import LogLines, Originals  # noqa: E402

from swa_hal.integrations import EngineDriftError, stepped_aside  # noqa: E402
from swa_hal.integrations import sglang as integ  # noqa: E402
from swa_hal.integrations.aside import reset_stepped_aside  # noqa: E402
from swa_hal.integrations.shadow import Shadow, ShadowSettings, fields_of  # noqa: E402


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    """Each test starts with no counts, no shadow, the torch backend and swa_hal's log lines kept."""
    reset_stepped_aside()
    integ.configure(backend="torch")
    monkeypatch.setattr(integ, "_shadow", None)
    lines = LogLines()
    integ.log.addHandler(lines)
    integ.log.setLevel(logging.INFO)
    yield lines
    integ.log.removeHandler(lines)
    integ.configure()
    reset_stepped_aside()


def sglang_function(owner, attr):
    """SGLang's own function of a target, under any wrapper a registry put on it."""
    raw = owner.__dict__[attr]
    func = raw.__func__ if isinstance(raw, classmethod) else raw
    while getattr(func, "__wrapped__", None) is not None:
        func = func.__wrapped__
    return func


def with_new_keyword(function, name="integrity_args"):
    """``function`` as a newer SGLang has it: it takes one more keyword, and drops it."""

    def newer(*args, **kwargs):
        kwargs.pop(name, None)
        return function(*args, **kwargs)

    return newer


def with_renamed_keyword(function, old, new):
    """``function`` as a newer SGLang has it: its keyword ``old`` is called ``new``."""

    def newer(*args, **kwargs):
        kwargs[old] = kwargs.pop(new)
        return function(*args, **kwargs)

    return newer


# -- one valid call of each hook, with SGLang's own answer ---------------------------------------------------


@dataclasses.dataclass
class HookCall:
    """A call of ``hook`` SGLang could make: its positional and keyword arguments, SGLang's own function (the
    AROUND hook's original) and what SGLang answers, as a function of the result (``engine_answer``)."""

    name: str
    hook: object
    original: object
    args: tuple
    kwargs: dict
    want: object
    attribute_holder: object = None  # the object whose attribute the hook reads (methods of SGLang's backend)
    attribute: str | None = None

    def call(self, original=None, **extra):
        return self.hook(original or self.original, *self.args, **{**self.kwargs, **extra})


def op_call(name, hook, op, kwargs):
    """A call of SGLang op ``op``'s ``execute`` (a class method) through ``hook``, and SGLang's answer."""
    own = sglang_function(op, "execute")
    return HookCall(name, hook, own, (op,), kwargs, own(op, **kwargs))


def hook_calls():
    rng = random.Random("sglang-drift")
    causal = H.causal_case(rng, "replay")
    causal_own = sglang_function(BuildCausalSwaPageIndices, "execute")
    yield op_call("causal rows", integ.causal_execute, BuildCausalSwaPageIndices, causal.op_kwargs())
    core_self = SimpleNamespace(token_to_kv_pool=SimpleNamespace(request_window=None))

    def core_original(self, c, dspark_block_size=None):
        # make_core_attn_metadata's causal branch, calling the op as SGLang's registry leaves it: hooked.
        return H.sglang_causal_branch(c, lambda **kw: integ.causal_execute(causal_own, BuildCausalSwaPageIndices, **kw))

    yield HookCall(
        "causal lens",
        integ.core_attn_metadata_around,
        core_original,
        (core_self, causal),
        {},
        H.sglang_causal(causal),
        core_self,
        "token_to_kv_pool",
    )
    dspark = H.dspark_case(rng, with_valid_from=True)
    dspark_self = H.backend_stand_in(dspark)

    def dspark_original(self, **kw):
        return H.sglang_dspark(dspark)

    kw = dict(
        seq_lens_casual=dspark.seq_lens_casual,
        req_pool_indices_repeated=dspark.req_pool_indices_repeated,
        out_loc=dspark.out_loc,
        block_size=dspark.block_size,
    )
    yield HookCall(
        "DSpark paged rows", integ.dspark_indices_around, dspark_original, (dspark_self,), kw, H.sglang_dspark(dspark),
        dspark_self.token_to_kv_pool, "full_to_swa_index_mapping",
    )
    ring = H.ring_case(rng, "ring_floors")
    yield op_call("DSpark ring rows", integ.dspark_ring_execute, BuildDsparkSwaRingIndices, ring.op_kwargs())
    hip_case = H.causal_case(rng, "decode")
    hip_self = SimpleNamespace(req_to_token=hip_case.pool.req_to_token, token_to_kv_pool=SimpleNamespace(
        full_to_swa_index_mapping=hip_case.pool.full_to_swa))
    hip_want = causal_own(BuildCausalSwaPageIndices, **{**hip_case.op_kwargs(), "swa_replay_start": None})

    def hip_original(self, seq_lens_casual, req_pool_indices_repeated):
        return hip_want

    yield HookCall(
        "ROCm causal rows", integ.hip_causal_indices_around, hip_original, (hip_self, hip_case.seq_lens_casual,
        hip_case.req_pool_indices_repeated), {}, hip_want, hip_self, "req_to_token",
    )
    import sglang.srt.mem_cache.dsv41_request_window as sgl_window

    window = H.window_case(rng, H.WINDOW_KINDS[0])
    window_own = sglang_function(sgl_window, "window_layout")
    yield HookCall(
        "V4.1 request-window layouts",
        integ.window_layout_around,
        window_own,
        (window.req, window.pos),
        window.kwargs(),
        window_own(window.req, window.pos, **window.kwargs()),
    )


CALLS = {c.name: c for c in hook_calls()}


def same_answer(got, want):
    """What SGLang answers, whatever its type: a tensor, a tuple of them, its metadata or layout objects."""
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
    if isinstance(want, tuple) and not hasattr(want, "_fields"):
        return len(got) == len(want) and all(same_answer(a, b) for a, b in zip(got, want))
    fields = fields_of(want)
    return all(same_answer(getattr(got, k), v) if isinstance(v, torch.Tensor) else getattr(got, k) == v
               for k, v in fields.items())


def test_every_hook_serves_the_valid_call_as_sglang_answers_it():
    for c in CALLS.values():
        assert same_answer(c.call(), c.want), c.name
    assert stepped_aside() == []


# make_core_attn_metadata's hook forwards every argument to SGLang's method and reads one of them by name.
FIXED_SIGNATURES = [n for n in CALLS if n != "causal lens"]


def test_a_new_keyword_of_make_core_attn_metadata_is_sglangs_to_take(clean):
    c = CALLS["causal lens"]
    seen = []

    def newer(self, case, dspark_block_size=None, integrity_args=None):
        seen.append(integrity_args)
        return c.original(self, case, dspark_block_size)

    assert same_answer(c.call(newer, integrity_args="crc"), c.want)
    assert seen == ["crc"] and stepped_aside() == []


@pytest.mark.parametrize("name", FIXED_SIGNATURES)
def test_a_new_keyword_steps_aside_to_sglangs_code(clean, name):
    c = CALLS[name]
    newer = with_new_keyword(c.original)
    for _ in range(3):
        assert same_answer(c.call(newer, integrity_args=("crc", 7)), c.want), name
    (entry,) = [e for e in stepped_aside("SGLang")]
    assert entry["hook"] == name and entry["calls"] == 3
    assert "integrity_args" in entry["reason"], entry
    warned = [line for line in clean.lines if "integrity_args" in line]
    assert len(warned) == 1 and name in warned[0] and "SGLang's own code" in warned[0], clean.lines


@pytest.mark.parametrize("name", [n for n, c in CALLS.items() if c.kwargs])
def test_a_renamed_keyword_steps_aside_to_sglangs_code(clean, name):
    c = CALLS[name]
    old = next(iter(c.kwargs))
    newer = with_renamed_keyword(c.original, old, old + "_v2")
    kwargs = dict(c.kwargs)
    kwargs[old + "_v2"] = kwargs.pop(old)
    assert same_answer(c.hook(newer, *c.args, **kwargs), c.want), name
    (entry,) = stepped_aside("SGLang")
    assert entry["hook"] == name and f"does not know: {old}_v2" in entry["reason"], entry
    assert f"lacks: {old}" in entry["reason"], entry


@pytest.mark.parametrize("name", [n for n, c in CALLS.items() if c.attribute])
def test_an_attribute_sglang_no_longer_has_steps_aside(clean, monkeypatch, name):
    c = CALLS[name]
    monkeypatch.delattr(c.attribute_holder, c.attribute)
    assert same_answer(c.call(), c.want), name
    (entry,) = stepped_aside("SGLang")
    assert entry["hook"] == name and entry["reason"].startswith("AttributeError") and c.attribute in entry["reason"]


@pytest.mark.parametrize("name", FIXED_SIGNATURES)
def test_drift_under_strict_is_a_clear_error(monkeypatch, name):
    monkeypatch.setenv("SWA_HAL_STRICT", "1")
    c = CALLS[name]
    with pytest.raises(EngineDriftError, match="integrity_args") as info:
        c.call(with_new_keyword(c.original), integrity_args=1)
    assert info.value.hook == name and info.value.engine == "SGLang"


def test_an_error_sglangs_own_code_raises_passes_through_once():
    """SGLang's own function raising inside a hook is SGLang's answer: passed on as it is, never taken for
    drift, and SGLang's function runs once."""
    c = CALLS["causal lens"]
    runs = []

    def broken(self, case, dspark_block_size=None):
        runs.append(1)
        raise KeyError("SGLang's own")

    with pytest.raises(KeyError, match="SGLang's own"):
        c.hook(broken, *c.args)
    assert runs == [1] and stepped_aside() == []


def test_a_drifted_op_applied_by_sglangs_registry_answers_as_sglang():
    """The whole path: a newer ``BuildCausalSwaPageIndices.execute`` (one more keyword) under SGLang's own hook
    registry, called as SGLang's backend calls it: SGLang's rows come back."""
    originals = Originals()
    saved = BuildCausalSwaPageIndices.__dict__["execute"]
    own = sglang_function(BuildCausalSwaPageIndices, "execute")
    newer = with_new_keyword(own)
    newer.__module__, newer.__qualname__ = own.__module__, own.__qualname__
    BuildCausalSwaPageIndices.execute = classmethod(newer)
    try:
        HookRegistry.reset()
        HookRegistry.register(integ.TARGET_CAUSAL, integ.causal_execute, HookType.AROUND)
        HookRegistry.apply_hooks()
        c = CALLS["causal rows"]
        got = BuildCausalSwaPageIndices.execute(integrity_args=None, **c.kwargs)
        assert same_answer(got, c.want)
        assert stepped_aside("SGLang")[0]["calls"] == 1
        assert same_answer(BuildCausalSwaPageIndices.execute(**c.kwargs), c.want)  # a call it knows: served
        assert stepped_aside("SGLang")[0]["calls"] == 1
    finally:
        BuildCausalSwaPageIndices.execute = saved
        HookRegistry.reset()
        originals.restore()


# -- shadow mode ----------------------------------------------------------------------------------------------


def shadowing(steps=1000, every=1, promote=False):
    shadow = Shadow("SGLang", integ.log, ShadowSettings(steps, every, promote))
    integ._shadow = shadow
    return shadow


@pytest.mark.parametrize("name", list(CALLS))
def test_shadow_serves_sglangs_answer_and_finds_swa_hal_equal(name):
    shadow = shadowing()
    c = CALLS[name]
    got = c.call()
    assert same_answer(got, c.want)
    report = shadow.report()
    assert report["compared"] == report["equal"] == 1 and report["difference"] is None, report


def test_shadow_compares_the_first_n_calls_then_one_in_k():
    shadow = shadowing(steps=3, every=4)
    c = CALLS["DSpark ring rows"]
    for _ in range(15):
        c.call()
    # Calls 1-3, then 7, 11 and 15: every 4th after the first 3.
    assert (shadow.calls, shadow.compared, shadow.equal) == (15, 6, 6), shadow.report()


def test_shadow_promotes_after_n_equal_calls_and_swa_hal_serves(monkeypatch):
    shadow = shadowing(steps=4, every=2, promote=True)
    c = CALLS["DSpark ring rows"]
    served = []
    real = integ.SGLangSWAIndices.dspark_ring
    monkeypatch.setattr(integ.SGLangSWAIndices, "dspark_ring", lambda self, **kw: served.append(1) or real(self, **kw))
    sglang_runs = []
    original = c.original

    def counted(*args, **kwargs):
        sglang_runs.append(1)
        return original(*args, **kwargs)

    for _ in range(4):
        assert same_answer(c.call(counted), c.want)
    assert shadow.mode == "serve" and len(sglang_runs) == 4 and len(served) == 4
    for _ in range(3):
        assert same_answer(c.call(counted), c.want)
    assert len(sglang_runs) == 4 and len(served) == 7  # swa_hal serves now: SGLang's op no longer runs


def planted(monkeypatch, method, on_call, plant):
    """The adapter's ``method`` with ``plant`` applied to its answer on its ``on_call``-th call."""
    real = getattr(integ.SGLangSWAIndices, method)
    calls = []

    def wrong(self, **kw):
        calls.append(1)
        got = real(self, **kw)
        return plant(got) if len(calls) == on_call else got

    monkeypatch.setattr(integ.SGLangSWAIndices, method, wrong)


def one_off(got):
    indices, lens = got
    indices = indices.clone()
    indices[1, 0] += 1
    return indices, lens


def test_shadow_finds_a_row_one_off_on_its_call_and_turns_swa_hal_off(clean, monkeypatch):
    shadow = shadowing()
    planted(monkeypatch, "dspark_ring", 5, one_off)
    c = CALLS["DSpark ring rows"]
    for _ in range(8):
        assert same_answer(c.call(), c.want)  # SGLang serves throughout
    report = shadow.report()
    assert report["mode"] == "off" and report["compared"] == 5 and report["equal"] == 4, report
    assert report["difference"].startswith("call 5 (DSpark ring rows): swa_page_indices[1, 0] differs: SGLang ")
    warned = [line for line in clean.lines if "swa_page_indices[1, 0]" in line]
    assert len(warned) == 1 and "swa_hal is off for this process" in warned[0]


def test_shadow_finds_a_shifted_replay_bound_on_its_call(monkeypatch):
    """swa_hal reading the replay floors one higher on its third call: the causal rows (their lens, through the
    ``make_core_attn_metadata`` hook, and their oldest entries) differ on that call."""
    shadow = shadowing()
    c = CALLS["causal lens"]
    real = integ.SGLangSWAIndices.causal_rows
    calls = []

    def shifted(self, **kw):
        calls.append(1)
        if len(calls) == 3 and kw.get("swa_replay_start") is not None:
            kw["swa_replay_start"] = kw["swa_replay_start"] + 1
        return real(self, **kw)

    monkeypatch.setattr(integ.SGLangSWAIndices, "causal_rows", shifted)
    for _ in range(4):
        assert same_answer(c.call(), c.want)
    report = shadow.report()
    assert report["compared"] == 3 and report["difference"].startswith("call 3 (causal rows): "), report


def test_shadow_compares_sglangs_negative_padding_lens_at_zero():
    """Draft-extend padding rows: SGLang's lens go negative, swa_hal's are 0 (docs/engines.md #shadow-mode):
    not a difference."""
    rng = random.Random("sglang-drift-padding")
    while True:
        case = H.causal_case(rng, "draft_extend")
        if bool((H.sglang_causal(case).swa_topk_lengths < 0).any()):
            break
    shadow = shadowing()
    c = CALLS["causal lens"]
    c.hook(c.original, c.args[0], case)
    assert shadow.report()["equal"] == 1 and shadow.difference is None, shadow.report()


def test_a_refusal_swa_hal_would_raise_is_a_difference():
    shadow = shadowing()
    c = CALLS["DSpark ring rows"]
    bad = dict(c.kwargs, ring_size=1)  # shorter than a row: swa_hal refuses, SGLang's op aliases
    want = c.original(*c.args, **bad)
    assert same_answer(c.hook(c.original, *c.args, **bad), want)
    assert shadow.mode == "off" and "swa_hal refused it where SGLang served it" in shadow.difference
