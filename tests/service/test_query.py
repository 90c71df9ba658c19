"""Queries on the agent's socket: an actor's state and reason, all actors, by state."""

from __future__ import annotations

from pathlib import Path

from substrate_gpu.service import query

from .agentproc import AgentProcess, event, register


def test_a_query_line_is_told_apart_from_an_event_line() -> None:
    """``{"query": ...}`` is a query; an event line (``type``) is not."""
    assert query.is_query(b'{"query": "actors"}')
    assert query.is_query(b' {"actor_id": "a1", "query": "actor"}')
    assert not query.is_query(b'{"type": "run_requested", "v": 1, "actor_id": "a1"}')
    assert not query.is_query(b"not json")


def test_an_actor_query_answers_its_state_and_reason(tmp_path: Path) -> None:
    """``{"query": "actor", "actor_id": A}`` -> the actor's state, GPU flag and reason."""
    agent = AgentProcess.on_socket(tmp_path)
    try:
        with agent.client() as client:
            client.request(register("a1", gpu=True))
            answer = client.request({"query": "actor", "actor_id": "a1"})
    finally:
        agent.terminate()
    assert answer == {
        "ok": True,
        "actor": {"actor_id": "a1", "state": "registered", "gpu": True},
    }


def test_an_actor_query_for_an_unknown_actor_is_refused(tmp_path: Path) -> None:
    """An actor the agent does not know: ok=false, kind unknown_actor, nothing else changes."""
    agent = AgentProcess.on_socket(tmp_path)
    try:
        with agent.client() as client:
            answer = client.request({"query": "actor", "actor_id": "ghost"})
    finally:
        agent.terminate()
    assert answer["ok"] is False
    assert answer["kind"] == "unknown_actor"
    assert "ghost" in answer["error"]


def test_an_actors_query_lists_every_actor_and_filters_by_state(tmp_path: Path) -> None:
    """``{"query": "actors"}`` lists all; ``"state": S`` only those in S."""
    agent = AgentProcess.on_socket(tmp_path)
    try:
        with agent.client() as client:
            client.request(register("a1"))
            client.request(register("a2"))
            client.request(event("bundle_prepared", "a2", bundle="/nonexistent"))
            everyone = client.request({"query": "actors"})
            registered = client.request({"query": "actors", "state": "registered"})
    finally:
        agent.terminate()
    assert [a["actor_id"] for a in everyone["actors"]] == ["a1", "a2"]
    assert [a["state"] for a in everyone["actors"]] == ["registered", "bundle_prepared"]
    assert [a["actor_id"] for a in registered["actors"]] == ["a1"]


def test_an_actors_query_with_an_unknown_state_names_the_states(tmp_path: Path) -> None:
    """A misspelt state filter is refused with the field and the machine's states."""
    agent = AgentProcess.on_socket(tmp_path)
    try:
        with agent.client() as client:
            answer = client.request({"query": "actors", "state": "runing"})
    finally:
        agent.terminate()
    assert answer["ok"] is False and answer["kind"] == "schema"
    assert answer["field"] == "$.state"
    assert "did you mean 'running'" in answer["error"]


def test_a_malformed_query_is_refused_with_its_field(tmp_path: Path) -> None:
    """An unknown query, or one missing its actor id, is a schema refusal naming the field."""
    agent = AgentProcess.on_socket(tmp_path)
    try:
        with agent.client() as client:
            unknown = client.request({"query": "everything"})
            missing = client.request({"query": "actor"})
    finally:
        agent.terminate()
    assert unknown["ok"] is False and unknown["kind"] == "schema"
    assert "actor, actors" in unknown["error"]
    assert missing["ok"] is False and missing["field"] == "$.actor_id"


def test_queries_are_not_written_to_the_event_log(tmp_path: Path) -> None:
    """A query changes nothing: the log holds only the events."""
    agent = AgentProcess.on_socket(tmp_path)
    try:
        with agent.client() as client:
            client.request(register("a1"))
            client.request({"query": "actors"})
    finally:
        agent.terminate()
    assert b"query" not in (tmp_path / "events.jsonl").read_bytes()
