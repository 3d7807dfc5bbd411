"""Conformance topic: no host sync and no allocation in a build, checked on any device, the CPU included.

An engine captures decode builds in CUDA graphs and runs every build on its hot path, so ``build``,
``build_groups`` and the in-place draft-step updates must neither read a device value on the host (``.item()``,
``.tolist()``, ``int(t)``, ``.cpu()``, ``.numpy()``, ``.is_nonzero()``, ``torch.equal``, formatting a tensor, a
device-to-host ``copy_``: each a sync, and an error inside a capture) nor allocate a device tensor
(``torch.empty(..., device=...)``, ``t + 1``, ``x.new_zeros``: a capture would bake the address in). On a GPU the graph topic catches some of this for real; this topic
catches it on a CPU too, by watching every torch call the build makes (``BuildWatch``, a TorchFunctionMode).

On a CPU every tensor is a host tensor, so "device tensor" means what would be on the device: the batch's
device-side fields (not its host copies ``query_start_loc_cpu`` and ``seq_lens_cpu``, which a backend may read),
the builder's output buffers, the backend's own tensors, and whatever a torch op makes from any of them.
Tensors made on the host from host values (``torch.tensor(list)`` without ``device=``, to copy into a device
buffer) are allowed. The Triton interpreter's own host copies (it runs kernels on NumPy arrays) are not the
backend's doing and are not counted.

These are the rules of a build that can be captured in a CUDA graph, so the topic is collected for backends
that claim ``cuda_graphs``: the torch backend reads device values on purpose (and a backend built
on it inherits that). What it cannot see: work that does not go through torch (a vendor library reading
device memory through its own API, a ``torch.cuda.synchronize()``, a NumPy view of device memory), and a
lazy allocation on the first build of a shape (the topic builds each batch once before watching, as an
engine warms up before capturing).
"""

from __future__ import annotations

import dataclasses
import random
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..batch import AttentionBatch
from ..builder import SWAMetadataBuilder
from ..compare import compare_with_reference
from .fixtures import BackendFixtures, requires
from .groups import GROUPS, other_groups

# Tensor methods and builtins that hand a device value to the host (each one a sync on a GPU): formatting a
# tensor (``f"{t}"``, ``str(t)``) reads its values as ``repr`` does, and ``is_nonzero`` as ``bool`` does.
HOST_READS = frozenset(
    {
        "item",
        "tolist",
        "cpu",
        "numpy",
        "__int__",
        "__float__",
        "__bool__",
        "__index__",
        "__array__",
        "__repr__",
        "__str__",
        "__format__",
        "is_nonzero",
    }
)
# torch functions that compare tensors into a Python bool: a sync when any of their tensors is on the device.
HOST_COMPARISONS = frozenset({"equal", "allclose"})
# torch functions that make a new tensor from nothing; with device= (the builder's device) a device allocation.
FACTORIES = frozenset(
    {
        "empty",
        "empty_strided",
        "zeros",
        "ones",
        "full",
        "arange",
        "tensor",
        "as_tensor",
        "rand",
        "randn",
        "randint",
        "linspace",
        "eye",
        "empty_like",
        "zeros_like",
        "ones_like",
        "full_like",
        "rand_like",
        "randint_like",
    }
)
# Calls that make no new storage (metadata, views, in-place writes) and never need a look.
_QUIET = frozenset(
    {
        "data_ptr",
        "untyped_storage",
        "stride",
        "size",
        "dim",
        "numel",
        "storage_offset",
        "get_device",
        "is_contiguous",
        "element_size",
        "__get__",
        "__len__",
    }
)


def _tensors(obj: Any, skip: Callable[[str], bool] = lambda name: False, depth: int = 3) -> Iterator[torch.Tensor]:
    """Every tensor reachable from ``obj`` through attributes, dataclass fields, sequences and mappings."""
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if depth == 0 or obj is None or isinstance(obj, (str, bytes, int, float, bool, type)):
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not skip(str(key)):
                yield from _tensors(value, skip, depth - 1)
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a NamedTuple (the step's inputs): by name
        for key, value in zip(obj._fields, obj):
            if not skip(key):
                yield from _tensors(value, skip, depth - 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value, skip, depth - 1)
    elif hasattr(obj, "__dict__") or dataclasses.is_dataclass(obj):
        names = (
            vars(obj) if hasattr(obj, "__dict__") else {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        )
        for key, value in names.items():
            if not skip(key):
                yield from _tensors(value, skip, depth - 1)


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - a tensor without storage (meta, sparse) is never a device buffer here
        return 0


def _flat(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _flat(value)
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _flat(value)


class BuildWatch(TorchFunctionMode):
    """Records every host read of a device tensor and, with ``allocations``, every device allocation made by
    the code inside the ``with``: each problem as ``"what, at file:line (function)"``."""

    def __init__(self, device_tensors: Iterable[torch.Tensor], device: torch.device, allocations: bool = True):
        super().__init__()
        self.device = torch.device(device)
        self.allocations = allocations
        self.tainted = {p for p in (_storage(t) for t in device_tensors) if p}
        self.problems: list[str] = []

    def _is_device(self, t: Any) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        if t.device.type != "cpu" and t.device.type == self.device.type:
            return True
        return _storage(t) in self.tainted

    @staticmethod
    def _caller() -> tuple[str, str]:
        frame = sys._getframe(2)
        while frame is not None and frame.f_globals.get("__name__", "").startswith("torch"):
            frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return "", "?"
        code = frame.f_code
        return frame.f_globals.get("__name__", ""), f"{code.co_filename}:{frame.f_lineno} ({code.co_name})"

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _QUIET:
            return func(*args, **kwargs)
        module, where = self._caller()
        if module.startswith("triton"):
            return func(*args, **kwargs)  # the interpreter's own host copies, not the backend's
        inputs = list(_flat(args)) + list(_flat(kwargs))
        device_in = [t for t in inputs if self._is_device(t)]
        label = (
            getattr(func, "__qualname__", name)
            .replace("TensorBase.", "Tensor.")
            .replace("_VariableFunctionsClass.", "torch.")
        )
        if name in HOST_READS and args and self._is_device(args[0]):
            self.problems.append(f"{label}() reads a device tensor on the host (a sync), at {where}")
        elif name in HOST_COMPARISONS and device_in:
            self.problems.append(f"{label}() compares a device tensor on the host (a sync), at {where}")
        elif name == "to" and device_in and self._to_host(args, kwargs):
            self.problems.append(f"{label}(cpu) copies a device tensor to the host (a sync), at {where}")
        elif name == "copy_" and len(args) > 1 and self._is_device(args[1]) and not self._is_device(args[0]):
            self.problems.append(f"{label}() copies a device tensor into a host one (a sync), at {where}")
        before = {_storage(t) for t in inputs}
        out = func(*args, **kwargs)
        fresh = [t for t in _flat(out) if _storage(t) and _storage(t) not in before]
        explicit = (
            "device" in kwargs
            and kwargs["device"] is not None
            and torch.device(kwargs["device"]).type == (self.device.type)
        )
        if fresh and (device_in or (name in FACTORIES and explicit)):
            if self.allocations:
                self.problems.append(f"{label}() allocates a new device tensor, at {where}")
            self.tainted.update(_storage(t) for t in fresh)
        return out

    @staticmethod
    def _to_host(args: tuple, kwargs: dict) -> bool:
        for value in list(args[1:]) + [kwargs.get("device")]:
            if isinstance(value, (str, torch.device)) and torch.device(value).type == "cpu":
                return True
        return False


def device_tensors(builder: SWAMetadataBuilder, *batches_and_inputs: Any) -> list[torch.Tensor]:
    """What would be on the device: the builder's buffers and the backend's tensors, and the device-side fields
    of the batches and group inputs given (their ``*_cpu`` host copies left out)."""
    host_copy = lambda name: name.endswith("_cpu")  # noqa: E731 - the one rule, named
    out = list(_tensors(builder.buffers)) + list(_tensors(builder.backend))
    for obj in batches_and_inputs:
        out.extend(_tensors(obj, host_copy))
    return out


@contextmanager
def watched(builder: SWAMetadataBuilder, what: str, *inputs: Any) -> Iterator[BuildWatch]:
    """Run the body under a ``BuildWatch`` of ``builder`` and ``inputs``; fail naming every call it saw."""
    watch = BuildWatch(device_tensors(builder, *inputs), builder.device)
    with watch:
        yield watch
    if watch.problems:
        shown = "\n  ".join(dict.fromkeys(watch.problems))
        raise AssertionError(
            f"backend {builder.backend_name!r} claims cuda_graphs, but {what} made calls a CUDA-graph capture "
            f"cannot hold:\n  {shown}\nA build must read no device value on the host (use the batch's host copies "
            f"query_start_loc_cpu / seq_lens_cpu, or keep the value on the device) and allocate nothing (write "
            f"into the builder's buffers, or into buffers of your own made once in allocate()); or drop "
            f"cuda_graphs=True from the spec"
        )


def separate_host_copies(batch: AttentionBatch) -> AttentionBatch:
    """The batch with host copies of their own: on a CPU a batch's host copy may be its device field itself,
    and a read of the one must not pass for a read of the other."""
    device = {_storage(t) for t in _tensors(batch, lambda name: name.endswith("_cpu"))}

    def own(value: torch.Tensor) -> torch.Tensor:
        return value.clone() if _storage(value) in device else value

    seq_lens_cpu = None if batch.seq_lens_cpu is None else own(batch.seq_lens_cpu)
    return batch.replace(query_start_loc_cpu=own(batch.query_start_loc_cpu), seq_lens_cpu=seq_lens_cpu)


class HostSyncTests(BackendFixtures):
    """Builds of every batch kind of the V4 config, a group build and in-place draft steps, each watched."""

    WATCH_CONFIG = "v4"
    DRAFT_CONFIG = "w4b4_mtp"

    @requires("cuda_graphs")
    def test_builds_neither_sync_nor_allocate(
        self, name: str, make_builder: Callable[..., SWAMetadataBuilder], make_batch: Callable
    ) -> None:
        config = self.configs[self.WATCH_CONFIG]
        builder = make_builder(config)
        builder.warmup()
        rng = random.Random(f"host-sync-{name}")
        for kind in ("decode", "mtp", "mixed", "prefill", "padded", "invalid"):
            batch = separate_host_copies(make_batch(config, rng, kind))
            builder.build(batch)  # the first build of a shape may set things up; the next ones may not
            with watched(builder, f"build() of a {kind} batch", batch):
                md = builder.build(batch)
            problems = compare_with_reference(config, batch, md)
            assert not problems, f"{kind} batch: " + "; ".join(problems)

    @requires("cuda_graphs")
    def test_group_builds_and_draft_updates_neither_sync_nor_allocate(
        self, name: str, make_builder: Callable[..., SWAMetadataBuilder], make_batch: Callable
    ) -> None:
        config = dataclasses.replace(self.configs[self.DRAFT_CONFIG], num_kv_groups=GROUPS)
        builder = make_builder(config)
        builder.warmup()
        rng = random.Random(f"host-sync-groups-{name}")
        batch = make_batch(config, rng, "decode", max_context=config.max_model_len - 8, extra_pages=2)
        batch = separate_host_copies(batch)
        tables, slots = other_groups(config, batch, GROUPS, rng)
        builder.build_groups(batch, tables, slots)
        with watched(builder, "build_groups() of a decode batch", batch, tables, slots):
            mds = builder.build_groups(batch, tables, slots)
        md = builder.build(batch)
        if not builder.supports_draft_decode_metadata_update:
            return
        for step in range(2):
            batch.seq_lens.add_(1)
            assert batch.seq_lens_cpu is not None, "a draft step's batch needs seq_lens_cpu"
            batch.seq_lens_cpu.add_(1)
            with watched(builder, f"update_draft_decode_metadata() of one build, step {step + 1}", batch, md):
                builder.update_draft_decode_metadata(md)
            with watched(builder, f"update_draft_decode_metadata() of a group build, step {step + 1}", batch, mds):
                builder.update_draft_decode_metadata(mds)
