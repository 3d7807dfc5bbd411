"""The guarded-output fuzz's draws (swa_hal.testing.guarded, docs/semantics.md #guarded-builds): each class
the cases draw is drawn at all from a fixed seed, so none can silently vanish from the long run or the
kit's guarded topic. The torch builder stands in for the backend (the draws do not depend on it); the
topic itself runs every backend (tests/test_conformance_builtin.py)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from swa_hal.errors import SWAHalError
from swa_hal.rules import Violation
from swa_hal.testing import guarded as G

CPU = torch.device("cpu")


def drawn(case: Callable[..., list[str]], config, seed: str, cases: int) -> dict[str, int]:
    """The classes ``cases`` seeded calls of ``case`` drew, each compared with the reference (clean)."""
    G.DRAWN.clear()
    builder, ref = G.reference_builder(config), G.reference_builder(config)
    rng = random.Random(seed)
    for k in range(cases):
        problems = case(G.Draw(builder, ref, rng, CPU, k))
        assert not problems, problems
    return dict(G.DRAWN)


@pytest.fixture(scope="module")
def group_draws() -> dict[str, int]:
    return drawn(G.group_case, G.GUARDED_CONFIG, "draws-groups", 200)


@pytest.mark.parametrize("layout", [f"tables {t}" for t in G.TABLE_LAYOUTS] + [f"slots {s}" for s in G.SLOT_LAYOUTS])
def test_group_cases_draw_every_shared_storage_layout(group_draws, layout):
    assert group_draws.get(f"groups shared {layout}", 0) >= 1, (layout, group_draws)


@pytest.mark.parametrize("what", G.MISMATCHES)
def test_group_cases_draw_every_disagreeing_structure(group_draws, what):
    assert group_draws.get(f"groups {what}", 0) >= 1, (what, group_draws)


@pytest.mark.parametrize("empty", G.EMPTY_POOLS)
def test_token_slot_cases_draw_every_empty_pool(empty):
    """An empty pool is refused by shape on every backend alike (docs/semantics.md #token-slot-rows)."""
    draws = drawn(G.slot_rows_case, G.guarded_slot_rows_config(8), "draws-empty-pools", 200)
    assert draws.get(f"slot_rows {empty}", 0) >= 1, (empty, draws)


def test_group_cases_keep_most_of_their_budget_on_the_listed_groups(group_draws):
    assert group_draws["groups listed"] >= 80, group_draws


@pytest.mark.parametrize(
    "config", [G.SETTINGS_CONFIG, G.guarded_slot_rows_config(8)], ids=lambda c: f"w{c.window_size}"
)
def test_settings_cases_draw_every_setting_inside_and_outside(config):
    draws = drawn(G.settings_case, config, f"draws-settings-{config.window_size}", 200)
    for entry, setting in G.SETTINGS:
        for side in ("inside", "outside"):
            assert draws.get(f"settings {entry}.{setting} {side}", 0) >= 1, (entry, setting, side, draws)


def test_request_window_cases_are_drawn_and_equal_the_reference():
    draws = drawn(G.request_window_case, G.guarded_slot_rows_config(8), "draws-request-window", 30)
    assert draws.get("request_window", 0) == 30, draws


def test_build_cases_draw_the_host_seq_model_len_and_page_size_classes():
    """Rules 15-17 (docs/semantics.md #guarded-builds): the malformed batches draw a prefill's seq_lens_cpu that
    differs from seq_lens, a seq_len past max_model_len, slots made for another page size and one slot off,
    and the reference records each rule (the long run and the kit's guarded topic use these batches)."""
    draws = drawn(G.build_case, G.GUARDED_CONFIG, "draws-batches", 120)
    for name in G.BATCH_CLASSES:
        assert draws.get(name, 0) >= 3, (name, draws)
    ref = G.reference_builder(G.GUARDED_CONFIG)
    rng = random.Random("recorded-kinds")
    kinds = set()
    for _ in range(200):
        batch = G.malformed_batch(rng)
        try:
            ref.build(batch, validate=False)
        except SWAHalError:  # refused by the preflight: nothing built
            continue
        kinds.add(ref.buffers.violation.tolist()[1])
        ref.buffers.violation.zero_()
    assert {int(Violation.HOST_SEQ), int(Violation.MODEL_LEN), int(Violation.OWN_SLOT)} <= kinds, kinds


def test_dspark_build_cases_draw_host_upper_bounds_and_the_rows_they_would_have_refused():
    """A DSpark step's decodes with seq_lens_cpu an upper bound (docs/semantics.md #dspark-rows), at a window at the
    row's edge: drawn, equal to the reference, and among them rows that fit by their device length although the
    host bound says they do not (which a host check from the bound would have refused)."""
    config = G.GUARDED_DSPARK_EDGE_CONFIG
    width, window = config.noncausal_index_width, config.window_size
    draws = drawn(G.build_case, config, "draws-dspark-edge", 60)
    assert draws.get("batch DSpark host upper bounds", 0) >= 10, draws
    rng = random.Random("dspark-edge-refusals")
    fits_by_device = 0
    for _ in range(150):
        batch = G.malformed_batch(rng, config)
        if batch.causal or batch.seq_lens_cpu is None:
            continue
        qsl, seqs, host = batch.query_start_loc_cpu.tolist(), batch.seq_lens.tolist(), batch.seq_lens_cpu.tolist()
        for r in range(len(qsl) - 1):
            q = qsl[r + 1] - qsl[r]
            if 0 < q <= config.decode_threshold and min(q + window, seqs[r]) <= width < min(q + window, host[r]):
                fits_by_device += 1
    assert fits_by_device >= 3, fits_by_device


@pytest.mark.parametrize("config", [G.GUARDED_CONFIG, G.GUARDED_DSPARK_EDGE_CONFIG], ids=lambda c: f"w{c.window_size}")
def test_validated_cases_draw_every_default_path_form(config):
    """Validated builds of valid steps in the forms the default path takes (docs/semantics.md
    #inputs), each form drawn, and inputs of a type the default path refuses."""
    draws = drawn(G.validated_case, config, f"draws-validated-{config.window_size}", 80)
    forms = [
        "validated per-request buffers longer than R",
        "validated host upper bounds",
        "validated overstated max_query_len",
        "validated padding requests without bounds",
    ]
    if config.is_dspark:
        forms.append("validated DSpark host upper bounds")
    for form in forms:
        assert draws.get(form, 0) >= 2, (form, draws)
    assert sum(v for k, v in draws.items() if k.startswith("validated untyped ")) >= 5, draws
