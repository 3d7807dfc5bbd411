"""The guard's rule codes (``swa_hal.rules.Violation``, docs/semantics.md #guarded-builds) as kernel constants:
the kernels, the torch backend's guard and ``check()`` read one table."""

from __future__ import annotations

import triton.language as tl

from ..rules import Violation

QUERY_ORDER = tl.constexpr(int(Violation.QUERY_ORDER))
SEQ_SHORT = tl.constexpr(int(Violation.SEQ_SHORT))
REPLAY = tl.constexpr(int(Violation.REPLAY))
SPAN = tl.constexpr(int(Violation.SPAN))
PAGES = tl.constexpr(int(Violation.PAGES))
BLOCK = tl.constexpr(int(Violation.BLOCK))
ROW_WIDTH = tl.constexpr(int(Violation.ROW_WIDTH))
POOL = tl.constexpr(int(Violation.POOL))
POSITION = tl.constexpr(int(Violation.POSITION))
TOKEN_SLOT = tl.constexpr(int(Violation.TOKEN_SLOT))
CACHE_SLOT = tl.constexpr(int(Violation.CACHE_SLOT))
RING_SLOT = tl.constexpr(int(Violation.RING_SLOT))
PADDING_SLOT = tl.constexpr(int(Violation.PADDING_SLOT))
HOST_SPLIT = tl.constexpr(int(Violation.HOST_SPLIT))
HOST_SEQ = tl.constexpr(int(Violation.HOST_SEQ))
MODEL_LEN = tl.constexpr(int(Violation.MODEL_LEN))
OWN_SLOT = tl.constexpr(int(Violation.OWN_SLOT))
