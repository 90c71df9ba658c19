"""The agent's wire protocol: one JSON object per line in, one JSON object per line out.

Pure functions on bytes and values; the transports (:mod:`.lines`) do the I/O. Requests and
answers are msgspec types decoded and encoded by :mod:`substrate_gpu.lifecycle.codec`, the
codec of the event log too; ``docs/schema/agent-protocol.schema.json`` is generated from
them (:mod:`substrate_gpu.service.schema`).

**Requests** are lifecycle events in their JSON form (:meth:`Event.to_json`) without a
``seq``: ``{"type": "run_requested", "v": 1, "actor_id": "a1"}``. ``v`` is required (the
client says which version of the type it speaks; an ``actor_registered`` of ``v`` 1 is
upgraded to 3 before it is logged, so the GPU allocator decides for every GPU actor). ``at``
is optional (default: when the agent read the line) and bounded (``events.AT_MIN`` to
``events.AT_MAX``). ``actor_id`` must match :data:`ACTOR_ID`: it becomes a container id and
a directory name, so a path in it is refused. Only *external* events are accepted: outcomes
(``gpu_injected``, ``checkpoint_written``, ...) are produced by the agent's own effects.

**Answers**, one per request line, in the order of the lines on that connection:

- :class:`Ack` ``{"ok": true, "seq": N, "actor_id": A, "event": T, "from": S, "state": D}``
  (plus ``"reason"`` when the transition carries one, e.g. a suspend refused while a CUDA
  context is live): the event is in the event log (durable) and applied; its effect, if
  any, runs after the acknowledgement. ``seq`` is its position in the log.
- :class:`Refusal` ``{"ok": false, "error": MESSAGE, "kind": K, "line": L}`` (plus
  ``"actor_id"`` when known, and ``"field"``, the JSON path of the offending value such as
  ``$.pid``, when one value was at fault): nothing was logged or changed. ``line`` is the
  1-based line number on this connection (or stdin). ``kind`` is one of
  :data:`ERROR_KINDS`: ``malformed`` (not JSON, not an object, nested deeper than the
  decoder goes, not UTF-8), ``too_long`` (over :data:`MAX_LINE_BYTES`), ``schema`` (a
  well-formed line that is no valid event), ``not_external``, ``invalid_in_state``,
  ``unknown_actor``.

**Queries** (:class:`ActorQuery`, :class:`ActorsQuery`) carry a ``query`` key instead of a
``type``: ``{"query": "actor", "actor_id": "a1"}`` is answered with an :class:`ActorAnswer`,
``{"query": "actors", "state": "running"}`` (``state`` optional) with an
:class:`ActorsAnswer`, or either with a :class:`Refusal`. They change and log nothing
(:mod:`substrate_gpu.service.query` answers them).

Why ``seq`` is refused in a request: the agent stamps it, and the machine keeps a non-zero
``seq`` as given (replay needs that), so a client-chosen one could reorder the log.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

import msgspec

from substrate_gpu.lifecycle import codec, errors, events, hooks, machine

#: The longest request line accepted (bytes, newline excluded); a longer one is an error
#: and the connection is closed (its remainder cannot be framed reliably).
MAX_LINE_BYTES: Final = 64 * 1024

#: What an actor id may be: it becomes the runsc container id and a directory name under
#: ``--checkpoint-root``, so no ``/``, no ``..``, nothing runsc refuses.
ACTOR_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

ErrorKind = Literal[
    "malformed",
    "schema",
    "not_external",
    "invalid_in_state",
    "unknown_actor",
    "too_long",
    "unavailable",
    "busy",
    "timeout",
]
"""Why a request line (or a connection) was refused."""

#: Every ``kind`` an error response can carry.
ERROR_KINDS: Final[frozenset[str]] = frozenset(ErrorKind.__args__)  # type: ignore[attr-defined]

#: The kinds of error a connection (not a request line) gets before the agent hangs up:
#: ``busy`` (``--max-clients`` reached), ``timeout`` (a line not finished in
#: ``--line-timeout``). They are counted as connections, not as rejected events.
CONNECTION_ERROR_KINDS: Final[frozenset[str]] = frozenset({"busy", "timeout"})

#: The ``substrate_gpu_events_rejected`` reason for each request error kind (bounded values).
REJECTION_REASONS: Final[Mapping[str, str]] = {
    "malformed": "malformed",
    "schema": "schema",
    "not_external": "schema",
    "too_long": "malformed",
    "invalid_in_state": "invalid_in_state",
    "unknown_actor": "unknown_actor",
    "unavailable": "log_unavailable",
}


class Ack(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The answer to an accepted request: logged (durable) and applied."""

    ok: Literal[True]
    seq: int
    """The event's position in the event log."""
    actor_id: str
    event: str
    """The event's type."""
    source: str = msgspec.field(name="from")
    """The actor's state before."""
    state: str
    """The actor's state after."""
    reason: str | msgspec.UnsetType = msgspec.UNSET
    """Why, when the transition says (a refused suspend, a failure)."""


class Refusal(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The answer to a refused request: nothing was logged or changed."""

    ok: Literal[False]
    error: str
    """What was wrong, for a person."""
    kind: ErrorKind
    line: int
    """The request's 1-based line number on its connection."""
    actor_id: str | msgspec.UnsetType = msgspec.UNSET
    """The actor the line named, when it named one."""
    field: str | msgspec.UnsetType = msgspec.UNSET
    """The JSON path of the offending value (``$.pid``), when one value was at fault."""


# --- queries: ask the agent, change nothing (handled by :mod:`substrate_gpu.service.query`) ---


class ActorQuery(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    tag_field="query",
    tag="actor",
):
    """``{"query": "actor", "actor_id": A}``: one actor's state and reason."""

    actor_id: str


class ActorsQuery(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    tag_field="query",
    tag="actors",
):
    """``{"query": "actors"}``, or with ``"state": S``: every actor (in state ``S``)."""

    state: str | msgspec.UnsetType = msgspec.UNSET
    """Only the actors in this state (a state of ``machines/actor.yaml``)."""


Query = ActorQuery | ActorsQuery
"""A query line (told apart from an event line by its ``query`` key)."""


class ActorStatus(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a query says about one actor."""

    actor_id: str
    state: str
    gpu: bool
    reason: str | msgspec.UnsetType = msgspec.UNSET
    """Why it stands where it stands, when the last transition said (a refusal, a failure)."""
    checkpoint: str | msgspec.UnsetType = msgspec.UNSET
    """Its latest checkpoint image, when it has one."""
    containers: list[str] | msgspec.UnsetType = msgspec.UNSET
    """A sandbox actor's app containers, in order (``_pause`` implied); absent for a
    single-container actor."""
    identity: dict[str, str] | msgspec.UnsetType = msgspec.UNSET
    """The identity the registration carried (opaque to the agent), when it carried one."""


class ActorAnswer(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The answer to an :class:`ActorQuery`."""

    ok: Literal[True]
    actor: ActorStatus


class ActorsAnswer(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The answer to an :class:`ActorsQuery`: the actors, ordered by id."""

    ok: Literal[True]
    actors: list[ActorStatus]


@dataclass(frozen=True)
class RequestError:
    """A request line that was refused before reaching the agent, or by the machine."""

    kind: ErrorKind
    """One of :data:`ERROR_KINDS`."""
    message: str
    """What was wrong, for the client."""
    actor_id: str | None = None
    """The actor the line named, when it named one."""
    field: str | None = None
    """The JSON path of the offending value, when one value was at fault."""


#: The event types a client may send (sorted): suggestions and "accepted here" name only these.
EXTERNAL_TYPES: Final[tuple[str, ...]] = tuple(
    sorted(t for t, cls in events.REGISTRY.items() if cls.external)
)


class _Envelope(msgspec.Struct):
    """The keys of a request line the event types cannot tell apart from their defaults.

    A well-formed request is decoded twice, as its event and as this envelope (``v`` given,
    ``seq`` absent), on purpose: the envelope pass is a small share of parse_request's
    time. The one-pass alternative, a request subclass of every external event with ``v``
    required and ``seq`` captured, must then build the event again: more types, slower,
    and no figure a client sees moves (tests/bench/README.md, "Figures behind design
    choices").
    """

    type: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    v: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    seq: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    actor_id: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_ENVELOPE: Final = msgspec.json.Decoder(_Envelope)
_REQUEST: Final[codec.Decoder[events.Event]] = codec.Decoder(
    events.AnyEvent, what="request", kinds=events.REGISTRY
)


def _envelope(line: bytes) -> _Envelope | None:
    try:
        return _ENVELOPE.decode(line)
    except (msgspec.MsgspecError, RecursionError):
        return None


def _actor_named(line: bytes) -> str | None:
    """The actor id a refused line names, if it names one (only on the error path)."""
    envelope = _envelope(line)
    if envelope is None or isinstance(envelope.actor_id, msgspec.UnsetType):
        return None
    try:
        return msgspec.json.decode(envelope.actor_id, type=str)
    except msgspec.MsgspecError:
        return None


def _type_named(line: bytes) -> str | None:
    """The ``type`` a refused line names, if it names a string (only on the error path)."""
    envelope = _envelope(line)
    if envelope is None or isinstance(envelope.type, msgspec.UnsetType):
        return None
    try:
        return msgspec.json.decode(envelope.type, type=str)
    except msgspec.MsgspecError:
        return None


def _not_external(kind: str, actor_id: str | None) -> RequestError:
    return RequestError(
        "not_external",
        f"event type {kind!r} is an effect outcome produced by the agent itself; "
        "send external events only",
        actor_id,
        "$.type",
    )


def _schema_error(line: bytes, failure: codec.DecodeFailure) -> RequestError:
    """A well-formed line that is no valid request: say what a client may send instead."""
    actor_id = _actor_named(line)
    kind = _type_named(line)
    if kind is not None and kind in events.REGISTRY and not events.REGISTRY[kind].external:
        return _not_external(kind, actor_id)  # before its missing fields: it cannot be sent
    if kind is not None and kind not in events.REGISTRY:
        close = difflib.get_close_matches(kind, EXTERNAL_TYPES, n=3, cutoff=0.6)
        hint = (
            f"did you mean {' or '.join(repr(c) for c in close)}?"
            if close
            else f"a client may send: {', '.join(EXTERNAL_TYPES)}"
        )
        return RequestError(
            "schema", f"unknown event type {kind!r}; {hint} - at `$.type`", actor_id, "$.type"
        )
    return RequestError("schema", str(failure), actor_id, failure.field)


def parse_request(line: bytes) -> events.Event | RequestError:
    """The event a request line carries, or why it cannot be accepted (never raises)."""
    if len(line) > MAX_LINE_BYTES:
        return RequestError("too_long", f"request line exceeds {MAX_LINE_BYTES} bytes")
    try:
        event = _REQUEST.decode(line)
    except codec.DecodeFailure as e:
        if e.malformed:
            return RequestError("malformed", str(e))
        return _schema_error(line, e)
    envelope = _envelope(line)  # the line decoded as an event: it is well-formed
    assert envelope is not None
    if isinstance(envelope.v, msgspec.UnsetType):
        return RequestError(
            "schema",
            f"request for {event.type!r} lacks 'v': a client says which version of the event "
            "type it speaks - at `$.v`",
            event.actor_id,
            "$.v",
        )
    if not isinstance(envelope.seq, msgspec.UnsetType):
        return RequestError(
            "schema",
            "request must not carry 'seq': the agent assigns it when it accepts the event "
            "- at `$.seq`",
            event.actor_id,
            "$.seq",
        )
    if not event.external:
        return _not_external(event.type, event.actor_id)
    if not ACTOR_ID.fullmatch(event.actor_id):
        return RequestError(
            "schema",
            f"actor_id {event.actor_id!r} is not a valid id: it names the sandbox container "
            "and a checkpoint directory, so it must match "
            f"{ACTOR_ID.pattern} (letters, digits, '_', '.', '-'; 1-128 characters)"
            " - at `$.actor_id`",
            field="$.actor_id",
        )
    if isinstance(event, events.ActorRegistered) and not event.allocates_gpus:
        # v1 predates the allocator: in a log it means "all the worker's GPUs, unallocated"
        # and replays so. A client still speaking v1 today must not bypass the allocator
        # (its actor would share GPUs another actor was granted): the door upgrades the
        # request before it is logged, and v2 with the same fields asks for all the
        # worker's GPUs through the allocator. (Upgraded to the newest version: v3 with
        # no containers and no identity means what v2 means.)
        return msgspec.structs.replace(event, v=3)
    return event


def classify_refusal(
    error: errors.InvalidEvent, spec: machine.MachineSpec | None = None
) -> RequestError:
    """The response for an event the machine refused.

    With the machine's ``spec``, a state refusal lists what a *client* may send in that
    state (the machine's own message lists effect outcomes too, which no client can send).
    """
    if error.problem.startswith("unknown actor"):
        return RequestError("unknown_actor", str(error), error.actor_id)
    message = str(error)
    if spec is not None and error.state in spec.accepts:
        sendable = sorted(t for t in spec.accepts[error.state] if t in EXTERNAL_TYPES)
        here = (
            ", ".join(sendable)
            if sendable
            else "nothing while its effect runs; wait for it to finish"
            if error.state in spec.effects
            else "nothing"
        )
        message = (
            f"actor {error.actor_id!r} in state {error.state!r} refused event "
            f"{error.event_type!r}: not accepted in this state (accepted here: {here})"
        )
    return RequestError("invalid_in_state", message, error.actor_id)


def ack(seq: int, transition: hooks.Transition) -> bytes:
    """The acknowledgement line of an accepted event."""
    return codec.encode_line(
        Ack(
            ok=True,
            seq=seq,
            actor_id=transition.actor_id,
            event=transition.event_type,
            source=transition.source,
            state=transition.dest,
            reason=transition.reason or msgspec.UNSET,
        )
    )


def refusal(error: RequestError, line_number: int) -> bytes:
    """The error line of a refused request."""
    return codec.encode_line(
        Refusal(
            ok=False,
            error=error.message,
            kind=error.kind,
            line=line_number,
            actor_id=msgspec.UNSET if error.actor_id is None else error.actor_id,
            field=msgspec.UNSET if error.field is None else error.field,
        )
    )
