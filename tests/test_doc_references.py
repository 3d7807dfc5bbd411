"""Docs, docstrings and comments name only what exists: every file, module and dotted name of this repository
that they mention resolves in today's tree, so a renamed module, a moved constant or a deleted results file
leaves no stale mention behind.

Read: every tracked Markdown file but CHANGELOG.md (whose entries name what was removed or renamed), and the
docstrings and comments of the Python files, the shell scripts, .ci/, the Makefile and pyproject.toml. Checked
there, by parsing the tree (nothing is imported):

* a path from the repository root (``swa_hal/builder.py``, ``benchmarks/results/h200/info.txt``), from the
  file's own folder (a Markdown link's target, ``../docs/kernels.md``), or from a folder one level inside a
  top folder (``kernels/launch.py``, ``h200/info.txt``): the file or folder is there (``*`` matches a name part);
* a bare file name (``rules.py``, ``bench_cpu.txt``): a file of that name is in the repository, or a script
  of it names it (an output it writes);
* a Python file's path followed by ``:name`` or ``::name`` (``swa_hal/preflight.py:preflight_noncausal``): the file
  defines ``name``;
* a dotted name in one of the packages, the built-in backends' and the example plugin's included
  (``swa_hal.torch_backend.guard.TorchGuard.requests_clean``, ``swa_hal.integrations.sglang:load_plugin``):
  each step exists, a package's names being what it defines or imports, any other module's what it defines;
* ``Class.member`` for a class of the repository: it or one of its bases defines ``member`` (a method, a
  class attribute or field, or an attribute its methods set on ``self``);
* ``module.name`` where ``module`` is one of the packages' modules and ``name`` one of the packages' top-level
  definitions: that module defines ``name`` (``preflight.group_inputs``; a constant that moved to another
  module is caught under its old module's name). Other ``module.name`` (mostly a variable's attribute:
  ``batch.seq_lens``) are not checked.

Not checked: paths into folders git ignores (outputs: ``benchmarks/out/``, ``.device/``), paths of other
projects (a first folder this repository has not got: ``sglang/srt/...``), placeholders (a ``<...>`` part, a
made-up name with ``acme`` or ``my_``, a one-letter file name: ``configs/batches/x.yaml``), entry-point groups
(``swa_hal.backends``), and the files copied from other projects (``tests/engines/sglang_upstream``,
``tests/engines/vllm_upstream``) and the paths they came from (``OTHERS``).
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

from helpers import ROOT

TOP = ("swa_hal", "backends", "tests", "benchmarks", "docs", "configs", "examples", ".ci", ".github")
# The importable packages: the core, the built-in backends, the example plugin.
PACKAGES = ("swa_hal", *sorted(p.name for p in (ROOT / "backends").glob("swa_hal_*")), "swa_hal_example")
SKIPPED = ("CHANGELOG.md", "tests/engines/sglang_upstream/", "tests/engines/vllm_upstream/", "swa_hal/plugin_template/")
# Other projects' paths whose first folder this repository has too (vLLM's tests, named where its copied tests are).
OTHERS = ("tests/v1/",)
EXTENSIONS = ("py", "md", "txt", "json", "png", "yaml", "yml", "sh", "log", "toml", "tmpl", "cfg")
PLACEHOLDER = re.compile(r"<[^>]*>|acme|(^|/)my_|(^|/)\w\.\w+$")


@functools.cache
def tracked() -> frozenset[str]:
    """The repository's files: git's list (without git, the tree but the folders .gitignore names)."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return frozenset(line for line in out.splitlines() if (ROOT / line).is_file())
    except (OSError, subprocess.CalledProcessError):
        skip = re.compile(r"(^|/)(\.venv[^/]*|__pycache__|build|dist|[^/]*\.egg-info|\.git|\.pytest_cache)(/|$)")
        files = (str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file())
        return frozenset(f for f in files if not skip.search(f) and not f.startswith(outputs()))


@functools.cache
def folders() -> frozenset[str]:
    return frozenset("/".join(f.split("/")[:i]) for f in tracked() for i in range(1, f.count("/") + 1))


@functools.cache
def by_name() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in tracked():
        out.setdefault(f.rpartition("/")[2], []).append(f)
    return out


@functools.cache
def outputs() -> tuple[str, ...]:
    """What git ignores: a path into one of these names what a command writes, not a file of the repository."""
    lines = [line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()]
    return tuple(line.strip("/") + "/" for line in lines if line.endswith("/") and "*" not in line) + (".venv",)


@functools.cache
def second_level() -> frozenset[str]:
    """Folders a path may start from: those one level inside a top folder (kernels, testing, batches) and the
    recorded results' machines (h200)."""
    inside = {d for d in folders() if d.count("/") == 1 and d.startswith(TOP)}
    machines = {d for d in folders() if d.startswith("benchmarks/results/")}
    return frozenset(d.rpartition("/")[2] for d in inside | machines)


@functools.cache
def entry_point_groups() -> frozenset[str]:
    return frozenset(re.findall(r'^\[project\.entry-points\."([^"]+)"\]', (ROOT / "pyproject.toml").read_text(), re.M))


def _exists(path: str) -> bool:
    path = path.rstrip("/")
    if "*" in path:
        regex = re.compile("[^/]*".join(re.escape(part) for part in path.split("*")) + "(/.*)?")
        return any(regex.fullmatch(f) for f in tracked())
    return path in tracked() or path in folders()


@functools.cache
def _source(path: str) -> str:
    return (ROOT / path).read_text()


@functools.cache
def _tree(path: str) -> ast.Module:
    return ast.parse(_source(path))


def _normal(path: str) -> str:
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/".join(parts)


# --- what the repository's Python files define ---------------------------------------------------------------


class Module:
    """One Python file's names: its top-level definitions and imports, and each class's members and bases."""

    def __init__(self, path: str, name: str):
        self.path = path
        self.package = path.endswith("__init__.py")
        tree = _tree(path)
        self.defined: set[str] = set()
        self.imports: dict[str, str] = {}  # a name imported at the top level -> where from (dotted)
        self.classes: dict[str, tuple[set[str], list[str]]] = {}
        self.lazy = False  # a module-level __getattr__: the strings the module holds are names too
        self.strings: set[str] = set()
        self.exported: set[str] = set()  # __all__
        self._package = name if self.package else name.rpartition(".")[0]
        for node in tree.body:
            self._top(node)
        if self.lazy:
            self.strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        for node in _statements(tree):
            if isinstance(node, ast.ClassDef):
                self.classes.setdefault(node.name, _class_members(node))
        self.members = {m for members, _ in self.classes.values() for m in members}

    def _top(self, node: ast.stmt) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.defined.add(node.name)
            self.lazy |= node.name == "__getattr__"
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                self.defined.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
                if isinstance(target, ast.Name) and target.id == "__all__" and node.value is not None:
                    consts = (n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant))
                    self.exported.update(c for c in consts if isinstance(c, str))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                self.imports[alias.asname or alias.name.partition(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = self._package.split(".")[: self._package.count(".") + 2 - node.level]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                self.imports[alias.asname or alias.name] = f"{source}.{alias.name}"
                if alias.asname == alias.name:  # ``import x as x``: a re-export
                    self.exported.add(alias.name)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    self._top(child)
                elif isinstance(child, ast.ExceptHandler):
                    for stmt in child.body:
                        self._top(stmt)

    def has(self, name: str) -> bool:
        """Whether ``module.name`` names something: defined here, or imported into a package."""
        if name in self.defined or (self.lazy and name in self.strings):
            return True
        return name in self.imports and (self.package or name in self.exported)


def _statements(node: ast.AST) -> Iterator[ast.stmt]:
    """Every statement under ``node``, nested ones included (not the expressions: a fraction of the nodes)."""
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, field, ()):
            if isinstance(child, ast.stmt):
                yield child
            yield from _statements(child)


def _class_members(node: ast.ClassDef) -> tuple[set[str], list[str]]:
    members = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            members.add(item.name)
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            for target in item.targets if isinstance(item, ast.Assign) else [item.target]:
                members.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    for stmt in _statements(node):
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Attribute) and ast.unparse(sub.value) in ("self", "cls"):
                        members.add(sub.attr)
    return members, [re.sub(r"\[.*", "", ast.unparse(base)).rpartition(".")[2] for base in node.bases]


def _module_name(path: str) -> str:
    """A file's module name (``backends/swa_hal_cuda/backend.py``: ``swa_hal_cuda.backend``); outside the packages
    its path's (``tests.helpers``)."""
    parts = Path(path).with_suffix("").parts
    for i, part in enumerate(parts):
        if part in PACKAGES:
            parts = parts[i:]
            break
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules() -> dict[str, Module]:
    out = {}
    for f in sorted(tracked()):
        if f.endswith(".py") and not f.startswith(SKIPPED):
            out[_module_name(f)] = Module(f, _module_name(f))
    return out


@functools.cache
def by_path() -> dict[str, Module]:
    return {m.path: m for m in modules().values()}


@functools.cache
def package_modules() -> dict[str, list[Module]]:
    """The packages' modules by their last name (``guard``: swa_hal/torch_backend/guard.py)."""
    out: dict[str, list[Module]] = {}
    for name, module in modules().items():
        if name.startswith(PACKAGES):
            out.setdefault(name.rpartition(".")[2], []).append(module)
    return out


@functools.cache
def definitions() -> frozenset[str]:
    """The packages' top-level definitions (not imports)."""
    return frozenset(n for ms in package_modules().values() for m in ms if not m.package for n in m.defined)


@functools.cache
def classes() -> dict[str, list[tuple[Module, str]]]:
    out: dict[str, list[tuple[Module, str]]] = {}
    for module in modules().values():
        for name in module.classes:
            out.setdefault(name, []).append((module, name))
    return out


def _member(module: Module, cls: str, member: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether the class or a base of it has ``member``; True where a base is another library's."""
    members, bases = module.classes[cls]
    if member in members or "__getattr__" in members:
        return True
    for base in bases:
        if base in ("object", "Protocol", "Generic") or base in seen:
            continue
        if base not in classes():
            return True  # another library's class: its members are not known here
        if any(_member(m, c, member, seen | {cls}) for m, c in classes()[base]):
            return True
    return False


def _resolve(module: Module, rest: list[str], depth: int = 0) -> str | None:
    """Why ``rest`` (a dotted name's parts after the module) does not resolve in ``module``; None if it does."""
    if not rest:
        return None
    head = rest[0]
    if head in module.classes and head in module.defined:
        if len(rest) == 1 or _member(module, head, rest[1]):
            return None
        return f"{module.path}: {head} has no {rest[1]}"
    if module.has(head) and head not in module.imports:
        return None
    if module.has(head) and depth < 8:
        source = module.imports[head]
        if source in modules():
            return _resolve(modules()[source], rest[1:], depth + 1)
        origin, _, attr = source.rpartition(".")
        if origin in modules():
            return _resolve(modules()[origin], [attr] + rest[1:], depth + 1)
        return None  # another library's
    if _module_name(module.path) + "." + head in modules():
        return _resolve(modules()[_module_name(module.path) + "." + head], rest[1:], depth + 1)
    return f"{module.path} defines no {head}"


def check_dotted(name: str) -> str | None:
    """A dotted name of the packages, with or without a ``module:attribute`` colon."""
    if name in entry_point_groups():
        return None
    parts = name.replace(":", ".").split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in modules():
            return _resolve(modules()[".".join(parts[:i])], parts[i:])
    return f"no module {parts[0]}"


def check_member(owner: str, member: str) -> str | None:
    """``Class.member`` or ``module.name`` (see the module's docstring for which are checked)."""
    if f"{owner}.{member}" in entry_point_groups() or member in EXTENSIONS:
        return None
    if owner in classes():
        if any(_member(m, c, member) for m, c in classes()[owner]):
            return None
        return f"{' or '.join(m.path for m, _ in classes()[owner])}: {owner} has no {member}"
    if owner in package_modules() and member in definitions():
        found = package_modules()[owner]
        if not any(m.has(member) or member in m.members for m in found):
            return f"{' or '.join(m.path for m in found)} defines no {member}"
    return None


def check_path(path: str, doc: str, name: str | None) -> str | None:
    """A path (and the name after its ``:``) as ``doc`` mentions it."""
    if path.startswith(outputs()) or PLACEHOLDER.search(path):
        return None
    here = str(Path(doc).parent)
    first = path.split("/")[0]
    if first in ("..", "."):
        candidates = [_normal(f"{here}/{path}")]
    elif "/" not in path.rstrip("/") and path.endswith("/"):
        return None  # a folder's name alone: mostly another's or an output's (wheels/)
    elif "/" not in path:
        candidates = by_name().get(path, []) or [p for p in (path, _normal(f"{here}/{path}")) if _exists(p)]
        if not candidates:
            return None if _written(path) else "no file of that name in the repository"
    elif path.startswith(OTHERS):
        return None  # another project's path
    elif first in TOP:
        candidates = [path, _normal(f"{here}/{path}")]
    elif first in second_level() or _exists(_normal(f"{here}/{path}")):
        parents = [d.rpartition("/")[0] for d in folders() if d.endswith("/" + first)]
        candidates = [_normal(f"{here}/{path}")] + [f"{parent}/{path}" for parent in parents]
    else:
        return None  # another project's path
    existing = [c for c in candidates if _exists(c)]
    if not existing:
        return "no such file or folder"
    if name and existing[0].endswith(".py"):
        if not any(c in by_path() and _resolve(by_path()[c], name.split(".")) is None for c in existing):
            return f"{existing[0]} defines no {name.split('.')[0]}"
    return None


@functools.cache
def _script_words() -> frozenset[str]:
    names = [f for f in tracked() if f.endswith((".py", ".sh")) or f in ("Makefile", ".ci/run")]
    text = "\n".join(_source(f) for f in sorted(names) if f != "tests/test_doc_references.py")
    return frozenset(w.strip(".") for w in re.findall(r"[\w.-]+", text))


def _written(name: str) -> bool:
    """Whether a script of the repository names the file (an output it writes)."""
    return name in _script_words()


# --- where references are --------------------------------------------------------------------------------------

_EXT = "|".join(EXTENSIONS)
PATH = re.compile(
    r"(?<![\w./~$@{-])"
    r"((?:\.\.?/)*(?:\.?[\w*<>-]+/(?:\n[ \t]*(?=[\w*<]))?)+(?:[\w*<>-]+(?:\.[\w*<>-]+)*)?|[\w*<>-]+\.(?:" + _EXT + r"))"
    r"(?![\w/])(?:::?([A-Za-z_]\w*(?:\.\w+)*))?"
)
DOTTED = re.compile(r"(?<![\w./-])((?:" + "|".join(PACKAGES) + r")(?:\.\w+)+(?::\w+(?:\.\w+)*)?)")
MEMBER = re.compile(r"(?<![\w./-])([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?![\w/]|\.\w)")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)
SPAN = re.compile(r"``?([^`\n]+)``?")


def _python_texts(path: str) -> Iterator[tuple[int, str]]:
    """A Python file's comments and docstrings, each with its first line."""
    yield from _hash_comments(path)
    for node in [_tree(path), *_statements(_tree(path))]:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if ast.get_docstring(node, clean=False) is not None:
                yield node.body[0].lineno, ast.get_docstring(node, clean=False) or ""


def _hash_comments(path: str) -> Iterator[tuple[int, str]]:
    """A file's comments: whole-line ones, and what follows `` # `` where no quote is open before it (a
    docstring's line that looks like a comment is read twice, which finds nothing more)."""
    for number, line in enumerate(_source(path).splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith("#") and not stripped.startswith("#!"):
            yield number, stripped
        elif " # " in line:
            code, _, comment = line.partition(" # ")
            if code.count('"') % 2 == 0 and code.count("'") % 2 == 0:
                yield number, comment


def texts() -> Iterator[tuple[str, int, str, bool]]:
    """(file, first line, text, whether Markdown) for every text the check reads."""
    for f in sorted(tracked()):
        if f.startswith(SKIPPED):
            continue
        if f.endswith(".md"):
            yield f, 1, (ROOT / f).read_text(), True
        elif f.endswith(".py"):
            for line, text in _python_texts(f):
                yield f, line, text, False
        elif f.endswith(".sh") or f in ("Makefile", "pyproject.toml") or f.startswith(".ci/"):
            for line, text in _hash_comments(f):
                yield f, line, text, False


def problems(doc: str, first: int, text: str, markdown: bool) -> list[str]:
    """What ``text`` (of file ``doc``, from line ``first``) names that does not exist."""
    out = []

    def report(pos: int, what: str, error: str | None) -> None:
        if error:
            out.append(f"{doc}:{first + text.count(chr(10), 0, pos)}: {what}: {error}")

    for match in PATH.finditer(text):
        path, name = re.sub(r"\s", "", match.group(1)).rstrip("."), match.group(2)
        if not re.search(r"\w", path) or "://" in text[max(0, match.start() - 12) : match.start() + 3]:
            continue
        if text[max(0, match.start() - 2) : match.start()] == "](":
            continue  # a link's target: below
        report(match.start(), path + (f":{name}" if name else ""), check_path(path, doc, name))
    if markdown:
        for match in LINK.finditer(text):
            if "://" not in match.group(1) and not match.group(1).startswith("mailto:"):
                target = _normal(f"{Path(doc).parent}/{match.group(1)}")
                report(match.start(), match.group(1), None if _exists(target) else "no such file")
    # Dotted names: Markdown's code spans, outside fenced blocks (whose code test_docs_examples runs); a
    # docstring's or comment's whole text.
    names = FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text) if markdown else text
    spans = [(m.start(1), m.group(1)) for m in SPAN.finditer(names)] if markdown else [(0, names)]
    for start, span in spans:
        for match in DOTTED.finditer(span):
            report(start + match.start(), match.group(1), check_dotted(match.group(1)))
        for match in MEMBER.finditer(span):
            if not match.group(1).startswith(PACKAGES):
                report(start + match.start(), match.group(), check_member(*match.groups()))
    return out


def test_every_reference_in_the_docs_and_comments_exists():
    found = [p for doc, line, text, markdown in texts() for p in problems(doc, line, text, markdown)]
    assert not found, "\n".join(found)


def test_a_stale_name_of_each_kind_is_found():
    """Each kind of reference, once stale and once as it is today: only the stale ones are reported."""
    stale = {
        "swa_hal/guard.py": "swa_hal/rules.py",
        "kernels/guard.py": "kernels/rules.py",
        "benchmarks/results/h200/gone.txt": "benchmarks/results/h200/info.txt",
        "swa_hal/preflight.py:_no_such_name": "swa_hal/preflight.py:preflight_noncausal",
        "swa_hal.reference_backend": "swa_hal.torch_backend",
        "swa_hal.torch_backend.guard.violation_error": "swa_hal.rules.violation_error",
        "swa_hal.torch_backend:ReferenceBackend": "swa_hal.torch_backend:TorchBackend",
        "TritonBackend.supports_group_launch": "TritonBackend.rows_args",
        "guard.RECORD_LEN": "rules.RECORD_LEN",
        "no_such_results_file.txt": "bench_cpu.txt",
    }
    for old, new in stale.items():
        for markdown in (False, True):
            text = f"see `{old}` here" if markdown else f"see ``{old}`` here"
            assert problems("docs/x.md" if markdown else "swa_hal/x.py", 1, text, markdown), (old, markdown)
            text = text.replace(old, new)
            assert not problems("docs/x.md" if markdown else "swa_hal/x.py", 1, text, markdown), (new, markdown)


def test_a_stale_link_is_found_and_another_projects_path_is_not_checked():
    assert problems("docs/x.md", 3, "a\n[figures](../benchmarks/results/h200/gone.txt)", True) == [
        "docs/x.md:4: ../benchmarks/results/h200/gone.txt: no such file"
    ]
    assert not problems("docs/x.md", 1, "[figures](../benchmarks/results/README.md#nvidia-h200-h200)", True)
    assert not problems("docs/x.md", 1, "SGLang's `sglang/srt/managers/scheduler.py`, `benchmarks/out/x.txt`", True)


def test_the_results_index_lists_each_recorded_file_once():
    """benchmarks/results/README.md has a row, with its command, for each file there and for no other: a results file
    is a current figure with the command that made it (a row's ``.json``, ``.png`` take the stem before them)."""
    folder = "benchmarks/results/"
    listed: list[str] = []
    machine = ""
    for line in (ROOT / folder / "README.md").read_text().splitlines():
        if line.startswith("## "):
            found = re.search(r"\(`([\w-]+/)`\)", line)
            machine = found.group(1) if found else ""
        elif line.startswith("| `"):
            cells = line.split(" | ")
            assert len(cells) >= 3 and "`" in cells[2], f"a row without its command: {line[:80]}"
            stem = ""
            for name in re.findall(r"`([^`]+)`", cells[0]):
                stem = stem if name.startswith(".") else name.rpartition(".")[0]
                listed.append(machine + (stem + name if name.startswith(".") else name))
    recorded = sorted(f.removeprefix(folder) for f in tracked() if f.startswith(folder) and f != folder + "README.md")
    assert sorted(listed) == recorded, {
        "listed, not there": set(listed) - set(recorded),
        "not listed": set(recorded) - set(listed),
    }
