"""The built-in backends run the conformance kit against themselves: every Triton backend through
the interpreter on the CPU (SM12x address-strict), the torch backend natively."""

from __future__ import annotations

import os
import re

import pytest
import torch
from helpers import BACKEND_PLATFORMS, kit_run

from swa_hal import PlatformInfo
from swa_hal.testing import BackendConformance, BackendFixtures, SelectionTests, Target, VectorTests
from swa_hal.testing.batches import KINDS
from swa_hal.testing.fixtures import cases

# The kit's grid, every config with every batch kind it allows (65 cases for each of the random-batch, plain-model,
# group-build and address topics) and its three draft-update configs, is an exhaustive sweep. On the CPU the Triton
# backends run one set of kernels (tests/helpers.py SWEPT_BACKENDS), so make test gives each of cuda, sm12x and
# rocm each config once, the kinds taken in turn from a different start per backend (every kind at least once on
# each, different cases on each), the DSpark kind on every DSpark config, and one draft config each; the rest of
# their grid, and xpu's whole grid (cuda's kernels again), are marked sweep (make test-sweep, in CI). The torch
# backend, native and quick, runs the whole grid.
SWEEP = pytest.mark.sweep
START = {"cuda": 0, "sm12x": 1, "rocm": 2}


class BuiltinConformance(BackendConformance):
    def pytest_generate_tests(self, metafunc):
        name = self.backend_name
        if "kind" in metafunc.fixturenames:
            kinds = [k for k in KINDS if k != "dspark"]
            grid = []
            for i, config_name in enumerate(self.configs):
                for case in cases({config_name: self.configs[config_name]}):
                    turn = name in START and case.values[1] in ("dspark", kinds[(i + START[name]) % len(kinds)])
                    core = name == "torch" or turn
                    grid.append(case if core else pytest.param(*case.values, id=case.id, marks=SWEEP))
            metafunc.parametrize("config_name, kind", grid)
        if "draft_config" in metafunc.fixturenames:
            drafts = [n for n in self.draft_update_configs if n in self.configs]
            metafunc.parametrize("draft_config", [
                d if name == "torch" or (name in START and i % len(drafts) == START[name] % len(drafts))
                else pytest.param(d, marks=SWEEP)
                for i, d in enumerate(drafts)
            ])


# One conformance class per built-in backend: TestTorchBackend, TestCudaBackend, TestSm12xBackend, ...
for _name in BACKEND_PLATFORMS:
    _cls = f"Test{_name.capitalize()}Backend"
    globals()[_cls] = type(_cls, (BuiltinConformance,), {"backend_name": _name})


class TorchOnAnotherPlatform(BackendFixtures):
    """A suite's own fixtures: the torch backend on an assumed XPU platform."""

    backend_name = "torch"

    @pytest.fixture
    def target(self, spec):
        return Target(PlatformInfo.from_assume("vendor=xpu"), torch.device("cpu"))


class TestTopicsOnTheirOwn(SelectionTests, VectorTests, TorchOnAnotherPlatform):
    """Only the topics that apply, over overridden fixtures."""

    def test_only_the_chosen_topics_are_collected(self, make_builder):
        names = {n for n in dir(type(self)) if n.startswith("test_")}
        assert {"test_spec_vectors", "test_availability_grid"} <= names
        assert not any("random_batches" in n or "draft_update" in n or "address" in n for n in names)
        assert make_builder(BackendConformance.configs["w5b1"]).platform.vendor == "xpu"


PROBE = """
import os
import re
def test_env():
    assert os.environ.get("TRITON_INTERPRET") == {expected!r}
"""


@pytest.mark.parametrize("flag, expected", [((), None), (("--swa-hal-interpret",), "1")])
def test_the_kit_plugin_sets_the_interpreter_only_when_asked(tmp_path, flag, expected):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = kit_run(tmp_path, "-q", *flag, str(tmp_path), files={"test_probe.py": PROBE.format(expected=expected)}, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr


BROKEN_BACKEND = """
import pytest

from swa_hal import Availability, BackendSpec, hookimpl
from swa_hal.torch_backend import TorchBackend
from swa_hal.testing import SelectionTests, VectorTests


class Broken(TorchBackend):
    def compute(self, plan, batch, buffers):
        super().compute(plan, batch, buffers)
        buffers.decode_lens.zero_()  # wrong: the worked vectors say otherwise


SPEC = BackendSpec(
    name="broken", priority=1, factory="test_broken_kit:Broken", platforms=("vendor=broken",), summary="broken",
    is_available=lambda platform: Availability(platform.vendor == "broken", ()),  # a "no" without a reason
)


class Plugin:
    @hookimpl
    def swa_hal_register_backends(self):
        return [SPEC]


class TestBroken(SelectionTests, VectorTests):
    backend_name = "broken"

    @pytest.fixture
    def registry(self, swa_hal_registry):
        swa_hal_registry.register_plugin(Plugin(), "broken")
        return swa_hal_registry
"""


def test_every_kit_failure_says_what_failed(tmp_path):
    proc = kit_run(tmp_path, "-q", "-rf", files={"test_broken_kit.py": BROKEN_BACKEND})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "3 failed" in out, out
    assert "says unavailable without a reason" in out
    assert "(W=61, B=64, a 7-token DSpark decode and a 10-token prefill): decode_swa_lens" in out, out
    assert "decode_swa_lens: the backend gives" in out and "[0, 0]" in out and "[4, 4]" in out
    assert not re.search(r"^E\s+AssertionError\s*$", out, re.M), out  # never a bare AssertionError


INTERPRETER_WARNING = """
import warnings


def test_interpreter_deprecation_is_filtered():
    warnings.warn_explicit(
        "Conversion of an array with ndim > 0 to a scalar is deprecated", DeprecationWarning,
        "interpreter.py", 1, module="triton.runtime.interpreter",
    )


def test_other_deprecations_still_show():
    warnings.warn_explicit("a deprecation of the vendor's own", DeprecationWarning, "acme.py", 1, module="acme")
"""


def test_the_kit_plugin_filters_the_interpreters_deprecation_warnings(tmp_path):
    proc = kit_run(tmp_path, "-q", files={"test_warnings.py": INTERPRETER_WARNING})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "a deprecation of the vendor's own" in out and "1 warning" in out
    assert "Conversion of an array" not in out


def test_the_kit_suite_runs_any_installed_backend_by_name(tmp_path):
    proc = kit_run(tmp_path, "-q", "--pyargs", "swa_hal.testing.suite", "--swa-hal-backend", "torch", "-k",
                    "spec_is_well_formed or factory_resolves")
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout + proc.stderr
    proc = kit_run(tmp_path, "-q", "--pyargs", "swa_hal.testing.suite", "-k", "spec_is_well_formed")
    assert proc.returncode == 1 and "pass --swa-hal-backend NAME" in proc.stdout, proc.stdout + proc.stderr


def test_every_assert_of_the_kit_has_a_message():
    import ast
    from pathlib import Path

    import swa_hal.testing

    bare = []
    for path in sorted(Path(swa_hal.testing.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assert) and node.msg is None:
                bare.append(f"{path.name}:{node.lineno}")
    assert not bare, "asserts of the kit without a message: " + ", ".join(bare)
