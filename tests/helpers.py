"""Constants and helpers shared by the test modules."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from swa_hal import PlatformInfo, SWAConfig, SWAMetadataBuilder

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
SCENARIOS = sorted((CONFIGS / "batches").glob("*.yaml"))

# Each built-in backend and a platform on which it is the one selected.
BACKEND_PLATFORMS = {
    "torch": "vendor=cpu",
    "cuda": "vendor=cuda,capability=9.0",
    "sm12x": "vendor=cuda,capability=12.0",
    "rocm": "vendor=rocm,arch=gfx942,capability=9.4",
    "xpu": "vendor=xpu",
}
TRITON_BACKENDS = ("cuda", "sm12x", "rocm", "xpu")


def make_builder(config: SWAConfig, backend: str, **kwargs) -> SWAMetadataBuilder:
    platform = PlatformInfo.from_assume(BACKEND_PLATFORMS[backend])
    return SWAMetadataBuilder(config, device="cpu", backend=backend, platform=platform, **kwargs)


# On an NVIDIA GPU every Triton backend can run: the others are forced with a synthetic platform.
GPU_FORCED = {
    "cuda": None,
    "sm12x": "vendor=cuda,capability=12.0",
    "rocm": "vendor=rocm,arch=gfx942,capability=9.4",
    "xpu": "vendor=xpu",
}


def gpu_builder(name: str, config: SWAConfig, **kwargs) -> SWAMetadataBuilder:
    platform = PlatformInfo.from_assume(GPU_FORCED[name]) if GPU_FORCED[name] else None
    return SWAMetadataBuilder(config, device="cuda", backend=name, platform=platform, **kwargs)


def common_metadata(batch, **overrides):
    """A duck-typed stand-in for an engine's common attention metadata, from ``batch``."""
    fields = dict(
        seq_lens=batch.seq_lens, seq_lens_cpu_upper_bound=batch.seq_lens_cpu,
        query_start_loc=batch.query_start_loc, query_start_loc_cpu=batch.query_start_loc_cpu,
        block_table_tensor=batch.block_table, slot_mapping=batch.slot_mapping,
        max_query_len=batch.max_query_len, num_actual_tokens=int(batch.query_start_loc_cpu[-1]),
        causal=batch.causal, num_reqs=batch.seq_lens.shape[0],
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)
