"""What a new user meets on the first day, kept true: the README's dependency list, the clone's folder name,
`make clean`, `swa-hal info`'s columns, docstrings of the public classes, the example plugin's README, and a
config and a scenario passed in each other's place."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import shutil
import subprocess
import sys

import pytest

from helpers import CONFIGS, ROOT
from swa_hal import AttentionBatch, Availability, BackendSpec, hookimpl
from swa_hal.cli import main
from swa_hal.plugins import get_registry

EXAMPLE = ROOT / "examples" / "swa-hal-example-backend"


def _dependencies() -> list[str]:
    """The distribution names of pyproject.toml's [project] dependencies (a pattern: Python 3.10 has no tomllib)."""
    block = re.search(r"^dependencies = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S).group(1)
    return [re.match(r"[A-Za-z0-9_.-]+", item).group(0).lower() for item in re.findall(r'"([^"]+)"', block)]


def test_the_readme_lists_every_dependency():
    line = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("pip install . "))
    listed = re.search(r"\(([^)]*)\)", line).group(1).replace(" ", "").lower().split(",")
    assert sorted(listed) == sorted(_dependencies()), line


def test_the_readme_says_what_a_clone_named_swa_hal_does_from_its_parent_folder(tmp_path):
    # A clone's root: no __init__.py, so Python imports it as an empty namespace package.
    clone = tmp_path / "swa_hal"
    clone.mkdir()
    (clone / "README.md").write_text("a clone\n")
    proc = subprocess.run(
        [sys.executable, "-c", "from swa_hal import SWAConfig"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode != 0
    error = proc.stderr.strip().splitlines()[-1]
    readme = " ".join((ROOT / "README.md").read_text().split())
    # The README quotes the error Python gives, word for word, and the clone it tells users to make is not swa_hal.
    assert f"`{error}`" in readme, error
    assert "git clone <this repository's URL> swa-hal && cd swa-hal" in readme


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make, which runs every target of this project")
def test_make_clean_removes_the_example_plugins_build_leftovers():
    proc = subprocess.run(["make", "-n", "clean"], cwd=ROOT, capture_output=True, text=True, check=True)
    removed = proc.stdout.split()
    for leftover in ("build", "dist", "src/*.egg-info"):
        assert f"examples/swa-hal-example-backend/{leftover}" in removed, proc.stdout


class _LongNames:
    """A plugin whose plugin, distribution and backend names are longer than any built-in one."""

    @hookimpl
    def swa_hal_register_backends(self):
        return [
            BackendSpec(
                name="acme_accelerator_x_long",
                priority=1,
                factory="swa_hal.torch_backend:TorchBackend",
                is_available=lambda platform: Availability.check(["needs an Acme device"]),
                platforms=("vendor=acme",),
                summary="long names",
                kernels="torch",
            )
        ]


def _column_starts(lines: list[str], last_field: re.Pattern) -> set[int]:
    return {m.start() for m in map(last_field.search, lines) if m}


def test_info_aligns_its_columns_whatever_the_names(capsys):
    get_registry().register_plugin(
        _LongNames(), "a-plugin-with-a-long-name", dist="swa-hal-acme-accelerator-backend", version="10.20.30"
    )
    assert main(["info", "--env"]) == 0
    out = capsys.readouterr().out.splitlines()
    plugins = out[out.index("plugins:") + 1 : out.index("environment (swa_hal/envs.py):")]
    # The status column and the backends column start at one offset in every plugin row.
    assert len(_column_starts(plugins, re.compile(r" (active|blocked|failed|embedded) "))) == 1, plugins
    assert len({len(line) - len(line.split()[-1]) for line in plugins if " active " in line}) == 1, plugins
    priority = re.compile(r" priority +\d")
    backends = [line for line in out if priority.search(line)]
    assert len(backends) >= 7 and len(_column_starts(backends, priority)) == 1, backends
    env = out[out.index("environment (swa_hal/envs.py):") + 1 : out.index("backends:")]
    assert len(_column_starts(env, re.compile(r" (unset|= '.*?') "))) == 1, env
    assert len(_column_starts(env, re.compile(r" (flag|switch|int|text|list)[,:]"))) == 1, env


def test_every_public_class_of_the_library_says_what_it_is():
    # The engines' modules import their engine; the kernels' are Triton's launch records.
    import swa_hal

    skip = re.compile(r"swa_hal\.(integrations\.(vllm|sglang)|kernels)")
    missing = []
    for info in pkgutil.walk_packages(swa_hal.__path__, "swa_hal."):
        if skip.match(info.name):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == info.name and not name.startswith("_"):
                if not (obj.__dict__.get("__doc__") or "").strip():
                    missing.append(f"{info.name}.{name}")
    assert missing == [], missing
    from swa_hal.buffers import MetadataBuffers

    assert "views" in MetadataBuffers.__doc__ and "allocate()" in MetadataBuffers.__doc__


def test_the_example_readme_lists_the_files_it_has():
    text = (EXAMPLE / "README.md").read_text()
    listed = set(re.findall(r"^- `([^`]+)`:", text, re.M))
    # Its tracked files: what a copy of it holds (build leftovers are in its .gitignore).
    left_out = {"build", "dist", "__pycache__", ".pytest_cache"}
    files = {
        str(path.relative_to(EXAMPLE))
        for path in EXAMPLE.rglob("*")
        if path.is_file()
        and not left_out & set(path.relative_to(EXAMPLE).parts)
        and not any(part.endswith(".egg-info") for part in path.parts)
    }
    assert listed == files - {"README.md", ".gitignore"}, (listed, files)
    count = {3: "three", 4: "four", 5: "five"}[len(listed)]
    assert f"{count} files" in text


def test_a_config_passed_as_the_scenario_and_back_says_they_are_swapped(capsys):
    config, scenario = str(CONFIGS / "tiny.yaml"), str(CONFIGS / "batches" / "tiny_mixed.yaml")
    for argv, hint in (
        (["--config", scenario, "--batch", config], "This is a scenario file"),
        (["--batch", config], "This is a config file"),
    ):
        assert main(["build", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and hint in err and "were the config and the scenario swapped?" in err, err
    # A file with only a misspelt key is no swap.
    assert main(["build", "--batch", scenario]) == 0
    capsys.readouterr()


def test_an_unknown_key_alone_is_no_swap(tmp_path):
    from swa_hal import SWAConfig
    from swa_hal.errors import ConfigError

    path = tmp_path / "c.yaml"
    path.write_text((CONFIGS / "tiny.yaml").read_text() + "window_sise: 8\n")
    with pytest.raises(ConfigError) as info:
        SWAConfig.from_yaml(path)
    assert "window_sise" in str(info.value) and "swapped" not in str(info.value)
    assert AttentionBatch  # the public names the module imports stay importable


def test_from_lists_asks_for_the_page_size_it_derives_slots_with():
    """Slots derived with another page size than the builder's are not the table's, and a guarded build empties
    every row that reads them (recorded, so only check() would tell): the page size has no default."""
    from swa_hal import SWAConfig, SWAMetadataBuilder
    from swa_hal.errors import BatchDtypeError, BatchRangeError, BatchValidationError

    config = SWAConfig(window_size=8, block_size=16, max_model_len=256, max_num_batched_tokens=16, max_num_seqs=4)
    lists = ([40, 20], [1, 1], [[1, 2, 3], [4, 5]])
    with pytest.raises(BatchValidationError, match=r"^block_size is required to derive the slot mapping") as info:
        AttentionBatch.from_lists(*lists)
    assert info.value.field == "block_size" and "block_size=config.block_size" in str(info.value)
    with pytest.raises(BatchRangeError, match=r"^block_size=0 must be at least 1"):
        AttentionBatch.from_lists(*lists, block_size=0)
    with pytest.raises(BatchDtypeError, match=r"^block_size=2.5 is not an integer"):
        AttentionBatch.from_lists(*lists, block_size=2.5)
    builder = SWAMetadataBuilder(config)
    md = builder.build(AttentionBatch.from_lists(*lists, block_size=config.block_size))
    builder.check()  # nothing recorded: the slots are the table's
    # Request 0's window is positions 32..39, on its page 2 (block 3): slots 48..55. Request 1's is positions
    # 12..19: 12..15 on its page 0 (block 4), slots 76..79, and 16..19 on its page 1 (block 5), slots 80..83.
    assert md.decode_swa_lens.tolist() == [8, 8]
    assert md.decode_swa_indices[:, 0].tolist() == [list(range(48, 56)), list(range(76, 84))]
    # A batch that gives its slot mapping needs no page size.
    given = AttentionBatch.from_lists(*lists, slot_mapping=[3 * 16 + 7, 5 * 16 + 3])
    assert given.slot_mapping.tolist() == [55, 83]


@pytest.mark.parametrize(
    ("kind", "text", "error"),
    [
        ("config", "window_sise: 8\n", "window_sise: unknown setting in {path} (did you mean 'window_size'? known: "),
        ("config", "zzz: 8\n", "zzz: unknown setting in {path} (known: block_size, "),
        ("scenario", "padding_row: 2\n", "padding_row: unknown scenario key in {path} (did you mean 'padding_rows'? "),
        (
            "scenario",
            "groups: [{count: 2, query_len: 1, seq_lens: 5}]\n",
            "groups[0].seq_lens: unknown group key in {path} (did you mean 'seq_len'? known: count, query_len, "
            "seq_len)",
        ),
    ],
)
def test_a_misspelt_key_of_a_settings_file_says_the_key_it_is_closest_to(tmp_path, capsys, kind, text, error):
    """As a misspelt SWA_HAL_* variable does (swa_hal.envs): the known key the misspelt one is most alike, where
    one is close, before the list of every key."""
    path = tmp_path / f"{kind}.yaml"
    if kind == "config":
        path.write_text((CONFIGS / "tiny.yaml").read_text() + text)
        argv = ["build", "--config", str(path), "--batch", str(CONFIGS / "batches" / "tiny_mixed.yaml")]
    else:
        base = "" if text.startswith("groups") else "groups: [{count: 2, query_len: 1, seq_len: 5}]\n"
        path.write_text(base + text)
        argv = ["build", "--config", str(CONFIGS / "tiny.yaml"), "--batch", str(path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"swa-hal build: error: {error.format(path=path)}"), err
    assert ("did you mean" in err) == ("did you mean" in error), err
