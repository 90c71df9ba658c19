"""The worker API's answer to an event the door refuses: a status code per kind of refusal.

The door (``AgentService.offer``, the JSON door's too) says why an event was not accepted;
the worker API turns that into a gRPC status: a request it could never make valid is the
caller's mistake (INVALID_ARGUMENT), an event the actor's state refuses is a precondition
(FAILED_PRECONDITION), a log that failed is UNAVAILABLE (go to another worker). Every event
the worker API makes (registration, run, restore, suspend, delete) is submitted through one
method, driven here with a door that refuses it.
"""

from __future__ import annotations

import anyio
import grpc
import pytest

from substrate_gpu.lifecycle import actors, events, hooks
from substrate_gpu.service import protocol, worker_api, worker_calls


class _Agent:
    """An agent hosting nothing yet."""

    def actors(self) -> tuple[actors.ActorView, ...]:
        return ()

    def actor(self, actor_id: str) -> actors.ActorView | None:
        return None

    def add_observer(self, observer: object) -> None:
        pass


class _RefusingDoor:
    """A door that refuses every event with ``error`` (and counts it, as the real one does)."""

    def __init__(self, error: protocol.RequestError) -> None:
        self.agent = _Agent()
        self.error = error
        self.submitted: list[events.Event] = []
        self.rejected: list[protocol.RequestError] = []

    async def offer(self, event: events.Event) -> hooks.Transition | protocol.RequestError:
        self.submitted.append(event)
        return self.error

    def reject(self, error: protocol.RequestError, line_number: int) -> bytes:
        self.rejected.append(error)
        return b""


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        pytest.param("schema", grpc.StatusCode.INVALID_ARGUMENT, id="schema"),
        pytest.param("malformed", grpc.StatusCode.INVALID_ARGUMENT, id="malformed"),
        pytest.param("invalid_in_state", grpc.StatusCode.FAILED_PRECONDITION, id="state"),
        pytest.param("unknown_actor", grpc.StatusCode.FAILED_PRECONDITION, id="unknown-actor"),
        pytest.param("unavailable", grpc.StatusCode.UNAVAILABLE, id="log-unavailable"),
    ],
)
def test_a_refused_event_is_answered_by_its_kind(kind, code) -> None:
    """The refusal's message is the answer's, and the door counts the refusal."""
    error = protocol.RequestError(kind, f"refused as {kind}", "u.1")
    door = _RefusingDoor(error)
    service = worker_api.WorkerService(door, runsc="runsc")  # type: ignore[arg-type]
    registered = events.ActorRegistered(actor_id="u.1", gpu=False, bundle="/b", containers=("app",))
    with pytest.raises(worker_calls.CallError) as raised:
        anyio.run(service._submit, registered)
    assert (raised.value.code, raised.value.message) == (code, f"refused as {kind}")
    assert door.submitted == [registered]
    assert door.rejected == [error]
