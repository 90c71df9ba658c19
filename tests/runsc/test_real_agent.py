"""``substrate-gpu agent`` on real gVisor, over its socket: a CPU actor's whole life, and
recovery after SIGKILL while sandboxes run and mid-checkpoint — ``runsc state`` drives the
reconciliation, no actor is lost and no sandbox is leaked (``runsc list`` empty at the end)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from service.agentproc import AgentProcess, event, register
from support import real_runsc as runsc_
from support import runc_bundle

from substrate_gpu.eventlog import replay

COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done"
#: A state a recovered actor may rest in without being lost (the machine can move it on).
RESTING = {"running", "suspended", "stopped", "failed"}


def _agent(tmp: Path, runsc: Path) -> AgentProcess:
    flags = [f"--runsc-flag={f}" for f in runsc_.GLOBAL_FLAGS]
    return AgentProcess.on_socket(tmp, "--runsc", str(runsc), *flags)


def _state(log: Path, actor_id: str) -> str | None:
    actor = replay(log).actors.get(actor_id)
    return actor.state if actor else None


def _wait_logged(log: Path, actor_id: str, states: set[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while (state := _state(log, actor_id)) not in states:
        assert time.monotonic() < deadline, f"{actor_id} stuck in {state}, wanted {states}"
        time.sleep(0.05)
    assert state is not None
    return state


def _count(runsc: Path, root: Path, actor_id: str) -> int:
    """The actor's counter. An empty read is the shell's ``>`` truncating the file between
    two values, not a value: read again (a restarted counter still reads 1, 2, …)."""
    for _ in range(50):
        out = runsc_.run(runsc, root, "exec", actor_id, "/bin/cat", "/tmp/count")
        if out.stdout.strip():
            return int(out.stdout)
        time.sleep(0.02)
    return 0


def _start_actor(client, actor_id: str, bundle: Path) -> None:  # type: ignore[no-untyped-def]
    acks = client.requests(
        [
            register(actor_id, bundle=str(bundle)),
            event("bundle_prepared", actor_id, bundle=str(bundle)),
            event("run_requested", actor_id),
        ]
    )
    assert all(a["ok"] for a in acks), acks


@pytest.fixture
def root(real_runsc: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    root = tmp_path / "runsc-root"
    yield root
    runsc_.delete_all(real_runsc, root)


def test_a_cpu_actors_whole_life_over_the_socket(real_runsc: Path, tmp_path: Path, root) -> None:
    """register → running → suspended (real image) → running with its memory → deleted."""
    bundle = runc_bundle.make_busybox_bundle(tmp_path / "b", ["/bin/sh", "-c", COUNTER])
    agent = _agent(tmp_path, real_runsc)
    try:
        with agent.client() as client:
            _start_actor(client, "a1", bundle)
            _wait_logged(agent.log, "a1", {"running"})
            deadline = time.monotonic() + 20
            while (before := _count(real_runsc, root, "a1")) < 10:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert client.request(event("suspend_requested", "a1"))["ok"]
            _wait_logged(agent.log, "a1", {"suspended"})
            assert runsc_.list_ids(real_runsc, root) == []
            assert client.request(event("restore_requested", "a1"))["ok"]
            _wait_logged(agent.log, "a1", {"running"})
            assert _count(real_runsc, root, "a1") >= before
            assert client.request(event("delete_requested", "a1"))["ok"]
            _wait_logged(agent.log, "a1", {"deleted"})
    finally:
        assert agent.terminate() == 0
    assert runsc_.list_ids(real_runsc, root) == []


def test_sigkill_while_sandboxes_run_and_mid_checkpoint_loses_nothing(
    real_runsc: Path, tmp_path: Path, root
) -> None:
    """Two running actors; SIGKILL; restart: both still running (runsc says so). Suspend
    one and SIGKILL at once; restart: it is reconciled from runsc state to a resting state,
    the other untouched; delete both: runsc list is empty."""
    bundles = {
        a: runc_bundle.make_busybox_bundle(tmp_path / a, ["/bin/sh", "-c", COUNTER])
        for a in ("k1", "k2")
    }
    first = _agent(tmp_path, real_runsc)
    try:
        with first.client() as client:
            for actor_id, bundle in bundles.items():
                _start_actor(client, actor_id, bundle)
            for actor_id in bundles:
                _wait_logged(first.log, actor_id, {"running"})
    finally:
        first.process.send_signal(signal.SIGKILL)
        first.wait()
    assert sorted(runsc_.list_ids(real_runsc, root)) == ["k1", "k2"]

    second = _agent(tmp_path, real_runsc)
    try:
        assert {_state(second.log, a) for a in bundles} == {"running"}
        with second.client() as client:
            assert client.request(event("suspend_requested", "k1"))["state"] == "checkpointing"
        second.process.send_signal(signal.SIGKILL)  # mid-checkpoint
        second.wait()
    finally:
        second.kill()
    assert _state(second.log, "k1") == "checkpointing"

    third = _agent(tmp_path, real_runsc)
    try:
        recovered = _wait_logged(third.log, "k1", RESTING)
        listed = runsc_.run(real_runsc, root, "state", "k1", check=False)
        sandbox_runs = listed.returncode == 0 and '"running"' in listed.stdout
        assert (recovered == "running") == sandbox_runs
        assert _state(third.log, "k2") == "running"
        with third.client() as client:
            for actor_id in bundles:
                assert client.request(event("delete_requested", actor_id))["ok"]
        for actor_id in bundles:
            _wait_logged(third.log, actor_id, {"deleted"})
    finally:
        assert third.terminate() == 0
    assert runsc_.list_ids(real_runsc, root) == []
    leftovers = subprocess.run(
        ["pgrep", "-f", f"runsc-sandbox.*{root}"], capture_output=True, check=False
    )
    assert leftovers.stdout == b""
    # Every sandbox stacked a --network=none namespace mount on <root>/null-netns; the
    # teardown helper drops them all (one left behind breaks pytest's later clean-up).
    runsc_.delete_all(real_runsc, root)
    assert not os.path.ismount(root / "null-netns")
