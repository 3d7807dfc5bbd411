"""Every ```python block of README.md and docs/*.md runs as pasted, and prints what the docs say.

The convention the docs follow:

- A block fenced ```python is an example: it runs on a CPU, from the repository root, in a namespace of its
  own (so it imports what it uses), with no GPU and the torch backend.
- A block fenced ```python fragment only shows an API (placeholders, an engine's objects, a GPU) and is not run.
- A line ending in a comment ``# -> VALUE`` states what that line prints. The block's output must be exactly
  those values, one line each, in order; a block without such comments must print nothing. The stated values
  come from docs/semantics.md (its rules and worked vectors), never from running the example.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from helpers import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
EXPECT = re.compile(r"#\s*->\s?(?P<value>.*?)\s*$")


def _blocks() -> list[tuple[Path, int, str, str]]:
    """(doc, first line of the code, info string, code) for every fenced block of the docs."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start("body")) + 1
            out.append((doc, line, m.group("info").strip(), m.group("body")))
    return out


BLOCKS = _blocks()
EXAMPLES = [(doc, line, code) for doc, line, info, code in BLOCKS if info.split() == ["python"]]


def _id(block: tuple[Path, int, str]) -> str:
    return f"{block[0].relative_to(ROOT)}:{block[1]}"


def expected_output(code: str) -> list[str]:
    """The values the block's ``# -> VALUE`` comments state, in order."""
    return [m.group("value") for line in code.splitlines() if (m := EXPECT.search(line))]


def test_every_python_block_is_an_example_or_a_fragment():
    """A Python block is fenced ```python or ```python fragment: any other spelling would escape the run."""
    odd = [
        f"{doc.relative_to(ROOT)}:{line - 1}: ```{info}"
        for doc, line, info, _ in BLOCKS
        if info.split()[:1] in (["py"], ["python3"], ["pycon"])
        or (info.split()[:1] == ["python"] and info.split()[1:] not in ([], ["fragment"]))
    ]
    assert not odd, odd
    assert len(EXAMPLES) >= 4, [_id(b) for b in EXAMPLES]


@pytest.mark.parametrize("block", EXAMPLES, ids=_id)
def test_docs_example_runs_and_prints_what_the_docs_state(block, monkeypatch):
    doc, line, code = block
    monkeypatch.chdir(ROOT)  # examples read configs/ by relative path
    # No GPU even on a machine with one: torch reads this when CUDA first initialises, and the examples
    # build on device="cpu", so auto-selection gives the torch backend.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    # Line numbers in a traceback are the doc's own.
    compiled = compile("\n" * (line - 1) + code, str(doc.relative_to(ROOT)), "exec")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compiled, {"__name__": "__main__"})
    assert out.getvalue().splitlines() == expected_output(code)
