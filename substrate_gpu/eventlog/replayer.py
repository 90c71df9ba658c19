"""Replay: rebuild every actor's state from a log, running no effect.

Each logged event goes through the machine exactly as the agent applied it: the same
:class:`~substrate_gpu.lifecycle.actors.ActorTable`, ``machines/actor.yaml`` and its one
:class:`~substrate_gpu.lifecycle.machine.Interpreter`. Outcome events are *read* from the
log, never produced, so nothing talks to runsc, the probe or the injector. Deterministic:
the same log gives the same states and the same transition sequence.

A rejection record is replayed as a check: the machine must refuse the event again, in the
same state. An accepted event the machine now refuses, or a rejection it now accepts, means
the log was written by another machine definition: :class:`ReplayDivergence` names the line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
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


class Replayer:
    """Feeds records through the agent's machine: the same :class:`ActorTable` and
    interpreter (``spec.interpreter``) the live agent applies events with."""

    def __init__(self, spec: machine.MachineSpec | None = None) -> None:
        self.spec = spec or machine.load_spec()
        self.causes: dict[str, events.Event] = {}
        """For actors in an in-flight state: the event that entered it."""
        self.table = actors.ActorTable(self.spec)
        """The actors, as the agent holds them."""
        self._effects = self.spec.effects

    @property
    def last_seq(self) -> int:
        """The seq of the last event applied (or of the state loaded)."""
        return self.table.last_seq

    def load_views(self, views: Iterable[actors.ActorView], last_seq: int) -> None:
        """Start from these actors (a snapshot, or recovered views)."""
        self.table.resume(views, last_seq)

    def load(self, base: snapshot.Snapshot, *, actor: str | None = None) -> None:
        """Start from ``base`` (only ``actor`` when given)."""
        self.load_views([v for v in base.actors if actor is None or v.actor_id == actor], base.seq)
        self.causes.update({a: e for a, e in base.causes.items() if actor is None or a == actor})

    def apply(self, event: events.Event) -> tuple[str, str, str | None]:
        """Apply one accepted event: ``(source, dest, reason)``; InvalidEvent if refused."""
        step = self.table.apply(event)
        self._note_cause(step)
        return step.source, step.dest, step.reason

    def _note_cause(self, step: actors.Step) -> None:
        if step.effect is not None:
            self.causes[step.event.actor_id] = step.event
        elif step.dest not in self._effects:
            self.causes.pop(step.event.actor_id, None)

    def feed(
        self,
        path: Path,
        records: Iterable[tuple[int, format.Record]],
        transitions: TransitionList | None,
        rejections: list[format.Rejection] | None,
    ) -> int:
        """Apply ``(line, record)`` pairs in order; the number of events applied.

        The hot path of replay: :meth:`ActorTable.advance` per event (no :class:`Step`),
        the record's class compared by identity, the cause noted inline."""
        advance = self.table.advance
        causes = self.causes
        forget_cause = causes.pop
        effects = self._effects
        rows = transitions._rows if transitions is not None else None
        append = rows.append if rows is not None else None
        rejection = format.Rejection
        count = 0
        for line, record in records:
            if type(record) is rejection:
                self._check_rejection(path, line, record)
                if rejections is not None:
                    rejections.append(record)
                continue
            try:
                actor, source = advance(record)  # type: ignore[arg-type]
            except lifecycle_errors.InvalidEvent as e:
                raise errors.ReplayDivergence(
                    path,
                    line,
                    f"the logged event was accepted, the machine now refuses it: {e}",
                ) from e
            count += 1
            dest = actor.state
            # What _note_cause does for a Step: an entered in-flight state keeps its cause.
            if dest in effects:
                if dest != source:
                    causes[record.actor_id] = record  # type: ignore[assignment]
            else:
                forget_cause(record.actor_id, None)
            if append is not None:
                append((record, source, dest, actor.transition_reason))  # type: ignore[arg-type]
        return count

    def _check_rejection(self, path: Path, line: int, rejection: format.Rejection) -> None:
        event = rejection.event
        state = self.table.state_of(event.actor_id)
        try:
            self.table.check(event)
        except lifecycle_errors.InvalidEvent:
            pass
        else:
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
        """Every actor's current state."""
        return {actor.actor_id: actor.snapshot() for actor in self.table}

    def __len__(self) -> int:
        return len(self.table)


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
