"""Property-based tests of bad input: whatever the command line, a config or a scenario holds, only the
project's typed errors come out (ConfigError, a BatchValidationError, the CLI's one-line error with exit
code 2), never another exception and never a traceback.

Fixed and derandomized like tests/test_fuzz.py (SWA_HAL_FUZZ_EXAMPLES scales the examples, default 150;
SWA_HAL_FUZZ_RANDOM=1 draws new ones).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from helpers import CONFIGS
from swa_hal import ConfigError, SWAConfig
from swa_hal.cli import main
from swa_hal.config import REQUIRED_SETTINGS
from swa_hal.scenarios import Scenario
from swa_hal.validation import validate_batch

EXAMPLES = int(os.environ.get("SWA_HAL_FUZZ_EXAMPLES", "150"))
RANDOM = os.environ.get("SWA_HAL_FUZZ_RANDOM", "") not in ("", "0")
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

TINY = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
TINY_CONFIG = SWAConfig.from_mapping(TINY)
# Files the tests write their YAML into (hypothesis runs each example many times: no function fixture).
WORK = Path(tempfile.mkdtemp(prefix="swa_hal_cli_fuzz_"))
atexit.register(shutil.rmtree, WORK, ignore_errors=True)

# What safe_load can give: scalars of every type, and lists and mappings of them.
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-3, 300), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["mtp", "dspark", "none", "deepseek_v41", "window"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)


@st.composite
def config_mappings(draw):
    """The tiny config with settings left out, replaced by anything, or added; or anything at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(values)
    settings_ = dict(TINY)
    keys = sorted(set(TINY) | {f for f in SWAConfig.__dataclass_fields__} | set(REQUIRED_SETTINGS))
    for key in draw(st.lists(st.sampled_from(keys), max_size=3)):
        action = draw(st.sampled_from(["drop", "set", "set"]))
        if action == "drop":
            settings_.pop(key, None)
        else:
            settings_[key] = draw(values)
    if draw(st.booleans()):
        settings_[draw(st.text(max_size=10))] = draw(values)
    return settings_


def _check_config_result(load):
    try:
        config = load()
    except ConfigError as exc:
        assert str(exc) and "\n" not in str(exc).strip(), str(exc)
        return None
    assert isinstance(config, SWAConfig)
    return config


@FUZZ
@given(data=config_mappings())
def test_the_config_loader_raises_only_config_errors(data):
    note(repr(data))
    _check_config_result(lambda: SWAConfig.from_mapping(data))


@FUZZ
@given(text=st.one_of(st.text(max_size=200), config_mappings().map(lambda d: yaml.safe_dump(d)),
                      st.sampled_from(["a: 2001-02-30", "a: !!bool maybe", "a: !!float x", "[" * 2000,
                                       "!!python/object/apply:os.getcwd []", "window_size: !!int 0x", "- 1\n- 2"])))
def test_a_config_file_of_any_text_is_a_config_or_a_config_error(text):
    path = WORK / "config.yaml"
    path.write_text(text, encoding="utf-8")
    _check_config_result(lambda: SWAConfig.from_yaml(path))


small = st.integers(0, 12)
group_values = st.one_of(small, st.integers(-2, 300), values)


@st.composite
def scenario_mappings(draw):
    """Scenarios whose groups mostly have small, plausible numbers (so many load and run on the tiny
    config), with anything in any key now and then."""
    if draw(st.integers(0, 19)) == 0:
        return draw(values)
    groups = []
    for _ in range(draw(st.integers(0, 3))):
        q = draw(small)
        group = {"count": draw(st.integers(0, 4)), "query_len": q,
                 "seq_len": draw(st.one_of(st.integers(q, 300), st.tuples(st.integers(q, 60), st.integers(q, 300))
                                           .map(list)))}
        for key in draw(st.lists(st.sampled_from(["count", "query_len", "seq_len", "seq_lens"]), max_size=1)):
            group[key] = draw(group_values)
        groups.append(group)
    data = {"groups": groups}
    for key in draw(st.lists(st.sampled_from(["seed", "padding_rows", "padding_requests", "invalid_tokens",
                                              "images_per_prefill", "image_tokens", "causal", "replay", "name",
                                              "description", "config", "bogus"]), max_size=4, unique=True)):
        data[key] = draw(st.one_of(small, st.sampled_from(["none", "prefix", "window", "random", True, False]),
                                   values))
    if draw(st.integers(0, 9)) == 0:
        data["groups"] = draw(values)
    return data


@FUZZ
@given(data=scenario_mappings(), vision=st.booleans())
def test_the_scenario_loader_raises_only_config_errors_and_what_loads_runs(data, vision):
    # A scenario that loads and passes check_config makes a batch that full validation accepts: nothing
    # the loader lets through is clamped, dropped, or left for the builder to refuse.
    note(repr(data))
    config = SWAConfig.from_mapping({**TINY, "max_image_tokens": 6, "num_speculative_tokens": 0,
                                     "speculative_method": None} if vision else TINY)
    try:
        scenario = Scenario.from_mapping(data, "fuzz.yaml")
    except ConfigError as exc:
        assert "\n" not in str(exc).strip(), str(exc)
        return
    try:
        scenario.check_config(config)
    except ConfigError as exc:
        assert "\n" not in str(exc).strip(), str(exc)
        with pytest.raises(ConfigError):  # make_batch checks too
            scenario.make_batch(config)
        return
    batch = scenario.make_batch(config)
    validate_batch(batch, config)
    assert int(batch.seq_lens.max()) <= config.max_model_len


# -- the command line ------------------------------------------------------------------------------------------

FILES = [str(CONFIGS / "tiny.yaml"), str(CONFIGS / "tiny_vision.yaml"), str(CONFIGS / "batches" / "tiny_mixed.yaml"),
         str(CONFIGS / "batches" / "tiny_vision.yaml"), str(CONFIGS), "", "nowhere.yaml", str(WORK / "scenario.yaml")]
ASSUMES = ["vendor=cpu", "vendor=cuda,capability=9.0", "vendor=cuda,capability=12.0", "vendor=rocm,arch=gfx942",
           "vendor=cuda,capabilty=9.0", "vendor=xpu,devices=2", "x-a=1", "vendor=acme,x-a=b", "vendor"]
text = st.text(max_size=24)
# Repeats and iterations stay small where they parse: the CLI runs them all.
counts = st.one_of(st.integers(-3, 3).map(str), text.filter(lambda t: not t.strip().lstrip("+-").isdigit()))
OPTIONS = {
    "info": {"--assume": st.one_of(st.sampled_from(ASSUMES), text), "--backend": st.one_of(st.sampled_from(
             ["torch", "cuda", "sm12x", "nope"]), text), "--expect": st.sampled_from(["torch", "cuda", "x"]),
             "--config": st.one_of(st.sampled_from(FILES), text), "--device": st.one_of(st.sampled_from(
                 ["cpu", "cuda", "cuda:7", "meta", "xpu", "cpu:0"]), text),
             "--json": None, "--status": None, "--env": None},
    "build": {"--config": st.one_of(st.sampled_from(FILES), text), "--batch": st.one_of(st.sampled_from(FILES), text),
              "--backend": st.one_of(st.just("torch"), text), "--assume": st.one_of(st.sampled_from(ASSUMES), text),
              "--device": st.one_of(st.sampled_from(["cpu", "cuda", "meta", "cpu:1"]), text), "--repeat": counts,
              "--no-check": None, "--json": None},
    "bench": {"--config": st.one_of(st.sampled_from(FILES), text), "--batch": st.one_of(st.sampled_from(FILES), text),
              "--backend": st.one_of(st.just("torch"), text), "--device": st.sampled_from(["cpu", "meta", "x"]),
              "--iters": counts},
    "warmup": {"--config": st.one_of(st.sampled_from(FILES), text), "--backend": st.one_of(st.just("torch"), text),
               "--assume": st.one_of(st.sampled_from(ASSUMES), text), "--device": st.sampled_from(["cpu", "cuda", "?"])},
    "matrix": {"--json": None},
}
ENV = {"SWA_HAL_STRICT": ["1", "0", "2", "maybe"], "SWA_HAL_GUARD": ["0", "2", "off"], "SWA_HAL_DEBUG": ["1", "x"],
       "SWA_HAL_BACKEND": ["torch", "nope"], "SWA_HAL_POLL_EVERY": ["4", "often"]}


@st.composite
def command_lines(draw):
    command = draw(st.sampled_from(sorted(OPTIONS)))
    argv = [command]
    # The options a command needs come first, most often with a value that works, so that many examples
    # get past them to the options after.
    needed = {"build": ["--batch"], "bench": ["--batch"], "warmup": ["--config"]}.get(command, [])
    for option in needed:
        argv += [option, draw(st.one_of(st.sampled_from(FILES[:4]), OPTIONS[command][option]))]
    others = sorted(set(OPTIONS[command]) - set(needed))
    for option in draw(st.lists(st.sampled_from(others), max_size=4, unique=True)) if others else []:
        argv.append(option)
        if OPTIONS[command][option] is not None:
            argv.append(draw(OPTIONS[command][option]))
    if draw(st.integers(0, 9)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(text))  # a stray word
    env = {name: draw(st.one_of(st.sampled_from(words), text.filter(lambda t: "\x00" not in t)))
           for name, words in ENV.items() if draw(st.integers(0, 5)) == 0}
    scenario = draw(scenario_mappings()) if str(WORK / "scenario.yaml") in argv else None
    return argv, env, scenario


@FUZZ
@given(case=command_lines())
def test_the_command_line_exits_with_a_report_or_a_one_line_error(case):
    from swa_hal import plugins

    argv, env, scenario = case
    note(f"argv={argv!r} env={env!r} scenario={scenario!r}")
    if scenario is not None:
        (WORK / "scenario.yaml").write_text(yaml.safe_dump(scenario), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        for name in ENV:
            mp.delenv(name, raising=False)
        for name, value in env.items():
            mp.setenv(name, value)
        mp.setenv("TRITON_INTERPRET", "0")  # Triton backends fall back to torch: every example stays fast
        mp.setattr(plugins, "_default", None)  # the registry reads SWA_HAL_STRICT when it loads
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse: a usage error (2), or --help / --version (0)
                code = exc.code
    lines = err.getvalue().strip().splitlines()
    note(f"code={code!r} stderr={err.getvalue()!r}")
    event(f"{argv[0]} exit {code}")
    assert "Traceback" not in err.getvalue()
    assert code in (0, 1, 2), code
    if code == 0 and not {"-h", "--help", "--version"} & set(argv[:1] + argv):
        assert not [line for line in lines if ": error: " in line], lines
    if code == 2:
        errors = [line for line in lines if not line.startswith("swa-hal: warning: ")]
        # One line: the error itself (argparse's usage errors print the usage line first).
        assert len([line for line in errors if not line.startswith("usage: ")]) == 1, lines
