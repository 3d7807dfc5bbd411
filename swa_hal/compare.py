"""Comparing a build with the reference, output by output, bit for bit (the CLI and the conformance kit use it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .ragged import RaggedDecodeRows
from .reference import build_reference, ragged_rows

if TYPE_CHECKING:
    from .batch import AttentionBatch
    from .config import SWAConfig
    from .metadata import SWAMetadata


def _diff(name: str, got: torch.Tensor | None, want: torch.Tensor | None) -> str | None:
    if got is None or want is None:
        return None if got is None and want is None else f"{name}: got {got is not None}, reference {want is not None}"
    got, want = got.detach().cpu(), want.detach().cpu()
    if got.dtype != want.dtype:
        return f"{name}: dtype {got.dtype}, reference {want.dtype}"
    if got.shape != want.shape:
        return f"{name}: shape {tuple(got.shape)}, reference {tuple(want.shape)}"
    if torch.equal(got, want):
        return None
    bad = torch.nonzero(got != want)
    first = tuple(int(x) for x in bad[0])
    return (
        f"{name}: {bad.shape[0]} elements differ, first at {first}: got {got[first].item()}, "
        f"reference {want[first].item()}"
    )


def compare_with_reference(config: SWAConfig, batch: AttentionBatch, md: SWAMetadata) -> list[str]:
    """Every difference between ``md`` and ``reference.build_reference`` (empty: bit-exact)."""
    ref = build_reference(config, batch)
    out: list[str] = []
    split = (md.num_decodes, md.num_prefills, md.num_decode_tokens, md.num_prefill_tokens)
    if split != tuple(ref.split):
        out.append(f"split: got {split}, reference {tuple(ref.split)}")
        return out
    if md.decode_swa_width != ref.decode_width:
        out.append(f"decode_swa_width: got {md.decode_swa_width}, reference {ref.decode_width}")
    checks: list[tuple[str, torch.Tensor | None, torch.Tensor | None]] = [
        ("token_to_req_indices", md.token_to_req_indices, ref.token_to_req),
        ("is_valid_token", md.is_valid_token, ref.is_valid),
        ("decode_swa_indices", md.decode_swa_indices, ref.decode_indices),
        ("decode_swa_lens", md.decode_swa_lens, ref.decode_lens),
        ("prefill_swa_indices", md.prefill_swa_indices, ref.prefill_indices if ref.split.num_prefill_tokens else None),
        ("prefill_swa_lens", md.prefill_swa_lens, ref.prefill_lens if ref.split.num_prefill_tokens else None),
        ("prefill_gather_lens", md.prefill_gather_lens, ref.prefill_gather_lens),
        ("replay_start", md.replay_start, ref.replay_start),
        ("prefill_left_visible", md.prefill_left_visible, ref.prefill_left_visible),
        ("prefill_right_visible", md.prefill_right_visible, ref.prefill_right_visible),
    ]
    if md.max_decode_query_len != min(batch.max_query_len, config.decode_threshold):
        out.append(
            f"max_decode_query_len: got {md.max_decode_query_len}, expected "
            f"min({batch.max_query_len}, {config.decode_threshold})"
        )
    if md.num_prefills:
        nd = md.num_decodes
        seq_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens.cpu()
        checks.append(("prefill_seq_lens_cpu", md.prefill_seq_lens_cpu, seq_cpu[nd:]))
        qsl = batch.query_start_loc_cpu
        checks.append(("prefill_query_lens_cpu", md.prefill_query_lens_cpu, qsl[nd + 1 :] - qsl[nd:-1]))
    ragged = md.extra(RaggedDecodeRows)
    if ragged is not None:
        flat, indptr = ragged_rows(ref.decode_indices, ref.decode_lens)
        checks.append(("RaggedDecodeRows.indptr", ragged.indptr, indptr))
        checks.append(("RaggedDecodeRows.indices", ragged.indices.detach().cpu()[: int(indptr[-1])], flat.cpu()))
    for name, got, want in checks:
        problem = _diff(name, got, want)
        if problem:
            out.append(problem)
    return out
