"""swa_hal: sliding-window-attention metadata for DeepSeek-V4-style sparse MLA, on any hardware.

A core builder (semantics, buffers, validation) over a backend protocol; backends are pluggy
plugins found through the ``swa_hal.backends`` entry-point group and chosen per platform.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from .backend import Availability, Backend, BackendSpec
from .batch import AttentionBatch, ImageSpans
from .builder import SWAMetadataBuilder
from .config import LAYER_TYPES, SWAConfig
from .errors import (
    BackendNotFoundError,
    BackendStartError,
    BackendUnavailableError,
    BatchValidationError,
    ConfigError,
    PluginError,
    SWAHalError,
)
from .hookspecs import hookimpl, hookspec
from .metadata import SWAMetadata
from .plan import BuildPlan
from .platform import PlatformInfo, probe_platform
from .request_window import RequestWindowLayout, RequestWindowRows
from .selection import Selection, select_backend
from .slot_ring import SlotRing
from .slot_rows import SlotRows
from .step_inputs import StepInputs

try:
    __version__ = _version("swa-hal")
except PackageNotFoundError:  # a source checkout that was never installed
    __version__ = "0+unknown"

__all__ = [
    "AttentionBatch",
    "Availability",
    "Backend",
    "BackendNotFoundError",
    "BackendSpec",
    "BackendStartError",
    "BackendUnavailableError",
    "BatchValidationError",
    "BuildPlan",
    "ConfigError",
    "LAYER_TYPES",
    "PlatformInfo",
    "PluginError",
    "RequestWindowLayout",
    "RequestWindowRows",
    "SWAConfig",
    "SWAHalError",
    "SWAMetadata",
    "SWAMetadataBuilder",
    "ImageSpans",
    "Selection",
    "SlotRing",
    "SlotRows",
    "StepInputs",
    "hookimpl",
    "hookspec",
    "probe_platform",
    "select_backend",
    "__version__",
]
