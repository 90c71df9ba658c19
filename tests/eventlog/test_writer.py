"""The writer: durable before record returns, group commit, failures, refusals, reopening."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from lifecycle.doubles import FakeRuntime
from structlog.testing import capture_logs

from eventlog import logs
from substrate_gpu import eventlog
from substrate_gpu.eventlog import EventLog, read_log
from substrate_gpu.lifecycle import events

pytestmark = pytest.mark.anyio


def _registrations(n: int, first_seq: int = 1) -> list[events.Event]:
    return [
        events.ActorRegistered(actor_id=f"a{i}", gpu=False, bundle="/b", seq=first_seq + i)
        for i in range(n)
    ]


class _Fsyncs:
    """Counts fdatasync calls and what the file held at each."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
        self.sizes: list[int] = []
        real = os.fdatasync

        def fdatasync(fd: int) -> None:
            real(fd)
            self.sizes.append(path.stat().st_size)

        monkeypatch.setattr(os, "fdatasync", fdatasync)


class _Metrics:
    def __init__(self) -> None:
        self.appends: list[tuple[float, int]] = []

    def event_log_append(self, seconds: float, batch_size: int) -> None:
        self.appends.append((seconds, batch_size))


async def test_a_new_log_starts_with_its_header_and_seq_0(log_path: Path) -> None:
    """Creating a log writes the versioned header (atomically) and nothing else."""
    async with await EventLog.open(log_path) as log:
        assert log.last_seq == 0
        assert log.torn_tail is None
    assert log_path.read_text() == logs.header() + "\n"


async def test_record_returns_only_once_the_event_is_fsynced(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When record returns, an fdatasync has covered the event's whole line."""
    fsyncs = _Fsyncs(monkeypatch, log_path)
    async with await EventLog.open(log_path) as log:
        event = _registrations(1)[0]
        await log.record(event)
        assert fsyncs.sizes and fsyncs.sizes[-1] == log_path.stat().st_size
        assert log_path.read_text().endswith(event.to_json() + "\n")
        assert log.last_seq == 1


async def test_concurrent_records_share_one_fsync(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: 200 concurrent records take far fewer than 200 fsyncs, in seq order."""
    fsyncs = _Fsyncs(monkeypatch, log_path)
    metrics = _Metrics()
    async with await EventLog.open(log_path, metrics=metrics) as log:
        async with anyio.create_task_group() as tg:
            for event in _registrations(200):
                tg.start_soon(log.record, event)
    assert len(fsyncs.sizes) < 20
    assert sum(size for _, size in metrics.appends) == 200
    assert max(size for _, size in metrics.appends) > 1
    assert [e.seq for e in read_log(log_path).events] == list(range(1, 201))


async def test_a_lone_recorder_does_not_linger(log_path: Path) -> None:
    """One event at a time is written at once (max_delay only applies while a batch grows)."""
    async with await EventLog.open(log_path, max_delay=5.0) as log:
        with anyio.fail_after(2):
            for event in _registrations(3):
                await log.record(event)


async def test_a_record_takes_its_place_before_its_first_await(log_path: Path) -> None:
    """Records started in order are logged in that order even when they wait together."""
    async with await EventLog.open(log_path) as log:
        batch = _registrations(50)
        async with anyio.create_task_group() as tg:
            for event in batch:
                tg.start_soon(log.record, event)
    assert [e.actor_id for e in read_log(log_path).events] == [e.actor_id for e in batch]


@pytest.mark.parametrize("seq", [0, 1], ids=["unstamped", "repeated"])
async def test_an_event_out_of_seq_order_is_refused(log_path: Path, seq: int) -> None:
    """Each event is logged once, stamped, in acceptance order."""
    async with await EventLog.open(log_path) as log:
        await log.record(_registrations(1)[0])
        with pytest.raises(eventlog.EventLogError, match="does not follow 1"):
            await log.record(events.RunRequested(actor_id="a0", seq=seq))


async def test_a_write_failure_fails_the_log_for_good(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failing batch's recorders and every later one get an EventLogError."""
    async with await EventLog.open(log_path) as log:

        def broken(fd: int) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "fdatasync", broken)
        with pytest.raises(eventlog.EventLogError, match="No space left"):
            await log.record(_registrations(1)[0])
        monkeypatch.undo()
        with pytest.raises(eventlog.EventLogError, match="failed earlier"):
            await log.record(_registrations(1, first_seq=2)[0])


async def test_a_closed_log_accepts_nothing(log_path: Path) -> None:
    """aclose is final (and idempotent)."""
    log = await EventLog.open(log_path)
    await log.aclose()
    await log.aclose()
    with pytest.raises(eventlog.EventLogError, match="closed"):
        await log.record(_registrations(1)[0])


async def test_reopening_continues_after_the_last_seq(log_path: Path) -> None:
    """last_seq after open is the log's; appends continue the same file."""
    async with await EventLog.open(log_path) as log:
        for event in _registrations(3):
            await log.record(event)
    async with await EventLog.open(log_path) as log:
        assert log.last_seq == 3
        await log.record(events.BundlePrepared(actor_id="a0", bundle="/b", seq=4))
    assert [e.seq for e in read_log(log_path).events] == [1, 2, 3, 4]


async def test_a_refusal_is_logged_as_a_rejection_record(log_path: Path) -> None:
    """record_rejected writes the unstamped event, the state and the problem."""
    async with await EventLog.open(log_path) as log:
        await log.record(_registrations(1)[0])
        await log.record_rejected(events.SuspendRequested(actor_id="a0"), "registered", "nope")
    contents = read_log(log_path)
    assert contents.rejections == [
        eventlog.Rejection(event=contents.rejections[0].event, state="registered", problem="nope")
    ]
    assert contents.rejections[0].event.type == "suspend_requested"
    assert contents.last_seq == 1


# --- the seq mark: a log that lost its tail never hands a seq out twice (issue 22) ----------


async def _two_acknowledged_then_cut(log_path: Path, cut: int | None) -> None:
    """``cut`` bytes off the end; ``None``: the whole last line, as written (its length
    depends on the record's timestamp, so it is measured on the file)."""
    async with await EventLog.open(log_path) as log:
        for event in _registrations(2):
            await log.record(event)  # returned: acknowledged
    data = log_path.read_bytes()
    size = data.rindex(b"\n", 0, len(data) - 1) + 1 if cut is None else len(data) - cut
    with log_path.open("r+b") as f:
        f.truncate(size)


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(5, id="mid-line"),
        pytest.param(None, id="whole-line"),
    ],
)
async def test_a_log_cut_below_an_acknowledged_seq_never_reuses_it(
    log_path: Path, cut: int | None
) -> None:
    """Seq 1 and 2 acknowledged, the file then cut into (or past) line 2: the reopened log
    says seq 2 is gone and may have been acknowledged, and numbers the next event 3."""
    await _two_acknowledged_then_cut(log_path, cut)
    assert read_log(log_path).last_seq == 1
    with capture_logs() as logged:
        log = await EventLog.open(log_path)
    async with log:
        assert log.last_seq == 2
        with pytest.raises(eventlog.EventLogError, match="does not follow 2"):
            await log.record(events.BundlePrepared(actor_id="a0", bundle="/b", seq=2))
        await log.record(events.BundlePrepared(actor_id="a0", bundle="/b", seq=3))
    (warning,) = [e for e in logged if e["log_level"] == "warning"]
    assert "seq 2 was logged" in warning["detail"]
    assert "may have been acknowledged" in warning["detail"]
    assert "never acknowledged" not in str(warning)
    assert [e.seq for e in read_log(log_path).events] == [1, 3]


async def test_recovery_resumes_numbering_after_the_seq_mark(
    log_path: Path, runtime: FakeRuntime
) -> None:
    """The agent's resume point (what it numbers new events after) is the mark, not the cut
    log's last line."""
    await _two_acknowledged_then_cut(log_path, 5)
    recovered = await eventlog.recover(log_path, runtime=runtime)
    assert recovered.resume.last_seq == recovered.last_seq == 2


async def test_a_torn_line_above_the_mark_was_never_acknowledged(log_path: Path) -> None:
    """A crash mid-write (the line never reached its fsync, so the mark never moved) is still
    reported as never acknowledged, and its seq is free to be given again."""
    async with await EventLog.open(log_path) as log:
        await log.record(_registrations(1)[0])
    with log_path.open("ab") as f:
        f.write(_registrations(1, first_seq=2)[0].to_json().encode()[:-5])
    with capture_logs() as logged:
        log = await EventLog.open(log_path)
    async with log:
        assert log.last_seq == 1
    (warning,) = [e for e in logged if e["log_level"] == "warning"]
    assert "before it was acknowledged" in warning["tail"]


async def test_the_mark_is_fdatasynced_after_the_log_before_record_returns(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch: the log's line is synced, then the mark (holding the batch's seq) is
    synced, and only then does record return: a mark written but not synced could be lost
    with the power while its seq was acknowledged."""
    mark = log_path.parent / "events.jsonl.seq"
    synced: list[tuple[str, bytes]] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        real(fd)
        name = Path(os.readlink(f"/proc/self/fd/{fd}")).name
        synced.append((name, mark.read_bytes() if name == mark.name else b""))

    async with await EventLog.open(log_path) as log:
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        for event in _registrations(2):
            await log.record(event)
            assert synced[-2:] == [
                ("events.jsonl", b""),
                (mark.name, f"{event.seq:020d}\n".encode()),
            ], synced


async def test_a_damaged_seq_mark_is_a_clear_error(log_path: Path) -> None:
    """A mark that is not one stops the open, naming the file and what to do."""
    async with await EventLog.open(log_path) as log:
        await log.record(_registrations(1)[0])
    (log_path.parent / "events.jsonl.seq").write_bytes(b"garbage")
    with pytest.raises(eventlog.EventLogError, match=r"events.jsonl.seq .* is damaged"):
        await EventLog.open(log_path)
