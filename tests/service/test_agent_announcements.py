"""What the agent says by default: where it serves at start, what it resumed on restart."""

from __future__ import annotations

import json
from pathlib import Path

from .agentproc import AgentProcess, register


def test_the_agent_announces_its_socket_metrics_and_event_log_by_default(tmp_path: Path) -> None:
    """With no ``--log-level``, the start is logged at INFO: socket, metrics, event log."""
    agent = AgentProcess.on_socket(tmp_path, log_level=None)
    try:
        # The socket accepts before the announcement is flushed: give the line a moment.
        with agent.client() as client:
            client.request(register("a1"))
    finally:
        assert agent.terminate() == 0
    lines = [json.loads(line) for line in agent.stderr().splitlines() if line.startswith("{")]
    serving = [line for line in lines if line.get("event") == "agent serving"]
    assert serving, agent.stderr()
    assert serving[0]["socket"] == str(agent.socket)
    assert serving[0]["event_log"] == str(agent.log)
    assert serving[0]["metrics"] is None  # --metrics-port 0: no endpoint, said so


def test_a_restarted_agent_says_how_many_actors_it_resumed_at_which_seq(tmp_path: Path) -> None:
    """On restart: "resumed N actors at seq S", by default."""
    first = AgentProcess.on_socket(tmp_path, log_level=None)
    with first.client() as client:
        client.request(register("a1"))
        client.request(register("a2"))
    assert first.terminate() == 0
    second = AgentProcess.on_socket(tmp_path, log_level=None)
    assert second.terminate() == 0
    assert "resumed 2 actors at seq 2" in second.stderr()


def test_a_torn_tail_is_warned_about_once(tmp_path: Path) -> None:
    """A log whose last line was torn by a crash: one warning, not one per layer."""
    first = AgentProcess.on_socket(tmp_path)
    with first.client() as client:
        client.request(register("a1"))
    assert first.terminate() == 0
    with (tmp_path / "events.jsonl").open("ab") as log:
        log.write(b'{"type":"run_requested","v":1,"actor_')
    second = AgentProcess.on_socket(tmp_path)
    assert second.terminate() == 0
    warnings = [
        line
        for line in second.stderr().splitlines()
        if line.startswith("{") and json.loads(line).get("level") == "warning"
    ]
    assert len([w for w in warnings if "torn" in w]) == 1, warnings
