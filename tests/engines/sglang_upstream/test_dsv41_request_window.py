# Copied from SGLang (https://github.com/sgl-project/sglang), file
# test/registered/unit/mem_cache/test_dsv41_request_window.py at commit 4fd22d856b4aa28360357fa0431af9e5e2b4058a.
# Copyright the SGLang authors. Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License. You may obtain a copy of the License at
# http://www.apache.org/licenses/LICENSE-2.0 (the repository's LICENSE file holds it).
#
# Changes from the upstream file, nothing else (no assertion edited):
# - the tests that call ``window_layout`` are marked strict xfail: this copy predates SGLang 0.5.23, whose
#   ``window_layout`` requires a keyword ``zero_row`` (the row invalid history slots copy from) that the copy
#   never passes, so each fails with a TypeError before it asserts, on SGLang's ops and on swa_hal's alike;
# - ``test_cuda_graph_replay_refreshes_request_history`` is left out: it captures a CUDA graph, which this
#   CPU-only suite cannot (and it calls ``window_layout`` without ``zero_row`` too).
#
# Which tests exercise swa_hal (run with SGLANG_PLUGINS=swa_hal): every call of ``window_layout`` here goes
# through swa_hal's hook (SGLang's registry rebinds this module's imported name); none of those pass on
# SGLang 0.5.23. ``test_copy_preserves_separate_scale_region_across_pages`` tests SGLang's own copy kernel,
# which swa_hal does not replace. tests/engines/test_sglang.py holds the 0.5.23 layouts swa_hal is held to.
import pytest
import torch
from msgspec.structs import astuple

from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout
from sglang.srt.mem_cache.dsv41_request_window import (
    RequestWindow,
    copy_packed_tokens,
    window_layout,
)
from sglang.srt.model_executor.runner_utils.capture_mode import model_capture_mode
from sglang.test.ci.ci_register import register_amd_ci, register_cpu_ci

register_cpu_ci(est_time=5, suite="base-a-test-cpu")
# the CUDA-graph replay case needs a device
register_amd_ci(est_time=10, suite="stage-b-test-1-gpu-small-amd-mi35x")

ZERO_ROW = pytest.mark.xfail(
    strict=True,
    raises=TypeError,
    reason="copy older than SGLang 0.5.23: calls window_layout without the zero_row argument 0.5.23 requires",
)


class PackedPool:
    def __init__(self, size, layers, page=4):
        self.size = size
        self.dtype = torch.uint8
        self.kv_layout = KVLayout.V4
        self.kv_buffer = [
            torch.full(((size + page) // page, page * 584), 219, dtype=torch.uint8)
            for _ in range(layers)
        ]


def token_bytes(buf, loc, page=4):
    p, off = divmod(int(loc), page)
    return torch.cat(
        (
            buf[p, off * 576 : (off + 1) * 576],
            buf[p, page * 576 + off * 8 : page * 576 + (off + 1) * 8],
        )
    )


def put(buf, loc, value, page=4):
    p, off = divmod(int(loc), page)
    buf[p, off * 576 : (off + 1) * 576] = value
    buf[p, page * 576 + off * 8 : page * 576 + (off + 1) * 8] = value + 1


def run_chunk(state, req, pos, *, floor=None, layer=0):
    layout = window_layout(
        torch.tensor(req),
        torch.tensor(pos),
        window=3,
        capacity=state.capacity,
        floor=torch.tensor(floor) if floor is not None else None,
    )
    state.activate(layout)
    buf = state.buffer(layer)
    for loc, r, p in zip(layout.write_loc.tolist(), req, pos):
        put(buf, loc, r * 40 + p)
    return layout, buf


def test_copy_preserves_separate_scale_region_across_pages():
    src = torch.randint(0, 256, (7, 4 * 584), dtype=torch.uint8)
    dst = torch.full_like(src, 219)
    source = torch.tensor([0, 3, 4, 17, 22])
    target = torch.tensor([18, 2, 7, 11, 0])
    before = dst.clone()
    copy_packed_tokens(src, dst, source, target, page_size=4)
    for a, b in zip(source.tolist(), target.tolist()):
        assert torch.equal(token_bytes(src, a), token_bytes(dst, b))
    for i in set(range(28)) - set(target.tolist()):
        assert torch.equal(token_bytes(before, i), token_bytes(dst, i))


@ZERO_ROW
@pytest.mark.parametrize("length", [1, 3, 4, 17])
def test_large_prefill_reads_all_current_kv_before_ring_commit(length):
    state = RequestWindow(PackedPool, num_slots=3, layers=2, page_size=4, capacity=6)
    layout, buf = run_chunk(state, [1] * length, list(range(length)))
    for p, indices in enumerate(layout.indices.tolist()):
        actual = [int(token_bytes(buf, i)[0]) for i in indices if i >= 0]
        assert actual == [40 + j for j in range(p, max(-1, p - 3), -1)]
    state.commit(0)
    next_layout, next_buf = run_chunk(state, [1], [length])
    actual = [
        int(token_bytes(next_buf, i)[0]) for i in next_layout.indices[0] if i >= 0
    ]
    assert actual == [40 + j for j in range(length, max(-1, length - 3), -1)]


@ZERO_ROW
def test_replay_ignores_poisoned_pre_tail_state_and_is_request_private():
    state = RequestWindow(PackedPool, num_slots=3, layers=2, page_size=4, capacity=6)
    layout, buf = run_chunk(
        state, [1, 1, 1, 2, 2, 2], [7, 8, 9, 7, 8, 9], floor=[7] * 6
    )
    assert layout.lengths.tolist() == [1, 2, 3, 1, 2, 3]
    assert int(token_bytes(buf, layout.indices[0, 0])[0]) == 47
    state.commit(0)
    assert not torch.equal(state.state.kv_buffer[0][2:4], state.state.kv_buffer[0][4:6])
    state.reset(torch.tensor([1]))
    with pytest.raises(RuntimeError, match="history is missing"):
        run_chunk(state, [1], [10])
    run_chunk(state, [2], [10])
    with pytest.raises(RuntimeError, match="history is missing"):
        run_chunk(state, [2], [10], layer=1)


@ZERO_ROW
def test_layout_shapes_depend_only_on_batch_geometry():
    a = window_layout(
        torch.tensor([1, 1, 2]),
        torch.tensor([5, 6, 0]),
        window=3,
        capacity=8,
        num_groups=4,
    )
    b = window_layout(
        torch.tensor([3, 3, 3]),
        torch.tensor([9, 10, 11]),
        window=3,
        capacity=8,
        num_groups=4,
    )
    for first, second in (
        (a.write_loc, b.write_loc),
        (a.indices, b.indices),
        (a.lengths, b.lengths),
        (a.history_req, b.history_req),
        (a.history_pos, b.history_pos),
        (a.history_loc, b.history_loc),
        (a.history_valid, b.history_valid),
        (a.commit_mask, b.commit_mask),
    ):
        assert first.shape == second.shape
    assert a.size == b.size == 4 * 3 + 3
    assert int(a.history_valid.sum()) == 3


@ZERO_ROW
def test_startup_dummy_history_does_not_relax_real_request_validation():
    state = RequestWindow(PackedPool, num_slots=3, layers=2, page_size=4, capacity=8)
    layout = window_layout(torch.tensor([1]), torch.tensor([20]), window=3, capacity=8)
    state.reset(torch.tensor([1]))
    state.activate(layout)
    with pytest.raises(RuntimeError, match="history is missing"):
        state.buffer(0)
    state.initialize_dummy_history()
    for layer in (0, 1):
        buf = state.buffer(layer)
        for loc in layout.history_loc:
            assert torch.count_nonzero(token_bytes(buf, loc)) == 0
    state.reset(torch.tensor([1]))
    with pytest.raises(RuntimeError, match="history is missing"):
        state.buffer(0)


@ZERO_ROW
def test_capture_scope_does_not_relax_eager_history_validation():
    state = RequestWindow(
        PackedPool, num_slots=3, layers=1, page_size=4, capacity=8, workspace_rows=64
    )
    layout = window_layout(torch.tensor([1]), torch.tensor([20]), window=3, capacity=8)
    state.activate(layout)
    with pytest.raises(RuntimeError, match="history is missing"):
        state.buffer(0)
    workspace_address = state.workspace.kv_buffer[0].data_ptr()
    for _ in range(2):
        with model_capture_mode():
            state.buffer(0)
            state.buffer(0)
        # Same layout/layer after warmup must not reuse an unchecked buffer.
        with pytest.raises(RuntimeError, match="history is missing"):
            state.buffer(0)
        assert state.workspace.kv_buffer[0].data_ptr() == workspace_address
    with pytest.raises(ValueError, match="capture failure"):
        with model_capture_mode():
            state.buffer(0)
            raise ValueError("capture failure")
    with pytest.raises(RuntimeError, match="history is missing"):
        state.buffer(0)


@ZERO_ROW
@pytest.mark.parametrize("accepted", [1, 6])
def test_verify_rejection_preserves_required_history(accepted):
    state = RequestWindow(
        PackedPool, num_slots=3, layers=1, page_size=4, capacity=12, workspace_rows=256
    )
    state.reset(torch.tensor([1]))
    run_chunk(state, [1] * 9, list(range(9)))
    state.commit(0)
    # Verification writes all six candidates, even when only one is accepted.
    run_chunk(state, [1] * 6, list(range(9, 15)))
    state.commit(0)
    next_pos = 9 + accepted
    layout, buf = run_chunk(state, [1], [next_pos])
    actual = [int(token_bytes(buf, i)[0]) for i in layout.indices[0]]
    assert actual == [40 + p for p in range(next_pos, next_pos - 3, -1)]


@ZERO_ROW
def test_layout_copy_preserves_captured_tensor_addresses():
    a = window_layout(
        torch.tensor([1] * 5), torch.arange(9, 14), window=3, capacity=12, num_groups=1
    )
    b = window_layout(
        torch.tensor([2] * 5), torch.arange(2, 7), window=3, capacity=12, num_groups=1
    )
    addresses = [t.data_ptr() for t in astuple(a) if isinstance(t, torch.Tensor)]
    a.copy_(b)
    actual = [t for t in astuple(a) if isinstance(t, torch.Tensor)]
    expected = [t for t in astuple(b) if isinstance(t, torch.Tensor)]
    for tensor, other, addr in zip(actual, expected, addresses, strict=True):
        assert tensor.data_ptr() == addr
        assert torch.equal(tensor, other)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__]))
