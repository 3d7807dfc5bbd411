"""Exception types. Every error names the field, the index (where there is one) and the constraint."""

from __future__ import annotations


class SWAHalError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(SWAHalError, ValueError):
    """An invalid SWAConfig value."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class BatchValidationError(SWAHalError, ValueError):
    """An invalid AttentionBatch. Subclasses say which kind of constraint was broken.

    ``message`` is the whole sentence and starts with the field (``seq_lens[3]=2 is shorter than its
    query length 5``); ``field``, ``index`` and ``constraint`` are kept for programs.
    """

    def __init__(self, field: str, message: str, index: int | None = None):
        self.field = field
        self.index = index
        self.constraint = message
        super().__init__(message)


class BatchDtypeError(BatchValidationError, TypeError):
    """A tensor has the wrong dtype."""


class BatchDeviceError(BatchValidationError):
    """A tensor lives on the wrong device."""


class BatchShapeError(BatchValidationError):
    """A tensor has the wrong rank or length."""


class BlockGeometryError(BatchShapeError, AssertionError):
    """DSpark rows whose count is not a multiple of the draft block size. Also an ``AssertionError``: SGLang's
    own DSpark ops assert this geometry, so its callers that catch ``AssertionError`` catch swa_hal's too,
    and the error still names the field (``row_ends``) like every ``BatchValidationError``."""


class BatchOrderError(BatchValidationError):
    """query_start_loc is not a non-decreasing sequence starting at 0."""


class BatchRangeError(BatchValidationError):
    """A value lies outside its legal range."""


class BatchCapacityError(BatchValidationError):
    """The batch does not fit the builder's fixed buffers or the model limits."""


class BatchConsistencyError(BatchValidationError):
    """Two inputs disagree (CPU and device copies, slot_mapping and block_table, ...)."""


class SpeculativeModeError(BatchValidationError):
    """A request the configured speculative method does not allow (causal=False without DSpark, ...)."""


class DeviceError(SWAHalError, ValueError):
    """A device a builder cannot build on: not a device name torch knows, or one whose tensors hold no
    data (``meta``), so no output could be written or read back."""


class PluginError(SWAHalError):
    """A plugin failed to load or gave something malformed (raised only in strict mode)."""


class BackendNotFoundError(SWAHalError, LookupError):
    """An explicitly requested backend is not registered."""


class BackendUnavailableError(SWAHalError, RuntimeError):
    """An explicitly requested backend exists but cannot run on this platform, or no backend can."""


class BackendStartError(BackendUnavailableError):
    """A backend was chosen but failed to start: its factory or its ``allocate()`` raised. Raised for an
    explicit request and under ``SWA_HAL_STRICT=1`` (auto-selection falls back instead), and when no
    candidate could start; the error names the backend and chains what it raised."""


class ConcurrentBuildError(SWAHalError, RuntimeError):
    """A builder was entered from a second thread while a build was running (one builder per thread)."""
