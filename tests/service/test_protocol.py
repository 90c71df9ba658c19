"""The agent's JSON-lines protocol: request parsing and response shapes (pure functions)."""

from __future__ import annotations

import json

import msgspec
import pytest

from substrate_gpu.lifecycle import Transition, errors, events
from substrate_gpu.service import protocol

VALID = {"type": "actor_registered", "v": 1, "actor_id": "a1", "gpu": True, "bundle": "/b/a1"}


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        pytest.param(b"{not json", "malformed", id="invalid-json"),
        pytest.param(b"\xff\xfe", "malformed", id="not-utf8"),
        pytest.param(b"[1, 2]", "malformed", id="array-not-object"),
        pytest.param(b'"actor_registered"', "malformed", id="string-not-object"),
        pytest.param(b'{"v": 1, "actor_id": "a1"}', "schema", id="no-type"),
        pytest.param(
            b'{"type": "launch_rockets", "v": 1, "actor_id": "a1"}', "schema", id="unknown-type"
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 2, "actor_id": "a1"}', "schema", id="unknown-version"
        ),
        pytest.param(b'{"type": "run_requested", "actor_id": "a1"}', "schema", id="no-version"),
        pytest.param(
            b'{"type": "actor_registered", "v": 1, "actor_id": "a1", "gpu": true}',
            "schema",
            id="missing-field",
        ),
        pytest.param(
            b'{"type": "actor_registered", "v": 1, "actor_id": "a1", "gpu": "yes", "bundle": "/b"}',
            "schema",
            id="wrong-field-type",
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "a1", "extra": 1}',
            "schema",
            id="unknown-field",
        ),
        pytest.param(b'{"type": "run_requested", "v": 1}', "schema", id="no-actor"),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": ""}', "schema", id="empty-actor"
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "a1", "seq": 7}',
            "schema",
            id="client-seq",
        ),
        pytest.param(
            b'{"type": "sandbox_created", "v": 1, "actor_id": "a1"}',
            "not_external",
            id="outcome-event",
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "../../etc"}',
            "schema",
            id="actor-id-path",
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "a/b"}', "schema", id="actor-id-slash"
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": ".."}', "schema", id="actor-id-dotdot"
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "' + b"a" * 129 + b'"}',
            "schema",
            id="actor-id-too-long",
        ),
        # NaN and Infinity are not JSON: the strict decoder refuses the line itself.
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "a1", "at": NaN}',
            "malformed",
            id="at-nan",
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "a1", "at": Infinity}',
            "malformed",
            id="at-infinite",
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "a1", "at": -1e300}',
            "schema",
            id="at-negative",
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "a1", "at": 1e300}',
            "schema",
            id="at-absurdly-far",
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "a1", "at": 1' + b"0" * 400 + b"}",
            "schema",
            id="at-overflows-float",
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "a1", "at": 1' + b"0" * 5000 + b"}",
            "schema",
            id="int-too-long-for-a-float",
        ),
        pytest.param(b"[" * 2000, "malformed", id="nested-arrays-4kb"),
        # Deep nesting under a key is never parsed: the decoder stops at the unknown key (or at
        # the first value of the wrong type), and the envelope's look for the actor id is
        # bounded by msgspec's recursion limit.
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "a1", "x": '
            + b"[" * 2000
            + b"]" * 2000
            + b"}",
            "schema",
            id="nested-arrays-under-an-unknown-key",
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": '
            + b'{"a":' * 5000
            + b"1"
            + b"}" * 5000
            + b"}",
            "schema",
            id="nested-objects-where-a-string-goes",
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "'
            + b"a" * (protocol.MAX_LINE_BYTES)
            + b'"}',
            "too_long",
            id="oversized",
        ),
    ],
)
def test_bad_requests_are_classified_never_raised(line: bytes, kind: str) -> None:
    """Every malformed request becomes a RequestError of the right kind."""
    parsed = protocol.parse_request(line)
    assert isinstance(parsed, protocol.RequestError)
    assert parsed.kind == kind
    assert parsed.message


@pytest.mark.parametrize(
    ("line", "field", "says"),
    [
        pytest.param(
            b'{"type": "cuda_context_opened", "v": 1, "actor_id": "a1", "pid": "7"}',
            "$.pid",
            "Expected `int`, got `str` - at `$.pid`",
            id="wrong-type",
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "a1", "at": -1e300}',
            "$.at",
            "Expected `float` >= 0.0 - at `$.at`",
            id="at-before-the-epoch",
        ),
        pytest.param(
            b'{"type": "actor_registered", "v": 1, "actor_id": "a1", "gpu": true}',
            "$.bundle",
            "missing required field `bundle`",
            id="missing",
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "a1", "extra": 1}',
            "$.extra",
            "unknown field `extra`",
            id="unknown",
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 2, "actor_id": "a1"}',
            "$.v",
            "'run_requested' has schema version 2; this agent reads version 1",
            id="version",
        ),
        pytest.param(
            b'{"type": "run_requested", "actor_id": "a1"}', "$.v", "lacks 'v'", id="no-version"
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "a1", "seq": 0}',
            "$.seq",
            "must not carry 'seq'",
            id="seq-even-zero",
        ),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "a/b"}',
            "$.actor_id",
            "not a valid id",
            id="actor-id",
        ),
        # Rules across fields (the event's __post_init__) name their field too (issue 22).
        pytest.param(
            b'{"type": "actor_registered", "v": 2, "actor_id": "a1", "gpu": true, "bundle": "/b",'
            b' "gpu_names": ["nvidia.com/gpu=0", "1"]}',
            "$.gpu_names[1]",
            "gpu_names must be fully qualified CDI names (vendor/class=name), got '1'",
            id="gpu-name-not-qualified",
        ),
        pytest.param(
            b'{"type": "actor_registered", "v": 2, "actor_id": "a1", "gpu": true, "bundle": "/b",'
            b' "gpus": 1, "gpu_names": ["nvidia.com/gpu=0"]}',
            "$.gpu_names",
            "give gpus (1) or gpu_names (nvidia.com/gpu=0), not both",
            id="gpus-and-gpu-names",
        ),
    ],
)
def test_a_schema_error_names_the_field_and_what_was_expected(
    line: bytes, field: str, says: str
) -> None:
    """The refusal carries msgspec's path of the bad value, in the message and as `field`."""
    parsed = protocol.parse_request(line)
    assert isinstance(parsed, protocol.RequestError)
    assert (parsed.kind, parsed.field) == ("schema", field)
    assert says in parsed.message
    body = json.loads(protocol.refusal(parsed, 4))
    assert body["field"] == field and says in body["error"] and body["kind"] == "schema"


@pytest.mark.parametrize(
    ("line", "says"),
    [
        pytest.param(b"hello", "invalid character at column 1", id="first-character"),
        pytest.param(b'{"a": x}', "invalid character at column 7", id="inside"),
        # Columns count characters, not bytes: 'é' is two bytes and one column.
        pytest.param('{"é": x}'.encode(), "invalid character at column 7", id="after-utf8"),
        pytest.param(
            b'{"type": "run_requested", "v": 1, "actor_id": "a1"} x',
            "trailing characters at column 54",
            id="trailing",
        ),
    ],
)
def test_a_line_that_is_not_json_says_the_column(line: bytes, says: str) -> None:
    """msgspec's byte offset is reported as the column a person can find (issue 25)."""
    parsed = protocol.parse_request(line)
    assert isinstance(parsed, protocol.RequestError)
    assert parsed.kind == "malformed"
    assert says in parsed.message and "(byte" not in parsed.message


def test_a_malformed_request_says_why_without_a_traceback() -> None:
    """2,000 nested brackets (a 4 KB line) are refused as malformed, with a one-line reason."""
    parsed = protocol.parse_request(b"[" * 2000)
    assert isinstance(parsed, protocol.RequestError)
    assert parsed.kind == "malformed"
    assert "Traceback" not in parsed.message and "\n" not in parsed.message


def test_a_valid_request_is_the_event() -> None:
    """A request is an event's JSON form without seq; at defaults to now."""
    parsed = protocol.parse_request(json.dumps(VALID).encode())
    assert isinstance(parsed, events.ActorRegistered)
    assert (parsed.actor_id, parsed.gpu, parsed.bundle, parsed.seq) == ("a1", True, "/b/a1", 0)


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"gpu": True}, id="all-gpus"),
        pytest.param({"gpu": False}, id="cpu"),
        pytest.param({"gpu": True, "gpus": 2}, id="a-count"),
    ],
)
def test_a_v1_registration_is_upgraded_at_the_door_to_use_the_allocator(
    fields: dict[str, object],
) -> None:
    """A client speaking actor_registered v1 gets the newest version logged: the allocator
    decides (issue 22), and no container or identity is added (issue 23)."""
    line = json.dumps({**VALID, **fields, "v": 1, "at": 5.0}).encode()
    parsed = protocol.parse_request(line)
    assert isinstance(parsed, events.ActorRegistered)
    assert (parsed.v, parsed.allocates_gpus, parsed.containers, parsed.identity) == (
        3,
        True,
        (),
        {},
    )
    assert msgspec.structs.replace(parsed, v=1) == events.from_json(line)  # nothing else moved


def test_errors_name_the_actor_when_the_line_did() -> None:
    """A schema error keeps the actor id so the client can match it."""
    parsed = protocol.parse_request(b'{"type": "run_requested", "v": 9, "actor_id": "a7"}')
    assert isinstance(parsed, protocol.RequestError)
    assert parsed.actor_id == "a7"


def test_ack_shape() -> None:
    """An ack carries ok, seq, actor, event, from, state (and reason when there is one)."""
    t = Transition(
        "a1", "running", "running", "suspend_requested", "suspend_requested", 1.0, "live"
    )
    body = json.loads(protocol.ack(12, t))
    assert body == {
        "ok": True,
        "seq": 12,
        "actor_id": "a1",
        "event": "suspend_requested",
        "from": "running",
        "state": "running",
        "reason": "live",
    }
    assert protocol.ack(1, t).endswith(b"\n") and protocol.ack(1, t).count(b"\n") == 1


def test_refusal_shape() -> None:
    """An error carries ok=false, error, kind and the line number."""
    body = json.loads(protocol.refusal(protocol.RequestError("malformed", "bad"), 3))
    assert body == {"ok": False, "error": "bad", "kind": "malformed", "line": 3}


@pytest.mark.parametrize(
    ("problem", "kind"),
    [
        pytest.param(
            "unknown actor (register it first with actor_registered)", "unknown_actor", id="unknown"
        ),
        pytest.param(
            "not accepted in this state (accepted here: x)", "invalid_in_state", id="state"
        ),
    ],
)
def test_machine_refusals_are_classified(problem: str, kind: str) -> None:
    """InvalidEvent maps to unknown_actor or invalid_in_state."""
    error = protocol.classify_refusal(errors.InvalidEvent("a1", "new", "run_requested", problem))
    assert error.kind == kind
    assert error.actor_id == "a1"
    assert "a1" in error.message


def test_every_kind_has_a_bounded_rejection_reason() -> None:
    """Each error kind maps to a reason AgentMetrics knows."""
    from substrate_gpu.observability.metrics import EVENT_REJECTION_REASONS

    assert set(protocol.REJECTION_REASONS) == protocol.ERROR_KINDS - protocol.CONNECTION_ERROR_KINDS
    assert set(protocol.REJECTION_REASONS.values()) <= EVENT_REJECTION_REASONS
