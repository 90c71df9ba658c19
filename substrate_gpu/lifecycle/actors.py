"""Actor records and the synchronous core that moves them through the machine.

Why one machine and a cursor, not a transitions model per actor: ``Machine.add_model``
checks membership with a list scan (registering 100k actors is quadratic) and binds a
trigger partial per event type onto every model (kilobytes per actor). Instead, each actor
is a small ``__slots__`` :class:`Actor` record (~120 bytes plus its strings), and ONE
machine evaluates every transition on ONE reusable :class:`Cursor` model:

1. the cursor is loaded with a *copy* of the actor's fields and the event,
2. the trigger fires on the cursor (conditions and callbacks, named in the YAML, are the
   cursor's methods and touch only the cursor),
3. only when a transition happened is the cursor copied back into the actor.

Processing is synchronous (no await between 1 and 3), so sharing the cursor is safe, and an
event that is refused, or whose callback raises, leaves the actor exactly as it was.
Per-state counts are kept incrementally on commit: ``state_counts()`` is O(states).

Cursors never compare equal to each other by value (plain class, identity equality), so
transitions can never merge them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from substrate_gpu.lifecycle import errors, events

if TYPE_CHECKING:
    from substrate_gpu.lifecycle.machine import MachineSpec


class Actor:
    """One actor's lifecycle record: the state plus what its effects need."""

    __slots__ = (
        "actor_id",
        "bundle",
        "checkpoint",
        "cuda_pids",
        "exited",
        "gpu",
        "live_contexts",
        "reason",
        "sandbox",
        "state",
        "suspend_policy",
        "suspend_route",
    )

    def __init__(self, actor_id: str, state: str) -> None:
        self.actor_id = actor_id
        """The actor id (also its sandbox container id)."""
        self.state = state
        """The machine state name."""
        self.gpu = False
        """GPUs are injected and nvproxy is used."""
        self.bundle = ""
        """The OCI bundle directory."""
        self.checkpoint: str | None = None
        """The last good checkpoint image directory."""
        self.live_contexts = 0
        """CUDA contexts observed open (cuda_context_opened minus closed)."""
        self.sandbox = False
        """A sandbox (container) may exist in the runtime and must be deleted before reuse."""
        self.reason: str | None = None
        """Why the actor is failed/stopped, or the last refusal."""
        self.exited = False
        """The sandbox was reported exited while an effect was in flight."""
        self.suspend_policy = "auto"
        """The pool's GPU suspend policy (``auto`` or ``refuse``)."""
        self.suspend_route = ""
        """How the current (or last) suspend handles a live CUDA context, or empty."""
        self.cuda_pids = ""
        """Sandbox pids whose CUDA state the exec route checkpointed, comma-separated."""

    def snapshot(self) -> ActorView:
        """An immutable copy, handed to effects and callers."""
        return ActorView(
            actor_id=self.actor_id,
            state=self.state,
            gpu=self.gpu,
            bundle=self.bundle,
            checkpoint=self.checkpoint,
            live_contexts=self.live_contexts,
            sandbox=self.sandbox,
            reason=self.reason,
            exited=self.exited,
            suspend_policy=self.suspend_policy,
            suspend_route=self.suspend_route,
            cuda_pids=self.cuda_pids,
        )

    def __repr__(self) -> str:
        return f"Actor({self.actor_id!r}, state={self.state!r}, reason={self.reason!r})"


@dataclass(frozen=True, slots=True)
class ActorView:
    """A read-only snapshot of an :class:`Actor`."""

    actor_id: str
    state: str
    gpu: bool
    bundle: str
    checkpoint: str | None
    live_contexts: int
    sandbox: bool
    reason: str | None
    exited: bool = False
    suspend_policy: str = "auto"
    suspend_route: str = ""
    cuda_pids: str = ""


#: Condition names the YAML may use (methods of :class:`Cursor` returning bool).
CONDITIONS = frozenset(
    {
        "is_gpu",
        "has_live_context",
        "sandbox_survived",
        "has_checkpoint",
        "has_exited",
        "refuses_gpu_suspend",
        "route_is_runsc",
        "route_is_exec",
        "suspended_cuda_in_sandbox",
        "image_has_exec_cuda_state",
    }
)

#: Callback names the YAML may use (methods of :class:`Cursor` returning None).
CALLBACKS = frozenset(
    {
        "remember_registration",
        "remember_bundle",
        "remember_reason",
        "clear_reason",
        "remember_sandbox",
        "forget_sandbox",
        "count_context_opened",
        "count_context_closed",
        "clear_contexts",
        "refuse_live_context",
        "note_refusal",
        "remember_checkpoint",
        "remember_restore_image",
        "note_exit",
        "clear_exit",
        "report_exit",
        "refuse_by_policy",
        "remember_route",
        "forget_route",
        "remember_cuda_pids",
        "forget_cuda_pids",
        "note_code_refusal",
    }
)


class Cursor:
    """The machine's only model: a scratch copy of one actor while one event is applied."""

    __slots__ = (*Actor.__slots__, "event", "refusal", "transition_reason")

    def __init__(self, initial: str) -> None:
        self._reset("", initial)
        self.event: events.Event = events.RunRequested(actor_id="")

    def _reset(self, actor_id: str, state: str) -> None:
        self.actor_id = actor_id
        self.state = state
        self.gpu = False
        self.bundle = ""
        self.checkpoint: str | None = None
        self.live_contexts = 0
        self.sandbox = False
        self.reason: str | None = None
        self.exited = False
        self.suspend_policy = "auto"
        self.suspend_route = ""
        self.cuda_pids = ""
        self.refusal: str | None = None
        self.transition_reason: str | None = None

    def load(self, actor: Actor | None, initial: str, event: events.Event) -> None:
        """Copy ``actor`` (or a fresh actor in ``initial``) and ``event`` into the cursor."""
        if actor is None:
            self._reset(event.actor_id, initial)
        else:
            for name in Actor.__slots__:
                setattr(self, name, getattr(actor, name))
            self.refusal = None
            self.transition_reason = None
        self.event = event

    def store(self, actor: Actor) -> None:
        """Copy the cursor's (post-transition) fields back into ``actor``."""
        for name in Actor.__slots__:
            setattr(actor, name, getattr(self, name))

    # --- conditions -----------------------------------------------------------------------

    def is_gpu(self) -> bool:
        """The actor uses GPUs."""
        return self.gpu

    def has_live_context(self) -> bool:
        """At least one CUDA context is observed open."""
        return self.live_contexts > 0

    def sandbox_survived(self) -> bool:
        """The failed/refused checkpoint left the sandbox running."""
        return bool(getattr(self.event, "sandbox_survived", False))

    def has_exited(self) -> bool:
        """The sandbox exited while the current effect was in flight."""
        return self.exited

    def has_checkpoint(self) -> bool:
        """A checkpoint to restore is known (the event's, or the actor's last good one)."""
        return bool(getattr(self.event, "image_path", None) or self.checkpoint)

    def refuses_gpu_suspend(self) -> bool:
        """The pool's GPU suspend policy is ``refuse``."""
        return self.suspend_policy == "refuse"

    def route_is_runsc(self) -> bool:
        """The live context is suspended by runsc itself (``--cuda-checkpoint-path``)."""
        return getattr(self.event, "route", None) == events.ROUTE_RUNSC

    def route_is_exec(self) -> bool:
        """The live context is suspended by cuda-checkpoint exec'd in the sandbox."""
        return getattr(self.event, "route", None) == events.ROUTE_EXEC

    def suspended_cuda_in_sandbox(self) -> bool:
        """This suspend checkpointed CUDA processes through the sandbox (exec route): a
        failed checkpoint must resume them."""
        return self.suspend_route == events.ROUTE_EXEC

    def image_has_exec_cuda_state(self) -> bool:
        """The restored image holds CUDA state checkpointed through the sandbox."""
        return getattr(self.event, "cuda_route", "") == events.ROUTE_EXEC

    # --- callbacks -------------------------------------------------------------------------

    def remember_registration(self) -> None:
        """Take ``gpu`` and ``bundle`` from ``actor_registered``."""
        event = self.event
        assert isinstance(event, events.ActorRegistered)
        self.gpu = event.gpu
        self.bundle = event.bundle
        self.suspend_policy = event.suspend_policy

    def remember_bundle(self) -> None:
        """Take the (re-)prepared bundle directory."""
        event = self.event
        assert isinstance(event, events.BundlePrepared)
        self.bundle = event.bundle

    def remember_reason(self) -> None:
        """Record the event's reason on the actor and the transition."""
        self.reason = self.event.describe() or self.event.type
        self.transition_reason = self.reason

    def clear_reason(self) -> None:
        """The actor is healthy again."""
        self.reason = None

    def remember_sandbox(self) -> None:
        """A container of this actor (may) exist in the runtime: delete it before reuse."""
        self.sandbox = True

    def forget_sandbox(self) -> None:
        """No container of this actor exists in the runtime any more."""
        self.sandbox = False

    def note_exit(self) -> None:
        """The sandbox exited mid-effect: remembered for the effect's outcome."""
        self.exited = True
        self.reason = self.event.describe()
        self.transition_reason = self.reason

    def clear_exit(self) -> None:
        """A new effect starts: no exit seen during it yet."""
        self.exited = False

    def report_exit(self) -> None:
        """The effect finished but the sandbox had exited meanwhile: stopped, with why."""
        self.exited = False
        self.transition_reason = self.reason

    def count_context_opened(self) -> None:
        """One more CUDA context is open."""
        self.live_contexts += 1

    def count_context_closed(self) -> None:
        """One CUDA context closed."""
        self.live_contexts -= 1

    def clear_contexts(self) -> None:
        """No context can be live (no sandbox, or the runtime proved none)."""
        self.live_contexts = 0

    def refuse_live_context(self) -> None:
        """Suspend refused by the machine: contexts are observed open."""
        self.reason = f"suspend refused: {self.live_contexts} live CUDA context(s) observed"
        self.transition_reason = self.reason
        self.refusal = events.REFUSED_LIVE_CONTEXT_OBSERVED

    def note_refusal(self) -> None:
        """The effect refused the checkpoint (probe, runtime, or a rolled-back CUDA suspend):
        count it by reason."""
        event = self.event
        assert isinstance(event, events.CheckpointRefused | events.CudaSuspendRefused)
        self.refusal = event.reason

    def note_code_refusal(self) -> None:
        """A preflight or restore check refused: count it by its code."""
        event = self.event
        assert isinstance(event, events.PreflightRefused | events.RestoreRefused)
        self.refusal = event.code

    def refuse_by_policy(self) -> None:
        """Suspend refused by the machine: contexts are observed open and the pool refuses."""
        self.reason = (
            f"suspend refused: {self.live_contexts} live CUDA context(s) observed and the "
            "pool's GPU suspend policy is 'refuse'"
        )
        self.transition_reason = self.reason
        self.refusal = events.REFUSED_SUSPEND_POLICY

    def remember_route(self) -> None:
        """The route this suspend takes for its live CUDA context."""
        event = self.event
        assert isinstance(event, events.LiveContextFound)
        self.suspend_route = event.route

    def forget_route(self) -> None:
        """A new suspend starts: no route chosen yet."""
        self.suspend_route = ""

    def remember_cuda_pids(self) -> None:
        """The sandbox pids whose CUDA state was checkpointed (to resume them later)."""
        event = self.event
        assert isinstance(event, events.CudaSuspended | events.CudaSuspendFailed)
        self.cuda_pids = event.pids

    def forget_cuda_pids(self) -> None:
        """No CUDA process of the sandbox is left checkpointed."""
        self.cuda_pids = ""

    def remember_checkpoint(self) -> None:
        """The new checkpoint is the actor's last good one."""
        event = self.event
        assert isinstance(event, events.CheckpointWritten)
        self.checkpoint = event.image_path

    def remember_restore_image(self) -> None:
        """Restore from the image the event names (e.g. taken on another worker)."""
        image = getattr(self.event, "image_path", None)
        if image:
            self.checkpoint = image


class Engine(Protocol):
    """Evaluates one trigger on the cursor (transitions' Machine, or the dict-table floor)."""

    def fire(self, cursor: Cursor, trigger: str) -> bool:
        """Run the first transition of ``trigger`` from ``cursor.state`` whose conditions
        hold; False when none holds. The caller checked the trigger is valid there."""
        ...


@dataclass(frozen=True, slots=True)
class Step:
    """The result of applying one accepted event."""

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


class ActorTable:
    """Every actor of an agent, and the synchronous apply of an event to one of them."""

    def __init__(self, spec: MachineSpec, engine: Engine) -> None:
        self._spec = spec
        self._engine = engine
        self._initial = spec.initial
        self._accepts = spec.accepts
        self._effects = spec.effects
        self._cursor = Cursor(spec.initial)
        self._actors: dict[str, Actor] = {}
        self._counts: dict[str, int] = dict.fromkeys(spec.state_names, 0)
        self._seq = 0

    @property
    def spec(self) -> MachineSpec:
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
        """Actors per state, every state listed (O(states), kept on each commit)."""
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
        for name in Actor.__slots__:
            setattr(actor, name, getattr(view, name))
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
        self._evaluate(event, commit=False)

    def apply(self, event: events.Event) -> Step:
        """Apply ``event``: stamp it, run its transition, commit; or raise InvalidEvent.

        Replay calls this with logged events (already stamped: their ``seq`` is kept).
        """
        step = self._evaluate(event, commit=True)
        assert step is not None
        return step

    def _evaluate(self, event: events.Event, *, commit: bool) -> Step | None:
        actor = self._actors.get(event.actor_id)
        source = actor.state if actor is not None else self._initial
        trigger = event.type
        if trigger not in self._accepts.get(source, ()):
            accepted = ", ".join(sorted(self._accepts.get(source, ()))) or "nothing"
            problem = (
                "unknown actor (register it first with actor_registered)"
                if actor is None
                else f"not accepted in this state (accepted here: {accepted})"
            )
            raise errors.InvalidEvent(event.actor_id, source, trigger, problem)
        cursor = self._cursor
        cursor.load(actor, self._initial, event)
        if not self._engine.fire(cursor, trigger):
            raise errors.InvalidEvent(
                event.actor_id, source, trigger, self._spec.guard_summary(source, trigger)
            )
        if not commit:
            return None
        if event.seq == 0:
            self._seq += 1
            event = event.stamped(self._seq)
        else:
            self._seq = max(self._seq, event.seq)
        dest = cursor.state
        if actor is None:
            actor = Actor(event.actor_id, dest)
            self._actors[event.actor_id] = actor
        else:
            self._counts[source] -= 1
        cursor.store(actor)
        self._counts[dest] += 1
        return Step(
            event=event,
            source=source,
            dest=dest,
            reason=cursor.transition_reason,
            refusal=cursor.refusal,
            effect=self._effects.get(dest) if dest != source else None,
        )
