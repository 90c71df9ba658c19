"""Events are frozen, typed, versioned values with a JSON form."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lifecycle.factories import make_event
from substrate_gpu.lifecycle import errors, events

ALL_TYPES = [pytest.param(name, id=name) for name in sorted(events.REGISTRY)]


@pytest.mark.parametrize("event_type", ALL_TYPES)
def test_json_round_trip(event_type: str) -> None:
    """to_json then from_json gives an equal event of the same class."""
    event = make_event(event_type, actor_id="actor-7").stamped(42)
    back = events.from_json(event.to_json())
    assert back == event
    assert type(back) is type(event)


@pytest.mark.parametrize("event_type", ALL_TYPES)
def test_json_form_carries_type_version_actor_and_sequence(event_type: str) -> None:
    """The JSON object names its type, schema version, actor and sequence."""
    data = json.loads(make_event(event_type, actor_id="x").stamped(3).to_json())
    assert (data["type"], data["v"], data["actor_id"], data["seq"]) == (event_type, 1, "x", 3)
    assert isinstance(data["at"], float)


def test_events_are_frozen() -> None:
    """An event cannot be mutated."""
    event = events.RunRequested(actor_id="a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.actor_id = "b"  # type: ignore[misc]


def test_events_are_hashable_and_equal_by_value() -> None:
    """Equal fields make equal events with equal hashes."""
    a = events.SandboxExited(actor_id="a", status=1, at=5.0)
    b = events.SandboxExited(actor_id="a", status=1, at=5.0)
    assert a == b
    assert len({a, b}) == 1


def test_events_order_by_sequence() -> None:
    """Sorting events orders them by acceptance sequence, across types."""
    later = events.RunRequested(actor_id="a", seq=2, at=1.0)
    earlier = events.DeleteRequested(actor_id="b", seq=1, at=9.0)
    assert sorted([later, earlier]) == [earlier, later]


def test_outcomes_are_not_external() -> None:
    """Effect outcomes are marked as such; node-agent events are external."""
    assert events.RunRequested.external
    assert not events.CheckpointFailed.external


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        pytest.param(
            '{"type": "nope", "v": 1, "actor_id": "a"}', "unknown event type 'nope'", id="type"
        ),
        pytest.param(
            '{"type": "run_requested", "v": 2, "actor_id": "a"}', "schema version 2", id="version"
        ),
        pytest.param('{"v": 1, "actor_id": "a"}', "no string 'type'", id="no-type"),
        pytest.param('{"type": "run_requested", "v": 1}', "lacks field 'actor_id'", id="missing"),
        pytest.param(
            '{"type": "gpu_injected", "v": 1, "actor_id": "a", "devices": "2"}',
            "field 'devices' must be int",
            id="field-type",
        ),
        pytest.param(
            '{"type": "gpu_injected", "v": 1, "actor_id": "a", "devices": true}',
            "field 'devices' must be int",
            id="bool-is-not-int",
        ),
        pytest.param(
            '{"type": "run_requested", "v": 1, "actor_id": "a", "extra": 1}',
            "unknown field(s) extra",
            id="extra-field",
        ),
        pytest.param("[1]", "must be a JSON object", id="not-object"),
        pytest.param("{", "not valid JSON", id="not-json"),
    ],
)
def test_invalid_json_is_refused_clearly(payload: str, expected: str) -> None:
    """Malformed, unknown-type or unknown-version JSON raises EventSchemaError."""
    with pytest.raises(errors.EventSchemaError) as info:
        events.from_json(payload)
    assert expected in str(info.value)


def test_registering_a_type_twice_is_refused() -> None:
    """Two event classes cannot share a type name."""
    with pytest.raises(TypeError, match="registered twice"):

        @events.register
        @dataclasses.dataclass(frozen=True, kw_only=True)
        class Again(events.Event):
            type = "run_requested"
