"""Plugin faults: the host keeps working and says what happened; strict mode raises."""

from __future__ import annotations

import types

import pytest

from fakes import FakeEntryPoint, builtin_entry_points, plugin_module, spec, with_hook
from swa_hal import BackendSpec, PlatformInfo, PluginError, SWAConfig, SWAMetadataBuilder, select_backend
from swa_hal.plugins import PluginRegistry, PluginWarning

ACME = PlatformInfo.from_assume("vendor=acme")


def registry(eps, env=None, **kw):
    return PluginRegistry(entry_points=list(builtin_entry_points()) + eps, env=env or {}, **kw)


def test_builtins_are_registered_through_entry_points():
    reg = registry([])
    assert set(reg.backends) == {"torch", "cuda", "sm12x", "rocm", "xpu"}
    assert {p.status for p in reg.plugins} == {"active"}
    assert {p.dist for p in reg.plugins} == {"swa-hal"}


def test_a_working_third_party_plugin_is_selected_on_its_platform():
    reg = registry([FakeEntryPoint("acme", plugin_module(spec()))])
    assert select_backend(platform=ACME, registry=reg, env={}).name == "acme"
    assert select_backend(platform=PlatformInfo.from_assume("vendor=cpu"), registry=reg, env={}).name == "torch"


def test_import_error_is_skipped_with_a_warning_naming_the_distribution():
    bad = FakeEntryPoint("broken", error=ImportError("No module named 'acme_runtime'"), dist="acme-broken")
    with pytest.warns(PluginWarning, match=r"plugin 'broken' \(acme-broken 1.0\) failed to load.*acme_runtime"):
        reg = registry([bad])
    record = next(p for p in reg.plugins if p.name == "broken")
    assert record.status == "failed" and "ImportError" in record.detail
    assert select_backend(platform=PlatformInfo.from_assume("vendor=cpu"), registry=reg, env={}).name == "torch"


def test_any_exception_at_import_is_contained():
    bad = FakeEntryPoint("crashy", error=ZeroDivisionError("boom"))
    with pytest.warns(PluginWarning, match="ZeroDivisionError: boom"):
        reg = registry([bad])
    assert "torch" in reg.backends


@pytest.mark.parametrize("exc", [SystemExit(3), GeneratorExit()], ids=["SystemExit", "GeneratorExit"])
def test_base_exceptions_at_import_are_contained(exc):
    bad = FakeEntryPoint("quitter", error=exc, dist="acme-quitter")
    with pytest.warns(PluginWarning, match=rf"plugin 'quitter' \(acme-quitter 1.0\) failed to load.*{type(exc).__name__}"):
        reg = registry([bad])
    assert next(p for p in reg.plugins if p.name == "quitter").status == "failed"
    assert "torch" in reg.backends


def test_keyboard_interrupt_at_import_still_stops_the_host():
    with pytest.raises(KeyboardInterrupt):
        registry([FakeEntryPoint("ctrl_c", error=KeyboardInterrupt())])


def test_strict_mode_raises_on_import_error():
    bad = FakeEntryPoint("broken", error=ImportError("nope"))
    with pytest.raises(PluginError, match="broken.*SWA_HAL_STRICT=1"):
        registry([bad], env={"SWA_HAL_STRICT": "1"})


def test_probe_raising_counts_as_unavailable():
    def explode(platform):
        raise RuntimeError("driver went away")

    reg = registry([FakeEntryPoint("acme", plugin_module(spec(is_available=explode)))])
    with pytest.warns(PluginWarning, match="is_available of backend 'acme' raised RuntimeError: driver went away"):
        sel = select_backend(platform=ACME, registry=reg, env={})
    assert sel.name == "torch"
    assert "availability probe raised RuntimeError" in sel.candidates_by_name()["acme"].availability.reasons[0]


def test_probe_raising_in_strict_mode_raises():
    def explode(platform):
        raise RuntimeError("driver went away")

    reg = registry([FakeEntryPoint("acme", plugin_module(spec(is_available=explode)))], strict=True)
    with pytest.raises(PluginError, match="driver went away"):
        select_backend(platform=ACME, registry=reg, env={})


def test_factory_raising_falls_back_when_auto_and_raises_when_explicit(monkeypatch):
    mod = types.ModuleType("acme_factory_mod")

    class Boom:
        def __init__(self, *a):
            raise RuntimeError("no acme device handle")

    mod.Boom = Boom
    monkeypatch.setitem(__import__("sys").modules, "acme_factory_mod", mod)
    reg = registry([FakeEntryPoint("acme", plugin_module(spec(vendor="cpu", factory="acme_factory_mod:Boom")))])
    cfg = SWAConfig(max_num_batched_tokens=16)
    with pytest.warns(PluginWarning, match="backend 'acme' .* failed to start: RuntimeError: no acme device handle"):
        builder = SWAMetadataBuilder(cfg, registry=reg, platform=PlatformInfo.from_assume("vendor=cpu"))
    assert builder.backend_name == "torch"
    from swa_hal import BackendUnavailableError

    with pytest.raises(BackendUnavailableError, match="no acme device handle"):
        SWAMetadataBuilder(cfg, backend="acme", registry=reg, platform=PlatformInfo.from_assume("vendor=cpu"))


def swa_hal_register_backendz():
    """A misspelled hook."""
    return []


def test_unknown_hook_is_reported():
    mod = with_hook(plugin_module(spec()), swa_hal_register_backendz)
    with pytest.warns(PluginWarning, match="implements unknown hook 'swa_hal_register_backendz'"):
        reg = registry([FakeEntryPoint("acme", mod)])
    assert "acme" in reg.backends  # its valid hook still counts


def test_unknown_hook_in_strict_mode_raises():
    mod = with_hook(types.ModuleType("typo"), swa_hal_register_backendz)
    with pytest.raises(PluginError, match="unknown hook"):
        registry([FakeEntryPoint("typo", mod)], env={"SWA_HAL_STRICT": "1"})


def test_hook_raising_is_contained():
    def swa_hal_register_backends():
        raise KeyError("config missing")

    mod = with_hook(types.ModuleType("raiser"), swa_hal_register_backends)
    with pytest.warns(PluginWarning, match="swa_hal_register_backends raised KeyError"):
        reg = registry([FakeEntryPoint("raiser", mod)])
    assert next(p for p in reg.plugins if p.name == "raiser").status == "failed"


def test_hook_with_arguments_the_spec_lacks_is_rejected_by_pluggy():
    def swa_hal_register_backends(config):
        return []

    mod = with_hook(types.ModuleType("wrong_signature"), swa_hal_register_backends)
    with pytest.warns(PluginWarning, match=r"plugin 'wrong' .* could not be registered: PluginValidationError"):
        reg = registry([FakeEntryPoint("wrong", mod)])
    assert next(p for p in reg.plugins if p.name == "wrong").status == "failed"


def test_keyboard_interrupt_in_a_hook_still_stops_the_host():
    def swa_hal_register_backends():
        raise KeyboardInterrupt

    mod = with_hook(types.ModuleType("interrupted"), swa_hal_register_backends)
    with pytest.raises(KeyboardInterrupt):
        registry([FakeEntryPoint("interrupted", mod)])


def test_hook_calling_sys_exit_is_contained():
    def swa_hal_register_backends():
        raise SystemExit("vendor SDK called exit()")

    mod = with_hook(types.ModuleType("exiter"), swa_hal_register_backends)
    with pytest.warns(PluginWarning, match=r"plugin 'exiter' \(acme-swa 1.0\): swa_hal_register_backends raised SystemExit"):
        reg = registry([FakeEntryPoint("exiter", mod), FakeEntryPoint("acme", plugin_module(spec()))])
    assert next(p for p in reg.plugins if p.name == "exiter").status == "failed"
    assert "acme" in reg.backends  # the plugin registered after it still declares its backends


def test_plugins_are_registered_with_pluggy_and_the_block_list_uses_it():
    reg = registry([FakeEntryPoint("acme", plugin_module(spec()))], env={"SWA_HAL_DISABLE_PLUGINS": "rocm"})
    assert reg.pm.get_plugin("acme") is not None and reg.pm.get_plugin("torch") is not None
    assert reg.pm.is_blocked("rocm") and reg.pm.get_plugin("rocm") is None
    declared = [s.name for result in reg.pm.hook.swa_hal_register_backends() for s in result]
    assert sorted(declared) == sorted(reg.backends)
    reg.pm.check_pending()  # every hook of every registered plugin has a spec


def test_two_plugins_with_unknown_hooks_are_both_reported():
    def typo_module(name):
        return with_hook(plugin_module(spec(name=name), name=name), swa_hal_register_backendz)

    with pytest.warns(PluginWarning, match="unknown hook") as record:
        reg = registry([FakeEntryPoint("one", typo_module("one")), FakeEntryPoint("two", typo_module("two"))])
    assert sum("unknown hook" in str(w.message) for w in record) == 2
    assert {"one", "two"} <= set(reg.backends)


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ("not a spec", "yielded str, not a BackendSpec"),
        (BackendSpec(name="Acme!", priority=1, factory="m:a", is_available=lambda p: None), "name 'Acme!'"),
        (BackendSpec(name="acme", priority="high", factory="m:a", is_available=lambda p: None), "priority 'high'"),
        (BackendSpec(name="acme", priority=1, factory="m.a", is_available=lambda p: None), "factory 'm.a'"),
        (BackendSpec(name="acme", priority=1, factory="m:a", is_available=None), "is_available must be callable"),
        (BackendSpec(name="acme", priority=1, factory="m:a", is_available=lambda p: None, api_version=99), "api_version 99"),
    ],
)
def test_malformed_spec_is_skipped(bad, fragment):
    with pytest.warns(PluginWarning, match="malformed|not a BackendSpec") as record:
        reg = registry([FakeEntryPoint("acme", plugin_module(bad))])
    assert "acme" not in reg.backends
    assert any(fragment in str(w.message) for w in record)


def test_duplicate_name_keeps_the_builtin_and_names_both_distributions():
    clash = FakeEntryPoint("evil", plugin_module(spec(name="cuda")), dist="evil-cuda", version="6.6")
    with pytest.warns(PluginWarning, match=r"'cuda' is provided by both plugin 'cuda' \(swa-hal .*\) and plugin 'evil' \(evil-cuda 6.6\)"):
        reg = registry([clash])
    assert reg.backends["cuda"].plugin.dist == "swa-hal"
    assert next(p for p in reg.plugins if p.name == "evil").status == "conflict"


def test_duplicate_between_third_parties_keeps_the_first_by_entry_point_name():
    a = FakeEntryPoint("a_acme", plugin_module(spec()), dist="acme-a")
    b = FakeEntryPoint("b_acme", plugin_module(spec()), dist="acme-b")
    with pytest.warns(PluginWarning, match="acme-a"):
        reg = registry([b, a])
    assert reg.backends["acme"].plugin.dist == "acme-a"


def test_duplicate_in_strict_mode_raises():
    clash = FakeEntryPoint("evil", plugin_module(spec(name="torch")), dist="evil")
    with pytest.raises(PluginError, match="'torch' is provided by both"):
        registry([clash], env={"SWA_HAL_STRICT": "1"})


def test_block_list_blocks_and_allow_list_allows():
    acme = FakeEntryPoint("acme", plugin_module(spec()))
    reg = registry([acme], env={"SWA_HAL_DISABLE_PLUGINS": "acme,rocm"})
    assert "acme" not in reg.backends and "rocm" not in reg.backends
    assert next(p for p in reg.plugins if p.name == "acme").status == "blocked"
    reg = registry([FakeEntryPoint("acme", plugin_module(spec()))], env={"SWA_HAL_PLUGINS": "acme,torch"})
    assert set(reg.backends) == {"acme", "torch"}
    assert next(p for p in reg.plugins if p.name == "cuda").detail == "not listed in SWA_HAL_PLUGINS"


def test_unknown_names_in_env_lists_warn():
    with pytest.warns(PluginWarning, match="SWA_HAL_DISABLE_PLUGINS names 'acmee'"):
        registry([], env={"SWA_HAL_DISABLE_PLUGINS": "acmee"})
    with pytest.warns(PluginWarning, match="SWA_HAL_PLUGINS names 'nvidia'"):
        registry([], env={"SWA_HAL_PLUGINS": "nvidia,torch"})


def test_torch_is_embedded_when_its_entry_point_is_missing():
    reg = PluginRegistry(entry_points=[], env={})
    assert set(reg.backends) == {"torch"}
    assert reg.plugins[0].status == "embedded"
    assert select_backend(platform=PlatformInfo.from_assume("vendor=cuda,capability=9.0"), registry=reg, env={}).name == "torch"


def test_torch_is_not_embedded_when_blocked():
    reg = PluginRegistry(entry_points=[], env={"SWA_HAL_DISABLE_PLUGINS": "torch"})
    assert reg.backends == {}
    from swa_hal import BackendUnavailableError

    with pytest.raises(BackendUnavailableError, match="no backend is available"):
        select_backend(platform=PlatformInfo.from_assume("vendor=cpu"), registry=reg, env={})


def test_explicit_request_for_a_blocked_backend_is_not_found():
    from swa_hal import BackendNotFoundError

    reg = registry([], env={"SWA_HAL_DISABLE_PLUGINS": "sm12x"})
    with pytest.raises(BackendNotFoundError, match="'sm12x'"):
        select_backend("sm12x", PlatformInfo.from_assume("vendor=cuda,capability=12.0"), registry=reg, env={})


def test_non_auto_backend_needs_an_explicit_request():
    reg = registry([FakeEntryPoint("acme", plugin_module(spec(vendor="cpu", auto_select=False)))])
    assert select_backend(platform=PlatformInfo.from_assume("vendor=cpu"), registry=reg, env={}).name == "torch"
    assert select_backend("acme", PlatformInfo.from_assume("vendor=cpu"), registry=reg, env={}).name == "acme"
