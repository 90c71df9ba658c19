"""The writer's guards: one writer per log (a lock), and no ack into a file the path lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from substrate_gpu import eventlog
from substrate_gpu.eventlog import EventLog, read_log
from substrate_gpu.lifecycle import events

pytestmark = pytest.mark.anyio


def _registered(actor_id: str, seq: int) -> events.Event:
    return events.ActorRegistered(actor_id=actor_id, gpu=False, bundle="/b", seq=seq)


async def test_the_lock_is_exclusive_and_names_its_holder(log_path: Path) -> None:
    """A second lock on the same log fails at once, naming the holding process."""
    with eventlog.lock(log_path) as held:
        assert held.path == log_path.with_name("events.jsonl.lock")
        with pytest.raises(eventlog.EventLogLocked, match=f"pid {os.getpid()}") as caught:
            eventlog.lock(log_path)
        assert caught.value.holder == os.getpid()
        assert str(log_path) in str(caught.value)


async def test_the_lock_is_released_when_closed(log_path: Path) -> None:
    """After the holder releases it, the next one gets it."""
    with eventlog.lock(log_path):
        pass
    with eventlog.lock(log_path):
        pass


def test_the_lock_holds_across_processes(log_path: Path) -> None:
    """Another process cannot take the lock while this one holds it; it can once released."""
    probe = (
        "import sys; from pathlib import Path; from substrate_gpu import eventlog\n"
        "try:\n    eventlog.lock(Path(sys.argv[1])).close()\n"
        "except eventlog.EventLogLocked as e:\n    print(e.holder); sys.exit(3)\n"
    )
    with eventlog.lock(log_path):
        held = subprocess.run(
            [sys.executable, "-c", probe, str(log_path)],
            capture_output=True,
            text=True,
            check=False,
        )
    assert (held.returncode, held.stdout.strip()) == (3, str(os.getpid()))
    free = subprocess.run(
        [sys.executable, "-c", probe, str(log_path)], capture_output=True, check=False
    )
    assert free.returncode == 0


def test_a_lock_that_cannot_be_created_is_an_event_log_error(tmp_path: Path) -> None:
    """No directory possible for the lock file: an EventLogError naming it, not an OSError."""
    (tmp_path / "a-file").write_text("")
    with pytest.raises(eventlog.EventLogError, match=r"events\.jsonl\.lock"):
        eventlog.lock(tmp_path / "a-file" / "events.jsonl")


async def test_no_ack_after_the_log_file_is_unlinked(log_path: Path) -> None:
    """The log removed under the writer: record raises, and the log fails for good."""
    async with await EventLog.open(log_path) as log:
        await log.record(_registered("a", 1))
        log_path.unlink()
        with pytest.raises(eventlog.EventLogError, match="no longer names"):
            await log.record(_registered("b", 2))
        with pytest.raises(eventlog.EventLogError, match="failed earlier"):
            await log.record(_registered("c", 3))


async def test_no_ack_after_the_log_path_is_replaced(log_path: Path) -> None:
    """Another file renamed over the log: record raises; the replacement is left alone."""
    async with await EventLog.open(log_path) as log:
        await log.record(_registered("a", 1))
        other = log_path.with_name("other.jsonl")
        other.write_text("not ours\n")
        other.rename(log_path)
        with pytest.raises(eventlog.EventLogError, match="no longer names"):
            await log.record(_registered("b", 2))
    assert log_path.read_text() == "not ours\n"


async def test_rotation_keeps_the_path_check_true(log_path: Path) -> None:
    """The writer's own rotation replaces the file: acks continue on the new segment."""
    async with await EventLog.open(log_path, rotate_bytes=200) as log:
        for seq in range(1, 21):
            await log.record(_registered(f"a{seq}", seq))
        assert log.rotations > 0
    assert read_log(log_path).last_seq == 20


async def test_opening_a_log_the_process_cannot_write_is_an_event_log_error(
    log_path: Path,
) -> None:
    """A log that cannot be opened for writing: EventLogError naming the file."""
    async with await EventLog.open(log_path) as log:
        await log.record(_registered("a", 1))
    log_path.unlink()
    log_path.mkdir()  # a directory where the log should be: open(O_WRONLY) fails
    with pytest.raises(eventlog.EventLogError, match=str(log_path)):
        await EventLog.open(log_path)


async def test_the_unlinked_check_costs_one_stat_per_batch(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent records sharing an fsync share the path check too."""
    stats: list[object] = []
    real = os.stat

    def counting(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if path == log_path:
            stats.append(path)
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    async with await EventLog.open(log_path, max_delay=0.05) as log:
        monkeypatch.setattr(os, "stat", counting)
        async with anyio.create_task_group() as tg:
            for seq in range(1, 51):
                tg.start_soon(log.record, _registered(f"a{seq}", seq))
        monkeypatch.undo()
    assert 1 <= len(stats) < 10
