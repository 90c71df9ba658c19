"""When an accepted event is durable, with a recorder that group-commits (the event log's
``append`` + ``durable``): a group is durable together before its first effect; the
outcomes recovery derives again (``registry.REDERIVED``) are not waited for; nothing is
acted on, answered or left behind before it is durable (docs/event-log.md, "When an event
is durable")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import pytest

from lifecycle.doubles import FakeRuntime
from substrate_gpu.lifecycle import Agent, errors, events, hooks, pipeline, registry

pytestmark = pytest.mark.anyio

MakeAgent = Callable[..., Agent]


@dataclass
class GroupRecorder:
    """A group-committing recorder: ``durable`` makes everything appended durable at once,
    unless ``held`` (then it waits until released)."""

    appended: list[events.Event] = field(default_factory=list)
    durable_upto: int = 0
    """How many of ``appended`` are durable."""
    waits: int = 0
    """Calls of ``durable`` that found something not durable yet."""
    held: anyio.Event | None = None

    async def record(self, event: events.Event) -> None:
        self.append(event)
        await self.durable()

    def append(self, event: events.Event) -> None:
        self.appended.append(event)

    async def durable(self) -> None:
        if self.durable_upto == len(self.appended):
            return
        self.waits += 1
        upto = len(self.appended)
        if self.held is not None:
            await self.held.wait()
        self.durable_upto = max(self.durable_upto, upto)

    def is_durable(self, kind: str) -> bool:
        return any(e.type == kind for e in self.appended[: self.durable_upto])


def _cpu_group(actor_id: str = "a") -> list[events.Event]:
    return [
        events.ActorRegistered(actor_id=actor_id, gpu=False, bundle=f"/b/{actor_id}"),
        events.BundlePrepared(actor_id=actor_id, bundle=f"/b/{actor_id}"),
        events.RunRequested(actor_id=actor_id),
    ]


def test_the_event_log_is_a_group_commit_recorder() -> None:
    """The pipeline takes the group-commit path with the real event log."""
    from substrate_gpu.eventlog import EventLog

    assert issubclass(EventLog, pipeline.GroupCommitRecorder)


def test_the_outcomes_left_to_the_next_fsync_are_the_ones_recovery_derives_again() -> None:
    """What the pipeline does not wait for, the registry says, and checks (a fact in one
    place): only outcomes recovery derives from the runtime."""
    assert {"sandbox_created", "checkpoint_written"} == registry.REDERIVED
    assert registry.check_registry() == []


async def test_a_group_is_durable_together_before_its_first_effect(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """Registration, bundle and run request: one wait, all durable before ``create``."""
    recorder = GroupRecorder()
    durable_at_create: list[int] = []
    create = runtime.create

    async def noting_create(*args: object, **kwargs: object) -> None:
        durable_at_create.append(recorder.durable_upto)
        await create(*args, **kwargs)  # type: ignore[arg-type]

    runtime.create = noting_create  # type: ignore[method-assign]
    async with make_agent(recorder=recorder) as agent:
        transitions = await agent.submit_all(_cpu_group())
        assert recorder.waits == 1 and recorder.durable_upto == 3
        assert [t.dest for t in transitions] == ["registered", "bundle_prepared", "creating"]
        await agent.wait_for_state("a", "running", timeout=5)
    assert durable_at_create == [3]


async def test_a_refused_event_of_a_group_leaves_those_before_it_accepted_and_durable(
    make_agent: MakeAgent,
) -> None:
    """The refusal is raised once the accepted part of the group is durable."""
    recorder = GroupRecorder()
    group = [*_cpu_group()[:2], events.SuspendRequested(actor_id="a")]
    async with make_agent(recorder=recorder) as agent:
        with pytest.raises(errors.InvalidEvent, match="suspend_requested"):
            await agent.submit_all(group)
        assert agent.state_of("a") == "bundle_prepared"
    assert [e.type for e in recorder.appended] == ["actor_registered", "bundle_prepared"]
    assert recorder.durable_upto == 2


async def test_start_runs_without_waiting_for_sandbox_created(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """sandbox_created is rederived: ``start`` runs while its fsync has not come; the actor
    reaches running only once both outcomes are durable (one wait for both)."""
    recorder = GroupRecorder()
    async with make_agent(recorder=recorder) as agent:
        await agent.submit_all(_cpu_group())
        recorder.held = anyio.Event()
        with anyio.fail_after(5):
            while not runtime.ops("start"):
                await anyio.sleep(0.001)
        assert not recorder.is_durable("sandbox_created")
        waits = recorder.waits
        recorder.held.set()
        await agent.wait_for_state("a", "running", timeout=5)
        await agent.durable()
    assert recorder.is_durable("sandbox_started")
    assert recorder.waits == waits + 1  # sandbox_started's wait covered sandbox_created


async def test_an_outcome_starting_nothing_is_durable_within_the_window(
    make_agent: MakeAgent,
) -> None:
    """checkpoint_written is rederived and starts no effect: with no later wait to carry it,
    it is made durable within DEFERRED_WINDOW all the same."""
    recorder = GroupRecorder()
    async with make_agent(recorder=recorder) as agent:
        await agent.submit_all(_cpu_group())
        await agent.wait_for_state("a", "running", timeout=5)
        await agent.submit(events.SuspendRequested(actor_id="a"))
        await agent.wait_for_state("a", "suspended", timeout=5)
        with anyio.fail_after(pipeline.DEFERRED_WINDOW + 2):
            while not recorder.is_durable("checkpoint_written"):
                await anyio.sleep(0.005)


async def test_observers_are_told_in_order_before_the_fsync_and_settle_waits_for_it(
    make_agent: MakeAgent,
) -> None:
    """An observer sees a group's transitions in the order applied, even while its fsync
    has not come (a door waits for ``durable`` before it answers); ``settle`` returns only
    once everything is durable."""
    recorder = GroupRecorder(held=anyio.Event())
    seen: list[tuple[str, bool]] = []

    def observe(t: hooks.Transition) -> None:
        seen.append((t.dest, recorder.durable_upto == len(recorder.appended)))

    async with make_agent(recorder=recorder) as agent:
        agent.add_observer(observe)
        async with anyio.create_task_group() as tg:
            tg.start_soon(agent.submit_all, _cpu_group())
            with anyio.fail_after(5):
                while len(seen) < 3:
                    await anyio.sleep(0.001)
            assert seen == [
                ("registered", False),
                ("bundle_prepared", False),
                ("creating", False),
            ]
            settled = anyio.Event()

            async def settle() -> None:
                await agent.settle()
                settled.set()

            tg.start_soon(settle)
            await anyio.sleep(0.05)
            assert not settled.is_set()
            assert recorder.held is not None
            recorder.held.set()
        await agent.wait_for_state("a", "running", timeout=5)
        await agent.settle()
        assert recorder.durable_upto == len(recorder.appended)
        agent.remove_observer(observe)


async def test_without_a_group_commit_recorder_each_event_is_recorded_before_observed(
    make_agent: MakeAgent,
) -> None:
    """A plain recorder (``record`` only) is awaited for every event, outcomes included,
    before any observer hears of it: the behaviour before group commit."""
    recorded: list[str] = []
    seen: list[tuple[str, int]] = []

    class Plain:
        async def record(self, event: events.Event) -> None:
            await anyio.sleep(0)
            recorded.append(event.type)

    async with make_agent(recorder=Plain()) as agent:
        agent.add_observer(lambda t: seen.append((t.event_type, len(recorded))))
        await agent.submit_all(_cpu_group())
        await agent.wait_for_state("a", "running", timeout=5)
    assert [n for _, n in seen] == list(range(1, len(seen) + 1))
