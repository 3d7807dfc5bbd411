"""Engine calls swa_hal does not know go to the engine's own code (docs/engines.md #drift).

An engine moves faster than its releases: a hooked op gains a keyword, an object loses an attribute a hook
reads, a metadata class gains a field. A hook that meets such a call steps aside: the engine's own code
serves that call, the hook says so once in the engine's log (which hook, what it did not know) and counts
it (``stepped_aside``; ``swa-hal info --engine`` prints the counts). It never raises inside the engine,
except under ``SWA_HAL_STRICT=1``, where the call raises ``EngineDriftError`` instead.

What counts as drift: arguments that do not bind to the hook's own signature, any exception raised inside
the hook that is not one of swa_hal's typed errors (an attribute or a key the hook reads and the engine no
longer has, a value of another type), and whatever a plugin's own check finds (a set field of the engine's
metadata that swa_hal does not know). swa_hal's typed errors (``SWAHalError``: a step's input that breaks a
rule, a guard violation raised under ``SWA_HAL_STRICT=1``) keep their meaning and are raised as before; an
exception the engine's own code raises inside a hook passes through unchanged.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from ..envs import env_flag
from ..errors import SWAHalError

F = TypeVar("F", bound=Callable[..., Any])


class EngineDriftError(SWAHalError, RuntimeError):
    """A hook met an engine call it does not know, under ``SWA_HAL_STRICT=1`` (otherwise the call steps aside
    to the engine's own code)."""

    def __init__(self, engine: str, hook: str, reason: str):
        self.engine = engine
        self.hook = hook
        self.reason = reason
        super().__init__(
            f"swa_hal's {engine} hook {hook} met a call it does not know ({reason}); SWA_HAL_STRICT=1 refuses it "
            f"instead of handing it to {engine}'s own code"
        )


# Reasons kept apart per hook; past these, a hook's further reasons share one count (a reason that names a
# value could otherwise make a new entry, and a new log line, at every call).
MAX_REASONS = 32
OTHER_REASONS = f"other reasons (past the first {MAX_REASONS} kinds)"

_lock = threading.Lock()
_counts: Counter[tuple[str, str, str]] = Counter()  # (engine, hook, reason) -> calls that stepped aside


def step_aside(engine: str, hook: str, reason: str, logger: logging.Logger) -> None:
    """Count a call ``hook`` hands to the engine's own code, and log it the first time it happens for this
    reason; under ``SWA_HAL_STRICT=1`` raise ``EngineDriftError`` instead."""
    if env_flag("SWA_HAL_STRICT"):
        raise EngineDriftError(engine, hook, reason)
    key = (engine, hook, reason)
    with _lock:
        if key not in _counts and sum(k[:2] == key[:2] for k in _counts) >= MAX_REASONS:
            key = (engine, hook, OTHER_REASONS)
        first = key not in _counts
        _counts[key] += 1
    if first:
        logger.warning(
            "swa_hal: %s's %s: %s; this call and every one like it goes to %s's own code "
            "(counted: swa_hal.integrations.stepped_aside(); SWA_HAL_STRICT=1 raises instead)",
            engine,
            hook,
            reason,
            engine,
        )


def stepped_aside(engine: str | None = None) -> list[dict[str, Any]]:
    """Every (engine, hook, reason) whose calls stepped aside in this process, with how many did: what an
    engine's process can ask at any time (``swa-hal info --engine`` asks its own process)."""
    with _lock:
        items = sorted(_counts.items())
    return [
        {"engine": e, "hook": h, "reason": r, "calls": n} for (e, h, r), n in items if engine is None or e == engine
    ]


def reset_stepped_aside() -> None:
    """Forget the counts (tests)."""
    with _lock:
        _counts.clear()


def unbound(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why ``args`` and ``kwargs`` do not bind to ``signature`` (Python's own words: an unexpected or a
    missing argument), or None when they do."""
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        params = signature.parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        unknown = [] if takes_any else [k for k in kwargs if k not in params]
        required = [
            name
            for name, p in params.items()
            if p.default is inspect.Parameter.empty and p.kind is inspect.Parameter.KEYWORD_ONLY and name not in kwargs
        ]
        said = []
        if unknown:
            said.append(f"arguments it does not know: {', '.join(unknown)}")
        if required:
            said.append(f"arguments it needs that the call lacks: {', '.join(required)}")
        return "; ".join(said) or f"a call it does not know: {exc}"
    return None


def signature_gaps(engine_fn: Callable[..., Any], hook_fn: Callable[..., Any], hook_leading: int = 1) -> str | None:
    """What the engine's function ``engine_fn`` takes that the hook ``hook_fn`` does not know, and what the hook
    needs that the engine's function no longer takes, by parameter name (the hook's first ``hook_leading``
    parameters, its ``original``, are the hook's own); None when they agree. A start-up check: calls that pass
    what the hook does not know step aside (``attempt``)."""
    try:
        theirs = inspect.signature(engine_fn).parameters
        ours = inspect.signature(hook_fn).parameters
    except (TypeError, ValueError) as exc:
        return f"no signature to compare ({exc})"
    ours_named = {n: p for i, (n, p) in enumerate(ours.items()) if i >= hook_leading}
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    unknown = [n for n, p in theirs.items() if p.kind in plain and n not in ours_named]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ours_named.values()):
        unknown = []
    gone = [
        n
        for n, p in ours_named.items()
        if p.kind in plain and p.default is inspect.Parameter.empty and n not in theirs and n not in ("self", "cls")
    ]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in theirs.values()):
        gone = []  # the engine's takes any keyword: only its calls tell
    said = []
    if unknown:
        said.append(f"the engine's takes {', '.join(unknown)}, which the hook does not know")
    if gone:
        said.append(f"the hook needs {', '.join(gone)}, which the engine's no longer takes")
    return "; ".join(said) or None


def drift_reason(exc: BaseException) -> str:
    """An exception a hook raised, as the reason its call steps aside."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


# Set on an exception the engine's own code raised inside a hook (``engine_call``): it is the engine's answer
# to the call, passed on as it is, never taken for drift.
_ENGINE_RAISED = "__swa_hal_engine_raised__"


def engine_call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, a call of the engine's own code from inside a hook: an exception it raises
    is marked as the engine's, so the hook's wrapper passes it on rather than taking it for drift (and
    calling the engine a second time)."""
    try:
        return function(*args, **kwargs)
    except BaseException as exc:
        try:
            setattr(exc, _ENGINE_RAISED, True)
        except AttributeError:  # an exception class without a __dict__: taken for drift, the safe side
            pass
        raise


def raised_by_engine(exc: BaseException) -> bool:
    return getattr(exc, _ENGINE_RAISED, False)


def attempt(
    fn: Callable[..., Any], signature: inspect.Signature, original: Callable[..., Any], args: tuple, kwargs: dict
) -> tuple[bool, Any]:
    """``fn(original, *args, **kwargs)`` as a hook runs it: (True, its result), or (False, why it cannot serve
    this call: drift, as the module docstring says). ``fn`` gets ``original`` wrapped by ``engine_call``. A
    ``SWAHalError``, and an exception the engine's code raised inside ``fn`` (``engine_call``), propagate."""
    why = unbound(signature, (original, *args), kwargs)
    if why is not None:
        return False, why
    try:
        return True, fn(functools.partial(engine_call, original), *args, **kwargs)
    except SWAHalError:
        raise
    except Exception as exc:
        if raised_by_engine(exc):
            raise
        return False, drift_reason(exc)


def around(engine: str, hook: str, logger: logging.Logger) -> Callable[[F], F]:
    """An AROUND hook (``fn(original, *args, **kwargs)``) that steps aside on drift (``attempt``): the call goes
    to ``original``, once counted and logged (``step_aside``)."""

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def hooked(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            served, result = attempt(fn, signature, original, args, kwargs)
            if served:
                return result
            step_aside(engine, hook, result, logger)
            return original(*args, **kwargs)

        return hooked  # type: ignore[return-value]

    return decorate
