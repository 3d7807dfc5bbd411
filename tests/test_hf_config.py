"""Model configs in both formats (docs/semantics.md #model-configs): DeepSeek's compress_ratios and the upstream
layer_types + compress_rates + num_nextn_predict_layers. The expected ratios are worked out from the format's
rule by hand; tests/engines/test_vllm_configs.py holds them to vLLM's get_compress_ratios on transformers' own
config objects."""

from __future__ import annotations

import json
import math

import pytest

from swa_hal import ConfigError, SWAConfig
from swa_hal.hf_config import layer_ratios

ENGINE = {"block_size": 64, "max_num_batched_tokens": 4096, "max_num_seqs": 64}
CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"

# The shape of transformers' tiny DeepSeek-V4 test config: six layers of three kinds, small rates, one MTP layer.
TINY = {
    "model_type": "deepseek_v4",
    "sliding_window": 4,
    "max_position_embeddings": 512,
    "num_hidden_layers": 6,
    "layer_types": [HCA, HCA, CSA, HCA, SWA, CSA],
    "compress_rates": {CSA: 2, HCA: 4},
    "num_nextn_predict_layers": 1,
}


def test_upstream_tiny_config_gives_each_layer_its_rate_then_the_mtp_layers():
    cfg = SWAConfig.from_hf_config(TINY, **ENGINE)
    # HCA -> 4, CSA -> 2, sliding -> 0, then one MTP layer, which slides: 0.
    assert cfg.compress_ratios == (4, 4, 2, 4, 0, 2, 0)
    assert cfg.layer_types == ("swaonly", "c4a", "c2a")


def test_four_layers_of_three_kinds_keep_their_kinds():
    # The config that used to give compress_ratios=(1,): one SWA-only type instead of three.
    hf = {"sliding_window": 128, "max_position_embeddings": 4096, "layer_types": [SWA, CSA, HCA, CSA],
          "compress_rates": {CSA: 4, HCA: 128}, "num_nextn_predict_layers": 0}
    cfg = SWAConfig.from_hf_config(hf, **ENGINE)
    assert cfg.compress_ratios == (0, 4, 128, 4)
    assert cfg.layer_types == ("swaonly", "c4a", "c128a")


def test_legacy_ratios_win_over_layer_types():
    # Where a config has both, compress_ratios is read, as vLLM reads it.
    cfg = SWAConfig.from_hf_config({**TINY, "compress_ratios": [0, 4, 128]}, **ENGINE)
    assert cfg.compress_ratios == (0, 4, 128)


def test_a_config_object_is_read_through_to_dict():
    class Loaded:  # what transformers' PretrainedConfig offers: every field, defaults filled in
        def to_dict(self):
            return dict(TINY)

    assert SWAConfig.from_hf_config(Loaded(), **ENGINE).compress_ratios == (4, 4, 2, 4, 0, 2, 0)


@pytest.mark.parametrize(
    "change, key, message",
    [
        ({"compress_rates": None}, "compress_rates", "missing, and the layer_types need it; a config saved by"),
        ({"num_nextn_predict_layers": None}, "num_nextn_predict_layers", "missing, and the layer_types need it"),
        ({"num_nextn_predict_layers": -1}, "num_nextn_predict_layers", "must be an integer in [0, 1024], got -1"),
        ({"num_nextn_predict_layers": True}, "num_nextn_predict_layers", "must be an integer in [0, 1024], got True"),
        ({"compress_rates": [4, 128]}, "compress_rates", "must map layer type names to ratios, got [4, 128]"),
        ({"layer_types": "sliding_attention"}, "layer_types", "must be a non-empty list of layer type names"),
        ({"layer_types": []}, "layer_types", "must be a non-empty list of layer type names"),
        ({"num_hidden_layers": 5}, "layer_types", "names 6 layers, and num_hidden_layers is 5"),
        (
            {"layer_types": [HCA, "linear_attention"]} | {"num_hidden_layers": 2},
            "layer_types[1]",
            "'linear_attention' is neither 'sliding_attention' nor a type compress_rates gives a ratio for",
        ),
        (
            {"compress_rates": {CSA: 2, HCA: 8}},
            "compress_rates['heavily_compressed_attention']",
            "unsupported compress ratio 8 for deepseek_v4",
        ),
        ({"compress_rates": {CSA: "2", HCA: 4}}, "compress_rates['compressed_sparse_attention']", "ratio '2' is not"),
    ],
)
@pytest.mark.parametrize("given", ["dict", "file"])
def test_upstream_errors_name_the_field_and_the_file(tmp_path, change, key, message, given):
    hf = {k: v for k, v in {**TINY, **change}.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf))
    with pytest.raises(ConfigError) as info:
        SWAConfig.from_hf_config(hf if given == "dict" else path, **ENGINE)
    assert info.value.field == key, str(info.value)
    assert str(info.value).startswith(f"{key}: {message}"), str(info.value)
    assert str(info.value).endswith(f"in {path})" if given == "file" else "in the model config)"), str(info.value)


@pytest.mark.parametrize("window", [math.nan, math.inf, -math.inf])
def test_a_window_that_is_no_integer_is_named_before_a_missing_engine_setting(window):
    # No max_position_embeddings and no max_model_len: the bad window is still what the error names.
    with pytest.raises(ConfigError) as info:
        SWAConfig.from_hf_config({"sliding_window": window, "compress_ratios": [0]}, **ENGINE)
    assert info.value.field == "sliding_window", str(info.value)
    assert f"must be an integer, got {window!r}" in str(info.value)


def test_layer_ratios_keys_say_where_each_ratio_came_from():
    ratios = layer_ratios(TINY)
    assert ratios.keys == (
        f"compress_rates[{HCA!r}]",
        f"compress_rates[{HCA!r}]",
        f"compress_rates[{CSA!r}]",
        f"compress_rates[{HCA!r}]",
        "layer_types[4]",
        f"compress_rates[{CSA!r}]",
        "num_nextn_predict_layers",
    )
