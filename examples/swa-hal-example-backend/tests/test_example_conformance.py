"""The example plugin proves itself with swa_hal's conformance kit, exactly as a vendor would."""

import random

from swa_hal import PlatformInfo, SWAMetadataBuilder
from swa_hal.reference import ragged_rows
from swa_hal.testing import CONFORMANCE_CONFIGS, BackendConformance, random_batch


class TestExampleBackend(BackendConformance):
    backend_name = "example"


def test_ragged_post_pass_matches_the_dense_rows():
    config = CONFORMANCE_CONFIGS["v4"]
    builder = SWAMetadataBuilder(config, backend="example", platform=PlatformInfo.from_assume("vendor=example"))
    rng = random.Random(0)
    for kind in ("decode", "mixed", "invalid", "padded"):
        md = builder.build(random_batch(config, rng, kind))
        flat, indptr = ragged_rows(md.decode_swa_indices, md.decode_swa_lens)
        assert md.decode_swa_indptr.tolist() == indptr.tolist()
        assert md.decode_swa_ragged_indices[: int(indptr[-1])].tolist() == flat.tolist()
