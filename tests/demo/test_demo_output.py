"""What the demo prints: one event log (the kept one), each refusal once, what is simulated."""

from __future__ import annotations

import io
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from substrate_gpu import cli
from substrate_gpu.testing import demo


@pytest.fixture
def no_runc(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process runtime: the output's shape is the same, and it runs in seconds."""
    monkeypatch.setattr(demo, "choose_runtime", lambda: (None, "in-process simulated runsc (test)"))


@pytest.fixture
def temp_demo(no_runc: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """One demo in a temporary workdir (the default), its output."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = io.StringIO()
    demo.main(None, out)
    return out.getvalue()


def test_the_demo_names_one_event_log_and_it_is_kept(temp_demo: str) -> None:
    """Only the log that survives the run is named, and it is there afterwards."""
    named = set(re.findall(r"(/\S+events\.jsonl)", temp_demo))
    assert len(named) == 1, named
    assert Path(named.pop()).is_file()


def test_the_replay_command_it_prints_runs_as_printed(
    no_runc: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The closing hint is a command a newcomer can paste, venv activated or not."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # substrate-gpu not on PATH, as after the README
    out = io.StringIO()
    demo.main(tmp_path, out)
    hint = out.getvalue().splitlines()[-1]
    command = hint.removeprefix("every actor's timeline: ")
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "actor gpu-trainer" in done.stdout


def test_the_demo_says_what_is_simulated_and_why(temp_demo: str) -> None:
    """The fake GPU is named as such: /dev/null's numbers, so a workload can hold it open."""
    assert "simulated" in temp_demo
    assert "/dev/null" in temp_demo and "1:3" in temp_demo
    assert "hold" in temp_demo and "open" in temp_demo


def test_the_refused_suspend_is_printed_once(
    no_runc: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal is a transcript line; it is not repeated as a log line on stderr."""
    assert cli.main(["demo", "--workdir", str(tmp_path)]) == cli.EXIT_OK
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    assert printed.count("checkpoint refused (live_context_probed)") == 1, printed
