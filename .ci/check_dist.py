#!/usr/bin/env python3
"""Check the wheel and the sdist a release publishes: the one check that `make check-dist`, the release workflow
(.github/workflows/release.yml) and tests/test_dist.py run.

    python .ci/check_dist.py [--build [--no-isolation]] [--install [--torch SPEC]] [--tag vX.Y.Z] DIST

--build      first build both into DIST from a copy of this checkout's files (so nothing is written into it)
--install    then install the wheel into a fresh environment outside the checkout and run `swa-hal info`, the
             conformance kit against the torch backend and `swa-hal new-backend` there (what `pip install` gets)
--torch      what pip installs as torch there, split like a shell line (default: $SWA_HAL_DIST_TORCH or torch)
--tag        the release tag: the built version must be the tag without its leading "v"

The contents are checked against this checkout: every module of every package pyproject.toml builds (swa_hal and
the built-in backends), py.typed and the plugin template in the wheel and at its source path in the sdist, the wheel's entry points
exactly as pyproject.toml declares them (every group, every name, every target, each target's module inside the
wheel), nothing else at the wheel's top level (no tests/, benchmarks/, examples/, configs/), and in the sdist
what building the wheel again reads (pyproject.toml as checked in, README.md, LICENSE, PKG-INFO). `python -m build`
builds the wheel from the sdist, so a wheel that passes was built from what the sdist holds.

Each problem is one line on stderr; the exit status is 1 if there is any.
"""

from __future__ import annotations

import argparse
import configparser
import email.parser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import venv
import zipfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: build, which this check goes with, requires tomli there
    import tomli as tomllib  # type: ignore[no-redef, import-not-found, unused-ignore]

ROOT = Path(__file__).resolve().parent.parent
# Build leftovers and environments: never part of a release, wherever they lie in the checkout.
LEFTOVERS = ("build", "dist", "*.egg-info", "__pycache__", ".venv*", ".pytest_cache", ".hypothesis", ".mypy_cache")


def say(message: str) -> None:
    print(f"check-dist: {message}", flush=True)


def normalized(name: str) -> str:
    """A distribution name as wheel and sdist file names spell it (PEP 625, PEP 491)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def pyproject(root: Path = ROOT) -> dict:
    with open(root / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def package_files(root: Path = ROOT) -> dict[str, str]:
    """Each file the wheel must hold (its path in the wheel) -> its path in the source tree, from the
    packages setuptools finds with pyproject.toml's [tool.setuptools.packages.find] and package-data."""
    setuptools = pyproject(root)["tool"]["setuptools"]
    find = setuptools["packages"]["find"]
    data = setuptools.get("package-data", {})
    out: dict[str, str] = {}
    for where in find["where"]:
        base = root / where
        for top in sorted(base.iterdir()):
            if not (top / "__init__.py").is_file() or not any(
                re.fullmatch(pat.replace("*", ".*"), top.name) for pat in find["include"]
            ):
                continue
            # Its modules, and the files its package-data patterns name (glob patterns, relative to the package).
            files = {path for path in top.rglob("*.py") if "__pycache__" not in path.parts}
            for pattern in data.get(top.name, []):
                files.update(path for path in top.glob(pattern) if path.is_file())
            for path in sorted(files):
                out[path.relative_to(base).as_posix()] = path.relative_to(root).as_posix()
    return out


def project_name() -> str:
    return pyproject()["project"]["name"]


def entry_points(root: Path = ROOT) -> dict[str, dict[str, str]]:
    """Every entry point pyproject.toml declares, by group (its scripts are the console_scripts group)."""
    project = pyproject(root)["project"]
    groups = {group: dict(names) for group, names in project.get("entry-points", {}).items()}
    if project.get("scripts"):
        groups["console_scripts"] = dict(project["scripts"])
    return groups


def check_wheel(wheel: Path, version: str, problems: list[str]) -> None:
    project = pyproject()["project"]
    expected = package_files()
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = f"{normalized(project['name'])}-{version}.dist-info"
        for rel in sorted(set(expected) - names):
            problems.append(f"wheel: {rel} is missing (source {expected[rel]})")
        if "swa_hal/py.typed" not in names:
            problems.append("wheel: swa_hal/py.typed is missing: type checkers would ignore swa_hal's annotations")
        packages = {rel.split("/")[0] for rel in expected}
        for top in sorted({name.split("/")[0] for name in names} - packages - {dist_info}):
            problems.append(f"wheel: {top}/ does not belong in it (only {', '.join(sorted(packages))} and {dist_info})")
        for name in sorted(names - set(expected)):
            if not name.startswith(dist_info + "/"):
                problems.append(f"wheel: {name} is not a file of the source packages")
        if f"{dist_info}/entry_points.txt" not in names:
            problems.append(
                f"wheel: {dist_info}/entry_points.txt is missing: no backend, plugin or script would register"
            )
            found: dict[str, dict[str, str]] = {}
        else:
            parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
            parser.optionxform = str  # type: ignore[assignment,method-assign]  # names are case-sensitive
            parser.read_string(zf.read(f"{dist_info}/entry_points.txt").decode())
            found = {group: dict(parser[group]) for group in parser.sections()}
        for group, declared in entry_points().items():
            got = found.get(group, {})
            for ep, target in declared.items():
                if ep not in got:
                    problems.append(f"wheel: entry point {ep!r} of group {group!r} is missing (pyproject: {target})")
                elif got[ep] != target:
                    problems.append(f"wheel: entry point {group}:{ep} is {got[ep]!r}, pyproject declares {target!r}")
                module = target.split(":")[0].replace(".", "/")
                if f"{module}.py" not in names and f"{module}/__init__.py" not in names:
                    problems.append(f"wheel: entry point {group}:{ep} names {target!r}, whose module is not in it")
            for ep in sorted(set(got) - set(declared)):
                problems.append(f"wheel: entry point {group}:{ep} = {got[ep]!r} is not declared in pyproject.toml")
        for group in sorted(set(found) - set(entry_points())):
            problems.append(f"wheel: entry point group {group!r} is not declared in pyproject.toml")
        if f"{dist_info}/METADATA" in names:
            meta = email.parser.Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
            if (meta["Name"], meta["Version"]) != (project["name"], version):
                problems.append(
                    f"wheel: METADATA names {meta['Name']} {meta['Version']}, not {project['name']} {version}"
                )
            requires = meta.get_all("Requires-Dist") or []
            for dep in project["dependencies"]:
                if not any(req.replace(" ", "") == dep.replace(" ", "") for req in requires):
                    problems.append(f"wheel: METADATA does not require {dep!r}")
        else:
            problems.append(f"wheel: {dist_info}/METADATA is missing")


def check_sdist(sdist: Path, version: str, problems: list[str]) -> None:
    top = f"{normalized(project_name())}-{version}"
    with tarfile.open(sdist) as tf:
        names = {m.name for m in tf.getmembers() if m.isfile()}
        readme = pyproject()["project"].get("readme", "README.md")
        for rel in ("pyproject.toml", "PKG-INFO", readme, "LICENSE"):
            if f"{top}/{rel}" not in names:
                problems.append(f"sdist: {top}/{rel} is missing: building the wheel from it needs it")
        for rel in sorted(set(package_files().values())):
            if f"{top}/{rel}" not in names:
                problems.append(f"sdist: {top}/{rel} is missing")
        if f"{top}/pyproject.toml" in names:
            member = tf.extractfile(f"{top}/pyproject.toml")
            assert member is not None
            if member.read() != (ROOT / "pyproject.toml").read_bytes():
                problems.append("sdist: its pyproject.toml differs from the checkout's")


def copy_checkout(dest: Path) -> Path:
    """The files of this checkout a clone has (git's list when there is one), without build leftovers."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".git", *LEFTOVERS))
        return dest
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def build(dist: Path, isolation: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="swa-hal-build-") as tmp:
        source = copy_checkout(Path(tmp) / "src")
        say(f"building the sdist and, from it, the wheel into {dist} (python -m build)")
        cmd = [sys.executable, "-m", "build", "--outdir", str(dist), str(source)]
        proc = subprocess.run(cmd + ([] if isolation else ["--no-isolation"]), capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(
                f"check-dist: python -m build exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )


def run(cmd: list[str], cwd: Path, problems: list[str], what: str) -> subprocess.CompletedProcess | None:
    # PYTHONPATH would put a checkout's swa_hal before the installed one: the point is to run the wheel's.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_ADDOPTS")}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        problems.append(f"install: {what} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return None
    return proc


def check_install(wheel: Path, version: str, torch: list[str], problems: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="swa-hal-wheel-") as tmp:
        work = Path(tmp)
        say(f"creating a fresh environment (no system site-packages) in {work / 'env'}")
        venv.EnvBuilder(with_pip=True, system_site_packages=False).create(work / "env")
        python = str(work / "env" / "bin" / "python")
        pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        say(f"installing {' '.join(torch)} there")
        if not run([*pip, *torch], work, problems, f"pip install {' '.join(torch)}"):
            return
        # The kit's tests run under pytest, which is a test extra, not a dependency of swa-hal.
        say(f"installing {wheel.name} with its dependencies, and pytest")
        if not run([*pip, str(wheel), "pytest>=8"], work, problems, f"pip install {wheel.name}"):
            return
        say("running swa-hal --version and swa-hal info --expect torch there")
        proc = run([str(work / "env" / "bin" / "swa-hal"), "--version"], work, problems, "swa-hal --version")
        if proc and proc.stdout.split() != ["swa-hal", version]:
            problems.append(f"install: swa-hal --version printed {proc.stdout.strip()!r}, not 'swa-hal {version}'")
        info = [str(work / "env" / "bin" / "swa-hal"), "info", "--json", "--assume", "vendor=cpu", "--expect", "torch"]
        proc = run(info, work, problems, "swa-hal info --expect torch")
        if proc:
            data = json.loads(proc.stdout)
            plugins = {p["name"]: p for p in data["plugins"]}
            for backend in entry_points().get("swa_hal.backends", {}):
                got = plugins.get(backend, {})
                if (got.get("status"), got.get("dist")) != ("active", project_name()):
                    problems.append(f"install: swa-hal info lists backend plugin {backend!r} as {got or 'absent'}")
        where = run([python, "-c", "import swa_hal; print(swa_hal.__file__)"], work, problems, "import swa_hal")
        if where and not Path(where.stdout.strip()).is_relative_to(work / "env"):
            problems.append(
                f"install: swa_hal was imported from {where.stdout.strip()}, not from the fresh environment"
            )
        # The plugin template is package data: `swa-hal new-backend` must work from the wheel, not only a clone.
        say("writing a plugin with swa-hal new-backend there, installing it and selecting its backend")
        plugin = work / "swa-hal-acme-backend"
        if run(
            [str(work / "env" / "bin" / "swa-hal"), "new-backend", "acme", "--dir", str(plugin)],
            work,
            problems,
            "swa-hal new-backend acme",
        ) and run(
            [*pip, "--no-deps", str(plugin)], work, problems, "pip install of the plugin swa-hal new-backend wrote"
        ):
            info = [str(work / "env" / "bin" / "swa-hal"), "info", "--assume", "vendor=acme", "--expect", "acme"]
            run(info, work, problems, "swa-hal info --expect acme (the plugin swa-hal new-backend wrote)")
            # Its own tests (the kit, against its backend) pass before a line of it is changed.
            tests = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
            kit_ran(
                run(tests, plugin, problems, "the tests of the plugin swa-hal new-backend wrote"),
                "the written plugin's tests",
                problems,
            )
        say("running the conformance kit against the torch backend there")
        kit = "-m pytest -q -p no:cacheprovider -p swa_hal.testing.plugin --pyargs swa_hal.testing.suite"
        kit += " --swa-hal-backend torch"
        kit_ran(run([python, *kit.split()], work, problems, "the conformance kit"), "the kit", problems)


def kit_ran(proc: subprocess.CompletedProcess | None, what: str, problems: list[str]) -> None:
    """Whether a kit-based pytest run ran the kit: it is well over a hundred tests for one backend, so fewer
    means it did not run."""
    if proc is None:
        return
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    if not passed or int(passed.group(1)) < 100:
        problems.append(f"install: {what} ran too few tests: {summary}")
    else:
        say(f"{what}: {summary}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="check_dist.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("dist", type=Path, help="the folder holding the wheel and the sdist")
    parser.add_argument("--build", action="store_true", help="build them first, from a copy of this checkout")
    parser.add_argument("--no-isolation", action="store_true", help="build with this environment's setuptools")
    parser.add_argument("--install", action="store_true", help="install the wheel in a fresh environment and run it")
    parser.add_argument("--torch", default=os.environ.get("SWA_HAL_DIST_TORCH", "torch"), help="pip's torch")
    parser.add_argument("--tag", help="the release tag, vX.Y.Z: the version built must be X.Y.Z")
    args = parser.parse_args(argv)
    # Absolute from here on: the install step runs pip from a fresh temporary folder, where a path relative to
    # the caller's folder (`make check-dist` passes `dist`) names nothing.
    args.dist = args.dist.resolve()
    version = pyproject()["project"]["version"]
    problems: list[str] = []
    if args.tag is not None and args.tag != f"v{version}":
        problems.append(f"tag {args.tag!r} does not name the version pyproject.toml builds, {version} (tag v{version})")
    if args.build:
        args.dist.mkdir(parents=True, exist_ok=True)
        build(args.dist, isolation=not args.no_isolation)
    stem = f"{normalized(project_name())}-{version}"
    wheels, sdists = sorted(args.dist.glob("*.whl")), sorted(args.dist.glob("*.tar.gz"))
    if [w.name for w in wheels] != [f"{stem}-py3-none-any.whl"]:
        problems.append(f"{args.dist}: holds {[w.name for w in wheels]}, not one wheel {stem}-py3-none-any.whl")
    if [s.name for s in sdists] != [f"{stem}.tar.gz"]:
        problems.append(f"{args.dist}: holds {[s.name for s in sdists]}, not one sdist {stem}.tar.gz")
    for wheel in wheels[:1]:
        say(f"checking {wheel.name}")
        check_wheel(wheel, version, problems)
    for sdist in sdists[:1]:
        say(f"checking {sdist.name}")
        check_sdist(sdist, version, problems)
    if args.install and wheels and not problems:
        check_install(wheels[0], version, shlex.split(args.torch), problems)
    for problem in problems:
        print(f"check-dist: {problem}", file=sys.stderr)
    say(f"{len(problems)} problem(s)" if problems else "the wheel and the sdist are as pyproject.toml declares")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
