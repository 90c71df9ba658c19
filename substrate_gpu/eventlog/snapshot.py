"""Snapshots: every live actor's state at one seq, the base a rotated segment continues.

A snapshot file ``<log name>.snapshot-<seq>.json`` sits beside the log and is written
atomically (temp file, fsync, rename, fsync of the directory)::

    {"format":"substrate-gpu-eventlog-snapshot","v":1,"seq":S,"at":...,
     "actors":[{"actor_id":...,"state":...,...ActorView fields}],
     "causes":{"<actor_id>":{...the event that entered its in-flight state}}}

``causes`` keeps, for actors caught in an in-flight state, the event that entered it:
recovery needs it (a checkpoint's image directory is named by that event's seq).
Deleted actors are kept: the agent itself keeps them (a deleted id stays refused), and a
snapshot is exactly what a replay of the segments it replaces would have produced, so a
replay over a rotation reproduces refusals of a deleted actor's events too. A snapshot is
thus as large as the agent's actor table, never as its history.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from substrate_gpu import _atomic
from substrate_gpu.eventlog import errors, format
from substrate_gpu.lifecycle import errors as lifecycle_errors
from substrate_gpu.lifecycle import events
from substrate_gpu.lifecycle.actors import ActorView

FORMAT: Final = "substrate-gpu-eventlog-snapshot"
VERSION: Final = 1

# The annotations as written ("str | None"): actors.py postpones their evaluation.
_VIEW_FIELDS: Final[dict[str, str]] = dict(ActorView.__annotations__)
#: Fields an older snapshot may lack (they have defaults, as in older event versions).
_VIEW_OPTIONAL: Final = frozenset(
    f.name for f in msgspec.structs.fields(ActorView) if not f.required
)
_VIEW_CHECKS: Final = {
    "str": lambda x: isinstance(x, str),
    "int": lambda x: type(x) is int,
    "bool": lambda x: type(x) is bool,
    "str | None": lambda x: x is None or isinstance(x, str),
    "tuple[str, ...]": lambda x: isinstance(x, list) and all(isinstance(i, str) for i in x),
    "dict[str, str]": lambda x: isinstance(x, dict) and all(isinstance(v, str) for v in x.values()),
}


@dataclass(frozen=True)
class Snapshot:
    """Every live actor at ``seq``."""

    seq: int
    """The seq of the last event the snapshot includes."""
    actors: tuple[ActorView, ...]
    """Every actor the agent knows, deleted ones included."""
    causes: Mapping[str, events.Event]
    """For actors in an in-flight state: the event that entered it."""


def file_name(log: Path, seq: int) -> str:
    """The snapshot file name for ``log`` at ``seq``."""
    return f"{log.name}.snapshot-{seq}.json"


def encode(snapshot: Snapshot) -> bytes:
    """The snapshot file's content."""
    return json.dumps(
        {
            "format": FORMAT,
            "v": VERSION,
            "seq": snapshot.seq,
            "actors": [msgspec.structs.asdict(view) for view in snapshot.actors],
            "causes": {a: e.to_dict() for a, e in snapshot.causes.items()},
        },
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()


def write(log: Path, snapshot: Snapshot) -> Path:
    """Write ``snapshot`` beside ``log`` atomically; its path."""
    path = log.with_name(file_name(log, snapshot.seq))
    _atomic.write_atomically(path, encode(snapshot), default_mode=0o600)
    return path


def build(seq: int, views: Iterable[ActorView], causes: Mapping[str, events.Event]) -> Snapshot:
    """A snapshot of ``views`` at ``seq``."""
    kept = tuple(views)
    ids = {v.actor_id for v in kept}
    return Snapshot(seq=seq, actors=kept, causes={a: e for a, e in causes.items() if a in ids})


def read(path: Path, *, seq: int) -> Snapshot:
    """Read and check the snapshot at ``path``, which must be the one taken at ``seq``."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError as e:
        raise errors.CorruptLogError(
            path, 0, "the snapshot the log's header names is missing"
        ) from e
    except OSError as e:
        raise errors.EventLogError(f"cannot read snapshot {path}: {e.strerror or e}") from e
    except ValueError as e:
        raise errors.CorruptLogError(path, 0, f"snapshot is not valid JSON: {e}") from e
    try:
        return _parse(data, seq)
    except (ValueError, TypeError, lifecycle_errors.EventSchemaError) as e:
        raise errors.CorruptLogError(path, 0, str(e)) from e


def _parse(data: object, seq: int) -> Snapshot:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} file")
    if data.get("v") != VERSION:
        raise ValueError(
            f"snapshot format version {data.get('v')!r}; this agent reads version {VERSION}"
        )
    if data.get("seq") != seq:
        raise ValueError(f"snapshot is at seq {data.get('seq')!r}, the log expects {seq}")
    raw_actors, raw_causes = data.get("actors"), data.get("causes")
    if not isinstance(raw_actors, list) or not isinstance(raw_causes, dict):
        raise TypeError("snapshot actors must be a list and causes a mapping")
    views = []
    for i, raw in enumerate(raw_actors):
        if not isinstance(raw, dict) or not (
            set(_VIEW_FIELDS) - _VIEW_OPTIONAL <= set(raw) <= set(_VIEW_FIELDS)
        ):
            raise ValueError(f"snapshot actors[{i}] must have the fields {sorted(_VIEW_FIELDS)}")
        for name, kind in _VIEW_FIELDS.items():
            if name in raw and not _VIEW_CHECKS[kind](raw[name]):
                raise ValueError(f"snapshot actors[{i}].{name} must be {kind}, got {raw[name]!r}")
        fields = dict(raw)
        if "containers" in fields:
            fields["containers"] = tuple(fields["containers"])  # a JSON list
        views.append(ActorView(**fields))
    causes = {str(a): format.decode_event(e) for a, e in raw_causes.items()}
    return Snapshot(seq=seq, actors=tuple(views), causes=causes)
