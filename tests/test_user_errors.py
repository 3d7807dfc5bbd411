"""A user's mistakes at swa_hal's surfaces (constructors, entry points, the environment, the command): each
is an error of swa_hal's own type, or a warning, that names the input, its value and the rule, never a
traceback from deep inside torch or Python."""

from __future__ import annotations

import pytest
import torch

from helpers import CONFIGS
from swa_hal import SWAConfig, SWAMetadataBuilder
from swa_hal.cli import main
from swa_hal.envs import EnvWarning, unknown_variables
from swa_hal.errors import BackendNotFoundError, BackendUnavailableError, DeviceError
from swa_hal.integrations.engine import EngineSWABuilder
from swa_hal.integrations.sglang import SGLangSWAIndices

TINY_SCENARIO = str(CONFIGS / "batches" / "tiny_mixed.yaml")


def one_line_error(capsys, *argv):
    code = main(list(argv))
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# -- devices: a CUDA device this torch cannot reach is a DeviceError at every constructor ---------------


@pytest.fixture
def no_cuda(monkeypatch):
    """A torch that reaches no CUDA device (a CPU-only build behaves so; on a GPU machine the same test
    then checks the same path)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.mark.parametrize(
    "make",
    [
        lambda device: SWAMetadataBuilder(SWAConfig(), device=device),
        lambda device: EngineSWABuilder(SWAConfig(), device),
        lambda device: SGLangSWAIndices(device=device).builder,  # the adapter makes its builder on first use
    ],
    ids=["builder", "engine", "sglang"],
)
@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_a_cuda_device_torch_cannot_reach_is_a_device_error(no_cuda, make, device):
    # torch's own error here is a bare AssertionError ("Torch not compiled with CUDA enabled").
    with pytest.raises(DeviceError, match=rf"^device '{torch.device(device)}': .*(CUDA support|CUDA device)"):
        make(device)


def test_a_cuda_index_past_the_last_device_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(DeviceError, match=r"^device 'cuda:2': there are 2 CUDA device\(s\) here \(indices 0 to 1\)"):
        SWAMetadataBuilder(SWAConfig(), device="cuda:2")


# -- build(None) and friends: a TypeError naming the argument ---------------------------------------------


@pytest.mark.parametrize("given", [None, {}, "batch"])
def test_build_of_something_else_names_the_argument(tiny_config, given):
    builder = SWAMetadataBuilder(tiny_config)
    with pytest.raises(TypeError, match=rf"^batch must be a swa_hal\.batch\.AttentionBatch, got {type(given).__name__}$"):
        builder.build(given)
    with pytest.raises(TypeError, match="^batch must be a swa_hal.batch.AttentionBatch"):
        builder.build_groups(given, [], [])
    with pytest.raises(TypeError, match=r"^rows must be a swa_hal\.slot_rows\.SlotRows"):
        builder.build_slot_rows(given)
    with pytest.raises(TypeError, match=r"^rows must be a swa_hal\.request_window\.RequestWindowRows"):
        builder.build_request_window(given)
    with pytest.raises(TypeError, match="^metadata must be an SWAMetadata or a list of them"):
        builder.update_draft_decode_metadata(given)


# -- the environment ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variable, value, rule",
    [
        ("SWA_HAL_POLL_EVERY", "0", "must be at least 1"),
        ("SWA_HAL_POLL_EVERY", "-3", "must be at least 1"),
        ("SWA_HAL_NUM_WARPS", "0", "must be at least 1"),
        ("SWA_HAL_TILE_ELEMS", "-1", "must be at least 1"),
    ],
)
def test_an_integer_variable_below_its_minimum_is_one_line(capsys, monkeypatch, variable, value, rule):
    monkeypatch.setenv(variable, value)
    err = one_line_error(capsys, "build", "--batch", TINY_SCENARIO)
    assert err == f"swa-hal build: error: environment: {variable}={value!r}: {rule}", err


def test_poll_every_zero_is_refused_by_the_library_too(monkeypatch, tiny_config):
    monkeypatch.setenv("SWA_HAL_POLL_EVERY", "0")
    with pytest.raises(ValueError, match="^SWA_HAL_POLL_EVERY='0': must be at least 1"):
        SWAMetadataBuilder(tiny_config)


@pytest.mark.parametrize(
    "name, hint",
    [
        ("SWA_HAL_BACKND", "did you mean SWA_HAL_BACKEND?"),
        ("SWA_HAL_DEBGU", "did you mean SWA_HAL_DEBUG?"),
        ("SWA_HAL_DISABLE_PLUGIN", "did you mean SWA_HAL_DISABLE_PLUGINS?"),
        ("swa_hal_strict", "did you mean SWA_HAL_STRICT?"),
        ("SWA_HAL_QWERTY", "swa-hal info --env lists the variables it reads"),
    ],
)
def test_an_unknown_swa_hal_variable_is_warned_with_the_closest_name(capsys, monkeypatch, name, hint):
    monkeypatch.setenv(name, "cuda")
    expected = f"{name} is set, but swa_hal reads no variable of that name, so it has no effect: {hint}"
    assert unknown_variables() == [expected]
    # The library warns when its registry loads (every entry point loads it)...
    with pytest.warns(EnvWarning) as caught:
        SWAMetadataBuilder(SWAConfig())
    assert [str(w.message) for w in caught if w.category is EnvWarning] == [expected]
    # ...and the command says it once, as one line, and still runs.
    assert main(["info"]) == 0
    err = capsys.readouterr().err
    assert err.count(f"swa-hal: warning: {expected}\n") == 1, err


def test_known_variables_and_the_projects_own_are_not_warned_about():
    env = {"SWA_HAL_BACKEND": "torch", "SWA_HAL_FUZZ_EXAMPLES": "10", "PATH": "/bin", "SWA_HALX": "1"}
    assert unknown_variables(env) == []


def test_no_backend_left_by_the_plugin_lists_says_which_plugin_was_left_out(monkeypatch, capsys):
    monkeypatch.setenv("SWA_HAL_DISABLE_PLUGINS", "torch")
    with pytest.raises(BackendUnavailableError) as info:
        SWAMetadataBuilder(SWAConfig())
    message = str(info.value)
    assert message.startswith("no backend is available on cpu"), message
    assert "plugin 'torch' (listed in SWA_HAL_DISABLE_PLUGINS)" in message
    assert "the one that runs on every platform" in message
    # A request for the backend of a left-out plugin says the same.
    with pytest.raises(BackendNotFoundError, match=r"plugin 'torch' \(listed in SWA_HAL_DISABLE_PLUGINS\)"):
        SWAMetadataBuilder(SWAConfig(), backend="torch")
    # The command: one line naming the variable.
    assert main(["info"]) == 1
    assert "SWA_HAL_DISABLE_PLUGINS" in capsys.readouterr().err


# -- swa-hal info --expect NAME ---------------------------------------------------------------------------


def test_info_expect_of_a_name_not_registered_says_so(capsys):
    assert main(["info", "--expect", "troch"]) == 1
    err = capsys.readouterr().err
    assert "expected backend 'troch', selected 'torch'" in err
    assert "no backend named 'troch' is registered at all (did you mean 'torch'?)" in err, err


def test_info_expect_of_a_registered_name_does_not_say_so(capsys):
    assert main(["info", "--assume", "vendor=cuda,capability=12.0", "--expect", "cuda"]) == 1
    assert "is registered at all" not in capsys.readouterr().err


# -- the vLLM plugin without vLLM ---------------------------------------------------------------------------


def test_vllm_register_without_vllm_says_what_to_install(monkeypatch):
    from swa_hal.integrations import vllm, vllm_common

    # Whether or not vLLM is installed here: the plugin sees none.
    monkeypatch.setattr(vllm_common.importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setattr(vllm, "_registered", False)
    with pytest.raises(vllm.VllmNotInstalledError, match="needs vLLM 0.33.x, 0.34.x, which is not installed"):
        vllm.register()
    assert not vllm.is_registered()


# -- settings: files with a key twice, numpy integers -----------------------------------------------------


@pytest.mark.parametrize(
    "text, line, key",
    [
        ("window_size: 8\nblock_size: 4\nwindow_size: 16\n", 3, "window_size"),
        ("window_size: 8\n'window_size': 8\n", 2, "window_size"),  # the same key quoted, the same value
        ("name: a\ngroups:\n  - {count: 2, count: 3}\n", 3, "count"),  # a nested mapping
    ],
)
@pytest.mark.parametrize("kind", ["config", "scenario"])
def test_a_key_given_twice_is_refused_naming_the_key_and_the_file(tmp_path, text, line, key, kind):
    from swa_hal.errors import ConfigError
    from swa_hal.scenarios import Scenario

    path = tmp_path / f"{kind}.yaml"
    path.write_text(text)
    load = SWAConfig.from_yaml if kind == "config" else Scenario.from_yaml
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value).startswith(f"{path}: is not valid YAML (line {line}, "), str(info.value)
    assert f"key '{key}' is given twice (first at line " in str(info.value)


def test_a_merge_key_still_merges(tmp_path):
    # A key beside a merge overrides the merged one (YAML's rule), so it is no duplicate.
    path = tmp_path / "merged.yaml"
    base = (CONFIGS / "tiny.yaml").read_text()
    settings = "".join(f"  {line}\n" for line in base.splitlines() if line and not line.startswith("#"))
    path.write_text(f"base: &base\n{settings}config:\n  <<: *base\n  window_size: 6\n")
    import yaml

    from swa_hal.config import load_yaml_mapping

    data = load_yaml_mapping(path, "config")
    assert data["config"]["window_size"] == 6 and data["config"] == {**yaml.safe_load(base), "window_size": 6}


def test_numpy_integers_are_integers_in_settings():
    import numpy as np

    plain = SWAConfig(window_size=128, block_size=64, compress_ratios=(4, 128), max_num_seqs=8, split_threshold=2,
                      num_kv_blocks=100, num_speculative_tokens=1, speculative_method="mtp")
    numpy = SWAConfig(window_size=np.int64(128), block_size=np.int32(64), compress_ratios=(np.int64(4), np.int16(128)),
                      max_num_seqs=np.uint8(8), split_threshold=np.int64(2), num_kv_blocks=np.int64(100),
                      num_speculative_tokens=np.int64(1), speculative_method="mtp")
    assert numpy == plain and hash(numpy) == hash(plain)
    # Kept as Python ints: a config serialises and compares as its plain settings do.
    assert all(type(v) is int for v in (numpy.window_size, numpy.block_size, numpy.max_num_seqs, *numpy.compress_ratios))
    from swa_hal.errors import ConfigError

    for bad in (np.bool_(True), True, np.float64(128.0), 128.0):
        with pytest.raises(ConfigError, match=r"^window_size: must be an integer, got"):
            SWAConfig(window_size=bad)
    with pytest.raises(ConfigError, match=r"^window_size: 0 is outside \[1, "):
        SWAConfig(window_size=np.int64(0))


# -- the engines' version gates follow PEP 440 -------------------------------------------------------------


@pytest.mark.parametrize(
    "found, ok",
    [
        ("0.5.23", True),
        ("0.5.23.0", True),  # the same release, written longer
        ("0.5.23.post1", True),  # a post-release: the release with a packaging fix
        ("0.5.23+cu129", True),  # a local build of the release
        ("0.5.23.post1+cu129", True),
        ("v0.5.23", True),  # PEP 440 allows the leading v
        ("0.5.23rc1", False),  # pre- and development releases come before the release
        ("0.5.23.dev0", False),
        ("0.5.23.post1.dev0", False),
        ("0.5.23.1", False),  # a later release
        ("0.5.24", False),
        ("0.5.2", False),
        ("unknown", False),  # a source build without a version
    ],
)
def test_the_sglang_gate_takes_a_releases_builds_by_pep_440(found, ok):
    from swa_hal.integrations._common import version_supported
    from swa_hal.integrations.sglang import SUPPORTED_VERSIONS

    assert SUPPORTED_VERSIONS == ("0.5.23",)
    assert version_supported(found, SUPPORTED_VERSIONS) is ok


@pytest.mark.parametrize(
    "found, ok",
    [
        ("0.33.0", True),
        ("0.34.2.post1", True),
        ("0.34.0+cu130", True),
        ("0.34.1rc1", False),  # refused whatever packaging's default for an installed pre-release
        ("0.35.0.dev3", False),
        ("0.32.9", False),
    ],
)
def test_the_vllm_gate_judges_pre_releases_by_rule(found, ok):
    from swa_hal.integrations._common import version_supported
    from swa_hal.integrations.vllm_common import SUPPORTED_VLLM

    assert version_supported(found, SUPPORTED_VLLM) is ok


def test_a_named_pre_release_is_supported_with_its_local_builds():
    from swa_hal.integrations._common import version_supported

    assert version_supported("0.34.0rc1+cu130", ("0.34.0rc1",))
    assert version_supported("0.34.0rc2", (">=0.34.0rc1,<0.35",))
    assert not version_supported("0.34.0rc2", ("0.34.0rc1",))


def test_a_refused_pre_release_says_why():
    from swa_hal.integrations._common import EngineVersionError, require_version

    with pytest.raises(EngineVersionError, match=r"0\.5\.23rc1 is installed \(a pre-release, which comes before"):
        require_version("SGLang", "sglang", ("0.5.23",), found="0.5.23rc1")


# -- a step's groups: a scalar source shared only when it is the same value of the same type ---------------


@pytest.mark.parametrize(
    "name, value, error",
    [
        ("causal", 1, "causal must be a bool, got 1"),
        ("max_query_len", "float", "max_query_len must be an integer, got"),
        ("mm_req_doc_ranges", {0: [(0, True)]}, None),
    ],
)
def test_a_group_whose_scalar_only_equals_the_first_groups_builds_alone(name, value, error):
    import random

    from helpers import common_metadata
    from swa_hal.errors import BatchDtypeError
    from swa_hal.integrations.engine import inputs_from_common_metadata, same_sources, step_sources
    from swa_hal.testing.batches import random_batch

    batch = random_batch(SWAConfig(window_size=8, block_size=4, max_model_len=256), random.Random(0), "mixed")
    first = common_metadata(batch, mm_req_doc_ranges={0: [(0, 1)]})
    if value == "float":
        value = float(first.max_query_len)
    second = common_metadata(batch, **{"mm_req_doc_ranges": {0: [(0, 1)]}, name: value})
    assert getattr(second, name) == getattr(first, name)  # what == alone took for the same source
    # Not the same sources: the second group's inputs are made from its own, and checked...
    assert not same_sources(step_sources(first, None), step_sources(second, None))
    # ...where its value is refused, as it is when the group builds alone.
    if error is not None:
        with pytest.raises(BatchDtypeError, match=error):
            inputs_from_common_metadata(second)
    # The same values of the same types (other objects) still share.
    again = common_metadata(batch, mm_req_doc_ranges={0: [(0, 1)]})
    assert same_sources(step_sources(first, None), step_sources(again, None))


# -- the kit's PCP partition ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "num_ranks, decode_threshold, field",
    [(0, 1, "num_ranks"), (-1, 1, "num_ranks"), (True, 1, "num_ranks"), (2.0, 1, "num_ranks"),
     (2, 0, "decode_threshold"), (2, False, "decode_threshold")],
)
def test_pcp_partition_refuses_rank_counts_by_name(num_ranks, decode_threshold, field):
    import random

    from swa_hal.errors import ConfigError
    from swa_hal.testing.batches import random_batch
    from swa_hal.testing.pcp import partition

    batch = random_batch(SWAConfig(window_size=8, block_size=4, max_model_len=256), random.Random(1), "mixed")
    with pytest.raises(ConfigError, match=rf"^{field}: must be a positive integer, got {num_ranks if field == 'num_ranks' else decode_threshold!r}$"):
        partition(batch, num_ranks, decode_threshold=decode_threshold)
    import numpy as np

    assert len(partition(batch, np.int64(2), decode_threshold=1)) == 2  # a numpy integer is an integer


# -- the kit's host-sync watch ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "read, call",
    [
        (lambda d, h: torch.equal(d, h), "torch.equal() compares a device tensor on the host"),
        (lambda d, h: torch.equal(h, d), "torch.equal() compares a device tensor on the host"),
        (lambda d, h: d.equal(h), "Tensor.equal() compares a device tensor on the host"),
        (lambda d, h: torch.allclose(h, d), "torch.allclose() compares a device tensor on the host"),
        (lambda d, h: d[:1].is_nonzero(), "Tensor.is_nonzero() reads a device tensor on the host"),
        (lambda d, h: f"{d}", "Tensor.__format__() reads a device tensor on the host"),
        (lambda d, h: f"{d[0]:d}", "Tensor.__format__() reads a device tensor on the host"),
        (lambda d, h: str(d), "Tensor.__repr__() reads a device tensor on the host"),  # str is repr for a tensor
    ],
    ids=["equal", "equal-host-first", "Tensor.equal", "allclose", "is_nonzero", "f-string", "format-spec", "str"],
)
def test_the_host_sync_watch_sees_every_way_a_backend_reads_a_device_value(read, call):
    from swa_hal.testing.host_sync import BuildWatch

    device_tensor, host_tensor = torch.arange(4, dtype=torch.int32), torch.arange(4, dtype=torch.int32)
    watch = BuildWatch([device_tensor], torch.device("cpu"))
    with watch:
        read(device_tensor, host_tensor)
    assert any(p.startswith(call) for p in watch.problems), watch.problems
    # The same calls on host tensors alone are the backend's to make.
    quiet = BuildWatch([device_tensor], torch.device("cpu"))
    with quiet:
        read(host_tensor.clone(), host_tensor)
    assert quiet.problems == [], quiet.problems
