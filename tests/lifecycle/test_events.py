"""Events are frozen, typed, versioned values with a JSON form."""

from __future__ import annotations

import json
from typing import Literal

import msgspec
import pytest

from lifecycle.factories import make_event
from substrate_gpu.lifecycle import codec, errors, events

ALL_TYPES = [pytest.param(name, id=name) for name in sorted(events.REGISTRY)]


@pytest.mark.parametrize("event_type", ALL_TYPES)
def test_json_round_trip(event_type: str) -> None:
    """to_json then from_json gives an equal event of the same class."""
    event = make_event(event_type, actor_id="actor-7").stamped(42)
    back = events.from_json(event.to_json())
    assert back == event
    assert type(back) is type(event)


VERIFIED_BY_V2 = {"sandbox_started", "restored", "cuda_resumed"}


@pytest.mark.parametrize("event_type", ALL_TYPES)
def test_json_form_carries_type_version_actor_and_sequence(event_type: str) -> None:
    """The JSON object names its type, schema version, actor and sequence."""
    data = json.loads(make_event(event_type, actor_id="x").stamped(3).to_json())
    # actor_registered v2: GPU allocation, v3: sandboxes, v4: GPUs per container;
    # suspend_requested v2: image_path;
    # v2 of the start/restore outcomes: the GPU check after start/restore.
    versions = {"actor_registered": 4, "suspend_requested": 2, **dict.fromkeys(VERIFIED_BY_V2, 2)}
    version = versions.get(event_type, 1)
    assert (data["type"], data["v"], data["actor_id"], data["seq"]) == (event_type, version, "x", 3)
    assert isinstance(data["at"], float)


def test_events_are_frozen() -> None:
    """An event cannot be mutated."""
    event = events.RunRequested(actor_id="a")
    with pytest.raises(AttributeError, match="immutable"):
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
        pytest.param('{"v": 1, "actor_id": "a"}', "missing required field `type`", id="no-type"),
        pytest.param(
            '{"type": "run_requested", "v": 1}', "missing required field `actor_id`", id="missing"
        ),
        pytest.param(
            '{"type": "gpu_injected", "v": 1, "actor_id": "a", "devices": "2"}',
            "Expected `int`, got `str` - at `$.devices`",
            id="field-type",
        ),
        pytest.param(
            '{"type": "gpu_injected", "v": 1, "actor_id": "a", "devices": true}',
            "Expected `int`, got `bool` - at `$.devices`",
            id="bool-is-not-int",
        ),
        pytest.param(
            '{"type": "run_requested", "v": 1, "actor_id": "a", "extra": 1}',
            "unknown field `extra`",
            id="extra-field",
        ),
        pytest.param(
            '{"type": "actor_registered", "v": 1, "actor_id": "a", "gpu": true, "bundle": "/b", "suspend_policy": "never"}',
            "Invalid enum value 'never' - at `$.suspend_policy`",
            id="unknown-suspend-policy",
        ),
        pytest.param(
            '{"type": "run_requested", "v": 1, "actor_id": "a", "at": -1e300}',
            "Expected `float` >= 0.0 - at `$.at`",
            id="at-before-the-epoch",
        ),
        pytest.param(
            '{"type": "run_requested", "v": 1, "actor_id": "a", "at": 1e13}',
            "Expected `float` <= 253402300799.0 - at `$.at`",
            id="at-after-year-9999",
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
        class Again(events.Event, frozen=True, tag="run_requested"):
            pass


def test_an_event_class_without_its_type_name_is_refused() -> None:
    """An event class must name its type (msgspec's tag): the class name is not one."""
    with pytest.raises(TypeError, match="explicit tag"):

        @events.register
        class Untagged(events.Event, frozen=True):
            pass


def test_a_decode_error_names_the_field_path() -> None:
    """The error carries msgspec's JSON path of the offending value, not a traceback."""
    with pytest.raises(errors.EventSchemaError) as info:
        events.from_json('{"type": "cuda_context_opened", "v": 1, "actor_id": "a", "pid": "7"}')
    assert info.value.field == "$.pid"  # type: ignore[attr-defined]
    assert str(info.value) == "invalid event: Expected `int`, got `str` - at `$.pid`"


def test_a_constructed_event_with_an_unknown_suspend_policy_is_refused() -> None:
    """Built in code, not decoded, a bad policy still fails at construction."""
    with pytest.raises(errors.EventSchemaError, match="unknown suspend_policy"):
        events.ActorRegistered(actor_id="a", gpu=True, bundle="/b", suspend_policy="never")  # type: ignore[arg-type]


def test_the_json_form_of_an_event_is_what_msgspec_writes_for_it() -> None:
    """to_json, to_dict and the codec agree; an int `at` reads as the float it means."""
    event = events.SandboxExited(actor_id="a", status=3, seq=4, at=5.0)
    assert (
        json.loads(event.to_json())
        == event.to_dict()
        == {
            "type": "sandbox_exited",
            "v": 1,
            "actor_id": "a",
            "seq": 4,
            "at": 5.0,
            "status": 3,
        }
    )
    back = events.from_json(event.to_json().replace("5.0", "5"))
    assert back == event and isinstance(back.at, float)


def test_a_version_bump_reads_both_versions_and_upgrades_the_old_one() -> None:
    """The documented path for a type's v2: Literal[1, 2] = 2, __post_init__ upgrades a v1."""

    class Bumped(events.Event, frozen=True, tag="bumped_for_test"):
        v: Literal[1, 2] = 2  # type: ignore[assignment]
        seconds: float = 0.0
        """v1 carried milliseconds in ``seconds``; v2 carries seconds."""

        def __post_init__(self) -> None:
            if self.v == 1:
                msgspec.structs.force_setattr(self, "seconds", self.seconds / 1000)
                msgspec.structs.force_setattr(self, "v", 2)

    decoder: codec.Decoder[events.Event] = codec.Decoder(
        Bumped, what="event", kinds={"bumped_for_test": Bumped}
    )
    old = decoder.decode(b'{"type": "bumped_for_test", "v": 1, "actor_id": "a", "seconds": 1500}')
    new = decoder.decode(b'{"type": "bumped_for_test", "v": 2, "actor_id": "a", "seconds": 1.5}')
    assert (old.v, old.seconds) == (new.v, new.seconds) == (2, 1.5)  # type: ignore[attr-defined]
    assert json.loads(old.to_json())["v"] == 2
    with pytest.raises(
        errors.EventSchemaError, match="schema version 3; this agent reads version 1, 2"
    ):
        decoder.decode(b'{"type": "bumped_for_test", "v": 3, "actor_id": "a"}')


@pytest.mark.parametrize("event_type", sorted(VERIFIED_BY_V2))
def test_v1_lines_of_the_outcomes_before_verification_still_decode(event_type: str) -> None:
    """A v1 line (an agent before ``verifying``) reads back as v1: the machine replays it
    straight to running (``verifies_gpus`` is false for it)."""
    data = json.loads(make_event(event_type, actor_id="x").stamped(3).to_json())
    old = events.from_json(json.dumps({**data, "v": 1}))
    assert (old.type, old.v) == (event_type, 1)
