"""What a Hugging Face model config says of the SWA metadata: the model version, and the compress ratio of
every layer in either format DeepSeek-V4 configs come in (docs/semantics.md #model-configs).

- DeepSeek's format: ``compress_ratios``, one integer per layer, the MTP layers included.
- The upstream format (``transformers``' ``DeepseekV4Config``): ``layer_types``, one name per layer
  (``sliding_attention`` or a compressed kind), ``compress_rates`` (the ratio of each compressed kind) and
  ``num_nextn_predict_layers``, the MTP layers, which ``layer_types`` leaves out and which slide.

Both give the ratios vLLM's ``get_compress_ratios`` gives (``compress_ratios`` first, where a config has
both). A config that gives neither, or an upstream one that leaves out a field the ratios need, is a
``ConfigError`` naming the field: the layer types decide which tile schedulers an engine gets, and a guessed
default would give the wrong ones without a word. ``SWAConfig.from_hf_config`` reads through this module.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError

# The Hugging Face key each SWAConfig field is read from, so an error names the key the model config holds.
HF_KEYS = {
    "window_size": "sliding_window",
    "compress_ratios": "compress_ratios",
    "head_size": "head_dim",
    "max_model_len": "max_position_embeddings",
    "max_image_tokens": "vision_max_n_token",
}
# The upstream format's name of the sliding-window layer type, whose ratio is 0 (it compresses nothing).
SLIDING_LAYER_TYPE = "sliding_attention"
# The most MTP layers a config may declare (DeepSeek's checkpoints have one to three).
MAX_NEXTN_LAYERS = 1024
# Said where an upstream-format field is missing: saving a config writes only what differs from the
# class's defaults, and the loaded object holds them all.
_DEFAULTS_HINT = (
    "a config saved by transformers leaves out fields equal to its defaults: pass the loaded config object "
    "(transformers.AutoConfig.from_pretrained(path)), which holds them all, or state the field"
)


def as_mapping(config: Any) -> Mapping[str, Any] | None:
    """``config`` as a mapping of its fields: itself, or a config object's ``to_dict()`` (a transformers
    ``PretrainedConfig``, which holds every field, the class's defaults included); None for anything else."""
    if isinstance(config, Mapping):
        return config
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        fields = to_dict()
        if isinstance(fields, Mapping):
            return fields
    return None


def model_version_of(hf_config: Mapping[str, Any]) -> str:
    """The model version a Hugging Face config describes: ``model_type`` or ``architectures`` name V4.1."""
    architectures = hf_config.get("architectures") or ()
    if isinstance(architectures, (str, bytes)) or not isinstance(architectures, (list, tuple)):
        raise ConfigError("architectures", f"must be a list of class names, got {architectures!r}")
    if hf_config.get("model_type") == "deepseek_v41" or "DeepseekV41ForCausalLM" in architectures:
        return "deepseek_v41"
    return "deepseek_v4"


@dataclasses.dataclass(frozen=True)
class LayerRatios:
    """The compress ratio of every layer (``values``, as read: ``SWAConfig`` checks them) and the key of the
    model config each was read from (``keys``: ``compress_ratios[3]``, ``compress_rates[...]``,
    ``num_nextn_predict_layers``), so that an error about ratio ``i`` names what the config holds."""

    values: Any
    keys: tuple[str, ...] = ()

    def key(self, index: str) -> str:
        """The model config's key of ratio ``index`` (a ``compress_ratios[i]`` field's ``i``)."""
        if index.isdigit() and int(index) < len(self.keys):
            return self.keys[int(index)]
        return HF_KEYS["compress_ratios"] + (f"[{index}]" if index else "")


def layer_ratios(config: Mapping[str, Any]) -> LayerRatios:
    """The compress ratio of every layer of ``config``, in DeepSeek's format or the upstream one (module
    docstring)."""
    ratios = config.get("compress_ratios")
    if ratios is not None:
        if isinstance(ratios, list):
            ratios = tuple(ratios)
        keys = tuple(f"compress_ratios[{i}]" for i in range(len(ratios))) if isinstance(ratios, tuple) else ()
        return LayerRatios(ratios, keys)
    if config.get("layer_types") is None:
        raise ConfigError(
            "compress_ratios",
            "it has neither compress_ratios (DeepSeek's format) nor layer_types with compress_rates "
            "(transformers' DeepseekV4Config): the model's layer types are unknown",
        )
    return _upstream_ratios(config)


def _upstream_ratios(config: Mapping[str, Any]) -> LayerRatios:
    """``layer_types`` through ``compress_rates``, then one sliding layer per MTP layer."""
    types = config["layer_types"]
    if isinstance(types, (str, bytes)) or not isinstance(types, (list, tuple)) or not types:
        raise ConfigError("layer_types", f"must be a non-empty list of layer type names, got {types!r}")
    layers = config.get("num_hidden_layers")
    if _is_count(layers) and len(types) != layers:
        raise ConfigError("layer_types", f"names {len(types)} layers, and num_hidden_layers is {layers}")
    rates = _required(config, "compress_rates")
    if not isinstance(rates, Mapping):
        raise ConfigError("compress_rates", f"must map layer type names to ratios, got {rates!r}")
    nextn = _required(config, "num_nextn_predict_layers")
    if not (_is_count(nextn) and int(nextn) <= MAX_NEXTN_LAYERS):
        raise ConfigError(
            "num_nextn_predict_layers",
            f"must be an integer in [0, {MAX_NEXTN_LAYERS}], got {nextn!r}",
        )
    values: list[Any] = []
    keys: list[str] = []
    for i, kind in enumerate(types):
        if isinstance(kind, str) and kind in rates:
            values.append(rates[kind])
            keys.append(f"compress_rates[{kind!r}]")
        elif kind == SLIDING_LAYER_TYPE:
            values.append(0)
            keys.append(f"layer_types[{i}]")
        else:
            given = ", ".join(map(repr, rates)) or "none"
            raise ConfigError(
                f"layer_types[{i}]",
                f"{kind!r} is neither {SLIDING_LAYER_TYPE!r} nor a type compress_rates gives a ratio for ({given})",
            )
    values += [0] * int(nextn)
    keys += ["num_nextn_predict_layers"] * int(nextn)
    return LayerRatios(tuple(values), tuple(keys))


def _required(config: Mapping[str, Any], key: str) -> Any:
    value = config.get(key)
    if value is None:
        raise ConfigError(key, f"missing, and the layer_types need it; {_DEFAULTS_HINT}")
    return value


def _is_count(value: Any) -> bool:
    """A non-negative integer (never a bool)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0
