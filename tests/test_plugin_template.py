"""The plugin template (examples/swa-hal-example-backend) used as docs/backends.md tells a vendor to: copied
without the build leftovers its .gitignore names, renamed to the vendor's package, built into a wheel that
holds that package and nothing else, and installed into a fresh environment (no system site-packages) with
swa_hal installed from a path, as swa_hal is not on the package index; there its conformance kit passes.

The fresh environment takes a minute or two (torch, swa_hal's test tools, the plugin), hence ``slow``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from helpers import ROOT

TEMPLATE = ROOT / "examples" / "swa-hal-example-backend"
TORCH = os.environ.get("SWA_HAL_TEMPLATE_TORCH", "torch==2.13.0")  # the CPU build on this project's machines


def template_ignores() -> list[str]:
    """The template's .gitignore patterns: what a copy of the template must leave out."""
    lines = (TEMPLATE / ".gitignore").read_text().splitlines()
    return [line.strip().rstrip("/") for line in lines if line.strip() and not line.startswith("#")]


def copy_template(dest: Path) -> Path:
    """Copy the template's files as `git archive` of a clone would (build leftovers excluded), then rename
    the package as a vendor does: distribution swa-hal-acme, import package swa_hal_acme."""
    shutil.copytree(TEMPLATE, dest, ignore=shutil.ignore_patterns(*template_ignores()))
    (dest / "src" / "swa_hal_example").rename(dest / "src" / "swa_hal_acme")
    for path in dest.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".toml", ".md"):
            text = path.read_text()
            text = text.replace("swa-hal-example-backend", "swa-hal-acme").replace("swa_hal_example", "swa_hal_acme")
            path.write_text(text)
    return dest


def _run(cmd: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_ADDOPTS")}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


def test_template_ignores_its_build_leftovers():
    ignored = set(template_ignores())
    assert {"build", "dist", "*.egg-info", "__pycache__"} <= ignored, (
        "examples/swa-hal-example-backend/.gitignore must name build/, dist/, *.egg-info/ and __pycache__/, "
        "so neither a clone nor a copy of the template carries the example's build leftovers"
    )


def test_a_copy_of_the_template_builds_a_wheel_of_the_vendor_package_only(tmp_path):
    plugin = copy_template(tmp_path / "swa-hal-acme")
    # The example's own leftovers, as any `make` target leaves them, must not be in a copy.
    leftovers = [p.name for p in plugin.rglob("*") if p.name == "build" or p.name.endswith(".egg-info")]
    assert not leftovers, f"the copy of the template carries build leftovers: {leftovers}"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(plugin),
        ],
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert packages == {"swa_hal_acme"}, f"the vendor's wheel holds {sorted(packages)}: {names}"


def _swa_hal_source(dest: Path) -> Path:
    """What building swa_hal reads, copied, so the install writes nothing into this checkout."""
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("swa_hal", "backends"):
        shutil.copytree(ROOT / name, dest / name, ignore=skip)
    return dest


@pytest.mark.slow
def test_the_template_passes_the_kit_in_a_fresh_environment(tmp_path):
    plugin = copy_template(tmp_path / "swa-hal-acme")
    source = _swa_hal_source(tmp_path / "swa_hal")
    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q"]
    # The order docs/backends.md gives: torch, then swa_hal from a path with the kit's tools, then the plugin,
    # whose plain "swa-hal" requirement the installed swa_hal satisfies.
    _run([*pip, TORCH], cwd=tmp_path)
    _run([*pip, f"{source}[test]"], cwd=tmp_path)
    _run([*pip, "-e", str(plugin)], cwd=tmp_path)
    _run([python, "-m", "swa_hal.cli", "info", "--assume", "vendor=example", "--expect", "example"], cwd=plugin)
    proc = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=plugin)
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    # The whole kit is well over a hundred tests for this backend: fewer means the kit itself did not run.
    assert passed and int(passed.group(1)) > 100 and "failed" not in summary and "error" not in summary, proc.stdout[
        -4000:
    ]
