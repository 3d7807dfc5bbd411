"""Warmup covers every kernel the engines call: on each Triton backend (under the interpreter) the calls an
engine makes (a build, a DSpark build, a group build, a draft-step update, SGLang's token-slot rows paged and
over its ring, request-window layouts) launch only compile keys that ``warmup()`` prepared, and ``warmup()``
counts what it prepares."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from helpers import TRITON_BACKENDS, make_builder

from swa_hal import RequestWindowRows, SWAConfig
from swa_hal.integrations.sglang import SGLangSWAIndices
from swa_hal.kernels import slot_rows_launch
from swa_hal.kernels.launch import TritonLaunch
from swa_hal.testing.batches import random_batch
from swa_hal.testing.fixtures import CONFORMANCE_CONFIGS
from swa_hal.testing.groups import other_groups

# DSpark with two KV-cache groups: every kind of build the rows kernel has.
BASE = CONFORMANCE_CONFIGS["w7b3_dspark"]
CONFIG = SWAConfig(**{**BASE.to_dict(), "num_kv_groups": 2, "compress_ratios": BASE.compress_ratios})
I32, I64 = torch.int32, torch.int64


@contextmanager
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[set, set]]:
    """(compiled, launched): the (launch class, key) pairs compiled and launched while inside."""
    compiled: set = set()
    launched: set = set()
    compile, call = TritonLaunch.compile, TritonLaunch.__call__

    def compile_recorded(self, key):
        compiled.add((type(self).__name__, key))
        compile(self, key)

    def call_recorded(self, key, grid, args):
        launched.add((type(self).__name__, key))
        call(self, key, grid, args)

    with monkeypatch.context() as patch:
        patch.setattr(TritonLaunch, "compile", compile_recorded)
        patch.setattr(TritonLaunch, "__call__", call_recorded)
        yield compiled, launched


def engine_calls(builder) -> None:
    """One of each call an engine makes, inputs in the engine's dtypes."""
    config = builder.config
    rng = random.Random(7)
    for kind in ("mixed", "dspark"):
        builder.build(random_batch(config, rng, kind, max_tokens=12))
    batch = random_batch(config, rng, "decode", max_tokens=6)
    builder.update_draft_decode_metadata(builder.build(batch))
    tables, slots = other_groups(config, batch, 2, rng)
    builder.update_draft_decode_metadata(builder.build_groups(batch, tables, slots))

    # SGLang's token-slot rows, made by its adapter from its op's arguments.
    window, block = config.window_size, config.num_speculative_tokens
    sglang = SGLangSWAIndices(window)
    pools, positions = 3, 40
    req_to_token = torch.arange(pools * positions, dtype=I32).reshape(pools, positions)
    full_to_swa = torch.arange(pools * positions, dtype=I64)
    n = 2 * block
    ends = torch.tensor([20 + i for i in range(n)], dtype=I32)
    pool_rows = torch.tensor([1] * block + [2] * block, dtype=I64)
    paged = dict(req_to_token=req_to_token, full_to_swa=full_to_swa)
    for floors in (None, torch.full((n,), 15, dtype=I32), torch.full((n,), 15, dtype=I64)):
        rows = sglang.causal_rows(
            **paged, seq_lens_casual=ends, req_pool_indices_repeated=pool_rows, swa_replay_start=floors
        )
        builder.build_slot_rows(rows)
    ring_size = -(-(window + block) // config.block_size) * config.block_size  # SGLang's draft ring
    for valid_from in (None, torch.zeros(pools, dtype=I64)):
        out_loc = torch.arange(n, dtype=I64)
        common = dict(
            seq_lens_casual=ends, req_pool_indices_repeated=pool_rows, block_size=block, valid_from=valid_from
        )
        builder.build_slot_rows(sglang.dspark_rows(**paged, **common, out_loc=out_loc))
        builder.build_slot_rows(sglang.dspark_ring_rows(**common, ring_size=ring_size, num_slots=pools))

    # Request-window layouts: with and without floors, int32 and int64 inputs.
    for dtype in (I32, I64):
        req = torch.tensor([0, 0, 1], dtype=dtype)
        pos = torch.tensor([5, 6, 9], dtype=dtype)
        for floors in (None, torch.tensor([1, 1, 0], dtype=dtype)):
            builder.build_request_window(RequestWindowRows(req, pos, zero_row=0, capacity=16, floors=floors))


def uncovered(backend: str, monkeypatch: pytest.MonkeyPatch) -> set:
    builder = make_builder(CONFIG, backend)
    with recorded(monkeypatch) as (compiled, _):
        count = builder.warmup()
    assert count == len(compiled), "warmup() counts what it compiles"
    assert {key for _, key in compiled} >= set(builder.backend.kernel_keys())
    with recorded(monkeypatch) as (_, launched):
        engine_calls(builder)
    kernels = {name for name, _ in launched}
    assert {type(launch).__name__ for launch in builder.backend.launches()} <= kernels, "a kernel went uncalled"
    return launched - compiled


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_warmup_covers_every_key_the_engines_launch(backend, monkeypatch):
    assert uncovered(backend, monkeypatch) == set()


def test_a_missing_warmup_key_is_found(monkeypatch):
    """The check above can fail: without the causal rows' int64 floors, their call is found uncovered."""
    facts = slot_rows_launch.slot_rows_facts

    def fewer(config, guard):
        return [f for f in facts(config, guard) if not (f[1] == 0 and f[6][2] is I64)]

    monkeypatch.setattr(slot_rows_launch, "slot_rows_facts", fewer)
    missing = uncovered("cuda", monkeypatch)
    assert [(name, key.HAS_FLOORS, key.dtypes[2]) for name, key in missing] == [("SlotRowsLaunch", True, I64)]


def test_the_launch_owns_its_memo():
    """A key is computed once per call's facts and then found in the launch's memo (the host path reads it)."""
    backend = make_builder(CONFIG, "cuda").backend
    for launch in backend.launches():
        keys = launch.warmup_keys(backend.guard)
        assert keys and all(key in launch.keys.values() for key in keys)
        for facts, key in launch.keys.items():
            assert launch.key_for(facts) is key and launch.dispatch(facts) == key
    assert backend.kernel_key() is backend._rows.keys[(True, backend.guard, False)]
