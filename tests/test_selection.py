"""Selection on hand-built platforms; explicit requests never fall back silently."""

from __future__ import annotations

import pytest

from helpers import BACKEND_PLATFORMS
from swa_hal import BackendNotFoundError, BackendUnavailableError, PlatformInfo, select_backend
from swa_hal.plugins import PluginRegistry


@pytest.mark.parametrize(
    "assume, expected",
    [
        ("vendor=cuda,capability=9.0", "cuda"),
        ("vendor=cuda,capability=10.0", "cuda"),
        ("vendor=cuda,capability=10.3", "cuda"),
        ("vendor=cuda,capability=12.0", "sm12x"),
        ("vendor=cuda,capability=12.1", "sm12x"),
        ("vendor=cuda,capability=8.0", "torch"),
        ("vendor=rocm,arch=gfx942,capability=9.4", "rocm"),
        ("vendor=rocm,arch=gfx950,capability=10.0", "rocm"),
        ("vendor=xpu", "xpu"),
        ("vendor=cpu", "torch"),
        ("vendor=tpu", "torch"),
        ("vendor=cuda,capability=9.0,triton=0", "torch"),
    ],
)
def test_auto_selection(assume, expected):
    assert select_backend(platform=PlatformInfo.from_assume(assume)).name == expected


def test_rocm_reporting_capability_9_4_never_gets_a_cuda_backend():
    sel = select_backend(platform=PlatformInfo.from_assume("vendor=rocm,arch=gfx942,capability=9.4"))
    by = sel.candidates_by_name()
    assert not by["cuda"].availability.ok
    assert "found vendor 'rocm'" in by["cuda"].availability.reasons[0]
    assert sel.name == "rocm"


def test_reasons_are_specific():
    sel = select_backend(platform=PlatformInfo.from_assume("vendor=cuda,capability=12.0,triton=0"))
    by = sel.candidates_by_name()
    assert by["cuda"].availability.reasons == ("needs CUDA capability 9.x or 10.x; found 12.0", "triton is not installed")
    assert by["sm12x"].availability.reasons == ("triton is not installed",)
    assert sel.name == "torch"


def test_explicit_unavailable_request_raises_with_reasons_and_auto_pick():
    with pytest.raises(BackendUnavailableError) as info:
        select_backend("cuda", PlatformInfo.from_assume("vendor=cuda,capability=12.0"))
    msg = str(info.value)
    assert "needs CUDA capability 9.x or 10.x; found 12.0" in msg and "would pick 'sm12x'" in msg


def test_explicit_unknown_request_raises():
    with pytest.raises(BackendNotFoundError, match="'nope'.*registered: cuda, .*torch, xpu.*would pick 'torch'"):
        select_backend("nope", PlatformInfo.from_assume("vendor=cpu"))


def test_env_request_is_explicit(monkeypatch):
    monkeypatch.setenv("SWA_HAL_BACKEND", "rocm")
    with pytest.raises(BackendUnavailableError, match="requested by SWA_HAL_BACKEND"):
        select_backend(platform=PlatformInfo.from_assume("vendor=cpu"))
    monkeypatch.setenv("SWA_HAL_BACKEND", "torch")
    sel = select_backend(platform=PlatformInfo.from_assume("vendor=cuda,capability=9.0"))
    assert (sel.name, sel.how) == ("torch", "SWA_HAL_BACKEND")


def test_argument_beats_env(monkeypatch):
    monkeypatch.setenv("SWA_HAL_BACKEND", "nope")
    assert select_backend("torch", PlatformInfo.from_assume("vendor=cpu")).how == "argument"


def test_explain_lists_every_backend():
    text = select_backend(platform=PlatformInfo.from_assume("vendor=cuda,capability=9.0")).explain()
    assert "selected: cuda (highest priority" in text
    for name in BACKEND_PLATFORMS:
        assert name in text


def test_assume_parsing():
    p = PlatformInfo.from_assume("vendor=cuda, capability=12.1, arch=sm_121, x-custom=7")
    assert (p.vendor, p.capability, p.arch, p.get("custom"), p.synthetic) == ("cuda", (12, 1), "sm_121", "7", True)
    assert PlatformInfo.from_assume("vendor=cuda,sm=90").capability == (9, 0)
    with pytest.raises(ValueError, match="no vendor"):
        PlatformInfo.from_assume("capability=9.0")
    with pytest.raises(ValueError, match="capability"):
        PlatformInfo.from_assume("vendor=cuda,capability=nine")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        PlatformInfo.from_assume("vendor=cuda,oops")


def test_probe_of_a_cpu_device_is_cpu():
    from swa_hal import probe_platform

    p = probe_platform("cpu")
    assert p.vendor == "cpu" and not p.synthetic


def test_probing_and_availability_do_not_initialise_cuda():
    import torch

    from swa_hal import probe_platform

    registry = PluginRegistry()
    probe_platform("cpu")
    for assume in BACKEND_PLATFORMS.values():
        platform = PlatformInfo.from_assume(assume)
        for name in registry.backends:
            registry.availability(name, platform)
    assert not torch.cuda.is_initialized()


def test_equal_priority_tie_is_deterministic_and_warned():
    from fakes import plugin_module, spec

    registry = PluginRegistry(entry_points=[], env={})
    registry.register_plugin(plugin_module(spec("beta", 200, "cpu"), spec("alpha", 200, "cpu")), "twins")
    with pytest.warns(UserWarning, match="both available with priority 200"):
        assert select_backend(platform=PlatformInfo.from_assume("vendor=cpu"), registry=registry, env={}).name == "alpha"


def test_one_candidate_list_for_selection_and_reports():
    from swa_hal.selection import auto_order, build_candidates
    from swa_hal.plugins import get_registry

    platform = PlatformInfo.from_assume("vendor=cuda,capability=9.0")
    candidates = build_candidates(get_registry(), platform)
    assert [c.name for c in candidates] == sorted(c.name for c in candidates)
    sel = select_backend(platform=platform)
    assert sel.candidates == candidates
    assert [c.name for c in auto_order(candidates)] == [c.name for c in sel.auto_order()] == ["cuda", "torch"]


def test_env_flag_reads_true_words_only():
    from swa_hal.envs import env_flag

    for value in ("1", "true", " YES ", "On"):
        assert env_flag("SWA_HAL_DEBUG", {"SWA_HAL_DEBUG": value})
    for value in ("", "0", "false", "no", " OFF "):
        assert not env_flag("SWA_HAL_DEBUG", {"SWA_HAL_DEBUG": value})
    assert not env_flag("SWA_HAL_DEBUG", {})
    # Neither a true nor a false word: an error naming the variable, the value and the words, never "off".
    for value in ("2", "maybe", "ture", "-1"):
        with pytest.raises(ValueError, match=f"^SWA_HAL_DEBUG={value!r}: use one of 1, true, yes, on .* or 0, false"):
            env_flag("SWA_HAL_DEBUG", {"SWA_HAL_DEBUG": value})


def test_every_variable_read_is_listed_in_envs():
    """swa_hal/envs.py lists every variable the package reads: reading another is a programming error, and
    no module reads the environment for a SWA_HAL_ name by itself."""
    import pathlib
    import re

    from swa_hal import envs

    with pytest.raises(KeyError, match="X is not a variable swa_hal reads"):
        envs.env_flag("X", {"X": "1"})
    with pytest.raises(ValueError, match="SWA_HAL_GUARD='maybe'"):
        envs.env_switch("SWA_HAL_GUARD", {"SWA_HAL_GUARD": "maybe"})
    root = pathlib.Path(envs.__file__).parent
    named = set()
    for path in root.rglob("*.py"):
        text = path.read_text()
        named |= set(re.findall(r"SWA_HAL_[A-Z_]+[A-Z]", text))
        if path.name != "envs.py":
            assert not re.search(r"environ(\.get)?\(?\[?[\"']SWA_HAL_", text), path
    # The project's own tooling variables are named too (so that they are not warned about as unknown).
    assert named <= set(envs.VARIABLES) | envs.TOOLING_VARIABLES, named - set(envs.VARIABLES)


class _UnnamedAcme:
    """Backend classes of a vendor package that set no ``name`` of their own (the trap: the inherited one)."""

    @staticmethod
    def module(monkeypatch):
        import sys
        import types

        from swa_hal.torch_backend import TorchBackend
        from swa_hal.triton_backend import TritonBackend

        mod = types.ModuleType("acme_unnamed_backends")

        class AcmeTorch(TorchBackend):
            pass

        class AcmeTriton(TritonBackend):
            def __init__(self, config, device, platform):
                super().__init__(config, device, platform)
                self.name_in_init = self.name

        mod.AcmeTorch, mod.AcmeTriton = AcmeTorch, AcmeTriton
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
        return mod


def _acme_registry(factory, **kw):
    from fakes import plugin_module, spec

    registry = PluginRegistry(entry_points=[], env={})
    registry.register_plugin(plugin_module(spec(factory=f"acme_unnamed_backends:{factory}", **kw)), "acme")
    return registry


def test_a_backend_is_named_after_its_spec_whatever_its_class_says(monkeypatch):
    from swa_hal import SWAConfig, SWAMetadataBuilder

    mod = _UnnamedAcme.module(monkeypatch)
    acme = PlatformInfo.from_assume("vendor=acme")
    for factory in ("AcmeTorch", "AcmeTriton"):
        registry = _acme_registry(factory, kernels="triton")
        builder = SWAMetadataBuilder(SWAConfig(max_num_batched_tokens=16), registry=registry, platform=acme)
        assert builder.backend_name == builder.backend.name == "acme", factory
        assert builder.backend.fell_back_from == ()
    assert builder.backend.name_in_init == "acme"  # already named while its own __init__ runs
    assert mod.AcmeTorch.name == "torch" and mod.AcmeTriton.name == "triton"  # the classes are untouched


def test_a_backend_that_fails_to_start_is_named_after_its_spec_in_the_error(monkeypatch):
    from swa_hal import SWAConfig, SWAMetadataBuilder

    _UnnamedAcme.module(monkeypatch)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    registry = _acme_registry("AcmeTriton", kernels="triton")
    with pytest.raises(BackendUnavailableError, match="backend 'acme' runs Triton kernels"):
        SWAMetadataBuilder(SWAConfig(), backend="acme", registry=registry, platform=PlatformInfo.from_assume("vendor=acme"))


def test_a_factory_function_makes_a_backend_named_after_its_spec(monkeypatch):
    from swa_hal import SWAConfig, SWAMetadataBuilder

    mod = _UnnamedAcme.module(monkeypatch)
    mod.make = lambda config, device, platform: mod.AcmeTorch(config, device, platform)
    registry = _acme_registry("make")
    builder = SWAMetadataBuilder(SWAConfig(), registry=registry, platform=PlatformInfo.from_assume("vendor=acme"))
    assert builder.backend_name == "acme"
