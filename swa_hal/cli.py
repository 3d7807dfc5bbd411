"""The ``swa-hal`` command: info | build | bench | warmup | matrix."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from .platform import PlatformInfo


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for dist in ("swa-hal", "torch", "triton", "pluggy", "pyyaml", "tokenspeed-flashmla"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


class CliError(Exception):
    """Bad command-line input: printed as one line naming the input and the rule, exit code 2."""


def _assumed(args: argparse.Namespace) -> PlatformInfo | None:
    text = getattr(args, "assume", None)
    if not text:
        return None
    try:
        return PlatformInfo.from_assume(text)
    except ValueError as exc:
        raise CliError(f"--assume {text!r}: {exc}") from None


def _device(args: argparse.Namespace):
    """The --device argument as a torch.device that exists here."""
    import torch

    text = getattr(args, "device", None) or "cpu"
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as exc:
        raise CliError(f"--device {text!r}: {exc}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise CliError(
                f"--device {text!r}: this machine has no CUDA device (use --device cpu, or --assume to "
                f"evaluate selection for another platform)"
            )
        if device.index is not None and device.index >= count:
            raise CliError(f"--device {text!r}: there are {count} CUDA device(s) here")
    elif device.type != "cpu":
        raise CliError(f"--device {text!r}: only cpu and cuda[:N] devices are supported here")
    return device


def _default_device(platform: PlatformInfo):
    """Where a backend starts when no --device is given: the GPU of a probed GPU platform, else the CPU
    (an --assume'd platform is evaluated here, with Triton backends running through the interpreter)."""
    import torch

    if not platform.synthetic and platform.vendor in ("cuda", "rocm") and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _platform(args: argparse.Namespace) -> PlatformInfo:
    assumed = _assumed(args)
    if assumed is not None:
        return assumed
    from .platform import probe_platform

    return probe_platform(getattr(args, "device", None))


def _emit_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


# -- info ---------------------------------------------------------------------------------------


def cmd_info(args: argparse.Namespace) -> int:
    from .errors import SWAHalError
    from .plugins import get_registry
    from .selection import select_backend

    registry = get_registry()
    platform = _platform(args)
    error = None
    selection = None
    try:
        selection = select_backend(args.backend, platform, registry=registry)
    except SWAHalError as exc:
        error = str(exc)
    backend_status: dict[str, str] = {}
    started = None
    if selection is not None and (args.status or args.expect is not None):
        # Start the backend as a builder would: what runs is what --expect checks, fallbacks included.
        try:
            backend = selection.create(_config(args), _device(args) if args.device else _default_device(platform))
            started = backend.name
            backend_status = backend.status() if args.status else {}
            for reason in backend.fell_back_from:
                backend_status.setdefault("fell back", reason)
        except SWAHalError as exc:
            error = str(exc)
            backend_status = {"error": error}
    data = {
        "versions": _versions(),
        "platform": platform.to_dict(),
        "plugins": [p.to_dict() for p in registry.plugins],
        "plugin_problems": registry.problems,
        "backends": selection.to_dict()["candidates"] if selection else [],
        "selected": selection.name if selection else None,
        "started": started,
        "how": selection.how if selection else None,
        "backend_status": backend_status,
        "error": error,
    }
    if selection is None:
        from .selection import build_candidates

        data["backends"] = [c.to_dict() for c in build_candidates(registry, platform)]
    runs = started if started is not None else data["selected"]
    ok = error is None and (args.expect is None or runs == args.expect)
    if args.expect is not None and runs != args.expect:
        what = (
            f"selected {data['selected']!r}"
            if started in (None, data["selected"])
            else (f"selected {data['selected']!r} but it failed to start, so {started!r} runs")
        )
        data["error"] = (error + "; " if error else "") + f"expected backend {args.expect!r}, {what}"
    if args.json:
        _emit_json(data)
        return 0 if ok else 1
    v = data["versions"]
    print(
        f"swa-hal {v['swa-hal']}  (torch {v['torch']}, triton {v['triton']}, pluggy {v['pluggy']}, "
        f"python {v['python']}, flash_mla wheel {v['tokenspeed-flashmla'] or 'none'})"
    )
    print(f"platform: {platform.describe()}" + ("  [Triton interpreter on]" if platform.triton_interpret else ""))
    print("plugins:")
    for p in registry.plugins:
        dist = f"{p.dist} {p.version or ''}".strip() if p.dist else "-"
        print(f"  {p.name:<12} {p.status:<9} {dist:<28} {', '.join(p.backends) or p.detail}")
        if p.detail and p.backends:
            print(f"  {'':<12} {p.detail}")
    for problem in registry.problems:
        print(f"  ! {problem}")
    if selection is not None:
        print("backends:")
        print("\n".join("  " + line for line in selection.explain().splitlines()[1:]))
        for key, value in backend_status.items():
            print(f"  {selection.name} {key}: {value}")
    else:
        print("backends:")
        for c in data["backends"]:
            state = "available" if c["available"] else "unavailable: " + "; ".join(c["reasons"])
            print(f"    {c['name']:<10} priority {c['priority']:>4}  {state}")
    if data["error"]:
        print(f"error: {data['error']}")
    return 0 if ok else 1


# -- build --------------------------------------------------------------------------------------


def _config(args: argparse.Namespace):
    from .config import SWAConfig

    return SWAConfig.from_yaml(args.config) if getattr(args, "config", None) else SWAConfig()


def _histogram(values: list[int], width: int) -> list[str]:
    if not values:
        return ["  (no rows)"]
    edges = sorted({0, 1, max(1, width // 4), max(1, width // 2), max(1, width - 1), width})
    lines = []
    total = len(values)
    for lo, hi in zip(edges, edges[1:] + [width + 1]):
        n = sum(1 for v in values if lo <= v < hi)
        label = f"{lo}" if hi == lo + 1 else f"{lo}-{hi - 1}"
        bar = "#" * round(40 * n / total)
        lines.append(f"  lens {label:>9}: {n:>6} {bar}")
    return lines


def cmd_build(args: argparse.Namespace) -> int:
    import torch

    from .builder import SWAMetadataBuilder
    from .compare import compare_with_reference
    from .scenarios import Scenario

    config = _config(args)
    scenario = Scenario.from_yaml(args.batch)
    platform = _assumed(args)
    device = _device(args)
    builder = SWAMetadataBuilder(config, device=device, backend=args.backend, platform=platform, validate=True)
    batch = scenario.make_batch(config, device)
    builder.warmup()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    times = []
    md = None
    for i in range(args.repeat):
        sync()
        t0 = time.perf_counter()
        md = builder.build(batch, validate=(i == 0))
        sync()
        times.append(time.perf_counter() - t0)
    assert md is not None
    mismatches = [] if args.no_check else compare_with_reference(config, batch, md)
    med = statistics.median(times[1:] if len(times) > 1 else times) * 1e3
    out: dict[str, Any] = {
        "config": str(args.config),
        "scenario": scenario.name,
        "backend": builder.backend_name,
        "platform": builder.platform.describe(),
        "split": {
            "num_decodes": md.num_decodes,
            "num_prefills": md.num_prefills,
            "num_decode_tokens": md.num_decode_tokens,
            "num_prefill_tokens": md.num_prefill_tokens,
        },
        "first_build_ms": times[0] * 1e3,
        "median_build_ms": med,
        "builds": len(times),
        "checked_against_reference": not args.no_check,
        "mismatches": mismatches,
        "tile_sched": {k: (type(v).__name__ if v is not None else None) for k, v in md.tile_sched.items()},
        "replay_start": None if batch.replay_start is None else batch.replay_start.cpu().tolist(),
        "image_spans": _spans_report(batch),
    }
    if args.json:
        _emit_json(out)
        return 1 if mismatches else 0
    print(f"config {args.config}  scenario {scenario.name}: {scenario.description}")
    print(f"backend {builder.backend_name} on {builder.platform.describe()}")
    print(
        f"split: {md.num_decodes} decodes ({md.num_decode_tokens} token rows), "
        f"{md.num_prefills} prefills ({md.num_prefill_tokens} token rows); decode width {md.decode_swa_width}, "
        f"prefill width {config.prefill_index_width}"
    )
    if batch.replay_start is None:
        print("replay bounds: none")
    else:
        bounds = out["replay_start"]
        print(
            f"replay bounds: {sum(1 for b in bounds if b)} of {len(bounds)} requests bounded, first {bounds[:8]}"
            f"{' ...' if len(bounds) > 8 else ''}"
        )
    if out["image_spans"]:
        spans = out["image_spans"]
        print(
            f"image spans: {sum(len(v) for v in spans.values())} in {len(spans)} requests "
            f"(max_image_tokens {config.max_image_tokens}), e.g. request {next(iter(spans))}: "
            f"{spans[next(iter(spans))][:3]}"
        )
    for name, idx, lens, count in (
        ("decode", md.decode_swa_indices, md.decode_swa_lens, md.num_decode_tokens),
        ("prefill", md.prefill_swa_indices, md.prefill_swa_lens, md.num_prefill_tokens),
    ):
        if not count or idx is None or lens is None:
            continue
        print(f"{name} rows (first {min(3, count)} of {count}, entries 0..5 and the last valid one):")
        rows = idx[: min(3, count)].reshape(min(3, count), -1).cpu()
        lns = lens[: min(3, count)].cpu().tolist()
        for r, (row, n) in enumerate(zip(rows.tolist(), lns)):
            tail = f" ... {row[n - 1]}" if n > 6 else ""
            print(f"  [{r}] len {n:>4}: {row[: min(6, max(n, 1))]}{tail}")
        width = md.decode_swa_width if name == "decode" else config.prefill_index_width
        print("\n".join(_histogram(lens.cpu().tolist(), width)))
    if md.num_prefills and md.prefill_gather_lens is not None:
        print(
            f"prefill gather lens: {md.prefill_gather_lens.cpu().tolist()[:8]}{' ...' if md.num_prefills > 8 else ''}"
        )
    print(f"tile schedulers: {out['tile_sched']}")
    print(
        f"timing: first build {out['first_build_ms']:.3f} ms (validated), median of {len(times) - 1 or 1} "
        f"more {med:.3f} ms ({torch.get_num_threads()} torch threads)"
    )
    if args.no_check:
        print("check: skipped")
    elif mismatches:
        print("check: MISMATCH against reference.py:")
        for m in mismatches[:10]:
            print(f"  {m}")
    else:
        print("check: bit-exact with swa_hal.reference on every output")
    return 1 if mismatches else 0


def _spans_report(batch) -> dict[int, list[tuple[int, int]]]:
    spans = batch.image_spans
    if spans is None:
        return {}
    ptr, starts, ends = spans.indptr.cpu().tolist(), spans.starts.cpu().tolist(), spans.ends.cpu().tolist()
    return {
        r: list(zip(starts[ptr[r] : ptr[r + 1]], ends[ptr[r] : ptr[r + 1]]))
        for r in range(len(ptr) - 1)
        if ptr[r + 1] > ptr[r]
    }


# -- bench --------------------------------------------------------------------------------------


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from .builder import SWAMetadataBuilder
    from .scenarios import Scenario

    config = _config(args)
    device = _device(args)
    rows = []
    for path in args.batch:
        scenario = Scenario.from_yaml(path)
        builder = SWAMetadataBuilder(config, device=device, backend=args.backend, validate=False)
        builder.warmup()
        batch = scenario.make_batch(config, device)
        for _ in range(3):
            builder.build(batch)
        host = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            builder.build(batch)
            host.append(time.perf_counter() - t0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        rows.append((scenario.name, builder.backend_name, statistics.median(host) * 1e6))
    for name, backend, us in rows:
        print(
            f"{name:<16} {backend:<8} host {us:10.1f} us per build (median of {args.iters}, "
            f"{torch.get_num_threads()} torch threads)"
        )
    return 0


# -- warmup -------------------------------------------------------------------------------------


def cmd_warmup(args: argparse.Namespace) -> int:

    from .builder import SWAMetadataBuilder

    config = _config(args)
    platform = _assumed(args)
    builder = SWAMetadataBuilder(config, device=_device(args), backend=args.backend, platform=platform)
    try:
        from tqdm import tqdm
    except ImportError:  # progress is optional
        tqdm = None
    t0 = time.perf_counter()
    if tqdm is not None:
        bar = tqdm(desc=f"warmup {builder.backend_name}", unit="variant")

        def progress(msg: str) -> None:
            bar.set_postfix_str(msg[-60:])
            bar.update(1)

        count = builder.warmup(progress)
        bar.close()
    else:
        count = builder.warmup(lambda msg: print(f"  compiling {msg}"))
    print(
        f"warmup: {count} kernel variant(s) ready for backend {builder.backend_name} in "
        f"{time.perf_counter() - t0:.2f} s"
    )
    return 0


# -- matrix -------------------------------------------------------------------------------------


def cmd_matrix(args: argparse.Namespace) -> int:
    from .errors import SWAHalError
    from .plugins import get_registry
    from .selection import select_backend

    registry = get_registry()
    seen: dict[str, str] = {}
    for name, rb in sorted(registry.backends.items()):
        for assume in rb.spec.platforms:
            seen.setdefault(assume, name)
    entries = []
    for assume, declared_by in seen.items():
        platform = PlatformInfo.from_assume(assume)
        try:
            selected = select_backend(None, platform, registry=registry, env={}).name
        except SWAHalError as exc:
            selected, declared_by = None, f"{declared_by} ({exc})"
        entries.append(
            {
                "platform": assume,
                "expect": selected,
                "declared_by": declared_by,
                "vendor": platform.vendor,
                "capability": platform.capability_str,
            }
        )
    if args.json:
        _emit_json({"include": entries})
        return 0
    print(f"{'platform':<42} {'selects':<10} declared by")
    for e in entries:
        print(f"{e['platform']:<42} {str(e['expect']):<10} {e['declared_by']}")
    return 0


# -- entry point --------------------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, exit code 2 (argparse's own code for them)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="swa-hal", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("info", help="versions, platform, plugins, backends and the selection")
    p.add_argument("--json", action="store_true", help="machine-readable output (for CI)")
    p.add_argument("--assume", help="evaluate against a synthetic platform, e.g. vendor=cuda,capability=12.0")
    p.add_argument("--backend", help="explain an explicit request for this backend")
    p.add_argument("--expect", help="exit 1 unless this backend is the one selected")
    p.add_argument("--status", action="store_true", help="also start the selected backend and report its state")
    p.add_argument("--config", help="config for --status (default: built-in defaults)")
    p.add_argument("--device", default=None, help="probe this device (default: the best one here)")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("build", help="build metadata for a scenario, check it against the reference")
    p.add_argument("--config", required=True)
    p.add_argument("--batch", required=True, help="a scenario from configs/batches/")
    p.add_argument("--backend")
    p.add_argument("--assume", help="synthetic platform (with TRITON_INTERPRET=1 to run Triton backends on the CPU)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeat", type=_positive, default=5)
    p.add_argument("--no-check", action="store_true", help="skip the comparison with reference.py")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("bench", help="quick host-time medians here (benchmarks/bench_build.py is the full run)")
    p.add_argument("--config", required=True)
    p.add_argument("--batch", required=True, nargs="+")
    p.add_argument("--backend")
    p.add_argument("--device", default="cpu")
    p.add_argument("--iters", type=_positive, default=50)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("warmup", help="compile every kernel variant a config can launch")
    p.add_argument("--config", required=True)
    p.add_argument("--backend")
    p.add_argument("--assume")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_warmup)

    p = sub.add_parser("matrix", help="the CI job matrix: each target platform and the backend it should select")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_matrix)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    from .errors import SWAHalError

    try:
        return int(args.func(args) or 0)
    except (SWAHalError, CliError, OSError) as exc:
        # Bad input of any kind (a config, a scenario, a flag, a file): one line, no traceback.
        message = " ".join(str(exc).split())
        print(f"swa-hal {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
