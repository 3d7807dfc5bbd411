"""The plugin template: `swa-hal new-backend NAME` writes the example plugin (examples/swa-hal-example-backend,
packaged inside swa_hal as swa_hal/plugin_template so the command works from a wheel) with every name in it made
NAME's, as docs/backends.md #writing-a-backend-plugin tells a vendor to start. What it writes builds into a wheel
that holds the vendor's package and nothing else, and its kit-based tests pass before a line is changed: installed
next to this swa_hal here (a `slow` test: pip and the plugin's whole suite), and in a fresh environment (no system
site-packages) with swa_hal's own wheel: that one is `.ci/check_dist.py --install`'s (tests/test_dist.py), which
writes the plugin with the installed wheel's command and runs its tests there, so one fresh environment serves
both."""

from __future__ import annotations

import fnmatch
import importlib
import os
import re
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT

from swa_hal.cli import main
from swa_hal.new_backend import TEMPLATE as TEMPLATE_NAMES
from swa_hal.new_backend import PluginNames, render, template_files
from swa_hal.plugins import PluginRegistry

TEMPLATE = ROOT / "examples" / "swa-hal-example-backend"
SWA_HAL = [sys.executable, "-m", "swa_hal.cli"]


def template_ignores() -> list[str]:
    """The template's .gitignore patterns: what a copy of the template must leave out."""
    lines = (TEMPLATE / ".gitignore").read_text().splitlines()
    return [line.strip().rstrip("/") for line in lines if line.strip() and not line.startswith("#")]


def example_files() -> dict[str, str]:
    """The example plugin's files, without the build leftovers its .gitignore names: path -> text."""
    ignored = template_ignores()
    return {
        path.relative_to(TEMPLATE).as_posix(): path.read_text()
        for path in sorted(TEMPLATE.rglob("*"))
        if path.is_file()
        and not any(fnmatch.fnmatch(part, pat) for part in path.relative_to(TEMPLATE).parts for pat in ignored)
    }


def new_backend(name: str, dest: Path) -> Path:
    """`swa-hal new-backend NAME --dir DEST`, as a vendor runs it."""
    proc = subprocess.run(
        [*SWA_HAL, "new-backend", name, "--dir", str(dest)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
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
        "so neither a clone nor a written plugin carries the example's build leftovers"
    )


def test_the_packaged_template_is_the_example():
    packaged, example = template_files(), example_files()
    assert sorted(packaged) == sorted(example), "run `make plugin-template` after adding or removing an example file"
    stale = [path for path in example if packaged[path] != example[path]]
    assert not stale, f"swa_hal/plugin_template differs from the example in {stale}: run `make plugin-template`"


def test_new_backend_renames_every_example(tmp_path):
    plugin = new_backend("acme_npu", tmp_path / "plugin")
    written = {p.relative_to(plugin).as_posix(): p.read_text() for p in plugin.rglob("*") if p.is_file()}
    assert sorted(written) == [
        ".gitignore",
        "README.md",
        "pyproject.toml",
        "src/swa_hal_acme_npu/__init__.py",
        "src/swa_hal_acme_npu/backend.py",
        "tests/test_acme_npu_conformance.py",
    ]
    left = {path: re.findall(r".{0,30}example.{0,30}", text, re.I) for path, text in written.items()}
    assert not any(left.values()), {path: lines for path, lines in left.items() if lines}
    # Each name where the example has its own: distribution, entry point, classes, spec and vendor.
    for path, line in [
        ("pyproject.toml", 'name = "swa-hal-acme-npu-backend"'),
        ("pyproject.toml", 'acme_npu = "swa_hal_acme_npu"'),
        ("src/swa_hal_acme_npu/__init__.py", 'factory="swa_hal_acme_npu.backend:AcmeNpuBackend"'),
        ("src/swa_hal_acme_npu/__init__.py", 'platforms=("vendor=acme_npu",)'),
        ("src/swa_hal_acme_npu/backend.py", "class AcmeNpuRaggedRows:"),
        ("tests/test_acme_npu_conformance.py", 'backend_name = "acme_npu"'),
        ("README.md", "# swa-hal-acme-npu-backend"),
    ]:
        assert line in written[path], f"{path} lacks {line!r}"


@pytest.mark.parametrize("name", ["example_npu", "my_example", "example"])
def test_new_backend_renames_a_name_that_holds_the_templates_once(tmp_path, capsys, name):
    """Each of the template's names is replaced once: a NAME that holds the template's own ('example') is written
    as NAME, never NAME renamed again, and the command announces what it wrote."""
    names = PluginNames.of(name)
    assert main(["new-backend", name, "--dir", str(tmp_path / "p")]) == 0
    announced = capsys.readouterr().out
    folder = tmp_path / "p"
    written = {path.relative_to(folder).as_posix(): path.read_text() for path in folder.rglob("*") if path.is_file()}
    assert f"package {names.package}," in announced and f"wrote {names.distribution} into" in announced, announced
    assert sorted(written) == [
        ".gitignore",
        "README.md",
        "pyproject.toml",
        f"src/{names.package}/__init__.py",
        f"src/{names.package}/backend.py",
        f"tests/test_{name}_conformance.py",
    ]
    for path, line in [
        ("pyproject.toml", f'name = "{names.distribution}"'),
        ("pyproject.toml", f'{name} = "{names.package}"'),
        (f"src/{names.package}/__init__.py", f'factory="{names.package}.backend:{names.title}Backend"'),
        (f"src/{names.package}/__init__.py", f'platforms=("vendor={name}",)'),
        (f"src/{names.package}/backend.py", f"class {names.title}RaggedRows:"),
        (f"tests/test_{name}_conformance.py", f'backend_name = "{name}"'),
        (f"tests/test_{name}_conformance.py", f"from {names.package}.backend import {names.title}RaggedRows"),
    ]:
        assert line in written[path], f"{path} lacks {line!r}"
    # Split at the names (the template's in its files, the plugin's in the written ones), the two read the same: each
    # name swapped once, nothing else changed ('swa_hal_example_npu_npu' would leave '_npu' behind).
    def pieces(files: dict[str, str], forms: tuple[str, ...]) -> list[tuple[list[str], list[str]]]:
        split = re.compile("|".join(map(re.escape, forms))).split
        return sorted((split(path), split(text)) for path, text in files.items())

    assert pieces(written, names.forms()) == pieces(template_files(), TEMPLATE_NAMES.forms())


@pytest.mark.parametrize("length", [32, 33])
def test_new_backend_refuses_exactly_the_names_the_registry_skips(tmp_path, capsys, monkeypatch, length):
    """A plugin made from the template with a NAME of ``length`` characters, imported and registered: the
    registry takes it exactly when the command writes it (BackendSpec's name is 32 characters at most)."""
    name = "acme_" + "x" * (length - 5)
    names = PluginNames.unchecked(name)
    for rel, text in render(names).items():
        (tmp_path / "made" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "made" / rel).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path / "made" / "src"))
    registry = PluginRegistry(entry_points=[], env={}, embedded_default=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registry.register_plugin(importlib.import_module(names.package), name)
    registered = name in registry.backends
    assert registered == (length <= 32), [str(w.message) for w in caught]
    written = main(["new-backend", name, "--dir", str(tmp_path / "p")]) == 0
    assert written == registered, capsys.readouterr().err
    if not written:
        err = capsys.readouterr().err
        assert f"backend name {name!r} (33 characters): swa_hal's registry would skip" in err, err
        assert "malformed BackendSpec: name" in err and not (tmp_path / "p").exists(), err
        assert any("malformed BackendSpec" in str(w.message) for w in caught)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("cuda", "backend name 'cuda': a built-in backend has that name"),
        ("Acme", "backend name 'Acme': must be a lowercase Python identifier"),
        ("acme-npu", "backend name 'acme-npu': must be a lowercase Python identifier"),
        ("class", "backend name 'class': must be a lowercase Python identifier"),
    ],
)
def test_new_backend_refuses_a_name_it_cannot_use(tmp_path, capsys, name, problem):
    assert main(["new-backend", name, "--dir", str(tmp_path / "p")]) == 2
    assert problem in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_new_backend_writes_nothing_into_a_folder_that_holds_files(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["new-backend", "acme", "--dir", str(tmp_path)]) == 2
    assert "exists and is not an empty folder; nothing was written" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_the_written_plugin_builds_a_wheel_of_the_vendor_package_only(tmp_path):
    plugin = new_backend("acme", tmp_path / "swa-hal-acme-backend")
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
    assert wheel.name == "swa_hal_acme_backend-0.1.0-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert packages == {"swa_hal_acme"}, f"the vendor's wheel holds {sorted(packages)}: {names}"


def _kit_passed(proc: subprocess.CompletedProcess) -> None:
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    # The whole kit is well over a hundred tests for this backend: fewer means the kit itself did not run.
    assert passed and int(passed.group(1)) > 100 and "failed" not in summary and "error" not in summary, proc.stdout[
        -4000:
    ]


@pytest.mark.slow
def test_the_written_plugin_passes_its_tests_installed_next_to_swa_hal(tmp_path):
    """pip-installed (no dependencies, no build isolation) into a folder on the path of this environment, which
    has swa_hal; the written tests run from the written folder, as a vendor runs them."""
    plugin = new_backend("acme", tmp_path / "swa-hal-acme-backend")
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site)]
    subprocess.run([*pip, str(plugin)], check=True, capture_output=True, timeout=300)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    info = [*SWA_HAL, "info", "--assume", "vendor=acme", "--expect", "acme"]
    proc = subprocess.run(info, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "swa-hal-acme-backend 0.1.0" in proc.stdout, proc.stdout + proc.stderr
    tests = [sys.executable, "-m", "pytest", "-q", "-rp", "-p", "no:cacheprovider", "tests"]
    proc = subprocess.run(tests, cwd=plugin, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    _kit_passed(proc)
    # Its extra in a group build, by its own test and by the kit's (which holds each group's extras to its own).
    for test in ("test_each_group_has_ragged_rows_of_its_own", "TestAcmeBackend::test_group_builds_match_each_groups"):
        assert f"PASSED tests/test_acme_conformance.py::{test}" in proc.stdout, proc.stdout[-4000:]
