"""SWAConfig: validation names the field; YAML is data; Hugging Face configs load."""

from __future__ import annotations

import json

import pytest

from helpers import CONFIGS
from swa_hal import ConfigError, SWAConfig
from swa_hal.config import layer_type_for

# The settings an engine passes to from_hf_config (a config.json holds none of them).
ENGINE = {"block_size": 64, "max_num_batched_tokens": 4096, "max_num_seqs": 64}


def engine_for(hf):
    """ENGINE, and max_model_len where the model config has no max_position_embeddings to give it."""
    return ENGINE if "max_position_embeddings" in hf else {**ENGINE, "max_model_len": 8192}


def test_shipped_flash_config_matches_the_published_model():
    cfg = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash.yaml")
    assert (cfg.window_size, cfg.block_size, cfg.head_size) == (128, 64, 512)
    assert len(cfg.compress_ratios) == 44  # 43 layers + the MTP layer
    assert cfg.compress_ratios[:4] == (0, 0, 4, 128) and cfg.compress_ratios[-1] == 0
    assert cfg.layer_types == ("swaonly", "c4a", "c128a")
    assert cfg.decode_threshold == 1


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")))
def test_every_shipped_config_loads(path):
    cfg = SWAConfig.from_yaml(path)
    assert cfg.window_size >= 1 and cfg.max_num_batched_tokens >= 1


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("window_size", 0, "window_size"),
        ("window_size", -3, "window_size"),
        ("block_size", 0, "block_size"),
        ("block_size", 2.5, "block_size"),
        ("max_model_len", 0, "max_model_len"),
        ("max_num_batched_tokens", 0, "max_num_batched_tokens"),
        ("max_num_seqs", True, "max_num_seqs"),
        ("num_speculative_tokens", -1, "num_speculative_tokens"),
        ("compress_ratios", (1, 8), "compress_ratios[1]"),
        ("compress_ratios", (), "compress_ratios"),
        ("compress_ratios", "4", "compress_ratios"),
        ("parallel_drafting", "yes", "parallel_drafting"),
        ("head_size", 0, "head_size"),
        ("speculative_method", "", "speculative_method"),
    ],
)
def test_invalid_values_name_the_field(field, value, fragment):
    with pytest.raises(ValueError) as info:
        SWAConfig(**{field: value})
    assert isinstance(info.value, ConfigError)
    assert str(info.value).startswith(fragment)


def test_drafts_need_a_method_and_parallel_needs_drafts():
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        SWAConfig(num_speculative_tokens=2)
    with pytest.raises(ConfigError, match="parallel_drafting"):
        SWAConfig(parallel_drafting=True)


def test_int32_overflowing_cache_is_rejected():
    with pytest.raises(ConfigError, match="num_kv_blocks"):
        SWAConfig(block_size=64, num_kv_blocks=2**26)
    assert SWAConfig(block_size=64, num_kv_blocks=2**25).num_kv_blocks == 2**25


def test_decode_threshold():
    assert SWAConfig().decode_threshold == 1
    assert SWAConfig(num_speculative_tokens=3, speculative_method="mtp").decode_threshold == 4
    assert SWAConfig(num_speculative_tokens=3, speculative_method="mtp", parallel_drafting=True).decode_threshold == 7


@pytest.mark.parametrize("ratio, kind", [(0, "swaonly"), (1, "swaonly"), (2, "c2a"), (4, "c4a"), (128, "c128a")])
def test_layer_types(ratio, kind):
    assert layer_type_for(ratio) == kind


@pytest.mark.parametrize("ratio, kind", [(0, "swaonly"), (1, "c1a"), (2, "c2a")])
def test_v41_layer_types(ratio, kind):
    # docs/semantics.md #layer-types-and-schedulers: V4.1 has its own ratio table.
    assert layer_type_for(ratio, "deepseek_v41") == kind


@pytest.mark.parametrize("ratio", [3, 64, -1, 129])
def test_unsupported_ratio_is_a_config_error(ratio):
    with pytest.raises(ConfigError, match="unsupported compress ratio"):
        layer_type_for(ratio)


@pytest.mark.parametrize("ratio", [4, 128, 3])
def test_unsupported_v41_ratio_names_it(ratio):
    with pytest.raises(ConfigError, match=f"unsupported compress ratio {ratio} for deepseek_v41"):
        SWAConfig(model_version="deepseek_v41", compress_ratios=(0, ratio))


def test_hf_config_reads_the_model_version_and_vision_tokens():
    v41 = SWAConfig.from_hf_config({"sliding_window": 128, "model_type": "deepseek_v41", "compress_ratios": [0, 1, 2]}, **engine_for({}))
    assert (v41.model_version, v41.layer_types) == ("deepseek_v41", ("swaonly", "c1a", "c2a"))
    arch = SWAConfig.from_hf_config(
        {"sliding_window": 128, "architectures": ["DeepseekV41ForCausalLM"], "compress_ratios": [0, 1]}, **engine_for({})
    )
    assert (arch.model_version, arch.layer_types) == ("deepseek_v41", ("swaonly", "c1a"))
    vision = SWAConfig.from_hf_config(
        {"sliding_window": 128, "compress_ratios": [0], "vision_n_layers": 2, "vision_max_n_token": 576}, **engine_for({})
    )
    assert (vision.max_image_tokens, vision.prefill_index_width) == (576, 704)
    no_layers = SWAConfig.from_hf_config(
        {"sliding_window": 128, "compress_ratios": [0], "vision_n_layers": 0, "vision_max_n_token": 576}, **engine_for({})
    )
    assert no_layers.max_image_tokens == 0
    # V4.1 image tokens use the plain causal window: no widening.
    v41_vision = SWAConfig.from_hf_config(
        {
            "sliding_window": 128,
            "model_type": "deepseek_v41",
            "compress_ratios": [0],
            "vision_n_layers": 2,
            "vision_max_n_token": 576,
        },
        **engine_for({}),
    )
    assert v41_vision.max_image_tokens == 0
    with pytest.raises(ConfigError, match="model_version"):
        SWAConfig(model_version="deepseek_v5")


def test_yaml_unknown_key_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("window_size: 4\nwindow_sise: 8\n")
    with pytest.raises(ConfigError, match="window_sise"):
        SWAConfig.from_yaml(path)


def test_yaml_is_data_not_code(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("window_size: !!python/object/apply:os.system ['echo pwned']\n")
    # Refused by safe_load (reported as a config error naming the file), never constructed.
    with pytest.raises(ConfigError, match="evil.yaml: is not valid YAML.*could not determine a constructor"):
        SWAConfig.from_yaml(path)


def test_from_hf_config_dict_and_file(tmp_path):
    hf = {"sliding_window": 128, "compress_ratios": [0, 4, 128, 0], "head_dim": 512, "max_position_embeddings": 1048576}
    cfg = SWAConfig.from_hf_config(
        hf, block_size=64, max_num_batched_tokens=4096, max_num_seqs=64, num_speculative_tokens=1,
        speculative_method="mtp"
    )
    assert (cfg.window_size, cfg.max_model_len, cfg.max_num_batched_tokens) == (128, 1048576, 4096)
    assert cfg.layer_types == ("swaonly", "c4a", "c128a")
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert SWAConfig.from_hf_config(tmp_path, max_model_len=8192, **ENGINE).max_model_len == 8192
    assert SWAConfig.from_hf_config(tmp_path / "config.json", **ENGINE).window_size == 128


@pytest.mark.parametrize("model_type", ["deepseek_v4", "deepseek_v41"])
def test_from_hf_config_without_ratios_names_the_field(model_type):
    # docs/semantics.md #model-configs: the layer types decide the schedulers; none is guessed.
    with pytest.raises(ConfigError) as info:
        SWAConfig.from_hf_config({"sliding_window": 64, "model_type": model_type}, **engine_for({}))
    assert info.value.field == "compress_ratios"
    assert "neither compress_ratios (DeepSeek's format) nor layer_types" in str(info.value), str(info.value)


def test_from_hf_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="sliding_window"):
        SWAConfig.from_hf_config({"compress_ratios": [4]})
    with pytest.raises(ConfigError, match="window_size"):
        SWAConfig.from_hf_config({"sliding_window": 8, "compress_ratios": [0]}, window_size=16)
    with pytest.raises(ConfigError, match="compress_ratios\\[0\\]"):
        SWAConfig.from_hf_config({"sliding_window": 8, "compress_ratios": [3]}, **engine_for({}))


@pytest.mark.parametrize(
    "hf, settings, key, message",
    [
        ({"sliding_window": 8, "max_position_embeddings": 64}, {}, "block_size",
         "missing: pass block_size=..., the engine's KV-cache page size; no default fits every engine; also "
         "missing: max_num_batched_tokens, max_num_seqs"),
        ({"sliding_window": 8, "max_position_embeddings": 64}, {"block_size": 64, "max_num_seqs": 4},
         "max_num_batched_tokens", "missing: pass max_num_batched_tokens=..., the engine's largest step, in tokens"),
        ({"sliding_window": 8}, ENGINE, "max_model_len",
         "missing: the model config has no max_position_embeddings, so pass max_model_len=..., the engine's "
         "longest sequence"),
    ],
)
def test_from_hf_config_never_defaults_an_engine_setting(hf, settings, key, message):
    # As a config file missing them: the constructor's defaults are another engine's capacities.
    with pytest.raises(ConfigError) as info:
        SWAConfig.from_hf_config({"compress_ratios": [0], **hf}, **settings)
    assert info.value.field == key and str(info.value).startswith(f"{key}: {message}"), str(info.value)


# -- from_hf_config: every odd input is a ConfigError naming the file (when there is one) and the key --------


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "{path}: cannot read the model config: No such file or directory"),
        ('{"sliding_window": 128,', "{path}: is not valid JSON (line 1, column 24)"),
        ("[128]", "{path}: must hold a JSON object of settings, got list"),
        ('"sliding_window"', "{path}: must hold a JSON object of settings, got str"),
        (b"\xff\xfe{}", "{path}: is not a UTF-8 text file"),
        ("{}", "sliding_window: {path} has no sliding_window; this is not an SWA model"),
        (
            '{"sliding_window": "128", "compress_ratios": [0]}',
            "sliding_window: must be an integer, got '128' (SWAConfig.window_size, in {path})",
        ),
    ],
    ids=["missing", "invalid JSON", "a list", "a string", "not UTF-8", "no sliding_window", "string window"],
)
@pytest.mark.parametrize("given", ["file", "folder"])
def test_from_hf_config_file_errors_name_the_file(tmp_path, content, message, given):
    path = tmp_path / "config.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        SWAConfig.from_hf_config(path if given == "file" else tmp_path, **engine_for({}))
    assert str(info.value).startswith(message.format(path=path)), str(info.value)


@pytest.mark.parametrize(
    "hf, key, message",
    [
        ({"sliding_window": "128"}, "sliding_window", "must be an integer, got '128' (SWAConfig.window_size"),
        ({"sliding_window": 128.5}, "sliding_window", "must be an integer, got 128.5"),
        ({"sliding_window": True}, "sliding_window", "must be an integer, got True"),
        ({"sliding_window": 0}, "sliding_window", "0 is outside [1, 1048576]"),
        ({"sliding_window": -4}, "sliding_window", "-4 is outside [1, 1048576]"),
        ({"sliding_window": 8, "head_dim": "512"}, "head_dim", "must be an integer, got '512' (SWAConfig.head_size"),
        ({"sliding_window": 8, "head_dim": 0}, "head_dim", "0 is outside [1, 2147483647]"),
        (
            {"sliding_window": 8, "max_position_embeddings": False},
            "max_position_embeddings",
            "must be an integer, got False (SWAConfig.max_model_len",
        ),
        ({"sliding_window": 8, "max_position_embeddings": -1}, "max_position_embeddings", "-1 is outside"),
        ({"sliding_window": 8, "compress_ratios": "4"}, "compress_ratios", "must be a list of integers, got '4'"),
        ({"sliding_window": 8, "compress_ratios": [1, True]}, "compress_ratios[1]", "ratio True is not an integer"),
        ({"sliding_window": 8, "compress_ratios": [1, -4]}, "compress_ratios[1]", "unsupported compress ratio -4"),
        ({"sliding_window": 8, "architectures": 5}, "architectures", "must be a list of class names, got 5"),
        (
            {"sliding_window": 8, "architectures": "DeepseekV41ForCausalLM"},
            "architectures",
            "must be a list of class names, got 'DeepseekV41ForCausalLM'",
        ),
        ({"sliding_window": 8, "vision_n_layers": "2"}, "vision_n_layers", "must be a non-negative integer, got '2'"),
        ({"sliding_window": 8, "vision_n_layers": -1}, "vision_n_layers", "must be a non-negative integer, got -1"),
        (
            {"sliding_window": 8, "vision_n_layers": 2, "vision_max_n_token": "576"},
            "vision_max_n_token",
            "must be an integer, got '576' (SWAConfig.max_image_tokens",
        ),
        ({"sliding_window": 8, "vision_n_layers": 2, "vision_max_n_token": -1}, "vision_max_n_token", "-1 is outside"),
    ],
)
@pytest.mark.parametrize("given", ["dict", "file"])
def test_from_hf_config_value_errors_name_the_key_and_the_file(tmp_path, hf, key, message, given):
    hf = {"compress_ratios": [1], **hf}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf))
    with pytest.raises(ConfigError) as info:
        SWAConfig.from_hf_config(hf if given == "dict" else path, **engine_for(hf))
    error = info.value
    assert error.field == key
    assert str(error).startswith(f"{key}: {message}"), str(error)
    assert str(error).endswith(f"in {path})" if given == "file" else "in the model config)"), str(error)


@pytest.mark.parametrize("config", [5, None, ["sliding_window", 8], b"config.json"], ids=repr)
def test_from_hf_config_of_something_else_names_the_argument(config):
    with pytest.raises(ConfigError, match=r"^config: must be a mapping, a config.json file or its folder, or a config object with to_dict\(\), got "):
        SWAConfig.from_hf_config(config)


@pytest.mark.parametrize(
    "settings, key, message",
    [
        ({"max_num_seqs": 0}, "max_num_seqs", "0 is outside [1, 2147483647]"),
        ({"block_size": "64"}, "block_size", "must be an integer, got '64'"),
        ({"max_model_len": True}, "max_model_len", "must be an integer, got True"),
        ({"window_size": 16}, "window_size", "is not an engine setting"),
    ],
)
def test_from_hf_config_engine_setting_errors_name_the_setting(settings, key, message):
    # An engine setting that overrides a model value (max_model_len here) is named as the engine's.
    with pytest.raises(ConfigError) as info:
        SWAConfig.from_hf_config(
            {"sliding_window": 8, "max_position_embeddings": 64, "compress_ratios": [0]}, **{**ENGINE, **settings}
        )
    assert info.value.field == key and str(info.value).startswith(f"{key}: {message}"), str(info.value)


# -- config files state what has no safe default -------------------------------------------------------------


def _tiny_settings():
    import yaml

    return yaml.safe_load((CONFIGS / "tiny.yaml").read_text())


@pytest.mark.parametrize(
    "field", ["window_size", "block_size", "compress_ratios", "max_model_len", "max_num_batched_tokens", "max_num_seqs"]
)
def test_a_config_file_without_a_required_setting_names_it(tmp_path, field):
    import yaml

    settings = _tiny_settings()
    del settings[field]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(settings))
    with pytest.raises(ConfigError) as info:
        SWAConfig.from_yaml(path)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: missing from {path}: a config states "), str(info.value)
    assert "also missing" not in str(info.value)
    with pytest.raises(ConfigError, match=f"^{field}: missing from config: "):
        SWAConfig.from_mapping(settings)


def test_a_config_file_without_its_window_no_longer_gets_128(tmp_path):
    # The first of the settings missing is the error's field; the message lists the others.
    path = tmp_path / "c.yaml"
    path.write_text("block_size: 64\ncompress_ratios: [0, 4]\n")
    with pytest.raises(ConfigError) as info:
        SWAConfig.from_yaml(path)
    assert info.value.field == "window_size"
    assert str(info.value).endswith("also missing: max_model_len, max_num_batched_tokens, max_num_seqs")


def test_settings_with_a_safe_default_may_be_left_out():
    settings = {
        key: value
        for key, value in _tiny_settings().items()
        if key not in ("num_speculative_tokens", "speculative_method", "head_size")
    }
    cfg = SWAConfig.from_mapping(settings)
    assert (cfg.num_speculative_tokens, cfg.speculative_method, cfg.decode_threshold) == (0, None, 1)
    assert (cfg.head_size, cfg.model_version, cfg.max_image_tokens, cfg.num_kv_groups) == (512, "deepseek_v4", 0, 1)
    assert cfg.num_kv_blocks is None and cfg.split_threshold is None
    # The constructor keeps its defaults for code that builds a config by hand.
    assert SWAConfig().window_size == 128 and SWAConfig(window_size=4).max_num_seqs == 256


def test_ratio_1_needs_the_model_version_in_a_config_file():
    # Ratio 1 is a SWA-only layer in V4 and a C1A layer in V4.1: a file must say which model it describes.
    settings = {
        **_tiny_settings(),
        "compress_ratios": [0, 1, 2],
        "num_speculative_tokens": 0,
        "speculative_method": None,
    }
    with pytest.raises(
        ConfigError,
        match=r"^model_version: missing from config, whose compress_ratios include 1: "
        r"the layer type of that ratio differs between deepseek_v4 and deepseek_v41",
    ):
        SWAConfig.from_mapping(settings)
    assert SWAConfig.from_mapping({**settings, "model_version": "deepseek_v41"}).layer_types == (
        "swaonly",
        "c1a",
        "c2a",
    )
    assert SWAConfig.from_mapping({**settings, "model_version": "deepseek_v4"}).layer_types == ("swaonly", "c2a")
    no_one = SWAConfig.from_mapping({**settings, "compress_ratios": [0, 2]})  # the same types in both versions
    assert no_one.model_version == "deepseek_v4"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("a: 2001-02-30\n", "is not data a config can hold (ValueError: day is out of range for month)"),
        ("a: !!bool maybe\n", "is not data a config can hold (KeyError: 'maybe')"),
        ("a: " + "[" * 3000 + "\n", "is not data a config can hold (RecursionError"),
    ],
)
def test_yaml_the_parser_chokes_on_is_a_config_error(tmp_path, text, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        SWAConfig.from_yaml(path)
    assert str(info.value).startswith(f"{path}: {fragment}"), str(info.value)


def test_a_path_no_file_can_have_is_a_config_error():
    with pytest.raises(ConfigError, match="cannot read the config: embedded null byte"):
        SWAConfig.from_yaml("configs/tiny\x00.yaml")


def test_split_threshold_is_the_engines_own_decode_threshold():
    """docs/semantics.md #split: an engine's own threshold replaces the derived one, within [1 + N, tokens]."""
    base = dict(window_size=4, block_size=4, max_num_batched_tokens=16, num_speculative_tokens=3)
    derived = SWAConfig(**base, speculative_method="dspark", parallel_drafting=True)
    assert derived.decode_threshold == 7  # 1 + 2 * 3, the parallel-drafting rule
    given = SWAConfig(**base, speculative_method="dspark", parallel_drafting=True, split_threshold=4)
    assert given.decode_threshold == 4  # what vLLM 0.34 computes for this setup
    assert SWAConfig(**base, speculative_method="draft_model", split_threshold=5).decode_threshold == 5
    for bad, rule in ((3, r"outside \[4, 16\]"), (17, r"outside \[4, 16\]"), (True, "must be an integer")):
        with pytest.raises(ConfigError, match=rule) as info:
            SWAConfig(**base, speculative_method="mtp", split_threshold=bad)
        assert info.value.field == "split_threshold"
