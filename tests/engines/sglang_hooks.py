"""SGLang's own functions under swa_hal's hooks, for tests that compare the two: what each hook target held
before SGLang's hook registry wrapped it, and a context that puts those back for a while.

SGLang's registry replaces a target's attribute with a wrapper (``functools.wraps``, ``__wrapped__`` set to
what it wrapped) and rebinds module-level ``from X import name`` copies of it; class attributes copied from
another class (ROCm's backend takes its DSpark method from the CUDA backend's) are targets of their own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pkgutil
import sys
from collections.abc import Iterator
from typing import Any

from swa_hal.integrations import sglang as integ


def _raw(owner: Any, attr: str) -> Any:
    # The class's own entry, so a classmethod stays a classmethod.
    return owner.__dict__[attr] if isinstance(owner, type) and attr in owner.__dict__ else getattr(owner, attr)


def _unwrapped(value: Any) -> Any:
    """SGLang's own function under any number of the registry's wrappers (theirs carry ``__wrapped__``;
    SGLang's functions here do not)."""
    func = value.__func__ if isinstance(value, classmethod) else value
    while getattr(func, "__wrapped__", None) is not None:
        func = func.__wrapped__
    assert func.__module__.startswith("sglang."), (func, func.__module__)
    return classmethod(func) if isinstance(value, classmethod) else func


class Originals:
    """Every swa_hal hook target's SGLang function, read (and unwrapped) now."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[Any, str, Any]] = {}
        for target in integ.TARGETS:
            owner_path, attr = target.rsplit(".", 1)
            owner = pkgutil.resolve_name(owner_path)
            self.entries[target] = (owner, attr, _unwrapped(_raw(owner, attr)))

    def _bindings(self) -> list[tuple[Any, str, Any]]:
        """(holder, name, SGLang's function) for every target and every module-level copy of a function."""
        out = [entry for entry in self.entries.values()]
        for owner, attr, func in self.entries.values():
            if isinstance(owner, type):
                continue
            for module in list(sys.modules.values()):
                if module is owner or not getattr(module, "__name__", "").startswith("sglang."):
                    continue
                held = vars(module).get(attr)
                if held is not None and held is not func and _is_wrapper_of(held, func):
                    out.append((module, attr, func))
        return out

    def restore(self) -> None:
        """SGLang's own functions back in place for good (the end of a test module)."""
        for holder, name, func in self._bindings():
            setattr(holder, name, func)

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        """Every target and module-level copy as it is now (hooked or not) put back after the block: a block that
        runs SGLang's loader again would wrap the hooked functions once more."""
        saved = [(holder, name, _raw(holder, name)) for holder, name, _ in self._bindings()]
        try:
            yield
        finally:
            for holder, name, value in saved:
                setattr(holder, name, value)

    @contextlib.contextmanager
    def sglang_own(self) -> Iterator[None]:
        """SGLang's own functions in place of swa_hal's hooks for the block, the hooks back afterwards."""
        saved = [(holder, name, _raw(holder, name)) for holder, name, _ in self._bindings()]
        try:
            for holder, name, func in self._bindings():
                setattr(holder, name, func)
            yield
        finally:
            for holder, name, value in saved:
                setattr(holder, name, value)


def _is_wrapper_of(value: Any, func: Any) -> bool:
    seen = value
    while getattr(seen, "__wrapped__", None) is not None:
        seen = seen.__wrapped__
        if seen is func:
            return True
    return False


class LogLines(logging.Handler):
    """Keeps the message of every record of the loggers it is added to."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def fresh_loader_state() -> None:
    """SGLang's plugin loader and hook registry, and swa_hal's install-once guard and shadow, as in a new
    process."""
    import sglang.srt.plugins as sgl_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.reset()
    integ._install_once.reset()
    integ._shadow = None  # the install sets it when it shadows SGLang
    sgl_plugins._plugins_loaded = False


@contextlib.contextmanager
def loaded_by_sglang(originals: Originals) -> Iterator[tuple[LogLines, LogLines]]:
    """SGLang's own plugin loader run as every SGLang process runs it (``SGLANG_PLUGINS=swa_hal``), from a fresh
    loader state, with swa_hal's log lines and the plugin loader's (at INFO, as SGLang's servers log) kept for
    the block. Afterwards the log handlers are removed, ``SGLANG_PLUGINS`` is as it was, ``originals`` are put
    back and the loader is fresh again."""
    import sglang.srt.plugins as sgl_plugins

    ours, registry = LogLines(), LogLines()
    loggers = (logging.getLogger(integ.log.name), ours), (logging.getLogger("sglang.srt.plugins"), registry)
    for logger, lines in loggers:
        logger.addHandler(lines)
        logger.setLevel(logging.INFO)
    saved = os.environ.get("SGLANG_PLUGINS")
    os.environ["SGLANG_PLUGINS"] = "swa_hal"
    fresh_loader_state()
    integ.configure()
    try:
        sgl_plugins.load_plugins()
        yield ours, registry
    finally:
        for logger, lines in loggers:
            logger.removeHandler(lines)
        if saved is None:
            os.environ.pop("SGLANG_PLUGINS", None)
        else:
            os.environ["SGLANG_PLUGINS"] = saved
        originals.restore()
        fresh_loader_state()
        integ.configure()
