"""Rotation: a snapshot plus a fresh segment; a crash at any step leaves a readable log."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from eventlog import logs
from substrate_gpu import eventlog
from substrate_gpu.eventlog import EventLog, read_log, replay, writer
from substrate_gpu.eventlog.replayer import Replayer
from substrate_gpu.lifecycle import events

pytestmark = pytest.mark.anyio


def _files(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


async def test_a_long_log_rotates_into_a_snapshot_and_a_short_segment(
    log_path: Path, tmp_path: Path
) -> None:
    """Past rotate_bytes the segment restarts after a snapshot; replay gives the same states."""
    live = await logs.short_life(log_path, tmp_path, rotate_bytes=1500)
    contents = read_log(log_path)
    assert contents.snapshot is not None and contents.header.base_seq == contents.snapshot.seq
    assert _files(log_path) == [
        "events.jsonl",
        "events.jsonl.seq",
        f"events.jsonl.snapshot-{contents.header.base_seq}.json",
    ]
    assert log_path.stat().st_size < 1500 + 400
    result = replay(log_path)
    assert result.actors == live  # the deleted CPU actor included
    assert result.snapshot_seq == contents.header.base_seq


async def test_without_rotate_bytes_the_log_never_rotates(log_path: Path, tmp_path: Path) -> None:
    """rotate_bytes=None keeps one growing segment (and no machine copy in the writer)."""
    await logs.short_life(log_path, tmp_path, rotate_bytes=None)
    assert _files(log_path) == ["events.jsonl", "events.jsonl.seq"]
    assert read_log(log_path).header.base_seq == 0


class _Crash(Exception):
    """The agent 'dies' here."""


def _states_at(reference: Path, seq: int) -> dict[str, object]:
    """The reference log's states after its events up to ``seq``."""
    replayer = Replayer()
    replayer.feed(reference, [e for e in read_log(reference).events if e.seq <= seq])
    return dict(replayer.views())


@pytest.mark.parametrize(
    "step",
    [
        pytest.param("write_snapshot_step", id="while-writing-the-snapshot"),
        pytest.param("switch_segment_step", id="after-the-snapshot-before-the-new-segment"),
        pytest.param("remove_stale_step", id="after-the-new-segment-before-cleanup"),
    ],
)
async def test_a_crash_at_any_rotation_step_leaves_a_readable_log(
    log_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """The events of a real run re-recorded into a rotating log that dies at ``step`` of its
    first rotation: the log reads back to the states of every event made durable, and
    reopening it cleans up the leftovers and appends normally."""
    reference = tmp_path / "reference" / "events.jsonl"
    await logs.short_life(reference, tmp_path / "reference", rotate_bytes=None)
    real = getattr(writer, step)

    def crash(*args: object, **kwargs: object) -> object:
        if step == "write_snapshot_step":
            # Die half-way: the snapshot's temp file exists, the snapshot does not.
            tmp = log_path.with_name(f".{log_path.name}.snapshot-x.json.tmp")
            tmp.write_text('{"format": "substrate-gpu-eventlog-snap')
            raise _Crash
        real(*args, **kwargs)
        raise _Crash

    monkeypatch.setattr(writer, step, crash)
    durable = 0
    async with await EventLog.open(log_path, rotate_bytes=1500) as log:
        with pytest.raises(eventlog.EventLogError, match="failed earlier"):
            for event in read_log(reference).events:
                await log.record(event)
                durable = event.seq
    monkeypatch.undo()
    assert 0 < durable < read_log(reference).last_seq
    crashed = replay(log_path)
    assert crashed.last_seq == durable
    assert {a: v for a, v in crashed.actors.items() if v.state != "deleted"} == _states_at(
        reference, durable
    )
    # Reopening removes what the crash left behind and appends after the last seq.
    async with await EventLog.open(log_path, rotate_bytes=1500) as log:
        assert log.last_seq == durable
        header = read_log(log_path).header
        kept = [f"events.jsonl.snapshot-{header.base_seq}.json"] if header.snapshot else []
        assert _files(log_path) == sorted(["events.jsonl", "events.jsonl.seq", *kept])
        await log.record(
            events.ActorRegistered(actor_id="late", gpu=False, bundle="/b", seq=durable + 1)
        )
    after = replay(log_path)
    assert after.actors["late"].state == "registered"
    assert {a: v for a, v in after.actors.items() if a != "late"} == crashed.actors


def test_a_snapshot_written_before_pid_tracked_contexts_still_reads(tmp_path: Path) -> None:
    """Snapshot views without ``checkpoint_cuda_pids``/``context_pids`` (written before the
    fields existed) load with both empty; everything else as written."""
    import json

    from substrate_gpu.eventlog import snapshot

    old_view = {
        "actor_id": "a", "state": "suspended", "gpu": True, "bundle": "/b/a",
        "checkpoint": "/ck/a/1", "live_contexts": 0, "sandbox": False, "reason": None,
        "exited": False, "suspend_policy": "auto", "suspend_route": "", "cuda_pids": "",
    }  # fmt: skip
    path = tmp_path / "events.jsonl.snapshot-5.json"
    path.write_text(
        json.dumps(
            {
                "format": snapshot.FORMAT,
                "v": 1,
                "seq": 5,
                "at": 1.0,
                "actors": [old_view],
                "causes": {},
            }
        )
    )
    (view,) = snapshot.read(path, seq=5).actors
    assert (view.state, view.checkpoint, view.checkpoint_cuda_pids, view.context_pids) == (
        "suspended", "/ck/a/1", "", "",
    )  # fmt: skip


async def test_a_rotation_without_a_descriptor_is_postponed_not_fatal(
    log_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EMFILE writing the snapshot (the only step that opens files before anything is
    switched) postpones the rotation: every record is still acknowledged, a later batch
    rotates, and the log replays to the same states."""
    reference = tmp_path / "reference" / "events.jsonl"
    await logs.short_life(reference, tmp_path / "reference", rotate_bytes=None)
    real = writer.write_snapshot_step
    refused = 0

    def no_descriptor(*args: object, **kwargs: object) -> Path:
        nonlocal refused
        if refused < 3:
            refused += 1
            raise OSError(errno.EMFILE, "Too many open files")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(writer, "write_snapshot_step", no_descriptor)
    monkeypatch.setattr(writer, "ROTATE_RETRY", 0.0)
    async with await EventLog.open(log_path, rotate_bytes=1500) as log:
        for event in read_log(reference).events:
            await log.record(event)
        assert log.rotations >= 1
    assert refused == 3
    assert read_log(log_path).header.base_seq > 0
    assert replay(log_path).actors == replay(reference).actors
