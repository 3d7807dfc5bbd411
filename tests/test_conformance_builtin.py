"""The built-in backends run the conformance kit against themselves: every Triton backend through
the interpreter on the CPU (SM12x address-strict), the torch backend natively."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from swa_hal import PlatformInfo
from swa_hal.testing import BackendConformance, BackendFixtures, SelectionTests, Target, VectorTests


class TestTorchBackend(BackendConformance):
    backend_name = "torch"


class TestCudaBackend(BackendConformance):
    backend_name = "cuda"


class TestSm12xBackend(BackendConformance):
    backend_name = "sm12x"


class TestRocmBackend(BackendConformance):
    backend_name = "rocm"


class TestXpuBackend(BackendConformance):
    backend_name = "xpu"


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
def test_env():
    assert os.environ.get("TRITON_INTERPRET") == {expected!r}
"""


@pytest.mark.parametrize("flag, expected", [((), None), (("--swa-hal-interpret",), "1")])
def test_the_kit_plugin_sets_the_interpreter_only_when_asked(tmp_path, flag, expected):
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(PROBE.format(expected=expected)))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "swa_hal.testing.plugin", *flag, str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
