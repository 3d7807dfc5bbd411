"""What the conformance kit catches, run as a vendor runs it: pytest with only the kit's plugin, in a folder
outside this checkout (none of this repository's pytest settings apply).

- the CUDA-graph test is skipped, with its reason, where there is no CUDA device (it used to fail there);
- a backend that claims ``cuda_graphs`` but reads device values on the host or allocates device tensors
  during a build, a group build or a draft update fails the host-sync topic, naming the call; reading the
  batch's host copies stays allowed;
- a backend that claims ``clamps_addresses`` but does not clamp fails with what to change;
- a backend whose typed extras share buffers across the KV-cache groups of a group build (every group then holds
  the last group's) fails the group-build topic, naming the extra and the group it holds; extras that share memory
  but are alike for every group pass."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import kit_run

# One misbehaving backend per class, each a TritonBackend (the cuda backend's class) that claims cuda_graphs.
BAD_BACKENDS = """
import pytest

from swa_hal import Availability, BackendSpec, hookimpl
from swa_hal.testing import AddressRuleTests, HostSyncTests
from swa_hal_cuda.backend import CudaBackend


class ItemInCompute(CudaBackend):
    def compute(self, plan, batch, buffers):
        if int(batch.seq_lens.max().item()) < 0:  # a host read of a device value
            raise AssertionError("unreachable")
        super().compute(plan, batch, buffers)


class TolistInCompute(CudaBackend):
    def compute(self, plan, batch, buffers):
        self.seen = batch.slot_mapping.tolist()
        super().compute(plan, batch, buffers)


class CpuOfABuffer(CudaBackend):
    def compute(self, plan, batch, buffers):
        super().compute(plan, batch, buffers)
        self.lens = buffers.decode_lens.cpu()


class AllocatesInCompute(CudaBackend):
    def compute(self, plan, batch, buffers):
        scratch = torch.zeros(plan.inputs.num_tokens, dtype=torch.int32, device=self.device)
        super().compute(plan, batch, buffers)
        scratch.add_(1)


class OutOfPlaceInDraftUpdate(CudaBackend):
    def recompute_decode_rows(self, metadata, buffers):
        super().recompute_decode_rows(metadata, buffers)
        self.shifted = metadata.seq_lens + 1  # a new device tensor per draft step


class ReadsHostCopies(CudaBackend):
    def compute(self, plan, batch, buffers):
        self.queries = batch.query_start_loc_cpu.tolist()  # the host copies are the backend's to read
        if batch.seq_lens_cpu is not None:
            self.longest = int(batch.seq_lens_cpu.max())
        super().compute(plan, batch, buffers)


class Unclamped(CudaBackend):
    CLAMP_ADDRESSES = False  # but the spec below claims clamps_addresses


import torch  # noqa: E402


def spec(name, cls, **claims):
    return BackendSpec(
        name=name, priority=1, factory=f"test_bad_kit:{cls}", platforms=(f"vendor={name}",), summary=name,
        is_available=lambda platform: Availability.check([] if platform.vendor == name else ["another vendor"]),
        kernels="triton", cuda_graphs=True, **claims,
    )


SPECS = [
    spec("item", "ItemInCompute"), spec("tolist", "TolistInCompute"), spec("cpucopy", "CpuOfABuffer"),
    spec("alloc", "AllocatesInCompute"), spec("draftalloc", "OutOfPlaceInDraftUpdate"),
    spec("hostcopies", "ReadsHostCopies"), spec("unclamped", "Unclamped", clamps_addresses=True),
]


class Plugin:
    @hookimpl
    def swa_hal_register_backends(self):
        return SPECS


class Registered:
    @pytest.fixture
    def registry(self, swa_hal_registry):
        swa_hal_registry.register_plugin(Plugin(), "bad")
        return swa_hal_registry


class Bad(Registered, HostSyncTests):
    pass


# One host-sync class per misbehaving backend (the class the tests below name, its backend).
for _cls, _name in (
    ("TestItem", "item"), ("TestTolist", "tolist"), ("TestCpuCopy", "cpucopy"), ("TestAlloc", "alloc"),
    ("TestDraftAlloc", "draftalloc"), ("TestHostCopies", "hostcopies"),
):
    globals()[_cls] = type(_cls, (Bad,), {"backend_name": _name})


class TestUnclamped(Registered, AddressRuleTests):
    backend_name = "unclamped"
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a CUDA device")
def test_the_cuda_graph_test_is_skipped_without_a_cuda_device(tmp_path):
    proc = kit_run(
        tmp_path,
        "-rs",
        "--swa-hal-interpret",
        "--pyargs",
        "swa_hal.testing.suite",
        "--swa-hal-backend",
        "cuda",
        "-k",
        "cuda_graph",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "1 skipped" in out and "needs a CUDA device and this machine has none" in out, out


def _kit_output(tmp_path, selection: str, files: dict[str, str]) -> str:
    """What the kit's tests ``selection`` (pytest -k) print, run over ``files`` as a vendor runs them."""
    proc = kit_run(tmp_path, "-q", "--tb=short", "-k", selection, files=files)
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory):
    # One address-strict case is enough to show its message: the kit runs it for every config and kind.
    selection = "sync_nor or (address_strict and v4-decode)"
    return _kit_output(tmp_path_factory.mktemp("bad-kit"), selection, {"test_bad_kit.py": BAD_BACKENDS})


@pytest.mark.parametrize(
    "cls, test, call",
    [
        ("TestItem", "test_builds_neither_sync_nor_allocate", "Tensor.item() reads a device tensor on the host"),
        ("TestTolist", "test_builds_neither_sync_nor_allocate", "Tensor.tolist() reads a device tensor on the host"),
        ("TestCpuCopy", "test_builds_neither_sync_nor_allocate", "Tensor.cpu() reads a device tensor on the host"),
        ("TestAlloc", "test_builds_neither_sync_nor_allocate", "torch.zeros() allocates a new device tensor"),
        (
            "TestDraftAlloc",
            "test_group_builds_and_draft_updates_neither_sync_nor_allocate",
            "Tensor.add() allocates a new device tensor",
        ),
    ],
)
def test_a_backend_that_syncs_or_allocates_fails_naming_the_call(bad_run, cls, test, call):
    assert f"FAILED test_bad_kit.py::{cls}::{test}" in bad_run, bad_run[-6000:]
    # The failure's own section names the call and where the backend made it (its file and function).
    section = re.search(rf"^_+ {cls}\.{test} _+$(.*?)(?=^_{{3,}} |^=+ short test summary)", bad_run, re.M | re.S)
    assert section, bad_run[-6000:]
    assert call in section.group(1) and re.search(r"test_bad_kit\.py:\d+ \(\w+\)", section.group(1)), section.group(1)
    assert "claims cuda_graphs" in section.group(1) and "drop cuda_graphs=True" in section.group(1)


def test_reading_the_host_copies_is_allowed(bad_run):
    assert "FAILED test_bad_kit.py::TestHostCopies" not in bad_run, bad_run[-6000:]
    assert "ERROR test_bad_kit.py::TestHostCopies" not in bad_run, bad_run[-6000:]


def test_a_broken_address_claim_says_what_to_change(bad_run):
    assert "FAILED test_bad_kit.py::TestUnclamped::test_address_strict" in bad_run, bad_run[-6000:]
    assert "claims clamps_addresses=True" in bad_run and "CLAMP_ADDRESSES = True" in bad_run, bad_run[-6000:]


# Three backends with a typed extra: a copy of the decode rows in one buffer for every group (the groups' extras
# share it), the same with a buffer per group, and the builder's own token_to_req (shared, alike for every group).
EXTRAS_BACKENDS = """
import dataclasses

import pytest
import torch

from swa_hal import Availability, BackendSpec, hookimpl
from swa_hal.testing import GroupBuildTests
from swa_hal.torch_backend import TorchBackend


@dataclasses.dataclass(frozen=True)
class DecodeRows:
    rows: torch.Tensor


class OneCopyForAllGroups(TorchBackend):
    def allocate(self, buffers):
        super().allocate(buffers)
        width = max(self.config.window_size, self.config.noncausal_index_width)
        one = torch.full((buffers.capacity, width), -1, dtype=torch.int32, device=self.device)
        self.copies = [one] * buffers.num_groups

    def extras(self, metadata, buffers):
        copy = self.copies[buffers.group_index]
        n = metadata.num_decode_tokens
        if n:
            rows = metadata.decode_swa_indices.reshape(n, -1)
            copy[:n, : rows.shape[1]].copy_(rows)
        return (DecodeRows(copy),)


class OneCopyPerGroup(OneCopyForAllGroups):
    def allocate(self, buffers):
        super().allocate(buffers)
        self.copies = [copy.clone() for copy in self.copies]


@dataclasses.dataclass(frozen=True)
class Owners:
    token_to_req: torch.Tensor


class SharedButAlike(TorchBackend):
    def extras(self, metadata, buffers):
        return (Owners(metadata.token_to_req_indices),)


def spec(name, cls):
    return BackendSpec(
        name=name, priority=1, factory=f"test_extras_kit:{cls}", platforms=(f"vendor={name}",), summary=name,
        is_available=lambda platform: Availability.check([] if platform.vendor == name else ["another vendor"]),
    )


class Plugin:
    @hookimpl
    def swa_hal_register_backends(self):
        return [spec("shared", "OneCopyForAllGroups"), spec("own", "OneCopyPerGroup"), spec("alike", "SharedButAlike")]


class Registered(GroupBuildTests):
    @pytest.fixture
    def registry(self, swa_hal_registry):
        swa_hal_registry.register_plugin(Plugin(), "extras")
        return swa_hal_registry


class TestShared(Registered):
    backend_name = "shared"


class TestOwn(Registered):
    backend_name = "own"


class TestAlike(Registered):
    backend_name = "alike"
"""


@pytest.fixture(scope="module")
def extras_run(tmp_path_factory):
    # The MTP config's decodes, draft steps and batch kinds show each case; the kit runs every config.
    files = {"test_extras_kit.py": EXTRAS_BACKENDS}
    return _kit_output(tmp_path_factory.mktemp("extras-kit"), "group_builds and w4b4_mtp", files)


def test_extras_shared_across_groups_fail_the_kit_naming_the_group_they_hold(extras_run):
    test = "TestShared::test_group_builds_match_each_groups_reference"
    assert f"FAILED test_extras_kit.py::{test}[w4b4_mtp-decode]" in extras_run, extras_run[-6000:]
    assert f"FAILED test_extras_kit.py::{test}[w4b4_mtp-mtp]" in extras_run, extras_run[-6000:]
    assert (
        "build_groups with listed tables of a decode batch: group 0's extra DecodeRows.rows is not what a build of "
        "group 0's own batch gives; it holds group 2's" in extras_run
    ), extras_run[-6000:]
    assert "allocate one set per group in allocate(buffers) (buffers.num_groups)" in extras_run, extras_run[-6000:]


def test_extras_of_their_own_or_alike_for_every_group_pass(extras_run):
    summary = extras_run.strip().splitlines()[-1]
    for cls in ("TestOwn", "TestAlike"):
        assert f"test_extras_kit.py::{cls}" not in extras_run, extras_run[-6000:]
    # Every batch kind of the MTP config, for each of the three backends.
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 2 * 6, summary
