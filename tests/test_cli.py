"""The swa-hal command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from helpers import CONFIGS, ROOT, SCENARIOS
from swa_hal.cli import main


def tiny_config_text(**changes):
    """configs/tiny.yaml as YAML text, with ``changes`` to its settings (None: the setting left out)."""
    settings = {**yaml.safe_load((CONFIGS / "tiny.yaml").read_text()), **changes}
    return yaml.safe_dump({k: v for k, v in settings.items() if v is not None}, sort_keys=False)


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_info_json_parses_and_describes_everything(capsys):
    code, out, _ = run(capsys, "info", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["selected"] == "torch" and data["platform"]["vendor"] == "cpu"
    assert {b["name"] for b in data["backends"]} >= {"torch", "cuda", "sm12x", "rocm", "xpu"}
    cuda = next(b for b in data["backends"] if b["name"] == "cuda")
    assert cuda["available"] is False and cuda["reasons"]
    assert data["versions"]["torch"] and data["versions"]["pluggy"]
    assert all(p["status"] in ("active", "embedded") for p in data["plugins"])


@pytest.mark.parametrize(
    "assume, expected",
    [
        ("vendor=cuda,capability=12.0", "sm12x"),
        ("vendor=rocm,arch=gfx942", "rocm"),
        ("vendor=xpu", "xpu"),
        ("vendor=cuda,capability=9.0", "cuda"),
        ("vendor=cuda,capability=10.0", "cuda"),
        ("vendor=cpu", "torch"),
    ],
)
def test_info_assume_selects(capsys, assume, expected):
    code, out, _ = run(capsys, "info", "--json", "--assume", assume, "--expect", expected)
    assert code == 0 and json.loads(out)["selected"] == expected


def test_info_expect_mismatch_fails(capsys):
    code, out, _ = run(capsys, "info", "--assume", "vendor=cuda,capability=12.0", "--expect", "cuda")
    assert code == 1 and "expected backend 'cuda', selected 'sm12x'" in out


def test_info_text_lists_plugins_and_reasons(capsys):
    code, out, _ = run(capsys, "info", "--assume", "vendor=cuda,capability=12.0")
    assert code == 0
    assert "needs CUDA capability 9.x or 10.x; found 12.0" in out and "* sm12x" in out


def test_info_explicit_unavailable_reports_error(capsys):
    code, out, _ = run(capsys, "info", "--backend", "cuda")
    assert code == 1 and "unavailable" in out


def test_info_status_reports_scheduler_reason(capsys):
    code, out, _ = run(capsys, "info", "--json", "--assume", "vendor=cuda,capability=9.0", "--status",
                       "--config", str(CONFIGS / "tiny.yaml"))
    data = json.loads(out)
    assert code == 0
    assert "flash_mla is not importable" in data["backend_status"]["tile scheduler"]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_build_every_shipped_scenario(capsys, scenario):
    meta = yaml.safe_load(scenario.read_text())
    code, out, _ = run(capsys, "build", "--config", str(CONFIGS / meta["config"]), "--batch", str(scenario),
                       "--repeat", "2", "--json")
    data = json.loads(out)
    assert code == 0, data["mismatches"]
    assert data["mismatches"] == [] and data["checked_against_reference"]
    assert data["split"]["num_decode_tokens"] + data["split"]["num_prefill_tokens"] > 0


def test_build_text_output(capsys):
    code, out, _ = run(capsys, "build", "--config", str(CONFIGS / "tiny.yaml"), "--batch",
                       str(CONFIGS / "batches" / "tiny_mixed.yaml"), "--repeat", "2")
    assert code == 0
    assert "check: bit-exact" in out and "split:" in out and "lens" in out


def test_build_with_a_triton_backend_through_the_interpreter(capsys):
    code, out, _ = run(capsys, "build", "--config", str(CONFIGS / "tiny.yaml"), "--batch",
                       str(CONFIGS / "batches" / "tiny_mixed.yaml"), "--repeat", "1",
                       "--assume", "vendor=cuda,capability=12.0", "--json")
    data = json.loads(out)
    assert code == 0 and data["backend"] == "sm12x" and data["mismatches"] == []


def test_bad_batch_file_is_a_clean_error(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n  - {count: 2, query_len: 5, seq_len: 3}\n")
    code, _, err = run(capsys, "build", "--config", str(CONFIGS / "tiny.yaml"), "--batch", str(bad))
    assert code == 2 and "groups[0]" in err


def test_warmup(capsys):
    code, out, err = run(capsys, "warmup", "--config", str(CONFIGS / "tiny.yaml"))
    assert code == 0 and "warmup:" in out


def test_matrix_json(capsys):
    code, out, _ = run(capsys, "matrix", "--json")
    rows = {e["platform"]: e["expect"] for e in json.loads(out)["include"]}
    assert code == 0
    assert rows["vendor=cuda,capability=9.0"] == "cuda"
    assert rows["vendor=cuda,capability=10.0"] == "cuda"
    assert rows["vendor=cuda,capability=12.0"] == "sm12x"
    assert rows["vendor=rocm,arch=gfx942,capability=9.4"] == "rocm"
    assert rows["vendor=xpu"] == "xpu"
    assert rows["vendor=cpu"] == "torch"


def test_console_script_is_installed():
    exe = shutil.which("swa-hal", path=os.path.dirname(sys.executable))
    assert exe, "the swa-hal console script is not installed next to this python"
    proc = subprocess.run([exe, "info", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["selected"] == "torch"


def test_build_reports_replay_and_image_spans(capsys):
    code, out, _ = run(capsys, "build", "--config", str(CONFIGS / "tiny_vision.yaml"), "--batch",
                       str(CONFIGS / "batches" / "tiny_vision.yaml"), "--repeat", "1")
    assert code == 0 and "check: bit-exact" in out
    assert "replay bounds: 4 of 4 requests bounded" in out
    assert "image spans: 4 in 2 requests (max_image_tokens 6)" in out and "prefill width 10" in out


@pytest.mark.parametrize("argv, message", [
    (["info", "--assume", "garbage"], "--assume 'garbage': --assume item 'garbage' is not KEY=VALUE"),
    (["build", "--config", "{tmp}", "--batch", "x.yaml"], "cannot read the config"),
    (["build", "--config", "{bad}", "--batch", "x.yaml"], "is not valid YAML (line 2"),
    (["build", "--config", "{empty}", "--batch", "x.yaml"], "is empty; a config needs at least one setting"),
    (["build", "--config", "{ratios}", "--batch", "x.yaml"], "compress_ratios: must name at least one layer"),
    (["build", "--config", "{method}", "--batch", "x.yaml"], "speculative_method: 'medusa2' is not one of"),
    (["build", "--config", "{window}", "--batch", "x.yaml"], "window_size: must be an integer, got '128'"),
    (["build", "--config", "{zero}", "--batch", "x.yaml"], "max_num_seqs: 0 is outside [1, "),
    (["build", "--config", "{tiny}", "--batch", "x.yaml", "--repeat", "0"], "argument --repeat: 0 must be at least 1"),
    (["bench", "--config", "{tiny}", "--batch", "x.yaml", "--iters", "0"], "argument --iters: 0 must be at least 1"),
    (["build", "--config", "{tiny}", "--batch", "{empty}"], "is empty; a scenario needs at least one setting"),
    (["build", "--config", "{tiny}", "--batch", "{tiny_batch}", "--device", "cuda"], "--device 'cuda': "),
])
def test_bad_cli_input_is_one_line_and_exit_code_2(capsys, tmp_path, argv, message):
    files = {"tmp": tmp_path, "bad": tmp_path / "bad.yaml", "empty": tmp_path / "empty.yaml",
             "ratios": tmp_path / "ratios.yaml", "method": tmp_path / "method.yaml", "window": tmp_path / "window.yaml",
             "zero": tmp_path / "zero.yaml", "tiny": CONFIGS / "tiny.yaml",
             "tiny_batch": CONFIGS / "batches" / "tiny_mixed.yaml"}
    files["bad"].write_text("window_size: [1,\n")
    files["empty"].write_text("")
    # Each a whole config (every required setting there) with one bad value.
    files["ratios"].write_text(tiny_config_text(compress_ratios=[]))
    files["method"].write_text(tiny_config_text(num_speculative_tokens=1, speculative_method="medusa2"))
    files["window"].write_text(tiny_config_text(window_size="128"))
    files["zero"].write_text(tiny_config_text(max_num_seqs=0))
    argv = [a.format(**files) for a in argv]
    if "--device" in argv and __import__("torch").cuda.is_available():
        pytest.skip("this machine has a CUDA device")  # the no-GPU message is what is tested here
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(argv))
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_info_expect_checks_the_backend_that_actually_starts(capsys, monkeypatch):
    # The cuda backend is selected for this platform, but on a CPU without the Triton interpreter it
    # cannot start: a builder would fall back to torch, so --expect cuda must fail and say so.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    code, out, _ = run(capsys, "info", "--json", "--assume", "vendor=cuda,capability=9.0", "--expect", "cuda")
    data = json.loads(out)
    assert code == 1 and data["selected"] == "cuda" and data["started"] == "torch"
    assert "expected backend 'cuda', selected 'cuda' but it failed to start, so 'torch' runs" in data["error"]
    code, out, _ = run(capsys, "info", "--assume", "vendor=cuda,capability=9.0", "--status")
    assert "fell back: backend 'cuda'" in out and "TRITON_INTERPRET" in out


def test_strict_mode_refuses_the_fallback(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("SWA_HAL_STRICT", "1")
    code, out, _ = run(capsys, "info", "--json", "--assume", "vendor=cuda,capability=9.0", "--expect", "cuda")
    data = json.loads(out)
    assert code == 1 and data["started"] is None and "SWA_HAL_STRICT=1: no fallback" in data["error"]
    from swa_hal import PlatformInfo, SWAConfig, SWAMetadataBuilder
    from swa_hal.errors import BackendUnavailableError

    with pytest.raises(BackendUnavailableError, match="no fallback"):
        SWAMetadataBuilder(SWAConfig(), platform=PlatformInfo.from_assume("vendor=cuda,capability=9.0"))


# -- the command line itself ---------------------------------------------------------------------


def _cli(*argv, env=None, cwd=ROOT):
    """The CLI in a process of its own, as a user runs it (warnings, logging and streams as they are)."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "swa_hal.cli", *argv], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=120)


def test_version(capsys):
    from swa_hal import __version__

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"swa-hal {__version__}"


def test_bare_command_prints_the_usage_to_stderr_and_exits_2(capsys):
    code, out, err = run(capsys)
    assert code == 2 and out == ""
    assert err.startswith("usage: swa-hal") and all(
        c in err for c in ("info", "build", "bench", "warmup", "matrix", "new-backend")
    )
    assert "exits 2" in err  # the help says so


def test_every_option_has_help():
    import argparse

    from swa_hal.cli import build_parser

    missing = []

    def walk(parser, where):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{where} {name}")
            elif action.option_strings and not action.help:
                missing.append(f"{where} {'/'.join(action.option_strings)}")

    walk(build_parser(), "swa-hal")
    assert not missing, missing


def test_a_fallback_warning_is_printed_once_as_one_line():
    proc = _cli("info", "--assume", "vendor=cuda,capability=9.0", "--expect", "cuda", env={"TRITON_INTERPRET": "0"})
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    failed = [line for line in lines if "failed to start" in line]
    assert len(failed) == 2, proc.stderr  # the warning, then the --expect error
    assert failed[0].startswith("swa-hal: warning: backend 'cuda' (swa-hal) failed to start: ")
    assert failed[1].startswith("swa-hal info: error: expected backend 'cuda', selected 'cuda' but it failed")
    assert len(lines) == 2, proc.stderr  # no log line, no source line of the warning
    assert "warnings.warn" not in proc.stderr and "WARNING" not in proc.stderr


def test_a_plugin_warning_is_printed_once_as_one_line():
    proc = _cli("info", "--json", env={"SWA_HAL_PLUGINS": "torch,nonesuch"})
    assert proc.returncode == 0 and json.loads(proc.stdout)["plugin_problems"]
    assert proc.stderr.splitlines() == [
        "swa-hal: warning: SWA_HAL_PLUGINS names 'nonesuch', which no installed plugin provides "
        f"(installed: {', '.join(sorted(p['name'] for p in json.loads(proc.stdout)['plugins'] if p['status'] != 'embedded'))})"
    ]


def test_errors_go_to_stderr(capsys):
    code, out, err = run(capsys, "info", "--assume", "vendor=cuda,capability=12.0", "--expect", "cuda")
    assert code == 1 and "error" not in out
    assert err == "swa-hal info: error: expected backend 'cuda', selected 'sm12x'\n"
    code, out, err = run(capsys, "info", "--json", "--backend", "cuda")
    assert code == 1 and json.loads(out)["error"]  # stdout stays JSON
    assert err.startswith("swa-hal info: error: backend 'cuda' (requested by argument) is unavailable on cpu")
    code, out, err = run(capsys, "info", "--assume", "vendor=cuda,capability=12.0", "--expect", "sm12x")
    assert code == 0 and err == "" and "expect: backend 'sm12x' is selected and starts, as expected" in out


def test_warmup_progress_has_a_total_and_a_whole_label(capsys):
    code, out, err = run(capsys, "warmup", "--config", str(CONFIGS / "tiny.yaml"), "--assume",
                         "vendor=cuda,capability=9.0")
    # The rows, three token-slot rows variants and four request-window layouts (tests/test_launch_keys.py).
    assert code == 0 and "warmup: 8 kernel variant(s) ready for backend cuda" in out
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert "warmup cuda: 100%" in last and "8/8" in last, err
    assert "request_window_kernel RequestWindowKey(WINDOW=4" in last, err  # the label keeps its start
    code, out, err = run(capsys, "warmup", "--config", str(CONFIGS / "tiny.yaml"))
    assert code == 0 and err == "" and "0 kernel variant(s) ready for backend torch" in out


def test_bench_prints_its_table_and_nothing_else(capsys):
    batches = [str(CONFIGS / "batches" / "tiny_mixed.yaml"), str(CONFIGS / "batches" / "tiny_vision.yaml")]
    proc = _cli("bench", "--batch", *batches, "--iters", "2")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [["tiny_mixed", "torch"], ["tiny_vision", "torch"]], proc.stdout
    assert all("us per build (median of 2, " in line and "torch threads)" in line for line in lines)


def test_the_scenarios_config_is_the_default(capsys):
    code, out, _ = run(capsys, "build", "--batch", str(CONFIGS / "batches" / "tiny_vision.yaml"), "--repeat", "1",
                       "--json")
    data = json.loads(out)
    assert code == 0 and data["config"] == str(CONFIGS / "tiny_vision.yaml") and data["mismatches"] == []
    assert data["image_spans"]  # the vision config, so the spans are there


@pytest.mark.parametrize("command", ["build", "bench"])
def test_a_config_the_scenario_is_not_meant_for_is_a_clear_error(capsys, command):
    scenario = CONFIGS / "batches" / "tiny_vision.yaml"
    code, _, err = run(capsys, command, "--config", str(CONFIGS / "tiny.yaml"), "--batch", str(scenario))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"--config {CONFIGS / 'tiny.yaml'} does not match --batch {scenario}" in err
    assert f"meant for config '{CONFIGS / 'tiny_vision.yaml'}'" in err


def test_a_scenario_without_config_needs_one(capsys, tmp_path):
    scenario = tmp_path / "loose.yaml"
    scenario.write_text("groups:\n  - {count: 2, query_len: 1, seq_len: [1, 30]}\n")
    code, _, err = run(capsys, "build", "--batch", str(scenario))
    assert code == 2 and "scenario 'loose' names no config (no config: key), so --config is needed" in err
    code, out, _ = run(capsys, "build", "--batch", str(scenario), "--config", str(CONFIGS / "tiny.yaml"), "--json")
    assert code == 0 and json.loads(out)["mismatches"] == []  # any config will do


def test_a_scenario_naming_a_missing_config_is_a_clear_error(capsys, tmp_path):
    (tmp_path / "batches").mkdir()
    scenario = tmp_path / "batches" / "lost.yaml"
    scenario.write_text("config: nowhere.yaml\ngroups:\n  - {count: 2, query_len: 1, seq_len: [1, 30]}\n")
    code, _, err = run(capsys, "build", "--batch", str(scenario))
    assert code == 2 and "scenario 'lost'" in err and "names config 'nowhere.yaml', which is not a config file" in err
    assert str(tmp_path / "nowhere.yaml") in err and str(tmp_path / "batches" / "nowhere.yaml") in err


def test_image_spans_on_a_config_without_images_are_an_error(capsys, tmp_path):
    scenario = tmp_path / "images.yaml"
    scenario.write_text("images_per_prefill: 2\nimage_tokens: 5\ngroups:\n  - {count: 2, query_len: 12, seq_len: [12, 60]}\n")
    code, _, err = run(capsys, "build", "--config", str(CONFIGS / "tiny.yaml"), "--batch", str(scenario))
    assert code == 2 and "image_tokens: scenario 'images' has image spans (2 per prefill, 5 tokens each)" in err
    assert "max_image_tokens 0 (no vision variant), so they would be ignored" in err
    code, _, err = run(capsys, "build", "--config", str(CONFIGS / "tiny_vision.yaml"), "--batch", str(scenario))
    assert code == 0
    scenario.write_text(scenario.read_text().replace("image_tokens: 5", "image_tokens: 7"))
    code, _, err = run(capsys, "build", "--config", str(CONFIGS / "tiny_vision.yaml"), "--batch", str(scenario))
    assert code == 2 and "the config's max_image_tokens is 6" in err
    scenario.write_text(scenario.read_text().replace("image_tokens: 7", "image_tokens: 0"))
    code, _, err = run(capsys, "build", "--config", str(CONFIGS / "tiny_vision.yaml"), "--batch", str(scenario))
    assert code == 2 and "image_tokens: is 0" in err and "image spans need both" in err


def test_a_backend_class_without_a_name_runs_under_its_specs_name(capsys, monkeypatch):
    # The vendor's first plugin: a TritonBackend subclass and vendor_backend_spec, no `name = ...` anywhere.
    import types

    from fakes import plugin_module
    from swa_hal import plugins
    from swa_hal.plugins import PluginRegistry
    from swa_hal.specs import vendor_backend_spec
    from swa_hal.triton_backend import TritonBackend

    mod = types.ModuleType("acme_cli_backend")
    mod.AcmeBackend = type("AcmeBackend", (TritonBackend,), {})
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    spec = vendor_backend_spec("acme", factory="acme_cli_backend:AcmeBackend", priority=300, vendor="acme",
                               vendor_label="an Acme accelerator", platforms=("vendor=acme",), summary="Acme")
    registry = PluginRegistry(env={})
    registry.register_plugin(plugin_module(spec), "acme")
    monkeypatch.setattr(plugins, "_default", registry)
    code, out, err = run(capsys, "info", "--assume", "vendor=acme", "--expect", "acme")
    assert code == 0 and err == "", err
    assert "expect: backend 'acme' is selected and starts, as expected" in out


def test_info_env_lists_every_variable(capsys, monkeypatch):
    from swa_hal.cli import main
    from swa_hal.envs import VARIABLES

    monkeypatch.setenv("SWA_HAL_GUARD", "0")
    assert main(["info", "--env"]) == 0
    out = capsys.readouterr().out
    for name in VARIABLES:
        assert name in out, name
    assert "SWA_HAL_GUARD              = '0'" in out
    assert main(["info", "--env", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [v["name"] for v in data["env"]] == list(VARIABLES)


# -- nothing is repaired or ignored in silence; bad input is one line, exit 2 ---------------------------------


def _one_line_error(capsys, *argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def test_a_seq_len_past_max_model_len_is_refused_not_clamped(capsys, tmp_path):
    (tmp_path / "batches").mkdir()
    shutil.copy(CONFIGS / "tiny.yaml", tmp_path / "tiny.yaml")
    scenario = tmp_path / "batches" / "long.yaml"
    scenario.write_text("config: tiny.yaml\ngroups:\n  - {count: 2, query_len: 1, seq_len: [1, 30]}\n"
                        "  - {count: 1, query_len: 4, seq_len: [200, 1000]}\n")
    err = _one_line_error(capsys, "build", "--batch", str(scenario))
    assert err == ("swa-hal build: error: groups[1].seq_len: 1000 is past the config's max_model_len 256 (scenario "
                   "'long'): lower the group's seq_len, or use a config with a longer max_model_len")
    scenario.write_text(scenario.read_text().replace("1000", "256"))  # the limit itself is a sequence's length
    code, out, _ = run(capsys, "build", "--batch", str(scenario), "--repeat", "1", "--json")
    assert code == 0 and json.loads(out)["mismatches"] == []


@pytest.mark.parametrize("groups, field, message", [
    ("[{count: 0, query_len: 1, seq_len: 5}]", "groups[0].count", "must be an integer >= 1"),
    ("[{count: 2, query_len: 1, seq_len: 5}, {count: 0, query_len: 1, seq_len: 5}]", "groups[1].count",
     "must be an integer >= 1"),
    ("[]", "groups", "describes no requests"),
    ("5", "groups", "describes no requests"),
    ("[7]", "groups[0]", "must be a mapping of count, query_len, seq_len"),
    ("[{count: 2, query_len: 1, seq_lens: 5}]", "groups[0].seq_lens", "unknown group key"),
    ("[{count: 2, query_len: 1}]", "groups[0].seq_len", "missing in"),
    ("[{count: '2', query_len: 1, seq_len: 5}]", "groups[0].count", "got '2'"),
    ("[{count: 2.5, query_len: 1, seq_len: 5}]", "groups[0].count", "got 2.5"),
    ("[{count: 2, query_len: true, seq_len: 5}]", "groups[0].query_len", "got True"),
    ("[{count: 2, query_len: 1, seq_len: [1, 5, 9]}]", "groups[0].seq_len", "must be an integer or [lo, hi]"),
    ("[{count: 2, query_len: 1, seq_len: [9, 5]}]", "groups[0].seq_len", "breaks query_len <= lo <= hi"),
])
def test_bad_groups_name_the_group_and_the_key(capsys, tmp_path, groups, field, message):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"groups: {groups}\n")
    err = _one_line_error(capsys, "build", "--config", str(CONFIGS / "tiny.yaml"), "--batch", str(scenario))
    assert err.startswith(f"swa-hal build: error: {field}: ") and message in err, err


@pytest.mark.parametrize("text, field, message", [
    ("padding_requests: 2\ngroups: [{count: 7, query_len: 1, seq_len: 5}]\n", "groups",
     "has 9 requests (counts plus padding_requests), past the config's max_num_seqs 8"),
    ("padding_rows: 5\ngroups: [{count: 6, query_len: 10, seq_len: 20}]\n", "groups",
     "has 65 token rows (count x query_len of each group plus padding_rows), past the config's "
     "max_num_batched_tokens 64"),
    ("invalid_tokens: 5\ngroups: [{count: 2, query_len: 2, seq_len: 5}]\n", "invalid_tokens",
     "5 in {path}, but its groups have 4 tokens"),
])
def test_a_scenario_that_does_not_fit_its_config_is_refused(capsys, tmp_path, text, field, message):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(text)
    err = _one_line_error(capsys, "build", "--config", str(CONFIGS / "tiny.yaml"), "--batch", str(scenario))
    assert err.startswith(f"swa-hal build: error: {field}: ") and message.format(path=scenario) in err, err


def test_images_a_prefill_cannot_hold_are_refused_not_shortened(capsys, tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("images_per_prefill: 2\nimage_tokens: 5\n"
                        "groups: [{count: 1, query_len: 1, seq_len: 9}, {count: 1, query_len: 9, seq_len: 20}]\n")
    err = _one_line_error(capsys, "build", "--config", str(CONFIGS / "tiny_vision.yaml"), "--batch", str(scenario))
    assert "groups[1].query_len: 9 new tokens cannot hold scenario 's' has image spans (2 per prefill, 5 tokens " \
           "each): a prefill of this scenario needs at least 10" in err, err
    scenario.write_text(scenario.read_text().replace("query_len: 9", "query_len: 10"))
    assert run(capsys, "build", "--config", str(CONFIGS / "tiny_vision.yaml"), "--batch", str(scenario),
               "--repeat", "1")[0] == 0


def test_a_copy_of_the_scenarios_config_is_that_config(capsys, tmp_path):
    # Configs are what they say, not where they are: a copy (other comments, other name) runs the scenario.
    copy = tmp_path / "my_tiny.yaml"
    copy.write_text("# my copy\n" + (CONFIGS / "tiny.yaml").read_text().replace("name: tiny", "name: mine"))
    scenario = CONFIGS / "batches" / "tiny_mixed.yaml"
    code, out, err = run(capsys, "build", "--config", str(copy), "--batch", str(scenario), "--repeat", "1", "--json")
    assert code == 0 and err == "" and json.loads(out)["config"] == str(copy)
    copy.write_text(tiny_config_text(window_size=8, max_num_seqs=16))
    err = _one_line_error(capsys, "build", "--config", str(copy), "--batch", str(scenario))
    assert f"--config {copy} does not match --batch {scenario}: scenario 'tiny_mixed' is meant for config " in err
    assert "the two differ in window_size (8 vs 4), max_num_seqs (16 vs 8) (--config's value first)" in err


@pytest.mark.parametrize("assume, message", [
    ("vendor=cuda,capabilty=9.0", "--assume key 'capabilty' is not one of vendor, capability, arch, name, triton, "
                                  "interpret, devices (aliases: cc=capability, sm=capability, device_name=name)"),
    ("vendor=cuda,capability=9.0,cc=12.0", "--assume key 'cc': capability is given twice"),
    ("vendor=cuda,capability=", "--assume capability=: the value is empty"),
    ("vendor=cuda,devices=two", "--assume devices='two': expected a number of devices"),
])
def test_a_bad_assume_key_is_an_error_not_another_backend(capsys, assume, message):
    err = _one_line_error(capsys, "info", "--assume", assume, "--expect", "cuda")
    assert message in err, err


def test_a_backends_own_facts_pass_through_assume():
    from swa_hal import PlatformInfo

    platform = PlatformInfo.from_assume("vendor=acme,x-Stepping=B0,name=Acme 1")
    assert (platform.get("stepping"), platform.device_name, platform.to_dict()["extra"]) == ("B0", "Acme 1",
                                                                                           {"stepping": "B0"})
    with pytest.raises(ValueError, match="--assume key 'x-stepping': x-stepping is given twice"):
        PlatformInfo.from_assume("vendor=acme,x-stepping=B0,X-Stepping=B1")


@pytest.mark.parametrize("variable, value", [("SWA_HAL_STRICT", "2"), ("SWA_HAL_STRICT", "maybe"),
                                             ("SWA_HAL_DEBUG", "yes please"), ("SWA_HAL_GUARD", "2"),
                                             ("SWA_HAL_POLL_EVERY", "often")])
def test_a_misspelt_variable_is_one_line_and_exit_2(capsys, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    err = _one_line_error(capsys, "build", "--batch", str(CONFIGS / "batches" / "tiny_mixed.yaml"))
    assert err.startswith(f"swa-hal build: error: environment: {variable}={value!r}: "), err
    err = _one_line_error(capsys, "info")
    assert f"{variable}={value!r}" in err


def test_a_misspelt_strict_flag_is_an_error_in_the_library_too(monkeypatch):
    from swa_hal import SWAConfig, SWAMetadataBuilder

    monkeypatch.setenv("SWA_HAL_STRICT", "2")
    monkeypatch.setattr("swa_hal.plugins._default", None)  # the registry reads the flag when it loads
    with pytest.raises(ValueError, match="^SWA_HAL_STRICT='2': use one of 1, true, yes, on"):
        SWAMetadataBuilder(SWAConfig())


@pytest.mark.parametrize("device, message", [
    ("meta", "device 'meta' holds no data (meta tensors have shapes only)"),
    ("garbage", "device 'garbage' is not a torch device"),
])
def test_a_builder_on_a_device_it_cannot_build_on_says_so_first(device, message):
    import torch

    from swa_hal import SWAConfig, SWAMetadataBuilder
    from swa_hal.errors import DeviceError, SWAHalError

    for given in (device, torch.device(device) if device == "meta" else device):
        with pytest.raises(DeviceError) as info:
            SWAMetadataBuilder(SWAConfig(), device=given)
        assert isinstance(info.value, SWAHalError) and str(info.value).startswith(message), str(info.value)


def test_info_on_a_device_torch_does_not_know_is_one_line(capsys):
    err = _one_line_error(capsys, "info", "--device", "garbage")
    assert err.startswith("swa-hal info: error: --device 'garbage': "), err


def test_the_scenario_format_in_the_backends_guide_is_whole_and_runs(capsys, tmp_path):
    # docs/backends.md documents every scenario key, and its example is a scenario that runs as written.
    import dataclasses
    import re

    from swa_hal.scenarios import Scenario

    guide = (ROOT / "docs" / "backends.md").read_text()
    section = guide.split("## Trying a backend on a scenario", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)`(?:, `(\w+)`)? \|", section, flags=re.M))
    keys = {k for pair in documented for k in pair if k}
    assert keys == {f.name for f in dataclasses.fields(Scenario)}, keys
    example = re.search(r"```yaml\n(.*?)```", section, flags=re.S).group(1)
    (tmp_path / "batches").mkdir()
    shutil.copy(CONFIGS / "deepseek_v4_flash.yaml", tmp_path / "deepseek_v4_flash.yaml")
    scenario = tmp_path / "batches" / "my_step.yaml"
    scenario.write_text(example)
    assert set(yaml.safe_load(example)) == keys - {"name"}  # the example shows every key but the name
    code, out, err = run(capsys, "build", "--batch", str(scenario), "--repeat", "1", "--json")
    data = json.loads(out)
    assert code == 0 and err == "" and data["mismatches"] == [], err
    assert data["scenario"] == "my_step" and data["split"]["num_decodes"] == 64 and data["split"]["num_prefills"] == 6


def test_info_engine_vllm_without_vllm_says_so_and_exits_1(capsys, monkeypatch):
    """(With vLLM installed, tests/engines/test_vllm.py runs it for real.)"""
    from swa_hal.integrations import vllm_common

    monkeypatch.setattr(vllm_common, "vllm_version", lambda: None)
    monkeypatch.setattr("swa_hal.integrations.vllm.vllm_version", lambda: None)
    code, out, _ = run(capsys, "info", "--engine", "vllm")
    assert code == 1
    assert "engine: vLLM not installed (the plugin is tested with ==0.33.*, ==0.34.*)" in out
    assert "  entry point:   vllm.general_plugins swa_hal = swa_hal.integrations.vllm:register" in out
    assert "  active: no: vLLM is not installed in this environment" in out
