"""The comparison the kit runs (it lives in the core so the CLI can check builds without the kit)."""

from ..compare import compare_with_reference

__all__ = ["compare_with_reference"]
