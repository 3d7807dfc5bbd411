"""On the GPU: every Triton backend's kernels (they all run on an NVIDIA GPU) equal the
reference at full DeepSeek-V4 sizes, and a decode-only build replays correctly in a CUDA graph."""

from __future__ import annotations

import random
import time

import pytest
import torch

from swa_hal import PlatformInfo, SWAConfig, SWAMetadataBuilder

pytestmark = pytest.mark.gpu
from swa_hal.scenarios import Scenario
from swa_hal.testing.batches import KINDS, random_batch
from swa_hal.testing.compare import compare_with_reference
from swa_hal.testing.graphs import check_graph_replay

from helpers import CONFIGS, GPU_FORCED, SCENARIOS, gpu_builder

FORCED = GPU_FORCED


builder_for = gpu_builder


def config_for(scenario_path):
    import yaml

    meta = yaml.safe_load(scenario_path.read_text())
    return SWAConfig.from_yaml(CONFIGS / meta.get("config", "deepseek_v4_flash.yaml"))


@pytest.mark.parametrize("name", list(FORCED))
def test_scenarios_match_reference(name, report):
    checked = 0
    for path in SCENARIOS:
        config = config_for(path)
        builder = builder_for(name, config)
        batch = Scenario.from_yaml(path).make_batch(config, "cuda")
        md = builder.build(batch, validate=True)
        problems = compare_with_reference(config, batch, md)
        assert not problems, f"{path.stem}: {problems}"
        assert int(builder.buffers.decode_lens[md.num_decode_tokens :].abs().sum()) == 0
        checked += 1
    report(f"{name}: {checked} scenarios bit-exact with the reference")


@pytest.mark.parametrize("name", list(FORCED))
def test_random_full_size_batches_match_reference(name, report):
    configs = [SWAConfig.from_yaml(CONFIGS / f) for f in
               ("deepseek_v4_flash.yaml", "deepseek_v4_flash_mtp.yaml", "deepseek_v4_flash_dspark.yaml")]
    rng = random.Random(name)
    count = tokens = 0
    t0 = time.perf_counter()
    for config in configs:
        builder = builder_for(name, config)
        for kind in KINDS:
            if kind == "dspark" and not config.is_dspark:
                continue
            for _ in range(6):
                batch = random_batch(config, rng, kind, max_context=65536, device="cuda")
                md = builder.build(batch)
                problems = compare_with_reference(config, batch, md)
                assert not problems, f"{kind}: {problems}"
                count += 1
                tokens += batch.num_tokens
    report(f"{name}: {count} random batches ({tokens} token rows, up to 16384 per batch) bit-exact "
           f"in {time.perf_counter() - t0:.1f} s")


@pytest.mark.parametrize("name", list(FORCED))
def test_decode_build_replays_in_cuda_graph(name, report):
    config = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash.yaml")
    replays = check_graph_replay(builder_for(name, config), rng=random.Random(1), num_reqs=256, replays=8)
    report(f"{name}: captured a 256-token decode build; {replays} replays on changed inputs bit-exact")


def test_decode_build_does_not_sync(report):
    config = SWAConfig.from_yaml(CONFIGS / "deepseek_v4_flash.yaml")
    builder = builder_for("cuda", config)
    batch = Scenario.from_yaml(CONFIGS / "batches" / "decode_only.yaml").make_batch(config, "cuda")
    builder.warmup()
    builder.build(batch)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            md = builder.build(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert not compare_with_reference(config, batch, md)
    report("decode-only build ran under torch.cuda.set_sync_debug_mode('error'): no host sync")
