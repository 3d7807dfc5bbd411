"""swa_hal inside SGLang 0.5.23 (``make test-sglang``): SGLang's own plugin loader activates swa_hal,
and on random batches of every forward mode the SWA rows and lens SGLang's DeepSeek-V4 backend receives
through swa_hal equal what SGLang's own ops return, for the torch backend and the Triton backends (in the
interpreter).

What runs here: SGLang's plugin framework and its dsv4 metadata ops (their CPU references) for real, on many
random batches through the hooks themselves (the causal branch of ``make_core_attn_metadata`` reproduced from
SGLang's ops, ``sglang_harness.sglang_causal_branch``); test_sglang_backend.py calls the real backend classes'
methods with and without the hooks.

The per-request SWA ring's DSpark rows go through SGLang's own op ``BuildDsparkSwaRingIndices.execute``,
hooked by SGLang's registry here; swa_hal's causal ring rows, which no hook hands SGLang, are compared with
SGLang's ROCm unified-KV stream op.

Where SGLang's own behaviour differs from swa_hal's safe behaviour, the test says so by name:
``test_draft_extend_padding_rows_sglang_gives_negative_lens``,
``test_sglang_xpu_padding_rows_read_no_wrapped_index``, and the ring's
``test_ring_slot_outside_the_ring_sglang_reads_outside_swa_hal_empties``,
``test_ring_block_at_a_negative_prefix_sglang_gives_rows_swa_hal_none``,
``test_ring_shorter_than_a_block_sglang_aliases_swa_hal_refuses``. Malformed steps reach SGLang's log a call
later (or raise under SWA_HAL_STRICT=1); SGLang's XPU platform, forced on the CPU, gets swa_hal's xpu backend.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

import sglang.srt.plugins as sgl_plugins  # noqa: E402
import sglang_harness as H  # noqa: E402
from helpers import BACKEND_PLATFORMS, TRITON_BACKENDS, logged_warnings  # noqa: E402
from sglang.kernels.ops.attention.dsv4.attn_metadata_kernels import BuildCausalSwaPageIndices  # noqa: E402
from sglang.kernels.ops.speculative.dspark.dspark_attn_metadata import BuildDsparkSwaRingIndices  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402
from sglang_hooks import LogLines, Originals, loaded_by_sglang  # noqa: E402

from swa_hal import PlatformInfo, SlotRing, SlotRows  # noqa: E402
from swa_hal.errors import BatchCapacityError, BatchRangeError  # noqa: E402
from swa_hal.integrations import _common  # noqa: E402
from swa_hal.integrations import sglang as integ  # noqa: E402
from swa_hal.testing.request_windows import runs_past_the_groups_read_their_own_rows  # noqa: E402

BACKENDS = ("torch", *TRITON_BACKENDS)
# Random batches per backend (220 each): the causal kinds in turn, DSpark with and without valid_from.
CAUSAL_BATCHES = 180
DSPARK_BATCHES = 40
SMALL_WINDOWS = (8, 20, 64, 100)  # the ops take any window; SGLang's is 128


class _CountsSummary:
    """Prints what the parity tests covered in pytest's closing summary."""

    def pytest_terminal_summary(self, terminalreporter):
        if not H.COUNTS:
            return
        by_backend: dict[str, int] = {}
        for key, count in H.COUNTS.items():
            backend = key.split(":")[0]
            by_backend[backend] = by_backend.get(backend, 0) + count
        terminalreporter.write_line(
            "swa_hal vs SGLang parity, batches per backend: " + ", ".join(f"{k}={v}" for k, v in by_backend.items())
        )
        terminalreporter.write_line("  by kind: " + ", ".join(f"{k}={v}" for k, v in sorted(H.COUNTS.items())))
        if H.WINDOW_COUNTS:
            terminalreporter.write_line(
                "request-window layouts vs SGLang's window_layout: "
                + ", ".join(f"{k}={v}" for k, v in sorted(H.WINDOW_COUNTS.items()))
            )
        if H.RING_COUNTS:
            terminalreporter.write_line(
                "ring rows vs SGLang's ring ops: " + ", ".join(f"{k}={v}" for k, v in sorted(H.RING_COUNTS.items()))
            )


@pytest.fixture(scope="module", autouse=True)
def _parity_counts(request):
    summary = _CountsSummary()
    if not request.config.pluginmanager.is_registered(summary):
        request.config.pluginmanager.register(summary, "swa_hal_sglang_counts")
    yield


@pytest.fixture(scope="module")
def loaded():
    """SGLang's own loader, as every SGLang process runs it (``SGLANG_PLUGINS=swa_hal``)."""
    original = BuildCausalSwaPageIndices.__dict__["execute"]
    original_ring = BuildDsparkSwaRingIndices.__dict__["execute"]
    with loaded_by_sglang(Originals()) as (ours, sglang_log):  # every target's SGLang function put back after
        try:
            yield SimpleNamespace(ours=ours, sglang=sglang_log, original=original, original_ring=original_ring)
        finally:
            BuildCausalSwaPageIndices.execute = original
            BuildDsparkSwaRingIndices.execute = original_ring


@pytest.fixture
def isolated_registry():
    """A test that loads the plugin on its own: SGLang's hook registry and our install-once state are
    put back afterwards (the module's loaded plugin stays loaded)."""
    hooks = {k: list(v) for k, v in HookRegistry._hooks.items()}
    patched = set(HookRegistry._patched)
    done = integ._install_once._done, integ._install_once._result
    shadow = integ._shadow
    HookRegistry.reset()
    integ._install_once.reset()
    with Originals().kept():  # a test that runs SGLang's loader applies the hooks again
        yield
    HookRegistry.reset()
    HookRegistry._hooks.update(hooks)
    HookRegistry._patched.update(patched)
    integ._install_once._done, integ._install_once._result = done
    integ._shadow = shadow


def _use_backend(backend: str) -> None:
    plat = None if backend == "torch" else PlatformInfo.from_assume(BACKEND_PLATFORMS[backend])
    integ.configure(backend=backend, platform=plat)


def _cases_on(backend, what):
    """Route SGLang's hooks to ``backend``; the random source of its ``what`` cases."""
    _use_backend(backend)
    return random.Random(f"sglang-{what}-{backend}")


def _window(rng: random.Random) -> int:
    return rng.choice(SMALL_WINDOWS) if rng.random() < 0.2 else H.SWA_WINDOW


# -- the plugin ------------------------------------------------------------------------------------------------


def test_sglang_loader_activates_swa_hal(loaded):
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group=sgl_plugins.GENERAL_PLUGINS_GROUP)}
    assert eps.get("swa_hal") == "swa_hal.integrations.sglang:load_plugin"
    assert any("Executed general plugin: swa_hal" in line for line in loaded.sglang.lines)
    # One line from the plugin, naming the backend (the CPU's is torch).
    assert len(loaded.ours.lines) == 1, loaded.ours.lines
    line = loaded.ours.lines[0]
    assert "SGLang 0.5.23" in line and "swa_hal backend 'torch'" in line, line
    # Every hook is applied by SGLang's registry (the backend modules import in this environment), and the
    # line says so hook by hook.
    assert set(integ.TARGETS) <= HookRegistry._patched
    assert "all 7 hooks applied" in line and "FAILED" not in line, line
    assert set(integ.TARGETS) <= set(HookRegistry._hooks)
    assert all(len(HookRegistry._hooks[t]) == 1 for t in integ.TARGETS)
    wrapped = BuildCausalSwaPageIndices.__dict__["execute"]
    assert isinstance(wrapped, classmethod) and wrapped.__func__.__wrapped__ is loaded.original.__func__
    wrapped = BuildDsparkSwaRingIndices.__dict__["execute"]
    assert isinstance(wrapped, classmethod) and wrapped.__func__.__wrapped__ is loaded.original_ring.__func__


def test_plugin_is_idempotent(loaded):
    before = len(loaded.ours.lines)
    assert integ.load_plugin() == loaded.ours.lines[0]
    assert integ.load_plugin() == loaded.ours.lines[0]
    sgl_plugins._plugins_loaded = False
    sgl_plugins.load_plugins()  # the loader again, as a second process stage would
    assert len(loaded.ours.lines) == before
    assert all(len(HookRegistry._hooks[t]) == 1 for t in integ.TARGETS)


def test_switch_off_leaves_sglang_untouched(isolated_registry, monkeypatch):
    monkeypatch.setenv("SWA_HAL_SGLANG", "0")
    assert integ.load_plugin() is None
    assert not HookRegistry._hooks
    monkeypatch.setenv("SWA_HAL_SGLANG", "maybe")
    with pytest.raises(ValueError, match="SWA_HAL_SGLANG"):
        integ.load_plugin()
    monkeypatch.setenv("SWA_HAL_SGLANG", "on")
    assert "through swa_hal backend" in integ.load_plugin()


def _load_through_sglang():
    """SGLang's own plugin loader, as every SGLang process runs it; returns what its loggers logged."""
    handler = LogLines()
    logging.getLogger("sglang.srt.plugins").addHandler(handler)  # the plugin's logger is its child
    try:
        sgl_plugins._plugins_loaded = False
        sgl_plugins.load_plugins()
    finally:
        logging.getLogger("sglang.srt.plugins").removeHandler(handler)
        sgl_plugins._plugins_loaded = True
    return handler.lines


@pytest.mark.parametrize("found", ["0.5.22", "0.5.24", "0.5.23.dev3", "0.5.23rc1"])
def test_other_sglang_version_is_shadowed_with_one_warning(isolated_registry, monkeypatch, found):
    """Under an SGLang release outside the tested set (pre and development releases of the tested one
    included), SGLang's own loader runs the plugin, which logs one warning (the version found, the tested one,
    how to promote or refuse) and registers its hooks in shadow mode: SGLang serves, swa_hal compares
    (docs/engines.md #releases-outside-the-tested-set)."""
    monkeypatch.setattr(_common, "installed_version", lambda dist: found)
    monkeypatch.setattr(_common, "_warned", set())
    lines = _load_through_sglang() + _load_through_sglang()  # loaded twice in one process: one warning
    warned = [line for line in lines if f"{found} is installed" in line]
    assert len(warned) == 1, lines
    for word in ("tested with SGLang 0.5.23 only", "shadow mode", "SWA_HAL_SHADOW_PROMOTE=1", "SWA_HAL_SGLANG=0"):
        assert word in warned[0], warned[0]
    assert set(HookRegistry._hooks) == set(integ.TARGETS)
    assert integ.shadow_report()["mode"] == "shadow"
    assert any("shadow mode: SGLang serves" in line for line in lines), lines
    assert not any("Failed to execute general plugin" in line for line in lines)


def test_other_sglang_version_switched_off_is_untouched(isolated_registry, monkeypatch):
    monkeypatch.setattr(_common, "installed_version", lambda dist: "0.5.24")
    monkeypatch.setenv("SWA_HAL_SGLANG", "off")
    assert integ.load_plugin() is None
    assert not HookRegistry._hooks and integ.shadow_report() is None


def test_other_sglang_version_under_strict_is_a_clear_error(isolated_registry, monkeypatch):
    monkeypatch.setattr(_common, "installed_version", lambda dist: "0.5.22")
    monkeypatch.setenv("SWA_HAL_STRICT", "1")
    with pytest.raises(_common.EngineVersionError) as err:
        integ.load_plugin()
    message = str(err.value)
    assert "0.5.23" in message and "0.5.22 is installed" in message and "SWA_HAL_SGLANG=0" in message
    assert not HookRegistry._hooks
    monkeypatch.setattr(_common, "installed_version", lambda dist: None)
    with pytest.raises(_common.EngineVersionError, match="is not installed"):
        integ.load_plugin()


def test_other_sglang_version_forced_installs(isolated_registry, monkeypatch):
    monkeypatch.setattr(_common, "installed_version", lambda dist: "0.5.22")
    monkeypatch.setenv("SWA_HAL_FORCE_ENGINE", "1")
    assert "SGLang 0.5.22 DeepSeek-V4 SWA indices" in integ.load_plugin()
    assert HookRegistry._hooks and integ.shadow_report() is None  # swa_hal serves


def test_backend_that_cannot_start_is_an_error_before_any_hook(isolated_registry, monkeypatch):
    monkeypatch.setenv("SWA_HAL_BACKEND", "no-such-backend")
    with pytest.raises(Exception, match="no-such-backend"):
        integ.load_plugin()
    assert not HookRegistry._hooks


def test_module_imports_nothing_from_sglang():
    code = (
        "import sys, swa_hal.integrations.sglang as m\n"
        "bad = sorted(k for k in sys.modules if k == 'sglang' or k.startswith('sglang.'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "SWA_HAL_SGLANG": "1"})


# -- parity with SGLang's ops ---------------------------------------------------------------------------------


def _core_stand_in(case, dspark_block_size=None):
    """Stand-in for ``make_core_attn_metadata``: its causal branch, with the (hooked) SGLang op."""
    return H.sglang_causal_branch(case, BuildCausalSwaPageIndices.execute)


_BACKEND_SELF = SimpleNamespace(token_to_kv_pool=SimpleNamespace(request_window=None))


def _through_swa_hal(case):
    return integ.core_attn_metadata_around(lambda self, *a, **k: _core_stand_in(*a, **k), _BACKEND_SELF, case)


def _check_causal(case, got, want) -> int:
    """Rows equal SGLang's; lens equal SGLang's where SGLang's are not negative, 0 where they are.
    Returns the number of rows where SGLang handed out a negative length."""
    assert got.swa_page_indices.dtype == torch.int32 and got.swa_page_indices.shape == want.swa_page_indices.shape
    torch.testing.assert_close(
        got.swa_page_indices,
        want.swa_page_indices,
        rtol=0,
        atol=0,
        msg=lambda m: f"{case.kind} rows differ ({case.rows} rows, W={case.window}): {m}",
    )
    negative = int((want.swa_topk_lengths < 0).sum())
    torch.testing.assert_close(
        got.swa_topk_lengths,
        want.swa_topk_lengths.clamp_min(0).to(torch.int32),
        rtol=0,
        atol=0,
        msg=lambda m: f"{case.kind} lens differ: {m}",
    )
    return negative


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_rows_and_lens_equal_sglangs(loaded, backend):
    rng = _cases_on(backend, "causal")
    n = CAUSAL_BATCHES
    for i in range(n):
        kind = H.CAUSAL_KINDS[i % len(H.CAUSAL_KINDS)]
        case = H.causal_case(rng, kind, window=_window(rng))
        _check_causal(case, _through_swa_hal(case), H.sglang_causal(case))
        H.COUNTS[f"{backend}:{kind}"] += 1
    assert integ.adapter_for(torch.device("cpu")).backend_name == backend


def _refuse(*args, **kwargs):
    raise AssertionError("the paged pool must not fall back to SGLang's own DSpark ops")


def _dspark_through_swa_hal(case):
    """``case``'s DSpark rows and lens through the hook around SGLang's paged-pool op (its own op refused)."""
    return integ.dspark_indices_around(
        _refuse, H.backend_stand_in(case), seq_lens_casual=case.seq_lens_casual,
        req_pool_indices_repeated=case.req_pool_indices_repeated, out_loc=case.out_loc, block_size=case.block_size,
    )


def _check_dspark(case, got, want):
    """swa_hal's DSpark rows and lens equal SGLang's bit for bit."""
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, msg=lambda m: f"{case.kind}: {m}")
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0, msg=lambda m: f"{case.kind} lens: {m}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_dspark_rows_and_lens_equal_sglangs(loaded, backend):
    rng = _cases_on(backend, "dspark")
    n = DSPARK_BATCHES
    for i in range(n):
        case = H.dspark_case(rng, with_valid_from=bool(i % 2), window=_window(rng))
        want = H.sglang_dspark(case)
        got = (
            _dspark_through_swa_hal(case)
            if case.window == H.SWA_WINDOW
            else integ.adapter_for(torch.device("cpu"), case.window).dspark(
                req_to_token=case.pool.req_to_token,
                full_to_swa=case.pool.full_to_swa,
                seq_lens_casual=case.seq_lens_casual,
                req_pool_indices_repeated=case.req_pool_indices_repeated,
                out_loc=case.out_loc,
                block_size=case.block_size,
                valid_from=case.valid_from,
            )
        )
        _check_dspark(case, got, want)
        H.COUNTS[f"{backend}:{case.kind}"] += 1


def test_at_least_200_batches_per_backend():
    for backend in BACKENDS:
        total = sum(v for k, v in H.COUNTS.items() if k.startswith(f"{backend}:"))
        if total == 0:
            pytest.skip("the parity tests did not run in this session")
        assert total >= 200, (backend, total)
        assert H.COUNTS[f"{backend}:dspark"] and H.COUNTS[f"{backend}:dspark_valid_from"]


def test_request_window_and_dspark_branches_keep_sglangs_lens(loaded):
    """make_core_attn_metadata's other branches are passed through untouched."""
    marker = SimpleNamespace(swa_topk_lengths="sglang's")

    def original(self, case, dspark_block_size=None):
        return marker

    windowed = SimpleNamespace(token_to_kv_pool=SimpleNamespace(request_window=object()))
    assert integ.core_attn_metadata_around(original, windowed, None) is marker
    assert integ.core_attn_metadata_around(original, _BACKEND_SELF, None, dspark_block_size=3) is marker
    assert marker.swa_topk_lengths == "sglang's"


def test_draft_extend_padding_rows_sglang_gives_negative_lens(loaded):
    """SGLang's behaviour that swa_hal does not copy: draft extend pads a DP batch with seq_len-1
    requests of the full draft length, so their rows sit at negative positions; SGLang's lens for them
    are ``min(p + 1, W)``, i.e. negative. swa_hal hands out 0 (every entry -1 on both sides)."""
    _use_backend("torch")
    rng = random.Random(7)
    pool = H.Pool.make(rng, [300] + [1] * 7, 128, [0] * 8)
    seq = torch.tensor([300, 1], dtype=torch.int32)
    q = 4
    casual = (seq[:, None] + torch.arange(-q + 1, 1, dtype=torch.int32)).flatten()
    case = H.CausalCase("draft_extend", pool, H.SWA_WINDOW, torch.tensor([0, 1]).repeat_interleave(q), casual)
    want = H.sglang_causal(case)
    got = _through_swa_hal(case)
    assert want.swa_topk_lengths[4:].tolist() == [-2, -1, 0, 1]
    assert got.swa_topk_lengths[4:].tolist() == [0, 0, 0, 1]
    assert _check_causal(case, got, want) == 2
    assert torch.equal(got.swa_page_indices, want.swa_page_indices)


def test_late_tail_floor_and_padding_conventions(loaded):
    """Two SGLang conventions kept exactly: a padding row of an extend is position 0 of the last
    request with lens 1 (not -1 / 0), and a late-layer tail row's floor is max(0, seq_len - W)."""
    _use_backend("torch")
    rng = random.Random(3)
    pool = H.Pool.make(rng, [400, 50] + [1] * 6, 256, [0] * 8)
    casual, rep = H._expand([400, 50], [200, 50], [0, 1], 255, True)
    case = H.CausalCase("extend_padded", pool, H.SWA_WINDOW, rep, casual.to(torch.int32))
    got = _through_swa_hal(case)
    first_of_last = int(pool.full_to_swa[pool.req_to_token[1, 0]])
    assert got.swa_topk_lengths[250:].tolist() == [1] * 5
    assert got.swa_page_indices[250:, 0].tolist() == [first_of_last] * 5
    assert (got.swa_page_indices[250:, 1:] == -1).all()
    _check_causal(case, got, H.sglang_causal(case))


def test_one_launch_per_call_same_builder_new_outputs(loaded):
    """Each call is one kernel launch of the same builder (docs/semantics.md #token-slot-rows: no
    translation pass); outputs are new tensors, so SGLang's main and tail metadata never alias."""
    _use_backend("cuda")
    rng = random.Random(11)
    case = H.causal_case(rng, "decode")
    a = integ.adapter_for(torch.device("cpu"))
    first = _through_swa_hal(case)
    builder = a.builder
    launches = builder.backend._slot_rows.launches
    second = _through_swa_hal(case)
    assert a.builder is builder
    assert builder.backend._slot_rows.launches == launches + 1
    assert first.swa_page_indices.data_ptr() != second.swa_page_indices.data_ptr()
    assert torch.equal(first.swa_page_indices, second.swa_page_indices)


# -- the per-request SWA ring -------------------------------------------------------------------------------

# Random ring steps per backend, all compared with SGLang's op (its torch path is its only one); the unified-KV
# stream op (ROCm's causal ring rows, a Triton kernel) runs in the interpreter at about a millisecond a token.
RING_STEPS = 200
RING_STREAM_STEPS = {"torch": 60, **dict.fromkeys(TRITON_BACKENDS, 20)}


def _check_ring(case, got, want) -> None:
    """Rows and lens: SGLang's dtype, shape and values."""
    for name, have, expected in (("rows", got[0], want[0]), ("lens", got[1], want[1])):
        assert have.dtype == expected.dtype and have.shape == expected.shape, (case.kind, name)
        torch.testing.assert_close(
            have,
            expected,
            rtol=0,
            atol=0,
            msg=lambda m, n=name: (
                f"{case.kind} {n} (W={case.window}, N={case.block_size}, ring {case.ring_size} x {case.num_slots}): {m}"
            ),
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_rows_and_lens_equal_sglangs(loaded, backend):
    """SGLang's own ``BuildDsparkSwaRingIndices.execute`` (hooked by its registry) against its torch path,
    on random ring steps of every kind; each draft block also reads its own tokens exactly where SGLang
    writes them (``_dspark_swa_ring_out_cache_loc``)."""
    rng = _cases_on(backend, "ring")
    for i in range(RING_STEPS):
        kind = H.RING_KINDS[i % len(H.RING_KINDS)]
        case = H.ring_case(rng, kind, window=_window(rng))
        got = BuildDsparkSwaRingIndices.execute(**case.op_kwargs())
        _check_ring(case, got, H.sglang_ring(case))
        rows, lens = got
        own = (lens - case.block_size + torch.arange(case.rows) % case.block_size).long()
        assert torch.equal(rows.gather(1, own[:, None])[:, 0], H.sglang_ring_write_rows(case)), kind
        H.RING_COUNTS[f"{backend}:{kind}"] += 1
    assert integ.adapter_for(torch.device("cpu")).backend_name == backend


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_ring_rows_equal_sglangs_unified_kv_stream(loaded, backend):
    """Causal ring rows (newest first, docs/semantics.md #ring-rows) against SGLang's ROCm unified-KV op
    ``write_v4_paged_decode_indices`` (its Triton kernel through the interpreter), which packs each token's
    window oldest first into a ragged stream: read back to front, every row equals its stretch of the
    stream; a CUDA graph's padding token (batch id -1) is an empty row. Not hooked (the op fills SGLang's
    combined SWA, CSA and HCA streams in place), so through the builder."""
    rng = _cases_on(backend, "ring-stream")
    for i in range(RING_STREAM_STEPS[backend]):
        kind = H.RING_STREAM_KINDS[i % len(H.RING_STREAM_KINDS)]
        case = H.ring_stream_case(rng, kind, window=_window(rng))
        stream, indptr = H.sglang_ring_stream(case)
        real = case.batch_id >= 0
        rows = SlotRows(
            row_ends=torch.where(real, case.positions + 1, 0),
            pools=case.state_slot[case.batch_id.clamp_min(0).long()],
            width=-(-case.window // H.ALIGN) * H.ALIGN,
            ring=SlotRing(size=case.ring_size, slots=case.num_slots),
        )
        out, lens = integ.adapter_for(torch.device("cpu"), case.window).builder.build_slot_rows(rows)
        assert torch.equal(lens, indptr[1:] - indptr[:-1]), kind
        cols = torch.arange(out.shape[1])
        backwards = out.gather(1, (lens[:, None] - 1 - cols).clamp_min(0).long())
        assert torch.equal(backwards[cols[None, :] < lens[:, None]], stream), kind
        H.RING_COUNTS[f"{backend}:stream_{kind}"] += 1


def test_at_least_200_ring_steps_per_backend():
    if not H.RING_COUNTS:
        pytest.skip("the ring parity tests did not run in this session")
    for backend in BACKENDS:
        dspark = sum(H.RING_COUNTS[f"{backend}:{kind}"] for kind in H.RING_KINDS)
        assert dspark >= 200 and all(H.RING_COUNTS[f"{backend}:{kind}"] for kind in H.RING_KINDS), backend
        assert all(H.RING_COUNTS[f"{backend}:stream_{kind}"] for kind in H.RING_STREAM_KINDS), backend


def test_ring_worked_vector_is_sglangs(loaded):
    """docs/semantics.md #ring-rows, DSpark vector, as SGLang's own op computes it (W = 4, blocks of 2,
    two slots of 6 rows, valid_from [3, 0])."""
    t = torch.tensor
    case = H.RingCase("vector", 4, 2, 6, t([0, 0, 1, 1]), t([6, 7, 10, 11], dtype=torch.int32), t([3, 0]))
    want = [[3, 4, 5, 0, -1, -1, -1, -1]] * 2 + [[11, 6, 7, 8, 9, 10, -1, -1]] * 2
    kwargs = {**case.op_kwargs(), "page_index_aligned_size": 8}
    rows, lens = BuildDsparkSwaRingIndices.torch(**kwargs)
    assert rows.tolist() == want and lens.tolist() == [4, 4, 6, 6]
    _use_backend("torch")
    got = BuildDsparkSwaRingIndices.execute(**kwargs)
    assert got[0].tolist() == want and got[1].tolist() == [4, 4, 6, 6]


def test_ring_pool_gets_its_rows_from_swa_hal_through_sglangs_method(loaded, monkeypatch):
    """``get_dspark_swa_page_indices`` on a ring pool: the plugin's hook of the method lets SGLang's ring
    branch run, whose op call is swa_hal's (one launch on a Triton backend)."""
    _use_backend("cuda")
    rng = random.Random("sglang-ring-method")
    calls = []
    real = integ.SGLangSWAIndices.dspark_ring

    def counted(self, **kwargs):
        calls.append(kwargs["ring_size"])
        return real(self, **kwargs)

    monkeypatch.setattr(integ.SGLangSWAIndices, "dspark_ring", counted)
    for kind in H.RING_KINDS:
        case = H.ring_case(rng, kind)
        stand_in = SimpleNamespace(token_to_kv_pool=case.pool(), req_to_token=None)
        adapter = integ.adapter_for(torch.device("cpu"), case.window)
        launches = adapter.builder.backend._slot_rows.launches
        got = integ.dspark_indices_around(
            H.sglang_ring_method(case),
            stand_in,
            seq_lens_casual=case.seq_lens_casual,
            req_pool_indices_repeated=case.req_pool_indices_repeated,
            out_loc=None,
            block_size=case.block_size,
        )
        _check_ring(case, got, H.sglang_ring(case))
        assert adapter.builder.backend._slot_rows.launches == launches + 1
    assert calls == [c for c in calls if c >= H.SWA_WINDOW] and len(calls) == len(H.RING_KINDS)


def _ring_block(slot: int, prefix: int, *, slots: int = 4, block: int = 2):
    """One draft block of ``block`` rows at ``prefix`` in request slot ``slot`` of a ring of ``slots`` slots
    of 136 rows (W = 128 + a block of 8), valid_from 0."""
    t = torch.tensor
    casual = t([prefix + 1 + j for j in range(block)], dtype=torch.int32)
    return H.RingCase(
        "malformed", H.SWA_WINDOW, block, 136, t([slot] * block), casual, torch.zeros(slots, dtype=torch.int64)
    )


def test_ring_slot_outside_the_ring_sglang_reads_outside_swa_hal_empties(loaded, swa_hal_warnings):
    """SGLang's behaviour that swa_hal does not copy: a request slot of -1 wraps around ``valid_from`` and
    gives rows below 0, outside the ring (one past it, ``num_slots``, fails on the CPU and is an unchecked
    read on the GPU). swa_hal hands the block out empty and logs the typed error a call later."""
    _use_backend("torch")
    bad, good = _ring_block(-1, 300), _ring_block(1, 300)
    rows, lens = H.sglang_ring(bad)
    assert lens.tolist() == [130, 130] and int(rows[0, :130].min()) < 0
    with pytest.raises(IndexError):
        H.sglang_ring(_ring_block(4, 300))
    got_rows, got_lens = BuildDsparkSwaRingIndices.execute(**bad.op_kwargs())
    assert got_lens.tolist() == [0, 0] and (got_rows == -1).all()
    assert swa_hal_warnings() == []  # a call later, never by a sync in this one
    got_rows, got_lens = BuildDsparkSwaRingIndices.execute(**_ring_block(4, 300).op_kwargs())
    assert got_lens.tolist() == [0, 0] and (got_rows == -1).all()
    _check_ring(good, BuildDsparkSwaRingIndices.execute(**good.op_kwargs()), H.sglang_ring(good))
    warned = swa_hal_warnings()  # the same kind twice: logged once
    assert len(warned) == 1 and "pools[0]=-1 is not a request slot of the ring" in warned[0], warned
    with pytest.raises(BatchRangeError, match=r"pools\[0\]=-1 is not a request slot") as err:
        integ.adapter_for(torch.device("cpu")).builder.check()  # the first violation, which the poll took
    assert err.value.field == "pools"


def test_ring_block_at_a_negative_prefix_sglang_gives_rows_swa_hal_none(loaded):
    """SGLang's behaviour that swa_hal does not copy (no SGLang caller passes it: a block's prefix is its
    request's seq_len): a block at prefix -1 gets lens N from SGLang, rows at positions -1, 0, ... wrapped
    into the ring; swa_hal's block at a negative prefix is empty, as its paged DSpark rows are."""
    _use_backend("torch")
    case = _ring_block(1, -1)
    rows, lens = H.sglang_ring(case)
    assert lens.tolist() == [2, 2] and rows[0, :2].tolist() == [136 + 135, 136 + 0]
    got_rows, got_lens = BuildDsparkSwaRingIndices.execute(**case.op_kwargs())
    assert got_lens.tolist() == [0, 0] and (got_rows == -1).all()


def test_ring_shorter_than_a_block_sglang_aliases_swa_hal_refuses(loaded):
    """A ring shorter than W + N rows (SGLang sizes its ring to hold them, get_draft_swa_ring_size): SGLang's
    rows then name one ring row twice, the newest key over the oldest; swa_hal refuses the call by name."""
    _use_backend("torch")
    case = dataclasses.replace(_ring_block(1, 300, block=8), ring_size=130)
    rows, lens = H.sglang_ring(case)
    live = rows[0, : int(lens[0])].tolist()
    assert len(set(live)) < len(live)
    with pytest.raises(BatchCapacityError, match=r"ring.size=130 is shorter than a row's positions \(136"):
        BuildDsparkSwaRingIndices.execute(**case.op_kwargs())


# -- DeepSeek-V4.1 request-window layouts --------------------------------------------------------------------

# Random V4.1 steps compared with SGLang's torch path (200 on the torch backend; 20 on each Triton backend,
# whose kernel runs in the interpreter) and with SGLang's Triton op, which runs in the interpreter too and
# takes about a second a step: fewer of those.
WINDOW_STEPS = {"torch": 200, **dict.fromkeys(TRITON_BACKENDS, 20)}
WINDOW_OP_STEPS = 30


def _window_window(rng: random.Random) -> int:
    return rng.choice((4, 8, 16, 100)) if rng.random() < 0.4 else H.SWA_WINDOW


def _check_window(case, got, want, where: str) -> None:
    """Every WindowLayout field: the same dtype, shape and values (``want`` is SGLang's WindowLayout or
    its op's dict)."""
    for name in integ.RequestWindowLayout.FIELDS:
        have = getattr(got, name)
        expected = want[name] if isinstance(want, dict) else getattr(want, name)
        label = f"{where} {case.kind} {name}"
        if name == "size":
            assert have == expected, (label, have, expected)
            continue
        assert have.dtype == expected.dtype, (label, have.dtype, expected.dtype)
        torch.testing.assert_close(have, expected, rtol=0, atol=0, msg=lambda m, label=label: f"{label}: {m}")
    assert int(got.runs) == H.window_runs(case)


def _window_through_swa_hal(case):
    adapter = integ.adapter_for(case.pos.device, case.window)
    return adapter.window_layout(
        case.req,
        case.pos,
        zero_row=case.zero_row,
        capacity=case.capacity,
        floor=case.floor,
        num_groups=case.num_groups,
        padded_rows=case.padded_rows,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_layout_equals_sglangs_torch_path(loaded, backend):
    rng = _cases_on(backend, "window")
    for i in range(WINDOW_STEPS[backend]):
        kind = H.WINDOW_KINDS[i % len(H.WINDOW_KINDS)]
        case = H.window_case(rng, kind, window=_window_window(rng))
        _check_window(case, _window_through_swa_hal(case), H.sglang_window_torch(case), "torch path")
        H.WINDOW_COUNTS[f"torch path:{kind}"] += 1


def test_window_layout_equals_sglangs_triton_op(loaded):
    """SGLang's CUDA path: its op ``build_window_layout`` (interpreter). Every third step has more runs
    than groups, which only the op takes (the torch path fails: the next test)."""
    _use_backend("torch")
    rng = random.Random("sglang-window-op")
    for i in range(WINDOW_OP_STEPS):
        kind = H.WINDOW_KINDS[i % len(H.WINDOW_KINDS)]
        # The overfull third moves on each pass over the kinds, so every kind is also taken as it is.
        overfull = i % 3 == (i // len(H.WINDOW_KINDS)) % 3
        case = H.window_case(rng, kind, window=_window_window(rng), overfull=overfull)
        assert not overfull or H.window_runs(case) > case.num_groups
        op = H.sglang_window_triton(case)
        safe = runs_past_the_groups_read_their_own_rows(case, op)
        # Where a run past the groups reads anything before its own rows, the op points past the history.
        assert overfull or torch.equal(safe["indices"], op["indices"])
        _check_window(case, _window_through_swa_hal(case), safe, "op")
        H.WINDOW_COUNTS[f"op:{'overfull' if overfull else kind}"] += 1


def test_window_layout_runs_past_the_groups_sglang_torch_path_fails(loaded):
    """Where the runs outnumber the groups SGLang's torch path (every device but CUDA) fails; swa_hal gives
    its CUDA op's values on every device, except that a run past the groups reads its own rows only, where the
    op points its earlier entries past the history (docs/semantics.md #engine-parity)."""
    rng = random.Random("sglang-window-overfull")
    case = H.window_case(rng, "decode", window=8, overfull=True)
    with pytest.raises(RuntimeError, match="out of bounds"):
        H.sglang_window_torch(case)
    _use_backend("torch")
    op = H.sglang_window_triton(case)
    safe = runs_past_the_groups_read_their_own_rows(case, op)
    history = (case.num_groups or case.req.shape[0]) * case.window
    # The op's entries that swa_hal drops all point at or past the history's end, some past the workspace.
    dropped = op["indices"][(safe["indices"] == -1) & (op["indices"] >= 0)]
    assert dropped.numel() and bool((dropped >= history).all())
    got = _window_through_swa_hal(case)
    _check_window(case, got, safe, "op")
    assert int(got.indices.max()) < got.size


def test_window_layout_worked_vectors_are_sglangs(loaded):
    """The two vectors of docs/semantics.md #request-window-layouts, as SGLang computes them."""
    t = torch.tensor
    vectors = [
        H.WindowCase("vector 1", t([3, 3, 3, 5]), t([4, 5, 6, 0]), 99, 4, 8, None, 3, 6),
        H.WindowCase(
            "vector 2", t([7, 7, 7, 7, 7, 2]), t([9, 10, 11, 12, 13, 3]), 50, 4, 4, t([8, 8, 8, 8, 8, 2]), None, None
        ),
    ]
    _use_backend("torch")
    for case in vectors:
        got = _window_through_swa_hal(case)
        _check_window(case, got, H.sglang_window_torch(case), "torch path")
        _check_window(case, got, H.sglang_window_triton(case), "op")
    assert got.indices[5].tolist() == [29, 7, -1, -1] and got.history_src[:8].tolist() == [
        50,
        50,
        50,
        28,
        50,
        50,
        50,
        10,
    ]


def test_at_least_200_window_steps():
    if not H.WINDOW_COUNTS:
        pytest.skip("the request-window parity tests did not run in this session")
    torch_path = sum(v for k, v in H.WINDOW_COUNTS.items() if k.startswith("torch path:"))
    assert torch_path >= 200, torch_path
    assert all(H.WINDOW_COUNTS[f"torch path:{kind}"] for kind in H.WINDOW_KINDS)
    assert H.WINDOW_COUNTS["op:overfull"] >= 10
    assert all(H.WINDOW_COUNTS[f"op:{kind}"] for kind in H.WINDOW_KINDS)


def test_window_layout_through_the_hook(loaded, monkeypatch):
    """SGLang's own ``window_layout`` (what its V4.1 backends and the idle forward call) now returns
    swa_hal's layout as SGLang's WindowLayout, equal to SGLang's own on random steps."""
    import sglang.srt.mem_cache.dsv41_request_window as sgl_window

    hooked = sgl_window.window_layout
    assert hooked.__wrapped__ is not hooked and hooked.__wrapped__.__module__ == sgl_window.__name__
    _use_backend("torch")
    calls = []
    real = integ.SGLangSWAIndices.window_layout

    def counted(self, *args, **kwargs):
        calls.append(self.window_size)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(integ.SGLangSWAIndices, "window_layout", counted)
    rng = random.Random("sglang-window-hook")
    for i in range(len(H.WINDOW_KINDS)):
        case = H.window_case(rng, H.WINDOW_KINDS[i], window=_window_window(rng))
        args = case.kwargs()
        if case.window == H.SWA_WINDOW:
            del args["window"]  # SGLang's callers leave it at its default
        got = hooked(case.req, case.pos, **args)
        assert isinstance(got, sgl_window.WindowLayout)
        want = H.sglang_window_torch(case)
        for name in integ.RequestWindowLayout.FIELDS:
            have, expected = getattr(got, name), getattr(want, name)
            if name == "size":
                assert have == expected
            else:
                assert have.dtype == expected.dtype and torch.equal(have, expected), name
        # SGLang's own methods keep working on it (a prefill graph's leading rows).
        assert torch.equal(got.leading_rows(1).indices, want.indices[:1])
    assert len(calls) == len(H.WINDOW_KINDS)  # every call was swa_hal's
    # Runs past the groups: SGLang's torch path would fail here; through the hook the op's values come back.
    case = H.window_case(rng, "decode", window=8, overfull=True)
    got = hooked(case.req, case.pos, **case.kwargs())
    want = runs_past_the_groups_read_their_own_rows(case, H.sglang_window_triton(case))
    assert all(torch.equal(getattr(got, k), want[k]) for k in integ.RequestWindowLayout.FIELDS if k != "size")


def test_window_layout_hook_keeps_sglangs_invariant(loaded, monkeypatch):
    """``dsv41.window_groups_fit`` through SGLang's own ``expect``: silent when the runs fit, and at
    SGLang's STRICT level a failure when they do not (on the CPU its async assert raises at once)."""
    import sglang.srt.mem_cache.dsv41_request_window as sgl_window

    _use_backend("torch")
    fits = H.window_case(random.Random(3), "extend", window=8)
    fits = dataclasses.replace(fits, num_groups=H.window_runs(fits))
    overfull = H.window_case(random.Random(4), "decode", window=8, overfull=True)
    seen = []
    real_expect = sgl_window.expect

    def watched(inv, value, **kwargs):
        seen.append((inv.name, value.tolist()))
        return real_expect(inv, value, **kwargs)

    monkeypatch.setattr(sgl_window, "expect", watched)
    monkeypatch.setenv("SGLANG_INVARIANT_CHECK", "0")
    sgl_window.window_layout(overfull.req, overfull.pos, **overfull.kwargs())
    assert seen == []  # OFF: SGLang builds no predicate, neither do we
    monkeypatch.setenv("SGLANG_INVARIANT_CHECK", "2")
    sgl_window.window_layout(fits.req, fits.pos, **fits.kwargs())
    assert seen == [("dsv41.window_groups_fit", [True])]
    with pytest.raises(RuntimeError, match="dsv41.window_groups_fit"):
        sgl_window.window_layout(overfull.req, overfull.pos, **overfull.kwargs())
    assert seen[-1] == ("dsv41.window_groups_fit", [False])


# -- guard violations in SGLang's log ---------------------------------------------------------------------------

CACHE_SLOT_LINE = (
    "swa_hal: a guarded build handed out empty rows: BatchRangeError: slot_map: row 1's window reads cache slot "
    "-7, outside the cache (found by a guarded build, which handed the offending rows out empty) "
    "[field=slot_map request=1 value=-7]; logged once per kind, SWA_HAL_STRICT=1 raises instead"
)


@pytest.fixture
def swa_hal_warnings(caplog):
    """The plugin's warnings, each once (SGLang's logging may cut its loggers off from caplog's root)."""
    with logged_warnings(caplog, integ.log.name) as warnings:
        yield warnings


def _steps():
    """A clean decode step and two malformed ones (the harness's ``corrupt``): row 1's newest token maps
    to SWA slot -7; row 1's newest token sits at full-pool slot 10**6, past ``full_to_swa``."""
    good = H.decode_step()
    assert good.pool.full_to_swa.shape[0] < 10**6
    return good, H.corrupt(good, swa_slot=-7), H.corrupt(good, token_slot=10**6)


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_guard_violation_reaches_sglangs_log_a_call_later(loaded, swa_hal_warnings, backend):
    """SGLang never calls check(): each hooked call polls the violation record without a sync, so a
    malformed step is logged by the next call (once per kind), naming the field, the row and the value,
    through the plugin's logger; the offending row is handed out empty meanwhile."""
    _use_backend(backend)
    good, bad_slot, bad_token = _steps()
    for _ in range(2):
        _check_causal(good, _through_swa_hal(good), H.sglang_causal(good))
    assert swa_hal_warnings() == []
    got = _through_swa_hal(bad_slot)
    assert got.swa_topk_lengths.tolist() == [128, 0]  # row 1 handed out empty, row 0 untouched
    assert (got.swa_page_indices[1] == -1).all()
    assert swa_hal_warnings() == []  # a call later, never by a sync in this one
    _through_swa_hal(good)
    assert swa_hal_warnings() == [CACHE_SLOT_LINE]
    for _ in range(2):  # the same kind again: not logged again
        _through_swa_hal(bad_slot)
    _through_swa_hal(good)
    assert swa_hal_warnings() == [CACHE_SLOT_LINE]
    _through_swa_hal(bad_token)
    _through_swa_hal(good)
    warned = swa_hal_warnings()
    assert len(warned) == 2 and "[field=req_to_token request=1 value=1000000]" in warned[1], warned
    assert "BatchRangeError: req_to_token: row 1's window reads token slot 1000000" in warned[1]


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_guard_violation_raises_at_the_next_sglang_call_when_strict(loaded, swa_hal_warnings, monkeypatch, backend):
    monkeypatch.setenv("SWA_HAL_STRICT", "1")
    _use_backend(backend)
    good, bad_slot, bad_token = _steps()
    _through_swa_hal(good)
    _through_swa_hal(bad_slot)
    with pytest.raises(BatchRangeError, match="row 1's window reads cache slot -7") as info:
        _through_swa_hal(good)
    assert info.value.field == "slot_map" and info.value.index == 1
    _through_swa_hal(good)  # raised once
    _through_swa_hal(bad_token)
    with pytest.raises(BatchRangeError, match="token slot 1000000") as info:
        _through_swa_hal(good)
    assert info.value.field == "req_to_token" and info.value.index == 1
    assert swa_hal_warnings() == []


# -- SGLang's XPU platform ---------------------------------------------------------------------------------------

# SGLang's torch references read full_to_swa at index -1 for every entry outside a window (a wrapped index
# onto the mapping's trailing -1); with this there instead, a row that reads it shows it.
WRAP_SENTINEL = 4242


@pytest.fixture
def sglang_on_xpu(loaded, monkeypatch):
    """SGLang's XPU platform, forced on this CPU: its platform check (``sglang.srt.utils.is_xpu``, which
    its DeepSeek-V4 backend reads to pick its XPU kernels) says XPU. The tensors stay on the CPU, where
    SGLang's ops take their torch references, as they do for XPU tensors."""
    import sglang.srt.utils as sgl_utils
    import sglang.srt.utils.common as sgl_utils_common

    assert not sgl_utils.is_xpu()
    monkeypatch.setattr(sgl_utils, "is_xpu", lambda: True)
    monkeypatch.setattr(sgl_utils_common, "is_xpu", lambda: True)
    integ.configure()
    yield
    integ.configure()


def test_plain_cpu_platform_gets_torch(loaded):
    integ.configure()
    assert integ.sglang_platform(torch.device("cpu")) is None
    assert integ.adapter_for(torch.device("cpu")).backend_name == "torch"


def test_sglang_xpu_platform_gets_swa_hals_xpu_backend(sglang_on_xpu, isolated_registry):
    assert integ.sglang_platform(torch.device("cpu")).vendor == "xpu"
    assert integ.adapter_for(torch.device("cpu")).backend_name == "xpu"
    line = integ.load_plugin()  # the start-up line names the backend the adapters get
    assert "swa_hal backend 'xpu' (xpu" in line, line
    # An explicit choice still wins over SGLang's platform.
    integ.configure(backend="torch")
    assert integ.adapter_for(torch.device("cpu")).backend_name == "torch"


def test_sglang_xpu_rows_equal_sglangs_cuda_path(sglang_on_xpu):
    """On SGLang's XPU platform the hooked ops are swa_hal's xpu backend (its Triton kernel, in the
    interpreter), and give what SGLang gives on its CUDA path (its Triton kernels), not its torch
    reference's wrapped reads."""
    rng = random.Random("sglang-xpu")
    for kind in H.CAUSAL_KINDS:
        case = H.causal_case(rng, kind, window=_window(rng))
        case.pool.full_to_swa[-1] = WRAP_SENTINEL
        got = _through_swa_hal(case)
        _check_causal(case, got, H.sglang_causal_cuda_path(case))
        assert not (got.swa_page_indices == WRAP_SENTINEL).any(), kind
        H.COUNTS[f"xpu-platform:{kind}"] += 1
    assert integ.adapter_for(torch.device("cpu")).backend_name == "xpu"
    for i in range(4):
        case = H.dspark_case(rng, with_valid_from=bool(i % 2))
        case.pool.full_to_swa[-1] = WRAP_SENTINEL
        want = H.sglang_dspark(case, path="triton")
        _check_dspark(case, _dspark_through_swa_hal(case), want)
        H.COUNTS[f"xpu-platform:{case.kind}"] += 1
    assert integ.adapter_for(torch.device("cpu"), H.SWA_WINDOW).builder.backend_name == "xpu"


def test_sglang_xpu_padding_rows_read_no_wrapped_index(sglang_on_xpu):
    """Draft extend's DP padding rows (positions -3..0) and a short row: SGLang's torch reference, what its
    ops run on XPU, fills every entry outside the window from ``full_to_swa[-1]``; its CUDA path and swa_hal's
    xpu backend write -1 there without reading the mapping."""
    rng = random.Random(7)
    pool = H.Pool.make(rng, [300, 1, 20] + [1] * 5, 128, [0] * 8)
    pool.full_to_swa[-1] = WRAP_SENTINEL
    seq = torch.tensor([300, 1, 20], dtype=torch.int32)
    q = 4
    casual = (seq[:, None] + torch.arange(-q + 1, 1, dtype=torch.int32)).flatten()
    case = H.CausalCase("draft_extend", pool, H.SWA_WINDOW, torch.tensor([0, 1, 2]).repeat_interleave(q), casual)
    reference = H.sglang_causal(case).swa_page_indices
    cuda_path = H.sglang_causal_cuda_path(case)
    got = _through_swa_hal(case)
    # SGLang's torch reference: the padding rows' 128 window entries are all the wrapped read; the short
    # request's first row (row 8: position 16, 17 tokens) reads it for its 111 entries below position 0.
    assert (reference[4:7, :128] == WRAP_SENTINEL).all()
    assert (reference[8, 17:128] == WRAP_SENTINEL).all() and not (reference[8, :17] == WRAP_SENTINEL).any()
    # SGLang's CUDA path and swa_hal's xpu backend: -1 there, and equal throughout.
    assert (cuda_path.swa_page_indices[4:7] == -1).all() and (cuda_path.swa_page_indices[8, 17:] == -1).all()
    assert torch.equal(got.swa_page_indices, cuda_path.swa_page_indices)
    assert got.swa_topk_lengths[4:12].tolist() == [0, 0, 0, 1, 17, 18, 19, 20]
    assert integ.adapter_for(torch.device("cpu")).backend_name == "xpu"


def test_sglang_xpu_ring_rows_come_from_swa_hals_xpu_backend(sglang_on_xpu):
    """The ring op has one path in SGLang (torch, on every device); on SGLang's XPU platform the hooked op
    is swa_hal's xpu backend (its Triton kernel, in the interpreter), equal to it."""
    rng = random.Random("sglang-xpu-ring")
    for kind in H.RING_KINDS:
        case = H.ring_case(rng, kind, window=_window(rng))
        _check_ring(case, BuildDsparkSwaRingIndices.execute(**case.op_kwargs()), H.sglang_ring(case))
        H.COUNTS[f"xpu-platform:{kind}"] += 1
        assert integ.adapter_for(torch.device("cpu"), case.window).backend_name == "xpu"


def _info_engine(tmp_path, *argv, **env):
    """`swa-hal info --engine sglang` in a new process, as a user runs it."""
    full = {k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS", "SWA_HAL_SGLANG")}
    full.update(env)
    cmd = [sys.executable, "-m", "swa_hal.cli", "info", "--engine", "sglang", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=full, timeout=600)


@pytest.mark.parametrize("switch, mode, word", [(None, "serve", "serving"), ("shadow", "shadow", "shadowing")])
def test_info_engine_sglang_says_the_plugin_is_active_and_its_mode(tmp_path, switch, mode, word):
    env = {"SGLANG_PLUGINS": "swa_hal", **({"SWA_HAL_SGLANG": switch} if switch else {})}
    proc = _info_engine(tmp_path, "--json", **env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    engine = json.loads(proc.stdout)["engine"]
    assert (engine["engine"], engine["active"], engine["mode"]) == ("sglang", True, mode)
    assert engine["startup"].startswith("swa_hal 0.1.0: SGLang 0.5.23") and engine["hook_gaps"] == {}
    assert (engine["shadow"] is None) == (mode == "serve")
    text = _info_engine(tmp_path, **env).stdout
    assert f"  active: yes, {word} SGLang" in text and "  stepped aside: 0 calls in this process" in text


def test_info_engine_sglang_says_why_the_plugin_is_not_active(tmp_path):
    proc = _info_engine(tmp_path, SGLANG_PLUGINS="some_other_plugin")
    assert proc.returncode == 1
    assert "  active: no: SGLANG_PLUGINS='some_other_plugin' does not name swa_hal" in proc.stdout, proc.stdout
