"""Batch scenarios: YAML descriptions of a step (configs/batches/), turned into AttentionBatch.

A scenario is data (``yaml.safe_load``)::

    name: mixed
    seed: 3
    config: deepseek_v4_flash.yaml      # the config it is meant for (optional; see config_file)
    groups:                              # in batch order: decodes first
      - {count: 64, query_len: 1, seq_len: [512, 8192]}
      - {count: 4, query_len: 2048, seq_len: [2048, 6144]}
    padding_rows: 0                      # extra token rows past the real ones (slot -1)
    padding_requests: 0                  # requests with no tokens (query_len 0, seq_len 0)
    invalid_tokens: 0                    # real tokens whose slot is -1
    causal: true
    replay: none                         # replay bounds: none | prefix | window | random
    images_per_prefill: 0                # image spans in each prefill's new tokens (vision configs)
    image_tokens: 0                      # tokens per image (<= the config's max_image_tokens)

Nothing is repaired: a value a key does not take is a ``ConfigError`` naming the key (``groups[1].seq_len``).
Each group has ``count >= 1`` and ``query_len <= lo <= hi``; ``invalid_tokens`` is at most the groups' tokens.
``images_per_prefill`` and ``image_tokens`` go together (both 0, or both positive).

A scenario runs on a config only as written (``check_config``, which ``make_batch`` calls): every ``seq_len``
within ``max_model_len``, the requests (counts plus ``padding_requests``) within ``max_num_seqs``, the token
rows (``count x query_len`` plus ``padding_rows``) within ``max_num_batched_tokens``; image spans need a vision
config (``max_image_tokens`` neither 0, where the spans would be ignored, nor smaller than ``image_tokens``)
and prefills whose new tokens hold ``images_per_prefill x image_tokens``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .batch import AttentionBatch
from .config import SWAConfig, key_name, load_yaml_mapping, swapped_hint, unknown_key
from .errors import ConfigError

REPLAY_MODES = ("none", "prefix", "window", "random")


@dataclasses.dataclass(frozen=True)
class Group:
    count: int
    query_len: int
    seq_len: tuple[int, int]


GROUP_KEYS = ("count", "query_len", "seq_len")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _group(i: int, data: Any, source: str) -> Group:
    """``groups[i]`` of a scenario: ``count`` requests (at least 1) of ``query_len`` new tokens each, with
    sequence lengths drawn from ``seq_len`` (an integer, or ``[lo, hi]`` with ``query_len <= lo <= hi``)."""
    where = f"groups[{i}]"
    if not isinstance(data, Mapping):
        raise ConfigError(where, f"must be a mapping of {', '.join(GROUP_KEYS)} in {source}, got {data!r}")
    unknown = sorted((k for k in data if k not in GROUP_KEYS), key=key_name)
    if unknown:
        error = unknown_key(unknown[0], "group key", source, GROUP_KEYS)
        raise ConfigError(f"{where}.{error.field}", error.message)
    for key in GROUP_KEYS:
        if key not in data:
            raise ConfigError(f"{where}.{key}", f"missing in {source}: a group needs {', '.join(GROUP_KEYS)}")
    count, query_len, seq_len = data["count"], data["query_len"], data["seq_len"]
    if not _is_int(count) or count < 1:
        raise ConfigError(
            f"{where}.count", f"must be an integer >= 1 in {source} (requests in the group), got {count!r}"
        )
    if not _is_int(query_len) or query_len < 0:
        raise ConfigError(f"{where}.query_len", f"must be a non-negative integer in {source}, got {query_len!r}")
    if _is_int(seq_len):
        lo = hi = seq_len
    elif isinstance(seq_len, (list, tuple)) and len(seq_len) == 2 and all(_is_int(v) for v in seq_len):
        lo, hi = seq_len
    else:
        raise ConfigError(
            f"{where}.seq_len", f"must be an integer or [lo, hi] of integers in {source}, got {seq_len!r}"
        )
    if not query_len <= lo <= hi:
        raise ConfigError(
            f"{where}.seq_len",
            f"{seq_len!r} in {source} breaks query_len <= lo <= hi (query_len {query_len}): a sequence holds its "
            f"new tokens",
        )
    return Group(count, query_len, (lo, hi))


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    groups: tuple[Group, ...]
    seed: int = 0
    padding_rows: int = 0
    padding_requests: int = 0
    invalid_tokens: int = 0
    causal: bool = True
    config: str | None = None
    description: str = ""
    replay: str = "none"
    images_per_prefill: int = 0
    image_tokens: int = 0

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "scenario") -> Scenario:
        """A scenario from its settings. Every value is checked as written, never repaired: a value that
        is not what its key takes is a ConfigError naming the key (``groups[i].count`` for a group's)."""
        if not isinstance(data, Mapping):
            raise ConfigError(source, "a scenario must be a mapping")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted((k for k in data if k not in known), key=key_name)
        if unknown:
            hint = swapped_hint(data, "config", {f.name for f in dataclasses.fields(SWAConfig)})
            error = unknown_key(unknown[0], "scenario key", source, sorted(known))
            raise ConfigError(error.field, f"{error.message}{hint}")
        raw_groups = data.get("groups")
        if not isinstance(raw_groups, list) or not raw_groups:
            raise ConfigError(
                "groups",
                f"{source} describes no requests: groups must be a non-empty list of "
                f"{{count, query_len, seq_len}}, got {raw_groups!r}",
            )
        groups = tuple(_group(i, g, source) for i, g in enumerate(raw_groups))
        fields = {k: data[k] for k in known - {"groups"} if k in data}
        for key in ("name", "description"):
            if key in fields and not isinstance(fields[key], str):
                raise ConfigError(key, f"must be a string in {source}, got {fields[key]!r}")
        replay = fields.get("replay", "none")
        if not isinstance(replay, str) or replay not in REPLAY_MODES:
            raise ConfigError("replay", f"{replay!r} is not one of {', '.join(REPLAY_MODES)}")
        for key in ("seed", "padding_rows", "padding_requests", "invalid_tokens", "images_per_prefill", "image_tokens"):
            value = fields.get(key, 0)
            if not _is_int(value) or value < 0:
                raise ConfigError(key, f"must be a non-negative integer in {source}, got {value!r}")
        if not isinstance(fields.get("causal", True), bool):
            raise ConfigError("causal", f"must be true or false in {source}, got {fields['causal']!r}")
        images, tokens = fields.get("images_per_prefill", 0), fields.get("image_tokens", 0)
        if bool(images) != bool(tokens):
            zero, other = ("image_tokens", "images_per_prefill") if images else ("images_per_prefill", "image_tokens")
            raise ConfigError(
                zero,
                f"is 0 in {source} but {other} is {images or tokens}: image spans need both "
                f"(images_per_prefill spans of image_tokens tokens in each prefill), or neither",
            )
        real_tokens = sum(g.count * g.query_len for g in groups)
        if real_tokens + fields.get("padding_rows", 0) == 0:
            raise ConfigError(
                "groups",
                f"{source} has no token rows (every query_len is 0, and padding_rows is 0): a step has at least one",
            )
        if fields.get("invalid_tokens", 0) > real_tokens:
            raise ConfigError(
                "invalid_tokens",
                f"{fields['invalid_tokens']} in {source}, but its groups have {real_tokens} tokens: at most that many "
                f"can lack a KV slot",
            )
        if "config" in fields and (not isinstance(fields["config"], str) or not fields["config"].strip()):
            raise ConfigError("config", f"must be the path of a config file in {source}, got {fields['config']!r}")
        return cls(groups=groups, **{"name": Path(source).stem, **fields})

    @classmethod
    def from_yaml(cls, path: str | Path) -> Scenario:
        return cls.from_mapping(load_yaml_mapping(path, "scenario"), str(path))

    def config_file(self, scenario_path: str | Path) -> Path | None:
        """The config file this scenario names (``config:``), for a scenario read from ``scenario_path``;
        None when it names none. A relative name is looked up in the folder above the scenario's, where the
        configs of a folder of scenarios live (``configs/batches/mixed.yaml`` names ``deepseek_v4_flash.yaml``,
        ``configs/deepseek_v4_flash.yaml``), then beside the scenario; never the scenario file itself."""
        if self.config is None:
            return None
        named = Path(self.config).expanduser()
        here = Path(scenario_path).parent
        tried = [named] if named.is_absolute() else [here.parent / named, here / named]
        for path in tried:
            if path.is_file() and not path.samefile(scenario_path):
                return path
        raise ConfigError(
            "config",
            f"scenario {self.name!r} ({scenario_path}) names config {self.config!r}, which is not a config file "
            f"(looked for {' and '.join(str(p) for p in tried)})",
        )

    def check_config(self, config: SWAConfig) -> None:
        """Raise a ConfigError unless this scenario can run on ``config`` as written, with nothing clamped or
        dropped: every sequence within ``max_model_len``, the requests within ``max_num_seqs``, the token rows
        within ``max_num_batched_tokens``; image spans need a vision config (``max_image_tokens > 0``; with 0
        the spans would be ignored) that fits them, and every prefill's new tokens must hold its images whole."""
        for i, g in enumerate(self.groups):
            if g.seq_len[1] > config.max_model_len:
                raise ConfigError(
                    f"groups[{i}].seq_len",
                    f"{g.seq_len[1]} is past the config's max_model_len {config.max_model_len} (scenario "
                    f"{self.name!r}): lower the group's seq_len, or use a config with a longer max_model_len",
                )
        requests = sum(g.count for g in self.groups) + self.padding_requests
        if requests > config.max_num_seqs:
            raise ConfigError(
                "groups",
                f"scenario {self.name!r} has {requests} requests (counts plus padding_requests), past the config's "
                f"max_num_seqs {config.max_num_seqs}",
            )
        rows = sum(g.count * g.query_len for g in self.groups) + self.padding_rows
        if rows > config.max_num_batched_tokens:
            raise ConfigError(
                "groups",
                f"scenario {self.name!r} has {rows} token rows (count x query_len of each group plus padding_rows), "
                f"past the config's max_num_batched_tokens {config.max_num_batched_tokens}",
            )
        if not self.images_per_prefill:
            return
        spans = f"scenario {self.name!r} has image spans ({self.images_per_prefill} per prefill, {self.image_tokens} tokens each)"
        if config.max_image_tokens == 0:
            raise ConfigError(
                "image_tokens",
                f"{spans} but the config has max_image_tokens 0 (no vision variant), so they would be ignored: "
                f"use a vision config (max_image_tokens > 0), or drop images_per_prefill and image_tokens",
            )
        if self.image_tokens > config.max_image_tokens:
            raise ConfigError(
                "image_tokens",
                f"{spans} but the config's max_image_tokens is {config.max_image_tokens}: an image span holds "
                f"at most max_image_tokens tokens",
            )
        need = self.images_per_prefill * self.image_tokens
        for i, g in enumerate(self.groups):
            if config.decode_threshold < g.query_len < need:
                raise ConfigError(
                    f"groups[{i}].query_len",
                    f"{g.query_len} new tokens cannot hold {spans}: a prefill of this scenario needs at least {need}",
                )

    def make_batch(self, config: SWAConfig, device: str | torch.device = "cpu") -> AttentionBatch:
        self.check_config(config)
        rng = random.Random(self.seed)
        seq_lens, query_lens = [], []
        for g in self.groups:
            for _ in range(g.count):
                seq_lens.append(rng.randint(*g.seq_len))  # within max_model_len: check_config said so
                query_lens.append(g.query_len)
        seq_lens += [0] * self.padding_requests
        query_lens += [0] * self.padding_requests
        return synthesize_batch(
            config,
            seq_lens,
            query_lens,
            rng=rng,
            padding_rows=self.padding_rows,
            invalid_tokens=self.invalid_tokens,
            causal=self.causal,
            device=device,
            replay_start=self._replay(config, rng, seq_lens, query_lens),
            image_spans=self._images(config, seq_lens, query_lens),
        )

    def _replay(self, config: SWAConfig, rng: random.Random, seq_lens: list[int], query_lens: list[int]):
        """docs/semantics.md #bounded-replay: bounds at the prefix, at the first new token's window
        start plus one (inside its window), or anywhere in [0, prefix]."""
        if self.replay == "none":
            return None
        prefixes = [s - q for s, q in zip(seq_lens, query_lens)]
        if self.replay == "prefix":
            return prefixes
        if self.replay == "window":
            return [min(p, max(0, p - config.window_size + 2)) for p in prefixes]
        return [rng.randint(0, p) for p in prefixes]

    def _images(self, config: SWAConfig, seq_lens: list[int], query_lens: list[int]):
        """Evenly spaced image spans of ``image_tokens`` in the new tokens of every prefill."""
        if not self.images_per_prefill or not self.image_tokens:
            return None
        spans: dict[int, list[tuple[int, int]]] = {}
        for r, (s, q) in enumerate(zip(seq_lens, query_lens)):
            if q <= config.decode_threshold:
                continue
            step = q // self.images_per_prefill
            length = min(self.image_tokens, step)
            if length < 1:
                continue
            spans[r] = [(s - q + k * step, s - q + k * step + length - 1) for k in range(self.images_per_prefill)]
        return spans


def synthesize_batch(
    config: SWAConfig,
    seq_lens: Sequence[int],
    query_lens: Sequence[int],
    *,
    rng: random.Random,
    padding_rows: int = 0,
    invalid_tokens: int = 0,
    causal: bool = True,
    extra_pages: int = 0,
    device: str | torch.device = "cpu",
    replay_start: Sequence[int] | None = None,
    image_spans: Mapping[int, Sequence[tuple[int, int]]] | None = None,
) -> AttentionBatch:
    """A valid batch with the given lengths: every request owns distinct, shuffled physical pages
    (exactly as many as it needs, plus ``extra_pages`` for growth; shorter rows are padded with -1),
    the slot mapping follows the table, and ``invalid_tokens`` random real tokens get slot -1.
    ``replay_start`` and ``image_spans`` pass through to the batch."""
    block = config.block_size
    pages_needed = [max(1, -(-s // block)) + extra_pages for s in seq_lens]
    width = max(pages_needed)
    gen = torch.Generator().manual_seed(rng.getrandbits(62))
    pool = torch.randperm(sum(pages_needed) + 8, generator=gen, dtype=torch.int64).to(torch.int32)
    table = torch.full((len(pages_needed), width), -1, dtype=torch.int32)
    cursor = 0
    for r, n in enumerate(pages_needed):
        table[r, :n] = pool[cursor : cursor + n]
        cursor += n
    batch = AttentionBatch.from_lists(
        seq_lens,
        query_lens,
        table,
        num_tokens=sum(query_lens) + padding_rows,
        causal=causal,
        device="cpu",
        block_size=block,
        replay_start=replay_start,
        image_spans=image_spans,
    )
    real = sum(query_lens)
    if invalid_tokens and real:
        slots = batch.slot_mapping.clone()
        for t in rng.sample(range(real), min(invalid_tokens, real)):
            slots[t] = -1
        batch = dataclasses.replace(batch, slot_mapping=slots)
    return batch.to(device) if torch.device(device).type != "cpu" else batch
