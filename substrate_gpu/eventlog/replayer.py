"""Replay: rebuild every actor's state from a log, running no effect.

Each logged event goes through the machine exactly as the agent applied it: the same
:class:`~substrate_gpu.lifecycle.table.ActorTable`, ``machines/actor.yaml`` and its one
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
from substrate_gpu.lifecycle import actors, events, hooks, machine, table
from substrate_gpu.lifecycle import errors as lifecycle_errors


class TransitionList(Sequence[hooks.Transition]):
    """Replayed transitions, kept as the :class:`~substrate_gpu.lifecycle.table.Trail` the
    machine left and built as :class:`Transition` when read.

    A million frozen ``Transition`` objects (or a million tuples) cost more to build than
    replaying the events that produce them; most callers read a few (one actor's timeline)
    or none (recovery). A step's state after is the actor's next step's state before, or
    the actor's final state: worked out once, on the first read. Compares equal to any
    sequence of the same transitions (a list included).
    """

    __slots__ = ("_dests", "_final", "trail")

    def __init__(self) -> None:
        self.trail = table.Trail()
        """The steps, as replay records them."""
        self._final: dict[str, str] = {}
        self._dests: list[str] | None = None

    def seal(self, final: dict[str, str]) -> None:
        """The actors' states after the last step (replay calls this when it is done)."""
        self._final = final
        self._dests = None

    def _dest_list(self) -> list[str]:
        dests = self._dests
        if dests is None:
            after = dict(self._final)
            trail = self.trail
            dests = [""] * len(trail.sources)
            for i in range(len(dests) - 1, -1, -1):
                actor_id = trail.events[i].actor_id
                dests[i] = after[actor_id]
                after[actor_id] = trail.sources[i]
            self._dests = dests
        return dests

    def _build(self, index: int) -> hooks.Transition:
        trail = self.trail
        event = trail.events[index]
        kind = event.type
        return hooks.Transition(
            event.actor_id,
            trail.sources[index],
            self._dest_list()[index],
            kind,
            kind,
            event.at,
            trail.reasons.get(index),
        )

    def __len__(self) -> int:
        return len(self.trail.sources)

    @overload
    def __getitem__(self, index: int) -> hooks.Transition: ...

    @overload
    def __getitem__(self, index: slice) -> list[hooks.Transition]: ...

    def __getitem__(self, index: int | slice) -> hooks.Transition | list[hooks.Transition]:
        if isinstance(index, slice):
            return [self._build(i) for i in range(len(self))[index]]
        return self._build(range(len(self))[index])

    def __iter__(self) -> Iterator[hooks.Transition]:
        return map(self._build, range(len(self)))

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
        self.table = table.ActorTable(self.spec)
        """The actors, as the agent holds them."""
        self._effects = self.spec.effects

    @property
    def causes(self) -> dict[str, events.Event]:
        """For actors in an in-flight state: the event that entered it."""
        effects = self._effects
        return {
            actor.actor_id: actor.entered_by
            for actor in self.table
            if actor.state in effects and actor.entered_by is not None
        }

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
        for actor_id, cause in base.causes.items():
            loaded = self.table.get(actor_id)
            if loaded is not None:
                loaded.entered_by = cause

    def apply(self, event: events.Event) -> tuple[str, str, str | None]:
        """Apply one accepted event: ``(source, dest, reason)``; InvalidEvent if refused."""
        step = self.table.apply(event)
        if step.dest != step.source:
            self.table.get(event.actor_id).entered_by = step.event  # type: ignore[union-attr]
        return step.source, step.dest, step.reason

    def feed(
        self,
        path: Path,
        records: Sequence[format.Record],
        transitions: TransitionList | None = None,
        rejections: list[format.Rejection] | None = None,
        *,
        lines: Sequence[int] | None = None,
    ) -> int:
        """Apply the logged ``records`` in order (``records[i]`` is on line ``lines[i]``,
        by default ``i + 2``); the number of events applied.

        The hot path of replay: :meth:`ActorTable.apply_logged`, which records the steps
        in ``transitions`` (when given) and what entered each state; a rejection is checked
        against the state at its point in the log."""

        refused = 0

        def check(rejection: format.Rejection) -> None:
            nonlocal refused
            refused += 1
            divergence = self._divergence(rejection)
            if divergence is not None:
                raise errors.ReplayDivergence(path, _line_of(rejection, records, lines), divergence)
            if rejections is not None:
                rejections.append(rejection)

        try:
            self.table.apply_logged(
                records,
                transitions.trail if transitions is not None else None,
                other=format.Rejection,
                on_other=check,
            )
        except lifecycle_errors.LoggedEventRefused as e:
            raise errors.ReplayDivergence(
                path,
                _line_of(e.record, records, lines),
                f"the logged event was accepted, the machine now refuses it: {e}",
            ) from e
        if transitions is not None:
            transitions.seal({actor.actor_id: actor.state for actor in self.table})
        return len(records) - refused

    def _divergence(self, rejection: format.Rejection) -> str | None:
        """How the machine now disagrees with a logged refusal, or None: it refuses again,
        in the same state."""
        event = rejection.event
        state = self.table.state_of(event.actor_id)
        try:
            self.table.check(event)
        except lifecycle_errors.InvalidEvent:
            pass
        else:
            return (
                f"the event {event.type!r} was refused ({rejection.problem}); the machine now "
                f"accepts it in state {state!r}"
            )
        if state != rejection.state:
            return (
                f"the event {event.type!r} was refused in state {rejection.state!r}; on "
                f"replay the actor is in state {state!r}"
            )
        return None

    def views(self) -> dict[str, actors.ActorView]:
        """Every actor's current state."""
        return {actor.actor_id: actor.snapshot() for actor in self.table}

    def __len__(self) -> int:
        return len(self.table)


def _line_of(record: object, records: Sequence[object], lines: Sequence[int] | None) -> int:
    """The line of ``record`` (found by identity: only when naming a line in an error)."""
    index = next(i for i, r in enumerate(records) if r is record)
    return lines[index] if lines is not None else index + 2


def replay(
    path: Path,
    *,
    actor: str | None = None,
    machine_spec: machine.MachineSpec | None = None,
    keep_transitions: bool = True,
) -> ReplayResult:
    """Read and replay the log at ``path`` (only ``actor``'s events when given).

    The cyclic GC stays paused throughout: each collection it would start between the
    steps traverses the million-record lists just built, a cost replay need not pay
    (tests/bench/README.md, "Figures behind design choices")."""
    with reader.gc_paused():
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
    records: Sequence[format.Record] = contents.records
    lines = None
    if actor is not None:
        mine = [(n, r) for n, r in enumerate(records, start=2) if r.actor_id == actor]
        lines, records = [n for n, _ in mine], [r for _, r in mine]
    with reader.gc_paused():
        count = replayer.feed(contents.path, records, transitions, rejections, lines=lines)
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
