"""The host copies of a step (``query_start_loc_cpu``, ``seq_lens_cpu``) are checked on every build, not only
under full validation (docs/semantics.md #guarded-builds): the split and the chunk plan read them as numbers,
so a float or int64 copy (another split), a [R+1, 1] or 0-d copy (other offsets, or an untyped IndexError) and a
``seq_lens_cpu`` shorter than the batch (a prefill dropped from the plan) are refused by name, on every backend,
before any launch."""

from __future__ import annotations

import pytest
import torch

from helpers import BACKEND_PLATFORMS, make_builder, swept
from swa_hal import AttentionBatch, SWAConfig
from swa_hal.errors import BatchDtypeError, BatchShapeError

CONFIG = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=4)


def base() -> AttentionBatch:
    """A decode (S=6, q=1) and a prefill (S=9, q=5)."""
    return AttentionBatch.from_lists([6, 9], [1, 5], [[1, 2], [3, 4, 5]], block_size=4)


def qsl_cpu(b: AttentionBatch) -> torch.Tensor:
    return b.query_start_loc_cpu


def seq_cpu(b: AttentionBatch) -> torch.Tensor:
    return b.seq_lens_cpu


CASES = [
    (
        "query_start_loc_cpu float",
        "query_start_loc_cpu",
        lambda b: qsl_cpu(b).float(),
        BatchDtypeError,
        r"^query_start_loc_cpu has dtype torch.float32; a host copy must be int32",
    ),
    (
        "query_start_loc_cpu int64",
        "query_start_loc_cpu",
        lambda b: qsl_cpu(b).long(),
        BatchDtypeError,
        r"^query_start_loc_cpu has dtype torch.int64",
    ),
    (
        "query_start_loc_cpu [R+1, 1]",
        "query_start_loc_cpu",
        lambda b: qsl_cpu(b)[:, None],
        BatchShapeError,
        r"^query_start_loc_cpu has shape \(3, 1\); a host copy must be 1-D",
    ),
    (
        "query_start_loc_cpu 0-d",
        "query_start_loc_cpu",
        lambda b: qsl_cpu(b)[2],
        BatchShapeError,
        r"^query_start_loc_cpu has shape \(\); a host copy must be 1-D",
    ),
    (
        "seq_lens_cpu short",
        "seq_lens_cpu",
        lambda b: seq_cpu(b)[:1],
        BatchShapeError,
        r"^seq_lens_cpu has 1 entries for 2 requests",
    ),
    (
        "seq_lens_cpu int64",
        "seq_lens_cpu",
        lambda b: seq_cpu(b).long(),
        BatchDtypeError,
        r"^seq_lens_cpu has dtype torch.int64",
    ),
    (
        "seq_lens_cpu [R, 1]",
        "seq_lens_cpu",
        lambda b: seq_cpu(b)[:, None],
        BatchShapeError,
        r"^seq_lens_cpu has shape \(2, 1\)",
    ),
]


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("backend", swept(sorted(BACKEND_PLATFORMS)))
@pytest.mark.parametrize("kind, field, make, exc, message", CASES, ids=[c[0] for c in CASES])
def test_a_bad_host_copy_is_refused_on_every_build(backend, validate, kind, field, make, exc, message):
    builder = make_builder(CONFIG, backend)
    builder.build(base())  # the good batch builds
    bad = base()
    bad = bad.replace(**{field: make(bad)})
    with pytest.raises(exc) as info:
        builder.build(bad, validate=validate)
    assert info.value.field == field
    if not validate:  # full validation names the same field in its own words
        assert info.match(message)
