"""``substrate-gpu replay``: timelines, final states, --actor, --json, exit codes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from eventlog import logs
from substrate_gpu.cli import _replay

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="substrate-gpu")
    _replay.register(parser.add_subparsers())
    args = parser.parse_args(["replay", *argv])
    return int(args.handler(args))


def test_the_timeline_shows_each_transition_and_the_final_state(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """seq, time, event, from -> to (with the reason), then the final state, per actor."""
    assert _run(str(SCENARIOS / "suspend_refused_then_accepted.jsonl")) == 0
    out = capsys.readouterr().out
    assert "actor gpu-1" in out and "actor gpu-2" in out
    assert "2026-01-01T00:00:01.000Z  actor_registered     new -> registered" in out
    assert "suspend_requested    running -> running  (suspend refused:" in out
    assert "final: suspended (gpu, checkpoint /var/lib/substrate/checkpoints/gpu-1/" in out


def test_refused_events_appear_in_the_timeline(capsys: pytest.CaptureFixture[str]) -> None:
    """A rejection record is shown where it happened, with the state and the problem."""
    assert _run(str(SCENARIOS / "event_out_of_order_rejected.jsonl")) == 0
    out = capsys.readouterr().out
    assert "run_requested        REFUSED in new: unknown actor" in out
    assert "4 refusal(s)" in out


def test_actor_filters_the_timeline(capsys: pytest.CaptureFixture[str]) -> None:
    """--actor prints one actor only."""
    assert _run(str(SCENARIOS / "suspend_refused_then_accepted.jsonl"), "--actor", "gpu-2") == 0
    out = capsys.readouterr().out
    assert "actor gpu-2" in out and "actor gpu-1" not in out


def test_json_output_is_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    """--json: final views and timelines per actor, machine-readable."""
    assert _run(str(SCENARIOS / "happy_gpu_actor.jsonl"), "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    actor = doc["actors"]["gpu-1"]
    assert actor["final"]["state"] == "deleted"
    assert actor["timeline"][0] == {
        "seq": 1,
        "at": 1767225601.0,
        "event": "actor_registered",
        "from": "new",
        "to": "registered",
        "reason": None,
    }
    assert doc["torn_tail"] is None and doc["events_replayed"] == len(actor["timeline"])


def test_a_torn_tail_is_a_warning_and_exit_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The torn line was never acknowledged: replay what is there, say what was dropped."""
    log = logs.write_lines(
        tmp_path / "events.jsonl", logs.header(), logs.registered("a", 1), tail='{"type":"bun'
    )
    assert _run(str(log)) == 0
    captured = capsys.readouterr()
    assert "warning" in captured.err and "torn last line 3 (12 bytes at offset" in captured.err
    assert "final: registered" in captured.out


def test_a_corrupt_log_exits_1_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad complete line is an error: the message names file and line."""
    log = logs.write_lines(
        tmp_path / "events.jsonl", logs.header(), "{oops", logs.registered("a", 2)
    )
    assert _run(str(log)) == 1
    assert f"{log}:2" in capsys.readouterr().err


def test_a_missing_log_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing to read is a failure, not an empty timeline."""
    assert _run(str(tmp_path / "nope.jsonl")) == 1
    assert "no event log at" in capsys.readouterr().err


@pytest.mark.parametrize("at", [-1e300, 1e300, 1e20])
def test_a_logged_time_no_calendar_can_show_is_a_warning_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], at: float
) -> None:
    """An ``at`` older agents accepted (-1e300): the timeline shows the raw value, exit 0."""
    line = logs.registered("a", 1).replace('"at":1.0', f'"at":{at!r}')
    assert f"{at!r}" in line
    log = logs.write_lines(tmp_path / "events.jsonl", logs.header(), line)
    assert _run(str(log)) == 0
    captured = capsys.readouterr()
    assert "final: registered" in captured.out
    assert f"{at!r}" in captured.out
    assert "warning" in captured.err and "seq 1" in captured.err and "'at'" in captured.err
