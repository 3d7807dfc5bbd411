"""The out-of-tree example plugin: a real distribution with a real entry point, installed into the
test environment by `make test`; and a broken variant of it, which must be reported and skipped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT
from swa_hal import PlatformInfo, select_backend
from swa_hal.plugins import get_registry

EXAMPLE = ROOT / "examples" / "swa-hal-example-backend"
SWA_HAL = [sys.executable, "-m", "swa_hal.cli"]


def test_example_is_installed_and_registered_through_its_entry_point():
    registry = get_registry()
    assert "example" in registry.backends, "run `make test` (it pip-installs examples/swa-hal-example-backend)"
    record = registry.backends["example"].plugin
    assert (record.name, record.dist, record.status) == ("example", "swa-hal-example-backend", "active")
    assert select_backend(platform=PlatformInfo.from_assume("vendor=example")).name == "example"


def test_info_lists_the_example_with_distribution_and_version():
    proc = subprocess.run(SWA_HAL + ["info", "--json", "--assume", "vendor=example"], capture_output=True, text=True,
                          timeout=120)
    data = json.loads(proc.stdout)
    plugin = next(p for p in data["plugins"] if p["name"] == "example")
    assert (plugin["dist"], plugin["version"], plugin["status"]) == ("swa-hal-example-backend", "0.1.0", "active")
    assert data["selected"] == "example"


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory):
    """pip-install a broken copy of the example (its plugin imports a module that does not exist)."""
    src = tmp_path_factory.mktemp("broken-src") / "pkg"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("tests", "*.egg-info", "build", "__pycache__"))
    pyproject = (src / "pyproject.toml").read_text()
    pyproject = pyproject.replace('name = "swa-hal-example-backend"', 'name = "swa-hal-example-broken"')
    pyproject = pyproject.replace('example = "swa_hal_example"', 'example_broken = "swa_hal_example_broken"')
    pyproject = pyproject.replace('version = "0.1.0"', 'version = "0.0.1"')
    (src / "pyproject.toml").write_text(pyproject)
    pkg = src / "src" / "swa_hal_example_broken"
    (src / "src" / "swa_hal_example").rename(pkg)
    init = pkg / "__init__.py"
    init.write_text("import acme_runtime_that_is_not_installed  # the vendor SDK is missing\n" + init.read_text())
    site = tmp_path_factory.mktemp("broken-site")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return site


def _info(site, *extra, strict=False):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    env.pop("SWA_HAL_STRICT", None)
    if strict:
        env["SWA_HAL_STRICT"] = "1"
    return subprocess.run(SWA_HAL + ["info", *extra], capture_output=True, text=True, env=env, timeout=120)


def test_broken_variant_is_reported_and_skipped(broken_site):
    proc = _info(broken_site, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    broken = next(p for p in data["plugins"] if p["name"] == "example_broken")
    assert broken["status"] == "failed"
    assert (broken["dist"], broken["version"]) == ("swa-hal-example-broken", "0.0.1")
    assert "acme_runtime_that_is_not_installed" in broken["detail"]
    assert data["selected"] == "torch"
    assert "swa-hal-example-broken" in proc.stderr  # the warning names the distribution
    example = next(p for p in data["plugins"] if p["name"] == "example")
    assert example["status"] == "active"  # the working plugin still loads


def test_broken_variant_in_strict_mode_fails_loudly(broken_site):
    proc = _info(broken_site, strict=True)
    assert proc.returncode == 2
    assert "example_broken" in proc.stderr and "SWA_HAL_STRICT=1" in proc.stderr
