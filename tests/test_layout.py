"""The shape of the package: no import cycle, and the core depends on neither the backends nor the kit."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers import ROOT

PACKAGE = ROOT / "swa_hal"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """What a module imports when it is imported (module level, TYPE_CHECKING blocks excluded: function-level
    imports are lazy on purpose)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            prefix = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
            for alias in node.names:
                full = f"{prefix}.{alias.name}"
                out.add(full if full in MODULES else prefix)
    return {m for m in out if m in MODULES and m != name} | {m for m in out if not m.startswith("swa_hal")}


def test_no_import_cycle():
    graph = {name: {m for m in _imports(name) if m in MODULES} for name in MODULES}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        for dep in graph[name]:
            assert dep not in path, "import cycle: " + " -> ".join(path[path.index(dep):] + [dep])
            if dep not in done:
                visit(dep, path + [dep])
        done.add(name)

    for name in graph:
        visit(name, [name])


def test_the_core_imports_no_backend_and_no_test_kit():
    core = [n for n in MODULES if not n.startswith(("swa_hal.testing", "swa_hal.integrations"))]
    for name in core:
        deps = _imports(name)
        assert not any(d.startswith("swa_hal_") for d in deps), f"{name} imports a backend package"
        assert not any(d.startswith("swa_hal.testing") for d in deps), f"{name} imports the test kit"
    assert "swa_hal.reference" not in _imports("swa_hal.metadata")
    assert "swa_hal.validation" not in _imports("swa_hal.batch")
    assert "swa_hal.batch" not in _imports("swa_hal.validation")


def test_the_rules_stand_on_the_config_and_the_errors_alone():
    """Every backend, launch contract and the violation watch read the guarded build's rules from one module,
    which reads nothing of theirs (docs/semantics.md #guarded-builds)."""
    assert {d for d in _imports("swa_hal.rules") if d.startswith("swa_hal")} == {"swa_hal.config", "swa_hal.errors"}
    readers = ("swa_hal.kernels.rules", "swa_hal.kernels.rows_launch", "swa_hal.violations", "swa_hal.buffers")
    for name in readers + ("swa_hal.torch_backend.guard", "swa_hal.torch_backend.rows", "swa_hal.torch_backend.slot_rows"):
        assert "swa_hal.rules" in _imports(name), f"{name} does not read the rules from swa_hal.rules"


def test_the_torch_and_triton_wings_import_nothing_of_each_other():
    torch_wing = ("swa_hal.torch_backend",)
    triton_wing = ("swa_hal.triton_backend", "swa_hal.kernels")
    for name in MODULES:
        deps = _imports(name)
        if name.startswith(triton_wing):
            assert not any(d.startswith(torch_wing) for d in deps), f"{name} imports the torch backend"
        if name.startswith(torch_wing):
            assert not any(d.startswith(triton_wing) for d in deps), f"{name} imports the Triton backend"


def test_the_cli_never_imports_the_test_kit():
    # Not even lazily: the command line checks builds with swa_hal.compare, which lives in the core.
    for node in ast.walk(ast.parse(MODULES["swa_hal.cli"].read_text())):
        if isinstance(node, ast.ImportFrom):
            assert "testing" not in (node.module or ""), f"swa_hal/cli.py line {node.lineno} imports the kit"


def test_every_cited_section_of_the_semantics_exists():
    """Code, tests and docs cite docs/semantics.md by its level-2 headings' anchors; each cited one is there."""
    headings = re.findall(r"^## (.+)$", (ROOT / "docs" / "semantics.md").read_text(), flags=re.M)
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
    cited = {}
    for folder in ("swa_hal", "backends", "tests", "benchmarks", "docs", "examples"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md") and path.is_file():
                for anchor in re.findall(r"semantics\.md ?#([a-z0-9-]+)", path.read_text()):
                    cited.setdefault(anchor, path.relative_to(ROOT))
    assert len(cited) > 10
    missing = {a: str(p) for a, p in cited.items() if a not in anchors}
    assert not missing, missing


def test_the_per_request_input_files_docs_list_are_the_files_that_name_replay_start():
    """docs/kernels.md #adding-a-per-request-input lists the core files ``replay_start`` (the worked example, with
    every kind of file an input can need) names: the list and the package's own files agree, so the guide's
    count of what a new input touches cannot drift from the code."""
    root = ROOT
    docs = (root / "docs" / "kernels.md").read_text()
    section = docs[docs.index("## Adding a per-request input") :]
    listed_part = section[section.index("names exactly these core files") : section.index("Outside the core")]
    listed = set(re.findall(r"`(swa_hal/[\w/]+\.py)`", listed_part))
    name = re.compile(r"(?<![A-Za-z0-9_])(?:no_|padded_)?replay_(?:start|ptr)\b")
    outside = ("swa_hal/integrations/", "swa_hal/testing/", "swa_hal/cli.py", "swa_hal/compare.py", "swa_hal/scenarios.py")
    naming = {
        str(p.relative_to(root))
        for p in (root / "swa_hal").rglob("*.py")
        if not str(p.relative_to(root)).startswith(outside) and name.search(p.read_text())
    }
    assert len(listed) == 15, sorted(listed)
    assert naming == listed, (sorted(naming - listed), sorted(listed - naming))


def test_the_fewest_files_a_per_request_input_touches_are_the_numbered_ones():
    """docs/kernels.md #adding-a-per-request-input numbers the files any new per-request input touches: as many
    as its words say, each among the files ``replay_start`` names; and the torch backend is not among them
    because its calls of the per-request terms, the gather lengths and the guard's request checks hand them the
    build's plan, not the inputs one by one (which would make every new input an edit of those calls too)."""
    docs = (ROOT / "docs" / "kernels.md").read_text()
    section = docs[docs.index("## Adding a per-request input") : docs.index("and more as the input asks")]
    numbered = re.findall(r"^\d+\. `(swa_hal/[\w/]+\.py)`", section, flags=re.M)
    words = {"five": 5, "six": 6, "seven": 7, "eight": 8}
    count = words[re.search(r"at the\s+least, (\w+) core files", section).group(1)]
    assert len(numbered) == count == 6, numbered
    assert "swa_hal/torch_backend/backend.py" not in numbered
    tree = ast.parse((ROOT / "swa_hal" / "torch_backend" / "backend.py").read_text())
    calls: dict[str, list[ast.Call]] = {"request_terms": [], "gather_lens": [], "request_quantities": []}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            calls.get(name, []).append(node)
    for name, found in calls.items():
        assert found, f"the torch backend no longer calls {name}"
        for call in found:
            assert isinstance(call.args[0], ast.Name) and call.args[0].id == "plan", ast.dump(call)
            handed = {k.arg for k in call.keywords} | {a.id for a in call.args if isinstance(a, ast.Name)}
            assert not handed & {"query_start_loc", "seq_lens", "replay_start", "qsl", "seq", "replay"}, handed
