"""Launch contracts (swa_hal/kernels/launch.py): each kernel's compile key and argument record are its
signature in order, every launch a build makes uses a key that warmup() prepares, and nothing a build
passes can specialise the kernel (so warmed kernels are all a builder ever needs; the GPU suite
counts real compilations in tests/gpu/test_jit_gpu.py)."""

from __future__ import annotations

import dataclasses
import inspect
import random

import pytest
import torch

from helpers import make_builder, rotated
from swa_hal.kernels import (
    ragged,
    ragged_launch,
    request_window,
    request_window_launch,
    rows_launch,
    slot_rows,
    slot_rows_launch,
    swa_metadata,
)
from swa_hal.kernels.launch import CompileKey, DtypesKey, TritonLaunch, record_fields
from swa_hal.testing import CONFORMANCE_CONFIGS, KINDS, random_batch


def params(kernel):
    fn = getattr(kernel, "fn", kernel)
    return inspect.signature(fn).parameters


def option(kernel, name):
    value = getattr(kernel, name, None)
    return value if value is not None else getattr(kernel, "kwargs", {}).get(name, [])


CONTRACTS = [
    (swa_metadata.swa_metadata_kernel, rows_launch.RowsKey, rows_launch.RowsLaunch),
    (slot_rows.slot_rows_kernel, slot_rows_launch.SlotRowsKey, slot_rows_launch.SlotRowsLaunch),
    (ragged.ragged_rows_kernel, ragged_launch.RaggedKey, ragged_launch.RaggedLaunch),
    (ragged.ragged_indptr_kernel, ragged_launch.IndptrKey, ragged_launch.IndptrLaunch),
    (
        request_window.request_window_kernel,
        request_window_launch.RequestWindowKey,
        request_window_launch.RequestWindowLaunch,
    ),
]


@pytest.mark.parametrize("kernel, key_type, launch", CONTRACTS)
def test_key_and_record_are_the_kernel_signature_in_order(kernel, key_type, launch):
    names = list(params(kernel))
    constexprs = [n for n, p in params(kernel).items() if "constexpr" in str(p.annotation)]
    assert [f.name for f in dataclasses.fields(key_type) if f.name != "dtypes"] == constexprs
    # The fast launch appends constexpr values after the runtime args: they must come last.
    assert names[-len(constexprs):] == constexprs
    # The record is every other parameter, in order; its pointer fields are the kernel's *_ptr ones.
    fields = record_fields(launch.Args)
    assert list(fields) == names[: -len(constexprs)]
    assert sorted(launch.POINTERS) == sorted(n for n in fields if n.endswith("_ptr"))
    assert set(launch.ENGINE) <= set(launch.POINTERS)


@pytest.mark.parametrize("kernel, key_type, launch", CONTRACTS)
def test_keys_compare_by_value_and_hash_once(kernel, key_type, launch):
    fields = [f.name for f in dataclasses.fields(key_type)]
    values = {name: i for i, name in enumerate(fields)}
    if issubclass(key_type, DtypesKey):
        values["dtypes"] = (torch.int32, torch.int64)
    key, same = key_type(**values), key_type(**values)
    assert key is not same and key == same and hash(key) == hash(same) and len({key, same}) == 1
    for name in fields:
        other = dataclasses.replace(key, **{name: (torch.int64,) if name == "dtypes" else -1})
        assert other != key and other not in {key} and not other == key
    assert key != tuple(values.values())  # only a key of its own class equals a key
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(key, fields[0], 0)
    # CompileKey's: the hash computed once per key (a key declared with eq=True hashes its fields per lookup).
    assert key_type.__hash__ is CompileKey.__hash__ and key_type.__eq__ is CompileKey.__eq__
    if issubclass(key_type, DtypesKey):
        assert "dtypes" not in key.constexprs()
        first, second = key_type.INPUTS[:2]
        assert key.pointer_dtypes() == {first: torch.int32, second: torch.int64}
        assert set(key_type.INPUTS) <= set(launch.ENGINE)
    else:
        assert key.pointer_dtypes() == {}


@pytest.mark.parametrize("kernel, key_type, launch", CONTRACTS)
def test_runtime_ints_never_specialise_and_engine_tensors_never_assume_alignment(kernel, key_type, launch):
    runtime = [n for n in record_fields(launch.Args) if n not in launch.POINTERS]
    assert sorted(option(kernel, "do_not_specialize")) == sorted(runtime)
    assert sorted(option(kernel, "do_not_specialize_on_alignment")) == sorted(launch.ENGINE)
    if launch is rows_launch.RowsLaunch:
        # host_seq_ptr: the builder's copy of the host seq_lens, or seq_lens itself where a build holds none.
        inputs = ["qsl_ptr", "seq_lens_ptr", "host_seq_ptr", "block_table_ptr", "slot_mapping_ptr", "replay_ptr",
                  "span_indptr_ptr", "span_starts_ptr", "span_ends_ptr"]
        assert sorted(launch.ENGINE) == sorted(inputs)


def test_a_build_sets_every_per_build_field_of_the_record():
    """The rows record is kept per row kind and refilled by name: every field that is not the builder's
    own buffer must be set by rows_args on every build (a stale value would launch silently)."""
    from swa_hal.triton_backend import OWNED_ROWS_FIELDS

    config = CONFORMANCE_CONFIGS["v4"]
    builder = make_builder(config, "cuda")
    batch = random_batch(config, random.Random(5), "mixed")
    plan, _ = builder._plan(batch.inputs, batch.inputs.num_reqs, 1)
    backend = builder.backend
    record = backend._records[True]
    poison = object()
    for name in record_fields(rows_launch.RowsArgs):
        if name not in OWNED_ROWS_FIELDS and name != "group_rows":
            setattr(record, name, poison)
    args = backend.rows_args(backend.kernel_key(), plan, batch.block_table, batch.slot_mapping,
                             builder.buffers, 1)
    assert args is record
    assert [n for n in record_fields(rows_launch.RowsArgs) if getattr(args, n) is poison] == []


def test_contracts_import_without_triton():
    """Compile keys and records are plain Python: a tool (or a CI job without Triton) can list them."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['triton'] = None\n"
            "from swa_hal.kernels import rows_launch, slot_rows_launch, ragged_launch\n"
            "from swa_hal.testing import CONFORMANCE_CONFIGS\n"
            "print(len(rows_launch.rows_keys(CONFORMANCE_CONFIGS['v4_dspark'], clamp=True, device_type='cuda')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2"


@pytest.mark.parametrize("config_name, backend", rotated(["w4b4_mtp", "v4", "w7b3_dspark"], ("cuda", "sm12x", "rocm")))
def test_every_key_a_build_launches_is_warmed(config_name, backend, monkeypatch):
    config = CONFORMANCE_CONFIGS[config_name]
    used = set()
    real = TritonLaunch.__call__

    def spy(self, key, grid, args, **kwargs):
        used.add(key)
        return real(self, key, grid, args, **kwargs)

    monkeypatch.setattr(TritonLaunch, "__call__", spy)
    builder = make_builder(config, backend)
    builder.warmup()
    launches = [builder.backend._rows, *(launch for r in getattr(builder.backend, "_ragged", ())
                                         for launch in (r._scan, r._scatter))]
    warmed = set().union(*(launch.prepared for launch in launches))
    assert not used, "warmup() compiles through Triton's warmup API: it launches nothing"
    rng = random.Random(f"{backend}-{config_name}")
    for kind in KINDS:
        if kind == "dspark" and not config.is_dspark:
            continue
        for _ in range(2):
            md = builder.build(random_batch(config, rng, kind))
            if md.causal and md.num_decode_tokens:
                builder.update_draft_decode_metadata(md)
    assert used <= warmed, f"{backend}: launched keys that warmup() never prepared: {used - warmed}"


def test_keys_depend_on_the_config_only():
    config = CONFORMANCE_CONFIGS["v4"]
    a = rows_launch.rows_keys(config, clamp=False, device_type="cuda")
    b = rows_launch.rows_keys(dataclasses.replace(config, max_num_batched_tokens=64, max_model_len=999), clamp=False,
                      device_type="cuda")
    assert a == b and len(a) == 1  # one causal variant serves builds and draft-step updates
    # The owner search compares up to max_num_seqs requests per step (capped at 512).
    few = rows_launch.rows_key(dataclasses.replace(config, max_num_seqs=3), causal=True, clamp=False,
                       device_type="cuda")
    many = rows_launch.rows_key(dataclasses.replace(config, max_num_seqs=5000), causal=True, clamp=False,
                        device_type="cuda")
    assert (few.SEARCH_BLOCK, many.SEARCH_BLOCK) == (16, 512)
    assert len(rows_launch.rows_keys(CONFORMANCE_CONFIGS["v4_dspark"], clamp=True, device_type="cuda")) == 2


def _jit_functions():
    """Every ``@triton.jit`` function of swa_hal's kernels: (file, name, parameters, lines)."""
    import ast
    from pathlib import Path

    import swa_hal.kernels

    for path in sorted(Path(swa_hal.kernels.__file__).parent.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
                yield path.name, node.name, len(node.args.args), node.end_lineno - node.lineno + 1


def test_no_triton_helper_takes_over_25_parameters_or_150_lines():
    """docs/kernels.md #reading-a-kernel: a kernel's helpers are pieces a reader can hold; the kernels
    themselves (``*_kernel``, the launch contract's argument lists) are exempt from the parameter count."""
    found = list(_jit_functions())
    helpers = [(f, n, p, lines) for f, n, p, lines in found if not n.endswith("_kernel")]
    assert len(helpers) >= 20, found  # the scan sees the helpers
    assert [h for h in helpers if h[2] > 25 or h[3] > 150] == []
    assert [k for k in found if k[1].endswith("_kernel") and k[3] > 200] == []
