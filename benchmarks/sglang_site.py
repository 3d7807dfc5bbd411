"""SGLang 0.5.23's own DeepSeek-V4 metadata ops, carried to a machine that has neither SGLang nor network
access (a GPU machine's image with torch and triton), so that ``benchmarks/sglang_window.py`` and
``benchmarks/sglang_rows.py`` compare swa_hal with SGLang's own code there.

    python3 benchmarks/sglang_site.py [--python .venv-sglang/bin/python] [--out .device/sglang]

``--python`` is an interpreter with SGLang 0.5.23 installed (``make test-sglang`` builds ``.venv-sglang``).
The script runs, in a child process of that interpreter, the imports and the calls the benchmarks make:
SGLang's ``window_layout`` (``sglang.srt.mem_cache.dsv41_request_window``) on its torch path and the Triton
op of its CUDA path (``sglang.kernels.ops.kvcache.dsv41_window_layout.build_window_layout``, in the Triton
interpreter), ``BuildCausalSwaPageIndices`` (``sglang.kernels.ops.attention.dsv4.attn_metadata_kernels``) and
``sglang.kernels.ops.speculative.dspark.dspark_attn_metadata``, both paths each; then, in a second child that
makes torch report a CUDA device, the same imports again, for import branches taken only on CUDA. Every
module those loaded is in ``sys.modules``; from there it builds ``--out`` (git ignores ``.device/``):

- ``src/``: SGLang's own .py files among them, copied unmodified, with every package ``__init__.py`` above
  them, the files of SGLang the chain opens, and the folders in ``DATA`` (below); nothing else of SGLang.
  Then the same imports and calls run again with ``src/`` first on the path, and every SGLang module must
  come from it.
- ``wheels/``: manylinux wheels for ``--python-version`` (3.12 by default) of the third-party distributions
  among them that the target lacks, at the versions the SGLang interpreter has (``pip download``, so this
  step needs the package index). ``--have`` names what the target has (by default torch, triton and their
  dependencies and the usual packages of a GPU machine's image, below).
- ``MANIFEST.txt``: the SGLang version, every file and wheel with its size, and what is expected on the target.

On the target (``benchmarks/run_h200.sh`` does this for its steps ``slotrows`` and ``sglwindow``)::

    python3 -m pip install --no-index --no-deps --target DIR .device/sglang/wheels/*.whl
    PYTHONPATH=.device/sglang/src:DIR python3 benchmarks/sglang_window.py

``--wheels-only --python-version 3.11 --wheel-dir DIR`` fetches the same distributions for another Python into
DIR (the same trace, nothing else written), to try the folder on a machine with that Python.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SGLANG_VERSION = "0.5.23"
LIMIT_MIB = 40

# What the target image has: torch and triton with their own dependencies, and the usual packages of a GPU
# machine's Python (the test tools included). Distribution names, compared after PEP 503 normalisation.
HAVE = (
    "torch triton numpy sympy mpmath networkx filelock fsspec jinja2 markupsafe typing-extensions setuptools "
    "aiohttp aiosignal aiohappyeyeballs anyio attrs certifi charset-normalizer frozenlist idna msgpack multidict "
    "packaging pillow pluggy propcache psutil pygments pytest pyyaml requests rich tqdm urllib3 uvloop yarl "
    "hypothesis pytest-xdist"
)

# SGLang's own non-Python files the chain needs: sglang.kernels.jit checks on import that its C++ sources are
# there (include/ and csrc/ beside it); none of the ops here compiles them, but they are carried as they are.
DATA = ("kernels/jit/include", "kernels/jit/csrc")

# The trace, run by the SGLang interpreter: `python -c TRACE MODE OUT.json`.
TRACE = r"""
import json, os, sys
mode, out = sys.argv[1], sys.argv[2]
opened = set()  # files the chain opens (SGLang's data files among them)
sys.addaudithook(lambda event, args: opened.add(str(args[0])) if event == "open" and isinstance(args[0], str) else None)
import torch
if mode == "cuda-imports":
    import types
    props = types.SimpleNamespace(name="GPU", major=9, minor=0, total_memory=1 << 37, multi_processor_count=132,
                                  gcnArchName="", L2_cache_size=1 << 25)
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_name = lambda *a, **k: "GPU"
    torch.cuda.get_device_properties = lambda *a, **k: props
    torch.version.cuda = torch.version.cuda or "13.0"
from sglang.srt.mem_cache import dsv41_request_window as rw
from sglang.kernels.ops.kvcache.dsv41_window_layout import build_window_layout
from sglang.kernels.ops.attention.dsv4.attn_metadata_kernels import BuildCausalSwaPageIndices
from sglang.kernels.ops.speculative.dspark.dspark_attn_metadata import (
    BuildDsparkSwaPageIndices, ComputeDsparkWindowGather)
if mode == "calls":
    t = torch.tensor
    req, pos = t([3, 3, 3, 5]), t([4, 5, 6, 0], dtype=torch.int32)
    kw = dict(zero_row=99, window=4, capacity=8)
    rw.window_layout(req, pos, num_groups=3, padded_rows=6, **kw)  # the torch path
    rw.window_layout(req, pos, floor=t([4, 4, 4, 0]), **kw)
    # The CUDA path: its invariant check at each level (off, warn, strict), the scans, then the op.
    for level in ("0", "1", "2"):
        os.environ["SGLANG_INVARIANT_CHECK"] = level
        if rw.resolve_level() >= rw.InvariantCheckLevel.WARN and not rw._capturing():
            rw.expect(rw._WINDOW_GROUPS_FIT, t([True]), msg="request runs")
    os.environ.pop("SGLANG_INVARIANT_CHECK")
    group, first, last = rw._first_row_offsets(req)
    rw.WindowLayout(**build_window_layout(req, pos, group, first, last, floor=t([4, 4, 4, 0]), num_groups=3,
                                          padded_rows=6, **kw))
    req_to_token = torch.arange(2 * 512, dtype=torch.int32).view(2, 512)
    full_to_swa = torch.cat([torch.arange(1024, dtype=torch.int64), t([-1])])
    rows = dict(req_to_token=req_to_token, full_to_swa_mapping=full_to_swa,
                req_pool_indices_repeated=t([0, 0, 1]), seq_lens_casual=t([300, 301, 40], dtype=torch.int32),
                swa_window=128, page_index_aligned_size=64)
    for path in ("torch", "triton"):
        for floor in (None, t([200, 200, 0], dtype=torch.int32)):
            getattr(BuildCausalSwaPageIndices, path)(**rows, swa_replay_start=floor)
        for valid_from in (None, t([100, 0], dtype=torch.int64)):
            gather = getattr(ComputeDsparkWindowGather, path)(
                seq_lens_casual=t([303, 303, 303, 43, 43, 43], dtype=torch.int32),
                req_pool_indices_repeated=t([0, 0, 0, 1, 1, 1]), block_size=3, swa_window=128,
                valid_from=valid_from)
            getattr(BuildDsparkSwaPageIndices, path)(
                req_to_token=req_to_token, full_to_swa_mapping=full_to_swa,
                req_pool_indices_per_request=gather.req_pool_indices_per_request, offsets=gather.offsets,
                invalid=gather.invalid, out_loc=t([300, 301, 302, 552, 553, 554])[: gather.num_q],
                context_lens=gather.context_lens, block_size=3, swa_window=128, page_index_aligned_size=64)
    BuildCausalSwaPageIndices.execute(**rows)
import importlib.metadata as md
import sglang
tops = md.packages_distributions()
dists = {}
for mod in list(sys.modules):
    top = mod.split(".")[0]
    for dist in tops.get(top, ()):
        try:
            dists[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
files = {m: getattr(v, "__file__", None) for m, v in list(sys.modules.items())}
json.dump({"sglang_root": os.path.dirname(sglang.__file__), "sglang_version": md.version("sglang"),
           "python": sys.version.split()[0], "files": files, "dists": dists, "opened": sorted(opened)},
          open(out, "w"))
"""


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def trace(python: str, mode: str, out: Path, path: Path | None = None) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("SGLANG_INVARIANT_CHECK", None)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run([python, "-c", TRACE, mode, str(out)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {mode} trace failed under {python}:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def sglang_files(traces: list[dict]) -> list[str]:
    """SGLang's own files the traces loaded, relative to its package root, with the package __init__.py above
    each (present in the installed package)."""
    root = Path(traces[0]["sglang_root"])
    rel: set[str] = set()
    for t in traces:
        for file in t["opened"]:
            path = Path(file)
            if path.is_file() and path.is_relative_to(root) and "__pycache__" not in path.parts:
                rel.add(str(path.relative_to(root)))  # a data file the chain reads (or a source it opens)
        for name, file in t["files"].items():
            if not (name == "sglang" or name.startswith("sglang.")) or not file:
                continue
            path = Path(file)
            if path.suffix != ".py":
                raise SystemExit(f"{name} is not a .py file ({file}); this script carries only Python sources")
            rel.add(str(path.relative_to(root)))
    for r in list(rel):
        parent = Path(r).parent
        while str(parent) != ".":
            if (root / parent / "__init__.py").exists():
                rel.add(str(parent / "__init__.py"))
            parent = parent.parent
    rel.add("__init__.py")
    return sorted(rel)


def download(dists: dict[str, str], python_version: str, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
        "--python-version", python_version, "--implementation", "cp",
        "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
        "--platform", "manylinux_2_17_x86_64", "-d", str(dest),
        *(f"{name}=={version}" for name, version in sorted(dists.items())),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pip download failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_python = ROOT / ".venv-sglang" / "bin" / "python"
    ap.add_argument(
        "--python",
        default=str(default_python) if default_python.exists() else sys.executable,
        help="an interpreter with SGLang 0.5.23 (default: .venv-sglang's, else this one)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / ".device" / "sglang")
    ap.add_argument("--python-version", default="3.12", help="the target's Python, for the wheels")
    ap.add_argument("--have", default=HAVE, help="space-separated distributions the target has")
    ap.add_argument("--wheels-only", action="store_true", help="only fetch the wheels, into --wheel-dir")
    ap.add_argument("--wheel-dir", type=Path, help="where the wheels go (default: OUT/wheels)")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        traces = [trace(args.python, mode, Path(scratch) / f"{mode}.json") for mode in ("calls", "cuda-imports")]
    version = traces[0]["sglang_version"]
    if version != SGLANG_VERSION:
        raise SystemExit(f"{args.python} has SGLang {version}; this script carries {SGLANG_VERSION}")
    found: dict[str, str] = {}
    for t in traces:
        found.update(t["dists"])
    have = {normalise(n) for n in args.have.split()}
    carry = {n: v for n, v in found.items() if normalise(n) not in have and normalise(n) != "sglang"}
    expected = {n: v for n, v in found.items() if normalise(n) in have}
    print(f"SGLang {version} traced under Python {traces[0]['python']} ({args.python})")
    print("third-party distributions carried: " + ", ".join(f"{n}=={v}" for n, v in sorted(carry.items())))
    print("expected on the target: " + ", ".join(f"{n} (here {v})" for n, v in sorted(expected.items())))

    wheel_dir = args.wheel_dir or args.out / "wheels"
    if args.wheels_only:
        if args.wheel_dir is None:
            raise SystemExit("--wheels-only needs --wheel-dir")
        download(carry, args.python_version, wheel_dir)
        print(f"wheels for Python {args.python_version} in {wheel_dir}")
        return 0

    if args.out.exists():
        shutil.rmtree(args.out)
    src_root = Path(traces[0]["sglang_root"])
    files = sglang_files(traces)
    for rel in files:
        dest = args.out / "src" / "sglang" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src_root / rel, dest)
    for rel in DATA:
        shutil.copytree(src_root / rel, args.out / "src" / "sglang" / rel, ignore=shutil.ignore_patterns("__pycache__"))
    # The folder on its own: the same imports and calls with it first on the path load SGLang from it alone.
    with tempfile.TemporaryDirectory() as scratch:
        check = trace(args.python, "calls", Path(scratch) / "check.json", path=args.out / "src")
    carried = (args.out / "src").resolve()
    outside = sorted(
        f"{name} ({file})"
        for name, file in check["files"].items()
        if (name == "sglang" or name.startswith("sglang."))
        and file
        and not Path(file).resolve().is_relative_to(carried)
    )
    if outside:
        raise SystemExit("with the folder first on the path, SGLang still loaded from elsewhere: " + ", ".join(outside))
    print(f"checked: the imports and calls run with {args.out / 'src'} first on the path, every SGLang module from it")
    download(carry, args.python_version, wheel_dir)
    wheels = sorted(wheel_dir.glob("*.whl"))
    total = size(args.out)
    lines = [
        f"SGLang {version}: {len(files)} files of its own (src/sglang/), copied unmodified from its installed package,",
        "the set that importing and calling window_layout (torch path and CUDA op), BuildCausalSwaPageIndices and",
        "the DSpark metadata ops loads (benchmarks/sglang_site.py traced it), and the C++ sources of",
        "sglang.kernels.jit, whose presence it checks on import (" + ", ".join(DATA) + ").",
        f"Wheels (wheels/, Python {args.python_version}, manylinux x86_64) of the third-party packages that chain",
        "loads which the target lacks; install them with",
        "  python3 -m pip install --no-index --no-deps --target DIR wheels/*.whl",
        "and put src/ and DIR on PYTHONPATH.",
        "Expected on the target (versions traced here): " + ", ".join(f"{n} {v}" for n, v in sorted(expected.items())),
        f"Total {total / 2**20:.2f} MiB.",
        "",
        "wheels:",
        *(f"  {w.name}  {w.stat().st_size}" for w in wheels),
        "",
        "files:",
        *(f"  src/sglang/{rel}  {(src_root / rel).stat().st_size}" for rel in files),
        *(f"  src/sglang/{rel}/  {size(src_root / rel)} (the whole folder)" for rel in DATA),
    ]
    (args.out / "MANIFEST.txt").write_text("\n".join(lines) + "\n")
    total = size(args.out)
    print(
        f"{args.out}: {len(files)} SGLang files ({size(args.out / 'src') / 2**20:.2f} MiB), "
        f"{len(wheels)} wheels ({size(wheel_dir) / 2**20:.2f} MiB), {total / 2**20:.2f} MiB in all"
    )
    if total > LIMIT_MIB * 2**20:
        print(f"more than {LIMIT_MIB} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
