"""The ``swa-hal`` command: info | build | bench | warmup | matrix | new-backend.

Run without a command, it prints this help to stderr and exits 2 (a usage error, like any other).
Reports go to stdout; every error and warning goes to stderr, one line each.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any

from . import __version__
from .platform import PlatformInfo
from .spelling import closest

if TYPE_CHECKING:
    from pathlib import Path

    from .config import SWAConfig
    from .scenarios import Scenario


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


def _error(args: argparse.Namespace, message: str) -> None:
    """An error of a command that still printed its report: one line on stderr."""
    print(f"swa-hal {args.command}: error: {' '.join(message.split())}", file=sys.stderr)


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    """Every warning raised while a command runs (a plugin that failed to load, a backend that failed to
    start) printed once, as one line on stderr, without the source line Python's default adds."""
    from .envs import EnvWarning
    from .plugins import PluginWarning

    seen: set[str] = set()

    def show(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
        text = " ".join(str(message).split())
        if not issubclass(category, (PluginWarning, EnvWarning)):
            text = f"{category.__name__}: {text}"
        if text not in seen:
            seen.add(text)
            print(f"swa-hal: warning: {text}", file=sys.stderr)

    with warnings.catch_warnings():
        for category in (PluginWarning, EnvWarning):
            warnings.simplefilter("always", category)  # repeats are dropped above, by their text
        warnings.showwarning = show
        yield


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
    xpu = getattr(torch, "xpu", None)
    if not platform.synthetic and platform.vendor == "xpu" and xpu is not None and xpu.is_available():
        return torch.device("xpu")
    return torch.device("cpu")


def _platform(args: argparse.Namespace) -> PlatformInfo:
    assumed = _assumed(args)
    if assumed is not None:
        return assumed
    import torch

    from .platform import probe_platform

    text = getattr(args, "device", None)
    if text is None:
        return probe_platform(None)
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as exc:
        raise CliError(f"--device {text!r}: {exc}") from None
    return probe_platform(device)


def _check_environment() -> None:
    """Read every SWA_HAL_* variable (and TRITON_INTERPRET) of a kind that can be misspelt before the
    command runs: a value that is not a word or number its variable takes is one line naming the
    variable, not a traceback from wherever the library first reads it."""
    from . import envs

    envs.warn_unknown()  # a misspelt name is a warning: the command still runs, as the library would
    readers = {"flag": envs.env_flag, "switch": envs.env_switch, "int": envs.env_int, "engine": envs.env_engine_mode}
    for var in envs.VARIABLES.values():
        read = readers.get(var.kind)
        if read is not None:
            try:
                read(var.name)
            except ValueError as exc:
                raise CliError(f"environment: {exc}") from None


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
    from .kernels.launch import launcher_report

    data = {
        "versions": _versions(),
        "triton_launch": launcher_report(),
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
    if args.env:
        from .envs import describe

        data["env"] = describe()
    if args.engine is not None:
        if args.engine == "vllm":
            from .integrations.vllm import plugin_report
        else:
            from .integrations.sglang import plugin_report

        data["engine"] = plugin_report()
    if selection is None:
        from .selection import build_candidates

        data["backends"] = [c.to_dict() for c in build_candidates(registry, platform)]
    runs = started if started is not None else data["selected"]
    ok = error is None and (args.expect is None or runs == args.expect)
    ok = ok and (args.engine is None or data["engine"]["active"])
    check = None
    if args.expect is not None and runs != args.expect:
        what = (
            f"selected {data['selected']!r}"
            if started in (None, data["selected"])
            else (f"selected {data['selected']!r} but it failed to start, so {started!r} runs")
        )
        check = f"expected backend {args.expect!r}, {what}"
        registered = sorted(registry.backends)
        if args.expect not in registered:
            # A misspelt or uninstalled name can never run: say so rather than only what was selected.
            close = closest(args.expect, registered)
            hint = f" (did you mean {close!r}?)" if close else ""
            check += (
                f"; no backend named {args.expect!r} is registered at all{hint}: registered: "
                f"{', '.join(registered) or 'none'}"
            )
        data["error"] = (error + "; " if error else "") + check
    elif args.expect is not None and ok:
        check = f"backend {args.expect!r} is selected and starts, as expected"
    if data["error"]:
        _error(args, data["error"])
    if args.json:
        _emit_json(data)
        return 0 if ok else 1
    v = data["versions"]
    print(
        f"swa-hal {v['swa-hal']}  (torch {v['torch']}, triton {v['triton']}, pluggy {v['pluggy']}, "
        f"python {v['python']}, flash_mla wheel {v['tokenspeed-flashmla'] or 'none'})"
    )
    print(f"platform: {platform.describe()}" + ("  [Triton interpreter on]" if platform.triton_interpret else ""))
    print(f"NVIDIA compiled launches: {data['triton_launch']['detail']}")
    print("plugins:")
    # Columns as wide as their widest entry: a plugin's name or distribution may be longer than any built-in's.
    dists = [f"{p.dist} {p.version or ''}".strip() if p.dist else "-" for p in registry.plugins]
    name_w = max([12, *(len(p.name) for p in registry.plugins)])
    dist_w = max([28, *map(len, dists)])
    for p, dist in zip(registry.plugins, dists):
        print(f"  {p.name:<{name_w}} {p.status:<9} {dist:<{dist_w}} {', '.join(p.backends) or p.detail}")
        if p.detail and p.backends:
            print(f"  {'':<{name_w}} {p.detail}")
    # registry.problems were printed on stderr as warnings while the registry loaded (and are in --json).
    if args.env:
        print("environment (swa_hal/envs.py):")
        values = [f"= {var['value']!r}" if var["value"] else "unset" for var in data["env"]]
        name_w, value_w = max([26, *(len(var["name"]) for var in data["env"])]), max([12, *map(len, values)])
        for var, value in zip(data["env"], values):
            default = f", default {var['default']}" if var["default"] else ""
            print(f"  {var['name']:<{name_w}} {value:<{value_w}} {var['kind']}{default}: {var['meaning']}")
    if selection is not None:
        print("backends:")
        print("\n".join("  " + line for line in selection.explain().splitlines()[1:]))
        for key, value in backend_status.items():
            print(f"  {selection.name} {key}: {value}")
    else:
        print("backends:")
        width = max([10, *(len(c["name"]) for c in data["backends"])])
        for c in data["backends"]:
            state = "available" if c["available"] else "unavailable: " + "; ".join(c["reasons"])
            print(f"    {c['name']:<{width}} priority {c['priority']:>4}  {state}")
    if check is not None:
        print(f"expect: {check}")
    if args.engine is not None:
        _print_engine(data["engine"])
    return 0 if ok else 1


def _print_engine(report: dict[str, Any]) -> None:
    """The ``--engine`` section: whether the plugin is active here and in which mode, each thing that decides it,
    what would step aside to the engine's own code, and what stepped aside or was compared in this process."""
    engine = {"vllm": "vLLM", "sglang": "SGLang"}[report["engine"]]
    version = report["version"] or "not installed"
    supported = ", ".join(report["supported"])
    group = "vllm.general_plugins" if report["engine"] == "vllm" else "sglang.srt.plugins"
    print(f"engine: {engine} {version} (the plugin is tested with {supported})")
    print(f"  entry point:   {group} swa_hal = {report['entry_point'] or 'none'}")
    filter_name, allowed = report.get("engine_plugins") or ("VLLM_PLUGINS", report.get("vllm_plugins"))
    print(f"  {filter_name + ':':<14} {'unset (every general plugin loads)' if allowed is None else repr(allowed)}")
    ((name, value),) = ((k, v) for k, v in report["switch"].items() if k != "on")
    print(
        f"  {name + ':':<14} {'unset' if value is None else repr(value)} ({'on' if report['switch']['on'] else 'off'})"
    )
    if report["startup"]:
        print(f"  start-up line: {report['startup']}")
    for message in report["messages"]:
        print(f"  plugin said:   {message}")
    if report["active"]:
        print(f"  active: yes, {'shadowing' if report.get('mode') == 'shadow' else 'serving'} {engine}")
    else:
        print(f"  active: no: {report['reason']}")
    for hook, why in (report.get("hook_gaps") or {}).items():
        print(f"  drift:         {hook}: {why}")
    shadow = report.get("shadow")
    if shadow:
        print(
            f"  shadow:        {shadow['mode']}: {shadow['calls']} calls, {shadow['compared']} compared, "
            f"{shadow['equal']} equal" + (f"; {shadow['difference']}" if shadow["difference"] else "")
        )
    aside = report.get("stepped_aside") or []
    print(f"  stepped aside: {sum(e['calls'] for e in aside)} calls in this process")
    for entry in aside:
        print(f"    {entry['hook']}: {entry['calls']} ({entry['reason']})")


# -- build --------------------------------------------------------------------------------------


def _config(args: argparse.Namespace):
    from .config import SWAConfig

    return _config_file(args.config) if getattr(args, "config", None) else SWAConfig()


def _config_file(path: str | Path) -> SWAConfig:
    """``SWAConfig.from_yaml(path)``; a scenario given as the config (most of its keys are a scenario's) is
    said to be one: the config and the scenario were probably swapped (the scenario's loader says the same
    of a config given as the scenario)."""
    from .config import SWAConfig, load_yaml_mapping, swapped_hint
    from .errors import ConfigError
    from .scenarios import Scenario

    try:
        return SWAConfig.from_yaml(path)
    except ConfigError as exc:
        try:
            scenario_keys = {f.name for f in dataclasses.fields(Scenario)}
            hint = swapped_hint(load_yaml_mapping(path, "config"), "scenario", scenario_keys)
        except ConfigError:
            hint = ""
        if not hint:
            raise
        raise ConfigError(exc.field, f"{exc.message}{hint}") from None


def _differences(given: SWAConfig, named: SWAConfig) -> str:
    """The settings two configs differ in, with both values where they are short."""
    out = []
    for field in dataclasses.fields(given):
        mine, theirs = getattr(given, field.name), getattr(named, field.name)
        if mine != theirs:
            values = f" ({mine!r} vs {theirs!r})"
            out.append(field.name + (values if len(values) <= 40 else ""))
    return ", ".join(out)


def _scenario_config(args: argparse.Namespace, path: str) -> tuple[Scenario, SWAConfig, str]:
    """A scenario and the config it runs with: ``--config``, else the one its ``config:`` key names. A
    scenario that names a config runs with that config's settings only: a ``--config`` with the same
    settings (a copy, another path to it, a file with other comments) is that config; one with other
    settings is an error naming both and the settings they differ in. What a config is, is its settings,
    never its path: a copy must run where the original does."""
    from .scenarios import Scenario

    given = _config(args) if args.config else None  # a bad --config is reported before a bad scenario
    scenario = Scenario.from_yaml(path)
    named = scenario.config_file(path)
    if given is None:
        if named is None:
            raise CliError(
                f"--batch {path}: scenario {scenario.name!r} names no config (no config: key), so --config is "
                f"needed: pass --config FILE, or add config: FILE to the scenario"
            )
        return scenario, _config_file(named), str(named)
    if named is not None:
        meant = _config_file(named)
        if given != meant:
            raise CliError(
                f"--config {args.config} does not match --batch {path}: scenario {scenario.name!r} is meant for "
                f"config {str(named)!r} (its config: key), and the two differ in {_differences(given, meant)} "
                f"(--config's value first). Leave out --config to use that one (a scenario without a config: key "
                f"runs with any config)"
            )
    return scenario, given, str(args.config)


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

    scenario, config, config_path = _scenario_config(args, args.batch)
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
        "config": config_path,
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
    if mismatches:
        _error(args, f"{len(mismatches)} output(s) differ from swa_hal.reference (backend {builder.backend_name})")
    if args.json:
        _emit_json(out)
        return 1 if mismatches else 0
    print(f"config {config_path}  scenario {scenario.name}: {scenario.description}")
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

    device = _device(args)
    rows = []
    for path in args.batch:
        scenario, config, _ = _scenario_config(args, path)
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


def _warmup_total(backend: Any) -> int | None:
    """How many variants ``backend.warmup`` prepares, for the progress bar (None: it cannot say)."""
    from .backend import Backend

    if type(backend).warmup is Backend.warmup:
        return 0
    keys = getattr(backend, "kernel_keys", None)  # the Triton backends: one variant per key
    if callable(keys):
        try:
            return len(keys())
        except Exception:  # noqa: BLE001 - only the bar's total depends on it
            return None
    return None


def _clip(text: str, width: int) -> str:
    """``text`` cut from the right (its start says what it is), with an ellipsis when cut."""
    return text if len(text) <= width else text[: width - 3] + "..."


def cmd_warmup(args: argparse.Namespace) -> int:
    from .builder import SWAMetadataBuilder

    config = _config(args)
    platform = _assumed(args)
    builder = SWAMetadataBuilder(config, device=_device(args), backend=args.backend, platform=platform)
    name = builder.backend_name
    total = _warmup_total(builder.backend)
    try:
        from tqdm import tqdm
    except ImportError:  # progress is optional
        tqdm = None

    def label(msg: str) -> str:
        return _clip(msg.removeprefix(f"{name}: "), 60)

    t0 = time.perf_counter()
    if total == 0:  # nothing to compile (the torch backend): no bar
        count = builder.warmup()
    elif tqdm is not None:
        bar = tqdm(total=total, desc=f"warmup {name}", unit="variant", file=sys.stderr)

        def progress(msg: str) -> None:
            bar.set_postfix_str(label(msg), refresh=False)
            bar.update(1)

        count = builder.warmup(progress)
        bar.close()
    else:
        done = [0]

        def progress(msg: str) -> None:
            done[0] += 1
            print(f"  compiling {done[0]}/{total if total is not None else '?'}: {label(msg)}", file=sys.stderr)

        count = builder.warmup(progress)
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
        try:
            platform = PlatformInfo.from_assume(assume)
        except ValueError as exc:  # a plugin's platform string --assume does not take: that row's problem
            platform = PlatformInfo(vendor="?", synthetic=True)
            selected, declared_by = None, f"{declared_by} (its platform {assume!r}: {exc})"
        else:
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


# -- new-backend --------------------------------------------------------------------------------


def cmd_new_backend(args: argparse.Namespace) -> int:
    from .new_backend import PluginNames, write_plugin

    names = PluginNames.of(args.name)
    folder = write_plugin(args.name, args.dir)
    print(f"wrote {names.distribution} into {folder}/: package {names.package}, backend and entry point {names.name!r}")
    print("next: pip install -e the folder (next to swa_hal, installed with its test extra), then, in it:")
    print(f"  pytest tests   # the conformance kit, which passes as written; swa-hal info --assume vendor={names.name}")
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
        # One line even when a word of the command line holds a line break.
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def _add_backend_and_platform(p: argparse.ArgumentParser) -> None:
    """The options of the commands that start a backend: which one, and a synthetic platform to start it on."""
    p.add_argument("--backend", metavar="NAME", help="request this backend (default: automatic selection)")
    p.add_argument(
        "--assume",
        metavar="PLATFORM",
        help="synthetic platform (with TRITON_INTERPRET=1 to run Triton backends on the CPU)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="swa-hal",
        description="Sliding-window-attention metadata for DeepSeek-V4-style sparse MLA: inspect the platform, "
        "plugins and backend selection, build and check a batch scenario, time builds, compile kernels.",
        epilog="Run without a command, swa-hal prints this help to stderr and exits 2. "
        "`swa-hal COMMAND --help` describes a command.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}", help="print the version")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    scenario_config = (
        "the model config (YAML); default: the config the scenario names (its config: key). A scenario that names "
        "a config runs with that one only"
    )

    p = sub.add_parser("info", help="versions, platform, plugins, backends and the selection")
    p.add_argument("--json", action="store_true", help="machine-readable output (for CI)")
    p.add_argument(
        "--assume",
        metavar="PLATFORM",
        help="evaluate against a synthetic platform, e.g. vendor=cuda,capability=12.0 (on a CPU, Triton backends "
        "start only with TRITON_INTERPRET=1)",
    )
    p.add_argument("--backend", metavar="NAME", help="explain an explicit request for this backend")
    p.add_argument(
        "--expect",
        metavar="NAME",
        help="start the selected backend as a builder would and exit 1 unless NAME is the one that runs",
    )
    p.add_argument("--status", action="store_true", help="also start the selected backend and report its state")
    p.add_argument(
        "--env", action="store_true", help="also list every SWA_HAL_* variable: meaning, default and value here"
    )
    p.add_argument("--config", metavar="FILE", help="config to start the backend with (default: built-in defaults)")
    p.add_argument("--device", default=None, help="probe this device (default: the best one here)")
    p.add_argument(
        "--engine",
        choices=("vllm", "sglang"),
        help="also load the engine's plugins as it does at start-up and say whether swa_hal's is active and in which "
        "mode, what would step aside to the engine's own code, and what did in this process (exit 1 unless active)",
    )
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("build", help="build metadata for a scenario, check it against the reference")
    p.add_argument("--config", metavar="FILE", help=scenario_config)
    p.add_argument("--batch", required=True, metavar="SCENARIO", help="a scenario (YAML), e.g. from configs/batches/")
    _add_backend_and_platform(p)
    p.add_argument("--device", default="cpu", help="torch device to build on: cpu or cuda[:N] (default: cpu)")
    p.add_argument("--repeat", type=_positive, default=5, metavar="N", help="builds to time (default: 5)")
    p.add_argument("--no-check", action="store_true", help="skip the comparison with reference.py")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("bench", help="quick host-time medians here (benchmarks/bench_build.py is the full run)")
    p.add_argument("--config", metavar="FILE", help=scenario_config)
    p.add_argument("--batch", required=True, nargs="+", metavar="SCENARIO", help="one or more scenarios (YAML)")
    p.add_argument("--backend", metavar="NAME", help="request this backend (default: automatic selection)")
    p.add_argument("--device", default="cpu", help="torch device to build on: cpu or cuda[:N] (default: cpu)")
    p.add_argument("--iters", type=_positive, default=50, metavar="N", help="timed builds per scenario (default: 50)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("warmup", help="compile every kernel variant a config can launch")
    p.add_argument("--config", required=True, metavar="FILE", help="the model config (YAML)")
    _add_backend_and_platform(p)
    p.add_argument("--device", default="cpu", help="torch device to compile for: cpu or cuda[:N] (default: cpu)")
    p.set_defaults(func=cmd_warmup)

    p = sub.add_parser("matrix", help="the CI job matrix: each target platform and the backend it should select")
    p.add_argument("--json", action="store_true", help='machine-readable output: {"include": [rows]} for CI')
    p.set_defaults(func=cmd_matrix)

    p = sub.add_parser("new-backend", help="write a new backend plugin package, the example plugin renamed")
    p.add_argument("name", metavar="NAME", help="the backend's name, e.g. acme (package swa_hal_acme)")
    p.add_argument(
        "--dir", metavar="PATH", help="the folder to write it into, new or empty (default: ./swa-hal-NAME-backend)"
    )
    p.set_defaults(func=cmd_new_backend)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if not argv:
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    from .errors import SWAHalError

    with _one_line_warnings():
        try:
            _check_environment()
            return int(args.func(args) or 0)
        except BrokenPipeError:  # the reader went away (`swa-hal build ... | head`): nothing left to say
            with contextlib.suppress(OSError):
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - so the interpreter's final flush is quiet
            return 1
        except (SWAHalError, CliError, OSError) as exc:
            # Bad input of any kind (a config, a scenario, a flag, a file): one line, no traceback.
            _error(args, str(exc))
            return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
