"""The backend protocol: what a backend declares (BackendSpec) and what it implements (Backend).

A backend holds no semantics. It says when it can run, computes the outputs of docs/semantics.md #per-token-helpers, #causal-rows, #dspark-rows, #prefill-metadata into the
builder's fixed buffers (by calling the reference or the shared kernels), and may add FlashMLA
scheduler objects or a post-pass. The core decides everything else.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from .config import LAYER_TYPES

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from .batch import AttentionBatch
    from .buffers import MetadataBuffers
    from .config import SWAConfig
    from .metadata import SWAMetadata
    from .plan import BuildPlan
    from .platform import PlatformInfo
    from .preflight import GroupInputs
    from .request_window import RequestWindowLayout, RequestWindowRows
    from .slot_rows import SlotRows

API_VERSION = 1
SUPPORTED_API_VERSIONS = (1,)
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
FACTORY_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclasses.dataclass(frozen=True)
class Availability:
    """Whether a backend can run on a platform, and if not, every reason why."""

    ok: bool
    reasons: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def yes(cls) -> Availability:
        return cls(True)

    @classmethod
    def no(cls, *reasons: str) -> Availability:
        return cls(False, tuple(reasons) or ("unavailable",))

    @classmethod
    def check(cls, failures: list[str]) -> Availability:
        """Available when ``failures`` is empty; else unavailable for all of them."""
        return cls(not failures, tuple(failures))


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """A backend as a plugin declares it. Cheap to create: nothing heavy is imported until ``factory``.

    name: short, fixed, lowercase ("cuda", "acme").
    priority: explicit number; the highest available auto-selectable backend wins. The built-ins use
        0 (torch, the fallback) and 100-200 (hardware backends); third parties pick their own.
    factory: "module:attr" naming a Backend subclass (or callable) taking (config, device, platform).
    is_available: PlatformInfo -> Availability; must be pure (no probing, no CUDA initialisation).
    vendors: the PlatformInfo.vendor values it targets (documentation and the CI matrix).
    platforms: ``--assume`` strings of the platforms it should be selected on (the CI matrix).
    kernels: "torch", "triton", or another word; "triton" lets the conformance kit run it on a CPU
        through the Triton interpreter.
    clamps_addresses: every lane address in bounds, masked or not (checked address-strict).
    cuda_graphs: a decode-only build can be captured in a CUDA graph.
    """

    name: str
    priority: int
    factory: str
    is_available: Callable[[PlatformInfo], Availability]
    vendors: tuple[str, ...] = ()
    platforms: tuple[str, ...] = ()
    api_version: int = API_VERSION
    auto_select: bool = True
    summary: str = ""
    kernels: str = "torch"
    clamps_addresses: bool = False
    cuda_graphs: bool = False

    def problems(self) -> list[str]:
        """What is malformed about this spec (empty when it is well formed)."""
        out = []
        if not isinstance(self.name, str) or not NAME_PATTERN.match(self.name):
            out.append(f"name {self.name!r} must match {NAME_PATTERN.pattern}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            out.append(f"priority {self.priority!r} must be an integer")
        if not isinstance(self.factory, str) or not FACTORY_PATTERN.match(self.factory):
            out.append(f"factory {self.factory!r} must be a 'module:attribute' string")
        if not callable(self.is_available):
            out.append("is_available must be callable")
        if self.api_version not in SUPPORTED_API_VERSIONS:
            out.append(f"api_version {self.api_version!r} is not supported (supported: {SUPPORTED_API_VERSIONS})")
        if not isinstance(self.vendors, tuple) or not all(isinstance(v, str) for v in self.vendors):
            out.append("vendors must be a tuple of strings")
        if not isinstance(self.platforms, tuple) or not all(isinstance(p, str) for p in self.platforms):
            out.append("platforms must be a tuple of --assume strings")
        return out

    def load_factory(self) -> Callable[..., Backend]:
        module_name, _, attr = self.factory.partition(":")
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj


# The name of the spec whose factory is running (``starting``): ``Backend.__init__`` takes it as the
# instance's name, so a subclass's own ``__init__`` already sees it after ``super().__init__``.
_STARTING: contextvars.ContextVar[str | None] = contextvars.ContextVar("swa_hal_starting_backend", default=None)


@contextlib.contextmanager
def starting(name: str) -> Iterator[None]:
    """Run a backend factory for the spec called ``name``: the backend it makes is called ``name``."""
    token = _STARTING.set(name)
    try:
        yield
    finally:
        _STARTING.reset(token)


def name_from_spec(backend: Any, name: str) -> None:
    """Give a backend made for the spec called ``name`` that name (whatever its class says)."""
    if getattr(backend, "name", None) != name:
        backend.__dict__["name"] = name


class Backend:
    """Base class of backends. Subclasses implement ``compute`` and ``recompute_decode_rows``."""

    # The backend's name is its spec's (``BackendSpec.name``): selection sets it on every backend it
    # starts, so a subclass needs no ``name`` of its own. This default names a backend made by hand.
    name: ClassVar[str] = "base"
    # Set by the builder: guarded builds and updates (docs/semantics.md #guarded-builds) check what
    # needs the data, hand offending rows out empty and record the first violation.
    guard: bool = False
    # Set by selection: why the backends it tried first failed to start (empty: none failed).
    fell_back_from: tuple[str, ...] = ()
    # Whether update_draft_decode_metadata (docs/semantics.md #draft-updates) is supported.
    supports_draft_decode_metadata_update: ClassVar[bool] = True

    def __init__(self, config: SWAConfig, device: torch.device, platform: PlatformInfo):
        started_as = _STARTING.get()
        if started_as is not None:
            name_from_spec(self, started_as)
        self.config = config
        self.device = device
        self.platform = platform

    def allocate(self, buffers: MetadataBuffers) -> None:
        """Allocate any extra fixed buffers (once, at builder construction)."""

    def compute(self, plan: BuildPlan, batch: AttentionBatch, buffers: MetadataBuffers) -> None:
        """Fill token_to_req, is_valid, decode and prefill rows and lens, gather lens."""
        raise NotImplementedError

    def recompute_decode_rows(self, metadata: SWAMetadata, buffers: MetadataBuffers) -> None:
        """The draft-step update (docs/semantics.md #draft-updates): recompute token_to_req, is_valid and
        the decode rows and lens (causal or DSpark, as ``metadata.causal`` says) in place from the
        advanced seq_lens, with the plan ``swa_hal.plan.update_plan`` makes of the build (its replay
        bounds included); no sync, no allocation."""
        raise NotImplementedError

    def compute_groups(
        self, plan: BuildPlan, batch: AttentionBatch, groups: GroupInputs, buffers: MetadataBuffers
    ) -> None:
        """Fill every KV-cache group's outputs (docs/semantics.md #group-builds); the builder's one entry
        point, a single build being a group of one (``batch`` holds group 0's table and slot mapping).
        ``groups``: the groups' block tables and slot mappings as the build's preflight checked them, with
        their rows of the kernels' group table. One group is ``compute``'s, two or more ``compute_several``'s,
        so a backend's ``compute`` serves every single build."""
        if len(groups.tables) == 1:
            self.compute(plan, batch, buffers)
        else:
            self.compute_several(plan, batch, groups, buffers)

    def compute_several(
        self, plan: BuildPlan, batch: AttentionBatch, groups: GroupInputs, buffers: MetadataBuffers
    ) -> None:
        """A build of two KV-cache groups or more: group g reads ``groups.tables[g]`` and ``groups.slots[g]``
        and writes ``buffers.group(g)``; a violation it records names group g (``in_group_build``). Default:
        one ``compute`` per group; backends that can do all groups in one launch override it."""
        for g, (table, slot_mapping) in enumerate(zip(groups.tables, groups.slots)):
            self.compute(plan, batch.with_group(table, slot_mapping), buffers.in_group_build(g))

    def recompute_groups(self, metadatas: Sequence[SWAMetadata], buffers: MetadataBuffers) -> None:
        """The draft-step update of a group build, as ``compute_groups``: one group is
        ``recompute_decode_rows``'s, two or more ``recompute_several``'s."""
        if len(metadatas) == 1:
            self.recompute_decode_rows(metadatas[0], buffers)
        else:
            self.recompute_several(metadatas, buffers)

    def recompute_several(self, metadatas: Sequence[SWAMetadata], buffers: MetadataBuffers) -> None:
        """The draft-step update of two KV-cache groups or more: default, one ``recompute_decode_rows`` per
        group."""
        for g, metadata in enumerate(metadatas):
            self.recompute_decode_rows(metadata, buffers.in_group_build(g))

    def compute_slot_rows(
        self, rows: SlotRows, out: torch.Tensor, lens: torch.Tensor, record: torch.Tensor, limit: int
    ) -> None:
        """Token-slot rows (docs/semantics.md #token-slot-rows, and #ring-rows when ``rows.ring`` is set) into
        ``out``/``lens``; guarded (``self.guard``) rows that break a rule are emptied and recorded in
        ``record``, whose cache slots lie in ``[-1, limit)``. The torch backend builds them with vectorised
        torch ops (``torch_backend/slot_rows.py``), the Triton backends with one launch."""
        raise NotImplementedError(f"backend {self.name!r} does not build token-slot rows (compute_slot_rows)")

    def compute_request_window(self, rows: RequestWindowRows) -> RequestWindowLayout:
        """A request-window layout (docs/semantics.md #request-window-layouts), in new tensors. The torch
        backend builds it with vectorised torch ops (``torch_backend/request_window.py``), the Triton
        backends with one launch."""
        raise NotImplementedError(
            f"backend {self.name!r} does not build request-window layouts (compute_request_window)"
        )

    def make_tile_schedulers(self, num_decode_tokens: int) -> Mapping[str, Any]:
        """One fresh planner object per layer type the model has, None for the rest (the default:
        None everywhere). Every key of LAYER_TYPES is present; ``schedulers.FreshSchedulers`` makes
        the objects on first access."""
        return dict.fromkeys(LAYER_TYPES)

    def extras(self, metadata: SWAMetadata, buffers: MetadataBuffers) -> tuple[Any, ...]:
        """Typed extras (a small dataclass each) derived from the finished metadata; called after
        every build and every draft-step update. Default: none."""
        return ()

    def warmup(self, buffers: MetadataBuffers, progress: Callable[[str], None] | None = None) -> int:
        """Compile everything a build can need; returns the number of kernel variants prepared."""
        return 0

    def status(self) -> dict[str, str]:
        """Human-readable facts for ``swa-hal info`` (kernel variant, scheduler state, ...)."""
        return {}


def require(
    platform: PlatformInfo,
    *,
    vendor: str,
    vendor_label: str,
    capability_majors: tuple[int, ...] | None = None,
    triton: bool = False,
) -> Availability:
    """Availability for the common case: a vendor, optionally capability majors, optionally Triton.

    The vendor is checked before the capability: ROCm devices report capability tuples too.
    """
    failures = []
    if platform.vendor != vendor:
        failures.append(f"needs {vendor_label}; found vendor {platform.vendor!r}")
    elif capability_majors is not None:
        found = platform.capability_str or "none"
        if platform.capability is None or platform.capability[0] not in capability_majors:
            wanted = " or ".join(f"{m}.x" for m in capability_majors)
            failures.append(f"needs CUDA capability {wanted}; found {found}")
    if triton and not platform.triton:
        failures.append("triton is not installed")
    return Availability.check(failures)
