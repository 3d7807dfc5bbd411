"""The interpreter's address-strict mode (the SM12x rule on a CPU): it must catch what it claims to."""

from __future__ import annotations

import random

import pytest
import torch
import triton
import triton.language as tl

from helpers import make_builder
from swa_hal.testing import CONFORMANCE_CONFIGS, AddressViolation, address_strict, random_batch


@triton.jit
def copy_tail_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr, CLAMP: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    keep = offs < n
    if CLAMP:
        offs = tl.minimum(offs, n - 1)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=keep, other=0), mask=keep)


@triton.jit
def unmasked_overrun_kernel(src_ptr, dst_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs + 1))


def test_unclamped_masked_overrun_fails_naming_the_kernel_and_lanes():
    src, dst = torch.arange(5, dtype=torch.int32), torch.zeros(5, dtype=torch.int32)
    with address_strict(), pytest.raises(AddressViolation) as info:
        copy_tail_kernel[(1,)](src, dst, 5, BLOCK=8, CLAMP=False)
    msg = str(info.value)
    assert "kernel copy_tail_kernel" in msg and "program (0, 0, 0)" in msg
    assert "masked load" in msg and "3 of 8 lanes" in msg and "lane 5 " in msg and "masked off" in msg


def test_the_same_kernel_clamped_passes_and_is_correct():
    src, dst = torch.arange(5, dtype=torch.int32), torch.zeros(5, dtype=torch.int32)
    with address_strict():
        copy_tail_kernel[(1,)](src, dst, 5, BLOCK=8, CLAMP=True)
    assert dst.tolist() == [0, 1, 2, 3, 4]


def test_without_the_checker_the_overrun_goes_unnoticed():
    # Why the checker exists: the plain interpreter runs the unclamped kernel happily.
    src, dst = torch.arange(5, dtype=torch.int32), torch.zeros(5, dtype=torch.int32)
    copy_tail_kernel[(1,)](src, dst, 5, BLOCK=8, CLAMP=False)
    assert dst.tolist() == [0, 1, 2, 3, 4]


def test_an_active_out_of_bounds_lane_is_caught_too():
    src, dst = torch.arange(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    with address_strict(), pytest.raises(AddressViolation, match="lane 3 .* \\(active\\)"):
        unmasked_overrun_kernel[(1,)](src, dst, BLOCK=4)


def test_a_view_may_run_into_its_base_storage():
    base = torch.arange(8, dtype=torch.int32)
    view, dst = base[:5], torch.zeros(8, dtype=torch.int32)
    with address_strict():
        copy_tail_kernel[(1,)](view, dst, 5, BLOCK=8, CLAMP=False)  # lanes 5..7 stay inside `base`


def test_the_checker_is_removed_after_the_context():
    src, dst = torch.arange(5, dtype=torch.int32), torch.zeros(5, dtype=torch.int32)
    with address_strict():
        pass
    copy_tail_kernel[(1,)](src, dst, 5, BLOCK=8, CLAMP=False)


def test_the_unclamped_variant_of_the_real_kernel_breaks_the_rule():
    """The CLAMP flag matters: the same kernel without it fails the SM12x rule, with it passes."""
    config = CONFORMANCE_CONFIGS["v4"]
    batch = random_batch(config, random.Random(0), "mixed")
    with address_strict():
        with pytest.raises(AddressViolation, match="kernel swa_metadata_kernel"):
            make_builder(config, "cuda").build(batch)
        make_builder(config, "sm12x").build(batch)
