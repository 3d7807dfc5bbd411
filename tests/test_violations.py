"""Guard violations seen without a sync (swa_hal/violations.py): a poll per build reports, a build late,
what a guarded build recorded: one warning per kind naming the field, request and value, or the typed
error raised under SWA_HAL_STRICT=1; ``check()`` still raises the first violation since the last check."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from helpers import make_builder
from test_guard import CFG as GUARD_CFG

from swa_hal import AttentionBatch
from swa_hal import errors as E
from swa_hal.rules import RECORD_LEN, Violation
from swa_hal.violations import ViolationWatch, describe

# The guard tests' geometry without image tokens.
CFG = dataclasses.replace(GUARD_CFG, max_image_tokens=0)
LOGGER = "swa_hal"
SEQ_SHORT_LINE = (
    "swa_hal: a guarded build handed out empty rows: BatchRangeError: seq_lens[1]=3 is shorter than its query "
    "length (found by a guarded build, which handed the offending rows out empty) [field=seq_lens request=1 "
    "value=3]; logged once per kind, SWA_HAL_STRICT=1 raises instead"
)


def clean() -> AttentionBatch:
    """A decode (S=6, q=1) and a prefill (S=9, q=5)."""
    return AttentionBatch.from_lists([6, 9], [1, 5], [[1, 2], [3, 4, 5]], block_size=4)


def seq_short() -> AttentionBatch:
    """Request 1's seq_len 3 is shorter than its 5 new tokens (the host copy is left as it was)."""
    b = clean()
    return dataclasses.replace(b, seq_lens=torch.tensor([6, 3], dtype=torch.int32))


def block_past_cache() -> AttentionBatch:
    """Request 1's window reads block id 16, past the 16-block cache."""
    b = clean()
    table = b.block_table.clone()
    table[1, 1] = 16
    return dataclasses.replace(b, block_table=table)


def step(builder, batch: AttentionBatch) -> None:
    """One engine step: the build, then the poll an engine plugin makes after it."""
    builder.build(batch)
    builder.poll_violations()


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_a_violation_is_logged_a_build_later_once_per_kind(backend, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    b = make_builder(CFG, backend)
    for _ in range(2):
        step(b, clean())
    assert lines(caplog) == []
    step(b, seq_short())
    assert lines(caplog) == []  # seen by this build's poll, reported by the next
    step(b, clean())
    assert lines(caplog) == [SEQ_SHORT_LINE]
    # The same kind again, at another request and value: not logged again.
    for _ in range(3):
        step(b, dataclasses.replace(clean(), seq_lens=torch.tensor([0, 9], dtype=torch.int32)))
    step(b, clean())
    assert lines(caplog) == [SEQ_SHORT_LINE]
    # Another kind: its own line, naming its field, request and value.
    step(b, block_past_cache())
    step(b, clean())
    got = lines(caplog)
    assert len(got) == 2 and got[0] == SEQ_SHORT_LINE
    assert got[1].startswith("swa_hal: a guarded build handed out empty rows: BatchRangeError: block_table: ")
    assert "reads block id 16, outside [0, 16)" in got[1]
    assert "[field=block_table request=1 value=16]" in got[1]
    assert b.violations.logged == {Violation.SEQ_SHORT, Violation.BLOCK}
    # Every violation was taken off the device: clean steps afterwards log nothing more.
    for _ in range(3):
        step(b, clean())
    assert len(lines(caplog)) == 2 and b.buffers.violation.tolist() == [0, 0, 0, 0, 0]


@pytest.mark.parametrize("backend", ["torch", "cuda"])
def test_strict_raises_the_typed_error_at_the_next_build(backend, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    monkeypatch.setenv("SWA_HAL_STRICT", "1")
    b = make_builder(CFG, backend)
    step(b, clean())
    step(b, seq_short())  # the malformed build itself hands its rows out empty
    assert int(b.buffers.decode_lens[0]) > 0 and (b.buffers.prefill_lens[:5] == 0).all()
    b.build(clean())
    with pytest.raises(E.BatchRangeError, match=r"seq_lens\[1\]=3 is shorter than its query length") as info:
        b.poll_violations()
    assert info.value.field == "seq_lens" and info.value.index == 1
    assert lines(caplog) == []
    # Raised once: later clean steps go on, and check() does not raise it a second time.
    for _ in range(2):
        step(b, clean())
    b.check()


def test_clean_steps_log_nothing_and_never_touch_the_record(caplog, monkeypatch):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    b = make_builder(CFG, "torch")
    record = b.buffers.violation
    cleared = []
    monkeypatch.setattr(record, "zero_", lambda: cleared.append(1) or record, raising=False)
    for batch in (clean(), clean(), AttentionBatch.from_lists([3], [1], [[7]], block_size=4)):
        step(b, batch)
    assert [r for r in caplog.records if r.name == LOGGER] == [] and not b.violations.logged
    assert cleared == [] and record.tolist() == [0, 0, 0, 0, 0]
    # The stand-in is what a poll would call: a violation does reach it.
    record[0] = 1
    record[1] = int(Violation.SEQ_SHORT)
    step(b, clean())
    step(b, clean())
    assert cleared == [1] and len(lines(caplog)) == 1


def test_check_still_raises_what_a_poll_took_off(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    b = make_builder(CFG, "torch")
    step(b, block_past_cache())
    step(b, clean())  # logs the block id and takes it off the device
    assert len(lines(caplog)) == 1 and "block_table" in lines(caplog)[0]
    assert b.buffers.violation.tolist() == [0, 0, 0, 0, 0]
    # The first violation since the last check is the block id, though a poll took it off the device.
    with pytest.raises(E.BatchRangeError, match="block_table") as info:
        b.check()
    assert info.value.index == 1
    b.check()  # cleared
    step(b, clean())
    step(b, clean())
    assert len(lines(caplog)) == 1
    # A check() between two polls: the violation it raised is not logged afterwards.
    step(b, seq_short())
    with pytest.raises(E.BatchRangeError, match="seq_lens"):
        b.check()
    step(b, clean())
    step(b, clean())
    assert len(lines(caplog)) == 1


def test_unguarded_builds_are_not_polled(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    b = make_builder(CFG, "torch", guard=False)
    b.buffers.violation.copy_(torch.tensor([1, int(Violation.SEQ_SHORT), 0, 1, 0], dtype=torch.int32))
    for _ in range(3):
        b.poll_violations()
    assert lines(caplog) == [] and b.buffers.violation.tolist()[0] == 1


def test_describe_names_field_request_and_value():
    from swa_hal.rules import violation_error

    record = [1, int(Violation.BLOCK), 4, 123, 0]
    error = violation_error(record, CFG)
    assert error is not None
    line = describe(record, error)
    assert line.startswith("swa_hal: a guarded build handed out empty rows: BatchRangeError: block_table: request 4")
    assert "[field=block_table request=4 value=123]" in line and "SWA_HAL_STRICT=1" in line


# -- the CUDA protocol, on host tensors with a stand-in event -----------------------------------------


class FakeEvent:
    """A CUDA event whose completion the test decides; synchronising it is counted."""

    def __init__(self) -> None:
        self.done = True
        self.recorded = 0
        self.synchronized = 0

    def record(self, stream=None) -> None:
        self.recorded += 1

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.synchronized += 1
        self.done = True


@pytest.fixture
def cuda_watch(monkeypatch):
    """A watch on the CUDA path over a host record: its host copy a separate tensor, copied as a
    non-blocking copy would land (at once; the event says when the watch may read it)."""
    capturing = {"on": False}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing["on"])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    record = torch.zeros(RECORD_LEN, dtype=torch.int32)
    watch = ViolationWatch(record, CFG, logger=logging.getLogger(LOGGER))
    watch.cuda = True
    watch._host = torch.zeros(RECORD_LEN, dtype=torch.int32)
    watch._view = watch._host.numpy()
    event = FakeEvent()
    watch._event = event
    return watch, record, event, capturing


def test_cuda_path_reads_only_landed_copies_and_never_syncs(cuda_watch, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    watch, record, event, capturing = cuda_watch
    watch.poll()  # starts the first copy
    assert event.recorded == 1
    record.copy_(torch.tensor([1, int(Violation.SEQ_SHORT), 2, 0, 0], dtype=torch.int32))
    watch.poll()  # the copy it reads was made before the violation: clean; starts the next copy
    assert lines(caplog) == [] and event.recorded == 2
    event.done = False
    for _ in range(3):  # in flight: no read, no new copy, no wait
        watch.poll()
    assert event.recorded == 2 and lines(caplog) == [] and record.tolist()[0] == 1
    event.done = True
    watch.poll()
    assert lines(caplog) == [describe([1, 2, 2, 0], watch_error(2, 2, 0))]
    assert record.tolist() == [0, 0, 0, 0, 0] and event.recorded == 2  # cleared; the next poll copies again
    watch.poll()
    assert event.recorded == 3
    assert event.synchronized == 0


def test_cuda_path_does_nothing_while_capturing(cuda_watch, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    watch, record, event, capturing = cuda_watch
    record.copy_(torch.tensor([1, int(Violation.BLOCK), 0, 99, 0], dtype=torch.int32))
    capturing["on"] = True
    for _ in range(3):
        watch.poll()
    assert event.recorded == 0 and record.tolist()[0] == 1 and watch._host.tolist() == [0, 0, 0, 0, 0]
    capturing["on"] = False
    watch.poll()
    watch.poll()
    assert len(lines(caplog)) == 1 and "[field=block_table request=0 value=99]" in lines(caplog)[0]


def test_cuda_path_take_waits_for_the_copy_in_flight(cuda_watch):
    watch, record, event, _ = cuda_watch
    record.copy_(torch.tensor([1, int(Violation.REPLAY), 3, 25, 0], dtype=torch.int32))
    watch.poll()
    event.done = False
    assert watch.take() == [1, int(Violation.REPLAY), 3, 25, 0] and event.synchronized == 1
    assert watch.take() is None


def watch_error(kind: int, request: int, value: int):
    from swa_hal.rules import violation_error

    return violation_error([1, kind, request, value, 0], CFG)


def test_a_gpu_watch_looks_at_every_nth_poll(cuda_watch, monkeypatch):
    """On CUDA looking costs a copy and two event calls, more host time than a build, so the builder's poll
    looks at every ``every``-th build only (docs/semantics.md #guarded-builds); the first poll looks."""
    watch, _, _, _ = cuda_watch
    watch.every = 4
    assert [watch.due() for _ in range(9)] == [True, False, False, False, True, False, False, False, True]
    b = make_builder(CFG, "torch")
    looks = []
    b.violations.cuda = True  # a CPU record taken for a GPU one: due() counts as on CUDA
    b.violations.every = 3
    monkeypatch.setattr(b.violations, "poll", lambda: looks.append(1))
    for _ in range(7):
        b.poll_violations()
    assert len(looks) == 3  # builds 1, 4 and 7


def test_the_cpu_watch_looks_at_every_poll():
    watch = ViolationWatch(torch.zeros(RECORD_LEN, dtype=torch.int32), CFG, every=16)
    assert all(watch.due() for _ in range(20))


def test_poll_every_comes_from_the_environment_and_is_checked(monkeypatch):
    record = torch.zeros(RECORD_LEN, dtype=torch.int32)
    assert ViolationWatch(record, CFG).every == 16
    monkeypatch.setenv("SWA_HAL_POLL_EVERY", "3")
    assert ViolationWatch(record, CFG).every == 3
    assert ViolationWatch(record, CFG, every=1).every == 1
    monkeypatch.setenv("SWA_HAL_POLL_EVERY", "0")
    with pytest.raises(ValueError, match="SWA_HAL_POLL_EVERY='0': must be at least 1"):
        ViolationWatch(record, CFG)
    with pytest.raises(ValueError, match="every=0: must be at least 1"):
        ViolationWatch(record, CFG, every=0)
    monkeypatch.setenv("SWA_HAL_POLL_EVERY", "x")
    with pytest.raises(ValueError, match="SWA_HAL_POLL_EVERY='x': must be an integer"):
        ViolationWatch(record, CFG)
