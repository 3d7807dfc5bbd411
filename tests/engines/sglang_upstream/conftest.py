"""SGLang's own unit tests of the ops swa_hal replaces, copied from SGLang's repository (each file's header names
its upstream path and commit, and what was changed), run by ``make test-sglang`` in two sessions of their own:

- ``SWA_HAL_SGLANG=0``: SGLang's plugin loader runs and swa_hal's entry point installs nothing, so the tests run
  against SGLang's own ops;
- ``SGLANG_PLUGINS=swa_hal``: SGLang's plugin loader applies swa_hal's hooks, so every call of a hooked entry
  point (``window_layout``, the DeepSeek-V4 backends' ``get_dspark_swa_page_indices`` and
  ``make_core_attn_metadata``, ROCm's ``get_swa_page_indices``, ``BuildCausalSwaPageIndices.execute``,
  ``BuildDsparkSwaRingIndices.execute``) is served by swa_hal.

Like every SGLang process, the session runs SGLang's loader (``sglang.srt.plugins.load_plugins``) before any
test; this file checks that the hooks are applied in the second session and absent in the first. The tests
listed in ``THROUGH_SWA_HAL`` call a hooked entry point: each must reach swa_hal in the second session and
must not in the first. Run this folder on its own: ``tests/engines/test_sglang.py`` puts SGLang's own functions
back when it ends.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

import pytest
import sglang.srt.plugins as sgl_plugins
from sglang.srt.plugins.hook_registry import HookRegistry

from swa_hal.integrations import _common
from swa_hal.integrations import sglang as integ

SWAPPED = _common.enabled(integ.SWITCH)

# The tests that call a hooked entry point and pass on SGLang 0.5.23 (node ids below this folder).
THROUGH_SWA_HAL = {
    "test_dspark_hip_backend_metadata.py::TestDsparkDraftBlockWindowHip::test_block_window_differs_from_the_causal_verify_window",
}



def _datasets_stand_in() -> None:
    """``sglang.test.test_utils`` (the upstream tests' ``CustomTestCase``) imports SGLang's benchmark datasets,
    one of which binds ``datasets.load_dataset`` at import. The Hugging Face ``datasets`` package (and its
    pyarrow and pandas) is not in this environment and nothing here loads a data set: the stand-in holds that
    one name, which raises if called."""
    if "datasets" in sys.modules or importlib.util.find_spec("datasets") is not None:
        return

    def load_dataset(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the datasets package is not installed in make test-sglang's environment")

    module = types.ModuleType("datasets")
    module.__spec__ = importlib.machinery.ModuleSpec("datasets", None)
    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    sys.modules["datasets"] = module


_datasets_stand_in()
sgl_plugins.load_plugins()
_hooked = set(integ.TARGETS) & HookRegistry._patched
if SWAPPED:
    assert _hooked == set(integ.TARGETS), f"swa_hal's hooks not all applied: {set(integ.TARGETS) - _hooked}"
else:
    assert not _hooked, f"swa_hal is off, yet SGLang applied its hooks: {_hooked}"


def pytest_report_header(config):
    if SWAPPED:
        return f"SGLang's upstream tests with swa_hal's hooks ({len(_hooked)} applied by SGLang's plugin loader)"
    return f"SGLang's upstream tests against SGLang's own ops ({integ.SWITCH}=0: no swa_hal hook applied)"


@pytest.fixture(autouse=True)
def _swa_hal_calls(request, monkeypatch):
    """Counts the hooks' calls into swa_hal during each test; a test that goes through a hooked entry point
    must reach swa_hal when it is swapped in, and never otherwise."""
    calls = []
    real = integ.adapter_for

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(integ, "adapter_for", counted)
    yield
    node = request.node.nodeid.split("sglang_upstream/", 1)[-1]
    if node in THROUGH_SWA_HAL:
        assert bool(calls) == SWAPPED, (node, len(calls), SWAPPED)
    elif not SWAPPED:
        assert not calls, node
