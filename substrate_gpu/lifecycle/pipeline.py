"""The event pipeline: accept events in order, run effects concurrently, feed outcomes back.

How an event flows (one actor's events strictly in order, actors concurrently):

1. ``submit`` first takes a slot of the bounded queue (``queue_size``): when every slot is
   held, it **awaits** (back-pressure; memory stays bounded however fast events come).
2. The event is applied to the machine **synchronously** (no await between the check and the
   commit), so the order of acceptance is the order of ``submit`` calls, and an invalid
   event raises :class:`InvalidEvent` to the submitter with the actor untouched.
3. The accepted event is **recorded** (:class:`EventRecorder`) and observed; it is durable
   before it is acted on and before its submitter is answered. With a recorder that
   group-commits (:class:`GroupCommitRecorder`, the event log), the event takes its place
   in the log's order at once, observers are told, then the submitter waits for the fsync;
   :meth:`Pipeline.submit_all` accepts several events (a registration and its first
   request) and waits once for all of them, before any of their effects starts.
4. If the transition entered an in-flight state, its effect is queued for one of
   ``concurrency`` workers. An actor in flight accepts no event that starts another
   effect (the machine says so), so at most one effect per actor runs at a time and its
   outcome is ordered after everything accepted before it.
5. A worker runs the effect under ``anyio.fail_after(timeout)``, turns its result (or the
   timeout, or an unexpected error) into an outcome event, and accepts that like any
   other event; a follow-up effect (create → start) continues on the same worker and slot.

**No GPU is freed while a sandbox that has it may still run**. When an actor
leaves a ``holds_gpus`` state for one the machine marks ``may_leave_sandbox`` (``failed``:
an effect failed, timed out or was interrupted, a verification failed, a resume failed with
the sandbox up), or for any state when the effect raised (an unexpected error: what it did
to the sandbox is unknown, whatever its failure outcome says), its GPUs stay held: the
pipeline deletes what is left of the sandbox (apps first, ``_pause`` last), asks the
runtime that none of its containers is left, and only then frees them (and offers them to
actors awaiting GPUs). Other outcomes leave a holding state only with the sandbox known
gone (:mod:`~substrate_gpu.lifecycle.effects`). GPUs recovery
found injected in a live sandbox (:class:`~substrate_gpu.lifecycle.allocation.LiveSandbox`)
are held the same way, beside what the log says, until that sandbox is gone. A kept GPU is
free for the actor itself (its next create or restore replaces the old sandbox first), and
that actor's next effect waits for a cleanup under way.

**Outcomes recovery re-derives are not waited for** (``REDERIVED``, from the effect
registry: ``sandbox_created``, ``checkpoint_written``). If the agent dies before such an
outcome is durable, the log leaves the actor in the effect's state and recovery asks runsc,
which shows the same outcome (a created sandbox, or one whose start ran too; the sandbox
gone and its image whole): so the follow-up effect (``start``) runs without waiting for the
fsync, which the follow-up's own outcome then shares. An outcome that starts no effect is
made durable by the next wait (the worker door's next request or its answer), and at the
latest :data:`DEFERRED_WINDOW` seconds later. docs/event-log.md, "When an event is durable".

A hung effect holds one worker and one slot until its timeout, then the actor goes to
``failed`` with the reason; the other workers keep serving other actors. An effect's
blocking steps must be abandonable for this to hold (a thread anyio waits for is not:
the injector runs its file work through :mod:`substrate_gpu._blocking`). Cancellation
(the agent closing) cancels running effects: the actor stays in its in-flight state, which
is what recovery reconciles from the event log.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from substrate_gpu._log import get_logger
from substrate_gpu.lifecycle import (
    actors,
    allocation,
    effects,
    errors,
    events,
    hooks,
    registry,
    table,
)

_log = get_logger(__name__)

#: Seconds an outcome left to the next wait (``REDERIVED``, starting no effect) may stay
#: appended but not durable when no wait comes (module doc).
DEFERRED_WINDOW: Final = 0.05


@runtime_checkable
class RejectionRecorder(Protocol):
    """An :class:`~hooks.EventRecorder` that also records refused events (the event log).

    Optional: the pipeline calls it when the recorder has it. A refused event changes no
    actor; it is recorded (in order, before :class:`InvalidEvent` reaches the submitter) so
    that a replay of the log reproduces the refusal.
    """

    async def record_rejected(self, event: events.Event, state: str, problem: str) -> None:
        """Persist the refusal of ``event`` (unstamped) by an actor in ``state``."""
        ...


@runtime_checkable
class GroupCommitRecorder(Protocol):
    """An :class:`~hooks.EventRecorder` that can take an event into its order now and make
    it durable later (the event log's group commit).

    Optional: with it, the pipeline appends each accepted event synchronously and waits
    once for a group (:meth:`Pipeline.submit_all`), and leaves an outcome recovery
    re-derives to the next wait (module doc); without it, every event is ``record``-ed and
    waited for, one by one.
    """

    def append(self, event: events.Event) -> None:
        """Take ``event`` (stamped) into the order now (raises when the log failed)."""
        ...

    async def durable(self) -> None:
        """Return once every event appended so far is durable."""
        ...


@runtime_checkable
class GpuMetrics(Protocol):
    """A :class:`~hooks.LifecycleMetrics` that also shows the worker's GPU allocation.

    Optional: the pipeline calls it, when the metrics object has it, after every change of
    the allocation table.
    """

    def gpus_allocated(self, worker: str, allocated: int, free: int) -> None:
        """The worker's GPUs held by actors, and free."""
        ...


@runtime_checkable
class GpuRecordMetrics(Protocol):
    """A :class:`~hooks.LifecycleMetrics` that counts recovered actors whose live sandbox's
    GPUs differ from their logged allocation (optional, like :class:`GpuMetrics`)."""

    def gpu_record_mismatch(self, worker: str) -> None:
        """One such actor on ``worker``."""
        ...


@dataclass(frozen=True, slots=True)
class _Job:
    actor_id: str
    effect: str
    event: events.Event
    """The accepted event that entered the in-flight state."""


class Pipeline:
    """Accepts events into an :class:`ActorTable` and runs their effects."""

    def __init__(
        self,
        table: table.ActorTable,
        context: effects.EffectContext,
        *,
        timeouts: Mapping[str, float] | None = None,
        recorder: hooks.EventRecorder | None = None,
        metrics: hooks.LifecycleMetrics | None = None,
        observers: Iterable[Callable[[hooks.Transition], None]] = (),
        queue_size: int = 1024,
        concurrency: int = 64,
        effect_impls: Mapping[str, effects.Effect] = effects.EFFECTS,
        live: Iterable[allocation.LiveSandbox] = (),
    ) -> None:
        """``live``: the GPU sandboxes recovery found in the runtime (held whatever the
        log says: module doc)."""
        if queue_size < 1 or concurrency < 1:
            raise ValueError("queue_size and concurrency must be at least 1")
        self.table = table
        self._context = context
        self._timeouts = {**effects.DEFAULT_TIMEOUTS, **(timeouts or {})}
        self._recorder = recorder
        given: object = recorder
        self._group = given if isinstance(given, GroupCommitRecorder) else None
        self._flush_pending = False
        """A deferred outcome's bounded flush is scheduled (:meth:`_flush_soon`)."""
        self._metrics = metrics
        self._observers = list(observers)
        self._effects = effect_impls
        self._concurrency = concurrency
        self._queue_size = queue_size
        self._slots = anyio.Semaphore(queue_size)
        self._send: MemoryObjectSendStream[_Job] | None = None
        self._pending = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._broken: BaseException | None = None
        self._serving = False
        self._allocator = context.allocator
        self._holding = table.spec.gpu_holding_states
        self._leaving = table.spec.sandbox_leaving_states
        self._gpus_freed = anyio.Event()
        self._kept: dict[str, tuple[str, ...]] = {}
        """GPUs held beyond an actor's record: a sandbox of it that may still run has them."""
        self._cleaning: dict[str, anyio.Event] = {}
        """Actors whose leftover sandbox is being deleted (set when done)."""
        self._tg: TaskGroup | None = None
        if self._allocator is not None:
            self._keep_live(self._allocator, live)
            # The table is the projection of the actors' records (resumed ones included),
            # and of the sandboxes the runtime showed live.
            self._allocator.rebuild((a.actor_id, self._held(a)) for a in table)
            self._report_gpus()

    # --- lifecycle of the pipeline itself ---------------------------------------------------

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the effect workers until cancelled."""
        send, receive = anyio.create_memory_object_stream[_Job](self._queue_size)
        async with send, receive, anyio.create_task_group() as tg:
            for _ in range(self._concurrency):
                tg.start_soon(self._worker, receive)
            self._send = send
            self._serving = True
            self._tg = tg
            for actor_id in tuple(self._kept):
                actor = self.table.get(actor_id)
                if actor is not None and actor.state not in self._holding:
                    self._clean_up_soon(actor_id)
            if self._allocator is not None:
                # Actors resumed waiting for GPUs are offered the free ones once.
                self._gpus_freed.set()
                tg.start_soon(self._offer_freed_gpus)
            task_status.started()
            try:
                await anyio.sleep(math.inf)
            finally:
                self._serving = False
                self._send = None
                self._tg = None

    def add_observer(self, observer: Callable[[hooks.Transition], None]) -> None:
        """Call ``observer`` with every transition from now on."""
        self._observers.append(observer)

    def remove_observer(self, observer: Callable[[hooks.Transition], None]) -> None:
        """Stop calling ``observer``."""
        self._observers.remove(observer)

    @property
    def pending(self) -> int:
        """Effect chains queued or running."""
        return self._pending

    async def settle(self) -> None:
        """Wait until no effect is queued or running (every accepted event acted on) and
        every accepted event is durable."""
        while self._pending:
            await self._idle.wait()
        await self.durable()

    async def durable(self) -> None:
        """Return once every accepted event is durable (at once without a group-commit
        recorder: each was recorded before it was observed). Raises
        :class:`AgentClosedError` once the recorder failed."""
        self._check_not_broken()
        await self._until_durable()

    # --- accepting events -------------------------------------------------------------------

    def _check_not_broken(self) -> None:
        if self._broken is not None:
            raise errors.AgentClosedError(
                f"the agent stopped accepting events: its event recorder failed: {self._broken}"
            ) from self._broken

    def _check_open(self) -> None:
        if self._broken is not None:
            raise errors.AgentClosedError(
                f"the agent stopped accepting events: its event recorder failed: {self._broken}"
            ) from self._broken
        if not self._serving:
            raise errors.AgentClosedError(
                "the agent is not serving: use it inside `async with Agent(...) as agent:`"
            )

    async def submit(self, event: events.Event) -> table.Step:
        """Accept one external event (see the module docstring); the accepted step."""
        self._check_open()
        if not event.external:
            raise errors.InvalidEvent(
                event.actor_id,
                self.table.state_of(event.actor_id),
                event.type,
                "effect outcomes are produced by the agent's own effects; submit external "
                "events only",
            )
        # One scheduling point per submit, so effects progress under a fast producer.
        await anyio.lowlevel.checkpoint()
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            # Full: refuse an invalid event now rather than after the wait (re-checked below).
            try:
                self.table.check(event)
            except errors.InvalidEvent as e:
                await self._record_rejection(event, e)
                raise
            await self._slots.acquire()
        try:
            self._check_open()
            step = await self._apply(event)
        except BaseException as e:
            self._slots.release()
            if isinstance(e, errors.InvalidEvent):
                await self._record_rejection(event, e)
            raise
        if step.effect is None:
            self._slots.release()
        else:
            self._enqueue(_Job(event.actor_id, step.effect, step.event))
        return step

    async def submit_all(self, group: Sequence[events.Event]) -> list[table.Step]:
        """Accept external events in order, as :meth:`submit` does each, but wait once for
        all of them to be durable (one fsync with a group-commit recorder, instead of one
        each), then start their effects. An event refused raises :class:`InvalidEvent`
        once those accepted before it are durable and their effects queued: they stay
        accepted."""
        self._check_open()
        for event in group:
            if not event.external:
                raise errors.InvalidEvent(
                    event.actor_id,
                    self.table.state_of(event.actor_id),
                    event.type,
                    "effect outcomes are produced by the agent's own effects; submit external "
                    "events only",
                )
        await anyio.lowlevel.checkpoint()
        steps: list[table.Step] = []
        jobs: list[_Job] = []
        try:
            for event in group:
                await self._slots.acquire()
                try:
                    self._check_open()
                    step = await self._apply(event, durable=False)
                except BaseException as e:
                    self._slots.release()
                    if isinstance(e, errors.InvalidEvent):
                        await self._record_rejection(event, e)
                    raise
                steps.append(step)
                if step.effect is None:
                    self._slots.release()
                else:
                    jobs.append(_Job(event.actor_id, step.effect, step.event))
        finally:
            try:
                if steps:
                    await self._until_durable()
            finally:
                # Accepted is acted on (a broken recorder stops each chain before its effect).
                for job in jobs:
                    self._enqueue(job)
        return steps

    async def _record_rejection(self, event: events.Event, error: errors.InvalidEvent) -> None:
        recorder: object = self._recorder
        if not isinstance(recorder, RejectionRecorder):
            return
        try:
            with anyio.CancelScope(shield=True):
                await recorder.record_rejected(event, error.state, error.problem)
        except Exception as e:
            self._broken = e
            raise

    # --- resuming after a restart (recovery from the event log) -----------------------------

    async def reconcile(self, outcome: events.Event, *, act: bool = True) -> table.Step:
        """Accept an outcome that recovery established by asking the runtime.

        The outcome is recorded and observed like any other, and the effect its transition
        enters (e.g. ``start`` after ``sandbox_created``) is started: the chain continues
        where the crash interrupted it. ``act`` False: not started, as the runtime showed
        that effect done too and its outcome is reconciled next (a sandbox whose start ran
        before its ``sandbox_created`` was durable).
        """
        self._check_open()
        await self._slots.acquire()
        try:
            step = await self._apply(outcome)
        except BaseException:
            self._slots.release()
            raise
        if step.effect is None or not act:
            self._slots.release()
        else:
            self._enqueue(_Job(outcome.actor_id, step.effect, step.event))
        return step

    async def rerun(self, actor_id: str, cause: events.Event) -> None:
        """Start the effect of an actor recovered in its in-flight state.

        Recovery asks for this only where running the effect again is safe (it is
        idempotent, or the runtime proved the interrupted attempt had no effect).
        """
        self._check_open()
        actor = self.table.get(actor_id)
        effect = self.table.spec.effects.get(actor.state) if actor is not None else None
        if effect is None:
            raise ValueError(f"actor {actor_id!r} is not in an in-flight state: nothing to rerun")
        await self._slots.acquire()
        self._enqueue(_Job(actor_id, effect, cause))

    def _enqueue(self, job: _Job) -> None:
        if self._pending == 0:
            self._idle = anyio.Event()
        self._pending += 1
        assert self._send is not None
        # Never blocks: a slot is held for every job, and the buffer has one per slot.
        self._send.send_nowait(job)
        self._report_depth()

    async def _offer_freed_gpus(self) -> None:
        """Send ``gpus_freed`` to every actor waiting for GPUs, each time GPUs are freed."""
        while True:
            await self._gpus_freed.wait()
            self._gpus_freed = anyio.Event()
            waiting = [a.actor_id for a in self.table if a.state == "awaiting_gpus"]
            for actor_id in waiting:
                try:
                    await self.reconcile(events.GpusFreed(actor_id=actor_id))
                except errors.InvalidEvent:
                    continue  # it moved on meanwhile (deleted)
                except errors.AgentClosedError:
                    return

    # --- GPUs kept while a sandbox may still run (module doc) -------------------------------

    def _keep_live(
        self, allocator: allocation.GpuAllocator, live: Iterable[allocation.LiveSandbox]
    ) -> None:
        """Keep the GPUs injected in each live sandbox, reporting every difference from the
        log's record (a warning each, and the mismatch metric)."""
        metrics: object = self._metrics
        for found in live:
            actor = self.table.get(found.actor_id)
            if actor is None:
                continue
            gpus, unknown = allocator.worker.identify(found.injected)
            if unknown:
                _log.warning(
                    "a live sandbox has GPU devices this worker does not know (not held)",
                    worker=allocator.name,
                    actor_id=found.actor_id,
                    devices=list(unknown),
                )
            logged = allocation.held_by(actor, self._holding)
            if logged == allocation.EVERY_GPU:
                logged = allocator.worker.names
            logged = tuple(allocator.worker.aliases.get(d, d) for d in logged)
            if set(gpus) != set(logged):
                _log.warning(
                    "the GPUs injected in a live sandbox differ from those the event log "
                    "says its actor holds; the injected ones are held",
                    worker=allocator.name,
                    actor_id=found.actor_id,
                    state=actor.state,
                    logged=list(logged),
                    injected=list(gpus),
                    containers=list(found.containers),
                )
                if isinstance(metrics, GpuRecordMetrics):
                    metrics.gpu_record_mismatch(allocator.name)
            # Kept even when none is known: an actor that no longer holds GPUs gets its live
            # sandbox deleted (serve), like one that just left a holding state.
            self._kept[found.actor_id] = gpus

    def _held(self, actor: actors.Actor) -> tuple[str, ...]:
        """What ``actor`` holds: its record's GPUs, and those kept for its sandbox."""
        record = allocation.held_by(actor, self._holding)
        kept = self._kept.get(actor.actor_id)
        if not kept or record == allocation.EVERY_GPU or self._allocator is None:
            return record
        wanted = set(record) | set(kept)
        order = {n: i for i, n in enumerate(self._allocator.worker.names)}
        return tuple(sorted(wanted, key=lambda n: (order.get(n, len(order)), n)))

    def _clean_up_soon(self, actor_id: str) -> None:
        """Delete the actor's leftover sandbox in the background, then free what it kept."""
        if actor_id in self._cleaning or self._tg is None:
            return
        done = anyio.Event()
        self._cleaning[actor_id] = done
        if self._pending == 0:
            self._idle = anyio.Event()
        self._pending += 1
        self._tg.start_soon(self._clean_up, actor_id, done)

    async def _clean_up(self, actor_id: str, done: anyio.Event) -> None:
        gone = False
        try:
            actor = self.table.get(actor_id)
            if actor is not None and actor.state not in self._holding:
                with anyio.move_on_after(self._timeouts["delete"]):
                    gone = await effects.delete_leftover(self._context, actor.snapshot())
        finally:
            del self._cleaning[actor_id]
            done.set()
            self._pending -= 1
            if self._pending == 0:
                self._idle.set()
        if not gone:
            _log.warning(
                "a sandbox that may still run could not be deleted: its GPUs stay held "
                "until its next create, restore or delete",
                actor_id=actor_id,
                gpus=list(self._kept.get(actor_id, ())),
            )
            return
        if self._kept.pop(actor_id, None) is not None:
            self._hold_gpus(actor_id)

    def _hold_gpus(
        self,
        actor_id: str,
        source: str | None = None,
        event: events.Event | None = None,
        *,
        sandbox_may_run: bool = False,
    ) -> None:
        """Bring the allocation table up to date with ``actor_id``'s record (after ``event``,
        which moved it from ``source``), keeping GPUs a sandbox may still have
        (``sandbox_may_run``: whatever state the event entered)."""
        allocator = self._allocator
        actor = self.table.get(actor_id)
        if allocator is None or actor is None:
            return
        if isinstance(event, events.SandboxCreated | events.Restored):
            # The effect deleted what was left before making this sandbox.
            self._kept.pop(actor_id, None)
        if actor.state not in self._holding:
            if (
                source in self._holding
                and (actor.state in self._leaving or sandbox_may_run)
                and actor_id not in self._kept
            ):
                kept = allocator.held(actor_id)
                if kept:
                    self._kept[actor_id] = kept
            if actor_id in self._kept:
                self._clean_up_soon(actor_id)
        held = self._held(actor)
        before = allocator.allocated
        freed = allocator.hold(actor_id, held)
        if allocator.allocated != before or freed:
            self._report_gpus()
        if freed:
            self._gpus_freed.set()

    def _report_gpus(self) -> None:
        metrics: object = self._metrics
        if self._allocator is not None and isinstance(metrics, GpuMetrics):
            metrics.gpus_allocated(
                self._allocator.name, self._allocator.allocated, self._allocator.free
            )

    def _report_depth(self) -> None:
        if self._metrics is not None and self._send is not None:
            self._metrics.queue_depth(self._send.statistics().current_buffer_used)

    async def _apply(
        self, event: events.Event, *, durable: bool = True, sandbox_may_run: bool = False
    ) -> table.Step:
        """Apply ``event``, take it into the recorder's order, tell observers; then, unless
        ``durable`` is False (the caller waits later), wait until it is durable.
        ``sandbox_may_run``: keep the actor's GPUs whatever state the event entered."""
        step = self.table.apply(event)
        # Before any await: the next allocation decision must see this one.
        try:
            self._hold_gpus(
                step.event.actor_id, step.source, step.event, sandbox_may_run=sandbox_may_run
            )
        except errors.AllocationError as e:
            # Unreachable while grants come from the allocator: memory and table disagree.
            self._broken = e
            raise
        group = self._group
        if group is not None:
            try:
                group.append(step.event)
            except Exception as e:
                self._broken = e
                raise
        elif self._recorder is not None:
            # Shielded: once applied, the event must be recorded and acted on; a cancelled
            # submit must not leave an actor in flight with no effect queued.
            try:
                with anyio.CancelScope(shield=True):
                    await self._recorder.record(step.event)
            except Exception as e:
                self._broken = e
                raise
        self._observe(step)
        if group is not None and durable:
            await self._until_durable()
        return step

    async def _until_durable(self) -> None:
        """Wait until every appended event is durable (shielded, as recording is)."""
        if self._group is None:
            return
        try:
            with anyio.CancelScope(shield=True):
                await self._group.durable()
        except Exception as e:
            self._broken = e
            raise

    def _flush_soon(self) -> None:
        """Make what was appended durable within :data:`DEFERRED_WINDOW` (an outcome left to
        the next wait, when none comes)."""
        if self._flush_pending or self._tg is None:
            return
        self._flush_pending = True
        self._tg.start_soon(self._flush_deferred)

    async def _flush_deferred(self) -> None:
        try:
            await anyio.sleep(DEFERRED_WINDOW)
            self._flush_pending = False
            await self._until_durable()
        except Exception:  # noqa: BLE001 (the pipeline is marked broken; submit says why)
            _log.exception("making a deferred outcome durable failed")
        finally:
            self._flush_pending = False

    def _observe(self, step: table.Step) -> None:
        """Tell the log, the metrics and the observers of ``step`` (once it is in the
        recorder's order)."""
        accepted = step.event
        transition = hooks.Transition(
            actor_id=accepted.actor_id,
            source=step.source,
            dest=step.dest,
            trigger=accepted.type,
            event_type=accepted.type,
            at=accepted.at,
            reason=step.reason,
        )
        if step.refusal is not None or (step.reason is not None and step.dest != step.source):
            # Refusals and failures are what an operator looks for in the logs.
            _log.warning(
                "transition refused or failed",
                actor_id=accepted.actor_id,
                source=step.source,
                dest=step.dest,
                event_type=accepted.type,
                reason=step.reason,
            )
        metrics = self._metrics
        if metrics is not None:
            metrics.transition(step.source, step.dest, accepted.type)
            if step.refusal is not None:
                metrics.checkpoint_refused(step.refusal)
            devices = getattr(accepted, "devices", 0)
            if devices:
                metrics.devices_injected(devices)
        for observer in tuple(self._observers):
            try:
                observer(transition)
            except Exception:  # noqa: BLE001 (logged; see below)
                # An observer's bug must not wedge the lifecycle of every actor.
                _log.exception("transition observer failed", observer=repr(observer))

    # --- running effects --------------------------------------------------------------------

    async def _worker(self, receive: MemoryObjectReceiveStream[_Job]) -> None:
        async for job in receive:
            self._report_depth()
            try:
                await self._run_chain(job)
            finally:
                self._pending -= 1
                self._slots.release()
                if self._pending == 0:
                    self._idle.set()

    async def _run_chain(self, job: _Job) -> None:
        effect: str | None = job.effect
        cause = job.event
        while effect is not None and self._broken is None:
            while (cleaning := self._cleaning.get(job.actor_id)) is not None:
                await cleaning.wait()  # its old sandbox is being deleted: never beside it
            actor = self.table.get(job.actor_id)
            assert actor is not None
            view = actor.snapshot()
            timeout = self._timeouts[effect]
            started = time.monotonic()
            raised = False
            try:
                with anyio.fail_after(timeout):
                    outcome = await self._effects[effect](self._context, view, cause)
            except TimeoutError:
                outcome = events.EffectTimedOut(
                    actor_id=job.actor_id, effect=effect, seconds=timeout
                )
            except Exception as e:  # noqa: BLE001 (turned into a failure outcome)
                # Effects report expected failures as outcomes; anything else is a bug in a
                # collaborator. The actor must still land on an explicit failure transition.
                _log.exception("effect raised", effect=effect, actor_id=job.actor_id)
                outcome = effects.failure_outcome(effect, view, f"unexpected error: {e!r}")
                raised = True
            if self._metrics is not None:
                self._metrics.effect_finished(effect, outcome.type, time.monotonic() - started)
            deferred = outcome.type in registry.REDERIVED
            try:
                step = await self._apply(outcome, durable=not deferred, sandbox_may_run=raised)
            except errors.InvalidEvent:
                # The loader checks every in-flight state accepts its effect's outcomes.
                _log.exception("effect outcome refused by the machine", effect=effect)
                return
            except Exception:  # noqa: BLE001 (logged; the pipeline is marked broken)
                # The recorder failed: _apply marked the pipeline broken; submit says why.
                _log.exception("recording an effect outcome failed", effect=effect)
                return
            if deferred and step.effect is None:
                self._flush_soon()
            effect, cause = step.effect, step.event
