"""The opt-in pytest plugin of the conformance kit.

Load it with ``pytest -p swa_hal.testing.plugin`` or ``pytest_plugins = ["swa_hal.testing.plugin"]``
in a conftest.py; it is never auto-loaded. It adds:

  --swa-hal-backend NAME   the backend a conformance class without backend_name tests
  --swa-hal-expect NAME    fail the session unless auto-selection on this machine picks NAME
                           (catches a silent fallback to another backend in a vendor's CI)
  --swa-hal-interpret      run Triton kernels on the CPU: sets TRITON_INTERPRET=1 for the session,
                           before any conftest (and so triton) is imported, and restores it after

Importing or loading the plugin changes no environment variable; only ``--swa-hal-interpret`` does. It
filters the Triton interpreter's own DeprecationWarnings (``INTERPRETER_WARNINGS``), which are not about the
backend under test.

and fixtures: ``swa_hal_registry`` (a fresh registry of the installed plugins), ``swa_hal_register``
(register a plugin object for one test), ``swa_hal_platform`` (a PlatformInfo from an --assume string),
``swa_hal_entry_point`` (a fake entry point), ``swa_hal_address_strict`` (the interpreter's
address-strict mode). Tests marked ``swa_hal_requires(claim)`` are deselected for backends that do not
make that claim; the kit's ``gpu`` tests (CUDA-graph capture) are skipped, with the reason shown, on a
machine without a CUDA device.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

_INTERPRET = "TRITON_INTERPRET"
_saved_interpret: list[str | None] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("swa_hal", "swa_hal conformance kit")
    group.addoption(
        "--swa-hal-backend",
        dest="swa_hal_backend",
        default=None,
        help="backend tested by BackendConformance classes that set no backend_name",
    )
    group.addoption(
        "--swa-hal-expect",
        dest="swa_hal_expect",
        default=None,
        help="fail unless the backend auto-selection starts on this machine (fallbacks included) is this one",
    )
    group.addoption(
        "--swa-hal-interpret",
        dest="swa_hal_interpret",
        action="store_true",
        default=False,
        help="run Triton kernels on the CPU through the Triton interpreter (TRITON_INTERPRET=1)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    # The interpreter must be on before triton is imported, and conftests may import it: this hook runs
    # before any conftest is loaded (only for plugins given by -p or installed, which this one is).
    if early_config.known_args_namespace.swa_hal_interpret:
        _saved_interpret.append(os.environ.get(_INTERPRET))
        os.environ[_INTERPRET] = "1"


# The Triton interpreter (3.6) converts 1-element NumPy arrays with int(), which NumPy deprecates: one
# DeprecationWarning per launch, hundreds in a kit run, none of them about the code under test.
INTERPRETER_WARNINGS = "ignore::DeprecationWarning:triton.runtime.interpreter"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "swa_hal_requires(claim): run only for backends that make this claim")
    config.addinivalue_line("markers", "gpu: needs a GPU")
    config.addinivalue_line("filterwarnings", INTERPRETER_WARNINGS)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _saved_interpret:
        previous = _saved_interpret.pop()
        if previous is None:
            os.environ.pop(_INTERPRET, None)
        else:
            os.environ[_INTERPRET] = previous


def pytest_sessionstart(session: pytest.Session) -> None:
    expect = session.config.getoption("swa_hal_expect")
    if not expect:
        return
    import torch

    from ..config import SWAConfig
    from ..selection import select_backend

    # Start the selected backend as a builder would: a backend that is selected but fails to start
    # (a missing driver, a broken import) and falls back must turn the session red too.
    try:
        selection = select_backend()
        vendor = selection.platform.vendor
        if vendor in ("cuda", "rocm") and torch.cuda.is_available():
            device = torch.device("cuda")
        elif vendor == "xpu" and getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
            device = torch.device("xpu")
        else:
            device = torch.device("cpu")
        backend = selection.create(SWAConfig(), device)
        picked, detail = backend.name, selection.explain()
        if backend.fell_back_from:
            detail += "\nfell back: " + "; ".join(backend.fell_back_from)
    except Exception as exc:  # noqa: BLE001 - reported as the failure
        picked, detail = None, f"{type(exc).__name__}: {exc}"
    if picked != expect:
        pytest.exit(f"--swa-hal-expect {expect}: the backend that starts here is {picked!r}\n{detail}", returncode=1)


def _claims(spec: Any, backend: Any | None) -> set[str]:
    """The claims a backend makes (``requires(claim)`` tests are collected for those only)."""
    out = set()
    if spec.clamps_addresses:
        out.add("clamps_addresses")
    if spec.cuda_graphs:
        out.add("cuda_graphs")
    if backend is None or getattr(backend, "supports_draft_decode_metadata_update", False):
        out.add("draft_update")
    return out


GPU_SKIP_REASON = (
    "swa_hal kit: needs a CUDA device and this machine has none; the per-platform CI job on the row's own "
    "GPU runner runs it (docs/backends.md, Per-platform CI)"
)


def _skip_gpu_tests_without_cuda(items: list[pytest.Item], kit: type) -> None:
    """Skip the kit's ``gpu`` tests (CUDA-graph capture) where no CUDA device is present, whatever the host
    project's pytest settings: only swa_hal's own configuration deselects ``gpu`` tests, so a vendor's
    CPU CI job would otherwise run them and fail for want of a device, not for a fault of the backend."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        cls = getattr(item, "cls", None)
        if cls is not None and issubclass(cls, kit) and item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from ..plugins import get_registry
    from .fixtures import BackendFixtures

    _skip_gpu_tests_without_cuda(items, BackendFixtures)
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("swa_hal_requires")
        cls = getattr(item, "cls", None)
        if marker is None or cls is None or not issubclass(cls, BackendFixtures):
            keep.append(item)
            continue
        name = cls.backend_name or config.getoption("swa_hal_backend")
        registered = get_registry().backends.get(name) if name else None
        if registered is None:
            keep.append(item)  # the test itself reports the missing backend
            continue
        backend_cls = None
        try:
            backend_cls = registered.spec.load_factory()
        except Exception:  # noqa: BLE001 - test_factory_resolves reports it
            pass
        if marker.args[0] in _claims(registered.spec, backend_cls):
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture
def swa_hal_registry() -> Iterator[Any]:
    """A registry freshly loaded from the installed entry points, used as the process default for
    the test (and forgotten after it)."""
    from .. import plugins

    plugins.reset_registry()
    registry = plugins.get_registry()
    yield registry
    plugins.reset_registry()


@pytest.fixture
def swa_hal_register(swa_hal_registry: Any) -> Iterator[Callable[..., Any]]:
    """Register a plugin object (module or instance with hookimpls) for this test only."""
    names: list[str] = []

    def register(obj: Any, name: str = "test-plugin", **kw: Any):
        names.append(name)
        return swa_hal_registry.register_plugin(obj, name, **kw)

    yield register
    for name in names:
        swa_hal_registry.unregister_plugin(name)


@pytest.fixture
def swa_hal_platform() -> Callable[[str], Any]:
    from ..platform import PlatformInfo

    return PlatformInfo.from_assume


@pytest.fixture
def swa_hal_entry_point() -> Callable[..., Any]:
    """Make a fake entry point: ``swa_hal_entry_point("acme", module)`` or ``(..., error=ImportError())``."""

    class _Dist:
        def __init__(self, name: str, version: str):
            self.name, self.version = name, version

    class _EntryPoint:
        group = "swa_hal.backends"

        def __init__(
            self,
            name: str,
            obj: Any = None,
            *,
            error: BaseException | None = None,
            dist: str = "fake-dist",
            version: str = "0",
        ):
            self.name, self.value = name, f"{name}:plugin"
            self.dist = _Dist(dist, version)
            self._obj, self._error = obj, error

        def load(self) -> Any:
            if self._error is not None:
                raise self._error
            return self._obj

    return _EntryPoint


@pytest.fixture
def swa_hal_address_strict() -> Iterator[None]:
    from .interpreter import address_strict

    with address_strict():
        yield
