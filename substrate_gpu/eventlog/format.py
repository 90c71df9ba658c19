"""The on-disk format of the event log: one JSON object per line, versioned.

A segment (the log file itself, e.g. ``events.jsonl``) is::

    {"format":"substrate-gpu-eventlog","v":1,"base_seq":0,"snapshot":null}   <- header
    {"type":"actor_registered","v":1,"actor_id":"a1","seq":1,"at":...,...}    <- an event
    {"type":"rejected","v":1,"event":{...},"state":"running","problem":"..."} <- a refusal

- The **header** names the format and its version ``v`` (of the *container*: how lines are
  framed and what record kinds exist). A reader refuses another format or a newer ``v``
  instead of guessing. ``base_seq``/``snapshot`` say which snapshot the segment continues
  (0/null: from the beginning); see :mod:`substrate_gpu.eventlog.snapshot`.
- An **event** line is exactly :meth:`Event.to_json` of an accepted event, stamped with its
  ``seq``; each event type carries its own schema version ``v`` (checked by
  :func:`substrate_gpu.lifecycle.events.from_dict`). ``seq`` strictly increases.
- A **rejection** line records an event the machine refused (unstamped, ``seq`` 0), the
  state it was refused in and why, so a replay reproduces the refusal.

Every line ends with ``\\n``; a last line without one was torn by a crash (it never reached
its fsync, so it was never acknowledged) and is dropped, never parsed.

Decoding is on the replay hot path (a million events per replay in the benchmark), so
:func:`decode_event` has a fast path per event type: when the line has exactly the fields
:meth:`Event.to_dict` writes, with the right JSON types, the event is built without the
generic validator. Anything else goes through :func:`events.from_dict`, which either builds
it or raises the precise :class:`EventSchemaError`; the two agree on what they accept.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from substrate_gpu.lifecycle import errors as lifecycle_errors
from substrate_gpu.lifecycle import events

FORMAT: Final = "substrate-gpu-eventlog"
"""The header's ``format`` value."""
VERSION: Final = 1
"""The container format version this code writes and reads."""
REJECTED: Final = "rejected"
"""The ``type`` of a rejection line (never an event type)."""
REJECTED_VERSION: Final = 1


@dataclass(frozen=True)
class Header:
    """The first line of a segment."""

    v: int
    """The container format version."""
    base_seq: int = 0
    """The segment continues the snapshot taken at this seq (0: from the beginning)."""
    snapshot: str | None = None
    """The snapshot file's name, in the log's directory (None when ``base_seq`` is 0)."""

    def to_json(self) -> str:
        """The header line (no newline)."""
        return json.dumps(
            {"format": FORMAT, "v": self.v, "base_seq": self.base_seq, "snapshot": self.snapshot},
            separators=(",", ":"),
        )


@dataclass(frozen=True)
class Rejection:
    """An event the machine refused, as recorded in the log."""

    event: events.Event
    """The refused event (unstamped: ``seq`` 0)."""
    state: str
    """The actor's state when it was refused."""
    problem: str
    """Why (the :class:`InvalidEvent`'s problem)."""

    @property
    def actor_id(self) -> str:
        """The actor the refused event was for."""
        return self.event.actor_id

    def to_json(self) -> str:
        """The rejection line (no newline)."""
        return json.dumps(
            {
                "type": REJECTED,
                "v": REJECTED_VERSION,
                "event": self.event.to_dict(),
                "state": self.state,
                "problem": self.problem,
            },
            separators=(",", ":"),
            ensure_ascii=False,
        )


Record = events.Event | Rejection
"""One line after the header: an accepted event or a rejection."""


def parse_header(data: object) -> Header:
    """Check a decoded header line; ``ValueError`` saying what is wrong."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(
            f"the first line is not a {FORMAT} header (is this an event log?): {data!r:.200}"
        )
    version = data.get("v")
    if version != VERSION:
        raise ValueError(
            f"event log format version {version!r}; this agent reads version {VERSION} "
            "(upgrade the agent to read newer logs)"
        )
    base_seq = data.get("base_seq", 0)
    snapshot = data.get("snapshot")
    if type(base_seq) is not int or base_seq < 0:
        raise ValueError(f"header base_seq must be a non-negative integer, got {base_seq!r}")
    if snapshot is not None and not isinstance(snapshot, str):
        raise ValueError(f"header snapshot must be a file name or null, got {snapshot!r}")
    if (base_seq == 0) != (snapshot is None):
        raise ValueError("header base_seq and snapshot must be set together")
    if snapshot is not None and ("/" in snapshot or snapshot in {".", ".."}):
        raise ValueError(f"header snapshot must be a bare file name, got {snapshot!r}")
    return Header(v=VERSION, base_seq=base_seq, snapshot=snapshot)


# --- fast event decoding -----------------------------------------------------------------------

_CHECK_TEMPLATES: dict[str, str] = {
    "str": "    if type({v}) is not str: return None\n",
    "int": "    if type({v}) is not int: return None\n",
    "bool": "    if type({v}) is not bool: return None\n",
    "float": (
        "    if type({v}) is not float:\n"
        "        if type({v}) is not int: return None\n"
        "        {v} = float({v})\n"
    ),
    "str | None": "    if {v} is not None and type({v}) is not str: return None\n",
}


def _compile_decoder(cls: type[events.Event]) -> Callable[[dict[str, Any]], events.Event | None]:
    """A decoder for one event type, generated the way dataclasses generates ``__init__``.

    It returns None (take the slow path) unless the mapping has exactly the keys
    ``to_dict`` writes, the type's version, and values of exactly the annotated JSON types.
    """
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    lines = [
        "def decode(d):\n",
        "    if d.keys() != KEYS or d['v'] != VERSION: return None\n",
    ]
    for i, f in enumerate(fields):
        lines.append(f"    v{i} = d[{f.name!r}]\n")
        lines.append(_CHECK_TEMPLATES[str(f.type)].format(v=f"v{i}"))
    values = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names))
    lines.append("    e = NEW(CLS)\n")
    # A frozen dataclass: its fields live in the instance __dict__, as __init__ leaves them.
    lines.append(f"    SET(e, '__dict__', {{{values}}})\n")
    if hasattr(cls, "__post_init__"):
        # The class's own validation runs exactly as its generated __init__ would run it.
        lines.append("    e.__post_init__()\n")
    lines.append("    return e\n")
    namespace: dict[str, Any] = {
        "KEYS": frozenset({"type", "v", *names}),
        "VERSION": cls.v,
        "NEW": object.__new__,
        "SET": object.__setattr__,
        "CLS": cls,
    }
    exec("".join(lines), namespace)  # noqa: S102 (code built above from dataclass fields only)
    decode: Callable[[dict[str, Any]], events.Event | None] = namespace["decode"]
    return decode


_DECODERS: dict[str, Callable[[dict[str, Any]], events.Event | None]] = {
    name: _compile_decoder(cls) for name, cls in events.REGISTRY.items()
}


def fast_decoders() -> dict[str, Callable[[dict[str, Any]], events.Event | None]]:
    """Event type -> its fast decoder (None from a decoder: take :func:`decode_record`)."""
    return _DECODERS


def _fast(data: dict[str, Any]) -> events.Event | None:
    """The event when ``data`` is exactly what ``to_dict`` writes; None to take the slow path."""
    decoder = _DECODERS.get(data.get("type"))  # type: ignore[arg-type]
    return None if decoder is None else decoder(data)


def decode_event(data: object) -> events.Event:
    """The event of a decoded event line; :class:`EventSchemaError` when invalid."""
    if isinstance(data, dict):
        event = _fast(data)
        if event is not None:
            return event
        return events.from_dict(data)
    raise lifecycle_errors.EventSchemaError(
        f"an event line must be a JSON object, got {type(data).__name__}"
    )


def decode_record(data: object) -> Record:
    """An event or a rejection from a decoded line; ``EventSchemaError``/``ValueError``."""
    if isinstance(data, dict) and data.get("type") == REJECTED:
        if data.get("v") != REJECTED_VERSION:
            raise ValueError(
                f"rejection record version {data.get('v')!r}; this agent reads version "
                f"{REJECTED_VERSION}"
            )
        state, problem = data.get("state"), data.get("problem")
        if set(data) != {"type", "v", "event", "state", "problem"}:
            raise ValueError(f"rejection record has fields {sorted(data)}")
        if not isinstance(state, str) or not isinstance(problem, str):
            raise ValueError("rejection record state and problem must be strings")
        return Rejection(event=decode_event(data["event"]), state=state, problem=problem)
    return decode_event(data)
