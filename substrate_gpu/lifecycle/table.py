"""The actor table: the synchronous core that moves actor records through the machine.

Why no transitions model per actor: ``Machine.add_model`` checks membership with a list
scan (registering 100k actors is quadratic) and binds a trigger partial per event type onto
every model (kilobytes per actor). Instead, each actor is a small ``__slots__``
:class:`~substrate_gpu.lifecycle.actors.Actor` record, and ONE interpreter
(:class:`~substrate_gpu.lifecycle.machine.Interpreter`, compiled from
``machines/actor.yaml``) evaluates every transition on it through :class:`ActorTable`:

1. the conditions of the ``(state, trigger)``'s transitions are evaluated, in YAML order;
   they only read the actor and the event, so a refused event changes nothing;
2. the first transition whose conditions hold moves the state and runs its callbacks; the
   actor's fields are saved first and put back if a callback raises (a bug), so an event
   is applied entirely or not at all.

The live pipeline, replay and recovery all go through :class:`ActorTable` and that one
interpreter. Processing is synchronous (no await between check and commit). Per-state
counts are kept incrementally on commit: ``state_counts()`` is O(states).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from substrate_gpu.lifecycle import errors, events
from substrate_gpu.lifecycle.actors import Actor, ActorView, read_fields, restore_fields

Move = Callable[[Actor, events.Event], bool]
"""One ``(state, trigger)`` entry of an engine: tries that trigger's transitions from that
state, runs the first whose conditions hold (True), or leaves the actor untouched (False).
A raising callback (a bug) may leave part of its changes: :meth:`ActorTable.advance` puts
the actor back, so a live event is applied entirely or not at all."""


class Engine(Protocol):
    """Evaluates the machine on an actor: the :class:`Interpreter`, or the transitions
    reference engine the property tests compare it with."""

    @property
    def moves(self) -> Mapping[str, Mapping[type[events.Event], Move]]:
        """State -> event class (its trigger) -> :data:`Move`, for every trigger the state
        accepts (a trigger absent here is not accepted in that state). Keyed by class: an
        event's class is found faster than its ``type`` name, which lives on the class."""
        ...


def moves_from_fire(
    spec: Machine, fire: Callable[[Actor, events.Event], bool]
) -> Mapping[str, Mapping[type[events.Event], Move]]:
    """The :attr:`Engine.moves` of an engine that only knows how to fire any trigger (the
    transitions reference): the spec says which triggers each state accepts."""
    return {
        state: {events.REGISTRY[trigger]: fire for trigger in spec.accepts[state]}
        for state in spec.state_names
    }


@dataclass(slots=True)
class Trail:
    """The steps :meth:`ActorTable.apply_logged` took, kept compact: no object is built
    per step (a million of them cost more than the steps), and each step's state after is
    the actor's next step's state before (or its final state)."""

    events: list[events.Event] = field(default_factory=list)
    """The applied events, in order."""
    sources: list[str] = field(default_factory=list)
    """``sources[i]``: the state before ``events[i]``."""
    reasons: dict[int, str] = field(default_factory=dict)
    """``reasons[i]``: why, where step ``i`` has a reason (failures and refusals)."""


class Step(NamedTuple):
    """The result of applying one accepted event (a tuple: cheap to build per event)."""

    event: events.Event
    """The event, as accepted (stamped with its sequence number)."""
    source: str
    """The state before."""
    dest: str
    """The state after (== source for reflexive transitions)."""
    reason: str | None
    """Why, for failures and refusals."""
    refusal: str | None
    """The bounded checkpoint-refusal reason when this step is a refusal."""
    effect: str | None
    """The effect to start now (the dest state's, when the state was entered)."""


class Machine(Protocol):
    """What the table and the pipeline read of the machine
    (:class:`~substrate_gpu.lifecycle.machine.MachineSpec` is one): a Protocol, so this
    module does not import the loader, which imports it."""

    @property
    def initial(self) -> str:
        """The state a new actor starts in."""
        ...

    @property
    def state_names(self) -> tuple[str, ...]:
        """Every state, in the YAML's order."""
        ...

    @property
    def final_states(self) -> frozenset[str]:
        """States with no way out."""
        ...

    @property
    def gpu_holding_states(self) -> frozenset[str]:
        """States in which an actor keeps its allocated GPUs."""
        ...

    @property
    def sandbox_leaving_states(self) -> frozenset[str]:
        """States entered with a sandbox that may still run (its GPUs kept until gone)."""
        ...

    @property
    def effects(self) -> Mapping[str, str]:
        """State -> the effect entering it starts."""
        ...

    @property
    def accepts(self) -> Mapping[str, frozenset[str]]:
        """State -> the triggers it accepts."""
        ...

    @property
    def interpreter(self) -> Engine:
        """The one interpreter compiled from the machine."""
        ...

    def guard_summary(self, source: str, trigger: str) -> str:
        """Why ``trigger`` is refused in ``source``, in words."""
        ...


class ActorTable:
    """Every actor of an agent, and the synchronous apply of an event to one of them."""

    def __init__(self, spec: Machine, engine: Engine | None = None) -> None:
        """``engine`` defaults to the spec's :class:`Interpreter` (the one the agent, replay
        and recovery use); tests pass the transitions reference engine to compare."""
        self._spec = spec
        self._engine: Engine = engine if engine is not None else spec.interpreter
        self._moves = self._engine.moves
        self._initial = spec.initial
        self._effects = spec.effects
        self._actors: dict[str, Actor] = {}
        self._counts: dict[str, int] = dict.fromkeys(spec.state_names, 0)
        self._counts_stale = False
        """:meth:`apply_logged` moved actors without counting: recount when asked."""
        self._seq = 0

    @property
    def spec(self) -> Machine:
        """The machine this table follows."""
        return self._spec

    @property
    def last_seq(self) -> int:
        """The sequence number of the last accepted event."""
        return self._seq

    def __len__(self) -> int:
        return len(self._actors)

    def __iter__(self) -> Iterator[Actor]:
        return iter(self._actors.values())

    def get(self, actor_id: str) -> Actor | None:
        """The actor's record (mutated in place by :meth:`apply`), or None."""
        return self._actors.get(actor_id)

    def state_of(self, actor_id: str) -> str:
        """The actor's state; the initial state for unknown actors."""
        actor = self._actors.get(actor_id)
        return actor.state if actor is not None else self._initial

    def state_counts(self) -> Mapping[str, int]:
        """Actors per state, every state listed (O(states), kept on each commit; counted
        once, O(actors), after :meth:`apply_logged`)."""
        if self._counts_stale:
            counts = dict.fromkeys(self._spec.state_names, 0)
            for actor in self._actors.values():
                counts[actor.state] += 1
            self._counts, self._counts_stale = counts, False
        return dict(self._counts)

    def put(self, view: ActorView) -> None:
        """Insert or replace an actor from a snapshot (recovery from a compacted log)."""
        if view.state not in self._counts:
            raise ValueError(f"actor {view.actor_id!r}: unknown state {view.state!r}")
        actor = self._actors.get(view.actor_id)
        if actor is None:
            actor = self._actors[view.actor_id] = Actor(view.actor_id, view.state)
        else:
            self._counts[actor.state] -= 1
            actor.entered_by = None  # a view does not say which event entered its state
        actor.load(view)
        self._counts[actor.state] += 1

    def resume(self, views: Iterable[ActorView], last_seq: int) -> None:
        """Load recovered actors (:meth:`put` each) and number new events after ``last_seq``.

        Used when an agent restarts on an existing event log: the log's last sequence number
        must never be reused, so the next accepted event gets ``last_seq + 1``.
        """
        for view in views:
            self.put(view)
        self._seq = max(self._seq, last_seq)

    def check(self, event: events.Event) -> None:
        """Raise :class:`InvalidEvent` if ``event`` cannot be accepted now (no change)."""
        actor = self._actors.get(event.actor_id)
        scratch = Actor(event.actor_id, self._initial)
        if actor is not None:
            scratch.load(actor.snapshot())
        self._fire(scratch, event, known=actor is not None)

    def apply(self, event: events.Event) -> Step:
        """Apply ``event``: stamp it, run its transition, commit; or raise InvalidEvent.

        Replay calls this with logged events (already stamped: their ``seq`` is kept).
        """
        if event.seq == 0:
            event = event.stamped(self._seq + 1)
        actor, source = self.advance(event)
        dest = actor.state
        return Step(
            event,
            source,
            dest,
            actor.transition_reason,
            actor.refusal,
            self._effects.get(dest) if dest != source else None,
        )

    def advance(self, event: events.Event) -> tuple[Actor, str]:
        """:meth:`apply`'s work without the :class:`Step`: the actor (moved, its
        ``transition_reason`` and ``refusal`` set) and its state before. ``event`` is
        applied as it is (an unstamped one gets no ``seq``)."""
        actor = self._actors.get(event.actor_id)
        if actor is None:
            return self._admit(event)
        source = actor.state
        # _fire, inlined: this runs once per replayed event.
        move = self._moves[source].get(type(event))
        if move is None:
            raise self._not_accepted(event, source, known=True)
        actor.refusal = None
        actor.transition_reason = None
        saved = read_fields(actor)
        try:
            moved = move(actor, event)
        except BaseException:
            restore_fields(actor, saved)  # a raising callback (a bug) changes nothing
            raise
        if not moved:
            raise self._no_transition(event, source)
        dest = actor.state
        if dest != source:
            counts = self._counts
            counts[source] -= 1
            counts[dest] += 1
        if event.seq > self._seq:  # noqa: PLR1730 (a call to max costs more per event)
            self._seq = event.seq
        return actor, source

    def apply_logged(
        self,
        records: Sequence[Any],
        trail: Trail | None = None,
        *,
        other: type | None = None,
        on_other: Callable[[Any], None] | None = None,
    ) -> None:
        """Apply events read back from the log, in log order: what :meth:`advance` does
        for each, through the same :attr:`Engine.moves`, without keeping the per-state
        counts on the way (recounted once, when next asked for). Replay's and recovery's
        hot path: a million events per second is the order of magnitude.

        An actor's :attr:`~Actor.entered_by` becomes the event that changed its state.
        ``trail``, when given, gets every applied event, its state before and its reason.
        A record of class ``other`` is not an event: it goes to ``on_other`` (in order:
        the replayer checks a logged rejection against the state at that point). An event
        the machine refuses raises :class:`LoggedEventRefused`; the events before it stay
        applied (the caller discards the table).
        """
        actors_get = self._actors.get
        moves = self._moves
        keep = trail is not None
        if trail is not None:
            push_event, push_source = trail.events.append, trail.sources.append
            sources, reasons = trail.sources, trail.reasons
        self._counts_stale = True
        record = None
        try:
            for record in records:
                if type(record) is other:
                    on_other(record)  # type: ignore[misc]
                    continue
                actor = actors_get(record.actor_id)
                if actor is None:
                    actor, source = self._admit(record)
                else:
                    source = actor.state
                    try:
                        move = moves[source][type(record)]
                    except KeyError:
                        raise self._not_accepted(record, source, known=True) from None
                    # Not ``refusal``: only apply() reads it, and advance() resets it first.
                    actor.transition_reason = None
                    if not move(actor, record):
                        raise self._no_transition(record, source)
                if actor.state != source:
                    actor.entered_by = record
                if keep:
                    reason = actor.transition_reason
                    if reason is not None:
                        reasons[len(sources)] = reason
                    push_event(record)
                    push_source(source)
        except errors.InvalidEvent as e:
            raise errors.LoggedEventRefused(record, e) from e
        for record in reversed(records):
            if type(record) is not other:
                self._seq = max(self._seq, record.seq)
                break

    def _admit(self, event: events.Event) -> tuple[Actor, str]:
        """An unknown actor's first event (its registration, or a refusal)."""
        actor = Actor(event.actor_id, self._initial)
        self._fire(actor, event, known=False)
        self._actors[actor.actor_id] = actor
        self._counts[actor.state] += 1
        if event.seq > self._seq:  # noqa: PLR1730 (a call to max costs more per event)
            self._seq = event.seq
        return actor, self._initial

    def _fire(self, actor: Actor, event: events.Event, *, known: bool) -> None:
        source = actor.state
        move = self._moves[source].get(type(event))
        if move is None:
            raise self._not_accepted(event, source, known=known)
        actor.refusal = None
        actor.transition_reason = None
        if not move(actor, event):
            raise self._no_transition(event, source)

    def _no_transition(self, event: events.Event, source: str) -> Exception:
        problem = self._spec.guard_summary(source, event.type)
        return errors.InvalidEvent(event.actor_id, source, event.type, problem)

    def _not_accepted(self, event: events.Event, source: str, *, known: bool) -> Exception:
        accepted = ", ".join(sorted(kind.type for kind in self._moves[source])) or "nothing"
        problem = (
            f"not accepted in this state (accepted here: {accepted})"
            if known
            else "unknown actor (register it first with actor_registered)"
        )
        return errors.InvalidEvent(event.actor_id, source, event.type, problem)
