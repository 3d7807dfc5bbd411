"""Running Triton kernels on the CPU, and an address-strict mode that reproduces the SM12x rule.

The Triton interpreter (``TRITON_INTERPRET=1``, set before triton is imported) executes kernels
with numpy on CPU tensors, but it does not bounds-check: a masked-off lane may point anywhere.
SM12x GPUs with Triton 3.6 fault on such addresses even when the lane is masked off. Inside
``address_strict()``, every load, store and atomic checks every lane, masked or not: its address
must fall inside the storage of a tensor passed to the kernel (a view may run into its base
storage), else ``AddressViolation`` names the kernel, the program and the lanes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..envs import env_flag


class AddressViolation(AssertionError):
    """A lane's address lies outside every tensor argument of the kernel."""


def require_interpreter() -> None:
    if not env_flag("TRITON_INTERPRET"):
        raise RuntimeError("Triton kernels on the CPU need TRITON_INTERPRET=1 set before triton is imported")


_state = threading.local()


def _stack() -> list[dict[str, Any]]:
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


def _storage_ranges(args: Any) -> list[tuple[int, int, str]]:
    import torch

    out: list[tuple[int, int, str]] = []

    def visit(arg: Any, name: str) -> None:
        base = getattr(arg, "base", None) if not isinstance(arg, torch.Tensor) else None
        if isinstance(base, torch.Tensor):  # TensorWrapper
            arg = base
        if isinstance(arg, torch.Tensor):
            storage = arg.untyped_storage()
            start = storage.data_ptr()
            out.append((start, start + storage.nbytes(), name))
        elif isinstance(arg, (tuple, list)):
            for i, item in enumerate(arg):
                visit(item, f"{name}[{i}]")

    for name, arg in args:
        visit(arg, name)
    return out


def _check(kind: str, ptrs: Any, mask: Any) -> None:
    stack = _stack()
    if not stack:
        return
    ctx = stack[-1]
    from triton.runtime.interpreter import _get_np_dtype

    size = np.dtype(_get_np_dtype(ptrs.get_element_ty())).itemsize
    addrs = np.asarray(ptrs.data, dtype=np.uint64).reshape(-1)
    inside = np.zeros(addrs.shape, dtype=bool)
    for lo, hi, _ in ctx["ranges"]:
        inside |= (addrs >= np.uint64(lo)) & (addrs + np.uint64(size) <= np.uint64(hi))
    if inside.all():
        return
    masked = np.asarray(mask.data, dtype=bool).reshape(-1) if mask is not None else np.ones(addrs.shape, bool)
    masked = np.broadcast_to(masked, addrs.shape)
    if ctx["active_only"]:
        inside |= ~masked  # a masked-off lane touches no memory on GPUs without the SM12x rule
        if inside.all():
            return
    lanes = np.flatnonzero(~inside)
    from triton.runtime.interpreter import interpreter_builder

    shown = ", ".join(
        f"lane {int(i)} @0x{int(addrs[i]):x} ({'active' if masked[i] else 'masked off'})" for i in lanes[:8]
    )
    more = f" and {lanes.size - 8} more" if lanes.size > 8 else ""
    raise AddressViolation(
        f"address-strict: kernel {ctx['kernel']} program {interpreter_builder.grid_idx}: {kind} of "
        f"{size}-byte elements has {lanes.size} of {addrs.size} lanes outside every tensor argument: "
        f"{shown}{more}"
    )


# The interpreter's memory operations address_strict checks (in every supported Triton).
PATCHED_BUILDER_METHODS = ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas")


@contextlib.contextmanager
def address_strict(active_only: bool = False, extra: Any = ()) -> Iterator[None]:
    """Check every lane of every interpreted load/store/atomic while the context is active; with
    ``active_only``, only the lanes the mask leaves on (what any GPU requires). ``extra``: tensors a
    kernel reaches through addresses it was handed in a table (group builds), allowed like arguments."""
    require_interpreter()
    from triton.runtime import interpreter as it

    # (owner, attribute) of everything patched; block-pointer loads and stores exist up to triton 3.7.
    targets = [
        (it.GridExecutor, "_init_args_hst"),
        (it.GridExecutor, "__call__"),
        *((it.InterpreterBuilder, name) for name in PATCHED_BUILDER_METHODS),
        *(
            (it.InterpreterBuilder, name)
            for name in ("create_tensor_pointer_load", "create_tensor_pointer_store")
            if hasattr(it.InterpreterBuilder, name)
        ),
    ]
    saved = {(owner, name): getattr(owner, name) for owner, name in targets}
    originals = {
        "init": it.GridExecutor._init_args_hst,
        "call": it.GridExecutor.__call__,
        "load": it.InterpreterBuilder.create_masked_load,
        "store": it.InterpreterBuilder.create_masked_store,
        "rmw": it.InterpreterBuilder.create_atomic_rmw,
        "cas": it.InterpreterBuilder.create_atomic_cas,
    }

    def init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = originals["init"](self, args_dev, kwargs)
        named = list(zip(self.arg_names, args_hst)) + list(kwargs_hst.items())
        _stack()[-1]["ranges"] = _storage_ranges(named) + _storage_ranges([("extra", list(extra))])
        return args_hst, kwargs_hst

    def call(self, *args, **kwargs):
        _stack().append({"kernel": getattr(self.fn, "__name__", "?"), "ranges": [], "active_only": active_only})
        try:
            return originals["call"](self, *args, **kwargs)
        except it.InterpreterError as exc:
            # Each interpreted call level wraps the error again; surface the violation itself.
            cause = exc.__cause__
            while cause is not None and not isinstance(cause, AddressViolation):
                cause = cause.__cause__
            if cause is not None:
                raise AddressViolation(str(cause)) from None
            raise
        finally:
            _stack().pop()

    def load(self, ptrs, mask, other, *rest):
        _check("masked load", ptrs, mask)
        return originals["load"](self, ptrs, mask, other, *rest)

    def store(self, ptrs, value, mask, *rest):
        _check("masked store", ptrs, mask)
        return originals["store"](self, ptrs, value, mask, *rest)

    def rmw(self, op, ptr, val, mask, *rest):
        _check("atomic", ptr, mask)
        return originals["rmw"](self, op, ptr, val, mask, *rest)

    def cas(self, ptr, cmp, val, *rest):
        _check("atomic cas", ptr, None)
        return originals["cas"](self, ptr, cmp, val, *rest)

    def unsupported(*_args, **_kwargs):
        raise AddressViolation("address-strict: block-pointer loads/stores are not checked; use plain pointers")

    replacements = {
        "_init_args_hst": init_args,
        "__call__": call,
        "create_masked_load": load,
        "create_masked_store": store,
        "create_atomic_rmw": rmw,
        "create_atomic_cas": cas,
        "create_tensor_pointer_load": unsupported,
        "create_tensor_pointer_store": unsupported,
    }
    for owner, name in targets:
        setattr(owner, name, replacements[name])
    try:
        yield
    finally:
        for (owner, name), original in saved.items():
            setattr(owner, name, original)
