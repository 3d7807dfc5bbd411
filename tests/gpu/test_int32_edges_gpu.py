"""On the GPU: the int32 edges of tests/test_int32_edges.py (docs/semantics.md #guarded-builds) on every Triton
backend and the torch build, compiled rather than interpreted (int32 arithmetic wraps on the GPU as numpy's
does, but the compiled kernels are what an engine runs): lengths at INT32_MIN and INT32_MAX, query lengths
past int32, int64 token-slot inputs past int32 and valid windows on the last int32 page of 64 Ki-token pages,
against the hand-derived rows and, for the kernels, the torch backend."""

from __future__ import annotations

import pytest
import torch

from swa_hal import SWAMetadataBuilder
from swa_hal.testing.guarded import metadata_differences, recorded

pytestmark = pytest.mark.gpu

from helpers import GPU_FORCED, gpu_builder  # noqa: E402
from test_int32_edges import (  # noqa: E402
    CFG,
    DECODE_ROW,
    DSPARK_EDGES,
    EMPTY_DECODE,
    EMPTY_PREFILL,
    LARGE,
    LAST_PAGE_DECODE,
    LAST_PAGE_PREFILL,
    LENGTH_EDGES,
    PREFILL_ROWS,
    ROW1,
    SLOT_CFG,
    SLOT_EDGES,
    UNGUARDED_EDGES,
    last_page_batch,
)

NAMES = (*GPU_FORCED, "torch")


def builder(name: str, config, **kw) -> SWAMetadataBuilder:
    if name == "torch":
        return SWAMetadataBuilder(config, device="cuda", backend="torch", **kw)
    return gpu_builder(name, config, **kw)


def test_lengths_at_the_int32_edges(report):
    for name in NAMES:
        b, ref = builder(name, CFG), builder("torch", CFG)
        for edge, make, (decode_ok, prefill_ok, gather), exc, field in LENGTH_EDGES:
            batch = make().to("cuda")
            md = b.build(batch, validate=False)
            what = (name, edge)
            assert md.decode_swa_lens.tolist() == ([4] if decode_ok else [0]), what
            assert md.decode_swa_indices.view(1, -1).tolist() == [DECODE_ROW if decode_ok else EMPTY_DECODE], what
            assert md.prefill_swa_lens.tolist() == ([4] * 5 if prefill_ok else [0] * 5), what
            assert md.prefill_swa_indices.view(5, -1).tolist() == (
                PREFILL_ROWS if prefill_ok else [EMPTY_PREFILL] * 5
            ), what
            assert md.prefill_gather_lens.tolist() == [gather], what
            with pytest.raises(exc) as checked:
                b.check()
            assert checked.value.field == field, what
            assert metadata_differences(md, ref.build(batch, validate=False)) == [], what
            assert recorded(ref), what
    report(f"{len(LENGTH_EDGES)} int32-edge batches x {len(NAMES)} backends: emptied, recorded, equal to the reference")


@pytest.mark.parametrize("guard", [True, False], ids=["guarded", "unguarded"])
def test_windows_on_the_last_int32_page(report, guard):
    batch = last_page_batch().to("cuda")
    for name in NAMES:
        b = builder(name, LARGE, guard=guard)
        md = b.build(batch, validate=False)
        torch.cuda.synchronize()
        assert md.decode_swa_indices.view(2, -1).tolist() == LAST_PAGE_DECODE, name
        assert md.prefill_swa_indices.view(3, -1).tolist() == LAST_PAGE_PREFILL, name
        assert md.decode_swa_lens.tolist() == [4, 4] and md.prefill_swa_lens.tolist() == [4, 4, 4], name
        assert md.prefill_gather_lens.tolist() == [6], name
        b.check()
    report(f"last int32 page (B = 65536, slot 2^31 - 1 included), {'guarded' if guard else 'unguarded'}: exact")


def test_token_slot_inputs_past_int32(report):
    calls = [(rows, [want, ROW1], exc) for _, rows, want, exc in SLOT_EDGES]
    calls += [(rows, [want, want], exc) for _, rows, want, exc in DSPARK_EDGES]
    for name in NAMES:
        b = builder(name, SLOT_CFG)
        for rows, want, exc in calls:
            out, lens = b.build_slot_rows(rows.to("cuda"))
            assert out.tolist() == [r for r, _ in want] and lens.tolist() == [n for _, n in want], name
            if exc is None:
                assert b.buffers.violation.tolist() == [0, 0, 0, 0, 0], name
            else:
                with pytest.raises(exc):
                    b.check()
        unguarded = builder(name, SLOT_CFG, guard=False)
        for _, rows, want in UNGUARDED_EDGES:
            out, lens = unguarded.build_slot_rows(rows.to("cuda"))
            assert out.tolist() == [r for r, _ in want] and lens.tolist() == [n for _, n in want], name
    report(
        f"{len(calls)} guarded and {len(UNGUARDED_EDGES)} unguarded token-slot calls at the int32 edges x "
        f"{len(NAMES)} backends: exact"
    )
