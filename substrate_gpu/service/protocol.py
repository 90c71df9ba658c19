"""The agent's wire protocol: one JSON object per line in, one JSON object per line out.

Pure functions on bytes and values; the server (:mod:`.server`) does the I/O.

**Requests** are lifecycle events in their JSON form (:meth:`Event.to_json`) without a
``seq``: ``{"type": "run_requested", "v": 1, "actor_id": "a1"}``. ``at`` is optional
(default: when the agent read the line). ``actor_id`` must match :data:`ACTOR_ID`: it
becomes a container id and a directory name, so a path in it is refused. Only *external*
events are accepted: outcomes (``gpu_injected``, ``checkpoint_written``, ...) are produced
by the agent's own effects.

**Responses**, one per request line, in the order of the lines on that connection:

- ``{"ok": true, "seq": N, "actor_id": A, "event": T, "from": S, "state": D}`` (plus
  ``"reason"`` when the transition carries one, e.g. a suspend refused while a CUDA context
  is live): the event is in the event log (durable) and applied; its effect, if any, runs
  after the acknowledgement. ``seq`` is its position in the log.
- ``{"ok": false, "error": MESSAGE, "kind": K, "line": L}`` (plus ``"actor_id"`` when
  known): nothing was logged or changed. ``line`` is the 1-based line number on this
  connection (or stdin). ``kind`` is one of :data:`ERROR_KINDS`.

Why ``seq`` is refused in a request: the agent stamps it, and the machine keeps a non-zero
``seq`` as given (replay needs that), so a client-chosen one could reorder the log.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from substrate_gpu.lifecycle import errors, events, hooks

#: The longest request line accepted (bytes, newline excluded); a longer one is an error
#: and the connection is closed (its remainder cannot be framed reliably).
MAX_LINE_BYTES: Final = 64 * 1024

#: What an actor id may be: it becomes the runsc container id and a directory name under
#: ``--checkpoint-root``, so no ``/``, no ``..``, nothing runsc refuses.
ACTOR_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

#: The kinds of error a connection (not a request line) gets before the agent hangs up:
#: ``busy`` (``--max-clients`` reached), ``timeout`` (a line not finished in
#: ``--line-timeout``). They are counted as connections, not as rejected events.
CONNECTION_ERROR_KINDS: Final[frozenset[str]] = frozenset({"busy", "timeout"})

#: Every ``kind`` an error response can carry.
ERROR_KINDS: Final[frozenset[str]] = (
    frozenset(
        {
            "malformed",
            "schema",
            "not_external",
            "invalid_in_state",
            "unknown_actor",
            "too_long",
            "unavailable",
        }
    )
    | CONNECTION_ERROR_KINDS
)

#: The ``substrate_gpu_events_rejected`` reason for each request error kind (bounded values).
REJECTION_REASONS: Final[Mapping[str, str]] = {
    "malformed": "malformed",
    "schema": "malformed",
    "not_external": "malformed",
    "too_long": "malformed",
    "invalid_in_state": "invalid_in_state",
    "unknown_actor": "unknown_actor",
    "unavailable": "log_unavailable",
}

#: The event times (``at``, seconds since the epoch) a request may carry: the epoch to the
#: last second of year 9999 UTC, what a calendar (``datetime``) can show. Anything else is a
#: client bug, and once logged it would follow the log into every replay.
AT_RANGE: Final = (0.0, 253_402_300_799.0)


@dataclass(frozen=True)
class RequestError:
    """A request line that was refused before reaching the agent, or by the machine."""

    kind: str
    """One of :data:`ERROR_KINDS`."""
    message: str
    """What was wrong, for the client."""
    actor_id: str | None = None
    """The actor the line named, when it named one."""


def parse_request(line: bytes) -> events.Event | RequestError:
    """The event a request line carries, or why it cannot be accepted (never raises)."""
    try:
        data: object = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        return RequestError("malformed", f"request is not valid JSON: {e}")
    except RecursionError:
        # json's decoder recurses per nesting level: 2,000 '[' exhaust the stack.
        return RequestError("malformed", "request is nested too deeply to be an event")
    if not isinstance(data, dict):
        return RequestError(
            "malformed", f"request must be a JSON object (an event), got {type(data).__name__}"
        )
    actor = data.get("actor_id")
    actor_id = actor if isinstance(actor, str) else None
    if "seq" in data:
        return RequestError(
            "schema",
            "request must not carry 'seq': the agent assigns it when it accepts the event",
            actor_id,
        )
    at_error = at_problem(data.get("at"))
    if at_error is not None:
        return RequestError("schema", at_error, actor_id)
    try:
        event = events.from_dict(data)
    except errors.EventSchemaError as e:
        return RequestError("schema", str(e), actor_id)
    except (ValueError, TypeError, OverflowError) as e:
        # Numbers JSON allows but a float cannot hold (an "at" of 10**400).
        return RequestError("schema", f"event has an unusable value: {e}", actor_id)
    if not event.external:
        return RequestError(
            "not_external",
            f"event type {event.type!r} is an effect outcome produced by the agent itself; "
            "send external events only",
            actor_id,
        )
    if not ACTOR_ID.fullmatch(event.actor_id):
        return RequestError(
            "schema",
            f"actor_id {event.actor_id!r} is not a valid id: it names the sandbox container "
            "and a checkpoint directory, so it must match "
            f"{ACTOR_ID.pattern} (letters, digits, '_', '.', '-'; 1-128 characters)",
        )
    return event


def at_problem(at: object) -> str | None:
    """Why ``at`` cannot be a request's event time; None when it can (or is absent).

    A value of the wrong type is left to the event schema, which names the field and type.
    """
    if at is None or isinstance(at, bool) or not isinstance(at, int | float):
        return None
    low, high = AT_RANGE
    try:
        seconds = float(at)
    except OverflowError:
        seconds = math.inf
    if math.isfinite(seconds) and low <= seconds <= high:
        return None
    shown = repr(at) if len(repr(at)) <= 24 else f"{repr(at)[:20]}..."
    return (
        f"event field 'at' must be a finite time in seconds since the epoch between "
        f"{low:.0f} and {high:.0f} (year 9999), got {shown}"
    )


def classify_refusal(error: errors.InvalidEvent) -> RequestError:
    """The response for an event the machine refused."""
    unknown = error.problem.startswith("unknown actor")
    return RequestError(
        "unknown_actor" if unknown else "invalid_in_state", str(error), error.actor_id
    )


def ack(seq: int, transition: hooks.Transition) -> bytes:
    """The acknowledgement line of an accepted event."""
    body: dict[str, object] = {
        "ok": True,
        "seq": seq,
        "actor_id": transition.actor_id,
        "event": transition.event_type,
        "from": transition.source,
        "state": transition.dest,
    }
    if transition.reason:
        body["reason"] = transition.reason
    return _line(body)


def refusal(error: RequestError, line_number: int) -> bytes:
    """The error line of a refused request."""
    body: dict[str, object] = {
        "ok": False,
        "error": error.message,
        "kind": error.kind,
        "line": line_number,
    }
    if error.actor_id is not None:
        body["actor_id"] = error.actor_id
    return _line(body)


def _line(body: Mapping[str, object]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
