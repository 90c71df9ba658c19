"""SIGKILL the agent process mid-stream, restart it on the same log: no acknowledged event
lost, no effect run twice, the same final states (tests/eventlog/kill_driver.py)."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from substrate_gpu.eventlog import read_log, replay

DRIVER = Path(__file__).with_name("kill_driver.py")
sys.path.insert(0, str(DRIVER.parent))
from kill_driver import ACTORS, GOALS  # noqa: E402

EFFECT_STATES = {
    "create": "creating",
    "start": "starting",
    "checkpoint": "checkpointing",
    "restore": "restoring",
}


def _start(root: Path, phase: str, rotate: str = "4096") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(DRIVER), str(root), phase, rotate],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def _acks_until_killed(
    root: Path, phase: str, after: int, rotate: str = "4096"
) -> list[tuple[str, str, float, int]]:
    """Run ``phase``; SIGKILL it once ``after`` events were acknowledged; the acks."""
    acks: list[tuple[str, str, float, int]] = []
    with _start(root, phase, rotate) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            data = json.loads(line)
            if "ack" in data:
                acks.append(tuple(data["ack"]))  # type: ignore[arg-type]
                if len(acks) >= after:
                    proc.send_signal(signal.SIGKILL)
                    break
        proc.wait(timeout=30)
        err = proc.stderr.read()
    assert proc.returncode == -signal.SIGKILL, err
    return acks


def _run_to_end(
    root: Path, phase: str, rotate: str = "4096", reconciled: list[str] | None = None
) -> tuple[list[tuple[str, str, float, int]], dict[str, str]]:
    """Run ``phase`` to its end: the acks and the final states (``reconciled`` gets the
    recovery's report lines)."""
    with _start(root, phase, rotate) as proc:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    acks, final = [], {}
    for line in out.splitlines():
        data = json.loads(line)
        if "ack" in data:
            acks.append(tuple(data["ack"]))
        if reconciled is not None:
            reconciled.extend(data.get("reconciled", ()))
        final = data.get("final", final)
    return acks, final  # type: ignore[return-value]


def _check(root: Path, acked: list[tuple[str, str, float, int]], final: dict[str, str]) -> None:
    log = root / "events.jsonl"
    result = replay(log)
    # Every acknowledged event is in the log under the seq it was acknowledged with, or
    # (after a rotation) older than the snapshot that now stands for it.
    contents = read_log(log)
    logged = {(e.actor_id, e.type, e.at, e.seq) for e in contents.events}
    assert len({a[3] for a in acked}) == len(acked)
    assert {a for a in acked if a[3] > contents.header.base_seq} <= logged
    # The same final states as an uninterrupted run: each actor at its last goal ...
    assert final == {a: GOALS[a][-1] for a in ACTORS}
    # ... which is also what the log replays to, and what the runtime holds.
    assert {a: v.state for a, v in result.actors.items()} == final
    for actor, state in final.items():
        container = root / "runtime" / f"{actor}.json"
        if state == "running":
            assert json.loads(container.read_text())["status"] == "running"
        else:
            assert not container.exists(), (actor, state)
    # No effect ran twice: every runtime action the journal shows is backed by its own
    # logged entry into the effect's state, and no checkpoint image was written twice.
    journal = [json.loads(line) for line in (root / "runtime-calls.jsonl").read_text().splitlines()]
    assert [j for j in journal if j["op"] == "error"] == []
    images = [j["image"] for j in journal if j["op"] == "checkpoint"]
    assert len(images) == len(set(images))


def _entries(root: Path) -> collections.Counter[tuple[str, str]]:
    """Entries into each in-flight state per actor over the log's whole history."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for t in replay(root / "events.jsonl").transitions:
        if t.source != t.dest:
            counts[(t.actor_id, t.dest)] += 1
    return counts


def _effects(root: Path) -> collections.Counter[tuple[str, str]]:
    journal = [json.loads(line) for line in (root / "runtime-calls.jsonl").read_text().splitlines()]
    return collections.Counter(
        (j["cid"], EFFECT_STATES[j["op"]]) for j in journal if j["op"] in EFFECT_STATES
    )


@pytest.mark.parametrize("after", [7, 23, 37])
def test_sigkill_mid_stream_then_recovery_loses_nothing_and_repeats_nothing(
    tmp_path: Path, after: int
) -> None:
    """Killed after ``after`` acks (effects in flight), restarted on the same log."""
    acked = _acks_until_killed(tmp_path, "first", after)
    more, final = _run_to_end(tmp_path, "recover")
    _check(tmp_path, acked + more, final)


def test_no_effect_runs_more_often_than_the_log_entered_its_state(tmp_path: Path) -> None:
    """Without rotation in the way: each create/start/checkpoint/restore the runtime did is
    matched by a distinct logged entry into creating/starting/checkpointing/restoring,
    across two kills and two recoveries."""
    acked = _acks_until_killed(tmp_path, "first", 15, "none")
    acked += _acks_until_killed(tmp_path, "recover", 3, "none")
    more, final = _run_to_end(tmp_path, "recover", "none")
    _check(tmp_path, acked + more, final)
    assert read_log(tmp_path / "events.jsonl").snapshot is None
    entries, effects = _entries(tmp_path), _effects(tmp_path)
    assert effects and all(n <= entries[key] for key, n in effects.items()), (effects, entries)


def _acks_until_window(root: Path, outcome: str, follow: str) -> list[tuple[str, str, float, int]]:
    """Drive actor a0 until ``outcome`` is appended and will never be fsynced, then SIGKILL
    the driver once the runtime journal shows ``follow`` (the effect after it) done."""
    acks: list[tuple[str, str, float, int]] = []
    journal = root / "runtime-calls.jsonl"
    with _start(root, f"window:{outcome}", "none") as proc:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            data = json.loads(line)
            if "ack" in data:
                acks.append(tuple(data["ack"]))  # type: ignore[arg-type]
            if data.get("window") == outcome:
                break
        deadline = time.monotonic() + 10
        while not any(json.loads(j)["op"] == follow for j in journal.read_text().splitlines()[-2:]):
            assert time.monotonic() < deadline, f"{follow} never ran after {outcome}"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        err = proc.stderr.read()
    assert proc.returncode == -signal.SIGKILL, err
    return acks


@pytest.mark.parametrize(
    ("outcome", "follow", "left_in", "derived"),
    [
        pytest.param(
            "sandbox_created",
            "start",
            "creating",
            "-> sandbox_created, sandbox_started",
            id="start-ran-before-sandbox_created-was-durable",
        ),
        pytest.param(
            "checkpoint_written",
            "delete",
            "checkpointing",
            "-> checkpoint_written",
            id="killed-before-checkpoint_written-was-durable",
        ),
    ],
)
def test_an_outcome_left_to_the_next_fsync_is_derived_again_after_a_kill(
    tmp_path: Path, outcome: str, follow: str, left_in: str, derived: str
) -> None:
    """The pipeline does not wait for ``sandbox_created`` before ``start`` runs, nor for
    ``checkpoint_written`` (their fsync is the next one's: docs/event-log.md, "When an
    event is durable"). Killed after the effect that follows ran and before that fsync, the
    log leaves the actor in the effect's state; recovery derives the lost outcome again from
    the runtime (created and started; gone, with its image whole) and logs it: nothing
    acknowledged is lost, no effect runs twice, and the lives end where they would have."""
    acked = _acks_until_window(tmp_path, outcome, follow)
    log = tmp_path / "events.jsonl"
    assert outcome not in {e.type for e in read_log(log).events if e.actor_id == "a0"}
    assert replay(log).actors["a0"].state == left_in
    reconciled: list[str] = []
    more, final = _run_to_end(tmp_path, "recover", "none", reconciled)
    (line,) = [line for line in reconciled if line.startswith("actor a0:")]
    assert derived in line, line
    _check(tmp_path, acked + more, final)
    entries, effects = _entries(tmp_path), _effects(tmp_path)
    assert all(n <= entries[key] for key, n in effects.items()), (effects, entries)
    assert outcome in {e.type for e in read_log(log).events if e.actor_id == "a0"}
