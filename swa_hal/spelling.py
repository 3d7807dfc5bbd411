"""The "did you mean" of an error about a name swa_hal does not know: a ``SWA_HAL_*`` environment variable, a
key of a config or scenario file, a backend name."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known name ``word`` is most alike (``difflib``'s ratio, at least 0.6), or None where none is close."""
    found = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return found[0] if found else None
