"""Conformance topic: the SM12x address rule (every lane's address in bounds, masked or not), checked under
the Triton interpreter's address-strict mode. Collected for backends that claim ``clamps_addresses``."""

from __future__ import annotations

import random

import pytest

from ..compare import compare_with_reference
from .fixtures import BackendFixtures, MakeBatch, MakeBuilder, Target, requires
from .interpreter import AddressViolation, address_strict

# What to change when a backend breaks the rule it claims.
CLAMP_FIX = (
    "backend {name!r} claims clamps_addresses=True in its spec, so every lane's address must lie inside a tensor "
    "argument, masked or not. Fix: run swa_hal's shared kernels in their clamped variant (a TritonBackend "
    "subclass with CLAMP_ADDRESSES = True, as the sm12x backend does), or clamp the offsets of your own "
    "kernel's loads and stores into bounds before the mask applies; or, if the device does not need it, drop "
    "clamps_addresses=True from the spec (the test is then not collected)"
)


class AddressRuleTests(BackendFixtures):
    """Random batches of every config and kind, built (and draft-updated) with every lane checked."""

    @requires("clamps_addresses")
    def test_address_strict(
        self, name: str, target: Target, make_builder: MakeBuilder, make_batch: MakeBatch, config_name: str, kind: str
    ) -> None:
        if target.device.type != "cpu":
            pytest.skip("address-strict runs under the Triton interpreter on the CPU")
        config = self.configs[config_name]
        builder = make_builder(config)
        rng = random.Random(f"strict-{name}-{config_name}-{kind}")
        try:
            with address_strict():
                for _ in range(self.batches_per_case):
                    batch = make_batch(config, rng, kind)
                    md = builder.build(batch)
                    problems = compare_with_reference(config, batch, md)
                    assert not problems, f"{kind} batch of {config_name} under address-strict: " + "; ".join(problems)
                    if md.causal and md.num_decode_tokens and builder.supports_draft_decode_metadata_update:
                        builder.update_draft_decode_metadata(md)  # the in-place variant, same rule
        except AddressViolation as exc:
            # The message says which lanes; the fix is in the backend or in its claim, never in the kit.
            raise AddressViolation(f"{kind} batch of {config_name}: {exc}\n{CLAMP_FIX.format(name=name)}") from None
