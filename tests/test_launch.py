"""Compile keys: every launch a build makes uses a key that warmup() prepares, and nothing a build
passes can specialise the kernel (so warmed kernels are all a builder ever needs; the GPU suite
counts real compilations in tests/gpu/test_jit_gpu.py)."""

from __future__ import annotations

import dataclasses
import inspect
import random

import pytest

from helpers import make_builder
from swa_hal import jit
from swa_hal.kernels import ragged, swa_metadata
from swa_hal.kernels.launcher import KernelLauncher
from swa_hal.testing import CONFORMANCE_CONFIGS, KINDS, random_batch


def params(kernel):
    fn = getattr(kernel, "fn", kernel)
    return inspect.signature(fn).parameters


def option(kernel, name):
    value = getattr(kernel, name, None)
    return value if value is not None else getattr(kernel, "kwargs", {}).get(name, [])


@pytest.mark.parametrize("kernel, key_type", [(swa_metadata.swa_metadata_kernel, jit.RowsKey),
                                              (ragged.ragged_rows_kernel, jit.RaggedKey),
                                              (ragged.ragged_indptr_kernel, jit.IndptrKey)])
def test_key_fields_are_the_kernel_constexprs_in_order(kernel, key_type):
    constexprs = [n for n, p in params(kernel).items() if "constexpr" in str(p.annotation)]
    assert [f.name for f in dataclasses.fields(key_type)] == constexprs
    # The fast launcher appends constexpr values after the runtime args: they must come last.
    names = list(params(kernel))
    assert names[-len(constexprs):] == constexprs


def test_runtime_ints_never_specialise_and_engine_tensors_never_assume_alignment():
    kernel = swa_metadata.swa_metadata_kernel
    runtime = [n for n, p in params(kernel).items() if "constexpr" not in str(p.annotation) and not n.endswith("_ptr")]
    assert sorted(option(kernel, "do_not_specialize")) == sorted(runtime)
    inputs = ["qsl_ptr", "seq_lens_ptr", "block_table_ptr", "slot_mapping_ptr", "replay_ptr",
              "span_indptr_ptr", "span_starts_ptr", "span_ends_ptr"]
    assert sorted(option(kernel, "do_not_specialize_on_alignment")) == sorted(inputs)


@pytest.mark.parametrize("config_name", ["w4b4_mtp", "v4", "w7b3_dspark"])
def test_every_key_a_build_launches_is_warmed(config_name, monkeypatch):
    config = CONFORMANCE_CONFIGS[config_name]
    used = set()
    real = KernelLauncher.__call__

    def spy(self, key, grid, args, **kwargs):
        used.add(key)
        return real(self, key, grid, args, **kwargs)

    monkeypatch.setattr(KernelLauncher, "__call__", spy)
    for backend in ("cuda", "sm12x", "rocm"):
        builder = make_builder(config, backend)
        builder.warmup()
        warmed = set(used)
        used.clear()
        rng = random.Random(f"{backend}-{config_name}")
        for kind in KINDS:
            if kind == "dspark" and not config.is_dspark:
                continue
            for _ in range(2):
                md = builder.build(random_batch(config, rng, kind))
                if md.causal and md.num_decode_tokens:
                    builder.update_draft_decode_metadata(md)
        assert used <= warmed, f"{backend}: launched keys that warmup() never prepared: {used - warmed}"
        used.clear()


def test_keys_depend_on_the_config_only():
    config = CONFORMANCE_CONFIGS["v4"]
    a = jit.rows_keys(config, clamp=False, device_type="cuda")
    b = jit.rows_keys(dataclasses.replace(config, max_num_batched_tokens=64, max_model_len=999), clamp=False,
                      device_type="cuda")
    assert a == b and len(a) == 1  # one causal variant serves builds and draft-step updates
    # The owner search compares up to max_num_seqs requests per step (capped at 512).
    few = jit.rows_key(dataclasses.replace(config, max_num_seqs=3), causal=True, clamp=False,
                       device_type="cuda")
    many = jit.rows_key(dataclasses.replace(config, max_num_seqs=5000), causal=True, clamp=False,
                        device_type="cuda")
    assert (few.SEARCH_BLOCK, many.SEARCH_BLOCK) == (16, 512)
    assert len(jit.rows_keys(CONFORMANCE_CONFIGS["v4_dspark"], clamp=True, device_type="cuda")) == 2
