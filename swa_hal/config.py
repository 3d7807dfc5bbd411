"""SWAConfig: the static, per-model and per-engine settings (docs/semantics.md #inputs), validated on construction."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .errors import ConfigError
from .hf_config import HF_KEYS, LayerRatios, as_mapping, layer_ratios, model_version_of
from .spelling import closest

# Every layer type a model of either version can have; scheduler slots exist for all five
# (docs/semantics.md #layer-types-and-schedulers), None where the model has no such layer.
LAYER_TYPES = ("swaonly", "c4a", "c128a", "c1a", "c2a")
MODEL_VERSIONS = ("deepseek_v4", "deepseek_v41")
# Drafting methods engines run with these models. Only "dspark" changes the rows (non-causal draft
# blocks); the others only set the decode threshold through num_speculative_tokens.
SPECULATIVE_METHODS = ("mtp", "dspark", "eagle", "eagle3", "ngram", "medusa", "draft_model", "suffix")
# Layer type by compress ratio, per model version.
_LAYER_TYPE_BY_RATIO = {
    "deepseek_v4": {0: "swaonly", 1: "swaonly", 2: "c2a", 4: "c4a", 128: "c128a"},
    "deepseek_v41": {0: "swaonly", 1: "c1a", 2: "c2a"},
}
# Index slots are int32 (FlashMLA's encoding), so no position or slot may reach 2**31.
INT32_LIMIT = 2**31 - 1
# The widest row any kernel takes: a Triton program holds a whole row (its width padded to a power of two)
# in one tensor, and Triton's tensors hold at most 2^20 elements; a wider row fails inside the compiler.
MAX_ROW_WIDTH = 1 << 20
# FlashMLA reads index rows in tiles of 64 entries (docs/semantics.md #flashmla-consumer), hence the DSpark row padding.
INDEX_TILE = 64


def layer_type_for(compress_ratio: int, model_version: str = "deepseek_v4") -> str:
    """docs/semantics.md #layer-types-and-schedulers: the layer type of a compress ratio."""
    if not _is_integer(compress_ratio):
        raise ConfigError("compress_ratios", f"ratio {compress_ratio!r} is not an integer")
    compress_ratio = int(compress_ratio)
    table = _LAYER_TYPE_BY_RATIO.get(model_version)
    if table is None:
        raise ConfigError("model_version", f"{model_version!r} is not one of {', '.join(MODEL_VERSIONS)}")
    kind = table.get(compress_ratio)
    if kind is None:
        allowed = ", ".join(str(r) for r in table)
        raise ConfigError(
            "compress_ratios", f"unsupported compress ratio {compress_ratio} for {model_version} (allowed: {allowed})"
        )
    return kind


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"is not valid YAML{where}: {problem}"


def _json_problem(exc: json.JSONDecodeError) -> str:
    return f"is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"


def _read_settings(path: Path, what: str, parse: Any, parse_error: type[Exception], problem: Any) -> Any:
    """``parse`` of a UTF-8 file; every way it can be unreadable is a ConfigError naming the file."""
    try:
        fh = path.open("r", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read the {what}: {exc.strerror or exc}") from None
    except ValueError as exc:  # a name no file can have (an embedded NUL)
        raise ConfigError(repr(str(path)), f"cannot read the {what}: {exc}") from None
    with fh:
        try:
            return parse(fh)
        except OSError as exc:
            raise ConfigError(str(path), f"cannot read the {what}: {exc.strerror or exc}") from None
        except parse_error as exc:
            raise ConfigError(str(path), problem(exc)) from None
        except UnicodeDecodeError as exc:
            raise ConfigError(str(path), f"is not a UTF-8 text file: {exc.reason}") from None
        except Exception as exc:  # noqa: BLE001
            # The parsers fail on some inputs with their own internals' errors (PyYAML: a ValueError for the
            # date 2001-02-30, a KeyError for ``!!bool maybe``, a RecursionError for deep nesting): the file is
            # then no data either, and says so as the parse errors above do.
            raise ConfigError(
                str(path), f"is not data a {what} can hold ({type(exc).__name__}: {' '.join(str(exc).split())})"
            ) from None


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (data only: no tags that construct objects) that refuses a mapping holding one
    key twice. PyYAML keeps the last value without a word, so a config that states ``window_size`` twice
    would run with whichever came last. Merge keys (``<<: *base``) still merge: a key written beside a
    merge overrides the merged one, as YAML says."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the constructor below reports it
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"key {key_name(key)!r} is given twice (first at line {first.line + 1}); state it once",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _safe_load_unique(stream: Any) -> Any:
    return yaml.load(stream, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass: data only


def load_yaml_mapping(path: str | Path, what: str) -> Mapping[str, Any]:
    """Read a YAML file of settings as data (``yaml.safe_load``'s loader: no tags that construct objects),
    refusing a key given twice (``UniqueKeyLoader``). Every way it can be unusable is a ConfigError naming
    the file: unreadable, not YAML, a duplicate key, empty, or not a mapping."""
    path = Path(path)
    data = _read_settings(path, what, _safe_load_unique, yaml.YAMLError, _yaml_problem)
    if data is None:
        raise ConfigError(str(path), f"is empty; a {what} needs at least one setting")
    if not isinstance(data, Mapping):
        raise ConfigError(str(path), f"must be a mapping of settings, got {type(data).__name__}")
    return data


def load_json_mapping(path: str | Path, what: str) -> Mapping[str, Any]:
    """Read a JSON file of settings (a Hugging Face ``config.json``). Every way it can be unusable is a
    ConfigError naming the file, as ``load_yaml_mapping``: unreadable, not JSON, or not an object."""
    path = Path(path)
    data = _read_settings(path, what, json.load, json.JSONDecodeError, _json_problem)
    if not isinstance(data, Mapping):
        raise ConfigError(str(path), f"must hold a JSON object of settings, got {type(data).__name__}")
    return data


def dspark_index_width(window_size: int, num_speculative_tokens: int) -> int:
    """docs/semantics.md #dspark-rows: a DSpark row holds the window plus the draft block, padded to FlashMLA's tile."""
    return math.ceil((window_size + num_speculative_tokens) / INDEX_TILE) * INDEX_TILE


# The settings a config file (``from_mapping``, ``from_yaml``) must state, each with what it is: values of
# one model or engine, for which any default would be another model's or engine's.
REQUIRED_SETTINGS = {
    "window_size": "the model's sliding window (sliding_window in its config.json)",
    "block_size": "the engine's KV-cache page size",
    "compress_ratios": "the model's compress ratio of every layer (compress_ratios in its config.json)",
    "max_model_len": "the engine's longest sequence",
    "max_num_batched_tokens": "the engine's largest step, in tokens",
    "max_num_seqs": "the engine's largest step, in requests",
}
# Compress ratios whose layer type depends on the model version (docs/semantics.md #layer-types-and-schedulers).
AMBIGUOUS_RATIOS = frozenset(
    r
    for r in _LAYER_TYPE_BY_RATIO["deepseek_v4"]
    if r in _LAYER_TYPE_BY_RATIO["deepseek_v41"]
    and _LAYER_TYPE_BY_RATIO["deepseek_v4"][r] != _LAYER_TYPE_BY_RATIO["deepseek_v41"][r]
)


def swapped_hint(data: Mapping[Any, Any], other: str, theirs: Collection[str]) -> str:
    """The end of an "unknown key" error for settings that are the ``other`` kind of file (a scenario given
    as a config, or a config as a scenario), whose keys are ``theirs``: most of the settings' keys are that
    kind's, so the two files are probably swapped. Empty otherwise."""
    keys = {k for k in data if isinstance(k, str)} - {"name", "description"}
    theirs = set(theirs)
    if keys and len(keys & theirs) * 2 > len(keys):
        mine = "config" if other == "scenario" else "scenario"
        flag = "--batch" if other == "scenario" else "--config"
        return (
            f". This is a {other} file ({', '.join(sorted(keys & theirs)[:3])}, ...): were the config and the "
            f"scenario swapped? (swa-hal takes a {other} with {flag}, the {mine} with "
            f"{'--config' if flag == '--batch' else '--batch'})"
        )
    return ""


def unknown_key(key: Any, what: str, source: str, known: Sequence[str]) -> ConfigError:
    """The error of a key of a settings file that is none of ``known`` (the ``what`` of ``source``, such as "setting"
    or "group key"), naming it, the known key it is most alike where one is close, and every known key."""
    name = key_name(key)
    close = closest(str(key), known)
    hint = f"did you mean {close!r}? " if close else ""
    return ConfigError(name, f"unknown {what} in {source} ({hint}known: {', '.join(known)})")


def key_name(key: Any) -> str:
    """A key of a settings file as an error names it: as written, or quoted where it holds a line break or
    another character that would not print (an error is one line)."""
    text = str(key)
    return text if text.isprintable() and text.strip() == text and text else repr(text)


def _reason(exc: ConfigError) -> str:
    """A ConfigError's message without its leading field."""
    return str(exc).removeprefix(f"{exc.field}: ")


def _is_integer(value: Any) -> bool:
    """An integer setting: a Python or numpy integer (``numbers.Integral``: what an engine computes its
    sizes with), never a bool (True is an int to Python, not a size) or a float."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


# The integer settings and their ranges (the constructor checks them; ``from_hf_config`` checks the model's
# among them before it asks for missing engine settings, so a bad value is named before a missing one).
INTEGER_SETTINGS = (
    ("window_size", 1, MAX_ROW_WIDTH),
    ("block_size", 1, INT32_LIMIT),
    ("max_model_len", 1, INT32_LIMIT),
    ("max_num_batched_tokens", 1, INT32_LIMIT),
    ("max_num_seqs", 1, INT32_LIMIT),
    ("num_speculative_tokens", 0, 1024),
    ("head_size", 1, INT32_LIMIT),
)


def _check_int(field: str, value: Any, minimum: int, maximum: int = INT32_LIMIT) -> int:
    """``value`` as a Python int, or a ConfigError naming the field, the value and the range."""
    if not _is_integer(value):
        raise ConfigError(field, f"must be an integer, got {value!r}")
    value = int(value)
    if not minimum <= value <= maximum:
        raise ConfigError(field, f"{value} is outside [{minimum}, {maximum}]")
    return value


@dataclasses.dataclass(frozen=True)
class SWAConfig:
    window_size: int = 128
    block_size: int = 64
    compress_ratios: tuple[int, ...] = (1,)
    max_model_len: int = 65536
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    num_speculative_tokens: int = 0
    parallel_drafting: bool = False
    speculative_method: str | None = None
    # The decode threshold as the engine computes it (docs/semantics.md #split; engines change their rule
    # between releases, so an engine plugin passes the engine's own value). None: derived from drafting.
    split_threshold: int | None = None
    head_size: int = 512
    # Pages in the SWA KV cache. Optional: when given, validation checks block ids against it.
    num_kv_blocks: int | None = None
    # "deepseek_v4" or "deepseek_v41": decides the layer type of each compress ratio.
    model_version: str = "deepseek_v4"
    # M of the vision variant (V4 only): prefill rows are window_size + M wide (docs/semantics.md #vision-spans).
    max_image_tokens: int = 0
    # SWA KV-cache groups the engine builds for in one step (docs/semantics.md #group-builds): the
    # builder keeps this many sets of per-group buffers for build_groups().
    num_kv_groups: int = 1

    def __post_init__(self) -> None:
        # Each integer setting is checked and kept as a Python int (a numpy integer is one too, and the
        # config must compare, hash and serialise as the same settings written as plain integers).
        for field, low, high in INTEGER_SETTINGS:
            object.__setattr__(self, field, _check_int(field, getattr(self, field), low, high))
        if self.model_version not in MODEL_VERSIONS:
            raise ConfigError("model_version", f"{self.model_version!r} is not one of {', '.join(MODEL_VERSIONS)}")
        object.__setattr__(self, "max_image_tokens", _check_int("max_image_tokens", self.max_image_tokens, 0, 1 << 20))
        object.__setattr__(self, "num_kv_groups", _check_int("num_kv_groups", self.num_kv_groups, 1, 1024))
        if self.max_image_tokens and self.model_version != "deepseek_v4":
            raise ConfigError(
                "max_image_tokens", f"the vision variant exists for deepseek_v4 only, not {self.model_version}"
            )
        if not isinstance(self.parallel_drafting, bool):
            raise ConfigError("parallel_drafting", f"must be true or false, got {self.parallel_drafting!r}")
        ratios = self.compress_ratios
        if isinstance(ratios, (str, bytes)) or not isinstance(ratios, (list, tuple)):
            raise ConfigError("compress_ratios", f"must be a list of integers, got {ratios!r}")
        if len(ratios) == 0:
            raise ConfigError("compress_ratios", "must name at least one layer")
        for i, ratio in enumerate(ratios):
            try:
                layer_type_for(ratio, self.model_version)
            except ConfigError as exc:
                raise ConfigError(f"compress_ratios[{i}]", str(exc).split(": ", 1)[1]) from None
        object.__setattr__(self, "compress_ratios", tuple(int(r) for r in ratios))
        method = self.speculative_method
        if method is not None:
            if not isinstance(method, str) or method.strip().lower() not in SPECULATIVE_METHODS:
                raise ConfigError(
                    "speculative_method", f"{method!r} is not one of {', '.join(SPECULATIVE_METHODS)} (or null)"
                )
            object.__setattr__(self, "speculative_method", method.strip().lower())
        if self.num_speculative_tokens > 0 and self.speculative_method is None:
            raise ConfigError(
                "num_speculative_tokens",
                f"{self.num_speculative_tokens} draft tokens need a speculative_method (mtp, dspark, ...)",
            )
        if self.parallel_drafting and self.num_speculative_tokens == 0:
            raise ConfigError("parallel_drafting", "needs num_speculative_tokens > 0")
        if self.split_threshold is not None:
            # A verification query (1 + N tokens) is always a decode; no decode is longer than a step.
            threshold = _check_int(
                "split_threshold",
                self.split_threshold,
                1 + self.num_speculative_tokens,
                max(1 + self.num_speculative_tokens, self.max_num_batched_tokens),
            )
            object.__setattr__(self, "split_threshold", threshold)
        if self.num_kv_blocks is not None:
            object.__setattr__(self, "num_kv_blocks", _check_int("num_kv_blocks", self.num_kv_blocks, 1))
            if self.num_kv_blocks * self.block_size > INT32_LIMIT + 1:
                raise ConfigError(
                    "num_kv_blocks",
                    f"{self.num_kv_blocks} pages x block_size {self.block_size} = "
                    f"{self.num_kv_blocks * self.block_size} slots overflow the int32 slot ids FlashMLA reads",
                )
        if self.max_model_len + self.window_size + self.num_speculative_tokens > INT32_LIMIT:
            raise ConfigError("max_model_len", f"{self.max_model_len} overflows int32 positions")
        self._check_row_widths()

    def _check_row_widths(self) -> None:
        """Every row width the buffers hold, against what the kernels can address: a row fits one Triton
        tensor (``MAX_ROW_WIDTH``), and a buffer's last entry, ``max_num_batched_tokens * width - 1``, is
        an int32 offset (the kernels store row ``t`` at ``t * width``)."""
        widths = [("window_size", self.window_size)]
        if self.max_image_tokens:
            widths.append(("max_image_tokens", self.prefill_index_width))
        if self.is_dspark:
            widths.append(("num_speculative_tokens", self.noncausal_index_width))
        for field, width in widths:
            if width > MAX_ROW_WIDTH:
                raise ConfigError(
                    field,
                    f"rows {width} entries wide (window_size {self.window_size}, max_image_tokens "
                    f"{self.max_image_tokens}, num_speculative_tokens {self.num_speculative_tokens}) exceed "
                    f"{MAX_ROW_WIDTH}, the widest row a kernel holds",
                )
        field, width = max(widths, key=lambda item: item[1])
        if self.max_num_batched_tokens * width > INT32_LIMIT + 1:
            raise ConfigError(
                "max_num_batched_tokens",
                f"{self.max_num_batched_tokens} token rows x {width} entries (the widest row, set by {field}) = "
                f"{self.max_num_batched_tokens * width} entries: the kernels' int32 offsets reach "
                f"{INT32_LIMIT + 1} at most",
            )

    # -- derived values -------------------------------------------------------------------------

    @property
    def decode_threshold(self) -> int:
        """docs/semantics.md #split: the longest query that still counts as a decode (the engine's
        ``split_threshold`` when given)."""
        if self.split_threshold is not None:
            return self.split_threshold
        return 1 + (2 if self.parallel_drafting else 1) * self.num_speculative_tokens

    @property
    def is_dspark(self) -> bool:
        return self.speculative_method == "dspark"

    @property
    def noncausal_index_width(self) -> int:
        """Width of DSpark non-causal rows; 0 when DSpark is not configured."""
        return dspark_index_width(self.window_size, self.num_speculative_tokens) if self.is_dspark else 0

    @property
    def layer_types(self) -> tuple[str, ...]:
        """The layer types present in the model, in LAYER_TYPES order."""
        present = {layer_type_for(r, self.model_version) for r in self.compress_ratios}
        return tuple(t for t in LAYER_TYPES if t in present)

    @property
    def prefill_index_width(self) -> int:
        """Width of prefill rows: the window plus M image tokens of the vision variant."""
        return self.window_size + self.max_image_tokens

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["compress_ratios"] = list(self.compress_ratios)
        return out

    # -- loaders -------------------------------------------------------------------------------

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "config") -> SWAConfig:
        """A config from settings (a config file's mapping). Unlike the constructor, whose defaults serve
        code and tests, a mapping must state every setting in ``REQUIRED_SETTINGS``: a config file that
        leaves out its window or its capacities would otherwise run with values of another model or engine,
        and nothing would say so. ``model_version`` is required where ratio 1 makes the layer types depend
        on it (``AMBIGUOUS_RATIOS``). ``name`` and ``description`` are comments for people."""
        if not isinstance(data, Mapping):
            raise ConfigError(source, f"must be a mapping of settings, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        settings = {}
        for key, value in data.items():
            if key in ("name", "description"):
                continue
            if key not in known:
                raise unknown_key(key, "setting", source, sorted(known))
            settings[key] = value
        missing = [key for key in REQUIRED_SETTINGS if key not in settings]
        if missing:
            also = f"; also missing: {', '.join(missing[1:])}" if len(missing) > 1 else ""
            raise ConfigError(
                missing[0],
                f"missing from {source}: a config states {REQUIRED_SETTINGS[missing[0]]}, which has no default "
                f"that fits every model and engine{also}",
            )
        ratios = settings["compress_ratios"]
        if isinstance(ratios, list):
            settings["compress_ratios"] = ratios = tuple(ratios)
        if "model_version" not in settings and isinstance(ratios, tuple):
            ambiguous = sorted({int(r) for r in ratios if _is_integer(r) and r in AMBIGUOUS_RATIOS})
            if ambiguous:
                raise ConfigError(
                    "model_version",
                    f"missing from {source}, whose compress_ratios include {', '.join(map(str, ambiguous))}: the "
                    f"layer type of that ratio differs between {' and '.join(MODEL_VERSIONS)}, so the config "
                    f"must say which model it describes",
                )
        return cls(**settings)

    @classmethod
    def from_yaml(cls, path: str | Path) -> SWAConfig:
        """Load a config file. YAML is data here: safe_load only, no tags that construct objects."""
        return cls.from_mapping(load_yaml_mapping(path, "config"), source=str(path))

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | Path | Any, **engine_settings: Any) -> SWAConfig:
        """Build from a Hugging Face model config (a dict, a ``config.json`` file or its folder, or a loaded
        config object such as ``transformers.AutoConfig.from_pretrained(path)``) plus engine settings.

        The model gives ``sliding_window``, the compress ratio of every layer (DeepSeek's ``compress_ratios``,
        or the upstream ``layer_types`` with ``compress_rates`` and ``num_nextn_predict_layers``:
        ``swa_hal.hf_config``; neither is a ConfigError), ``head_dim`` and ``max_position_embeddings`` (the
        default ``max_model_len``); the engine gives the rest (``block_size``, ``max_num_batched_tokens``,
        ``max_num_seqs``, speculative settings, ...). As for a config file (``from_mapping``), every setting
        of ``REQUIRED_SETTINGS`` must come from one of them: ``block_size``, ``max_num_batched_tokens`` and
        ``max_num_seqs`` always from the engine (a config.json has none of them), ``max_model_len`` from the
        engine where the model has no ``max_position_embeddings``; a missing one is a ConfigError naming it,
        never the constructor's default (another engine's capacities). A bad value the model gives is named
        (its key and the file) before a missing engine setting is.
        """
        source = "the model config"
        fields = as_mapping(config)
        if fields is None:
            if not isinstance(config, (str, os.PathLike)):
                raise ConfigError(
                    "config",
                    f"must be a mapping, a config.json file or its folder, or a config object with to_dict(), "
                    f"got {type(config).__name__}",
                )
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            fields = load_json_mapping(path, "model config")
            source = str(path)
        settings, ratios = _model_settings(fields, source)
        from_model = set(settings)
        known = {f.name for f in dataclasses.fields(cls)}
        for key, value in engine_settings.items():
            if key not in known or key in MODEL_SETTINGS:
                raise ConfigError(
                    key, f"is not an engine setting (engine settings: {', '.join(sorted(known - MODEL_SETTINGS))})"
                )
            settings[key] = value
            from_model.discard(key)
        for field, low, high in INTEGER_SETTINGS:  # a bad value the model gives is named before a missing one
            if field in from_model:
                try:
                    _check_int(field, settings[field], low, high)
                except ConfigError as exc:
                    raise _model_error(exc, ratios, source) from None
        missing = [key for key in REQUIRED_SETTINGS if key not in settings]
        if missing:
            also = f"; also missing: {', '.join(missing[1:])}" if len(missing) > 1 else ""
            first = missing[0]
            because = f"{source} has no max_position_embeddings, so " if first == "max_model_len" else ""
            raise ConfigError(
                first,
                f"missing: {because}pass {first}=..., {REQUIRED_SETTINGS[first]}; no default fits every engine{also}",
            )
        try:
            return cls(**settings)
        except ConfigError as exc:
            name = exc.field.partition("[")[0]
            raise (_model_error(exc, ratios, source) if name in from_model else exc) from None


# The settings a model config gives (``from_hf_config``): an engine passes none of them.
MODEL_SETTINGS = frozenset({"window_size", "compress_ratios", "head_size", "model_version", "max_image_tokens"})


def _model_settings(fields: Mapping[str, Any], source: str) -> tuple[dict[str, Any], LayerRatios]:
    """The settings a Hugging Face model config gives, and where its ratios were read from."""
    if fields.get("sliding_window") is None:
        raise ConfigError("sliding_window", f"{source} has no sliding_window; this is not an SWA model")
    try:
        version = model_version_of(fields)
    except ConfigError as exc:
        raise ConfigError(exc.field, f"{_reason(exc)} (in {source})") from None
    settings: dict[str, Any] = {"window_size": fields["sliding_window"], "model_version": version}
    if fields.get("head_dim") is not None:
        settings["head_size"] = fields["head_dim"]
    if fields.get("max_position_embeddings") is not None:
        settings["max_model_len"] = fields["max_position_embeddings"]
    # The vision variant of V4 widens prefill rows by its largest image (docs/semantics.md #vision-spans).
    layers = fields.get("vision_n_layers") or 0
    if not _is_integer(layers) or layers < 0:
        raise ConfigError("vision_n_layers", f"must be a non-negative integer, got {layers!r} (in {source})")
    if version == "deepseek_v4" and layers > 0:
        settings["max_image_tokens"] = fields.get("vision_max_n_token") or 0
    try:
        ratios = layer_ratios(fields)
    except ConfigError as exc:
        raise ConfigError(exc.field, f"{_reason(exc)} (in {source})") from None
    settings["compress_ratios"] = ratios.values
    return settings, ratios


def _model_error(exc: ConfigError, ratios: LayerRatios, source: str) -> ConfigError:
    """``exc``, about a value a model config gave, naming its key there (``HF_KEYS``; a ratio's through
    ``ratios``) and the file."""
    name, _, index = exc.field.partition("[")
    if name not in HF_KEYS:
        return exc
    if name == "compress_ratios":
        where = ratios.key(index.rstrip("]"))
    else:
        where = HF_KEYS[name] + ("[" + index if index else "")
    return ConfigError(where, f"{_reason(exc)} (SWAConfig.{exc.field}, in {source})")
