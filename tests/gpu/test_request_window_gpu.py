"""Request-window layouts on the GPU (docs/semantics.md #request-window-layouts): every Triton backend's
kernel, compiled natively, equals the torch build on random calls and on an 8k-row prefill, in one launch
per call; the report line gives the kernel's time for that prefill (the kernel's programs scan the rows
before theirs, so its cost grows with the rows)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from swa_hal import RequestWindowRows, SWAConfig
from swa_hal.torch_backend.request_window import build_request_window

pytestmark = pytest.mark.gpu

from helpers import GPU_FORCED, gpu_builder  # noqa: E402
from test_request_window import random_rows  # noqa: E402


def config(window: int) -> SWAConfig:
    return SWAConfig(window_size=window, block_size=64, max_model_len=16384, max_num_batched_tokens=16, max_num_seqs=16)


def assert_equal(got, want, what: str) -> None:
    for name in (*want.FIELDS, "runs"):
        have, expected = getattr(got, name), getattr(want, name)
        if name == "size":
            assert have == expected, (what, name)
            continue
        have = have.cpu()
        assert have.dtype == expected.dtype and torch.equal(have, expected), (what, name)


@pytest.mark.parametrize("name", list(GPU_FORCED))
def test_kernel_equals_the_torch_build_on_the_gpu(name, report):
    rng = random.Random(f"request-window-gpu-{name}")
    for k in range(40):
        window = rng.choice((4, 8, 16, 128))
        rows = random_rows(rng, window)
        want = build_request_window(rows, window)
        got = gpu_builder(name, config(window)).build_request_window(rows.to("cuda"))
        assert_equal(got, want, f"{name} call {k}")
    report(f"{name}: 40 random request-window calls equal the torch build")


@pytest.mark.parametrize("name", list(GPU_FORCED))
def test_zero_rows_past_int32_reach_the_compiled_kernel(name, report):
    """zero_row is any int64 ring row: the compiled launch takes it as an int64 argument (an int32 argument
    made the launcher refuse any zero_row past int32 with an untyped OverflowError)."""
    rng = random.Random(f"request-window-zero-row-{name}")
    builder = gpu_builder(name, config(8))
    for zero_row in (2**31 - 1, 2**31, 2**40 + 3, 2**63 - 1):
        rows = dataclasses.replace(random_rows(rng, 8), zero_row=zero_row)
        assert_equal(builder.build_request_window(rows.to("cuda")), build_request_window(rows, 8), f"{zero_row}")
    report(f"{name}: zero_row up to 2^63 - 1 equals the torch build")


@pytest.mark.parametrize("name", list(GPU_FORCED))
def test_long_prefill_in_one_launch(name, report):
    n = 8192
    rows = RequestWindowRows(
        torch.full((n,), 3, dtype=torch.int64),
        torch.arange(100, 100 + n, dtype=torch.int64),
        zero_row=0,
        capacity=256,
        num_groups=4,
        padded_rows=n + 64,
    )
    want = build_request_window(rows, 128)
    builder = gpu_builder(name, config(128))
    dev = rows.to("cuda")
    assert_equal(builder.build_request_window(dev), want, f"{name} 8k prefill")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            builder.build_request_window(dev)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    ours = [e for e in kernels if "request_window" in e.name]
    assert len(ours) == len(kernels) == 20, [e.name for e in kernels]
    us = sorted(e.device_time for e in ours)[10]
    report(f"{name}: 8192-row request-window prefill in one launch, kernel {us:.1f} us (median of 20)")
