"""swa_hal inside SGLang: the SWA indices and lens of SGLang's DeepSeek-V4 attention backend, built
by swa_hal (docs/engines.md, "Using swa_hal in SGLang").

SGLang 0.5.23 builds them with its own ops (``BuildCausalSwaPageIndices`` for causal rows: decode,
extend and mixed batches, target verify, draft extend, late-layer tails; ``ComputeDsparkWindowGather`` +
``BuildDsparkSwaPageIndices`` for DSpark draft blocks). This module gives the same rows and lens from
swa_hal's auto-selected backend, and installs itself through SGLang's plugin framework: the entry point
``swa_hal`` of the group ``sglang.srt.plugins`` (select it with ``SGLANG_PLUGINS=swa_hal``; turn it off
with ``SWA_HAL_SGLANG=0``) registers three hooks with ``sglang.srt.plugins.hook_registry.HookRegistry``.

The translation, all on the device (no host synchronisation, fixed input buffers):

* SGLang hands its ops one row per query token: ``seq_lens_casual[i] = p_i + 1`` (p_i the row's
  position), ``req_pool_indices_repeated[i]``, and optionally a per-row floor ``swa_replay_start[i]``.
  Each row becomes a one-token request of an swa_hal decode batch, so every build is decode-only (no
  host data, CUDA-graph safe) and per-row floors (late-layer tails, folded replay) are exact.
* The block table is page-granular with B = 64: SGLang's two pools page in step (its allocator drives
  the full and the SWA allocator with one ``seq_lens``; the pages' size is a multiple of 128), so the SWA
  slot of position p is ``page * B + p % B`` and one lookup per 64 positions,
  ``full_to_swa[req_to_token[pool, 64 * k]] // 64``, gives the table. Each row's positions are shifted
  down by a multiple of 64 so that its table has only the few pages its window touches.
* swa_hal's rows run oldest first; SGLang's causal rows run newest first (column k holds position
  p - k). A gather reverses them within ``lens``. DSpark rows run oldest first in both.
* DSpark ``valid_from`` (SGLang's per-pool-slot lower bound of the draft window) drops the context
  entries below it: a shift of each row.

SGLang keeps the returned tensors in its metadata (the main and the late-layer-tail metadata of one
step live side by side), so the outputs are new tensors on every call, as SGLang's own ops return;
everything before them lives in buffers allocated once.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from ..batch import AttentionBatch
from ..builder import SWAMetadataBuilder
from ..config import SWAConfig, dspark_index_width
from ..platform import PlatformInfo
from ._common import InstallOnce, announce, auto_backend, enabled, require_version

# A child of SGLang's plugin logger, so the line appears in SGLang's own log format.
log = logging.getLogger("sglang.srt.plugins.swa_hal")

ENGINE = "SGLang"
DISTRIBUTION = "sglang"
SUPPORTED_VERSIONS = ("0.5.23",)
SWITCH = "SWA_HAL_SGLANG"
PLUGIN_NAME = "swa_hal"
# SGLang's constants (sglang/srt/layers/attention/deepseek_v4_backend.py).
SGLANG_SWA_WINDOW = 128
SGLANG_PAGE_INDEX_ALIGNED_SIZE = 64
# swa_hal's page size for the translated block table: divides every SGLang DeepSeek-V4 page size.
CHUNK = 64
_CHUNK_SHIFT = CHUNK.bit_length() - 1
DEFAULT_MAX_ROWS = 16384

_OPS = "sglang.kernels.ops.attention.dsv4.attn_metadata_kernels"
_BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend"
TARGET_CAUSAL = f"{_OPS}.BuildCausalSwaPageIndices.execute"
TARGET_CORE = f"{_BACKEND}.DeepseekV4AttnBackend.make_core_attn_metadata"
TARGET_DSPARK = f"{_BACKEND}.DeepseekV4AttnBackend.get_dspark_swa_page_indices"
TARGETS = (TARGET_CAUSAL, TARGET_CORE, TARGET_DSPARK)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _Inputs:
    """The fixed buffers of one builder: its input batch (up to ``rows`` one-row requests for causal
    rows, up to ``rows`` tokens in blocks for DSpark) and the scratch of the translation."""

    def __init__(self, rows: int, pages: int, width: int, device: torch.device):
        def i32(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.int32, device=device)

        def i64(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.int64, device=device)

        def flag(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.bool, device=device)

        self.rows = rows
        self.pages = pages
        self.device = device
        self.seq, self.table, self.slots, self.replay = i32(rows), i32(rows, pages), i64(rows), i32(rows)
        self.pos, self.base, self.shift, self.last, self.cut = (i64(rows) for _ in range(5))
        self.page, self.flat = i64(rows, pages), i64(rows, pages)
        self.ok, self.ok2 = flag(rows), flag(rows)
        self.k = torch.arange(pages, dtype=torch.int64, device=device)
        # the second pass: column numbers, gather indices and the -1 mask of every output column
        self.cols = torch.arange(width, dtype=torch.int64, device=device)
        self.src, self.mask = i64(rows, width), flag(rows, width)
        self._typed: dict[tuple[torch.dtype, int], torch.Tensor] = {}
        self._qsl: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def typed(self, dtype: torch.dtype) -> torch.Tensor:
        """A [rows, pages] scratch of ``dtype`` (req_to_token's slots in its own dtype)."""
        buf = self._typed.get((dtype, 2))
        if buf is None:
            buf = self._typed[(dtype, 2)] = torch.zeros((self.rows, self.pages), dtype=dtype, device=self.device)
        return buf

    def typed1(self, dtype: torch.dtype) -> torch.Tensor:
        """A [rows] scratch of ``dtype`` (valid_from's values in its own dtype)."""
        buf = self._typed.get((dtype, 1))
        if buf is None:
            buf = self._typed[(dtype, 1)] = torch.zeros(self.rows, dtype=dtype, device=self.device)
        return buf

    def qsl(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """query_start_loc for requests of ``step`` tokens each: device and host copies, made once."""
        got = self._qsl.get(step)
        if got is None:
            host = torch.arange(0, (self.rows // step + 1) * step, step, dtype=torch.int32)
            got = self._qsl[step] = (host.to(self.device), host)
        return got


@dataclasses.dataclass
class _Builder:
    builder: SWAMetadataBuilder
    inputs: _Inputs
    width: int


class SGLangSWAIndices:
    """SGLang's DeepSeek-V4 SWA indices and lens, from swa_hal, for one device and window.

    ``backend``/``platform`` go to ``SWAMetadataBuilder`` (None: ``SWA_HAL_BACKEND`` or
    auto-selection). ``max_rows``: the most query rows one call takes; a larger call makes a larger
    builder (and keeps the old one alive, so a CUDA graph captured with it stays valid).
    """

    def __init__(
        self,
        window_size: int = SGLANG_SWA_WINDOW,
        device: str | torch.device = "cpu",
        *,
        backend: str | None = None,
        platform: PlatformInfo | None = None,
        max_rows: int = DEFAULT_MAX_ROWS,
        validate: bool | None = None,
    ):
        self.window_size = int(window_size)
        self.device = torch.device(device)
        self.backend = backend
        self.platform = platform
        self.max_rows = int(max_rows)
        self.validate = validate
        self._builders: dict[tuple[int, int], _Builder] = {}
        self._retired: list[_Builder] = []
        self._lock = threading.Lock()

    # -- builders ----------------------------------------------------------------------------------

    def _builder(self, draft: int, rows: int) -> _Builder:
        """The builder for causal rows (draft=0) or DSpark blocks of ``draft`` tokens."""
        key = (draft, 0)
        got = self._builders.get(key)
        if got is not None and got.inputs.rows >= rows:
            return got
        with self._lock:
            got = self._builders.get(key)
            if got is not None and got.inputs.rows >= rows:
                return got
            cap = self.max_rows
            while cap < rows:
                cap *= 2
            if got is not None:
                log.warning(
                    "swa_hal: %d SGLang rows exceed the builder's %d; allocating for %d", rows, got.inputs.rows, cap
                )
                self._retired.append(got)
            w = self.window_size
            if draft:
                cfg = SWAConfig(
                    window_size=w,
                    block_size=CHUNK,
                    max_model_len=w + draft + 2 * CHUNK,
                    max_num_batched_tokens=cap,
                    max_num_seqs=cap,
                    num_speculative_tokens=draft,
                    speculative_method="dspark",
                )
                pages = _ceil_div(w + draft - 1, CHUNK) + 1
                width = dspark_index_width(w, draft)
            else:
                cfg = SWAConfig(
                    window_size=w,
                    block_size=CHUNK,
                    max_model_len=w + 2 * CHUNK,
                    max_num_batched_tokens=cap,
                    max_num_seqs=cap,
                )
                pages = _ceil_div(w - 1, CHUNK) + 1
                width = w
            builder = SWAMetadataBuilder(
                cfg, device=self.device, backend=self.backend, platform=self.platform, validate=self.validate
            )
            out_width = _ceil_div(width, SGLANG_PAGE_INDEX_ALIGNED_SIZE) * SGLANG_PAGE_INDEX_ALIGNED_SIZE
            got = self._builders[key] = _Builder(
                builder, _Inputs(cap, pages, max(width, out_width), builder.device), width
            )
            return got

    @property
    def backend_name(self) -> str:
        return self._builder(0, 1).builder.backend_name

    # -- the page table --------------------------------------------------------------------------

    @staticmethod
    def _fill_table(
        inp: _Inputs,
        n: int,
        req_to_token: torch.Tensor,
        full_to_swa: torch.Tensor,
        pool: torch.Tensor,
        base: torch.Tensor,
        last_pos: torch.Tensor,
    ) -> None:
        """table[i, k] = full_to_swa[req_to_token[pool[i], 64 * min(base[i] + k, last_pos[i] // 64)]] // 64."""
        page, flat, last_page = inp.page[:n], inp.flat[:n], inp.last[:n]
        torch.bitwise_right_shift(last_pos, _CHUNK_SHIFT, out=last_page)
        torch.add(base[:, None], inp.k[None, :], out=page)
        torch.minimum(page, last_page[:, None], out=page)
        # flat offsets into req_to_token: pool * stride + 64 * page
        flat.copy_(pool[:, None]).mul_(req_to_token.stride(0)).add_(page, alpha=CHUNK)
        rt = req_to_token if req_to_token.is_contiguous() else req_to_token.contiguous()
        full = inp.typed(rt.dtype)[:n]
        torch.take(rt, flat, out=full)  # the full-pool slot of each page's first position
        # full_to_swa indexed as SGLang indexes it: -1 reads its trailing -1.
        torch.remainder(full, full_to_swa.shape[0], out=page)
        swa = inp.typed(full_to_swa.dtype)[:n]
        torch.take(full_to_swa, page, out=swa)
        torch.floor_divide(swa, CHUNK, out=inp.table[:n])

    # -- causal rows -------------------------------------------------------------------------------

    def causal(
        self,
        *,
        req_to_token: torch.Tensor,
        full_to_swa: torch.Tensor,
        req_pool_indices_repeated: torch.Tensor,
        seq_lens_casual: torch.Tensor,
        swa_replay_start: torch.Tensor | None = None,
        page_index_aligned_size: int = SGLANG_PAGE_INDEX_ALIGNED_SIZE,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What ``BuildCausalSwaPageIndices`` returns (int32 [n, ceil(W / align) * align], newest
        first, -1 after) and the lens SGLang's backend pairs with it: ``min(p + 1, W)``, floored by
        ``swa_replay_start`` (per row) to ``p - floor + 1``. Rows with a negative position (draft-extend
        padding) get lens 0 where SGLang's own lens go negative."""
        n = seq_lens_casual.shape[0]
        w = self.window_size
        width = _ceil_div(w, page_index_aligned_size) * page_index_aligned_size
        dev = seq_lens_casual.device
        out = torch.empty((n, width), dtype=torch.int32, device=dev)
        lens_out = torch.empty(n, dtype=torch.int32, device=dev)
        if n == 0:
            return out, lens_out
        b = self._builder(0, n)
        inp = b.inputs
        pos, base, shift, ok = inp.pos[:n], inp.base[:n], inp.shift[:n], inp.ok[:n]
        torch.sub(seq_lens_casual, 1, out=pos)  # p
        torch.ge(pos, 0, out=ok)
        pos.clamp_min_(0)
        # base: the first 64-position page of the window; the row is shifted down by 64 * base.
        torch.sub(pos, w - 1, out=base)
        base.clamp_min_(0)
        torch.bitwise_right_shift(base, _CHUNK_SHIFT, out=base)
        torch.mul(base, CHUNK, out=shift)
        torch.sub(pos, shift, out=shift)  # now p - shift: the row's position in swa_hal's batch
        seq = inp.seq[:n]
        torch.add(shift, 1, out=seq)
        replay = None
        if swa_replay_start is not None:
            floor = swa_replay_start[:n]
            # A floor past p leaves an empty row (SGLang: lens 0, all -1): mark it invalid.
            torch.le(floor, pos, out=inp.ok2[:n])
            ok.logical_and_(inp.ok2[:n])
            replay = inp.replay[:n]
            torch.sub(floor, pos, out=replay)  # floor - p + (p - shift) = floor - shift
            replay.add_(shift).clamp_min_(0)
            torch.minimum(replay, seq, out=replay)
            replay.clamp_max_(shift)  # never past the row's own position (invalid rows included)
        slots = inp.slots[:n]
        slots.copy_(ok).sub_(1)  # 0 for a valid row, -1 for an empty one
        self._fill_table(inp, n, req_to_token, full_to_swa, req_pool_indices_repeated, base, pos)
        qsl, qsl_cpu = inp.qsl(1)
        batch = AttentionBatch(
            seq_lens=seq,
            query_start_loc=qsl[: n + 1],
            query_start_loc_cpu=qsl_cpu[: n + 1],
            seq_lens_cpu=None,
            block_table=inp.table[:n],
            slot_mapping=slots,
            max_query_len=1,
            num_tokens=n,
            causal=True,
            replay_start=replay,
        )
        md = b.builder.build(batch)
        rows = md.decode_swa_indices.view(n, w)
        lens = md.decode_swa_lens
        lens_out.copy_(lens)
        # newest first: column k holds entry lens - 1 - k
        src, mask, cols = inp.src[:n, :w], inp.mask[:n, :w], inp.cols[:w]
        torch.sub(lens[:, None], cols[None, :], out=src)
        src.sub_(1).clamp_min_(0)
        dst = out[:, :w]
        if width == w:
            torch.gather(rows, 1, src, out=dst)
        else:
            dst.copy_(torch.gather(rows, 1, src))
            out[:, w:].fill_(-1)
        torch.ge(cols[None, :], lens[:, None], out=mask)
        dst.masked_fill_(mask, -1)
        return out, lens_out

    # -- DSpark rows -------------------------------------------------------------------------------

    def dspark(
        self,
        *,
        req_to_token: torch.Tensor,
        full_to_swa: torch.Tensor,
        seq_lens_casual: torch.Tensor,
        req_pool_indices_repeated: torch.Tensor,
        out_loc: torch.Tensor,
        block_size: int,
        valid_from: torch.Tensor | None = None,
        page_index_aligned_size: int = SGLANG_PAGE_INDEX_ALIGNED_SIZE,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What ``DeepseekV4AttnBackend.get_dspark_swa_page_indices`` returns (paged SWA pool): for each
        draft block of ``block_size`` rows, the context positions ``[prefix - ctx, prefix)`` ascending,
        ``ctx = min(prefix, W)`` (and at most ``prefix - valid_from[pool]``), then the block's own slots;
        width ``ceil_align(W + block_size, align)``; lens ``ctx + block_size``. The block's slots are read
        from ``req_to_token`` at positions ``prefix..prefix + block_size - 1``: SGLang's ``out_loc`` for
        a draft block is exactly those entries (its verify window gathers them from ``req_to_token``)."""
        n = seq_lens_casual.shape[0]
        nb = int(block_size)
        if nb < 1 or n % nb:
            raise ValueError(f"DSpark draft block forward must be uniform: {n} rows, block_size {nb}")
        w = self.window_size
        width = _ceil_div(w + nb, page_index_aligned_size) * page_index_aligned_size
        dev = seq_lens_casual.device
        if n == 0:
            return torch.empty((0, width), dtype=torch.int32, device=dev), torch.empty(0, dtype=torch.int32, device=dev)
        bs = n // nb
        b = self._builder(nb, n)
        inp = b.inputs
        pos, base, shift, last = inp.pos[:bs], inp.base[:bs], inp.shift[:bs], inp.cut[:bs]
        first = seq_lens_casual[::nb]  # the first row of each block: prefix + 1
        pool = req_pool_indices_repeated[::nb]
        torch.sub(first, 1, out=pos)  # prefix P
        torch.sub(pos, w, out=base)
        base.clamp_min_(0)
        torch.bitwise_right_shift(base, _CHUNK_SHIFT, out=base)
        torch.mul(base, CHUNK, out=shift)
        seq = inp.seq[:bs]
        torch.sub(pos, shift, out=seq).add_(nb)  # S'' = P - shift + N
        inp.slots[:n].zero_()
        torch.add(pos, nb - 1, out=last)  # the block's last position
        self._fill_table(inp, bs, req_to_token, full_to_swa, pool, base, last)
        qsl, qsl_cpu = inp.qsl(nb)
        batch = AttentionBatch(
            seq_lens=seq,
            query_start_loc=qsl[: bs + 1],
            query_start_loc_cpu=qsl_cpu[: bs + 1],
            seq_lens_cpu=None,
            block_table=inp.table[:bs],
            slot_mapping=inp.slots[:n],
            max_query_len=nb,
            num_tokens=n,
            causal=False,
        )
        md = b.builder.build(batch)
        rows = md.decode_swa_indices.view(n, b.width)
        lens = md.decode_swa_lens
        out = torch.empty((n, width), dtype=torch.int32, device=dev)
        lens_out = torch.empty(n, dtype=torch.int32, device=dev)
        if valid_from is None:
            if width == b.width:
                out.copy_(rows)
            else:
                out.fill_(-1)
                out[:, : b.width].copy_(rows)
            lens_out.copy_(lens)
            return out, lens_out
        # valid_from: the context keeps min(ctx, max(P - valid_from[pool], 0)) of its ctx = min(P, W)
        # entries; the row drops its first ctx - keep.
        ctx, keep = inp.base[:bs], inp.shift[:bs]
        torch.clamp_max(pos, w, out=ctx)
        vf = inp.typed1(valid_from.dtype)[:bs]
        torch.index_select(valid_from, 0, pool, out=vf)
        torch.sub(pos, vf, out=keep)
        keep.clamp_min_(0)
        torch.minimum(ctx, keep, out=keep)
        torch.sub(ctx, keep, out=ctx)  # per block
        cut = inp.cut[:n].view(bs, nb)
        cut.copy_(ctx[:, None])
        cut = cut.view(n)
        src, mask, cols = inp.src[:n, :width], inp.mask[:n, :width], inp.cols[:width]
        torch.add(cols[None, :], cut[:, None], out=src)
        src.clamp_max_(b.width - 1)
        if width == b.width:
            torch.gather(rows, 1, src, out=out)
        else:
            out.copy_(torch.gather(rows, 1, src.clamp_max(b.width - 1)))
        torch.sub(lens, cut, out=lens_out)
        torch.ge(cols[None, :], lens_out[:, None], out=mask)
        out.masked_fill_(mask, -1)
        return out, lens_out


# -- the adapters the hooks use ------------------------------------------------------------------------


@dataclasses.dataclass
class _Settings:
    backend: str | None = None
    platform: PlatformInfo | None = None
    max_rows: int = DEFAULT_MAX_ROWS


_settings = _Settings()
_adapters: dict[tuple[int, str, int, int], SGLangSWAIndices] = {}
_adapters_lock = threading.Lock()


def configure(*, backend: str | None = None, platform: PlatformInfo | None = None, max_rows: int | None = None) -> None:
    """Settings for the adapters the hooks create from now on (tests force a backend this way;
    ``SWA_HAL_BACKEND`` does the same for a server). Forgets the adapters made so far."""
    _settings.backend = backend
    _settings.platform = platform
    if max_rows is not None:
        _settings.max_rows = int(max_rows)
    reset_adapters()


def reset_adapters() -> None:
    with _adapters_lock:
        _adapters.clear()


def adapter_for(device: torch.device, window_size: int = SGLANG_SWA_WINDOW) -> SGLangSWAIndices:
    """The adapter of this thread for ``device`` and ``window_size``. One per thread: a builder's fixed
    buffers serve one build at a time, and SGLang may prepare metadata on a second thread. Adapters
    are never dropped, so a CUDA graph that captured one keeps reading live buffers."""
    key = (threading.get_ident(), device.type, -1 if device.index is None else device.index, int(window_size))
    got = _adapters.get(key)
    if got is None:
        with _adapters_lock:
            got = _adapters.get(key)
            if got is None:
                got = _adapters[key] = SGLangSWAIndices(
                    window_size,
                    device,
                    backend=_settings.backend,
                    platform=_settings.platform,
                    max_rows=_settings.max_rows,
                )
    return got


# -- the hooks -----------------------------------------------------------------------------------------

# Set by the make_core_attn_metadata hook: the causal op hook leaves its lens here.
_LENS_SINK: contextvars.ContextVar[list[torch.Tensor] | None] = contextvars.ContextVar(
    "swa_hal_sglang_lens", default=None
)


def causal_execute(
    cls: Any,
    *,
    req_to_token: torch.Tensor,
    full_to_swa_mapping: torch.Tensor,
    req_pool_indices_repeated: torch.Tensor,
    seq_lens_casual: torch.Tensor,
    swa_window: int,
    page_index_aligned_size: int,
    swa_replay_start: torch.Tensor | None = None,
) -> torch.Tensor:
    """REPLACE hook of ``BuildCausalSwaPageIndices.execute``: swa_hal's rows, newest first."""
    adapter = adapter_for(seq_lens_casual.device, swa_window)
    indices, lens = adapter.causal(
        req_to_token=req_to_token,
        full_to_swa=full_to_swa_mapping,
        req_pool_indices_repeated=req_pool_indices_repeated,
        seq_lens_casual=seq_lens_casual,
        swa_replay_start=swa_replay_start,
        page_index_aligned_size=page_index_aligned_size,
    )
    sink = _LENS_SINK.get()
    if sink is not None:
        sink.append(lens)
    return indices


_core_signature: dict[Callable[..., Any], inspect.Signature] = {}


def core_attn_metadata_around(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of ``DeepseekV4AttnBackend.make_core_attn_metadata``: on the causal path (no
    request window, no DSpark block) the lens SGLang's metadata carries are the ones swa_hal built
    with the indices."""
    sig = _core_signature.get(original)
    if sig is None:
        sig = _core_signature[original] = inspect.signature(original)
    bound = sig.bind(self, *args, **kwargs)
    if (
        bound.arguments.get("dspark_block_size") is not None
        or getattr(self.token_to_kv_pool, "request_window", None) is not None
    ):
        return original(self, *args, **kwargs)
    token = _LENS_SINK.set([])
    try:
        core = original(self, *args, **kwargs)
        sink = _LENS_SINK.get()
    finally:
        _LENS_SINK.reset(token)
    if sink is not None and len(sink) == 1:
        core.swa_topk_lengths = sink[0]
    return core


def dspark_indices_around(
    original: Callable[..., Any],
    self: Any,
    *,
    seq_lens_casual: torch.Tensor,
    req_pool_indices_repeated: torch.Tensor,
    out_loc: torch.Tensor,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """AROUND hook of ``DeepseekV4AttnBackend.get_dspark_swa_page_indices``: swa_hal's DSpark rows for
    the paged SWA pool; the per-request SWA ring keeps SGLang's own path."""
    pool = self.token_to_kv_pool
    if getattr(pool, "swa_req_ring_size", None) is not None:
        return original(
            self,
            seq_lens_casual=seq_lens_casual,
            req_pool_indices_repeated=req_pool_indices_repeated,
            out_loc=out_loc,
            block_size=block_size,
        )
    module = sys.modules.get(type(self).__module__)
    window = getattr(module, "SWA_WINDOW", SGLANG_SWA_WINDOW)
    align = getattr(module, "PAGE_INDEX_ALIGNED_SIZE", SGLANG_PAGE_INDEX_ALIGNED_SIZE)
    adapter = adapter_for(seq_lens_casual.device, window)
    return adapter.dspark(
        req_to_token=self.req_to_token,
        full_to_swa=pool.full_to_swa_index_mapping,
        seq_lens_casual=seq_lens_casual,
        req_pool_indices_repeated=req_pool_indices_repeated,
        out_loc=out_loc,
        block_size=block_size,
        valid_from=getattr(pool, "swa_valid_from", None),
        page_index_aligned_size=align,
    )


# -- the plugin ----------------------------------------------------------------------------------------

_install_once = InstallOnce()


def _install() -> str:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    version = require_version(ENGINE, DISTRIBUTION, SUPPORTED_VERSIONS, switch=SWITCH)
    # Select first: a backend that cannot start is an error before SGLang is touched.
    name, where = auto_backend(backend=_settings.backend, platform=_settings.platform)
    HookRegistry.register(TARGET_CAUSAL, causal_execute, HookType.REPLACE)
    HookRegistry.register(TARGET_CORE, core_attn_metadata_around, HookType.AROUND)
    HookRegistry.register(TARGET_DSPARK, dspark_indices_around, HookType.AROUND)
    return announce(log, ENGINE, version, "DeepSeek-V4 SWA indices and lens", name, where)


def load_plugin() -> str | None:
    """The ``sglang.srt.plugins`` entry point. Registers the hooks once per process (SGLang's loader
    applies them), logs one line naming the swa_hal backend, and returns it. ``SWA_HAL_SGLANG=0``
    leaves SGLang untouched (returns None); another SGLang version raises EngineVersionError."""
    if not enabled(SWITCH):
        log.debug("swa_hal: %s=0, SGLang left untouched", SWITCH)
        return None
    require_version(ENGINE, DISTRIBUTION, SUPPORTED_VERSIONS, switch=SWITCH)
    return _install_once(_install)
