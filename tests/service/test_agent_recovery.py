"""Restarting ``substrate-gpu agent`` on its log: refusals are logged, interrupted effects reconciled."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from substrate_gpu.eventlog import read_log, replay
from substrate_gpu.testing import node as node_

from .agentproc import AgentProcess, event, register


def wait_for_file(path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)


def test_refusals_are_logged_but_malformed_lines_are_not(tmp_path):
    """An event the machine refuses is recorded as a rejection; unparseable lines leave no trace."""
    agent = AgentProcess.on_socket(tmp_path)
    try:
        with agent.client() as client:
            assert client.request(register("a1"))["ok"]
            assert client.request(b"{broken")["kind"] == "malformed"
            assert client.request(b'{"type":"nope","v":1,"actor_id":"a1"}')["kind"] == "schema"
            assert client.request(event("suspend_requested", "a1"))["kind"] == "invalid_in_state"
    finally:
        assert agent.terminate() == 0
    contents = read_log(agent.log)
    assert [e.type for e in contents.events] == ["actor_registered"]
    (rejection,) = contents.rejections
    assert (rejection.event.type, rejection.state) == ("suspend_requested", "registered")


@pytest.mark.runc
def test_an_effect_interrupted_by_sigkill_is_reconciled_on_restart(tmp_path, runc_path):
    """SIGKILL while runsc create hangs; the restarted agent asks runsc and fails the actor explicitly."""
    runsc = node_.install_runsc_standin(tmp_path / "bin")
    pids = tmp_path / "hang-pids"
    env = {
        "RUNSC_STANDIN_RUNC": runc_path,
        "RUNSC_STANDIN_HANG": "create",
        "RUNSC_STANDIN_HANG_PIDS": str(pids),
    }
    first = AgentProcess.on_socket(tmp_path, "--runsc", str(runsc), env=env)
    try:
        with first.client() as client:
            acks = client.requests(
                [
                    register("c1"),
                    event("bundle_prepared", "c1", bundle="/b"),
                    event("run_requested", "c1"),
                ]
            )
        assert acks[-1]["state"] == "creating"
        wait_for_file(pids)  # runsc create is hanging now
        first.process.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        first.kill()
        if pids.exists():
            for pid in pids.read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
    assert replay(first.log).actors["c1"].state == "creating"

    second = AgentProcess.on_socket(
        tmp_path, "--runsc", str(runsc), env={"RUNSC_STANDIN_RUNC": runc_path}
    )
    try:
        with second.client() as client:
            retry = client.request(event("delete_requested", "c1"))
    finally:
        assert second.terminate() == 0
    assert retry["ok"] and retry["from"] == "failed"
    assert retry["seq"] > acks[-1]["seq"]
    types = [e.type for e in read_log(first.log).events]
    assert types[:3] == ["actor_registered", "bundle_prepared", "run_requested"]
    assert types[3] == "effect_failed"
    assert "restart" in "".join(str(e.to_dict()) for e in read_log(first.log).events[3:4])
    assert "reconciled an interrupted effect" in second.stderr()
