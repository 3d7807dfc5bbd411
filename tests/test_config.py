"""SWAConfig: validation names the field; YAML is data; Hugging Face configs load."""

from __future__ import annotations

import json

import pytest

from helpers import CONFIGS
from swa_hal import ConfigError, SWAConfig
from swa_hal.config import layer_type_for


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
    v41 = SWAConfig.from_hf_config({"sliding_window": 128, "model_type": "deepseek_v41", "compress_ratios": [0, 1, 2]})
    assert (v41.model_version, v41.layer_types) == ("deepseek_v41", ("swaonly", "c1a", "c2a"))
    arch = SWAConfig.from_hf_config({"sliding_window": 128, "architectures": ["DeepseekV41ForCausalLM"]})
    assert (arch.model_version, arch.compress_ratios) == ("deepseek_v41", (0,))
    vision = SWAConfig.from_hf_config({"sliding_window": 128, "vision_n_layers": 2, "vision_max_n_token": 576})
    assert (vision.max_image_tokens, vision.prefill_index_width) == (576, 704)
    no_layers = SWAConfig.from_hf_config({"sliding_window": 128, "vision_n_layers": 0, "vision_max_n_token": 576})
    assert no_layers.max_image_tokens == 0
    # V4.1 image tokens use the plain causal window: no widening.
    v41_vision = SWAConfig.from_hf_config({"sliding_window": 128, "model_type": "deepseek_v41",
                                           "compress_ratios": [0], "vision_n_layers": 2, "vision_max_n_token": 576})
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
    hf = {"sliding_window": 128, "compress_ratios": [0, 4, 128, 0], "head_dim": 512,
          "max_position_embeddings": 1048576}
    cfg = SWAConfig.from_hf_config(hf, block_size=64, max_num_batched_tokens=4096, num_speculative_tokens=1,
                                   speculative_method="mtp")
    assert (cfg.window_size, cfg.max_model_len, cfg.max_num_batched_tokens) == (128, 1048576, 4096)
    assert cfg.layer_types == ("swaonly", "c4a", "c128a")
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert SWAConfig.from_hf_config(tmp_path, max_model_len=8192).max_model_len == 8192
    assert SWAConfig.from_hf_config(tmp_path / "config.json").window_size == 128


def test_from_hf_config_without_ratios_is_swa_only():
    assert SWAConfig.from_hf_config({"sliding_window": 64}).layer_types == ("swaonly",)


def test_from_hf_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="sliding_window"):
        SWAConfig.from_hf_config({"compress_ratios": [4]})
    with pytest.raises(ConfigError, match="window_size"):
        SWAConfig.from_hf_config({"sliding_window": 8}, window_size=16)
    with pytest.raises(ConfigError, match="compress_ratios\\[0\\]"):
        SWAConfig.from_hf_config({"sliding_window": 8, "compress_ratios": [3]})
