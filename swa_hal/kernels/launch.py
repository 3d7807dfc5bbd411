"""What every Triton kernel's launch object shares: compile keys, argument records, compile, launch.

Each kernel has one launch object beside it (``rows_launch.py``, ``slot_rows_launch.py``,
``ragged_launch.py``) that owns its launch contract:

* its compile key (a frozen dataclass of the kernel's constexprs, in signature order), its dispatch
  (``KeyedLaunch.key_for``: which key a call needs, from the call's facts, memoised in ``keys``) and the
  keys a config can need (``warmup_keys``), so ``warmup()`` can compile every variant a builder will ever
  launch;
* its argument record: a slotted dataclass of the kernel's other parameters, in signature order (a
  test holds both against the kernel's signature), with each pointer field's dtype (``POINTERS``)
  and the pointer fields that are engine tensors (``ENGINE``: an address read at every launch, never
  specialised on alignment). The other pointer fields are the builder's fixed buffers. A pointer
  field holds what the launch takes, ``launch.pointer(tensor)``: the tensor's address when
  compiled, the tensor itself in the interpreter; the caller applies it to engine tensors at every
  launch and to the builder's buffers once (they never move). A caller keeps one record per launch
  site and refills the fields that change by name before each launch: a keyword constructor call
  of some forty arguments would cost more host time than the rest of the launch, and every value still
  goes in under its name;
* compilation through Triton's own warmup API (no scratch launch: pointer arguments are given as
  dtypes), and a launch that takes one record.

A compiled launch calls the compiled kernel's C launch function directly with addresses: that skips
Triton's per-call argument binding, its Python launcher wrapper (which makes a closure and asks two
allocators for scratch space the kernels do not use) and, per pointer, a ``data_ptr()`` call and a
driver query. It is sound because nothing a launch passes can change the specialisation (runtime ints
and engine tensors are declared unspecialised) and the builder's host checks refuse tensors of
another dtype or device before every launch (what the driver query would have caught).

Nothing here imports Triton at module level: the keys and records are importable without it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import torch

from .. import envs
from ..cache import HostCache

if TYPE_CHECKING:
    from ..config import SWAConfig

NUM_WARPS = 4
# The C launch functions we call directly, by the layout of their arguments (a test holds each against
# the installed Triton's launcher source, tests/test_triton_versions.py). Triton 3.6 and 3.7: grid (3),
# stream, function, cooperative grid, PDL, global and profile scratch, kernel metadata, launch metadata,
# enter and exit hooks, then the kernel's arguments spread out. Triton 3.8 and 3.9: grid, stream, function,
# cooperative grid, PDL, kernel metadata, launch metadata, enter and exit hooks, global and profile
# scratch, the argument annotations and signature bytes of the launcher, then the kernel's arguments as
# one tuple. Another layout (another Triton) takes Triton's own launcher wrapper, still correct.
SPREAD_FORMAT = "iiiKKppOOOOOO"
TUPLE_FORMAT = "iiiKKpp(iii)OOOOOOy*O"
_TUPLE_CALL = (
    "gridX",
    "gridY",
    "gridZ",
    "stream",
    "function",
    "kernel_metadata",
    "launch_metadata",
    "launch_enter_hook",
    "launch_exit_hook",
    "args",
)


def num_warps() -> int:
    """Warps per program of every kernel; ``SWA_HAL_NUM_WARPS`` overrides it for tuning sweeps."""
    return envs.env_int("SWA_HAL_NUM_WARPS") or NUM_WARPS


# Floating-point fusion (FMA contraction) as every compile asks for it. The kernels do integer arithmetic
# only, so it changes no instruction; it is passed because triton 3.9 warns at a compile that leaves it to
# Triton's default (`TRITON_DEFAULT_FP_FUSION is unset`: the default, on through 3.9, turns off in 3.10).
# On, as that default has been: the compile options, and so the compiled kernels, stay those of 3.6 to 3.8.
FP_FUSION = True


def compile_options() -> dict[str, Any]:
    """The options of every compile and of every launch through Triton's own path (the same options, so
    such a launch finds the variant ``warmup()`` compiled: they are part of Triton's cache key)."""
    return {"num_warps": num_warps(), "enable_fp_fusion": FP_FUSION}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def record_fields(record: type) -> tuple[str, ...]:
    """The fields of an argument record, in order (the kernel's signature order)."""
    return tuple(f.name for f in dataclasses.fields(record))


def record_values(record: type) -> Callable[[Any], tuple[Any, ...]]:
    """A function returning a record's values as a tuple in field order: ``(r.a, r.b, ...)``."""
    # Generated, as dataclasses generates __init__: plain attribute loads are specialised by the
    # interpreter and cost a fraction of operator.attrgetter's generic lookup (measured per build).
    body = ", ".join(f"r.{name}" for name in record_fields(record))
    namespace: dict[str, Any] = {}
    exec(f"def values(r):\n    return ({body},)\n", namespace)  # noqa: S102 - field names only
    return namespace["values"]


class CompileKey:
    """Base of compile keys: frozen dataclasses of a kernel's constexprs, in signature order, declared
    ``@dataclasses.dataclass(frozen=True, eq=False)``. Keys are looked up on every launch: the hash is
    computed once, here, and equality (by value, as a dataclass's own) is here too. A subclass keeps both
    by leaving ``eq`` off: with ``eq=True`` a frozen dataclass writes its own ``__hash__``, which hashes
    the fields again at every lookup."""

    _hash: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(self._values()))

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))  # type: ignore[arg-type]

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def constexprs(self) -> dict[str, Any]:
        """The kernel's constexpr arguments, by name, in signature order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def pointer_dtypes(self) -> dict[str, torch.dtype]:
        """Dtypes of pointer fields that depend on the key (default: none; see ``POINTERS``)."""
        return {}


class DtypesKey(CompileKey):
    """A compile key whose kernel is also specialised on the dtypes of the engine's inputs: ``dtypes``,
    those of the pointer fields ``INPUTS`` names, in that order. A subclass declares ``dtypes`` as its last
    field (``= ()``), after the constexprs. The dtypes are no constexprs: the compile takes them as the
    pointers' dtypes (``pointer_dtypes``)."""

    INPUTS: ClassVar[tuple[str, ...]]
    dtypes: tuple[torch.dtype, ...]

    def constexprs(self) -> dict[str, Any]:
        out = super().constexprs()
        del out["dtypes"]
        return out

    def pointer_dtypes(self) -> dict[str, torch.dtype]:
        return dict(zip(self.INPUTS, self.dtypes))


def _hooks_idle(runtime: Any) -> bool:
    """No launch hooks are installed (profilers such as proton add some): the fast path may skip them.
    Triton 3.6 keeps an empty HookChain there rather than None."""
    hook = runtime.launch_enter_hook
    return hook is None or not getattr(hook, "calls", True)


def _nvidia_driver() -> Any:
    """The installed Triton's NVIDIA driver module, when it has one with a ``CudaLauncher``; else None."""
    try:
        from triton.backends.nvidia import driver as nvidia
    except ImportError:
        return None
    return nvidia if getattr(nvidia, "CudaLauncher", None) is not None else None


@functools.cache  # the installed Triton does not change within a process; read its source once
def launcher_layout() -> str | None:
    """Which C launch layout this Triton's NVIDIA launcher has: ``SPREAD_FORMAT`` (3.6, 3.7),
    ``TUPLE_FORMAT`` (3.8, 3.9), or None (another layout, or no NVIDIA backend: the wrapper's path)."""
    nvidia = _nvidia_driver()
    if nvidia is None:
        return None
    launcher = nvidia.CudaLauncher
    if getattr(nvidia, "_BASE_ARGS_FORMAT", None) == SPREAD_FORMAT:
        return SPREAD_FORMAT
    import inspect

    call = tuple(inspect.signature(launcher.__call__).parameters)[1:]
    if call == _TUPLE_CALL and "arg_annotations" in inspect.getsource(launcher.__init__):
        return TUPLE_FORMAT
    return None


def launcher_report() -> dict[str, Any]:
    """How compiled launches on an NVIDIA GPU go under the installed Triton (``swa-hal info``): directly
    through the C launch function of a layout recognised here, or why not (no Triton, no NVIDIA launcher,
    a layout this release of swa_hal does not know, whose launches take Triton's own wrapper)."""
    try:
        import triton
    except ImportError:
        return {"layout": None, "direct": False, "detail": "none: triton is not installed"}
    version = triton.__version__
    layout = launcher_layout()
    if layout is not None:
        how = "arguments spread" if layout == SPREAD_FORMAT else "arguments as one tuple"
        detail = f"direct, through triton {version}'s C launch function ({how}: {layout!r})"
        return {"layout": layout, "direct": True, "detail": detail}
    if _nvidia_driver() is None:
        detail = f"none: triton {version} has no NVIDIA launcher"
    else:
        detail = (
            f"through Triton's own launcher wrapper: triton {version}'s C launch layout is not one swa_hal "
            "knows (correct, a few microseconds slower per launch)"
        )
    return {"layout": None, "direct": False, "detail": detail}


def _direct_launch(kernel: Any) -> tuple[Any, tuple[Any, ...], bool] | None:
    """The C launch function, the arguments it takes before the kernel's own, and whether the kernel's
    arguments go in as one tuple, when this Triton's launcher can be called directly (a CUDA launcher of a
    known layout whose kernel needs no scratch space and no instrumentation); else None."""
    launcher = kernel.run  # loads the kernel onto the current device
    layout = launcher_layout()
    if (
        layout is None
        or type(launcher).__name__ != "CudaLauncher"
        or launcher.global_scratch_size
        or launcher.profile_scratch_size
        or getattr(launcher, "gsan_enabled", False)
    ):
        return None
    if layout == SPREAD_FORMAT:
        head: tuple[Any, ...] = (
            kernel.function,
            launcher.launch_cooperative_grid,
            launcher.launch_pdl,
            None,
            None,
            kernel.packed_metadata,
            None,
            None,
            None,
        )
        return launcher.launch, head, False
    from triton.runtime.driver import driver

    if launcher.launch is not driver.active.utils.launch:  # wrapped (tensor descriptors): not ours to skip
        return None
    head = (
        kernel.function,
        launcher.launch_cooperative_grid,
        launcher.launch_pdl,
        kernel.packed_metadata,
        None,
        None,
        None,
        None,
        None,
        launcher.arg_annotations,
        launcher.kernel_signature,
    )
    return launcher.launch, head, True


_INT64_MOCK = 2**32 + 1


class TritonLaunch:
    """One Triton kernel's launch contract (see the module docstring). Subclasses set ``KERNEL`` (the
    ``module:attribute`` of the ``@triton.jit`` function, imported when the object is made), ``Args``
    (the record type), ``POINTERS`` (each pointer field's dtype) and ``ENGINE`` (the pointer fields
    that are engine tensors)."""

    KERNEL: ClassVar[str]
    Args: ClassVar[Any]
    POINTERS: ClassVar[dict[str, torch.dtype]]
    ENGINE: ClassVar[tuple[str, ...]]
    # Integer fields compiled as int64 (the others are int32): a compiled launch packs each argument as its
    # compiled type, and a value past it is refused by the launcher (OverflowError), never widened.
    INT64: ClassVar[tuple[str, ...]] = ()

    def __init__(self, device: torch.device):
        import importlib

        import triton
        from triton.runtime.jit import JITFunction

        module, _, attr = self.KERNEL.partition(":")
        self.fn = getattr(importlib.import_module(module), attr)
        self.interpreted = not isinstance(self.fn, JITFunction)
        fields = record_fields(self.Args)
        self._fields = fields
        self._values = record_values(self.Args)
        # What a record's pointer fields hold: tensors for the interpreter, addresses for the C launch.
        self.pointer: Callable[[torch.Tensor], Any] = _same if self.interpreted else torch.Tensor.data_ptr
        # key -> (launch function, its leading arguments, constexpr values, kernel arguments as one tuple)
        self._compiled: dict[Hashable, tuple[Any, tuple[Any, ...], tuple[Any, ...], bool]] = {}
        self.direct: dict[Hashable, bool] = {}  # key -> launched through the C launch function directly
        self.kernels: dict[Hashable, Any] = {}  # the compiled kernels, for inspection (registers, spills)
        self.prepared: set[Hashable] = set()  # keys compiled (or, in the interpreter, seen by warmup)
        self.launches = 0
        self._runtime = triton.knobs.runtime
        if not self.interpreted:
            from triton.runtime.driver import driver

            self._current_stream = driver.active.get_current_stream
            self._device_index = device.index if device.index is not None else torch.cuda.current_device()

    # -- compile ---------------------------------------------------------------------------------

    def compile(self, key: CompileKey) -> None:
        """Compile ``key`` now through Triton's warmup API (pointer arguments given as their dtypes),
        on the current device. In the interpreter there is nothing to compile."""
        self.prepared.add(key)
        if self.interpreted or key in self._compiled:
            return
        dtypes = {**self.POINTERS, **key.pointer_dtypes()}
        # An int's mock value picks its compiled type: 1 is int32, a value past int32 int64.
        mock = [dtypes.get(name, _INT64_MOCK if name in self.INT64 else 1) for name in self._fields]
        constexprs = key.constexprs()
        kernel = self.fn.warmup(*mock, grid=(1,), **compile_options(), **constexprs)
        if hasattr(kernel, "result"):
            kernel = kernel.result()
        self.kernels[key] = kernel
        direct = _direct_launch(kernel)
        self.direct[key] = direct is not None
        if direct is None:
            # Through Triton's own launcher wrapper (its leading arguments differ).
            head: tuple[Any, ...] = (kernel.function, kernel.packed_metadata, None, None, None)
            self._compiled[key] = (kernel.run, head, tuple(constexprs.values()), False)
        else:
            launch, head, packed = direct
            self._compiled[key] = (launch, head, tuple(constexprs.values()), packed)

    # -- launch ----------------------------------------------------------------------------------

    def __call__(self, key: CompileKey, grid: int, args: Any) -> None:
        """Launch ``key`` on ``grid`` programs with the record ``args``, whose pointer fields hold
        ``self.pointer`` of their tensors."""
        self.launches += 1
        if self.interpreted:
            self.fn[(grid,)](*self._values(args), **compile_options(), **key.constexprs())
            return
        entry = self._compiled.get(key)
        if entry is None:
            self.compile(key)
            entry = self._compiled[key]
        launch, head, constexprs, packed = entry
        stream = self._current_stream(self._device_index)
        if _hooks_idle(self._runtime):
            if packed:
                launch(grid, 1, 1, stream, *head, (*self._values(args), *constexprs))
            else:
                launch(grid, 1, 1, stream, *head, *self._values(args), *constexprs)
        else:
            # A profiler's launch hooks are installed: the compiled kernel's own runner calls them.
            self.kernels[key][(grid, 1, 1)](*self._values(args), *constexprs, stream=stream)


KeyT = TypeVar("KeyT", bound=CompileKey)


class KeyedLaunch(TritonLaunch, Generic[KeyT]):
    """A launch that owns its dispatch too: which compile key a call needs (``dispatch``, from the call's
    facts: a tuple of what the call brings that the key depends on) and every key a config can need
    (``warmup_facts``). Made for one builder's config and address clamping; the guard is one of a call's
    facts, since the builder may switch it between calls.

    ``keys`` memoises the dispatch (``key_for``: one lookup, the dispatch only on a miss). ``warmup_keys``
    goes through ``key_for``, so a warmed variant is the very key a call finds. ``Facts``: the NamedTuple of a
    call's facts; ``dispatch`` reads them by name. A hot call may hand ``key_for`` the plain tuple of their
    values, in ``Facts``' order (it hashes and compares as the NamedTuple does), and ``key_for`` names it on a
    miss: a NamedTuple made per call costs about 0.4 us of a build's 10 us host path."""

    Facts: ClassVar[type]

    def __init__(self, device: torch.device, config: SWAConfig, *, clamp: bool = False):
        super().__init__(device)
        self.config = config
        self.clamp = clamp
        self.device_type = device.type
        self.keys: HostCache = HostCache(limit=256)  # kept as the host cache keeps (swa_hal/cache.py)

    def dispatch(self, facts: Any) -> KeyT:
        """The compile key of a call with these facts (uncached: see ``key_for``)."""
        raise NotImplementedError

    def warmup_facts(self, guard: bool) -> Sequence[tuple[Any, ...]]:
        """The facts of every call an engine with this config can make, guarded or not as ``guard``."""
        raise NotImplementedError

    def key_for(self, facts: tuple[Any, ...]) -> KeyT:
        key = self.keys.get(facts)
        if key is None:
            key = self.keys.keep(facts, self.dispatch(self.Facts(*facts)))
        return key

    def warmup_keys(self, guard: bool) -> list[KeyT]:
        """Every variant this config can launch, each once, in the order of ``warmup_facts``."""
        return list(dict.fromkeys(self.key_for(facts) for facts in self.warmup_facts(guard)))

    @property
    def kernel_name(self) -> str:
        return self.KERNEL.partition(":")[2]
