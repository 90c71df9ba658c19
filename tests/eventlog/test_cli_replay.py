"""``substrate-gpu replay``: timelines, final states, --actor, --json, exit codes."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from eventlog import logs
from substrate_gpu.cli import _replay
from substrate_gpu.eventlog import format
from substrate_gpu.lifecycle import events

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


def test_json_final_lists_are_lists(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json: GPU names and pids come out as the lists the log has, not joined strings."""
    names = ("nvidia.com/gpu=0", "nvidia.com/gpu=1")
    registered = events.ActorRegistered(
        actor_id="a", gpu=True, bundle="/b", gpu_names=names, seq=1, at=1.0
    )
    log = logs.write_lines(tmp_path / "events.jsonl", logs.header(), registered.to_json())
    assert _run(str(log), "--json") == 0
    final = json.loads(capsys.readouterr().out)["actors"]["a"]["final"]
    assert final["gpu_names"] == list(names)
    assert final["gpu_devices"] == [] and final["context_pids"] == []


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


def test_a_line_missing_from_the_middle_is_a_warning_naming_its_seq(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seq 2 deleted between 1 and 3: replayed without it, the warning names it."""
    log = logs.write_lines(
        tmp_path / "events.jsonl", logs.header(), logs.registered("a", 1), logs.registered("c", 3)
    )
    assert _run(str(log)) == 0
    captured = capsys.readouterr()
    assert "warning" in captured.err and "seq 2 missing from the log" in captured.err


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


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        pytest.param(
            '{"type":"cuda_context_opened","v":1,"actor_id":"a","seq":2,"at":1.0,"pid":"7"}',
            "Expected `int`, got `str` - at `$.pid`",
            id="wrong-type",
        ),
        pytest.param(
            '{"type":"run_requested","v":1,"actor_id":"a","seq":2,"at":-1e300}',
            "Expected `float` >= 0.0 - at `$.at`",
            id="at-out-of-range",
        ),
        pytest.param("[" * 2000, "must be a JSON object", id="deep-nesting"),
    ],
)
def test_a_bad_field_is_named_by_its_path_in_the_replay_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str, says: str
) -> None:
    """replay exits 1 with one line naming the file, the line and the field: no traceback."""
    log = tmp_path / "events.jsonl"
    logs.write_lines(log, logs.header(), logs.registered("a", 1), bad)
    assert _run(str(log)) == 1
    err = capsys.readouterr().err
    assert f"{log}:3" in err and says in err
    assert "Traceback" not in err and err.count("\n") == 1


def _refused(actor_id: str) -> str:
    """A rejection line: an event for an actor the agent never knew."""
    return format.Rejection(
        event=events.RunRequested(actor_id=actor_id, at=2.0), state="new", problem="unknown actor"
    ).to_json()


def test_a_file_that_is_not_an_event_log_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pool YAML given by mistake: "not an event log", not "restore it from a backup"."""
    other = tmp_path / "pool.yaml"
    other.write_text("apiVersion: substrate.io/v1alpha1\nkind: WorkerPool\n")
    assert _run(str(other)) == 1
    err = capsys.readouterr().err
    assert f"{other} is not an event log" in err
    assert "backup" not in err


def test_a_log_with_a_newer_header_keeps_the_upgrade_advice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An event log of another version is an event log: the reader's advice stands."""
    log = logs.write_lines(tmp_path / "events.jsonl", '{"format":"substrate-gpu-eventlog","v":99}')
    assert _run(str(log)) == 1
    err = capsys.readouterr().err
    assert "not an event log" not in err and "upgrade" in err


def test_an_unknown_actor_exits_1_naming_the_closest_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--actor with an id the log never saw is a mistake, answered with the nearest ids."""
    log = logs.write_lines(
        tmp_path / "events.jsonl",
        logs.header(),
        logs.registered("gpu-1", 1),
        logs.registered("gpu-2", 2),
        logs.registered("cpu-7", 3),
    )
    assert _run(str(log), "--actor", "gpu-3") == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no actor 'gpu-3' in" in captured.err
    assert "did you mean gpu-1, gpu-2?" in captured.err


def test_the_header_counts_the_actors_it_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An actor seen only in refused events is printed, so it is counted."""
    log = logs.write_lines(
        tmp_path / "events.jsonl", logs.header(), logs.registered("a", 1), _refused("ghost")
    )
    assert _run(str(log)) == 0
    out = capsys.readouterr().out
    assert out.count("\nactor ") == 2
    assert "2 actor(s)" in out.splitlines()[0]


def test_the_header_counts_only_the_chosen_actor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --actor, the header counts the one actor printed."""
    log = logs.write_lines(
        tmp_path / "events.jsonl", logs.header(), logs.registered("a", 1), logs.registered("b", 2)
    )
    assert _run(str(log), "--actor", "b") == 0
    assert "1 actor(s)" in capsys.readouterr().out.splitlines()[0]


def test_replay_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`replay LOG | head -1`: exit without a BrokenPipe traceback once the reader is gone."""
    log = logs.write_lines(
        tmp_path / "events.jsonl",
        logs.header(),
        *(logs.registered(f"actor-{i}", i) for i in range(1, 3001)),
    )
    pipeline = (
        f"{shlex.quote(sys.executable)} -m substrate_gpu replay {shlex.quote(str(log))} | head -1"
    )
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", pipeline],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.startswith(f"{log}: 3000 event(s) replayed")
    assert done.stderr == ""
    assert done.returncode in (0, 141)  # 141: SIGPIPE, as any filter cut short by head
