"""A killed agent's runsc commands never land later (issue 30 §1).

Every runsc command dies with the agent (``setpriv --pdeathsig KILL``); recovery finds and
kills any that still run under the agent's root, sandboxes and gofers left alone. And the
one-shot stall the tests use to kill the agent mid-step: the stand-in's knob, and the
wrapper that gives real runsc the same knob.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from support.real import missing

from substrate_gpu import _process
from substrate_gpu.runsc import api, driver, stragglers
from substrate_gpu.testing import node as node_

STANDIN = Path(__file__).resolve().parents[1] / "standins" / "runsc"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(["/usr/bin/runsc", "--root", "/r", "start", "x"], True, id="command"),
        pytest.param(["runsc", "--root", "/r/s1", "create", "--bundle", "/b", "side"], True, id="actor-root"),
        pytest.param(["runsc", "--root=/r/s1", "-nvproxy", "restore", "_pause"], True, id="flag=value"),
        pytest.param(["python3", "/t/runsc", "--root", "/r", "checkpoint", "x"], True, id="script"),
        pytest.param(["setpriv", "--pdeathsig", "KILL", "--", "runsc", "--root", "/r", "delete", "x"], True, id="setpriv"),
        pytest.param(["runsc-sandbox", "--root=/r/s1", "boot", "--bundle=/b", "_pause"], False, id="sandbox"),
        pytest.param(["runsc-gofer", "--root=/r/s1", "gofer", "--bundle", "/b"], False, id="gofer"),
        pytest.param(["runsc", "--root", "/rr", "start", "x"], False, id="another-root"),
        pytest.param(["runsc", "--root", "/", "start", "x"], False, id="above-the-root"),
        pytest.param(["sleep", "start"], False, id="no-root"),
        pytest.param(["runsc", "--root", "/r", "--version"], False, id="no-subcommand"),
    ],
)  # fmt: skip
def test_a_straggler_is_a_runsc_command_under_the_root(argv: list[str], expected: bool) -> None:
    assert stragglers.is_straggler(argv, Path("/r")) is expected


def _sleeper(*args: str) -> subprocess.Popen[bytes]:
    """A process whose command line is ``python3 -c <sleep> ARGS`` (its own session)."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", *args], start_new_session=True
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


@pytest.mark.anyio
async def test_recovery_kills_commands_under_its_root_and_leaves_sandboxes(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    """A command under the root (and its group) is killed and waited for; a sandbox process
    under it and a command under another root are left running."""
    root = tmp_path / "runsc-root"
    command = _sleeper("--root", str(root / "s1"), "start", "side")
    sandbox = _sleeper(f"--root={root / 's1'}", "boot", "_pause")
    other = _sleeper("--root", str(tmp_path / "other"), "start", "side")
    processes += [command, sandbox, other]
    deadline = time.monotonic() + 10
    while not all(Path(f"/proc/{p.pid}/cmdline").read_bytes() for p in processes):
        assert time.monotonic() < deadline
        await anyio.sleep(0.02)
    runtime = driver.RunscDriver(driver.RunscConfig(root=root, runsc=str(STANDIN)))
    assert isinstance(runtime, api.StragglerReaper)
    assert await runtime.reap_stragglers() == (command.pid,)
    assert command.wait(timeout=5) == -signal.SIGKILL
    assert sandbox.poll() is None and other.poll() is None
    assert await runtime.reap_stragglers() == ()


def _parent(tmp_path: Path, *, die_with_parent: bool) -> subprocess.Popen[bytes]:
    """A process running one stand-in ``runsc start x`` through ``run_command``."""
    code = textwrap.dedent(
        f"""
        import anyio
        from substrate_gpu import _process
        anyio.run(lambda: _process.run_command(
            [{str(STANDIN)!r}, "--root", {str(tmp_path / "root")!r}, "start", "x"],
            timeout=60, what="starting x", check=False, die_with_parent={die_with_parent},
        ))
        """
    )
    return subprocess.Popen([sys.executable, "-c", code])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in {"Z", "X"}


def _stalled_pid(knob: Path, timeout: float = 20) -> int:
    stalled = Path(f"{knob}.stalled")
    deadline = time.monotonic() + timeout
    while not (stalled.exists() and stalled.read_text().strip()):
        assert time.monotonic() < deadline, "the command never stalled"
        time.sleep(0.02)
    return int(stalled.read_text())


@pytest.mark.parametrize("die_with_parent", [True, False])
def test_a_command_dies_with_its_killed_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, die_with_parent: bool
) -> None:
    """SIGKILL of the process running a stalled runsc command: with ``die_with_parent`` the
    command dies at once; without, it runs on (and would land late)."""
    if _process.setpriv() is None:
        missing("setpriv (util-linux)")
    knob = tmp_path / "stall"
    knob.write_text("start x\n")
    monkeypatch.setenv("RUNSC_STANDIN_STALL", str(knob))
    monkeypatch.setenv("RUNSC_STANDIN_STALL_SECONDS", "30")
    parent = _parent(tmp_path, die_with_parent=die_with_parent)
    try:
        command = _stalled_pid(knob)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while _alive(command) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _alive(command) is not die_with_parent
    finally:
        parent.kill()
        parent.wait()
        if _alive(command):
            os.killpg(command, signal.SIGKILL)


def test_the_standin_stalls_the_named_command_once_then_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The knob names ``state x``: ``state y`` runs at once; the first ``state x`` claims the
    knob, stalls, then answers as usual; the next ``state x`` does not stall."""
    knob = tmp_path / "stall"
    knob.write_text("state x\n")
    env = {**os.environ, "RUNSC_STANDIN_STALL": str(knob), "RUNSC_STANDIN_STALL_SECONDS": "1"}

    def state(cid: str) -> tuple[float, subprocess.CompletedProcess[str]]:
        started = time.monotonic()
        done = subprocess.run(
            [str(STANDIN), "--root", str(tmp_path / "root"), "state", cid],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        return time.monotonic() - started, done

    took, done = state("y")
    assert took < 1 and knob.exists()
    took, done = state("x")
    assert took >= 1 and not knob.exists()
    assert "does not exist" in done.stderr  # it went on to run the command
    assert int(Path(f"{knob}.stalled").read_text()) > 0
    took, _ = state("x")
    assert took < 1


def test_the_wrapper_stalls_real_runsc_the_same_way(tmp_path: Path) -> None:
    """``install_stalling_runsc`` around a binary: the named subcommand and container stall
    once, then the binary is exec'd with the very arguments; others pass straight through."""
    real = tmp_path / "real"
    real.write_text('#!/bin/sh\necho "$@"\n')
    real.chmod(0o755)
    wrapper = node_.install_stalling_runsc(real, tmp_path / "bin")
    knob = tmp_path / "stall"
    knob.write_text("start side\n")
    env = {**os.environ, "RUNSC_STANDIN_STALL": str(knob), "RUNSC_STANDIN_STALL_SECONDS": "1"}

    def run(*args: str) -> tuple[float, str]:
        started = time.monotonic()
        done = subprocess.run(
            [str(wrapper), *args], capture_output=True, text=True, env=env, check=True
        )
        return time.monotonic() - started, done.stdout.strip()

    assert run("--root", "/r", "start", "app")[1] == "--root /r start app"
    assert knob.exists()
    took, out = run("--root", "/r", "--debug", "start", "side")
    assert took >= 1 and out == "--root /r --debug start side"
    assert not knob.exists() and Path(f"{knob}.stalled").read_text().strip().isdigit()
    assert run("--root", "/r", "start", "side")[0] < 1
