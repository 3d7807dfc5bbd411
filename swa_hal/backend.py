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
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from .config import INT32_LIMIT, LAYER_TYPES
from .step_inputs import StepInputs

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from .batch import AttentionBatch
    from .buffers import MetadataBuffers
    from .config import SWAConfig
    from .metadata import SWAMetadata
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


class BuildPlan(NamedTuple):
    """The host-side facts of one build: the split (docs/semantics.md #split) and where each output goes.

    Everything here comes from host values (the CPU copy of query_start_loc, max_query_len, sizes),
    so computing it never synchronises with the device. What the step's inputs hold (``num_tokens``,
    ``causal``, ``max_query_len``, the tensors) is read from ``inputs``, never copied here. (A NamedTuple: it
    is made on every build; made by keyword.)
    """

    # The step's per-request inputs (for a draft-step update, its decode requests'): what the rows read.
    inputs: StepInputs
    num_reqs: int
    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int
    decode_width: int
    # Decode lens rows [num_decode_tokens, decode_lens_clear_end) are zeroed (docs/semantics.md #fixed-buffers).
    decode_lens_clear_end: int
    # The replay bounds the build reads (#bounded-replay), R entries, and hands out as ``md.replay_start``: the
    # step's ``inputs.replay_start`` (cut to R, or padded with zeros past its entries), or zeros where it has none.
    replay_start: torch.Tensor
    # Whether this build works out image visibility (#vision-spans) from ``inputs.image_spans``.
    images: bool = False
    # The query length every request of the decode / prefill part is likely to have (the kernel's
    # cheap owner guess, checked before use; docs/semantics.md #per-token-helpers): host values only.
    decode_guess_len: int = 1
    prefill_guess_len: int = 1
    # The query length the host's split admits for a decode (docs/semantics.md #guarded-builds, rule 14):
    # max_decode_query_len (every request's is at most ``inputs.max_query_len``).
    decode_query_max: int = INT32_LIMIT
    # Rule 15 (docs/semantics.md #guarded-builds): the prefills' seq_lens_cpu where a guarded build holds
    # them against seq_lens, on the build's device (entries [num_decodes, num_reqs) meaningful); None where
    # there is nothing to hold (no prefill, no host copy, an unguarded build).
    host_seq_lens: torch.Tensor | None = None
    # Rules 16 and 17 are a build's: max_model_len, and each row's slot_mapping entry its own slot. A draft-step
    # update checks neither (an engine's draft step may run its drafts past max_model_len, whose tokens it
    # leaves without a slot, and may hand the update the slot mapping it had at the build).
    build_checks: bool = True
    # Rule 14: the requests before ``num_bounds`` have a replay bound; the host copy makes those after them
    # padding (no query tokens, so no bound: docs/semantics.md #bounded-replay), which the device offsets
    # must keep. INT32_LIMIT: every request has one.
    num_bounds: int = INT32_LIMIT
    # Rule 14 in a draft-step update of a build with prefills: the host's split starts the first prefill at
    # num_decode_tokens, so a decode row past the decodes' end on the device is that prefill's, not padding.
    prefill_follows: bool = False


def update_plan(metadata: SWAMetadata) -> BuildPlan:
    """The plan of a draft-step update (docs/semantics.md #draft-updates): the decode part of the build
    that made ``metadata``, recomputed from its (advanced) seq_lens and replay bounds. Its requests are the
    decodes alone (``StepInputs.of_update``): a decode token's owner counts the decodes' ends only (the same
    owner as the build's wherever the offsets never decrease), and only they are checked, against the build's
    split (rule 14: a decode row past the decodes' end on the device is the first prefill's where the build had
    prefills, and a decode past the build's replay bounds has no query token)."""
    ndt, mdql = metadata.num_decode_tokens, metadata.max_decode_query_len
    inputs = update_inputs(metadata)
    built = metadata.inputs
    bounds = None if built is None or built.replay_start is None else built.replay_start.shape[0]
    return BuildPlan(
        inputs=inputs,
        num_reqs=metadata.num_decodes,
        num_decodes=metadata.num_decodes,
        num_prefills=0,
        num_decode_tokens=ndt,
        num_prefill_tokens=0,
        decode_width=metadata.decode_swa_width,
        decode_lens_clear_end=ndt,
        replay_start=metadata.replay_start,
        decode_guess_len=mdql,
        decode_query_max=mdql,
        build_checks=False,
        num_bounds=INT32_LIMIT if bounds is None or bounds >= metadata.num_decodes else bounds,
        prefill_follows=metadata.num_prefills > 0,
    )


def update_inputs(metadata: SWAMetadata) -> StepInputs:
    """The inputs of a draft-step update of ``metadata`` (docs/semantics.md #draft-updates): the decode
    requests of its build (views of the metadata's tensors), at their advanced ``seq_lens``, with the
    build's replay bounds and without the prefills' image spans. Every other input is the build's own
    (``metadata.inputs``; metadata an engine made from its own has none, and reads its fields)."""
    nd = metadata.num_decodes
    decodes: dict[str, Any] = dict(
        seq_lens=metadata.seq_lens[:nd],
        query_start_loc=metadata.query_start_loc[: nd + 1],
        query_start_loc_cpu=metadata.query_start_loc_cpu[: nd + 1],
        seq_lens_cpu=None,
        max_query_len=min(metadata.max_decode_query_len, INT32_LIMIT),
        num_tokens=metadata.num_decode_tokens,
        causal=metadata.causal,
        replay_start=metadata.replay_start,
        image_spans=None,
    )
    built = metadata.inputs
    return StepInputs(**decodes) if built is None else built.replace(**decodes)


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
        advanced seq_lens and ``metadata.replay_start``; no sync, no allocation."""
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
