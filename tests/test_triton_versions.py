"""The kernels on the Triton releases swa_hal supports (docs/kernels.md #triton-versions).

Runs in every environment the suite runs in: ``make test`` (triton 3.6) and the engine environments
(``make test-vllm``: triton 3.8 under vLLM 0.34, 3.6 under 0.33). What each checks:

* the compiled launch's fast path (``kernels/launch.py``) calls Triton's C launch function with the
  argument layout of the installed release: the launcher source shipped with it is read here, so a
  release that changes the call fails this test instead of silently leaving the fast path (or worse,
  passing arguments in the wrong places);
* the interpreter probe passes here, names the versions where it does not, and keeps a Triton backend
  from starting where the interpreter cannot run the kernels.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from swa_hal import PlatformInfo, SWAConfig, SWAMetadataBuilder
from swa_hal.errors import BackendUnavailableError
from swa_hal.kernels import interpreter_probe, launch

triton = pytest.importorskip("triton")


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
