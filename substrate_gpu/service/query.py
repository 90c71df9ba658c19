"""Queries on the agent's socket: read the actors' state, change nothing.

A query line carries a ``query`` key instead of an event's ``type``:
``{"query": "actor", "actor_id": "a1"}`` answers that actor's state, GPU flag, reason and
checkpoint; ``{"query": "actors"}`` (optionally ``"state": "running"``) lists every actor
(in that state), ordered by id. The request and answer types
(:class:`~substrate_gpu.service.protocol.ActorQuery`, ...) live in :mod:`.protocol`, next to
the events' envelopes, and are in the generated JSON Schema.

Queries are not events: nothing is logged, no transition runs, and a refused query is not
counted in ``substrate_gpu_events_rejected_total`` (no event was rejected). A refusal is the
protocol's :class:`~substrate_gpu.service.protocol.Refusal` line (``unknown_actor`` for an
actor the agent does not know, ``schema`` for a query that is not one).
"""

from __future__ import annotations

import difflib
import re
from typing import Final

import msgspec

from substrate_gpu.lifecycle import Agent, actors, codec
from substrate_gpu.service import protocol

#: A line is a query when its object has a ``query`` key (checked before any decoding
#: work an event line would need; a line that merely mentions the word inside a string
#: and is no query is then refused by the query decoder, naming the field).
_QUERY_KEY: Final = re.compile(rb'^\s*\{(?:.*[,{]\s*)?"query"\s*:')

_DECODER: Final[codec.Decoder[protocol.Query]] = codec.Decoder(
    protocol.Query,
    what="query",
    kinds={"actor": protocol.ActorQuery, "actors": protocol.ActorsQuery},
)

QUERY_KINDS: Final = ("actor", "actors")
"""What a client may ask (the ``query`` tags)."""


def is_query(line: bytes) -> bool:
    """Whether ``line`` is a query rather than an event."""
    # The substring test first: an event line pays a memchr, not a regex.
    return b'"query"' in line and _QUERY_KEY.match(line) is not None


def may_list_actors(line: bytes) -> bool:
    """Whether the query ``line`` may ask for an actor list (an answer that grows with the
    worker); a stray mention of the word only makes its answer wait for room like one."""
    return b'"actors"' in line


def answer(agent: Agent, line: bytes, line_number: int) -> bytes:
    """The answer line to the query ``line`` (never raises on bad input)."""
    try:
        asked = _DECODER.decode(line)
    except codec.DecodeFailure as e:
        message = str(e)
        if e.field == "$.query":
            message = f"unknown query; a client may ask: {', '.join(QUERY_KINDS)} - at `$.query`"
        kind: protocol.ErrorKind = "malformed" if e.malformed else "schema"
        return protocol.refusal(protocol.RequestError(kind, message, field=e.field), line_number)
    if isinstance(asked, protocol.ActorQuery):
        view = agent.actor(asked.actor_id)
        if view is None:
            return protocol.refusal(
                protocol.RequestError(
                    "unknown_actor",
                    f"no actor {asked.actor_id!r} on this agent "
                    '(list them with {"query": "actors"})',
                    asked.actor_id,
                ),
                line_number,
            )
        return codec.encode_line(protocol.ActorAnswer(ok=True, actor=status(view)))
    state = asked.state
    if not isinstance(state, msgspec.UnsetType) and state not in agent.spec.state_names:
        return protocol.refusal(_unknown_state(state, agent.spec.state_names), line_number)
    return codec.encode_line(
        protocol.ActorsAnswer(
            ok=True,
            actors=[
                status(v)
                for v in agent.actors()
                if isinstance(state, msgspec.UnsetType) or v.state == state
            ],
        )
    )


def status(view: actors.ActorView) -> protocol.ActorStatus:
    """What a query says about the actor ``view`` shows."""
    return protocol.ActorStatus(
        actor_id=view.actor_id,
        state=view.state,
        gpu=view.gpu,
        reason=view.reason or msgspec.UNSET,
        checkpoint=view.checkpoint or msgspec.UNSET,
        containers=list(view.containers) if view.containers else msgspec.UNSET,
        identity=dict(view.identity) if view.identity else msgspec.UNSET,
    )


def _unknown_state(state: str, states: tuple[str, ...]) -> protocol.RequestError:
    close = difflib.get_close_matches(state, states, n=3, cutoff=0.6)
    hint = (
        f"did you mean {' or '.join(repr(c) for c in close)}?"
        if close
        else f"the states are: {', '.join(states)}"
    )
    return protocol.RequestError(
        "schema", f"unknown state {state!r}; {hint} - at `$.state`", field="$.state"
    )
