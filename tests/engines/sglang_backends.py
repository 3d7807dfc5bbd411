"""SGLang 0.5.23's DeepSeek-V4 attention backend classes for the engine tests that call their metadata methods:
an instance made without its constructor (which needs a model runner and a GPU) and carrying the attributes
those methods read, a stand-in for its KV pool, and the comparison of what a call gives with swa_hal's hooks
and with SGLang's own functions put back, field by field.

Imported only after conftest.py set TRITON_INTERPRET=1 and CUDA_VISIBLE_DEVICES="".
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool

from swa_hal.integrations import sglang as integ


def backend(cls: type, pool: Any, kv: Any, **extra: Any) -> Any:
    """An instance of SGLang's backend class with the attributes its metadata methods read."""
    made = object.__new__(cls)
    made.__dict__.update(
        page_size=pool.page_size,
        req_to_token=pool.req_to_token,
        token_to_kv_pool=kv,
        cuda_int32_kwargs=dict(device="cpu", dtype=torch.int32),
        index_topk=512,
        present_ratios=(),
        low_ratios=(),
        encoder_replay=False,
        encoder_row_floor=None,
        trtllm_attn=False,
        **extra,
    )
    return made


def kv_pool(pool: Any = None, **extra: Any) -> SimpleNamespace:
    """The attributes of SGLang's DeepSeek-V4 KV pool the backends read."""
    fields = dict(
        full_to_swa_index_mapping=None if pool is None else pool.full_to_swa,
        swa_req_ring_size=None,
        swa_valid_from=None,
        request_window=None,
        unified_swa_pages=0,
    )
    fields.update(extra)
    kv = SimpleNamespace(**fields)
    # SGLang's own translation of full-pool slots to SWA slots (ROCm's causal gather and the tail's writes call it).
    kv.translate_loc_from_full_to_swa = lambda loc: DeepSeekV4TokenToKVPool.translate_loc_from_full_to_swa(kv, loc)
    return kv


_MISSING = object()


def _fields(value: Any) -> list[str] | None:
    """The field names of one of SGLang's records (a dataclass, a msgspec struct, a namespace), else None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [f.name for f in dataclasses.fields(value)]
    if hasattr(value, "__struct_fields__"):
        return list(value.__struct_fields__)
    if isinstance(value, SimpleNamespace):
        return list(vars(value))
    return None


def assert_same(got: Any, want: Any, what: Any) -> None:
    """``got`` is ``want`` field by field, all the way down: tensors equal in dtype, shape and every value,
    records of the same type with every field the same (one unset on both sides is the same), the rest equal."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), (what, type(got))
        assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
        assert torch.equal(got, want), (what, got, want)
        return
    names = _fields(want)
    if names is not None:
        assert type(got) is type(want), (what, type(got), type(want))
        for name in sorted(set(names) | set(_fields(got) or ())):
            assert_same(getattr(got, name, _MISSING), getattr(want, name, _MISSING), (what, name))
        return
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), (what, got, want)
        for key in want:
            assert_same(got[key], want[key], (what, key))
        return
    if isinstance(want, list | tuple):
        assert type(got) is type(want) and len(got) == len(want), (what, got, want)
        for i, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, (what, i))
        return
    assert got == want, (what, got, want)


def both(hooked: Any, call: Any) -> tuple[Any, Any]:
    """``call()`` with swa_hal's hooks, then with SGLang's own functions (``hooked.originals``); the first asks
    swa_hal for its rows (every hook takes its adapter through ``adapter_for``), the second never does."""
    real = integ.adapter_for
    asked = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        asked.append(1)
        return real(*args, **kwargs)

    integ.adapter_for = counted
    try:
        got = call()
        served = len(asked)
        with hooked.originals.sglang_own():
            want = call()
    finally:
        integ.adapter_for = real
    assert served >= 1 and len(asked) == served, (served, len(asked))
    return got, want
