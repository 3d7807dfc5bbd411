"""The one helper of vLLM's test utilities (``tests/v1/attention/utils.py`` in vLLM's repository) that the copied
builder tests call, ``create_vllm_config``, as a stand-in that needs no download: upstream's loads the named
Hugging Face model (``meta-llama/Meta-Llama-3-8B`` by default) and then applies ``hf_config_override`` to its config;
this one makes the same VllmConfig over a local DeepSeek-V4 ``config.json`` (the model these builders are for, and
the config class vLLM's builder reads the vision variant's settings from), then applies the overrides the same way.
The model name is taken and not read."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

# A DeepSeek-V4 text config small enough to load without weights (the builders read its window, compress ratios and
# vision settings; the overrides set the first and the last).
_MODEL = {
    "model_type": "deepseek_v4",
    "architectures": ["DeepseekV4ForCausalLM"],
    "sliding_window": 128,
    "compress_ratios": [0, 4, 128, 4],
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "head_dim": 512,
    "max_position_embeddings": 8192,
    "vocab_size": 1000,
}


def create_vllm_config(
    model_name: str = "meta-llama/Meta-Llama-3-8B",
    max_model_len: int = 1024,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    hf_config_override: dict[str, Any] | None = None,
) -> Any:
    from vllm.config import ModelConfig, SchedulerConfig, VllmConfig

    folder = Path(tempfile.mkdtemp(prefix="vllm-upstream-model-"))
    (folder / "config.json").write_text(json.dumps(_MODEL))
    model_config = ModelConfig(
        model=str(folder), tokenizer=str(folder), skip_tokenizer_init=True, seed=0, max_model_len=max_model_len
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=model_config.max_model_len,
        is_encoder_decoder=model_config.is_encoder_decoder,
    )
    if hf_config_override:
        model_config.hf_config.update(hf_config_override)
    return VllmConfig(model_config=model_config, scheduler_config=scheduler_config)
