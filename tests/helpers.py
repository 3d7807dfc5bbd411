"""Constants and helpers shared by the test modules."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import SimpleNamespace

from swa_hal import PlatformInfo, SWAConfig, SWAMetadataBuilder
from swa_hal.plugins import PluginRegistry

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
SCENARIOS = sorted((CONFIGS / "batches").glob("*.yaml"))

# Each built-in backend and a platform on which it is the one selected.
BACKEND_PLATFORMS = {
    "torch": "vendor=cpu",
    "cuda": "vendor=cuda,capability=9.0",
    "sm12x": "vendor=cuda,capability=12.0",
    "rocm": "vendor=rocm,arch=gfx942,capability=9.4",
    "xpu": "vendor=xpu",
}
TRITON_BACKENDS = ("cuda", "sm12x", "rocm", "xpu")

# On the CPU the four Triton backends run one set of kernels through the interpreter: cuda and xpu the same
# variant, sm12x the clamped one (every lane address-checked), rocm cuda's and then its ragged form of the
# decode rows (which the conformance kit's cases check in make test). So a costly check of every backend runs
# on torch, cuda and sm12x in make test, and on xpu and rocm (cuda's kernels again) in make test-sweep (CI runs
# both): ``swept`` marks those.
SWEPT_BACKENDS = ("rocm", "xpu")


def swept(backends, also: tuple[str, ...] = ()) -> list:
    """``backends`` as test parameters, those of SWEPT_BACKENDS (and ``also``) marked ``sweep``."""
    import pytest

    return [pytest.param(b, marks=pytest.mark.sweep) if b in SWEPT_BACKENDS + also else b for b in backends]


def rotated(configs, backends=tuple(BACKEND_PLATFORMS)) -> list:
    """``config, backend`` parameters over a grid of configs and backends: the torch backend on every config,
    each config on one of the Triton backends make test keeps (cuda and sm12x, in turn); the other cases, and
    SWEPT_BACKENDS', marked ``sweep``."""
    import pytest

    kept = [b for b in backends if b in TRITON_BACKENDS and b not in SWEPT_BACKENDS]
    out = []
    for i, config in enumerate(configs):
        for b in backends:
            core = b not in TRITON_BACKENDS or (b in kept and kept.index(b) == i % len(kept))
            out.append(pytest.param(config, b, id=f"{config}-{b}", marks=() if core else pytest.mark.sweep))
    return out


def make_builder(config: SWAConfig, backend: str, **kwargs) -> SWAMetadataBuilder:
    platform = PlatformInfo.from_assume(BACKEND_PLATFORMS[backend])
    return SWAMetadataBuilder(config, device="cpu", backend=backend, platform=platform, **kwargs)


# On an NVIDIA GPU every Triton backend can run: the others are forced with a synthetic platform.
GPU_FORCED = {
    "cuda": None,
    "sm12x": "vendor=cuda,capability=12.0",
    "rocm": "vendor=rocm,arch=gfx942,capability=9.4",
    "xpu": "vendor=xpu",
}


def graph_backends() -> list[str]:
    """The GPU-forced backends whose specs say a decode-only build can be captured in a CUDA graph."""
    return [name for name, b in PluginRegistry().backends.items() if name in GPU_FORCED and b.spec.cuda_graphs]


def gpu_builder(name: str, config: SWAConfig, **kwargs) -> SWAMetadataBuilder:
    assume = GPU_FORCED[name]
    platform = PlatformInfo.from_assume(assume) if assume else None
    return SWAMetadataBuilder(config, device="cuda", backend=name, platform=platform, **kwargs)


def common_metadata(batch, **overrides):
    """A duck-typed stand-in for an engine's common attention metadata, from ``batch``."""
    fields = dict(
        seq_lens=batch.seq_lens, seq_lens_cpu_upper_bound=batch.seq_lens_cpu,
        query_start_loc=batch.query_start_loc, query_start_loc_cpu=batch.query_start_loc_cpu,
        block_table_tensor=batch.block_table, slot_mapping=batch.slot_mapping,
        max_query_len=batch.max_query_len, num_actual_tokens=int(batch.query_start_loc_cpu[-1]),
        causal=batch.causal, num_reqs=batch.seq_lens.shape[0],
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


def strictness(backend: str):
    """The address checks a backend's kernels run under on the CPU: every lane on SM12x (it does not clamp),
    the active lanes on the other Triton backends, none for the torch build."""
    from swa_hal.testing import address_strict

    if backend == "sm12x":
        return address_strict()
    if backend == "torch":
        return contextlib.nullcontext()
    return address_strict(active_only=True)


def fuzz_settings(examples: int = 40, *suppressed):
    """The malformed-input fuzz tests' settings: ``examples`` fixed, derandomized examples
    (SWA_HAL_FUZZ_EXAMPLES scales them, SWA_HAL_FUZZ_RANDOM draws fresh ones); ``suppressed``: health
    checks to suppress besides the slow and large data every one of them has."""
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=int(os.environ.get("SWA_HAL_FUZZ_EXAMPLES", str(examples))),
        deadline=None,
        derandomize=not os.environ.get("SWA_HAL_FUZZ_RANDOM"),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, *suppressed],
    )


def assert_check_names(field: str, *builders, error=None) -> None:
    """Each builder's ``check()`` raises ``error`` (default: ``BatchRangeError``), naming ``field``."""
    import pytest

    from swa_hal.errors import BatchRangeError

    for builder in builders:
        with pytest.raises(error or BatchRangeError) as checked:
            builder.check()
        assert checked.value.field == field, (field, checked.value)


def one_slot_rows_launch_replayed(builder: SWAMetadataBuilder, rows, shape: tuple[int, int] = (256, 128)):
    """On the GPU: assert one ``build_slot_rows`` call of ``builder`` on ``rows`` is one kernel and no host
    sync; then capture a call into outputs of ``shape``, step ``rows.row_ends`` in place (+37, the next
    decode step) and replay. Returns the replay's rows and lens, for the caller's model to check."""
    import torch
    from torch.profiler import DeviceType, ProfilerActivity, profile

    builder.build_slot_rows(rows)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        builder.build_slot_rows(rows)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
    assert len(kernels) == 1, kernels
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as idle:
        torch.cuda.synchronize()

    def syncs(p):
        return [e.name for e in p.events() if "Synchronize" in e.name or e.name in ("aten::item", "aten::_local_scalar_dense")]

    assert syncs(prof) == syncs(idle)  # the profiler's and the test's own synchronisation, nothing more

    out = torch.empty(shape, dtype=torch.int32, device="cuda")
    lens = torch.empty(shape[0], dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        builder.build_slot_rows(rows, out=out, lens=lens)
    rows.row_ends.add_(37)  # the next decode step, written in place
    graph.replay()
    torch.cuda.synchronize()
    return out, lens


def kit_run(tmp_path, *args, files=None, env=None):
    """pytest with only the conformance kit's plugin, in a folder of its own (none of this checkout's pytest
    settings apply), after writing ``files`` (name -> source) there; ``env``: the environment (default: this
    one with TRITON_INTERPRET=1)."""
    import subprocess
    import sys
    import textwrap

    for name, text in (files or {}).items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = dict(os.environ, TRITON_INTERPRET="1") if env is None else dict(env)
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "swa_hal.testing.plugin", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )


@contextlib.contextmanager
def logged_warnings(caplog, name: str):
    """A callable listing the warnings of the logger ``name``, each once: caplog listens at the root, which
    an engine's logging configuration may cut off from the engine's loggers, so its handler also listens
    on ``name``."""
    import logging

    logger = logging.getLogger(name)
    logger.addHandler(caplog.handler)

    def warnings():
        records = {id(r): r for r in caplog.records if r.name == logger.name and r.levelno == logging.WARNING}
        return [r.getMessage() for r in records.values()]

    try:
        yield warnings
    finally:
        logger.removeHandler(caplog.handler)
