"""The vLLM plugin's shadow mode (docs/engines.md #shadow-mode): vLLM's own build serves, swa_hal's is compared
with it, field by field, on the shadow's turns (``swa_hal.integrations.shadow``).

A shadowing builder's row buffers are swa_hal's own (``SwaHalSparseSWAMetadataBuilder._adopt_native_buffers``):
vLLM's build and swa_hal's fill the same memory, so on a compared call swa_hal builds first, its answer is
copied aside, and vLLM's build then writes the answer vLLM serves; the two are compared on the device
(``Shadow.compare``, no sync). A promoted swa_hal fills the very addresses vLLM's builds filled, which the
CUDA graphs captured meanwhile read. Step builds and recorded metadata builds stay off while the plugin
shadows (they would hand out other buffers), also after a promotion.

What is compared is what vLLM's ``DeepseekSparseSWAMetadata`` carries, where it is defined (as the engine
suites compare it): the split and the static facts; the step's own input tensors (the same memory); every
token row's validity; token_to_req of valid tokens; every decode and prefill row and length; the replay
bounds of the step's requests (swa_hal's padding requests past vLLM's bounds hold 0); the prefill request
tensors; the image visibility of valid prefill tokens; which tile-scheduler slots are filled. A draft
update compares what it rewrites: validity, token_to_req, the decode rows and lengths.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ..config import LAYER_TYPES
from ..errors import SWAHalError
from .aside import drift_reason, raised_by_engine, step_aside
from .shadow import Check, Shadow
from .vllm_common import ENGINE, log

# The plugin's shadow while it shadows vLLM in this process (None: swa_hal serves, or no plugin).
_shadow: Shadow | None = None

SCALAR_FIELDS = (
    "num_decodes",
    "num_prefills",
    "num_decode_tokens",
    "num_prefill_tokens",
    "block_size",
    "decode_swa_width",
    "max_decode_query_len",
    "prefill_window_size",
    "prefill_max_model_len",
    "prefill_max_num_batched_tokens",
)
INPUT_FIELDS = ("seq_lens", "query_start_loc", "query_start_loc_cpu", "block_table", "slot_mapping")
PREFILL_REQUEST_FIELDS = ("prefill_seq_lens", "prefill_seq_lens_cpu", "prefill_gather_lens", "prefill_query_lens_cpu")


def start(shadow: Shadow | None) -> None:
    """The plugin's shadow from now on (``register``; None: swa_hal serves)."""
    global _shadow
    _shadow = shadow


def current() -> Shadow | None:
    return _shadow


def shadowing() -> bool:
    """Whether builders made now are a shadow's (their rows shared with vLLM's build)."""
    return _shadow is not None


def report() -> dict[str, Any] | None:
    return None if _shadow is None else _shadow.report()


def shadow_build(builder: Any, shadow: Shadow, cm: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``builder.build(*args, **kwargs)`` (of common metadata ``cm``) while shadowing: vLLM's build serves; on the
    shadow's turns swa_hal's is built first and compared with it."""
    call = shadow.turn()
    if call is None:
        return builder._native("build", args, kwargs)
    ours = _ours(builder, shadow, call, "build", builder.swa_hal_build, args, kwargs)
    if ours is not None:
        ours = _snapshot(ours)  # before vLLM's build rewrites the memory it views
    native = builder._native("build", args, kwargs)
    if ours is not None:
        shadow.compare(call, f"build of {type(builder).__name__}", build_checks(native, ours, cm))
    return native


def shadow_update(builder: Any, shadow: Shadow, metadata: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``builder.update_draft_decode_metadata(*args, **kwargs)`` (of ``metadata``) while shadowing: vLLM's update
    serves; on the shadow's turns swa_hal's updates the same metadata first, and what it wrote is compared with
    vLLM's."""
    call = shadow.turn()
    if call is None:
        return builder._native("update_draft_decode_metadata", args, kwargs)
    done = _ours(builder, shadow, call, "update_draft_decode_metadata", builder.swa_hal_update_draft, args, kwargs)
    ours = _update_fields(metadata) if done is not None else None
    builder._native("update_draft_decode_metadata", args, kwargs)
    if ours is not None:
        name = f"draft update of {type(builder).__name__}"
        valid = metadata.slot_mapping[: metadata.num_decode_tokens] >= 0
        shadow.compare(
            call,
            name,
            [
                Check(f, v, ours[f], valid if f == "token_to_req_indices" else None)
                for f, v in _update_fields(metadata, clone=False).items()
            ],
        )


_DONE = object()


def _ours(builder: Any, shadow: Shadow, call: int, hook: str, serve: Any, args: tuple, kwargs: dict) -> Any:
    """swa_hal's answer to a compared call, or None: it met drift (stepped aside, counted) or refused the call
    (a difference: swa_hal would not have served what vLLM serves)."""
    try:
        got = serve(*args, **kwargs)
    except SWAHalError as exc:
        shadow.refused(call, f"{hook} of {type(builder).__name__}", exc)
        return None
    except Exception as exc:
        if raised_by_engine(exc):
            raise
        step_aside(ENGINE, hook, drift_reason(exc), log)
        return None
    return _DONE if got is None else got


def _snapshot(metadata: Any) -> Any:
    """swa_hal's metadata with its buffers' tensors copied aside (vLLM's build rewrites that memory next); the
    step's input tensors stay as they are, so they can be compared by identity."""
    out = copy.copy(metadata)
    for name, value in vars(metadata).items():
        if isinstance(value, torch.Tensor) and name not in INPUT_FIELDS:
            setattr(out, name, value.clone())
    return out


def _same_memory(a: Any, b: Any) -> bool:
    return a is b or (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.data_ptr() == b.data_ptr()
        and a.dtype == b.dtype
        and a.shape == b.shape
    )


def build_checks(native: Any, ours: Any, cm: Any) -> list[Check]:
    """The fields of two ``DeepseekSparseSWAMetadata`` of one step to compare, each where it is defined (the
    module docstring)."""
    checks = [Check(f, getattr(native, f), getattr(ours, f)) for f in SCALAR_FIELDS]
    for f in INPUT_FIELDS:
        checks.append(Check(f"{f} is the step's own", True, _same_memory(getattr(native, f), getattr(ours, f))))
    slots = cm.slot_mapping
    rows = slots.shape[0]
    valid = slots >= 0
    ndt, npt = native.num_decode_tokens, native.num_prefill_tokens
    n = ndt + npt
    checks.append(Check("is_valid_token", native.is_valid_token[:rows], ours.is_valid_token[:rows]))
    checks.append(
        Check("token_to_req_indices", native.token_to_req_indices[:n], ours.token_to_req_indices[:n], valid[:n])
    )
    for part, count in (("decode", ndt), ("prefill", npt)):
        for kind in ("indices", "lens"):
            f = f"{part}_swa_{kind}"
            a, b = getattr(native, f), getattr(ours, f)
            if a is None or b is None:
                checks.append(Check(f"{f} is None", a is None, b is None))
            else:
                checks.append(Check(f, a[:count], b[:count]))
    num_reqs = int(getattr(cm, "num_reqs", cm.query_start_loc_cpu.shape[0] - 1))
    bounds = min(num_reqs, native.replay_start.shape[0])
    checks.append(Check("replay_start", native.replay_start[:bounds], ours.replay_start[:bounds]))
    padding = ours.replay_start[bounds:num_reqs]
    checks.append(Check("replay_start of padding requests", torch.zeros_like(padding), padding))
    for f in PREFILL_REQUEST_FIELDS:
        a, b = getattr(native, f, None), getattr(ours, f, None)
        if a is None or b is None:
            checks.append(Check(f"{f} is None", a is None, b is None))
        else:
            checks.append(Check(f, a[: native.num_prefills], b[: native.num_prefills]))
    for f in ("prefill_left_visible", "prefill_right_visible"):
        a, b = getattr(native, f), getattr(ours, f)
        if a is None or b is None:
            checks.append(Check(f"{f} is None", a is None, b is None))
        else:
            checks.append(Check(f, a[ndt:n], b[ndt:n], valid[ndt:n]))
    for kind in LAYER_TYPES:
        f = f"tile_sched_{kind}"
        checks.append(Check(f"{f} is filled", getattr(native, f) is not None, getattr(ours, f) is not None))
    return checks


def _update_fields(metadata: Any, clone: bool = True) -> dict[str, Any]:
    """What a draft update rewrites of ``metadata`` (its decode tokens' rows and lengths, token_to_req, every
    row's validity), copied aside (``clone``) or as views."""
    ndt = metadata.num_decode_tokens
    rows = metadata.slot_mapping.shape[0]
    fields = {
        "decode_swa_indices": metadata.decode_swa_indices[:ndt],
        "decode_swa_lens": metadata.decode_swa_lens[:ndt],
        "token_to_req_indices": metadata.token_to_req_indices[:ndt],
        "is_valid_token": metadata.is_valid_token[:rows],
    }
    return {k: v.clone() for k, v in fields.items()} if clone else fields
