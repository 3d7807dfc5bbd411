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

``images_per_prefill`` and ``image_tokens`` go together (both 0, or both positive), and image spans need a
vision config: ``make_batch`` raises a ``ConfigError`` for a config whose ``max_image_tokens`` is 0 (where
the spans would be ignored) or smaller than ``image_tokens``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .batch import AttentionBatch
from .config import SWAConfig, load_yaml_mapping
from .errors import ConfigError

REPLAY_MODES = ("none", "prefix", "window", "random")


@dataclasses.dataclass(frozen=True)
class Group:
    count: int
    query_len: int
    seq_len: tuple[int, int]


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
        if not isinstance(data, Mapping):
            raise ConfigError(source, "a scenario must be a mapping")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(
                sorted(unknown)[0], f"unknown scenario key in {source} (known: {', '.join(sorted(known))})"
            )
        groups = []
        for i, g in enumerate(data.get("groups") or []):
            try:
                lo_hi = g["seq_len"]
                lo, hi = (lo_hi, lo_hi) if isinstance(lo_hi, int) else (int(lo_hi[0]), int(lo_hi[1]))
                groups.append(Group(int(g["count"]), int(g["query_len"]), (lo, hi)))
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise ConfigError(f"groups[{i}]", f"needs count, query_len, seq_len (int or [lo, hi]): {exc}") from None
            if groups[-1].count < 0 or groups[-1].query_len < 0 or lo > hi or lo < groups[-1].query_len:
                raise ConfigError(f"groups[{i}]", "needs count >= 0, query_len >= 0 and query_len <= seq_len lo <= hi")
        if not groups:
            raise ConfigError("groups", f"{source} describes no requests")
        fields = {k: data[k] for k in known - {"groups"} if k in data}
        if fields.get("replay", "none") not in REPLAY_MODES:
            raise ConfigError("replay", f"{fields['replay']!r} is not one of {', '.join(REPLAY_MODES)}")
        for key in ("seed", "padding_rows", "padding_requests", "invalid_tokens", "images_per_prefill", "image_tokens"):
            value = fields.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
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
        if "config" in fields and (not isinstance(fields["config"], str) or not fields["config"].strip()):
            raise ConfigError("config", f"must be the path of a config file in {source}, got {fields['config']!r}")
        return cls(groups=tuple(groups), **{"name": Path(source).stem, **fields})

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
        """Raise a ConfigError unless this scenario can run on ``config`` as written: image spans need a
        vision config (``max_image_tokens > 0``; with 0 the spans would be ignored) that fits them."""
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

    def make_batch(self, config: SWAConfig, device: str | torch.device = "cpu") -> AttentionBatch:
        self.check_config(config)
        rng = random.Random(self.seed)
        seq_lens, query_lens = [], []
        for g in self.groups:
            for _ in range(g.count):
                hi = min(g.seq_len[1], config.max_model_len)
                lo = min(g.seq_len[0], hi)
                seq_lens.append(rng.randint(lo, hi))
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
