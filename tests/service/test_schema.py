"""The checked-in JSON Schema of the agent protocol is generated from the codec's types."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from substrate_gpu.lifecycle import Transition
from substrate_gpu.service import protocol, schema

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "schema" / "agent-protocol.schema.json"
REGENERATE = (
    ".venv/bin/python -m substrate_gpu.service.schema > docs/schema/agent-protocol.schema.json"
)


def _validator(name: str) -> jsonschema.Draft202012Validator:
    document = json.loads(SCHEMA_FILE.read_text())
    one = {k: v for k, v in document.items() if k != "anyOf"}  # only the named definition
    return jsonschema.Draft202012Validator({**one, "$ref": f"#/$defs/{name}"})


def test_the_checked_in_schema_is_current() -> None:
    """The file equals what the types generate now (else: regenerate it, see the message)."""
    assert SCHEMA_FILE.read_text() == schema.render(), f"stale schema: run {REGENERATE}"


def test_the_schema_is_valid_json_schema() -> None:
    """The document itself passes the 2020-12 meta-schema."""
    jsonschema.Draft202012Validator.check_schema(json.loads(SCHEMA_FILE.read_text()))


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param({"type": "run_requested", "v": 1, "actor_id": "a1"}, id="run"),
        pytest.param(
            {
                "type": "actor_registered",
                "v": 1,
                "actor_id": "a1",
                "gpu": True,
                "bundle": "/b",
                "suspend_policy": "refuse",
            },
            id="register",
        ),
        pytest.param(
            {"type": "cuda_context_opened", "v": 1, "actor_id": "a1", "pid": 7, "at": 5.0},
            id="context",
        ),
    ],
)
def test_a_request_the_agent_accepts_is_valid(request_: dict[str, object]) -> None:
    """What parse_request accepts, the Request schema accepts."""
    assert not isinstance(
        protocol.parse_request(json.dumps(request_).encode()), protocol.RequestError
    )
    _validator("Request").validate(request_)


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param({"type": "sandbox_created", "v": 1, "actor_id": "a1"}, id="outcome"),
        pytest.param({"type": "run_requested", "v": 1, "actor_id": "a1", "seq": 3}, id="seq"),
        pytest.param({"type": "run_requested", "actor_id": "a1"}, id="no-version"),
        pytest.param({"type": "run_requested", "v": 2, "actor_id": "a1"}, id="newer-version"),
        pytest.param({"type": "run_requested", "v": 1, "actor_id": "../etc"}, id="actor-path"),
        pytest.param(
            {"type": "run_requested", "v": 1, "actor_id": "a1", "at": -1e300}, id="at-negative"
        ),
        pytest.param(
            {"type": "cuda_context_opened", "v": 1, "actor_id": "a1", "pid": "7"}, id="pid-str"
        ),
        pytest.param(
            {"type": "run_requested", "v": 1, "actor_id": "a1", "x": 1}, id="unknown-field"
        ),
    ],
)
def test_a_request_the_agent_refuses_is_invalid(request_: dict[str, object]) -> None:
    """What parse_request refuses (outcomes included), the Request schema refuses."""
    assert isinstance(protocol.parse_request(json.dumps(request_).encode()), protocol.RequestError)
    assert not _validator("Request").is_valid(request_)


def test_outcomes_have_their_own_schema() -> None:
    """An outcome is valid as an Outcome, not as a Request."""
    outcome = {"type": "gpu_injected", "v": 1, "actor_id": "a1", "seq": 4, "at": 1.0, "devices": 2}
    _validator("Outcome").validate(outcome)
    assert not _validator("Request").is_valid(outcome)


def test_the_agent_s_answers_are_valid() -> None:
    """Acks (with and without a reason) and refusals validate as Answers."""
    t = Transition(
        "a1", "running", "running", "suspend_requested", "suspend_requested", 1.0, "live"
    )
    bad = protocol.parse_request(
        b'{"type": "cuda_context_opened", "v": 1, "actor_id": "a1", "pid": "7"}'
    )
    assert isinstance(bad, protocol.RequestError)
    for line in (
        protocol.ack(3, t),
        protocol.ack(4, Transition("a1", "new", "registered", "x", "x", 1.0)),
        protocol.refusal(bad, 2),
        protocol.refusal(protocol.RequestError("malformed", "request is not valid JSON"), 1),
    ):
        _validator("Answer").validate(json.loads(line))


@pytest.mark.parametrize(
    "query_",
    [
        pytest.param({"query": "actor", "actor_id": "a1"}, id="actor"),
        pytest.param({"query": "actors"}, id="actors"),
        pytest.param({"query": "actors", "state": "running"}, id="actors-in-state"),
    ],
)
def test_a_query_is_valid_against_the_query_schema_and_is_no_event(
    query_: dict[str, object],
) -> None:
    """Queries have their own definition; the Request (event) schema refuses them."""
    _validator("Query").validate(query_)
    assert not _validator("Request").is_valid(query_)


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(
            {"ok": True, "actor": {"actor_id": "a1", "state": "running", "gpu": True}}, id="one"
        ),
        pytest.param(
            {
                "ok": True,
                "actors": [{"actor_id": "a1", "state": "running", "gpu": False, "reason": "live"}],
            },
            id="many",
        ),
    ],
)
def test_a_query_answer_is_valid_against_the_answer_schema(answer: dict[str, object]) -> None:
    """Query answers are among the Answers."""
    _validator("Answer").validate(answer)
