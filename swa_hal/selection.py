"""Choosing a backend: an explicit name (argument, then ``SWA_HAL_BACKEND``) or the highest-priority
available one. The only module that decides between backends.

An explicit request that is unknown or unavailable raises, with the reasons and what
auto-selection would have picked: it never falls back silently.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .backend import Availability, BackendSpec, name_from_spec, starting
from .envs import env_flag, env_text
from .errors import BackendNotFoundError, BackendStartError, BackendUnavailableError
from .platform import PlatformInfo, probe_platform
from .plugins import PluginRegistry, PluginWarning, get_registry

if TYPE_CHECKING:
    import torch

    from .backend import Backend
    from .buffers import MetadataBuffers
    from .config import SWAConfig

log = logging.getLogger("swa_hal.selection")


@dataclasses.dataclass(frozen=True)
class Candidate:
    spec: BackendSpec
    plugin: str
    dist: str | None
    availability: Availability

    @property
    def name(self) -> str:
        return self.spec.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "priority": self.spec.priority,
            "plugin": self.plugin,
            "distribution": self.dist,
            "available": self.availability.ok,
            "reasons": list(self.availability.reasons),
            "auto_select": self.spec.auto_select,
            "kernels": self.spec.kernels,
            "summary": self.spec.summary,
        }


def build_candidates(registry: PluginRegistry, platform: PlatformInfo) -> tuple[Candidate, ...]:
    """Every registered backend with its availability on ``platform``, by name. The one place candidates
    are made: selection, ``swa-hal info`` and the conformance kit all see the same list."""
    return tuple(
        Candidate(rb.spec, rb.plugin.name, rb.plugin.dist, registry.availability(name, platform))
        for name, rb in sorted(registry.backends.items())
    )


def _rank(candidate: Candidate) -> tuple[int, str]:
    """Best first: higher priority, then the name (so ties are deterministic)."""
    return -candidate.spec.priority, candidate.name


def auto_order(candidates: Iterable[Candidate]) -> list[Candidate]:
    """The available, auto-selectable candidates, best first."""
    return sorted((c for c in candidates if c.availability.ok and c.spec.auto_select), key=_rank)


@dataclasses.dataclass(frozen=True)
class Selection:
    """The outcome of a selection: the chosen backend and every candidate with its reasons."""

    name: str
    spec: BackendSpec
    platform: PlatformInfo
    how: str  # "argument", "SWA_HAL_BACKEND" or "auto"
    candidates: tuple[Candidate, ...]

    @property
    def explicit(self) -> bool:
        return self.how != "auto"

    def auto_order(self) -> list[Candidate]:
        """Available, auto-selectable candidates, best first (priority, then name for ties)."""
        return auto_order(self.candidates)

    def explain(self) -> str:
        lines = [f"platform: {self.platform.describe()}"]
        how = {
            "argument": "requested by argument",
            "SWA_HAL_BACKEND": "requested by SWA_HAL_BACKEND",
            "auto": "highest priority among available backends",
        }[self.how]
        lines.append(f"selected: {self.name} ({how})")
        width = max([10, *(len(c.name) for c in self.candidates)])  # a plugin's name may be longer
        for c in sorted(self.candidates, key=_rank):
            mark = "*" if c.name == self.name else " "
            state = "available" if c.availability.ok else "unavailable: " + "; ".join(c.availability.reasons)
            if c.availability.ok and not c.spec.auto_select:
                state += " (explicit requests only)"
            lines.append(f" {mark} {c.name:<{width}} priority {c.spec.priority:>4}  {state}  [{c.dist or c.plugin}]")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "selected": self.name,
            "how": self.how,
            "platform": self.platform.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates],
        }

    def create(self, config: SWAConfig, device: torch.device, buffers: MetadataBuffers | None = None) -> Backend:
        """Start the backend as a builder does: its factory, then its ``allocate(buffers)`` (``buffers``:
        the builder's fixed buffers; None makes a set for ``config`` on ``device``). The backend is named
        after its spec (``backend.name == spec.name``, whatever the class says). A factory or an
        ``allocate()`` that raises anything but KeyboardInterrupt (SystemExit included) is a failure to
        start: an explicit choice raises ``BackendStartError`` naming the backend, and so does an
        automatic one under ``SWA_HAL_STRICT=1``; otherwise an automatic one falls back to the next
        available candidate with one warning, and the backend it returns says so in ``fell_back_from``
        (``swa-hal info --status`` / ``--expect`` and the kit's ``--swa-hal-expect`` report it)."""
        if buffers is None:
            from .buffers import MetadataBuffers

            buffers = MetadataBuffers(config, device)
        order = [self.candidates_by_name()[self.name]]
        strict = env_flag("SWA_HAL_STRICT")
        if not self.explicit and not strict:
            order += [c for c in self.auto_order() if c.name != self.name]
        failures: list[str] = []
        last: BaseException | None = None
        for cand in order:
            step = ""
            try:
                factory = cand.spec.load_factory()
                with starting(cand.name):
                    backend = factory(config, device, self.platform)
                name_from_spec(backend, cand.name)  # also for a factory that made its backend another way
                step = "allocate() raised "
                backend.allocate(buffers)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # SystemExit included: report any start failure with its backend
                detail = (
                    f"backend {cand.name!r} ({cand.dist or cand.plugin}) failed to start: "
                    f"{step}{type(exc).__name__}: {exc}"
                )
                if self.explicit:
                    raise BackendStartError(f"{detail} (requested by {self.how}: no fallback)") from exc
                if strict:
                    raise BackendStartError(detail + " (SWA_HAL_STRICT=1: no fallback)") from exc
                failures.append(detail)
                last = exc
                warnings.warn(detail + "; trying the next available backend", PluginWarning, stacklevel=2)
                continue
            backend.fell_back_from = tuple(failures)
            return backend
        raise BackendStartError("no backend could start:\n  " + "\n  ".join(failures)) from last

    def candidates_by_name(self) -> dict[str, Candidate]:
        return {c.name: c for c in self.candidates}


def _left_out(registry: PluginRegistry) -> str:
    """What the environment's plugin lists keep out, as the end of a "no backend" error: the plugins and
    why (``SWA_HAL_DISABLE_PLUGINS=torch`` leaves a CPU without the one backend that runs everywhere, and
    the error should say that this, not the machine, is why)."""
    blocked = [p for p in registry.plugins if p.status == "blocked"]
    if not blocked:
        return ""
    text = "; left out by the environment, so no backend of theirs is a candidate: " + ", ".join(
        f"plugin {p.name!r} ({p.detail})" for p in blocked
    )
    if any(p.name == "torch" for p in blocked):
        text += " (the torch plugin's backend is the one that runs on every platform)"
    return text


def select_backend(
    name: str | None = None,
    platform: PlatformInfo | None = None,
    *,
    registry: PluginRegistry | None = None,
    env: Mapping[str, str] | None = None,
    device: Any = None,
) -> Selection:
    """Pick a backend for ``platform`` (default: probe ``device``, or the best device here)."""
    registry = registry if registry is not None else get_registry()
    platform = platform if platform is not None else probe_platform(device)
    env = os.environ if env is None else env
    how = "argument"
    if name is None and env_text("SWA_HAL_BACKEND", env):
        name, how = env_text("SWA_HAL_BACKEND", env), "SWA_HAL_BACKEND"
    candidates = build_candidates(registry, platform)
    by_name = {c.name: c for c in candidates}
    auto = auto_order(candidates)
    auto_pick = auto[0].name if auto else None
    auto_note = (
        f"auto-selection would pick {auto_pick!r}" if auto_pick else "no backend is available for auto-selection"
    )

    if name is not None:
        cand = by_name.get(name)
        if cand is None:
            raise BackendNotFoundError(
                f"backend {name!r} ({'requested by ' + how}) is not registered; registered: "
                f"{', '.join(sorted(by_name)) or 'none'}; {auto_note}{_left_out(registry)}"
            )
        if not cand.availability.ok:
            raise BackendUnavailableError(
                f"backend {name!r} (requested by {how}) is unavailable on {platform.describe()}: "
                f"{'; '.join(cand.availability.reasons)}; {auto_note}"
            )
        selection = Selection(name, cand.spec, platform, how, candidates)
    else:
        if not auto:
            reasons = "; ".join(f"{c.name}: {', '.join(c.availability.reasons) or 'explicit only'}" for c in candidates)
            raise BackendUnavailableError(
                f"no backend is available on {platform.describe()} ({reasons or 'no backends registered'})"
                f"{_left_out(registry)}"
            )
        if len(auto) > 1 and auto[0].spec.priority == auto[1].spec.priority:
            warnings.warn(
                f"backends {auto[0].name!r} and {auto[1].name!r} are both available with priority "
                f"{auto[0].spec.priority}; picking {auto[0].name!r} by name. Set SWA_HAL_BACKEND to choose.",
                PluginWarning,
                stacklevel=2,
            )
        selection = Selection(auto[0].name, auto[0].spec, platform, "auto", candidates)
    others = [c.name for c in auto if c.name != selection.name]
    log.info(
        "swa_hal: backend %r (%s) on %s; other available: %s",
        selection.name,
        selection.how,
        platform.describe(),
        ", ".join(others) or "none",
    )
    return selection
