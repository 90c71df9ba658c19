"""Replay: rebuild every actor's state from a log, running no effect.

Each logged event goes through the machine exactly as the agent applied it: the same
:class:`~substrate_gpu.lifecycle.actors.ActorTable` and ``machines/actor.yaml``, evaluated
by the dict-table engine (the transitions engine is cross-checked against it by the
lifecycle's property tests and is three times slower). Outcome events are *read* from the
log, never produced, so nothing talks to runsc, the probe or the injector. Deterministic:
the same log gives the same states and the same transition sequence.

A rejection record is replayed as a check: the machine must refuse the event again, in the
same state. An accepted event the machine now refuses, or a rejection it now accepts, means
the log was written by another machine definition: :class:`ReplayDivergence` names the line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

from substrate_gpu.eventlog import errors, format, reader, snapshot
from substrate_gpu.lifecycle import actors, events, hooks, machine
from substrate_gpu.lifecycle import errors as lifecycle_errors


class TransitionList(Sequence[hooks.Transition]):
    """Replayed transitions, kept compact and built as :class:`Transition` when read.

    A million frozen ``Transition`` objects cost more to build than replaying the events
    that produce them; most callers read a few (one actor's timeline) or none (recovery).
    Compares equal to any sequence of the same transitions (a list included).
    """

    __slots__ = ("_rows",)

    def __init__(self) -> None:
        self._rows: list[tuple[events.Event, str, str, str | None]] = []

    @staticmethod
    def _build(row: tuple[events.Event, str, str, str | None]) -> hooks.Transition:
        event, source, dest, reason = row
        kind = event.type
        return hooks.Transition(event.actor_id, source, dest, kind, kind, event.at, reason)

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> hooks.Transition: ...

    @overload
    def __getitem__(self, index: slice) -> list[hooks.Transition]: ...

    def __getitem__(self, index: int | slice) -> hooks.Transition | list[hooks.Transition]:
        if isinstance(index, slice):
            return [self._build(row) for row in self._rows[index]]
        return self._build(self._rows[index])

    def __iter__(self) -> Iterator[hooks.Transition]:
        return map(self._build, self._rows)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TransitionList({len(self)} transitions)"


@dataclass
class ReplayResult:
    """What replaying a log rebuilt."""

    path: Path
    """The log replayed."""
    actors: dict[str, actors.ActorView]
    """Every actor's final state (only ``actor``'s when replay was filtered)."""
    transitions: Sequence[hooks.Transition]
    """Every transition, in log order (since the snapshot, for a rotated log)."""
    events_replayed: int
    """Accepted events fed through the machine."""
    last_seq: int
    """The seq of the log's last event (of the snapshot's, when no event follows it)."""
    rejections: list[format.Rejection] = field(default_factory=list)
    """Refusals reproduced, in log order."""
    causes: dict[str, events.Event] = field(default_factory=dict)
    """For actors in an in-flight state: the logged event that entered it."""
    torn_tail: reader.TornTail | None = None
    """The torn last line dropped, if any."""
    snapshot_seq: int = 0
    """The seq of the snapshot replay started from (0: from the beginning)."""


_Candidate = tuple[
    tuple[Callable[[actors.Cursor], bool], ...],
    tuple[Callable[[actors.Cursor], bool], ...],
    str | None,
    tuple[Callable[[actors.Cursor], None], ...],
]


class BoundTableEngine:
    """:class:`~substrate_gpu.lifecycle.machine.TableEngine` with its names bound once.

    The same dispatch (the spec's transitions of a ``(state, trigger)``, tried in order; the
    first whose conditions hold and whose ``unless`` do not fires its callbacks), calling
    the :class:`Cursor`'s condition and callback functions directly instead of looking each
    name up per event: the lookups were most of a replayed event's cost. The live agent's
    engines are checked against replay by the property tests (tests/eventlog).
    """

    def __init__(self, spec: machine.MachineSpec) -> None:
        cursor = actors.Cursor
        self._table: dict[tuple[str, str], tuple[_Candidate, ...]] = {
            (source, trigger): tuple(
                (
                    tuple(getattr(cursor, name) for name in t.conditions),
                    tuple(getattr(cursor, name) for name in t.unless),
                    t.dest,
                    tuple(getattr(cursor, name) for name in t.after),
                )
                for t in spec.candidates(source, trigger)
            )
            for source in spec.state_names
            for trigger in spec.accepts[source]
        }

    def fire(self, cursor: actors.Cursor, trigger: str) -> bool:
        """Fire ``trigger`` on ``cursor``; False when no transition's conditions held."""
        for conditions, unless, dest, after in self._table[(cursor.state, trigger)]:
            held = True
            for condition in conditions:
                if not condition(cursor):
                    held = False
                    break
            if held:
                for condition in unless:
                    if condition(cursor):
                        held = False
                        break
            if held:
                if dest is not None:
                    cursor.state = dest
                for callback in after:
                    callback(cursor)
                return True
        return False


class Replayer:
    """Feeds records through the agent's machine: its engine and its :class:`Cursor`.

    The live :class:`~substrate_gpu.lifecycle.actors.ActorTable` copies each actor into one
    shared cursor and back around every event, so that a *refused* event leaves the actor
    untouched. Replay applies events that were accepted (a refusal is a divergence that
    stops it), so each actor simply lives in its own cursor: the same conditions and
    callbacks, fired by the same engine on the same spec, without the two copies (40% of
    the per-event cost). Views are produced through :class:`Actor` as the agent does.
    """

    def __init__(self, spec: machine.MachineSpec | None = None) -> None:
        self.spec = spec or machine.load_spec()
        self.causes: dict[str, events.Event] = {}
        """For actors in an in-flight state: the event that entered it."""
        self.last_seq = 0
        self._engine = BoundTableEngine(self.spec)
        self._initial = self.spec.initial
        self._accepts = self.spec.accepts
        self._effects = self.spec.effects
        self._cursors: dict[str, actors.Cursor] = {}

    def load_views(self, views: Iterable[actors.ActorView], last_seq: int) -> None:
        """Start from these actors (a snapshot, or recovered views)."""
        for view in views:
            if view.state not in self._accepts:
                raise ValueError(f"actor {view.actor_id!r}: unknown state {view.state!r}")
            cursor = actors.Cursor(self._initial)
            for name in actors.Actor.__slots__:
                setattr(cursor, name, getattr(view, name))
            self._cursors[view.actor_id] = cursor
        self.last_seq = max(self.last_seq, last_seq)

    def load(self, base: snapshot.Snapshot, *, actor: str | None = None) -> None:
        """Start from ``base`` (only ``actor`` when given)."""
        self.load_views([v for v in base.actors if actor is None or v.actor_id == actor], base.seq)
        self.causes.update({a: e for a, e in base.causes.items() if actor is None or a == actor})

    def apply(self, event: events.Event) -> tuple[str, str, str | None]:
        """Apply one accepted event: ``(source, dest, reason)``; InvalidEvent if refused."""
        actor_id = event.actor_id
        cursor = self._cursors.get(actor_id)
        source = cursor.state if cursor is not None else self._initial
        trigger = event.type
        if trigger not in self._accepts[source]:
            raise lifecycle_errors.InvalidEvent(
                actor_id, source, trigger, "not accepted in this state"
            )
        if cursor is None:
            fresh = actors.Cursor(self._initial)
            fresh.load(None, self._initial, event)
            if not self._engine.fire(fresh, trigger):
                raise lifecycle_errors.InvalidEvent(
                    actor_id, source, trigger, self.spec.guard_summary(source, trigger)
                )
            self._cursors[actor_id] = cursor = fresh
        else:
            cursor.event = event
            cursor.refusal = None
            cursor.transition_reason = None
            if not self._engine.fire(cursor, trigger):
                raise lifecycle_errors.InvalidEvent(
                    actor_id, source, trigger, self.spec.guard_summary(source, trigger)
                )
        dest = cursor.state
        if dest != source and dest in self._effects:
            self.causes[actor_id] = event
        elif dest not in self._effects:
            self.causes.pop(actor_id, None)
        self.last_seq = max(self.last_seq, event.seq)
        return source, dest, cursor.transition_reason

    def feed(
        self,
        path: Path,
        records: Iterable[tuple[int, format.Record]],
        transitions: TransitionList | None,
        rejections: list[format.Rejection] | None,
    ) -> int:
        """Apply ``(line, record)`` pairs in order; the number of events applied.

        :meth:`apply`, inlined: this loop is the replay's hot path.
        """
        cursors = self._cursors
        accepts = self._accepts
        effects = self._effects
        causes = self.causes
        fire = self._engine.fire
        initial = self._initial
        rows = transitions._rows if transitions is not None else None
        event_type = events.Event
        count = 0
        last_seq = self.last_seq
        for line, record in records:
            if not isinstance(record, event_type):
                self._check_rejection(path, line, record)
                if rejections is not None:
                    rejections.append(record)
                continue
            actor_id = record.actor_id
            cursor = cursors.get(actor_id)
            trigger = record.type
            if cursor is None:
                source = initial
                cursor = actors.Cursor(initial)
                cursor.load(None, initial, record)
                fired = trigger in accepts[source] and fire(cursor, trigger)
                if fired:
                    cursors[actor_id] = cursor
            else:
                source = cursor.state
                cursor.event = record
                cursor.refusal = None
                cursor.transition_reason = None
                fired = trigger in accepts[source] and fire(cursor, trigger)
            if not fired:
                problem = (
                    self.spec.guard_summary(source, trigger)
                    if trigger in accepts[source]
                    else "not accepted in this state"
                )
                raise errors.ReplayDivergence(
                    path,
                    line,
                    "the logged event was accepted, the machine now refuses it: "
                    f"{lifecycle_errors.InvalidEvent(actor_id, source, trigger, problem)}",
                )
            count += 1
            dest = cursor.state
            if dest in effects:
                if dest != source:
                    causes[actor_id] = record
            elif actor_id in causes:
                del causes[actor_id]
            last_seq = record.seq
            if rows is not None:
                rows.append((record, source, dest, cursor.transition_reason))
        self.last_seq = max(self.last_seq, last_seq)
        return count

    def _check_rejection(self, path: Path, line: int, rejection: format.Rejection) -> None:
        event = rejection.event
        cursor = self._cursors.get(event.actor_id)
        state = cursor.state if cursor is not None else self._initial
        accepted = event.type in self._accepts[state]
        if accepted:
            # Try it on a scratch copy: the actor itself must not change.
            scratch = actors.Cursor(self._initial)
            if cursor is None:
                scratch.load(None, self._initial, event)
            else:
                for name in actors.Actor.__slots__:
                    setattr(scratch, name, getattr(cursor, name))
                scratch.event = event
            accepted = self._engine.fire(scratch, event.type)
        if accepted:
            raise errors.ReplayDivergence(
                path,
                line,
                f"the event {event.type!r} was refused ({rejection.problem}); the machine now "
                f"accepts it in state {state!r}",
            )
        if state != rejection.state:
            raise errors.ReplayDivergence(
                path,
                line,
                f"the event {event.type!r} was refused in state {rejection.state!r}; on "
                f"replay the actor is in state {state!r}",
            )

    def views(self) -> dict[str, actors.ActorView]:
        """Every actor's current state (built through :class:`Actor`, as the agent does)."""
        out = {}
        for actor_id, cursor in self._cursors.items():
            record = actors.Actor(actor_id, cursor.state)
            cursor.store(record)
            out[actor_id] = record.snapshot()
        return out

    def __len__(self) -> int:
        return len(self._cursors)


def replay(
    path: Path,
    *,
    actor: str | None = None,
    machine_spec: machine.MachineSpec | None = None,
    keep_transitions: bool = True,
) -> ReplayResult:
    """Read and replay the log at ``path`` (only ``actor``'s events when given)."""
    return replay_contents(
        reader.read_log(path),
        actor=actor,
        machine_spec=machine_spec,
        keep_transitions=keep_transitions,
    )


def replay_contents(
    contents: reader.LogContents,
    *,
    actor: str | None = None,
    machine_spec: machine.MachineSpec | None = None,
    keep_transitions: bool = True,
) -> ReplayResult:
    """Replay an already read log."""
    replayer = Replayer(machine_spec)
    if contents.snapshot is not None:
        replayer.load(contents.snapshot, actor=actor)
    transitions = TransitionList() if keep_transitions else None
    rejections: list[format.Rejection] = []
    numbered = enumerate(contents.records, start=2)
    if actor is not None:
        numbered = ((n, r) for n, r in numbered if r.actor_id == actor)  # type: ignore[assignment]
    with reader.gc_paused():
        count = replayer.feed(contents.path, numbered, transitions, rejections)
    return ReplayResult(
        path=contents.path,
        actors=replayer.views(),
        transitions=transitions if transitions is not None else TransitionList(),
        events_replayed=count,
        last_seq=contents.last_seq,
        rejections=rejections,
        causes=dict(replayer.causes),
        torn_tail=contents.torn_tail,
        snapshot_seq=contents.header.base_seq,
    )
