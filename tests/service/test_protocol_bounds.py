"""The protocol's bounds: nesting no decoder survives, and event times a calendar can show."""

from __future__ import annotations

import pytest

from substrate_gpu.lifecycle import events
from substrate_gpu.service import protocol


def _run(at: str) -> bytes:
    return b'{"type": "run_requested", "v": 1, "actor_id": "a1", "at": ' + at.encode() + b"}"


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b"[" * 2000, id="2000-brackets"),
        pytest.param(b'{"a":' * 2000, id="2000-objects"),
        pytest.param(b"[" * 60_000, id="60000-brackets"),
    ],
)
def test_nesting_deeper_than_the_decoder_is_malformed_not_raised(line: bytes) -> None:
    """A RecursionError inside the decoder is a 'malformed' answer."""
    parsed = protocol.parse_request(line)
    assert isinstance(parsed, protocol.RequestError)
    assert parsed.kind == "malformed"


def _padded_to(size: int) -> bytes:
    """A valid request of exactly ``size`` bytes (JSON whitespace before its closing brace)."""
    line = b'{"type": "run_requested", "v": 1, "actor_id": "a1"'
    return line + b" " * (size - len(line) - 1) + b"}"


def test_a_request_of_exactly_the_line_bound_is_accepted() -> None:
    """parse_request's own bound admits MAX_LINE_BYTES bytes (the newline not counted)."""
    parsed = protocol.parse_request(_padded_to(protocol.MAX_LINE_BYTES))
    assert isinstance(parsed, events.RunRequested)


def test_a_valid_request_one_byte_over_the_line_bound_is_too_long() -> None:
    """One byte more is refused before decoding, however valid the request is otherwise
    (a caller other than the server's reader gets the same bound)."""
    parsed = protocol.parse_request(_padded_to(protocol.MAX_LINE_BYTES + 1))
    assert isinstance(parsed, protocol.RequestError)
    assert parsed.kind == "too_long"
    assert str(protocol.MAX_LINE_BYTES) in parsed.message


@pytest.mark.parametrize(
    "at",
    ["-1e300", "1e300", "-1", "-0.5", "253402300800", "1e19", "1" + "0" * 400],
)
def test_an_at_outside_the_calendar_is_a_schema_error(at: str) -> None:
    """'at' must lie between the epoch and the end of year 9999, naming the field."""
    parsed = protocol.parse_request(_run(at))
    assert isinstance(parsed, protocol.RequestError)
    assert parsed.kind == "schema"
    assert parsed.field == "$.at" and "$.at" in parsed.message
    assert parsed.actor_id == "a1"


@pytest.mark.parametrize("at", ["0", "1.5", "1764460800", "253402300799"])
def test_an_at_inside_the_calendar_is_kept(at: str) -> None:
    """The range's ends and ordinary times are accepted as given."""
    parsed = protocol.parse_request(_run(at))
    assert isinstance(parsed, events.Event)
    assert parsed.at == float(at)


def test_a_mistyped_at_is_left_to_the_event_schema() -> None:
    """A string 'at' is the schema's error (its message names the type), not the range's."""
    parsed = protocol.parse_request(_run('"noon"'))
    assert isinstance(parsed, protocol.RequestError)
    assert parsed.kind == "schema"
    assert "Expected `float`, got `str`" in parsed.message
