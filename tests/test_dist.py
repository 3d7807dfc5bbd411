"""The release build: `python -m build` makes the wheel and the sdist a release publishes, and .ci/check_dist.py
(the check `make check-dist` and the release workflow run) passes them; the same check refuses a wheel or an sdist
with any one thing wrong, each by name. The build runs without isolation (with this environment's setuptools and
build, the test extra's) from a copy of the checkout, so it writes nothing here.

Installing the wheel into a fresh environment (torch, the wheel's dependencies, pytest) and running the kit there
takes a minute or two, hence ``slow``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT

CHECK = [sys.executable, str(ROOT / ".ci" / "check_dist.py")]
TORCH = os.environ.get("SWA_HAL_DIST_TORCH", "torch==2.13.0")  # the CPU build on this project's machines


def _check(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    return subprocess.run([*CHECK, *map(str, args)], capture_output=True, text=True, env=env, timeout=900, cwd=cwd)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = _check("--build", "--no-isolation", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _files(dist: Path) -> tuple[Path, Path]:
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    return wheel, sdist


def test_the_release_build_passes_its_check(dist):
    wheel, sdist = _files(dist)
    assert (wheel.name, sdist.name) == ("swa_hal-0.1.0-py3-none-any.whl", "swa_hal-0.1.0.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    # What a user imports and what registers the built-in backends, read here without the check script.
    for name in (
        "swa_hal/__init__.py",
        "swa_hal/py.typed",
        "swa_hal/testing/suite.py",
        "swa_hal/plugin_template/.gitignore.tmpl",
        "swa_hal_torch/__init__.py",
    ):
        assert name in names
    assert not [n for n in names if n.split("/")[0] in ("tests", "benchmarks", "examples", "configs", "docs")]
    entry_points = zipfile.ZipFile(wheel).read("swa_hal-0.1.0.dist-info/entry_points.txt").decode()
    assert "[swa_hal.backends]\ncuda = swa_hal_cuda\nrocm = swa_hal_rocm\nsm12x = swa_hal_sm12x\n" in entry_points
    proc = _check(dist, "--tag", "v0.1.0")
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout + proc.stderr


def _doctored(dist: Path, dest: Path, *, drop: str = "", add: str = "", replace: tuple[str, str, str] = ("", "", "")):
    """A copy of the wheel and the sdist with one thing wrong: a member dropped, one added, or a text replaced
    in one member (wheel members are paths in the wheel, sdist members start with swa_hal-0.1.0/)."""
    dest.mkdir()
    wheel, sdist = _files(dist)
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dest / wheel.name, "w") as out:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == replace[0]:
                data = data.replace(replace[1].encode(), replace[2].encode())
            if item.filename != drop:
                out.writestr(item, data)
        if add and not add.startswith("swa_hal-0.1.0/"):
            out.writestr(add, "")
    with tarfile.open(sdist) as src, tarfile.open(dest / sdist.name, "w:gz") as out:
        for member in src.getmembers():
            if member.name != drop:
                out.addfile(member, src.extractfile(member) if member.isfile() else None)
    return dest


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"add": "tests/test_builder.py"}, "wheel: tests/ does not belong in it"),
        ({"add": "benchmarks/bench_build.py"}, "wheel: benchmarks/ does not belong in it"),
        ({"drop": "swa_hal/py.typed"}, "wheel: swa_hal/py.typed is missing"),
        (
            {"drop": "swa_hal/plugin_template/pyproject.toml.tmpl"},
            "wheel: swa_hal/plugin_template/pyproject.toml.tmpl is missing",
        ),
        ({"drop": "swa_hal_xpu/__init__.py"}, "wheel: swa_hal_xpu/__init__.py is missing (source backends/"),
        (
            {"replace": ("swa_hal-0.1.0.dist-info/entry_points.txt", "xpu = swa_hal_xpu\n", "")},
            "wheel: entry point 'xpu' of group 'swa_hal.backends' is missing (pyproject: swa_hal_xpu)",
        ),
        (
            {"replace": ("swa_hal-0.1.0.dist-info/entry_points.txt", "[swa_hal.backends]", "[swa_hal.backend]")},
            "wheel: entry point group 'swa_hal.backend' is not declared in pyproject.toml",
        ),
        (
            {"replace": ("swa_hal-0.1.0.dist-info/entry_points.txt", "= swa_hal_rocm", "= swa_hal_roc")},
            "wheel: entry point swa_hal.backends:rocm is 'swa_hal_roc', pyproject declares 'swa_hal_rocm'",
        ),
        ({"drop": "swa_hal-0.1.0/LICENSE"}, "sdist: swa_hal-0.1.0/LICENSE is missing"),
        ({"drop": "swa_hal-0.1.0/backends/swa_hal_cuda/__init__.py"}, "sdist: swa_hal-0.1.0/backends/swa_hal_cuda"),
    ],
    ids=lambda v: "-".join(map(str, v.values())) if isinstance(v, dict) else None,
)
def test_the_check_refuses_a_build_with_one_thing_wrong(dist, tmp_path, change, problem):
    proc = _check(_doctored(dist, tmp_path / "dist", **change))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert problem in proc.stderr, proc.stderr


def test_the_check_refuses_a_tag_other_than_the_version(dist):
    proc = _check(dist, "--tag", "v0.1.1")
    assert proc.returncode == 1 and "tag 'v0.1.1' does not name the version pyproject.toml builds, 0.1.0" in proc.stderr


def test_the_check_refuses_a_folder_with_two_wheels(dist, tmp_path):
    shutil.copytree(dist, tmp_path / "dist")
    wheel, _ = _files(dist)
    shutil.copy2(wheel, tmp_path / "dist" / "swa_hal-0.0.9-py3-none-any.whl")
    proc = _check(tmp_path / "dist")
    assert proc.returncode == 1 and "not one wheel swa_hal-0.1.0-py3-none-any.whl" in proc.stderr


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_environment_and_passes_the_kit(dist):
    # The folder as `make check-dist` and the release workflow name it: relative to where the check runs (the
    # install step runs pip from a folder of its own).
    proc = _check(dist.name, "--install", "--torch", TORCH, cwd=dist.parent)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # The check's own lines say which steps ran: each must have, or the pass above means less than it says.
    steps = ("installing " + TORCH, "running swa-hal --version and swa-hal info", "writing a plugin")
    for step in (*steps, "the written plugin's tests: ", "the kit: "):
        assert f"check-dist: {step}" in proc.stdout, proc.stdout


def test_make_check_dist_builds_then_checks_dist_with_the_tag_it_is_given():
    """What `make check-dist` runs (make -n: printed, not run): the build into dist/, then the check of that folder
    as it names it (relative to the checkout, which the check resolves) with --install, and --tag where given."""
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH", "RELEASE_TAG", "MAKEFLAGS")}
    for args, tag in (([], ""), (["RELEASE_TAG=v0.1.0"], ' --tag "v0.1.0"')):
        dry = subprocess.run(["make", "-n", "check-dist", *args], cwd=ROOT, env=env, capture_output=True, text=True)
        assert dry.returncode == 0, dry.stderr
        lines = dry.stdout.splitlines()
        build = lines.index(".venv/bin/python -m build --outdir dist")
        check = f'.venv/bin/python .ci/check_dist.py --install --torch "torch==2.13.0"{tag} dist'
        assert check in lines and lines.index(check) > build, dry.stdout


def test_the_release_workflow_builds_checks_and_publishes_on_a_version_tag():
    import yaml

    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    # PyYAML reads the key `on` as the boolean True (YAML 1.1).
    assert workflow[True] == {"push": {"tags": ["v*"]}}
    build, publish = workflow["jobs"]["build"], workflow["jobs"]["publish"]
    # The release builds and checks with CI's own command (.ci/run), holding the version to the tag, then uploads.
    runs = [step.get("run", "").strip() for step in build["steps"]]
    assert 'make check-dist RELEASE_TAG="$GITHUB_REF_NAME"' in runs, runs
    assert re.search(r"^make check-dist\b", (ROOT / ".ci" / "run").read_text(), re.M), "CI does not run check-dist"
    uploads = [i for i, step in enumerate(build["steps"]) if step.get("uses", "").startswith("actions/upload-artifact")]
    assert uploads and uploads[0] > runs.index('make check-dist RELEASE_TAG="$GITHUB_REF_NAME"')
    assert publish["needs"] == "build" and publish["permissions"] == {"id-token": "write"}
    assert publish["steps"][-1]["uses"].startswith("pypa/gh-action-pypi-publish@")
    assert "with" not in publish["steps"][-1], "trusted publishing takes no password or token"
