"""The torch backend's guarded builds on the CPU (docs/semantics.md #guarded-builds): a build first runs
the cheap half of the checks and keeps an unguarded build when no rule can have broken; any other batch
is built again under the full guard. The two routes must give the same outputs and the same record."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from helpers import fuzz_settings, make_builder
from hypothesis import given
from test_guard import CFG, FUZZ, MALFORMED, base, malformed_batches

from swa_hal import SWAConfig
from swa_hal import errors as E
from swa_hal.testing.batches import KINDS, random_batch
from swa_hal.torch_backend.guard import TorchGuard

DSPARK = SWAConfig(window_size=7, block_size=3, max_model_len=300, max_num_batched_tokens=96, max_num_seqs=10,
                   num_speculative_tokens=5, speculative_method="dspark")
MTP = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=32, max_num_seqs=6,
                num_speculative_tokens=1, speculative_method="mtp")
VISION = SWAConfig(window_size=5, block_size=2, max_model_len=128, max_num_batched_tokens=64, max_num_seqs=8,
                   max_image_tokens=4, num_speculative_tokens=1, speculative_method="mtp")


def _builders(config: SWAConfig):
    """A builder per route: probe first (the default on the CPU), and the full guard always."""
    probed, full = make_builder(config, "torch"), make_builder(config, "torch")
    assert probed.guard and full.guard
    full.backend.probe_first = False
    return probed, full


def _outputs(md) -> dict[str, torch.Tensor]:
    return {f.name: v.clone() for f in dataclasses.fields(md) if isinstance(v := getattr(md, f.name), torch.Tensor)}


def _checked(builder) -> tuple[type, str] | None:
    try:
        builder.check()
    except E.BatchValidationError as err:
        return type(err), str(err)
    return None


def _same_build(probed, full, batch):
    """Builds ``batch`` by both routes, asserts the same outputs and record, and returns the record."""
    results = []
    for builder in (probed, full):
        try:
            md = builder.build(batch, validate=False)
        except E.BatchValidationError as err:  # the host preflight: the same for both routes
            results.append(("refused", type(err), str(err)))
            continue
        results.append((_outputs(md), _checked(builder)))
    (a, *ra), (b, *rb) = results
    if isinstance(a, str):
        assert (a, *ra) == (b, *rb)
        return None
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs between the probed and the full guard"
    assert ra == rb, f"the records differ: {ra} against {rb}"
    return ra[0]


class _Counting:
    """Counts the full guard's request selection (run only by the full route)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = TorchGuard.first_broken

        def counted(guard, num_reqs):
            self.calls += 1
            return real(guard, num_reqs)

        monkeypatch.setattr(TorchGuard, "first_broken", counted)


@pytest.mark.parametrize("config", [MTP, DSPARK, VISION], ids=["mtp", "dspark", "vision"])
def test_valid_batches_keep_the_unguarded_build_and_equal_the_full_guard(config, monkeypatch):
    probed, full = _builders(config)
    rng = random.Random(7)
    for kind in KINDS:
        if kind == "dspark" and not config.is_dspark:
            continue
        for _ in range(4):
            batch = random_batch(config, rng, kind)
            counting = _Counting(monkeypatch)
            md = probed.build(batch, validate=False)
            probed_outputs = _outputs(md)
            # Padding rows may read blocks past their request's window: those batches (and a DSpark step's whose
            # padding rows follow its prefills) may take the full guard (the probe is conservative); every other
            # valid batch keeps the unguarded build.
            padding_after_prefill = batch.num_tokens > int(batch.query_start_loc_cpu[-1]) and md.num_prefill_tokens
            if kind != "padded" and not padding_after_prefill:
                assert counting.calls == 0, f"a valid {kind} batch ran the full guard"
            md = full.build(batch, validate=False)
            for name, value in _outputs(md).items():
                assert torch.equal(probed_outputs[name], value), f"{kind}: {name} differs"
            assert _checked(probed) is None and _checked(full) is None


@pytest.mark.parametrize("kind, make, exc, field", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_batches_fall_back_to_the_full_guard(kind, make, exc, field, monkeypatch):
    probed, full = _builders(CFG)
    counting = _Counting(monkeypatch)
    _same_build(probed, full, make(base()))
    assert counting.calls == 2, "the probed route should have fallen back to the full guard"
    # The probed builder then keeps the unguarded build of a good batch again.
    counting.calls = 0
    md = probed.build(base())
    assert counting.calls == 0
    assert md.decode_swa_lens.tolist() == [4] and md.prefill_swa_lens.tolist() == [4, 4, 4, 4, 4]


def test_a_bad_block_in_the_prefill_rows_falls_back_after_the_decode_rows():
    probed, full = _builders(CFG)
    bad = base()
    bad = dataclasses.replace(bad, block_table=bad.block_table.clone())
    bad.block_table[1, 2] = 99  # read by the prefill's last rows only
    record = _same_build(probed, full, bad)
    assert record is not None and record[0] is E.BatchRangeError and "block id 99" in record[1], record


def test_draft_updates_take_the_same_route_and_agree():
    probed, full = _builders(CFG)
    rng = random.Random(3)
    for _ in range(6):
        batch = random_batch(CFG, rng, "mtp")
        mds = [b.build(batch) for b in (probed, full)]
        batch.seq_lens[: mds[0].num_decodes] += 1
        for b, md in zip((probed, full), mds):
            b.update_draft_decode_metadata(md)
        a, c = (_outputs(md) for md in mds)
        for name in a:
            assert torch.equal(a[name], c[name]), name


BUILDERS: dict[str, tuple] = {}


@fuzz_settings()
@given(batch=malformed_batches())
def test_fuzz_both_routes_give_the_same_outputs_and_record(batch):
    probed, full = BUILDERS.get("fuzz") or BUILDERS.setdefault("fuzz", _builders(FUZZ))
    _same_build(probed, full, batch)
