"""Conformance topic: token-slot rows (docs/semantics.md #token-slot-rows), the layout of engines that address
their cache through ``req_to_token`` (SGLang), and their ring flavour (docs/semantics.md #ring-rows, a
per-request SWA ring). Every backend has them: its own kernel, or the torch backend's build it inherits.
Compared with that build (``swa_hal.torch_backend.slot_rows.build_slot_rows``) bit for bit on the worked
vectors and random calls; a
guarded call on garbage input hands out only -1 or slots of the cache (ring rows: rows of the ring)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

from ..builder import SWAMetadataBuilder
from ..config import SWAConfig
from ..slot_ring import SlotRing
from ..slot_rows import SlotRows, slot_limit
from ..torch_backend.slot_rows import build_slot_rows
from .fixtures import BackendFixtures, MakeBuilder, Target, expect_equal
from .interpreter import address_strict

WINDOWS = (8, 20, 128)


def slot_rows_config(window: int, **kw: Any) -> SWAConfig:
    """A config for token-slot rows: only the window (and the cache size, when given) matters."""
    return SWAConfig(
        window_size=window, block_size=64, max_model_len=4096, max_num_batched_tokens=16, max_num_seqs=16, **kw
    )


def _causal_rows(
    rng: random.Random, top: int, requests: int, floor_below_the_end: bool = False
) -> tuple[list[int], list[int], list[int] | None]:
    """1-40 causal rows: their ends (up to ``top``, or near 0: padding rows at negative positions), their
    requests (of ``requests``) and, 60% of the time, their floors (0, up to ``top``, below 0, past the
    position and, with ``floor_below_the_end``, just below it)."""
    n = rng.randint(1, 40)
    ends = [rng.choice((rng.randint(1, top), rng.randint(-2, 3))) for _ in range(n)]
    pool_of = [rng.randrange(requests) for _ in range(n)]
    if rng.random() >= 0.6:
        return ends, pool_of, None

    def choices(e: int) -> tuple[int, ...]:
        near = (max(e + 2, 0), max(e - 2, 0)) if floor_below_the_end else (max(e + 2, 0),)
        return (0, rng.randint(0, top), -3, *near)

    return ends, pool_of, [rng.choice(choices(e)) for e in ends]


def random_slot_rows(rng: random.Random, window: int, row_dtype: torch.dtype = torch.int32) -> SlotRows:
    """A random well-formed call: a request pool with some -1 token slots, causal rows (padding rows at
    negative positions, floors below 0, inside the window and past the position) or DSpark blocks of 1-3
    (with or without ``valid_from``), widths aligned to 1, 16 or 64, int32 and int64 inputs."""
    pools, positions = rng.randint(1, 6), rng.randint(window + 10, 3 * window + 40)
    perm = list(range(pools * positions))
    rng.shuffle(perm)
    req_to_token = [
        [perm[r * positions + q] if rng.random() > 0.02 else -1 for q in range(positions)] for r in range(pools)
    ]
    slot_map = [rng.randrange(0, 5000) for _ in range(pools * positions)] + [-1]
    block = rng.choice((0, 0, 1, 2, 3))
    align = rng.choice((1, 16, 64))
    width = -(-(window + block) // align) * align
    floors = None
    block_slots = None
    if block:
        ends, pool_of, block_slots = [], [], []
        for _ in range(rng.randint(1, 9)):
            pool = rng.randrange(pools)
            prefix = rng.randint(0, positions - block)
            ends += [prefix + 1 + j for j in range(block)]
            pool_of += [pool] * block
            block_slots += [rng.randrange(len(slot_map) - 1) for _ in range(block)]
        if rng.random() < 0.6:
            floors = [rng.choice((0, rng.randint(0, positions), positions + 5)) for _ in range(pools)]
    else:
        ends, pool_of, floors = _causal_rows(rng, positions, pools)

    def index(values: list[int] | list[list[int]], dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype or rng.choice((torch.int32, torch.int64)))

    return SlotRows(
        row_ends=index(ends, row_dtype),
        pools=index(pool_of),
        req_to_token=index(req_to_token),
        slot_map=index(slot_map, torch.int64),
        floors=None if floors is None else index(floors),
        block=block,
        block_slots=None if block_slots is None else index(block_slots, torch.int64),
        width=width,
    )


def random_ring_rows(rng: random.Random, window: int, row_dtype: torch.dtype = torch.int32) -> SlotRows:
    """A random well-formed ring-rows call (docs/semantics.md #ring-rows): a ring of 1-6 request slots, as
    long as a row's positions or a page-rounded few rows longer; causal rows (padding rows at negative
    positions, floors below 0, inside the window and past the position) or DSpark blocks of 1-3 (with or
    without ``valid_from``: 0, inside, at or past the prefix), positions far past the ring so rows wrap,
    widths aligned to 1, 16 or 64, int32 and int64 inputs."""
    block = rng.choice((0, 0, 1, 2, 3))
    need = window + block
    size = rng.choice((need, need + rng.randint(1, 5), -(-need // 16) * 16 + 16))
    slots = rng.randint(1, 6)
    align = rng.choice((1, 16, 64))
    width = -(-need // align) * align
    top = rng.choice((3 * size, 40 * size, 5000))
    floors = None
    if block:
        ends, pool_of = [], []
        for _ in range(rng.randint(1, 9)):
            pool = rng.randrange(slots)
            prefix = rng.choice((0, 1, rng.randint(0, window + 2), rng.randint(0, top)))
            ends += [prefix + 1 + j for j in range(block)]
            pool_of += [pool] * block
        if rng.random() < 0.6:
            floors = [rng.choice((0, rng.randint(0, top), top + 5)) for _ in range(slots)]
    else:
        ends, pool_of, floors = _causal_rows(rng, top, slots, floor_below_the_end=True)

    def index(values: list[int], dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype or rng.choice((torch.int32, torch.int64)))

    return SlotRows(
        row_ends=index(ends, row_dtype),
        pools=index(pool_of),
        floors=None if floors is None else index(floors),
        block=block,
        width=width,
        ring=SlotRing(size, slots),
    )


def reference_slot_rows(rows: SlotRows, config: SWAConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch build's rows and lens on the CPU (guard on, nothing recorded for valid input)."""
    cpu = rows.to("cpu")
    width = cpu.row_width(config.window_size)
    out = torch.empty((cpu.num_rows, width), dtype=torch.int32)
    lens = torch.empty(cpu.num_rows, dtype=torch.int32)
    build_slot_rows(
        cpu, config.window_size, out, lens, torch.zeros(4, dtype=torch.int32), guard=True, limit=slot_limit(config)
    )
    return out, lens


def _expect_rows(builder: SWAMetadataBuilder, rows: SlotRows, where: str, lens: list[int], out: Any) -> None:
    """``builder``'s lens and rows for the worked vector ``rows`` (named ``where``) are ``lens`` and ``out``."""
    got_out, got_lens = builder.build_slot_rows(rows)
    expect_equal(got_lens.tolist(), lens, f"{where}: lens")
    expect_equal(got_out.tolist(), out, f"{where}: rows")


class SlotRowTests(BackendFixtures):
    """Token-slot rows: the worked vectors, random calls of every layout, guarded garbage."""

    def _strict(self, target: Target, spec_kernels: str, clamps: bool) -> Any:
        if target.device.type != "cpu" or spec_kernels != "triton":
            return contextlib.nullcontext()
        return address_strict(active_only=not clamps)

    def test_slot_rows_worked_vectors(self, make_builder: MakeBuilder, target: Target) -> None:
        dev = target.device
        builder = make_builder(slot_rows_config(4))
        rt = torch.tensor([[10 + q for q in range(8)], [30 + q for q in range(8)]], dtype=torch.int32, device=dev)
        slot_map = torch.tensor([100 + s for s in range(40)] + [-1], dtype=torch.int64, device=dev)
        causal = SlotRows(
            row_ends=torch.tensor([6, 2, 0, 6], dtype=torch.int32, device=dev),
            pools=torch.zeros(4, dtype=torch.int64, device=dev),
            req_to_token=rt,
            slot_map=slot_map,
            floors=torch.tensor([0, 0, 0, 4], dtype=torch.int32, device=dev),
            width=8,
        )
        want = [
            [115, 114, 113, 112, -1, -1, -1, -1],
            [111, 110, -1, -1, -1, -1, -1, -1],
            [-1] * 8,
            [115, 114, -1, -1, -1, -1, -1, -1],
        ]
        _expect_rows(builder, causal, "token-slot rows worked vector (W=4, causal)", [4, 2, 0, 2], want)
        dspark = SlotRows(
            row_ends=torch.tensor([6, 7, 3, 4], dtype=torch.int32, device=dev),
            pools=torch.tensor([0, 0, 1, 1], dtype=torch.int64, device=dev),
            req_to_token=rt,
            slot_map=slot_map,
            floors=torch.tensor([3, 0], dtype=torch.int64, device=dev),
            block=2,
            block_slots=torch.tensor([15, 16, 32, 33], dtype=torch.int64, device=dev),
            width=8,
        )
        want = [[113, 114, 115, 116, -1, -1, -1, -1]] * 2 + [[130, 131, 132, 133, -1, -1, -1, -1]] * 2
        _expect_rows(builder, dspark, "token-slot rows worked vector (W=4, DSpark blocks of 2)", [4, 4, 4, 4], want)

    def test_ring_rows_worked_vectors(self, make_builder: MakeBuilder, target: Target) -> None:
        """docs/semantics.md #ring-rows, by hand: slot s keeps position q at row s * 6 + q % 6."""
        dev = target.device

        def t(values: list[int], dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=dev)

        builder = make_builder(slot_rows_config(4))
        causal = SlotRows(
            row_ends=t([6, 2, 0, 9]),
            pools=t([1, 2, 0, 1], torch.int64),
            floors=t([0, 0, 0, 7]),
            width=8,
            ring=SlotRing(size=6, slots=3),
        )
        want = [[11, 10, 9, 8] + [-1] * 4, [13, 12] + [-1] * 6, [-1] * 8, [8, 7] + [-1] * 6]
        _expect_rows(builder, causal, "ring rows worked vector (W=4, ring 3 x 6, causal)", [4, 2, 0, 2], want)
        dspark = SlotRows(
            row_ends=t([6, 7, 10, 11]),
            pools=t([0, 0, 1, 1], torch.int64),
            floors=t([3, 0], torch.int64),
            block=2,
            width=8,
            ring=SlotRing(size=6, slots=2),
        )
        want = [[3, 4, 5, 0, -1, -1, -1, -1]] * 2 + [[11, 6, 7, 8, 9, 10, -1, -1]] * 2
        _expect_rows(
            builder, dspark, "ring rows worked vector (W=4, ring 2 x 6, DSpark blocks of 2)", [4, 4, 6, 6], want
        )
        builder.check()

    def _equal_the_reference(
        self,
        draw: Callable[..., SlotRows],
        seed: str,
        spec: Any,
        make_builder: MakeBuilder,
        target: Target,
        window: int,
    ) -> None:
        """Random well-formed calls of ``draw(rng, window, row dtype)`` equal the torch build bit for bit."""
        config = slot_rows_config(window)
        builder = make_builder(config)
        rng = random.Random(seed)
        with self._strict(target, spec.kernels, spec.clamps_addresses):
            for k in range(3 * self.batches_per_case):
                rows = draw(rng, window, (torch.int32, torch.int64)[k % 2])
                want_rows, want_lens = reference_slot_rows(rows, config)
                out, lens = builder.build_slot_rows(rows.to(target.device))
                kind, layout = ("ring", rows.ring) if rows.ring is not None else ("token-slot", f"width {rows.width}")
                call = f"random {kind} rows call {k} (window {window}, block {rows.block}, {layout})"
                assert torch.equal(lens.cpu(), want_lens), (
                    f"{call}: lens differ from the torch build: {lens.tolist()} vs {want_lens.tolist()}"
                )
                assert torch.equal(out.cpu(), want_rows), f"{call}: rows differ from the torch build"
        builder.check()

    @pytest.mark.parametrize("window", WINDOWS)
    def test_ring_rows_equal_the_reference(
        self, name: str, spec: Any, make_builder: MakeBuilder, target: Target, window: int
    ) -> None:
        self._equal_the_reference(random_ring_rows, f"ring-rows-{name}-{window}", spec, make_builder, target, window)

    @pytest.mark.parametrize("window", WINDOWS)
    def test_slot_rows_equal_the_reference(
        self, name: str, spec: Any, make_builder: MakeBuilder, target: Target, window: int
    ) -> None:
        self._equal_the_reference(random_slot_rows, f"slot-rows-{name}-{window}", spec, make_builder, target, window)

    def _guarded_on_garbage(
        self,
        draw: Callable[..., SlotRows],
        config: SWAConfig,
        seed: str,
        tensor_seed: int,
        spec: Any,
        make_builder: MakeBuilder,
        target: Target,
    ) -> None:
        """Guarded calls of ``draw(rng, ints, block, n)`` (``ints(lo, hi, size, dtype)``: random integers on
        the target) on garbage hand out only -1 or slots of the cache (ring rows: rows of the ring), and
        lens inside [0, W + block]."""
        builder = make_builder(config)
        gen = torch.Generator().manual_seed(tensor_seed)
        rng = random.Random(seed)

        def ints(lo: int, hi: int, size: tuple[int, ...], dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.randint(lo, hi, size, generator=gen, dtype=dtype).to(target.device)

        with self._strict(target, spec.kernels, spec.clamps_addresses):
            for _ in range(4):
                block = rng.choice((0, 2))
                rows = draw(rng, ints, block, 2 * rng.randint(1, 10))
                limit = rows.ring.rows if rows.ring is not None else slot_limit(config)
                inside = "rows outside -1 and the ring's" if rows.ring is not None else "slots outside -1 and"
                out, lens = builder.build_slot_rows(rows)
                assert bool(((out == -1) | ((out >= 0) & (out < limit))).all()), (
                    f"a guarded call on garbage input handed out {inside} [0, {limit}): "
                    f"{sorted({int(v) for v in out.flatten().tolist() if v != -1 and not 0 <= v < limit})[:8]}"
                )
                assert bool(((lens >= 0) & (lens <= 8 + block)).all()), (
                    f"a guarded call on garbage input gave lens outside [0, {8 + block}]: {lens.tolist()}"
                )
                with contextlib.suppress(ValueError):  # the recorded violation, raised by name
                    builder.check()

    def test_slot_rows_guarded_on_garbage(
        self, name: str, spec: Any, make_builder: MakeBuilder, target: Target
    ) -> None:
        config = slot_rows_config(8, num_kv_blocks=50)

        def draw(rng: random.Random, ints: Callable[..., torch.Tensor], block: int, n: int) -> SlotRows:
            return SlotRows(
                row_ends=ints(-5, 60, (n,), torch.int32),
                pools=ints(-2, 4, (n,)),
                req_to_token=ints(-3, 70, (3, 40), torch.int32),
                slot_map=ints(-3, 2 * slot_limit(config), (64,)),
                floors=ints(-3, 50, (max(n, 3),), torch.int32),
                block=block,
                block_slots=ints(-3, 70, (n,)) if block else None,
                width=16,
            )

        self._guarded_on_garbage(draw, config, f"slot-garbage-{name}", 0, spec, make_builder, target)

    def test_ring_rows_guarded_on_garbage(
        self, name: str, spec: Any, make_builder: MakeBuilder, target: Target
    ) -> None:
        def draw(rng: random.Random, ints: Callable[..., torch.Tensor], block: int, n: int) -> SlotRows:
            return SlotRows(
                row_ends=ints(-5, 1 << 33, (n,)),
                pools=ints(-2, 5, (n,)),
                floors=ints(-(1 << 40), 1 << 40, (max(n, 3),)),
                block=block,
                width=16,
                ring=SlotRing(size=rng.choice((8 + block, 16)), slots=3),
            )

        self._guarded_on_garbage(draw, slot_rows_config(8), f"ring-garbage-{name}", 1, spec, make_builder, target)
