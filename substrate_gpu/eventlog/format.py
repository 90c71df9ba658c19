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
  ``seq``; each event type carries its own schema version ``v`` (a ``Literal`` field the
  decoder checks). ``seq`` strictly increases.
- A **rejection** line records an event the machine refused (unstamped, ``seq`` 0), the
  state it was refused in and why, so a replay reproduces the refusal.

Every line ends with ``\\n``; a last line without one was torn by a crash (it never reached
its fsync, so it was never acknowledged) and is dropped, never parsed.

Records are msgspec Structs decoded by :mod:`substrate_gpu.lifecycle.codec` (one strict
decoder for every path): :data:`RECORD` reads a chunk of lines in one call on the replay
hot path, or one line (the reader's fallback, which names the bad line).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Final, Literal

import msgspec

from substrate_gpu.lifecycle import codec, events

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
        return codec.encode(
            {"format": FORMAT, "v": self.v, "base_seq": self.base_seq, "snapshot": self.snapshot}
        ).decode()


class Rejection(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    tag="rejected",
    tag_field="type",
    gc=False,
    forbid_unknown_fields=True,
):
    """An event the machine refused, as recorded in the log."""

    v: Literal[1] = 1
    """The rejection record's version."""
    event: events.AnyEvent
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
        return codec.encode(self).decode()


Record = events.Event | Rejection
"""One line after the header: an accepted event or a rejection."""


def decode_header(line: bytes) -> Header:
    """The header a first line holds; ``ValueError`` saying what is wrong."""
    try:
        data = msgspec.json.decode(line)
    except (msgspec.MsgspecError, RecursionError) as e:
        raise ValueError(f"the first line is not valid JSON: {e}") from None
    return parse_header(data)


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


# --- decoding ------------------------------------------------------------------------------

if typing.TYPE_CHECKING:
    AnyRecord: typing.TypeAlias = Record
else:
    AnyRecord = events.union_of([*events.REGISTRY.values(), Rejection])
    """The tagged union of a line after the header (``rejected`` or an event type)."""

RECORD: Final[codec.Decoder[Record]] = codec.Decoder(
    AnyRecord, what="record", kinds={**events.REGISTRY, REJECTED: Rejection}
)
"""Record lines: one (:meth:`~codec.Decoder.decode`) or a chunk of them at once
(:meth:`~codec.Decoder.decode_lines`, the replay's hot path)."""


def decode_event(data: object) -> events.Event:
    """The event of a parsed JSON object (a snapshot's cause); :class:`EventSchemaError`."""
    return events.DECODER.convert(data)
