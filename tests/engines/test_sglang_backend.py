"""SGLang 0.5.23's real DeepSeek-V4 attention backend classes with swa_hal's seven hooks applied by SGLang's own
plugin loader and hook registry (``make test-sglang``): their metadata methods, called as SGLang calls them,
give the same metadata, field by field, with the hooks and with SGLang's own functions put back.

The backends are made without their constructors (which need a model runner and a GPU); each carries the
attributes its metadata methods read (the pools, ``req_to_token``, the speculative settings). The causal
path, the replay floor, DSpark draft blocks over the paged pool and over the per-request ring, and V4.1's
request-window layouts (live rows, padded rows, history groups, folded floors) are driven on random steps
(``sglang_harness``), on ``DeepseekV4AttnBackend`` (CUDA, and CPU, which has no backend class of its own in
0.5.23: SGLang's registry gives it the CUDA class) and on ROCm's ``DeepseekV4HipRadixBackend``.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

import sglang_harness as H  # noqa: E402
from sglang.srt.layers.attention import deepseek_v4_backend as cuda_module  # noqa: E402
from sglang.srt.layers.attention import deepseek_v4_backend_hip_radix as hip_module  # noqa: E402
from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend  # noqa: E402
from sglang.srt.layers.attention.deepseek_v4_backend_hip_radix import DeepseekV4HipRadixBackend  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402
from sglang_backends import assert_same as _equal  # noqa: E402
from sglang_backends import backend as _backend  # noqa: E402
from sglang_backends import both as _both  # noqa: E402
from sglang_backends import kv_pool as _kv  # noqa: E402
from sglang_hooks import Originals, loaded_by_sglang  # noqa: E402

from swa_hal.integrations import sglang as integ  # noqa: E402
from swa_hal.testing.request_windows import WINDOW_KINDS, window_case  # noqa: E402

STEPS = 12  # random steps per kind and backend class


@pytest.fixture(scope="module")
def hooked():
    """SGLang's loader (``SGLANG_PLUGINS=swa_hal``) with both backend modules imported first, the order in
    which a ROCm server's stale class attribute would be missed; SGLang's own functions are read before."""
    originals = Originals()
    originals.restore()  # whatever an earlier module left hooked
    with loaded_by_sglang(originals) as (ours, registry):
        yield SimpleNamespace(originals=originals, ours=ours.lines, registry=registry.lines)


@pytest.fixture(autouse=True)
def _no_flashmla(monkeypatch):
    # need_compress=False still asks FlashMLA (a CUDA library) for an empty scheduler object; not SWA metadata.
    monkeypatch.setattr(cuda_module, "_create_flashmla_metadata", lambda: None)
    if hasattr(hip_module, "_create_flashmla_metadata"):
        monkeypatch.setattr(hip_module, "_create_flashmla_metadata", lambda: None)


def test_every_hook_is_applied_by_sglangs_registry(hooked):
    assert set(integ.TARGETS) <= HookRegistry._patched
    assert not any("Failed to apply hooks" in line for line in hooked.registry), hooked.registry
    assert len(hooked.ours) == 1 and "all 7 hooks applied" in hooked.ours[0], hooked.ours
    # ROCm's DSpark method, copied from the CUDA class before the hooks applied, is swa_hal's all the same.
    for cls in (DeepseekV4AttnBackend, DeepseekV4HipRadixBackend):
        method = cls.__dict__["get_dspark_swa_page_indices"]
        assert getattr(method, "__wrapped__", None) is not None, cls


def test_start_up_line_names_a_hook_that_cannot_apply(hooked, monkeypatch):
    """A target whose module does not import here is reported failed with the reason, never applied."""
    missing = "sglang.srt.layers.attention.no_such_backend.Backend.method"
    problems = {t: integ.target_problem(t) for t in integ.TARGETS}
    assert problems == dict.fromkeys(integ.TARGETS)
    monkeypatch.setitem(integ.TARGET_NAMES, missing, "a missing backend")
    problems[missing] = integ.target_problem(missing)
    # pkgutil's resolution (the registry's) reports the missing module as a missing attribute of its package.
    assert problems[missing] == "AttributeError: module 'sglang.srt.layers.attention' has no attribute 'no_such_backend'"
    detail = integ.hooks_detail(problems)
    assert detail.startswith("1 of 8 hooks FAILED"), detail
    assert f"a missing backend ({missing}: AttributeError" in detail and "applied: causal rows" in detail


# -- the backends ----------------------------------------------------------------------------------------------


def _core_kwargs(backend_cls, pool, rep, casual, **extra):
    kwargs = dict(
        req_to_token=pool.req_to_token,
        req_pool_indices_repeated=rep,
        seq_lens_casual=casual,
        max_seq_len=pool.req_to_token.shape[1],
        out_loc=torch.zeros(casual.shape[0], dtype=torch.int64),
        need_compress=False,
    )
    kwargs.update(extra)
    return kwargs


CLASSES = (DeepseekV4AttnBackend, DeepseekV4HipRadixBackend)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("kind", ("decode", "extend", "mixed", "target_verify", "replay", "late_tail"))
def test_causal_and_replay_metadata_equal_sglangs(hooked, cls, kind):
    rng = random.Random(f"backend-causal-{cls.__name__}-{kind}")
    for _ in range(STEPS):
        case = H.causal_case(rng, kind)
        backend = _backend(cls, case.pool, _kv(case.pool))
        extra = {} if case.swa_replay_start is None else dict(swa_replay_start=case.swa_replay_start)
        kwargs = _core_kwargs(cls, case.pool, case.req_pool_indices_repeated, case.seq_lens_casual, **extra)
        got, want = _both(hooked, lambda: backend.make_core_attn_metadata(**kwargs))
        _equal(got, want, (cls.__name__, kind))


def _dspark_backend(cls, kv, pool, block):
    extra = dict(is_dspark_draft=True, speculative_num_draft_tokens=block + 1, target_verify_num_draft_tokens=block)
    backend = _backend(cls, pool, kv, **extra)
    if cls is DeepseekV4HipRadixBackend:
        backend._uses_dspark_draft_window = lambda: True  # its draft-window check reads the model config
    return backend


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("with_valid_from", (False, True))
def test_dspark_paged_metadata_equal_sglangs(hooked, cls, with_valid_from):
    rng = random.Random(f"backend-dspark-{cls.__name__}-{with_valid_from}")
    for _ in range(STEPS):
        case = H.dspark_case(rng, with_valid_from=with_valid_from)
        kv = _kv(case.pool, swa_valid_from=case.valid_from)
        backend = _dspark_backend(cls, kv, case.pool, case.block_size)
        kwargs = _core_kwargs(
            cls, case.pool, case.req_pool_indices_repeated, case.seq_lens_casual,
            out_loc=case.out_loc, dspark_block_size=case.block_size,
        )
        got, want = _both(hooked, lambda: backend.make_core_attn_metadata(**kwargs))
        _equal(got, want, (cls.__name__, case.kind))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("kind", H.RING_KINDS)
def test_dspark_ring_metadata_equal_sglangs(hooked, cls, kind):
    rng = random.Random(f"backend-ring-{cls.__name__}-{kind}")
    for _ in range(STEPS):
        case = H.ring_case(rng, kind)
        if case.window != H.SWA_WINDOW:
            continue
        pool = H.Pool(torch.zeros((case.num_slots, 8), dtype=torch.int32), None, [], 64)
        kv = _kv(None, swa_req_ring_size=case.ring_size, swa_valid_from=case.valid_from, num_req_slots=case.num_slots)
        backend = _dspark_backend(cls, kv, pool, case.block_size)
        got, want = _both(
            hooked,
            lambda: backend.get_dspark_swa_page_indices(
                seq_lens_casual=case.seq_lens_casual,
                req_pool_indices_repeated=case.req_pool_indices_repeated,
                out_loc=None,
                block_size=case.block_size,
            ),
        )
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), (cls.__name__, kind)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("kind", WINDOW_KINDS)
def test_request_window_metadata_equal_sglangs(hooked, cls, kind):
    rng = random.Random(f"backend-window-{cls.__name__}-{kind}")
    for _ in range(STEPS):
        case = window_case(rng, kind)
        n = case.pos.shape[0]
        window = SimpleNamespace(zero_row=case.zero_row, capacity=case.capacity)
        slots = int(case.req.max()) + 1
        pool = H.Pool(torch.zeros((slots, 8), dtype=torch.int32), None, [], 64)
        backend = _backend(cls, pool, _kv(None, request_window=window))
        extra = dict(num_groups=case.num_groups)
        if case.floor is not None:
            extra["swa_replay_start"] = case.floor[:n]
        # ROCm's backend lays out the live rows only (no prefill-graph padding argument).
        padded = max(case.padded_rows or n, n) if cls is DeepseekV4AttnBackend else n
        rep = torch.cat([case.req, case.req.new_zeros(padded - n)])
        casual = torch.cat([case.pos, case.pos.new_zeros(padded - n)]) + 1
        if padded > n:
            extra["request_window_live_rows"] = n
        kwargs = _core_kwargs(cls, pool, rep, casual.to(torch.int32), **extra)
        got, want = _both(hooked, lambda: backend.make_core_attn_metadata(**kwargs))
        _equal(got, want, (cls.__name__, kind))
        layout = got.request_window_layout
        assert type(layout).__name__ == "WindowLayout" and layout.size == want.request_window_layout.size
