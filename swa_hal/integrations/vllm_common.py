"""What swa_hal's vLLM modules share: the supported releases and the version check, the ``SWA_HAL_VLLM``
switch, the defaults of the builders vLLM creates (``configure``), the plugin's logger, and how a swa_hal
builder class is told from vLLM's.

The plugin (``swa_hal.integrations.vllm``) re-exports every public name here, so users keep finding them
there. The builder (``vllm_builder``) and step build (``vllm_step``) modules take them from here instead:
the plugin imports both of them, and this module imports neither them nor the plugin, so no module of the
integration imports one that imports it. Like the plugin, it imports nothing from vLLM.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version

from ..errors import SWAHalError
from ..platform import PlatformInfo
from . import _common

# The vLLM release series this integration is written and tested against (its builders' internals);
# docs/engines.md #compatibility says how each is tested.
SUPPORTED_VLLM = ("==0.33.*", "==0.34.*")
ENV_SWITCH = "SWA_HAL_VLLM"
ENGINE = "vLLM"

# A child of vLLM's logger, so the line appears in vLLM's own log format.
log = logging.getLogger("vllm.plugins.swa_hal")


class VllmNotInstalledError(SWAHalError, ImportError):
    """The vLLM integration was used where vLLM is not installed."""


class VllmVersionError(_common.EngineVersionError):
    """The installed vLLM is not a release of the series this integration was built for."""


# -- the installed vLLM -------------------------------------------------------------------------


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def vllm_version() -> str | None:
    try:
        return _dist_version("vllm")
    except PackageNotFoundError:
        return None


def installed_version() -> str:
    version = vllm_version()
    if version is None:  # importable but without distribution metadata (a source tree on sys.path)
        import vllm

        version = getattr(vllm, "__version__", None) or "unknown"
    return version


def require_installed() -> None:
    """A ``VllmNotInstalledError`` saying what to install, where vLLM cannot be imported."""
    if not vllm_installed():
        raise VllmNotInstalledError(
            f"swa_hal.integrations.vllm needs vLLM {_common.supported_text(SUPPORTED_VLLM)}, which is not "
            "installed: install vLLM itself (swa_hal's [vllm] extra never installs, replaces or downgrades an engine)"
        )


# The release the plugin's start-up admitted (``register``: a tested one, or any other it shadows or is forced
# to serve), which the builders then accept as well.
_admitted: list[str] = []


def admit(version: str) -> None:
    """``register`` admitted ``version``: builders may be made under it (``check_vllm``)."""
    _admitted[:] = [version]


def admit_none() -> None:
    """Forget the admitted release (``unregister``)."""
    _admitted.clear()


def check_vllm(version: str | None = None) -> str:
    """The installed vLLM's version, or a clear error: not installed, or not a supported release (unless
    ``SWA_HAL_FORCE_ENGINE=1``, or the plugin's start-up admitted it: ``admit``). For direct use of the
    builders; vLLM's start-up goes through ``register``, which never raises on a version
    (``SWA_HAL_STRICT=1`` aside)."""
    if version is None:
        require_installed()
        version = installed_version()
    if version in _admitted:
        return version
    return _common.require_version(
        "vLLM", "vllm", SUPPORTED_VLLM, switch=ENV_SWITCH, error=VllmVersionError, found=version
    )


# -- options for the builders vLLM creates ------------------------------------------------------


@dataclasses.dataclass
class BuilderOptions:
    """Defaults for every swa_hal builder vLLM constructs (vLLM passes only its four arguments).
    ``backend``: a swa_hal backend name (None: ``SWA_HAL_BACKEND``, else auto-selection);
    ``platform``: a PlatformInfo replacing the device probe (tests, ``--assume``);
    ``validate``: full validation on every build (None: ``SWA_HAL_DEBUG``)."""

    backend: str | None = None
    platform: PlatformInfo | None = None
    validate: bool | None = None


# Changed in place only (``configure``): the plugin re-exports this one object.
options = BuilderOptions()


def configure(
    backend: str | None = None, platform: PlatformInfo | str | None = None, validate: bool | None = None
) -> BuilderOptions:
    """Set the defaults for builders created from now on; returns the previous options."""
    previous = dataclasses.replace(options)
    options.backend = backend
    options.platform = PlatformInfo.from_assume(platform) if isinstance(platform, str) else platform
    options.validate = validate
    return previous


# -- builder classes ----------------------------------------------------------------------------


def is_swa_hal_builder(cls: type) -> bool:
    """Whether ``cls`` is a swa_hal builder class: every one names the vLLM class it stands in for
    (``swa_hal_native_cls``), so this needs no import of the builder module (which imports vLLM)."""
    return isinstance(cls, type) and getattr(cls, "swa_hal_native_cls", None) is not None


def native_builder_cls(cls: type) -> type:
    """The vLLM builder class a swa_hal builder class stands in for (itself for any other class)."""
    return getattr(cls, "swa_hal_native_cls", None) or cls


def all_subclasses(cls: type) -> Iterator[type]:
    seen: set[type] = set()
    stack: list[type] = list(cls.__subclasses__())
    while stack:
        sub = stack.pop()
        if sub not in seen:
            seen.add(sub)
            yield sub
            stack.extend(sub.__subclasses__())
