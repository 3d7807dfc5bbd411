"""The kernels on the Triton releases swa_hal supports (docs/kernels.md #triton-versions).

Runs in every environment the suite runs in: ``make test`` (triton 3.6), the engine environments
(``make test-vllm``: triton 3.8 under vLLM 0.34, 3.6 under 0.33) and ``make test-torch-next`` (triton 3.9). What each checks:

* the compiled launch's fast path (``kernels/launch.py``) calls Triton's C launch function with the
  argument layout of the installed release: the launcher source shipped with it is read here, so a
  release that changes the call fails this test instead of silently leaving the fast path (or worse,
  passing arguments in the wrong places);
* the interpreter probe passes here, names the versions where it does not, and keeps a Triton backend
  from starting where the interpreter cannot run the kernels;
* swa_hal's compiles ask for every option triton 3.9 warns about when left to its default (FP fusion), and
  ``swa-hal info`` names the launch path the installed release gets.
"""

from __future__ import annotations

import importlib
import inspect
import re
import warnings
from pathlib import Path

import pytest

from swa_hal import PlatformInfo, SWAConfig, SWAMetadataBuilder
from swa_hal.errors import BackendUnavailableError
from swa_hal.kernels import interpreter_probe, launch

triton = pytest.importorskip("triton")
VERSION = tuple(int(p) for p in triton.__version__.split(".")[:2])


def _flat(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _nvidia_driver():
    from triton.backends.nvidia import driver

    return driver


def test_the_installed_launcher_has_a_layout_swa_hal_calls_directly():
    """Triton 3.6/3.7 spread the kernel's arguments after 13 leading ones; 3.8 passes them as one tuple
    after 16. swa_hal recognises both; another layout would take Triton's own (slower) launcher."""
    layout = launch.launcher_layout()
    major_minor = tuple(int(p) for p in triton.__version__.split(".")[:2])
    expected = launch.TUPLE_FORMAT if major_minor >= (3, 8) else launch.SPREAD_FORMAT
    assert layout == expected, f"triton {triton.__version__}: launcher layout {layout!r}"


def test_the_fast_path_passes_arguments_where_the_installed_launcher_expects_them():
    """What ``_direct_launch`` builds, held against the launcher's own call of the C function in the
    installed release's source (Python wrapper and C argument parser)."""
    driver = _nvidia_driver()
    call = _flat(inspect.getsource(driver.CudaLauncher.__call__))
    if launch.launcher_layout() == launch.SPREAD_FORMAT:
        assert driver._BASE_ARGS_FORMAT == launch.SPREAD_FORMAT
        # grid, stream, function, cooperative, PDL, global and profile scratch, then the rest spread out:
        # kernel metadata, launch metadata, the two hooks (what the compiled kernel's runner passes first).
        assert (
            "self.launch(gridX,gridY,gridZ,stream,function,self.launch_cooperative_grid,self.launch_pdl,"
            "global_scratch,profile_scratch,*args)" in call
        )
    else:
        source = (Path(driver.__file__).parent / "driver.c").read_text()
        assert f'PyArg_ParseTuple(args, "{launch.TUPLE_FORMAT}"' in source
        assert (
            "self.launch(gridX,gridY,gridZ,stream,function,self.launch_cooperative_grid,self.launch_pdl,"
            "kernel_metadata,launch_metadata,launch_enter_hook,launch_exit_hook,global_scratch,"
            "profile_scratch,self.arg_annotations,self.kernel_signature,kernel_args)" in call
        )
        assert tuple(inspect.signature(driver.CudaLauncher.__call__).parameters)[1:] == launch._TUPLE_CALL


def test_the_interpreter_here_runs_the_kernels():
    assert interpreter_probe.interpreter_problem() is None


def test_a_failing_interpreter_is_named_with_its_versions(monkeypatch):
    import numpy

    def broken():
        def launch_(*args, **kwargs):
            raise ValueError("mask has unsupported dtype")

        class Kernel:
            def __getitem__(self, grid):
                return launch_

        return Kernel()

    interpreter_probe.interpreter_problem.cache_clear()
    monkeypatch.setattr(interpreter_probe, "_kernel", broken)
    try:
        problem = interpreter_probe.interpreter_problem()
    finally:
        interpreter_probe.interpreter_problem.cache_clear()
    assert problem is not None
    assert f"triton {triton.__version__}" in problem and f"numpy {numpy.__version__}" in problem
    assert "mask has unsupported dtype" in problem and interpreter_probe.WORKING in problem


def test_a_triton_backend_does_not_start_where_the_interpreter_cannot_run_it(monkeypatch):
    """An explicit request fails with the probe's reason (never a builder that fails at its first build)."""
    from swa_hal.kernels import interpreter_probe as probe

    monkeypatch.setattr(probe, "interpreter_problem", lambda: "the Triton interpreter of triton X cannot run")
    config = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=4)
    with pytest.raises(BackendUnavailableError, match="backend 'sm12x': the Triton interpreter of triton X"):
        SWAMetadataBuilder(
            config, "cpu", backend="sm12x", platform=PlatformInfo.from_assume("vendor=cuda,capability=12.0")
        )


def _fp_fusion_warnings(action) -> list[str]:
    """The FP-fusion warnings ``action()`` raises, with triton 3.9's once-per-process record of its
    warnings cleared first (an earlier compile in this process would otherwise hide them)."""
    warn_once = getattr(importlib.import_module("triton._utils"), "warn_once", None)
    if hasattr(warn_once, "cache_clear"):
        warn_once.cache_clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        action()
    return [str(w.message) for w in seen if "FP_FUSION" in str(w.message)]


def test_compile_options_leave_no_fp_fusion_default_to_warn_about(monkeypatch):
    """Triton 3.9 warns at a compile that leaves FP fusion to its default (``TRITON_DEFAULT_FP_FUSION is
    unset``). The options every compile passes (``launch.compile_options``), parsed by the installed
    release's NVIDIA backend as a compile parses them (no GPU needed): no warning, fusion on as the
    default of 3.6 to 3.9 is, and the warps the kernels ask for."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend

    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)
    backend = CUDABackend(GPUTarget("cuda", 90, 32))
    parsed = []
    assert _fp_fusion_warnings(lambda: parsed.append(backend.parse_options(launch.compile_options()))) == []
    assert parsed[0].enable_fp_fusion is True and parsed[0].num_warps == launch.num_warps()
    # Without the option, 3.9 warns: what this test sees if a compile stops passing it.
    left_out = _fp_fusion_warnings(lambda: backend.parse_options({"num_warps": launch.num_warps()}))
    if VERSION == (3, 9):
        assert left_out and "TRITON_DEFAULT_FP_FUSION is unset" in left_out[0]


@pytest.mark.parametrize(
    "backend, assume",
    [
        ("cuda", "vendor=cuda,capability=9.0"),
        ("sm12x", "vendor=cuda,capability=12.0"),
        ("rocm", "vendor=rocm,arch=gfx942"),
        ("xpu", "vendor=xpu"),
    ],
)
def test_interpreted_builds_raise_no_fp_fusion_warning(monkeypatch, backend, assume):
    """In the interpreter nothing is compiled, so Triton's compile-time FP-fusion warning has no path
    there (3.9's interpreter never parses compile options); a warmed build on each Triton backend, its
    warnings recorded, holds that for the release installed here."""
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)
    config = SWAConfig(window_size=4, block_size=4, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=4)

    def build() -> None:
        import random

        from swa_hal.testing import compare_with_reference, random_batch

        builder = SWAMetadataBuilder(config, "cpu", backend=backend, platform=PlatformInfo.from_assume(assume))
        builder.warmup()
        batch = random_batch(config, random.Random(0), "mixed")
        assert not compare_with_reference(config, batch, builder.build(batch))

    assert _fp_fusion_warnings(build) == []


def test_info_names_the_launch_path_of_the_installed_triton(capsys):
    """``swa-hal info`` says whether compiled launches go directly through the installed release's C launch
    function: 3.6 and 3.7 by the spread layout, 3.8 and 3.9 by the tuple layout."""
    import json

    from swa_hal.cli import main

    assert main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["triton_launch"]
    expected = launch.TUPLE_FORMAT if VERSION >= (3, 8) else launch.SPREAD_FORMAT
    assert report["layout"] == expected and report["direct"] is True
    assert report["detail"].startswith(f"direct, through triton {triton.__version__}'s C launch function")
    assert main(["info"]) == 0
    assert f"NVIDIA compiled launches: {report['detail']}" in capsys.readouterr().out


def test_info_names_a_missing_or_unknown_launcher(monkeypatch):
    """A layout swa_hal does not know, and a Triton without an NVIDIA launcher, are named as such."""
    monkeypatch.setattr(launch, "launcher_layout", lambda: None)
    report = launch.launcher_report()
    assert report["direct"] is False and "layout is not one swa_hal knows" in report["detail"]
    assert f"triton {triton.__version__}" in report["detail"]
    monkeypatch.setattr(launch, "_nvidia_driver", lambda: None)
    report = launch.launcher_report()
    assert report == {
        "layout": None,
        "direct": False,
        "detail": f"none: triton {triton.__version__} has no NVIDIA launcher",
    }
