"""``swa-hal new-backend NAME``: a vendor's plugin package, written from the example plugin with every name in it
made NAME's (docs/backends.md #writing-a-backend-plugin).

The template is the example plugin's tracked files (examples/swa-hal-example-backend in the repository), packaged
in swa_hal as ``plugin_template/<path>.tmpl`` so the command works from an installed wheel; the suffix keeps every
tool (pytest, ruff, mypy, setuptools) from reading the copy as code or configuration of its own.
tests/test_plugin_template.py holds the copy equal to the example and the written package to the kit.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from .backend import BackendSpec
from .errors import SWAHalError
from .specs import vendor_backend_spec

if TYPE_CHECKING:
    from importlib.abc import Traversable

TEMPLATE_NAME = "example"  # the name the template's files use, which the command replaces
SUFFIX = ".tmpl"
NAME_RULE = re.compile(r"[a-z][a-z0-9_]*")


class NewBackendError(SWAHalError, ValueError):
    """A backend name or an output folder ``swa-hal new-backend`` cannot use."""


@dataclass(frozen=True)
class PluginNames:
    """The names a plugin called ``name`` has, each where the template has its counterpart."""

    name: str  # the backend, the entry point and the vendor: "acme_npu"
    package: str  # the import package: "swa_hal_acme_npu"
    distribution: str  # pip's name and the default folder: "swa-hal-acme-npu-backend"
    title: str  # the class-name prefix and the vendor in prose: "AcmeNpu"

    @classmethod
    def of(cls, name: str) -> PluginNames:
        """The names of the plugin ``name``; a NewBackendError where ``name`` is no Python identifier, a built-in
        backend's, or one swa_hal's registry would skip."""
        if not NAME_RULE.fullmatch(name) or keyword.iskeyword(name) or name.endswith("_") or "__" in name:
            raise NewBackendError(
                f"backend name {name!r}: must be a lowercase Python identifier starting with a letter "
                f"(letters, digits, single underscores), e.g. 'acme' or 'acme_npu'; it names the backend, the entry "
                f"point and the package swa_hal_NAME"
            )
        taken = _builtin_backend_names()
        if name in taken:
            raise NewBackendError(
                f"backend name {name!r}: a built-in backend has that name ({', '.join(sorted(taken))}); a plugin "
                f"registering it too would shadow one of them"
            )
        names = cls.unchecked(name)
        # What the registry refuses, it refuses by BackendSpec.problems(): the written plugin's spec is held to it
        # here, so the command never writes a plugin whose backend the registry would skip once installed.
        problems = names.spec().problems()
        if problems:
            raise NewBackendError(
                f"backend name {name!r} ({len(name)} characters): swa_hal's registry would skip the written "
                f"plugin's backend as a malformed BackendSpec: {'; '.join(problems)}"
            )
        return names

    @classmethod
    def unchecked(cls, name: str) -> PluginNames:
        """The names a plugin called ``name`` would have, whether or not ``of`` allows it."""
        return cls(
            name=name,
            package=f"swa_hal_{name}",
            distribution=f"swa-hal-{name.replace('_', '-')}-backend",
            title="".join(part.capitalize() for part in name.split("_")),
        )

    def spec(self) -> BackendSpec:
        """The spec the written plugin declares, as far as its names go (its other fields are the template's)."""
        return vendor_backend_spec(
            self.name,
            factory=f"{self.package}.backend:{self.title}Backend",
            priority=0,
            vendor=self.name,
            vendor_label=self.name,
            platforms=(f"vendor={self.name}",),
            summary="",
        )

    def rename(self, text: str) -> str:
        """Every occurrence of the template's names in ``text`` made this plugin's, in one pass (so a name that
        holds the template's, such as 'example_npu', is not renamed again), the longest forms first."""
        pairs = dict(zip(TEMPLATE.forms(), self.forms()))
        return re.sub("|".join(map(re.escape, pairs)), lambda m: pairs[m.group(0)], text)

    def forms(self) -> tuple[str, str, str, str]:
        """The names, the longest forms first: each one that holds another is replaced before it."""
        return (self.distribution, self.package, self.title, self.name)


TEMPLATE = PluginNames.unchecked(TEMPLATE_NAME)


def _builtin_backend_names() -> set[str]:
    """The backend names swa_hal itself registers (its own distribution's swa_hal.backends entry points)."""
    from importlib import metadata

    try:
        eps = metadata.distribution("swa-hal").entry_points
    except metadata.PackageNotFoundError:  # swa_hal run from a source tree without being installed
        return {"torch", "cuda", "sm12x", "rocm", "xpu"}
    return {ep.name for ep in eps if ep.group == "swa_hal.backends"}


def template_files() -> dict[str, str]:
    """The template: each file's path in the plugin (the template's names) -> its text."""
    out: dict[str, str] = {}

    def walk(node: Traversable, prefix: str) -> None:
        for child in node.iterdir():
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith(SUFFIX):
                out[prefix + child.name[: -len(SUFFIX)]] = child.read_text(encoding="utf-8")

    walk(resources.files("swa_hal") / "plugin_template", "")
    return dict(sorted(out.items()))


def render(name: str | PluginNames) -> dict[str, str]:
    """The plugin ``name`` (checked by ``PluginNames.of`` unless given as ``PluginNames``): each file's path ->
    its text, every name of the template's made ``name``'s."""
    names = name if isinstance(name, PluginNames) else PluginNames.of(name)
    return {names.rename(path): names.rename(text) for path, text in template_files().items()}


def write_plugin(name: str, dest: str | Path | None = None) -> Path:
    """Write the plugin ``name`` into ``dest`` (default: ./swa-hal-NAME-backend), which must not exist or be an
    empty folder (nothing there is overwritten). Returns the folder."""
    files = render(name)
    folder = Path(dest) if dest is not None else Path(PluginNames.of(name).distribution)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise NewBackendError(f"--dir {str(folder)!r}: exists and is not an empty folder; nothing was written")
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return folder
