"""Reading environment switches, one way everywhere.

``SWA_HAL_STRICT``, ``SWA_HAL_DEBUG`` and ``TRITON_INTERPRET`` are on when set to one of
``TRUE_WORDS`` (any case, surrounding spaces ignored) and off otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def env_flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether the variable ``name`` of ``env`` (default: the process environment) is set to a true word."""
    value = (os.environ if env is None else env).get(name, "")
    return value.strip().lower() in TRUE_WORDS
