"""A backend that fails to start (its factory or its allocate() raises) is isolated like a plugin that fails
to load: auto-selection falls back with one warning; an explicit request or strict mode raises
BackendStartError naming the backend and chaining the cause; KeyboardInterrupt still stops the host."""

from __future__ import annotations

import sys
import types
import warnings

import pytest

from fakes import plugin_module, spec
from swa_hal import (
    AttentionBatch,
    BackendStartError,
    BackendUnavailableError,
    PlatformInfo,
    SWAConfig,
    SWAHalError,
    SWAMetadataBuilder,
)
from swa_hal.plugins import PluginRegistry, PluginWarning
from swa_hal.torch_backend import TorchBackend

CPU = PlatformInfo.from_assume("vendor=cpu")
CONFIG = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=4)
MODULE = "acme_isolation_backends"


class VendorAbort(BaseException):
    """A vendor SDK's own BaseException subclass (neither Exception nor SystemExit)."""


# Each kind of failure, made fresh per call (an exception instance is raised once per test).
FAILURES = {
    "RuntimeError": lambda: RuntimeError("no acme device handle"),
    "SystemExit": lambda: SystemExit("acme SDK called exit()"),
    "VendorAbort": lambda: VendorAbort("acme runtime aborted"),
}
WHERE = ["factory", "allocate"]


def _module(monkeypatch, raising):
    """A module with AcmeBackend, a TorchBackend whose __init__ (``raising["factory"]``) or allocate()
    (``raising["allocate"]``) raises; allocate calls are counted."""
    mod = types.ModuleType(MODULE)
    mod.allocations = []

    class AcmeBackend(TorchBackend):
        def __init__(self, config, device, platform):
            if raising.get("factory") is not None:
                raise raising["factory"]()
            super().__init__(config, device, platform)

        def allocate(self, buffers):
            mod.allocations.append(self.name)
            if raising.get("allocate") is not None:
                raise raising["allocate"]()
            super().allocate(buffers)

    mod.AcmeBackend = AcmeBackend
    monkeypatch.setitem(sys.modules, MODULE, mod)
    return mod


def _registry(*, embedded=True):
    """The embedded torch backend (priority 0) and acme (priority 300), both available on the CPU."""
    registry = PluginRegistry(entry_points=[], env={}, embedded_default=embedded)
    acme = spec("acme", vendor="cpu", factory=f"{MODULE}:AcmeBackend")
    registry.register_plugin(plugin_module(acme), "acme", dist="acme-swa", version="1.0")
    return registry


def _start(registry, **kw):
    """A builder, and the PluginWarnings raised while it started."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        builder = SWAMetadataBuilder(CONFIG, platform=CPU, registry=registry, **kw)
    return builder, [w for w in caught if issubclass(w.category, PluginWarning)]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("kind", list(FAILURES))
def test_auto_selection_falls_back_with_one_warning(monkeypatch, where, kind):
    mod = _module(monkeypatch, {where: FAILURES[kind]})
    builder, caught = _start(_registry())
    assert builder.backend_name == "torch"
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert message.startswith("backend 'acme' (acme-swa) failed to start: "), message
    assert f"{kind}: {str(FAILURES[kind]())}" in message
    assert ("allocate() raised" in message) == (where == "allocate")
    assert len(builder.backend.fell_back_from) == 1 and "backend 'acme'" in builder.backend.fell_back_from[0]
    assert mod.allocations == (["acme"] if where == "allocate" else [])
    # The backend that did start was allocated and builds.
    batch = AttentionBatch.from_lists([3, 5], [1, 5], [[0], [1, 2]], block_size=4)
    md = builder.build(batch)
    assert md.decode_swa_lens.tolist() == [3]  # the decode at position 2 sees positions 0..2


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("kind", list(FAILURES))
@pytest.mark.parametrize("request_by", ["argument", "SWA_HAL_BACKEND", "SWA_HAL_STRICT"])
def test_an_explicit_or_strict_start_failure_raises_backend_start_error(monkeypatch, where, kind, request_by):
    _module(monkeypatch, {where: FAILURES[kind]})
    kw = {}
    if request_by == "argument":
        kw["backend"] = "acme"
    elif request_by == "SWA_HAL_BACKEND":
        monkeypatch.setenv("SWA_HAL_BACKEND", "acme")
    else:
        monkeypatch.setenv("SWA_HAL_STRICT", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PluginWarning)  # no fallback warning either: nothing falls back
        with pytest.raises(BackendStartError) as info:
            SWAMetadataBuilder(CONFIG, platform=CPU, registry=_registry(), **kw)
    error = info.value
    assert isinstance(error, BackendUnavailableError) and isinstance(error, SWAHalError)
    assert str(error).startswith("backend 'acme' (acme-swa) failed to start: "), str(error)
    assert f"{kind}: {str(FAILURES[kind]())}" in str(error)
    assert ("SWA_HAL_STRICT=1: no fallback" if request_by == "SWA_HAL_STRICT" else f"requested by {request_by}") in str(
        error
    )
    assert type(error.__cause__).__name__ == kind


@pytest.mark.parametrize("where", WHERE)
def test_no_backend_could_start(monkeypatch, where):
    _module(monkeypatch, {where: FAILURES["RuntimeError"]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginWarning)
        with pytest.raises(BackendStartError, match=r"^no backend could start:\n  backend 'acme'") as info:
            SWAMetadataBuilder(CONFIG, platform=CPU, registry=_registry(embedded=False))
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("explicit", [False, True], ids=["auto", "explicit"])
def test_keyboard_interrupt_propagates(monkeypatch, where, explicit):
    _module(monkeypatch, {where: KeyboardInterrupt})
    with pytest.raises(KeyboardInterrupt):
        SWAMetadataBuilder(CONFIG, platform=CPU, registry=_registry(), backend="acme" if explicit else None)


def test_a_backend_that_starts_is_allocated_once(monkeypatch):
    mod = _module(monkeypatch, {})
    builder, caught = _start(_registry())
    assert builder.backend_name == "acme" and caught == []
    assert mod.allocations == ["acme"]
    assert builder.backend.fell_back_from == ()


def test_the_cli_reports_a_start_failure_as_one_line_and_exit_code_2(monkeypatch, capsys):
    from helpers import CONFIGS
    from swa_hal import plugins
    from swa_hal.cli import main

    _module(monkeypatch, {"allocate": FAILURES["SystemExit"]})
    monkeypatch.setattr(plugins, "_default", _registry())
    code = main(["build", "--config", str(CONFIGS / "tiny.yaml"), "--batch", str(CONFIGS / "batches" / "tiny_mixed.yaml"),
                 "--backend", "acme"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "backend 'acme' (acme-swa) failed to start: allocate() raised SystemExit: acme SDK called exit()" in err


def test_info_expect_sees_an_allocate_failure(monkeypatch, capsys):
    # swa-hal info --expect starts the backend as a builder would, allocate() included.
    from swa_hal import plugins
    from swa_hal.cli import main

    _module(monkeypatch, {"allocate": FAILURES["RuntimeError"]})
    monkeypatch.setattr(plugins, "_default", _registry())
    code = main(["info", "--assume", "vendor=cpu", "--expect", "acme"])
    captured = capsys.readouterr()
    assert code == 1
    assert "expected backend 'acme', selected 'acme' but it failed to start, so 'torch' runs" in captured.out
    assert "swa-hal: warning: backend 'acme' (acme-swa) failed to start: allocate() raised RuntimeError" in captured.err
