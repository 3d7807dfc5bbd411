"""Conformance topic: random batches of every kind, bit for bit against the reference, in fixed buffers;
an invalid batch raises a validation error."""

from __future__ import annotations

import random

import pytest

from ..batch import AttentionBatch
from ..compare import compare_with_reference
from ..errors import BatchValidationError
from .fixtures import CONFORMANCE_CONFIGS, BackendFixtures, MakeBatch, MakeBuilder


class RandomBatchTests(BackendFixtures):
    """Every config of ``configs`` with every batch kind it allows (``config_name, kind`` are parametrized
    by ``BackendFixtures.pytest_generate_tests``), ``batches_per_case`` batches each."""

    def test_random_batches_match_reference(
        self, name: str, make_builder: MakeBuilder, make_batch: MakeBatch, config_name: str, kind: str
    ) -> None:
        config = self.configs[config_name]
        builder = make_builder(config)
        rng = random.Random(f"{name}-{config_name}-{kind}")
        addresses = None
        for _ in range(self.batches_per_case):
            batch = make_batch(config, rng, kind)
            md = builder.build(batch)
            problems = compare_with_reference(config, batch, md)
            assert not problems, f"{kind} batch {batch.num_tokens} tokens: " + "; ".join(problems)
            # Rows past the decode rows hold lens 0 (a captured graph may read them).
            tail = builder.buffers.decode_lens[md.num_decode_tokens :]
            assert int(tail.abs().sum()) == 0, "decode lens past num_decode_tokens must be 0"
            now = tuple(
                t.untyped_storage().data_ptr() for t in (md.decode_swa_lens, md.token_to_req_indices, md.is_valid_token)
            )
            assert addresses is None or now == addresses, "output buffers moved between builds"
            addresses = now

    def test_invalid_batch_raises_a_validation_error(self, make_builder: MakeBuilder) -> None:
        builder = make_builder(CONFORMANCE_CONFIGS["w4b4_mtp"])
        batch = AttentionBatch.from_lists([3], [2], [[0]], block_size=4).to(builder.device)
        batch.seq_lens.fill_(1)  # shorter than its 2 query tokens
        with pytest.raises(BatchValidationError, match=r"seq_lens\[0\]=1 is shorter than its query length 2"):
            builder.build(batch, validate=True)
