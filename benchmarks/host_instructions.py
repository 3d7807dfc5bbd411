#!/usr/bin/env python
"""Host instructions per build, counted by valgrind's callgrind: a measure of the host path that does not
move with the machine's load, for before/after comparisons of two source trees.

Host timings on a shared machine move by up to 2x between runs; instruction counts repeat to about 0.5%.
Each case runs in its own process under ``valgrind --tool=callgrind``, on the CPU, with the Triton
backend ``cuda`` selected through a synthetic SM90 platform and its kernel launch replaced by a no-op, so
what is counted is exactly the Python and torch work an engine's CPU does per build (preflight, split,
plan, launch record, metadata) and nothing of the interpreter. Collection is switched on only inside
``itertools.starmap``'s ``next``, which drives the timed builds, so imports and warm-up are not counted.

    python benchmarks/host_instructions.py --a /path/to/before --b . [--builds 200] [--cases ...]

The ``torch_*`` cases are the torch backend on the CPU, nothing stubbed (``_unguarded``: ``guard=False``).

Needs valgrind. The launch stub reaches into the backends' launch objects (``_rows``/``_slot_rows``, or
the older ``_launch_rows``); it is a measuring tool, not an API.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = (
    "decode_only",
    "mixed",
    "long_prefill",
    "groups8",
    "groups8_stacked",
    # The vLLM step of 8 groups as the plugin's step builds feed it (benchmarks/vllm_step.py): a tuple of
    # tables, the [G, T] slot mappings, the batch from vLLM's common metadata, then the poll.
    "step8",
    # The same step handed out to the 8 groups' builders, as the plugin does (common.vllm_plugin_step).
    "plugin_step8",
    "slot_rows",
    "sglang_causal",
    "window_layout",
    # The torch backend's builds on the CPU (nothing stubbed), guarded (the default) and not.
    "torch_decode_only",
    "torch_decode_only_unguarded",
    "torch_mixed",
    "torch_mixed_unguarded",
    "torch_long_prefill",
    "torch_long_prefill_unguarded",
)


def _stub(builder):
    """Replace the kernel launch of ``builder``'s Triton backend with a no-op (both launch layouts)."""
    import torch

    def noop(*args, **kwargs):
        return None

    class Always:
        def __init__(self, entry):
            self.entry = entry

        def get(self, key, default=None):
            return self.entry

        def __getitem__(self, key):
            return self.entry

        def __contains__(self, key):
            return True

    backend = builder.backend
    if hasattr(backend, "_rows"):  # one launch object per kernel
        # The request-window launch exists where the tree has it (newer than the other two).
        for launch in (backend._rows, backend._slot_rows, getattr(backend, "_request_window", None)):
            if launch is None:
                continue
            launch.interpreted = False
            launch.pointer = torch.Tensor.data_ptr
            launch._compiled = Always((noop, (), ()))
            launch._current_stream = lambda index: 0
            launch._device_index = 0
        backend.allocate(builder.buffers)
    else:  # the earlier single launcher
        launch = backend._launch_rows
        launch.interpreted = False
        launch._compiled = Always((noop, (), (), ()))
        launch._current_stream = lambda index: 0
        launch._device_index = 0
    return builder


def _case(name: str, root: Path):
    """The build ``name`` stands for, on a stubbed guarded builder of the DeepSeek-V4-Flash config."""
    import dataclasses
    import random

    import torch

    from swa_hal import PlatformInfo, SWAConfig, SWAMetadataBuilder
    from swa_hal.scenarios import Scenario, synthesize_batch

    platform = PlatformInfo.from_assume("vendor=cuda,capability=9.0")
    cpu = torch.device("cpu")
    flash = SWAConfig.from_yaml(root / "configs" / "deepseek_v4_flash.yaml")

    def builder(config, **options):
        return _stub(
            SWAMetadataBuilder(
                config, device=cpu, backend="cuda", platform=platform, validate=False, guard=True, **options
            )
        )

    if name.startswith("torch_"):
        scenario = name.removeprefix("torch_").removesuffix("_unguarded")
        batch = Scenario.from_yaml(root / "configs" / "batches" / f"{scenario}.yaml").make_batch(flash, cpu)
        guarded = SWAMetadataBuilder(
            flash, device=cpu, backend="torch", validate=False, guard=not name.endswith("_unguarded")
        )
        return lambda: guarded.build(batch)
    if name == "window_layout":
        # DeepSeek-V4.1's decode-256 request-window layout through the SGLang adapter
        # (benchmarks/sglang_window.py's first scenario).
        sys.path.insert(0, str(root / "benchmarks"))
        from sglang_window import scenarios as window_scenarios

        from swa_hal.integrations.sglang import SGLangSWAIndices

        case = window_scenarios(cpu)[0]
        adapter = SGLangSWAIndices(case.window, cpu, backend="cuda", platform=platform, validate=False)
        _stub(adapter.builder)
        return lambda: adapter.window_layout(
            case.req, case.pos, zero_row=case.zero_row, capacity=case.capacity, floor=case.floor,
            num_groups=case.num_groups, padded_rows=case.padded_rows,
        )  # fmt: skip
    if name in ("slot_rows", "sglang_causal"):
        # SGLang's decode-256 causal rows (benchmarks/sglang_rows.py's pools): the plain build of a prepared
        # SlotRows, and the call through the plugin's adapter (the SlotRows made per call, then the poll).
        sys.path.insert(0, str(root / "benchmarks"))
        from sglang_rows import scenarios

        from swa_hal.integrations.sglang import SGLangSWAIndices

        kw = scenarios(cpu)["decode 256"]["kw"]
        adapter = SGLangSWAIndices(device=cpu, backend="cuda", platform=platform, validate=False)
        _stub(adapter.builder)
        if name == "sglang_causal":
            return lambda: adapter.causal(**kw)
        from swa_hal import SlotRows

        rows = SlotRows(
            row_ends=kw["seq_lens_casual"],
            pools=kw["req_pool_indices_repeated"],
            req_to_token=kw["req_to_token"],
            slot_map=kw["full_to_swa"],
            width=128,
        )
        return lambda: adapter.builder.build_slot_rows(rows)
    if name in ("step8", "plugin_step8"):
        sys.path.insert(0, str(root / "benchmarks"))
        from common import vllm_plugin_step, vllm_step_inputs

        from swa_hal.integrations.engine import batch_from_common_metadata

        inputs = vllm_step_inputs(8, 256, cpu)
        common = inputs.common(inputs.tables[0], inputs.slot_mappings[0])
        if name == "plugin_step8":
            import inspect

            # The plugin's builder: no planner objects (vLLM makes its own), where the tree has the option.
            has_option = "tile_schedulers" in inspect.signature(SWAMetadataBuilder).parameters
            options = {"tile_schedulers": False} if has_option else {}
            step = builder(inputs.config, **options)
            return vllm_plugin_step(inputs, step)
        step = builder(inputs.config)

        def step8():
            step.build_groups(batch_from_common_metadata(common), inputs.tables, inputs.slot_mappings)
            step.poll_violations()

        return step8
    if name in ("decode_only", "mixed", "long_prefill"):
        batch = Scenario.from_yaml(root / "configs" / "batches" / f"{name}.yaml").make_batch(flash, cpu)
        b = builder(flash)
        return lambda: b.build(batch)
    groups = 8
    config = dataclasses.replace(flash, num_kv_groups=groups)
    rng = random.Random(0)
    seqs = [rng.randint(1, 32768) for _ in range(256)]
    batch = synthesize_batch(config, seqs, [1] * 256, rng=rng, device=cpu)
    others = [synthesize_batch(config, seqs, [1] * 256, rng=rng, device=cpu) for _ in range(groups)]
    tables, slots = [o.block_table for o in others], [o.slot_mapping for o in others]
    b = builder(config)
    if name == "groups8":
        return lambda: b.build_groups(batch, tables, slots)
    width = max(t.shape[1] for t in tables)
    stacked_tables = torch.full((groups, config.max_num_seqs, width), -1, dtype=torch.int32)
    stacked_slots = torch.full((groups, config.max_num_batched_tokens), -1, dtype=torch.int64)
    for g in range(groups):
        stacked_tables[g, :256, : tables[g].shape[1]] = tables[g]
        stacked_slots[g, : slots[g].shape[0]] = slots[g]
    t, s = stacked_tables[:, :256], stacked_slots[:, : batch.num_tokens]
    return lambda: b.build_groups(batch, t, s)


def _worker(name: str, builds: int, root: Path) -> None:
    # The CPU runs Triton backends through the interpreter only; the stub replaces every launch anyway.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import collections
    import itertools

    import torch

    torch.set_num_threads(1)
    fn = _case(name, root)
    for _ in range(20):
        fn()
    # Counted only inside starmap's next (--toggle-collect=starmap_next): the builds alone.
    collections.deque(itertools.starmap(fn, itertools.repeat((), builds)), maxlen=0)


def count(tree: Path, name: str, builds: int) -> int:
    """Instructions per build of case ``name`` with the code of ``tree``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "backends")])}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            "valgrind", "--tool=callgrind", "--toggle-collect=starmap_next",
            f"--callgrind-out-file={tmp}/callgrind.out",
            sys.executable, str(Path(__file__).resolve()), "--worker", name, "--builds", str(builds),
            "--root", str(tree),
        ]  # fmt: skip
        run = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", run.stderr)
    if not found:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{run.stderr[-2000:]}")
    return int(found.group(1)) // builds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", type=Path, help="the tree before")
    parser.add_argument("--b", type=Path, default=Path("."), help="the tree after (default: this one)")
    parser.add_argument("--builds", type=int, default=200, help="builds counted per case (default 200)")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--worker", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.worker, args.builds, args.root)
        return 0
    trees = [t.resolve() for t in (args.a, args.b) if t is not None]
    print(f"instructions per build (callgrind, launch stubbed, {args.builds} builds per case)")
    print(f"{'case':<18}" + "".join(f"{str(t)[-28:]:>30}" for t in trees) + ("   B/A" if len(trees) == 2 else ""))
    for name in args.cases:
        counts = [count(t, name, args.builds) for t in trees]
        ratio = f"{counts[1] / counts[0]:6.3f}" if len(counts) == 2 else ""
        print(f"{name:<18}" + "".join(f"{c:>30,}" for c in counts) + f"   {ratio}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
