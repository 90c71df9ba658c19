"""``/healthz`` and ``/readyz`` of a real ``substrate-gpu agent`` process.

Readiness: ready once started with a runsc that answers; not ready while recovery runs, when
runsc does not answer, or once the event log failed. Liveness: fails while the agent's event
loop is blocked (its main thread stopped with ptrace, the metrics thread still serving), and
recovers when the loop runs again.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrate_gpu.testing import node as node_

from .agentproc import (
    AgentProcess,
    event,
    free_port,
    main_thread_stopped,
    probe,
    register,
    sample,
    scrape,
    wait_for_probe,
)
from .test_agent_recovery import wait_for_file


def first_line(body: str) -> str:
    return body.splitlines()[0]


@pytest.fixture(scope="module")
def ready_agent(
    tmp_path_factory: pytest.TempPathFactory, real_runsc: Path
) -> Iterator[tuple[AgentProcess, int]]:
    """One agent with the real runsc and a 1 s liveness timeout, and its metrics port."""
    tmp = tmp_path_factory.mktemp("ready-agent")
    port = free_port()
    agent = AgentProcess.on_socket(
        tmp,
        "--runsc",
        str(real_runsc),
        "--metrics-port",
        str(port),
        "--liveness-timeout",
        "1",
    )
    try:
        yield agent, port
    finally:
        assert agent.terminate() == 0


def test_an_agent_with_a_working_runsc_becomes_ready(ready_agent):
    """Started with runsc answering: /readyz 200 listing every check, /healthz 200."""
    _, port = ready_agent
    _status, body = wait_for_probe(port, "/readyz", lambda status, _: status == 200)
    lines = body.splitlines()
    assert lines[0] == "ready"
    assert [line.split(":")[0] for line in lines[1:]] == [
        "ok event_log",
        "ok recovery",
        "ok runsc",
        "ok serving",
    ]
    assert "events.jsonl open and locked" in lines[1]
    assert "runsc version " in lines[3]
    assert probe(port, "/healthz")[0] == 200


def test_readiness_is_exported_as_a_gauge_per_check(ready_agent):
    """``substrate_gpu_agent_ready{check}`` is 1 for each check of a ready agent."""
    _, port = ready_agent
    wait_for_probe(port, "/readyz", lambda status, _: status == 200)
    text = scrape(port)
    for check in ("event_log", "recovery", "runsc", "serving"):
        assert sample(text, "substrate_gpu_agent_ready", check=check) == 1.0


def test_liveness_fails_while_the_event_loop_is_blocked_and_recovers(ready_agent):
    """Main thread stopped: /healthz 503 naming the loop within the timeout; 200 once resumed."""
    agent, port = ready_agent
    wait_for_probe(port, "/readyz", lambda status, _: status == 200)
    with main_thread_stopped(agent.process.pid):
        _status, body = wait_for_probe(port, "/healthz", lambda status, _: status == 503)
        assert first_line(body) == "not live: loop"
        assert "the event loop is blocked" in body
        # The metrics thread still answers: readiness is not what failed.
        assert probe(port, "/readyz")[0] == 200
    wait_for_probe(port, "/healthz", lambda status, _: status == 200, timeout=5)


def test_an_agent_whose_runsc_does_not_answer_is_live_but_not_ready(tmp_path):
    """runsc missing: /readyz 503 naming runsc (and its path); /healthz 200."""
    port = free_port()
    agent = AgentProcess.on_socket(tmp_path, "--metrics-port", str(port))
    try:
        status, body = wait_for_probe(port, "/readyz", lambda _, body: "failed runsc: " in body)
        assert status == 503
        assert first_line(body) == "not ready: runsc"
        assert "no-runsc-here" in body
        assert probe(port, "/healthz")[0] == 200
    finally:
        assert agent.terminate() == 0


def test_a_failed_event_log_makes_the_agent_unready(tmp_path, real_runsc):
    """The log's directory removed: the next request is ``unavailable`` and /readyz 503
    names ``event_log`` with the cause, while /healthz stays 200 (the process is fine)."""
    port = free_port()
    state = tmp_path / "state"
    agent = AgentProcess.on_socket(
        tmp_path,
        "--event-log",
        str(state / "events.jsonl"),
        "--runsc",
        str(real_runsc),
        "--metrics-port",
        str(port),
    )
    try:
        wait_for_probe(port, "/readyz", lambda status, _: status == 200)
        for path in sorted(state.iterdir()):
            path.unlink()
        state.rmdir()
        with agent.client() as client:
            assert client.request(register("after"))["kind"] == "unavailable"
        status, body = probe(port, "/readyz")
        assert status == 503
        assert first_line(body) == "not ready: event_log"
        assert "failed event_log: failed: " in body and "events.jsonl" in body
        assert sample(scrape(port), "substrate_gpu_agent_ready", check="event_log") == 0.0
        assert probe(port, "/healthz")[0] == 200
    finally:
        agent.terminate()


@pytest.mark.runc
def test_the_agent_is_not_ready_while_recovery_runs(tmp_path, runc_path):
    """Recovery waiting on ``runsc state``: /readyz 503 ``recovery: running``, /healthz 200;
    ready once recovery gets its answer."""
    runsc = node_.install_runsc_standin(tmp_path / "bin")
    pids = tmp_path / "hang-pids"
    hang = {"RUNSC_STANDIN_RUNC": runc_path, "RUNSC_STANDIN_HANG_PIDS": str(pids)}
    first = AgentProcess.on_socket(
        tmp_path, "--runsc", str(runsc), env={**hang, "RUNSC_STANDIN_HANG": "create"}
    )
    try:
        with first.client() as client:
            client.requests(
                [
                    register("c1"),
                    event("bundle_prepared", "c1", bundle="/b"),
                    event("run_requested", "c1"),
                ]
            )
        wait_for_file(pids)  # runsc create is hanging: c1 is in flight
        first.process.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        first.kill()
        kill_hung(pids)

    port = free_port()
    second = AgentProcess.on_socket(
        tmp_path,
        "--runsc",
        str(runsc),
        "--metrics-port",
        str(port),
        wait=False,  # it serves only after recovery, which is about to hang
        env={**hang, "RUNSC_STANDIN_HANG": "state"},
    )
    try:
        wait_for_file(pids)  # recovery's runsc state is hanging
        status, body = wait_for_probe(
            port, "/readyz", lambda _, body: "failed recovery: running" in body
        )
        assert status == 503
        assert first_line(body).startswith("not ready: recovery")
        assert probe(port, "/healthz")[0] == 200
        kill_hung(pids)
        status, body = wait_for_probe(port, "/readyz", lambda status, _: status == 200)
        assert "ok recovery: finished: 1 actors resumed at seq " in body
        second.wait_for_socket()
    finally:
        second.terminate()
        kill_hung(pids)


def kill_hung(pids: Path) -> None:
    """Kill the hung stand-in and its child (recorded in ``pids``), and forget them."""
    if pids.exists():
        for pid in pids.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        pids.unlink()
