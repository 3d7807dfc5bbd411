"""Model configs in both formats against vLLM's own reading of them (docs/semantics.md #model-configs).

``SWAConfig.from_hf_config`` must give the compress ratios (and so the layer types) vLLM's
``get_compress_ratios`` gives, on the config objects vLLM reads (``transformers``' ``DeepseekV4Config``, upstream
format, its legacy DeepSeek fields folded in; DeepSeek's own V4, V4.1 and vision configs), whether it is handed
the object, its dict or the file ``save_pretrained`` writes; and the layer types vLLM's SWA builder plans tile
schedulers for. A config it refuses is refused by name, never read with other ratios.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import pytest
from transformers import DeepseekV4Config
from vllm.transformers_utils.deepseek_v4_utils import get_compress_ratios
from vllm.v1.attention.backends.mla import sparse_swa

from swa_hal import ConfigError, SWAConfig

ENGINE = {"block_size": 64, "max_num_batched_tokens": 4096, "max_num_seqs": 64}
CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
# DeepSeek's published V4-Flash layout (43 layers, then its MTP layers), as its config.json lists them.
FLASH_RATIOS = [0, 0] + [4, 128] * 20 + [4, 0, 0, 0]


def upstream_configs():
    """transformers' own config objects: the tiny test shape, the default layout, and DeepSeek's legacy fields
    folded into the upstream ones (vision on and off)."""
    yield "tiny", DeepseekV4Config(
        num_hidden_layers=6,
        layer_types=[HCA, HCA, CSA, HCA, SWA, CSA],
        compress_rates={CSA: 2, HCA: 4},
        sliding_window=4,
    )
    yield "default layout", DeepseekV4Config(num_hidden_layers=7)
    for vision in (0, 32):
        yield f"legacy ratios, vision {vision}", DeepseekV4Config(
            num_hidden_layers=43, num_nextn_predict_layers=3, compress_ratios=FLASH_RATIOS, vision_n_layers=vision
        )


def vllm_layer_types(ratios: list[int]) -> tuple[str, ...]:
    """The layer types vLLM's V4 SWA builder plans for (``_layer_type_for`` of each ratio), in swa_hal's order."""
    found = {sparse_swa._layer_type_for(int(r)) for r in (ratios or [1])}
    return tuple(t for t in ("swaonly", "c4a", "c128a", "c1a", "c2a") if t in found)


@pytest.mark.parametrize("name, config", list(upstream_configs()), ids=lambda x: x if isinstance(x, str) else "")
@pytest.mark.parametrize("given", ["object", "dict", "file"])
def test_upstream_configs_read_as_vllm_reads_them(tmp_path, name, config, given):
    want = get_compress_ratios(config)
    if given == "file":
        config.save_pretrained(tmp_path)
        source = tmp_path
    else:
        source = config if given == "object" else config.to_dict()
    cfg = SWAConfig.from_hf_config(source, **ENGINE)
    assert list(cfg.compress_ratios) == list(want), name
    assert cfg.layer_types == vllm_layer_types(want), name
    assert cfg.window_size == config.sliding_window


@pytest.mark.parametrize(
    "hf",
    [
        {"model_type": "deepseek_v4", "sliding_window": 128, "compress_ratios": FLASH_RATIOS},
        {"model_type": "deepseek_v4", "sliding_window": 128, "compress_ratios": [0, 4, 128], "vision_n_layers": 2,
         "vision_max_n_token": 576},
        {"model_type": "deepseek_v41", "sliding_window": 128, "compress_ratios": [0, 1, 2, 1, 2, 0]},
    ],
    ids=["V4 Flash", "V4 vision", "V4.1"],
)
def test_deepseek_format_configs_read_as_vllm_reads_them(tmp_path, hf):
    # vLLM reads DeepSeek's format from the config's attributes: compress_ratios, as written.
    want = get_compress_ratios(SimpleNamespace(**hf))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf))
    for source in (hf, path):
        cfg = SWAConfig.from_hf_config(source, max_model_len=8192, **ENGINE)
        assert list(cfg.compress_ratios) == list(want)
    if hf["model_type"] == "deepseek_v4":
        assert cfg.layer_types == vllm_layer_types(want)


def test_a_type_vllm_would_read_as_sliding_is_refused_by_name():
    # vLLM 0.34 reads a layer type compress_rates does not name as ratio 0; swa_hal names it instead.
    config = DeepseekV4Config(num_hidden_layers=2, layer_types=[HCA, CSA], compress_rates={HCA: 128})
    assert get_compress_ratios(config) == [128, 0, 0]
    with pytest.raises(ConfigError) as info:
        SWAConfig.from_hf_config(config, **ENGINE)
    assert info.value.field == "layer_types[1]"
