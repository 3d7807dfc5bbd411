"""The CHANGELOG names the version being built: its newest release heading is pyproject.toml's version."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_newest_changelog_heading_is_the_packages_version():
    # (a pattern, not tomllib: the package supports Python 3.10)
    version = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), flags=re.M).group(1)
    headings = re.findall(r"^## (\S+) \(([^)]*)\)$", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert headings, "CHANGELOG.md has no '## X.Y.Z (state)' heading"
    newest, state = headings[0]
    assert newest == version, f"CHANGELOG.md's newest release is {newest}, pyproject.toml's version {version}"
    assert state == "unreleased" or re.fullmatch(r"\d{4}-\d{2}-\d{2}", state), state
    assert len({v for v, _ in headings}) == len(headings), "a version heading appears twice"
