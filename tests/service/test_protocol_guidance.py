"""Protocol refusals that point the way: what is missing, what was probably meant."""

from __future__ import annotations

import pytest

from substrate_gpu.lifecycle import errors, events, machine
from substrate_gpu.observability.metrics import EVENT_REJECTION_REASONS
from substrate_gpu.service import protocol

OUTCOMES = sorted(t for t, c in events.REGISTRY.items() if not c.external)


def _refused(line: bytes) -> protocol.RequestError:
    parsed = protocol.parse_request(line)
    assert isinstance(parsed, protocol.RequestError), parsed
    return parsed


def test_a_missing_v_is_named_as_missing_not_as_a_version() -> None:
    """No ``v``: the message says the field is missing, not "schema version None"."""
    error = _refused(b'{"type": "run_requested", "actor_id": "a1"}')
    assert "lacks 'v'" in error.message
    assert "None" not in error.message and "upgrade" not in error.message
    assert error.field == "$.v"


def test_a_misspelt_type_suggests_the_closest_external_types() -> None:
    """``run_requestd`` -> "did you mean 'run_requested'"; outcomes are never suggested."""
    error = _refused(b'{"type": "run_requestd", "v": 1, "actor_id": "a1"}')
    assert "did you mean 'run_requested'" in error.message
    assert not any(outcome in error.message for outcome in OUTCOMES)
    assert error.field == "$.type"
    assert error.kind == "schema"


def test_an_unknown_type_far_from_every_name_lists_what_a_client_may_send() -> None:
    """No close match: the external types are listed (not all 31 types)."""
    error = _refused(b'{"type": "launch_rockets", "v": 1, "actor_id": "a1"}')
    assert "did you mean" not in error.message
    assert "run_requested" in error.message
    assert not any(outcome in error.message for outcome in OUTCOMES)


def test_an_outcome_type_is_refused_as_not_external_even_with_fields_missing() -> None:
    """``gpu_injected`` without its fields: "the agent produces it", not "missing devices"."""
    error = _refused(b'{"type": "gpu_injected", "v": 1, "actor_id": "a1"}')
    assert error.kind == "not_external"
    assert "devices" not in error.message


def test_accepted_here_lists_only_events_a_client_may_send() -> None:
    """A state refusal names the external events that state accepts, no effect outcomes."""
    spec = machine.load_spec()
    refused = errors.InvalidEvent(
        "a1", "running", "run_requested", "not accepted in this state (accepted here: x)"
    )
    error = protocol.classify_refusal(refused, spec)
    external_here = sorted(t for t in spec.accepts["running"] if events.REGISTRY[t].external)
    assert external_here and all(t in error.message for t in external_here)
    assert not any(t in error.message for t in spec.accepts["running"] if t not in external_here)


def test_accepted_here_in_an_in_flight_state_says_to_wait() -> None:
    """While an effect runs, a client can send little; the message says what and why."""
    spec = machine.load_spec()
    state = next(iter(sorted(spec.effects)))
    refused = errors.InvalidEvent("a1", state, "run_requested", "not accepted in this state")
    error = protocol.classify_refusal(refused, spec)
    assert "accepted here" in error.message
    assert not any(t in error.message.split("accepted here", 1)[1] for t in OUTCOMES)


@pytest.mark.parametrize("kind", ["schema", "not_external"])
def test_schema_errors_have_their_own_metric_reason(kind: str) -> None:
    """Schema refusals are counted as ``schema``, not lumped with ``malformed``."""
    assert protocol.REJECTION_REASONS[kind] == "schema"
    assert "schema" in EVENT_REJECTION_REASONS
