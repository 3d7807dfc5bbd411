"""The example plugin proves itself with swa_hal's conformance kit, exactly as a vendor would."""

import dataclasses
import random

import torch

from swa_hal import PlatformInfo, SWAMetadataBuilder
from swa_hal.reference import ragged_rows
from swa_hal.testing import CONFORMANCE_CONFIGS, BackendConformance, other_groups, random_batch
from swa_hal_example.backend import ExampleRaggedRows


class TestExampleBackend(BackendConformance):
    backend_name = "example"


def _check_ragged(md):
    ragged = md.extra(ExampleRaggedRows)
    flat, indptr = ragged_rows(md.decode_swa_indices, md.decode_swa_lens)
    assert ragged.indptr.tolist() == indptr.tolist()
    assert ragged.indices[: int(indptr[-1])].tolist() == flat.tolist()
    return ragged


def test_ragged_rows_match_the_dense_rows_in_fixed_buffers():
    config = CONFORMANCE_CONFIGS["v4"]
    builder = SWAMetadataBuilder(config, backend="example", platform=PlatformInfo.from_assume("vendor=example"))
    rng = random.Random(0)
    addresses = set()
    for kind in ("decode", "mixed", "invalid", "padded"):
        ragged = _check_ragged(builder.build(random_batch(config, rng, kind)))
        addresses.add((ragged.indptr.untyped_storage().data_ptr(), ragged.indices.untyped_storage().data_ptr()))
    assert len(addresses) == 1, "the extra must live in buffers allocated once"


def test_ragged_rows_follow_draft_updates_and_dspark_rows():
    platform = PlatformInfo.from_assume("vendor=example")
    rng = random.Random(1)
    config = CONFORMANCE_CONFIGS["w4b4_mtp"]
    builder = SWAMetadataBuilder(config, backend="example", platform=platform)
    batch = random_batch(config, rng, "mtp", max_context=config.max_model_len - 4)
    md = builder.build(batch)
    for _ in range(3):
        batch.seq_lens[: md.num_decodes] += 1
        batch.seq_lens_cpu[: md.num_decodes] += 1
        builder.update_draft_decode_metadata(md)
        _check_ragged(md)
    config = CONFORMANCE_CONFIGS["w7b3_dspark"]
    builder = SWAMetadataBuilder(config, backend="example", platform=platform)
    md = builder.build(random_batch(config, rng, "dspark"))
    assert not md.causal and torch.equal(_check_ragged(md).indptr[:1], torch.zeros(1, dtype=torch.int32))


def test_each_group_has_ragged_rows_of_its_own():
    """A group build hands every KV-cache group its own extra, filled from that group's rows, after the
    build and after each grouped draft step."""
    config = dataclasses.replace(CONFORMANCE_CONFIGS["w4b4_mtp"], num_kv_groups=3)
    builder = SWAMetadataBuilder(config, backend="example", platform=PlatformInfo.from_assume("vendor=example"))
    rng = random.Random(2)
    batch = random_batch(config, rng, "mtp", max_context=config.max_model_len - 4, extra_pages=2)
    tables, slots = other_groups(config, batch, 3, rng)
    mds = builder.build_groups(batch, tables, slots)
    for step in range(4):
        if step:
            batch.seq_lens[: mds[0].num_decodes] += 1
            batch.seq_lens_cpu[: mds[0].num_decodes] += 1
            builder.update_draft_decode_metadata(mds)
        assert len({tuple(md.decode_swa_indices.flatten().tolist()) for md in mds}) == 3, "the groups' rows agree"
        rows = [_check_ragged(md) for md in mds]
        assert len({ragged.indices.data_ptr() for ragged in rows}) == 3, "the groups share one extra"
