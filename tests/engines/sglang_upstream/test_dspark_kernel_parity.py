# Copied from SGLang (https://github.com/sgl-project/sglang), file
# test/registered/spec/dspark/test_dspark_kernel_parity.py at commit 038ac07573d5fbc250ff629969815cda5a160dd3.
# Copyright the SGLang authors. Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License. You may obtain a copy of the License at
# http://www.apache.org/licenses/LICENSE-2.0 (the repository's LICENSE file holds it).
#
# Changes from the upstream file, nothing else (no assertion edited):
# - only the cases of the ops swa_hal replaces are copied (``_CASES`` lists those two): the causal SWA rows
#   (``BuildCausalSwaPageIndices``) and the DSpark block rows of the paged pool (``ComputeDsparkWindowGather``
#   then ``BuildDsparkSwaPageIndices``, what ``DeepseekV4AttnBackend.get_dspark_swa_page_indices`` runs); the
#   file's other twenty cases test DSpark's accept, sampling, verify-window and draft-model kernels, which swa_hal
#   does not replace, and the imports only they use are left out;
# - the imports name SGLang 0.5.23's modules, where these moved unchanged: ``sglang.kernels.ops.attention.
#   dsv4_attn_metadata_kernels`` is ``sglang.kernels.ops.attention.dsv4.attn_metadata_kernels`` there, and
#   ``sglang.srt.speculative.dspark_components.kernels.dspark_attn_metadata`` is
#   ``sglang.kernels.ops.speculative.dspark.dspark_attn_metadata``;
# - ``DEVICE`` is the CPU, not ``cuda``: the Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``).
#
# Which tests exercise swa_hal: none. Each case calls SGLang's ``.torch`` and ``.triton`` implementations
# directly, never the ``execute`` entry point swa_hal's hook replaces, so both runs of ``make test-sglang`` run
# SGLang's own kernels here: the copy shows that SGLang's own parity of these ops holds in this environment.
# tests/engines/test_sglang.py compares the hooked entry points with these implementations.
"""Seeded triton-vs-torch parity sweep for the DSpark kernels.

Guards against toolchain drift (triton/torch upgrades) silently diverging
the triton implementations from their torch references. Every method calls
the production kernel pair directly via `Cls.torch(...)` / `Cls.triton(...)`
(no env-var dispatch) on a small set of adversarial inputs and compares
exactly, or with the tolerance the kernel is specified to meet.
"""

import unittest

import torch

from sglang.kernels.ops.attention.dsv4 import attn_metadata_kernels
from sglang.kernels.ops.speculative.dspark import dspark_attn_metadata
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.test_utils import CustomTestCase

register_cuda_ci(est_time=30, stage="base-b", runner_config="1-gpu-small")

DEVICE = torch.device("cpu")
VOCAB = 129280


def _ri(lo, hi, shape, dtype=torch.int64, g=None):
    return torch.randint(lo, hi, shape, device=DEVICE, dtype=dtype, generator=g)


def _case_causal_swa_page_indices(tc):
    swa, num_pool, pool_len, num_q = 128, 64, 600, 40
    g = torch.Generator(device=DEVICE).manual_seed(7)
    kw = dict(
        req_to_token=_ri(0, 40000, (num_pool, pool_len), torch.int32, g),
        full_to_swa_mapping=_ri(0, 1 << 20, (40000,), torch.int64, g),
        req_pool_indices_repeated=_ri(0, num_pool, (num_q,), torch.int32, g),
        swa_window=swa,
        page_index_aligned_size=96,
    )
    # Lens short of / straddling / beyond the SWA window boundary.
    for lo, hi in ((1, swa), (swa - 4, swa + 4), (swa + 1, pool_len)):
        lens = _ri(lo, hi, (num_q,), torch.int32, g)
        cls = attn_metadata_kernels.BuildCausalSwaPageIndices
        ref = cls.torch(seq_lens_casual=lens, **kw)
        got = cls.triton(seq_lens_casual=lens, **kw)
        tc.assertEqual(got.shape, ref.shape)
        tc.assertEqual(got.dtype, ref.dtype)
        # Parity holds on the attended region; padding slots must be -1.
        col = torch.arange(ref.shape[1], device=DEVICE).view(1, -1)
        attended = col < torch.clamp(lens, max=swa).view(-1, 1)
        tc.assertTrue(torch.equal(got[attended], ref[attended]))
        tc.assertTrue(bool((got[~attended] == -1).all()))


def _case_swa_page_indices(tc):
    torch.manual_seed(11)
    block_size, num_q, max_reqs, n_full = 5, 320, 300, 50000
    _, gather = tc._parity(
        dspark_attn_metadata.ComputeDsparkWindowGather,
        seq_lens_casual=_ri(1, 300, (num_q,), torch.int32),
        req_pool_indices_repeated=_ri(0, max_reqs, (num_q,)),
        block_size=block_size,
        swa_window=128,
    )
    tc._parity(
        dspark_attn_metadata.BuildDsparkSwaPageIndices,
        req_to_token=_ri(0, n_full, (max_reqs, 400), torch.int32),
        full_to_swa_mapping=_ri(0, 20000, (n_full,), torch.int32),
        req_pool_indices_per_request=gather.req_pool_indices_per_request,
        offsets=gather.offsets,
        invalid=gather.invalid,
        out_loc=_ri(0, n_full, (num_q,)),
        context_lens=gather.context_lens,
        block_size=block_size,
        swa_window=128,
        page_index_aligned_size=64,
    )


_CASES = [
    ("causal_swa_page_indices", _case_causal_swa_page_indices),
    ("swa_page_indices", _case_swa_page_indices),
]


class TestDsparkKernelParity(CustomTestCase):
    def _eq(self, got, ref):
        """Exact comparison of tensors, tuples, and msgspec result structs."""
        if isinstance(ref, tuple):
            for g, r in zip(got, ref):
                self._eq(g, r)
        elif hasattr(ref, "__struct_fields__"):
            for name in ref.__struct_fields__:
                self._eq(getattr(got, name), getattr(ref, name))
        elif isinstance(ref, torch.Tensor):
            self.assertEqual(got.dtype, ref.dtype)
            self.assertTrue(torch.equal(got, ref))
        else:
            self.assertEqual(got, ref)

    def _parity(self, cls, **kw):
        got, ref = cls.triton(**kw), cls.torch(**kw)
        self._eq(got, ref)
        return got, ref

    def test_all_kernels_triton_matches_torch(self):
        for name, case in _CASES:
            with self.subTest(kernel=name):
                case(self)


if __name__ == "__main__":
    unittest.main()
