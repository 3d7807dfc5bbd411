"""swa_hal inside vLLM 0.33 and 0.34: DeepSeek-V4 / V4.1 sliding-window metadata from swa_hal's backend.

``register`` is the ``vllm.general_plugins`` entry point (``pyproject.toml``): vLLM calls it in every
process. It makes every DeepSeek-V4 SWA attention backend of vLLM (``DeepseekSparseSWABackend`` and
each platform subclass, V4 and V4.1: FlashMLA, FlashInfer, CPU, ROCm AITER, XPU) hand out a
swa_hal builder from ``get_builder_cls()``.

The swa_hal builder is vLLM's own builder class with swa_hal slotted in *under* the platform
subclass and *over* vLLM's base: its class is ``type(name, (native, SwaHalSparseSWAMetadataBuilder),
{})`` whose method order is ``platform subclass -> (V4.1 builder) -> swa_hal -> vLLM base``. So:

* replaced outright: the base ``DeepseekSparseSWAMetadataBuilder.build`` and
  ``update_draft_decode_metadata`` (every index row, length, split, token_to_req, is_valid, gather
  length and image-visibility value now comes from swa_hal's auto-selected backend, in swa_hal's fixed
  buffers), and the base's window/row buffers (freed; see
  ``SwaHalSparseSWAMetadataBuilder._release_native_row_buffers``);
* wrapped, each keeping what it adds on top of the base: the V4.1 builder (PCP slot chunking,
  ``cache_slot_mapping`` / ``cache_positions``, its layer types), FlashMLA (CUDA graphs ALWAYS),
  FlashInfer (``flashinfer_decode_topk_lens`` / ``_seq_lens``), CPU (its tile-scheduler sentinel),
  ROCm AITER (ragged rows built from swa_hal's dense rows and rebuilt after every draft-step update,
  so draft updates are on; its gfx942 one-launch decode shortcut declines, since the row buffers it
  would fill are swa_hal's); the
  ``build_tile_scheduler`` of whichever class vLLM picked makes the five ``tile_sched_*`` (vLLM's own
  FlashMLA planner objects, which its kernels consume).

vLLM's V4.1 specialized decode records metadata builds in CUDA graphs only for the builder types it
lists as recordable; ``register`` lists the swa_hal builder of each listed SWA builder there too.

Step builds (``swa_hal.integrations.vllm_step``; ``SWA_HAL_VLLM_STEP=0`` turns them off): ``register``
also wraps model runner V2's ``DefaultModelState.prepare_attn`` (and the drafter's ``build_attn_metadata``),
so every SWA group of a step is built by one ``build_groups`` and each group's builder hands out its part.

The builder classes are in ``swa_hal.integrations.vllm_builder``, which imports vLLM and is imported
on first use, after ``check_vllm``; the batch it builds comes from ``engine.batch_from_common_metadata``,
the conversion every engine adapter shares. Importing this module imports nothing from vLLM;
everything that needs vLLM says so when used.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any

from . import _common
from .aside import stepped_aside

# Defined in vllm_common, which the builder and step modules import instead of this one; re-exported so
# that swa_hal.integrations.vllm stays the one place users find them.
from .shadow import Shadow
from .vllm_common import ENGINE as ENGINE
from .vllm_common import ENV_SWITCH as ENV_SWITCH
from .vllm_common import SUPPORTED_VLLM as SUPPORTED_VLLM
from .vllm_common import BuilderOptions as BuilderOptions
from .vllm_common import VllmNotInstalledError as VllmNotInstalledError
from .vllm_common import VllmVersionError as VllmVersionError
from .vllm_common import admit, admit_none, all_subclasses, installed_version, require_installed
from .vllm_common import check_vllm as check_vllm
from .vllm_common import configure as configure
from .vllm_common import is_swa_hal_builder as is_swa_hal_builder
from .vllm_common import log as log
from .vllm_common import native_builder_cls as native_builder_cls
from .vllm_common import options as options
from .vllm_common import vllm_installed as vllm_installed
from .vllm_common import vllm_version as vllm_version

STEP_SWITCH = "SWA_HAL_VLLM_STEP"


# -- environment --------------------------------------------------------------------------------


def enabled(env: dict[str, str] | None = None) -> bool:
    """``SWA_HAL_VLLM`` off (0/false/no/off) leaves vLLM untouched; unset or a true word is on; any other
    value is an error (a typo never silently flips the engine's metadata)."""
    return _common.enabled(ENV_SWITCH, env)


def step_builds_enabled(env: dict[str, str] | None = None) -> bool:
    """``SWA_HAL_VLLM_STEP`` off (0/false/no/off) keeps every SWA group of a step building on its own;
    unset or a true word: one build per model-runner step for every SWA group (``vllm_step``)."""
    return _common.enabled(STEP_SWITCH, env)


# -- the builders (swa_hal.integrations.vllm_builder, which imports vLLM) -----------------------

_lock = threading.RLock()


def sparse_swa_builder_base() -> type:
    """``SwaHalSparseSWAMetadataBuilder``: vLLM's ``DeepseekSparseSWAMetadataBuilder`` with swa_hal's
    build and draft update (``swa_hal.integrations.vllm_builder``, imported on first use)."""
    check_vllm()
    from .vllm_builder import SwaHalSparseSWAMetadataBuilder

    return SwaHalSparseSWAMetadataBuilder


def swa_hal_builder_cls(native: type) -> type:
    """The swa_hal builder for vLLM's builder class ``native`` (cached; any class that is not a
    DeepSeek-V4 SWA builder comes back unchanged)."""
    if is_swa_hal_builder(native):
        return native
    check_vllm()
    from .vllm_builder import swa_hal_builder_cls as make

    return make(native)


# -- the plugin ---------------------------------------------------------------------------------

_registered = False
_patched: list[tuple[Any, str, Any]] = []  # (class or module, attribute, original value or None)


def is_registered() -> bool:
    return _registered


def _patch_backend(backend: type) -> None:
    """Make ``backend.get_builder_cls()`` return the swa_hal builder of whatever vLLM's returns."""
    raw = backend.__dict__.get("get_builder_cls")
    if raw is None or getattr(raw, "__swa_hal__", False):
        return
    if isinstance(raw, staticmethod):
        native = raw.__func__

        def get_builder_cls() -> type:
            return swa_hal_builder_cls(native())

        new: Any = staticmethod(get_builder_cls)
    elif isinstance(raw, classmethod):
        native_cm = raw.__func__

        def get_builder_cls_cm(cls: type) -> type:
            return swa_hal_builder_cls(native_cm(cls))

        new = classmethod(get_builder_cls_cm)
    else:  # a plain function would be an instance method; vLLM never calls it that way
        return
    new.__swa_hal__ = True
    name = "get_builder_cls"
    setattr(backend, name, new)
    _patched.append((backend, name, raw))


def register() -> bool:
    """The ``vllm.general_plugins`` entry point. Idempotent (vLLM calls it in every process).
    Returns whether swa_hal builds (or, shadowing, builds beside) vLLM's DeepSeek-V4 SWA metadata in this
    process: on a tested release it serves vLLM; on any other (or with ``SWA_HAL_VLLM=shadow``) it shadows
    vLLM's own builders (docs/engines.md #releases-outside-the-tested-set).

    vLLM itself only calls it where vLLM is installed; called where vLLM cannot be imported (a script that
    registers the plugin by hand in the wrong environment), it raises ``VllmNotInstalledError`` saying so,
    rather than returning False as if an engine had been looked at and left alone."""
    global _registered
    if not enabled():
        log.info(
            "swa_hal: %s=%s, vLLM keeps its own DeepSeek-V4 SWA metadata builders",
            ENV_SWITCH,
            os.environ.get(ENV_SWITCH),
        )
        return False
    with _lock:
        if _registered:
            return True
        require_installed()
        # Never stops vLLM from starting: another release is shadowed, with one warning.
        mode, version = _common.gate_mode(
            log, ENGINE, "vllm", SUPPORTED_VLLM, switch=ENV_SWITCH, error=VllmVersionError, found=installed_version()
        )
        if mode == "off" or version is None:
            return False
        admit(version)
        # Choose the backend first: a backend that cannot be chosen (SWA_HAL_BACKEND naming an
        # unknown or unavailable one) stops here, with vLLM untouched.
        backend_name, platform = describe(version)
        sparse_swa_builder_base()
        from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWABackend

        from . import vllm_shadow

        vllm_shadow.start(Shadow(ENGINE, log) if mode == "shadow" else None)
        backend = DeepseekSparseSWABackend
        for cls in (backend, *all_subclasses(backend)):
            _patch_backend(cls)
        # Platform modules imported later (ROCm, FlashInfer, ...) define their subclasses then.
        original = backend.__dict__.get("__init_subclass__")

        def __init_subclass__(cls: type, **kwargs: Any) -> None:
            if original is not None:
                original.__get__(None, cls)(**kwargs)
            else:
                super(backend, cls).__init_subclass__(**kwargs)
            _patch_backend(cls)

        backend.__init_subclass__ = classmethod(__init_subclass__)
        _patched.append((backend, "__init_subclass__", original))
        if mode == "shadow":
            # vLLM's own builds serve; step builds and recorded metadata builds would hand out other buffers.
            s = vllm_shadow.current().settings  # type: ignore[union-attr]
            detail = (
                f"shadow mode: vLLM's own builds serve, swa_hal builds beside them and compares (the first "
                f"{s.steps} builds, then one in {s.every}"
                + (", then serves after as many equal ones)" if s.promote else ")")
            )
        else:
            _declare_recordable()
            detail = _install_step_builds()
        _registered = True
    what = (
        "builds its DeepSeek-V4/V4.1 SWA metadata" if mode == "serve" else "shadows its DeepSeek-V4/V4.1 SWA metadata"
    )
    _common.announce(log, ENGINE, version, what, backend_name, platform, detail)
    return True


def _install_step_builds() -> str:
    """Hook model runner V2's ``prepare_attn`` for step builds (``swa_hal.integrations.vllm_step``) unless
    ``SWA_HAL_VLLM_STEP`` is off; returns what the start-up line says of them."""
    if not step_builds_enabled():
        return f"step builds off ({STEP_SWITCH}={os.environ.get(STEP_SWITCH)})"
    from .vllm_step import install

    if install(_patched):
        return "step builds on (one build per model-runner step for every SWA group)"
    return "step builds unavailable (no model runner V2 prepare_attn here; each SWA group builds on its own)"


def step_builds_active() -> bool:
    """Whether vLLM's ``prepare_attn`` is hooked for step builds in this process."""
    if not _registered:
        return False
    return any(attr == "prepare_attn" for _, attr, _ in _patched)


# vLLM's V4.1 specialized decode (``decode_backend=latency_specialized``) records the metadata builds of
# uniform-decode FULL steps in CUDA graphs, but only when every group's builder is exactly one of the types
# in this module's ``_RECORDABLE_BUILDERS`` (``AttnMetadataCudaGraphs.can_record``, an exact-type test).
METADATA_GRAPHS_MODULE = "vllm.models.deepseek_v41.nvidia.specialized_decode.runtime.metadata_graphs"


def _declare_recordable() -> None:
    """Add the swa_hal builder of every recordable vLLM SWA builder to vLLM's recordable set, so the
    exact-type test accepts the builders ``get_builder_cls()`` now hands out.

    Sound because swa_hal keeps what recording needs from the native build it replaces: a decode build
    writes only swa_hal's fixed buffers (docs/semantics.md #fixed-buffers; the same addresses at every
    build of a shape), performs no host sync, and reads only host values the graph key fixes (request and
    token counts, ``query_start_loc_cpu``, ``max_query_len``); the subclass's own additions run as they
    did. Only the swa_hal counterpart of a type already in the set is added, so recording is on exactly
    where it is without swa_hal. ``can_record`` looks the frozenset up when it runs: it is replaced,
    and ``unregister`` puts vLLM's own back.

    Not under full validation (``SWA_HAL_DEBUG=1`` or ``configure(validate=True)`` before vLLM loads the
    plugin): it reads the batch on the host at every build, which a recorded build cannot, and a replay
    would skip it; every step then builds eagerly, validated."""
    from ..builder import debug_mode

    if options.validate if options.validate is not None else debug_mode():
        return
    try:
        graphs: Any = importlib.import_module(METADATA_GRAPHS_MODULE)
    except Exception as exc:  # noqa: BLE001 - vLLM calls the plugin unguarded
        # In every process, on every platform: a module vLLM itself cannot import here records nothing,
        # and must not stop the engine.
        log.debug("swa_hal: %s does not import (%r); no metadata builds are recorded", METADATA_GRAPHS_MODULE, exc)
        return
    current = graphs._RECORDABLE_BUILDERS
    ours = {cls for cls in map(swa_hal_builder_cls, current) if cls not in current}
    if ours:
        graphs._RECORDABLE_BUILDERS = frozenset(current | ours)
        _patched.append((graphs, "_RECORDABLE_BUILDERS", current))


def unregister() -> None:
    """Give vLLM its own builders and its own recordable set back (classes already constructed stay as
    they are), and end the shadow."""
    global _registered
    with _lock:
        from . import vllm_shadow

        vllm_shadow.start(None)
        admit_none()
        while _patched:
            cls, attr, original = _patched.pop()
            if original is None:
                if attr in cls.__dict__:
                    delattr(cls, attr)
            else:
                setattr(cls, attr, original)
        _registered = False


def plugin_report() -> dict[str, Any]:
    """Whether the plugin is active in this environment, found as vLLM finds it: its entry point, vLLM's
    ``VLLM_PLUGINS`` filter, swa_hal's switch, then ``vllm.plugins.load_general_plugins()`` (what vLLM runs in
    every process) and ``is_registered()``. ``swa-hal info --engine vllm`` prints it (docs/engines.md #is-it-active).

    vLLM 0.34 configures its logging after it loads the plugins, so the start-up line the plugin logs then is
    shown nowhere: it is captured here (``startup``), with any warning (``messages``)."""
    from importlib import metadata

    from .vllm_common import SUPPORTED_VLLM as supported

    report: dict[str, Any] = {"engine": "vllm", "supported": list(supported), "active": False}
    version = vllm_version()
    report["version"] = version
    eps = [ep for ep in metadata.entry_points(group="vllm.general_plugins") if ep.name == "swa_hal"]
    report["entry_point"] = eps[0].value if eps else None
    allowed = os.environ.get("VLLM_PLUGINS")
    report["vllm_plugins"] = allowed
    report["switch"] = {ENV_SWITCH: os.environ.get(ENV_SWITCH), "on": enabled()}
    reason = None
    if version is None:
        reason = "vLLM is not installed in this environment"
    elif not eps:
        reason = "no vllm.general_plugins entry point named swa_hal: swa-hal is not installed as a distribution here"
    elif allowed is not None and "swa_hal" not in allowed.split(","):
        reason = f"VLLM_PLUGINS={allowed!r} does not name swa_hal, so vLLM does not load it"
    elif not enabled():
        reason = f"{ENV_SWITCH}={os.environ.get(ENV_SWITCH)}: the plugin leaves vLLM its own builders"
    messages: list[str] = []
    if version is not None:
        # Kept here, not passed on: the report shows them (vLLM's handlers are not set up yet anyway).
        with _common.kept_log(log, messages):
            try:
                from vllm.plugins import load_general_plugins

                load_general_plugins()
            except Exception as exc:  # noqa: BLE001 - what vLLM's own start-up would have raised, reported
                reason = reason or f"vllm.plugins.load_general_plugins() raised {type(exc).__name__}: {exc}"
    report["registered"] = is_registered()
    startup = [m.split(" ", 1)[1] for m in messages if m.startswith("INFO swa_hal ")]
    report["startup"] = startup[0] if startup else None
    report["messages"] = [m for m in messages if not m.startswith("INFO swa_hal ")]
    if report["registered"]:
        from . import vllm_shadow

        report["active"] = True
        report["step_builds"] = step_builds_active()
        report["mode"] = "shadow" if vllm_shadow.shadowing() and vllm_shadow.current().mode != "serve" else "serve"  # type: ignore[union-attr]
        report["shadow"] = vllm_shadow.report()
        report["hook_gaps"] = hook_gaps()
    elif reason is None:
        reason = "the plugin loaded but did not register" + (f": {report['messages'][0]}" if report["messages"] else "")
    report["stepped_aside"] = stepped_aside(ENGINE)
    report["reason"] = reason
    return report


def hook_gaps() -> dict[str, str]:
    """Per builder method whose vLLM base takes other parameters than swa_hal's knows, what differs, and the
    fields of vLLM's common metadata swa_hal does not know (``vllm_builder.KNOWN_COMMON_FIELDS``): calls that
    pass or set them step aside to vLLM's own build (docs/engines.md #drift)."""
    import dataclasses

    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadataBuilder as base

    from .aside import signature_gaps
    from .vllm_builder import KNOWN_COMMON_FIELDS
    from .vllm_builder import SwaHalSparseSWAMetadataBuilder as ours

    gaps = {}
    for name, known in (("build", ours.swa_hal_build), ("update_draft_decode_metadata", ours.swa_hal_update_draft)):
        why = signature_gaps(getattr(base, name), known, hook_leading=0)
        if why is not None:
            gaps[name] = why
    fields = [f.name for f in dataclasses.fields(CommonAttentionMetadata) if f.name not in KNOWN_COMMON_FIELDS]
    if fields:
        gaps["CommonAttentionMetadata"] = (
            f"fields {', '.join(fields)}, which swa_hal does not know: a build that sets one steps aside"
        )
    return gaps


def describe(version: str | None = None) -> tuple[str, str]:
    """(backend, platform): the swa_hal backend this process's device gets, found without building."""
    return _common.auto_backend(backend=options.backend, platform=options.platform)


def __getattr__(name: str) -> Any:
    # The builder classes live in vllm_builder (they subclass vLLM's); their old names resolve here.
    if name in ("SwaHalSparseSWAMetadataBuilder", "swa_config_from_vllm") or name.startswith("SwaHal_"):
        check_vllm()
        from . import vllm_builder

        return getattr(vllm_builder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
