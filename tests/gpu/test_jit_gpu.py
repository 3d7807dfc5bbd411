"""On the GPU: after warmup() no build of any shape compiles, and the compiled launch gives the same
bytes as Triton's own launch path."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from typing import Any

import pytest
import torch

from swa_hal import PlatformInfo, SWAConfig, SWAMetadataBuilder
from swa_hal.kernels.launch import compile_options, record_fields
from swa_hal.kernels.rows_launch import RowsArgs
from swa_hal.kernels.swa_metadata import swa_metadata_kernel
from swa_hal.triton_backend import OWNED_ROWS_FIELDS, rows_record
from swa_hal.testing.batches import KINDS, random_batch
from swa_hal.testing.compare import compare_with_reference

from helpers import CONFIGS, GPU_FORCED

pytestmark = pytest.mark.gpu


def compiled_variants() -> int:
    return sum(len(cache[0]) for cache in swa_metadata_kernel.device_caches.values())


@pytest.mark.parametrize("name, assume", [("cuda", None), ("sm12x", "vendor=cuda,capability=12.0")])
def test_no_compilation_after_warmup(name, assume, report):
    config = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash_dspark.yaml")
    platform = PlatformInfo.from_assume(assume) if assume else None
    builder = SWAMetadataBuilder(config, device="cuda", backend=name, platform=platform)
    variants = builder.warmup()
    after_warmup = compiled_variants()
    rng = random.Random(name)
    shapes = 0
    for kind in KINDS:
        for _ in range(12):
            batch = random_batch(config, rng, kind, max_context=65536, device="cuda")
            if rng.random() < 0.5:  # engine tensors as offset views: no alignment specialisation either
                wide = torch.zeros(batch.seq_lens.shape[0] + 1, dtype=torch.int32, device="cuda")
                wide[1:] = batch.seq_lens
                batch = batch.replace(seq_lens=wide[1:])
            md = builder.build(batch)
            if md.causal and md.num_decode_tokens:
                builder.update_draft_decode_metadata(md)
            assert not compare_with_reference(config, batch, md) or not md.causal
            shapes += 1
    # Triton's own launch path (not the compiled launch) with odd sizes must hit the cache too.
    for key in builder.backend._rows.warmup_keys(builder.backend.guard):  # the rows kernel's variants
        for tokens in (1, 3, 17, 1000):
            swa_metadata_kernel[(4,)](*_dummy_args(tokens, key), **compile_options(), **key.constexprs())
    torch.cuda.synchronize()
    assert compiled_variants() == after_warmup, "a build compiled a new kernel variant after warmup()"
    report(f"{name}: warmup prepared {variants} variants; {shapes} builds of random shapes (+ draft updates, "
           f"offset views) and direct Triton launches compiled nothing more ({compiled_variants()} cached)")


def _dummy_args(tokens, key):
    i32: dict[str, Any] = dict(dtype=torch.int32, device="cuda")
    lens = torch.zeros(tokens + 1, **i32)
    table = torch.arange(0, tokens + 7, **i32)[None, :]
    slots = torch.arange(tokens, dtype=torch.int64, device="cuda")
    groups = torch.tensor([[table.data_ptr(), slots.data_ptr(), table.stride(0), table.shape[1]]],
                          dtype=torch.int64, device="cuda")
    args = RowsArgs(
        decode_idx_ptr=torch.empty((tokens, 1, key.DECODE_WIDTH), **i32), decode_lens_ptr=lens,
        prefill_idx_ptr=torch.empty((tokens, 1, key.PREFILL_WIDTH), **i32), prefill_lens_ptr=lens,
        token_to_req_ptr=torch.zeros(tokens, **i32), is_valid_ptr=torch.zeros(tokens, dtype=torch.bool, device="cuda"),
        gather_lens_ptr=lens, left_ptr=lens, right_ptr=lens, violation_ptr=torch.zeros(5, **i32),
        qsl_ptr=torch.tensor([0, tokens], **i32), seq_lens_ptr=torch.tensor([tokens], **i32),
        host_seq_ptr=torch.tensor([tokens], **i32), block_table_ptr=table,
        slot_mapping_ptr=slots, replay_ptr=torch.zeros(1, **i32), span_indptr_ptr=torch.zeros(2, **i32),
        span_starts_ptr=lens, span_ends_ptr=lens, group_inputs_ptr=groups,
        bt_stride=table.stride(0), max_pages=table.shape[1], num_reqs=1, num_tokens=tokens, num_decodes=1,
        num_prefills=0, num_decode_tokens=tokens, num_prefill_tokens=0, decode_clear_end=tokens, dec_progs=1,
        pre_progs=0, clear_progs=0, search_chunks=1, num_groups=1, group_rows=tokens, decode_guess_len=1,
        prefill_guess_len=1, num_spans=0, max_query_len=tokens, decode_query_max=tokens, max_model_len=1 << 20,
        build_checks=1, num_bounds=1, prefill_follows=0,
    )
    return [getattr(args, name) for name in record_fields(RowsArgs)]


def test_compiled_launch_equals_triton_launch_path(report):
    """The compiled launch (the C launch function with addresses) writes what Triton's own launch path
    writes for the same record, with the builder's buffers given as tensors."""
    config = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash.yaml")
    builder = SWAMetadataBuilder(config, device="cuda")
    rng = random.Random(3)
    batch = random_batch(config, rng, "mixed", device="cuda")
    md = builder.build(batch)  # the compiled launch
    torch.cuda.synchronize()
    first = [t.clone() for t in (md.decode_swa_indices, md.decode_swa_lens, md.prefill_swa_indices, md.prefill_swa_lens)]
    assert not compare_with_reference(config, batch, md)
    for t in (builder.buffers.decode_indices, builder.buffers.prefill_indices):
        t.fill_(-5)
    backend = builder.backend
    plan, _ = builder._plan(batch.inputs, batch.inputs.num_reqs, 1)
    key = backend.kernel_key(plan.inputs.causal)
    args = backend.rows_args(key, plan, batch.block_table, batch.slot_mapping, builder.buffers, 1)
    tensors = rows_record(builder.buffers, plan.inputs.causal, lambda t: t)
    for name in record_fields(RowsArgs):
        if name not in OWNED_ROWS_FIELDS and name != "group_rows":
            setattr(tensors, name, getattr(args, name))
    # The engine's tensors, where the compiled record holds their addresses.
    tensors.qsl_ptr, tensors.seq_lens_ptr = batch.query_start_loc, batch.seq_lens
    tensors.host_seq_ptr = batch.seq_lens if plan.host_seq_lens is None else plan.host_seq_lens
    tensors.block_table_ptr, tensors.slot_mapping_ptr = batch.block_table, batch.slot_mapping
    tensors.replay_ptr = plan.replay_start
    tensors.span_indptr_ptr = builder.buffers.no_span_indptr
    tensors.span_starts_ptr, tensors.span_ends_ptr = builder.buffers.span_starts, builder.buffers.span_ends
    values = [getattr(tensors, name) for name in record_fields(RowsArgs)]
    swa_metadata_kernel[(args.programs(),)](*values, **compile_options(), **key.constexprs())
    torch.cuda.synchronize()
    second = [md.decode_swa_indices, md.decode_swa_lens, md.prefill_swa_indices, md.prefill_swa_lens]
    assert all(b is not None and torch.equal(a, b) for a, b in zip(first, second))
    report("the compiled launch and Triton's launch path wrote identical outputs")


def test_launch_hooks_are_called_and_builds_stay_exact(report):
    """With a profiler's launch hooks installed (proton installs some), compiled launches go through the
    compiled kernel's own runner, which calls them, and still hand it addresses."""
    import triton

    config = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash.yaml")
    builder = SWAMetadataBuilder(config, device="cuda")
    builder.warmup()
    rng = random.Random(4)
    seen = []

    def hook(metadata):
        seen.append(metadata.get()["name"])

    chain = triton.knobs.runtime.launch_enter_hook
    chain.add(hook)
    try:
        for kind in ("decode", "mixed", "prefill"):
            batch = random_batch(config, rng, kind, device="cuda")
            md = builder.build(batch)
            torch.cuda.synchronize()
            assert not compare_with_reference(config, batch, md), kind
    finally:
        chain.remove(hook)
    assert seen.count("swa_metadata_kernel") == 3, seen
    report(f"with a launch hook installed: 3 builds bit-exact, the hook saw {len(seen)} launches")


def test_compiled_launches_take_the_fast_path(report):
    """Every kernel variant a warmed builder compiled is launched through Triton's C launch function
    directly (kernels/launch.py, docs/kernels.md #triton-versions), on the Triton installed here: 3.6's
    spread layout and 3.8's tuple layout are both recognised, so an unrecognised one fails here."""
    import triton

    from swa_hal.kernels.launch import launcher_layout

    config = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash_dspark.yaml")
    builder = SWAMetadataBuilder(config, device="cuda", backend="cuda")
    builder.warmup()
    batch = random_batch(config, random.Random(7), "mixed", max_context=4096, device="cuda")
    md = builder.build(batch)
    assert not compare_with_reference(config, batch, md)
    launches = [builder.backend._rows, builder.backend._slot_rows, builder.backend._request_window]
    direct = {key: flag for launch in launches for key, flag in launch.direct.items()}
    assert direct and all(direct.values()), f"triton {triton.__version__}: {direct}"
    report(f"triton {triton.__version__}: layout {launcher_layout()!r}; {len(direct)} compiled variants, all direct")


# Run in a fresh process: Triton warns once per process, and only where a kernel is compiled.
_WARMUP_WARNINGS = """
import json, sys, warnings
from swa_hal import PlatformInfo, SWAConfig, SWAMetadataBuilder
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for name, assume in json.loads(sys.argv[2]).items():
        platform = PlatformInfo.from_assume(assume) if assume else None
        SWAMetadataBuilder(SWAConfig.from_yaml(sys.argv[1]), device="cuda", backend=name, platform=platform).warmup()
for w in seen:
    if "/triton/" in w.filename:
        print(f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}")
"""


def test_compiles_raise_no_triton_warning(report, tmp_path):
    """Every variant of every Triton backend compiled by warmup() in a fresh process with an empty Triton
    cache and TRITON_DEFAULT_FP_FUSION unset: Triton warns about nothing (triton 3.9 warns at a compile that
    leaves FP fusion to its default; swa_hal's compiles pass it, kernels/launch.py compile_options)."""
    import json

    import triton

    env = {k: v for k, v in os.environ.items() if k != "TRITON_DEFAULT_FP_FUSION"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    config = str(CONFIGS / "deepseek_v4_flash_dspark.yaml")
    out = subprocess.run([sys.executable, "-c", _WARMUP_WARNINGS, config, json.dumps(GPU_FORCED)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", out.stdout
    report(f"triton {triton.__version__}: warmup() of every Triton backend, fresh process and cache: no warning")
