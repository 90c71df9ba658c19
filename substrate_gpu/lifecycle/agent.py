"""The embedding API: one async context-managed :class:`Agent` per node agent.

::

    async with Agent(runtime=driver, probe=fd_probe, injector=inject,
                     checkpoint_root=Path("/var/lib/substrate/checkpoints")) as agent:
        await agent.submit(events.ActorRegistered(actor_id="a1", gpu=True, bundle="/b/a1"))
        await agent.wait_for_state("a1", "registered", timeout=5)

Subscribers (``async with agent.subscribe() as transitions: async for t in transitions``)
each get a bounded buffer. **Policy for slow subscribers**: the agent never waits for one.
When a subscriber's buffer is full it is disconnected: its iterator yields what was
buffered, then raises :class:`SubscriptionOverflow`, so a consumer always knows it missed
transitions instead of silently seeing a gap. (The event log is the lossless record.)

Leaving the ``async with`` cancels effects still running (actors stay in their in-flight
state, for recovery to reconcile); ``await agent.settle()`` first to let them finish.

**Restarting on an event log**: pass ``resume=`` a :class:`ResumePoint` (built by
``substrate_gpu.eventlog.recover``): the agent starts with the logged actors, numbers new
events after the log's last one, and on entering accepts the reconciliation outcomes (logged
and observed like any event, their follow-up effects started) and reruns the effects
recovery judged safe to rerun.
"""

from __future__ import annotations

import collections
import contextlib
import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import anyio

from substrate_gpu.lifecycle import (
    actors,
    allocation,
    effects,
    errors,
    events,
    hooks,
    machine,
    pipeline,
    table,
)
from substrate_gpu.lifecycle.gpu import GpuSettings
from substrate_gpu.probes.api import CudaContextProbe
from substrate_gpu.runsc.api import SandboxRuntime


@dataclass(frozen=True)
class ResumePoint:
    """Where a restarted agent resumes: the logged actors and what recovery decided."""

    actors: tuple[actors.ActorView, ...]
    """Every actor as the event log left it (before reconciliation)."""
    last_seq: int
    """The log's last sequence number: new events are numbered after it."""
    outcomes: tuple[events.Event, ...] = ()
    """Outcomes of interrupted effects, established by asking the runtime (unstamped). Two
    in a row for one actor: the effect the first one starts completed too (only the last
    one's effect is started)."""
    rerun: tuple[tuple[str, events.Event], ...] = ()
    """``(actor_id, cause)``: in-flight actors whose effect is safe to run again."""
    live: tuple[allocation.LiveSandbox, ...] = ()
    """GPU sandboxes the runtime showed live, with the GPUs injected in them: held whatever
    the log says, until each is gone (:mod:`substrate_gpu.lifecycle.pipeline`)."""


class Subscription:
    """An async iterator of :class:`Transition` with a bounded buffer (see module doc)."""

    def __init__(self, buffer: int) -> None:
        self._buffer: collections.deque[hooks.Transition] = collections.deque()
        self._limit = buffer
        self._wakeup = anyio.Event()
        self._overflowed = False
        self._closed = False
        self.dropped = 0
        """Transitions not delivered because this subscriber fell behind."""

    def _push(self, t: hooks.Transition) -> None:
        if self._closed:
            return
        if len(self._buffer) >= self._limit:
            self._overflowed = True
            self._closed = True
            self.dropped += 1
        else:
            self._buffer.append(t)
        self._wakeup.set()

    def _close(self) -> None:
        self._closed = True
        self._wakeup.set()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> hooks.Transition:
        while not self._buffer:
            if self._overflowed:
                raise errors.SubscriptionOverflow(
                    f"transition subscriber fell behind its buffer of {self._limit} and was "
                    "disconnected; read faster or subscribe with a larger buffer"
                )
            if self._closed:
                raise StopAsyncIteration
            await self._wakeup.wait()
            self._wakeup = anyio.Event()
        return self._buffer.popleft()


class Agent:
    """Per-actor lifecycles for one node: submit events, await states, watch transitions."""

    def __init__(
        self,
        *,
        runtime: SandboxRuntime,
        probe: CudaContextProbe,
        injector: effects.GpuInjector,
        checkpoint_root: Path,
        machine_spec: machine.MachineSpec | Path | None = None,
        recorder: hooks.EventRecorder | None = None,
        metrics: hooks.LifecycleMetrics | None = None,
        observers: Iterable[hooks.TransitionObserver] = (),
        timeouts: Mapping[str, float] | None = None,
        queue_size: int = 1024,
        concurrency: int = 64,
        resume: ResumePoint | None = None,
        gpu: GpuSettings | None = None,
        allocator: allocation.GpuAllocator | None = None,
    ) -> None:
        """``timeouts`` overrides :data:`effects.DEFAULT_TIMEOUTS` per effect name;
        ``queue_size`` bounds effects queued or running (``submit`` waits beyond it);
        ``concurrency`` is how many effects run at once; ``resume`` restarts from an
        event log (see the module doc); ``gpu`` turns on driver preflight, checkpoint
        manifests and the CUDA suspend routes (:mod:`substrate_gpu.lifecycle.gpu`);
        ``allocator`` hands out the worker's GPUs one actor at a time
        (:mod:`substrate_gpu.lifecycle.allocation`; without it every GPU actor gets all)."""
        if isinstance(machine_spec, machine.MachineSpec):
            spec = machine_spec
        else:
            spec = machine.load_spec(machine_spec or machine.DEFAULT_MACHINE)
        self._spec = spec
        self._table = table.ActorTable(spec)
        self._resume = resume
        if resume is not None:
            self._table.resume(resume.actors, resume.last_seq)
        self._pipeline = pipeline.Pipeline(
            self._table,
            effects.EffectContext(
                runtime=runtime,
                probe=probe,
                injector=injector,
                checkpoint_root=checkpoint_root,
                gpu=gpu,
                allocator=allocator,
            ),
            timeouts=timeouts,
            recorder=recorder,
            metrics=metrics,
            observers=[o.on_transition for o in observers],
            queue_size=queue_size,
            concurrency=concurrency,
            live=resume.live if resume is not None else (),
        )
        self._pipeline.add_observer(self._on_transition)
        self._subscriptions: set[Subscription] = set()
        self._waiters: dict[str, list[tuple[str, anyio.Event]]] = {}
        self._stack: contextlib.AsyncExitStack | None = None

    async def __aenter__(self) -> Self:
        async with contextlib.AsyncExitStack() as stack:
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            await tg.start(self._pipeline.serve)
            resume, self._resume = self._resume, None
            if resume is not None:
                outcomes = resume.outcomes
                for i, outcome in enumerate(outcomes):
                    followed = (
                        i + 1 < len(outcomes) and outcomes[i + 1].actor_id == outcome.actor_id
                    )
                    await self._pipeline.reconcile(outcome, act=not followed)
                for actor_id, cause in resume.rerun:
                    await self._pipeline.rerun(actor_id, cause)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        stack, self._stack = self._stack, None
        for subscription in tuple(self._subscriptions):
            subscription._close()
        if stack is not None:
            return await stack.__aexit__(exc_type, exc, tb)
        return None

    # --- events in ----------------------------------------------------------------------------

    async def submit(self, event: events.Event) -> hooks.Transition:
        """Accept ``event`` (waits while the queue is full); raise InvalidEvent if refused.

        Returns the transition it caused. Its effect, if any, runs afterwards.
        """
        step = await self._pipeline.submit(event)
        return hooks.Transition(
            actor_id=step.event.actor_id,
            source=step.source,
            dest=step.dest,
            trigger=step.event.type,
            event_type=step.event.type,
            at=step.event.at,
            reason=step.reason,
        )

    @property
    def pending_effects(self) -> int:
        """Effect chains queued or running right now."""
        return self._pipeline.pending

    async def submit_all(self, group: Sequence[events.Event]) -> list[hooks.Transition]:
        """Accept several events in order and wait once until all are durable (one fsync of
        the event log for the group), then start their effects; the transitions. A refused
        one raises :class:`InvalidEvent`: those before it stay accepted."""
        steps = await self._pipeline.submit_all(group)
        return [
            hooks.Transition(
                actor_id=step.event.actor_id,
                source=step.source,
                dest=step.dest,
                trigger=step.event.type,
                event_type=step.event.type,
                at=step.event.at,
                reason=step.reason,
            )
            for step in steps
        ]

    async def durable(self) -> None:
        """Return once every accepted event is durable: an observer may see a transition
        before its event is (docs/event-log.md, "When an event is durable"), so a door
        waits here before it answers for one."""
        await self._pipeline.durable()

    async def settle(self) -> None:
        """Wait until every accepted event's effects have finished and every accepted
        event is durable."""
        await self._pipeline.settle()

    # --- state out ----------------------------------------------------------------------------

    @property
    def spec(self) -> machine.MachineSpec:
        """The lifecycle machine in use."""
        return self._spec

    def state_of(self, actor_id: str) -> str | None:
        """The actor's state, or None for an actor this agent does not know."""
        actor = self._table.get(actor_id)
        return actor.state if actor is not None else None

    def actor(self, actor_id: str) -> actors.ActorView | None:
        """A snapshot of the actor's record, or None."""
        actor = self._table.get(actor_id)
        return actor.snapshot() if actor is not None else None

    def actors(self) -> tuple[actors.ActorView, ...]:
        """A snapshot of every actor's record, ordered by actor id (O(actors))."""
        return tuple(sorted((a.snapshot() for a in self._table), key=lambda v: v.actor_id))

    def state_counts(self) -> Mapping[str, int]:
        """Actors per state (every state listed; O(states))."""
        return self._table.state_counts()

    def __len__(self) -> int:
        return len(self._table)

    async def wait_for_state(self, actor_id: str, state: str, *, timeout: float = math.inf) -> None:
        """Return once ``actor_id`` is in ``state``.

        :class:`StateUnreachable` at once when the actor can no longer get there by itself:
        it is in a final state, or it came to rest (no effect in flight) with a reason (a
        failure or a refusal: ``failed``, ``running`` after a refused suspend, ``suspended``
        after a failed restore) in a state from which the machine reaches ``state`` only
        through another external event (:attr:`MachineSpec.reachable_unaided`). So submit
        the event, then wait: ``wait_for_state(a, "running")`` after ``run_requested`` ends
        with the create's error the moment it fails, not after ``timeout``. An actor at
        rest without a reason (``bundle_prepared``, a clean ``running``) is waited for: the
        next event may still be on its way. :class:`StateWaitTimeout` after ``timeout``."""
        if state not in self._table.spec.state_names:
            raise ValueError(f"unknown state {state!r}")
        if self.state_of(actor_id) == state:
            return
        if not self._cannot_reach(actor_id, state):
            reached = anyio.Event()
            entry = (state, reached)
            self._waiters.setdefault(actor_id, []).append(entry)
            try:
                with anyio.move_on_after(timeout):
                    await reached.wait()
            finally:
                waiters = self._waiters.get(actor_id, [])
                if entry in waiters:
                    waiters.remove(entry)
                if not waiters:
                    self._waiters.pop(actor_id, None)
        view = self.actor(actor_id)
        if view is None or view.state != state:
            now = "unknown" if view is None else view.state
            why = f" (reason: {view.reason})" if view is not None and view.reason else ""
            if self._cannot_reach(actor_id, state):
                raise errors.StateUnreachable(
                    f"while waiting for actor {actor_id!r} to reach state {state!r}: it is "
                    f"{now!r}{why}, from where it gets to {state!r} only if another event "
                    "is sent"
                    if now not in self._spec.final_states
                    else f"while waiting for actor {actor_id!r} to reach state {state!r}: it "
                    f"is {now!r}{why}, a final state"
                )
            raise errors.StateWaitTimeout(
                f"while waiting for actor {actor_id!r} to reach state {state!r} "
                f"(timeout {timeout:g}s): it is {now!r}{why}"
            )

    def _cannot_reach(self, actor_id: str, state: str) -> bool:
        """Whether ``actor_id`` cannot get to ``state`` by itself (see :meth:`wait_for_state`)."""
        actor = self._table.get(actor_id)
        if actor is None or actor.state == state:
            return False
        spec = self._spec
        if actor.state in spec.final_states:
            return True
        return (
            actor.state not in spec.effects
            and bool(actor.reason)
            and state not in spec.reachable_unaided[actor.state]
        )

    def add_observer(self, observer: Callable[[hooks.Transition], None]) -> None:
        """Call ``observer`` with every transition from now on, synchronously, in the order
        the machine applied them (it must not block: it runs inside the pipeline)."""
        self._pipeline.add_observer(observer)

    def remove_observer(self, observer: Callable[[hooks.Transition], None]) -> None:
        """Stop calling ``observer``."""
        self._pipeline.remove_observer(observer)

    @contextlib.asynccontextmanager
    async def subscribe(self, buffer: int = 1000) -> AsyncIterator[Subscription]:
        """Receive every transition from now on (bounded; see the module doc)."""
        subscription = Subscription(buffer)
        self._subscriptions.add(subscription)
        try:
            yield subscription
        finally:
            self._subscriptions.discard(subscription)
            subscription._close()

    def _on_transition(self, t: hooks.Transition) -> None:
        for subscription in self._subscriptions:
            subscription._push(t)
        waiters = self._waiters.get(t.actor_id)
        if waiters:
            for state, reached in waiters:
                if state == t.dest or self._cannot_reach(t.actor_id, state):
                    reached.set()
