"""Every environment variable swa_hal reads, in one place: its name, kind, default and meaning.

Variables are read when asked (never cached at import), so a test or an engine that sets one before
building sees it. Kinds:

* ``flag``: on when set to a true word (``TRUE_WORDS``, any case, spaces ignored), off when unset, empty or
  a false word (``FALSE_WORDS``); any other word is an error;
* ``switch``: on unless set to a false word (``FALSE_WORDS``); any other word than a true or false
  one is an error, so a typo never silently flips a behaviour;
* ``engine``: an engine plugin's mode (``env_engine_mode``): ``serve`` when unset or a true word, ``off`` for a
  false word, ``shadow`` for ``shadow``; any other word is an error;
* ``int``: an integer (at least ``minimum`` where the variable has one), or unset;
* ``text``: a string, or unset; ``list``: comma-separated names.

``swa-hal info --env`` prints the table with the values this process sees. A variable whose name starts
with ``SWA_HAL_`` but is none of these (a misspelling, ``BACKND`` for ``BACKEND``) would otherwise be ignored
without a word, so ``warn_unknown`` warns about it once, naming the closest known name; the plugin
registry calls it when it loads, and the ``swa-hal`` command before it runs.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping

from .spelling import closest

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class EnvVar:
    name: str
    kind: str  # flag | switch | int | text | list
    meaning: str
    default: str = ""
    # The smallest value an ``int`` variable takes (None: any integer).
    minimum: int | None = None


VARIABLES: dict[str, EnvVar] = {
    v.name: v
    for v in (
        EnvVar("SWA_HAL_BACKEND", "text", "the backend to use when the builder names none (an explicit request)"),
        EnvVar(
            "SWA_HAL_STRICT",
            "flag",
            "a plugin that fails to load, a backend fallback, or a guard violation a poll finds, is an error",
        ),
        EnvVar(
            "SWA_HAL_FORCE_ENGINE",
            "flag",
            "the engine plugins install under an engine version they were not tested with (at your own risk)",
        ),
        EnvVar("SWA_HAL_PLUGINS", "list", "load only these plugin distributions or entry points"),
        EnvVar("SWA_HAL_DISABLE_PLUGINS", "list", "skip these plugin distributions or entry points"),
        EnvVar("SWA_HAL_DEBUG", "flag", "full (syncing) validation of every build"),
        EnvVar("SWA_HAL_GUARD", "switch", "guarded builds (docs/semantics.md #guarded-builds)", "1"),
        EnvVar("SWA_HAL_CACHE", "switch", "the host-side caches of views and arrays (swa_hal/cache.py)", "1"),
        EnvVar(
            "SWA_HAL_VLLM",
            "engine",
            "the vLLM plugin replaces vLLM's DeepSeek-V4 SWA builders (on), leaves vLLM alone (off), or builds beside "
            "vLLM's and compares (shadow, the default on an untested vLLM release)",
            "1",
        ),
        EnvVar(
            "SWA_HAL_VLLM_STEP",
            "switch",
            "the vLLM plugin builds every SWA group of a model-runner step in one build (step builds)",
            "1",
        ),
        EnvVar(
            "SWA_HAL_POLL_EVERY",
            "int",
            "on a GPU, a violation poll looks at the guard's record at every Nth build (1: every build)",
            "16",
            minimum=1,
        ),
        EnvVar(
            "SWA_HAL_SGLANG",
            "engine",
            "the SGLang plugin replaces SGLang's DeepSeek-V4 SWA rows (on), leaves SGLang alone (off), or builds beside "
            "SGLang's and compares (shadow, the default on an untested SGLang release)",
            "1",
        ),
        EnvVar(
            "SWA_HAL_SHADOW_STEPS",
            "int",
            "shadow mode compares the first N engine calls, and the plugin may serve after N equal ones",
            "100",
            minimum=1,
        ),
        EnvVar(
            "SWA_HAL_SHADOW_EVERY",
            "int",
            "after its first SWA_HAL_SHADOW_STEPS calls, shadow mode compares one engine call in N",
            "100",
            minimum=1,
        ),
        EnvVar(
            "SWA_HAL_SHADOW_PROMOTE",
            "flag",
            "after SWA_HAL_SHADOW_STEPS equal comparisons, swa_hal serves the engine (shadow mode stops comparing)",
        ),
        EnvVar("SWA_HAL_NUM_WARPS", "int", "warps per program of every kernel (tuning sweeps)", "4", minimum=1),
        EnvVar("SWA_HAL_TILE_ELEMS", "int", "elements of a prefill program's tile (tuning sweeps)", minimum=1),
        EnvVar("SWA_HAL_DECODE_TILE_ELEMS", "int", "elements of a decode program's tile (tuning sweeps)", minimum=1),
        EnvVar("TRITON_INTERPRET", "flag", "run Triton kernels in the interpreter (Triton backends on a CPU)"),
    )
}


# SWA_HAL_* names the library does not read but this project's own tests and CI do: no warning for them.
TOOLING_VARIABLES = frozenset(
    {
        "SWA_HAL_FUZZ_EXAMPLES",
        "SWA_HAL_FUZZ_RANDOM",
        "SWA_HAL_SOAK_BUILDS",
        "SWA_HAL_DIST_TORCH",
        "SWA_HAL_GPU_RUNNERS",
    }
)
PREFIX = "SWA_HAL_"


class EnvWarning(UserWarning):
    """An environment variable named like one of swa_hal's (``SWA_HAL_*``) that swa_hal does not read."""


def unknown_variables(env: Mapping[str, str] | None = None) -> list[str]:
    """One sentence per ``SWA_HAL_*`` name of ``env`` (default: the process environment) that is neither a
    variable swa_hal reads nor one of the project's tooling: the name, and the closest known name where one
    is close (``difflib``), else where the list is."""
    env = os.environ if env is None else env
    # Compared without the prefix every name shares, which would make any two names look alike.
    known = {name.removeprefix(PREFIX): name for name in VARIABLES}
    out = []
    for name in sorted(env):
        if not name.upper().startswith(PREFIX) or name in VARIABLES or name in TOOLING_VARIABLES:
            continue
        close = closest(name.upper()[len(PREFIX) :], known)
        hint = f"did you mean {known[close]}?" if close else "swa-hal info --env lists the variables it reads"
        out.append(f"{name} is set, but swa_hal reads no variable of that name, so it has no effect: {hint}")
    return out


def warn_unknown(env: Mapping[str, str] | None = None, stacklevel: int = 2) -> list[str]:
    """Warn (``EnvWarning``) about every name ``unknown_variables`` finds; returns the sentences."""
    found = unknown_variables(env)
    for sentence in found:
        warnings.warn(sentence, EnvWarning, stacklevel=stacklevel + 1)
    return found


def _raw(name: str, env: Mapping[str, str] | None) -> str:
    if name not in VARIABLES:
        raise KeyError(f"{name} is not a variable swa_hal reads (see swa_hal.envs.VARIABLES)")
    return (os.environ if env is None else env).get(name, "").strip()


def env_flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether the flag ``name`` of ``env`` (default: the process environment) is set to a true word:
    off when unset, empty or a false word. Any other value is a ValueError naming the variable, the value
    and the words accepted: ``SWA_HAL_STRICT=2`` or ``=maybe`` must not quietly leave a safety check off."""
    raw = _raw(name, env)
    word = raw.lower()
    if word in TRUE_WORDS:
        return True
    if word == "" or word in FALSE_WORDS:
        return False
    raise ValueError(
        f"{name}={raw!r}: use one of {', '.join(TRUE_WORDS)} (on) or {', '.join(FALSE_WORDS)} (off), or leave it "
        f"unset (off)"
    )


def env_switch(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether the switch ``name`` is on: unset, empty or a true word; a false word turns it off."""
    raw = _raw(name, env)
    word = raw.lower()
    if word == "" or word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{name}={raw!r}: use one of {', '.join(TRUE_WORDS)} or {', '.join(FALSE_WORDS)}")


# The modes of an engine plugin (docs/engines.md #releases-outside-the-tested-set).
ENGINE_MODES = ("serve", "shadow", "off")


def env_engine_mode(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The mode an ``engine`` variable asks for: ``serve`` for a true word, ``off`` for a false word,
    ``shadow``; None when unset or empty (the plugin decides by the engine's release). Anything else is a
    ValueError naming the variable, the value and the words accepted."""
    raw = _raw(name, env)
    word = raw.lower()
    if word == "":
        return None
    if word in TRUE_WORDS:
        return "serve"
    if word in FALSE_WORDS:
        return "off"
    if word == "shadow":
        return "shadow"
    raise ValueError(
        f"{name}={raw!r}: use one of {', '.join(TRUE_WORDS)} (swa_hal serves), {', '.join(FALSE_WORDS)} (off) or "
        f"shadow (the engine serves, swa_hal builds beside it and compares), or leave it unset"
    )


def env_int(name: str, env: Mapping[str, str] | None = None) -> int | None:
    """The integer ``name`` is set to, or None when unset."""
    raw = _raw(name, env)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: must be an integer") from None
    minimum = VARIABLES[name].minimum
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}={raw!r}: must be at least {minimum}")
    return value


def env_text(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The string ``name`` is set to (stripped), or None when unset or empty."""
    return _raw(name, env) or None


def env_list(name: str, env: Mapping[str, str] | None = None) -> list[str]:
    """The comma-separated names ``name`` lists (empty when unset)."""
    return [part.strip() for part in _raw(name, env).split(",") if part.strip()]


def describe(env: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    """Every variable with its kind, default, meaning and the value this process sees."""
    env = os.environ if env is None else env
    return [
        {"name": v.name, "kind": v.kind, "default": v.default, "value": env.get(v.name, ""), "meaning": v.meaning}
        for v in VARIABLES.values()
    ]
