"""Properties over random interleavings of events and effects across many actors."""

from __future__ import annotations

import collections
from pathlib import Path
from tempfile import TemporaryDirectory

import anyio
import hypothesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifecycle.doubles import FakeInjector, FakeProbe, FakeRuntime
from lifecycle.factories import make_event
from substrate_gpu.eventlog import format
from substrate_gpu.eventlog.replayer import Replayer, TransitionList
from substrate_gpu.lifecycle import Agent, errors, events, machine, table

SPEC = machine.load_spec()
ACTORS = ("a0", "a1", "a2", "a3")
ACTIONS = (
    "register_gpu", "register_cpu", "bundle", "run", "suspend", "restore", "retry", "delete",
    "open", "close", "exit", "settle", "break_create", "fix_create",
)  # fmt: skip
#: Steps drawn from; the suspend/context actions repeat so refusals happen often.
WEIGHTED = (*ACTIONS, "suspend", "suspend", "open", "open", "close", "restore", "restore")
IN_FLIGHT = set(SPEC.effects)


def _check_invariants(agent: Agent, runtime: FakeRuntime) -> None:
    views = [agent.actor(a) for a in ACTORS if agent.actor(a) is not None]
    for view in views:
        assert view is not None
        if view.state == "suspended":
            # No actor is suspended while a CUDA context of its sandbox is live.
            assert runtime.live.get(view.actor_id, 0) == 0, view
            assert view.live_contexts == 0, view
        assert view.live_contexts >= 0, view
    recount = collections.Counter(v.state for v in views if v is not None)
    counts = agent.state_counts()
    # Every actor is in exactly one state, and the incremental counts equal a recount.
    assert {s: n for s, n in counts.items() if n} == dict(recount)
    assert sum(counts.values()) == len(views) == len(agent)


async def _act(agent: Agent, runtime: FakeRuntime, actor_id: str, action: str) -> None:
    container = runtime.containers.get(actor_id)
    running = container is not None and container.status == "running"
    event: events.Event | None = None
    if action in {"register_gpu", "register_cpu"}:
        event = events.ActorRegistered(
            actor_id=actor_id, gpu=action == "register_gpu", bundle=f"/b/{actor_id}"
        )
    elif action == "bundle":
        event = events.BundlePrepared(actor_id=actor_id, bundle=f"/b/{actor_id}")
    elif action == "run":
        event = events.RunRequested(actor_id=actor_id)
    elif action == "suspend":
        event = events.SuspendRequested(actor_id=actor_id)
    elif action == "restore":
        event = events.RestoreRequested(actor_id=actor_id)
    elif action == "retry":
        event = events.RetryRequested(actor_id=actor_id)
    elif action == "delete":
        event = events.DeleteRequested(actor_id=actor_id)
    elif action == "open" and running:
        runtime.open_context(actor_id)
        event = events.CudaContextOpened(actor_id=actor_id)
    elif action == "close" and runtime.live.get(actor_id, 0):
        runtime.close_context(actor_id)
        event = events.CudaContextClosed(actor_id=actor_id)
    elif action == "exit" and running:
        runtime.exit_sandbox(actor_id)
        event = events.SandboxExited(actor_id=actor_id, status=137)
    elif action == "settle":
        await agent.settle()
    elif action == "break_create":
        runtime.fail["create"] = "create failed"
    elif action == "fix_create":
        runtime.fail.pop("create", None)
    if event is None:
        return
    # With no effect in flight, nothing but this submit can change the actor.
    quiet = agent.pending_effects == 0
    before = agent.actor(actor_id)
    try:
        await agent.submit(event)
    except errors.InvalidEvent:
        # A refused event leaves the actor exactly as it was.
        if quiet:
            assert agent.actor(actor_id) == before


async def _scenario(
    gpus: list[bool], steps: list[tuple[int, str]], leave_running: bool, blind: bool
) -> None:
    runtime = FakeRuntime(leave_running=leave_running)
    probe = FakeProbe(runtime, blind=blind)
    with TemporaryDirectory() as tmp:
        async with Agent(
            runtime=runtime,
            probe=probe,
            injector=FakeInjector(),
            checkpoint_root=Path(tmp),
            concurrency=3,
            queue_size=4,
        ) as agent:
            # Every actor starts registered and running, so the steps explore later states.
            for actor_id, gpu in zip(ACTORS, gpus, strict=True):
                await _act(agent, runtime, actor_id, "register_gpu" if gpu else "register_cpu")
                await _act(agent, runtime, actor_id, "bundle")
                await _act(agent, runtime, actor_id, "run")
            for index, action in steps:
                await _act(agent, runtime, ACTORS[index], action)
                _check_invariants(agent, runtime)
            await agent.settle()
            _check_invariants(agent, runtime)
            # With effects that never hang, nothing is left in flight.
            assert not [a for a in ACTORS if agent.state_of(a) in IN_FLIGHT]
            for state in {agent.state_of(a) for a in ACTORS}:
                hypothesis.event(f"an actor ends {state}")
            for call in runtime.calls:
                hypothesis.event(f"runtime {call[0]}")
            if any(c[0] == "checkpoint" for c in runtime.calls) and any(runtime.live.values()):
                hypothesis.event("checkpoint with a live context somewhere")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpus=st.lists(st.booleans(), min_size=len(ACTORS), max_size=len(ACTORS)),
    steps=st.lists(
        st.tuples(st.integers(0, len(ACTORS) - 1), st.sampled_from(WEIGHTED)), max_size=60
    ),
    leave_running=st.booleans(),
    blind=st.booleans(),
)
def test_random_interleavings_keep_the_invariants(
    gpus: list[bool], steps: list[tuple[int, str]], leave_running: bool, blind: bool
) -> None:
    """No actor suspended with a live context; one state each; counts equal a recount."""
    anyio.run(_scenario, gpus, steps, leave_running, blind)


def _outcome(actor_table: table.ActorTable, event: events.Event) -> tuple[object, ...]:
    try:
        step = actor_table.apply(event)
    except errors.InvalidEvent as e:
        return ("refused", e.state, e.problem)
    return (step.source, step.dest, step.effect, step.reason, step.refusal, step.event.seq)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), length=st.integers(0, 100), cut=st.integers(0, 100))
def test_the_interpreter_agrees_with_the_transitions_reference(
    data: st.DataObject, length: int, cut: int
) -> None:
    """Live apply, check, replay of the log (rejections included) and replay resumed from a
    snapshot all give what transitions' Machine gives, event by event and at the end.

    Events are drawn mostly among those the actor's state accepts (so streams reach deep
    states), sometimes among every type (refusals)."""
    reference = table.ActorTable(SPEC, machine.TransitionsEngine(SPEC))
    live = table.ActorTable(SPEC)
    records: list[events.Event | format.Rejection] = []
    steps: list[tuple[object, ...]] = []
    for _ in range(length):
        actor_id = data.draw(st.sampled_from(ACTORS[:2]))
        accepted = sorted(SPEC.accepts[reference.state_of(actor_id)])
        any_type = not accepted or data.draw(st.integers(0, 9)) == 0
        event_type = data.draw(st.sampled_from(sorted(events.REGISTRY) if any_type else accepted))
        flag, survived = data.draw(st.booleans()), data.draw(st.booleans())
        route = data.draw(st.sampled_from(("", events.ROUTE_EXEC, events.ROUTE_RUNSC)))
        fields: dict[str, object] = {
            "gpu": flag,
            "sandbox_survived": survived,
            "pid": data.draw(st.sampled_from((0, 7, 9))),
            "route": route or events.ROUTE_EXEC,
            "cuda_route": route,
        }
        if event_type == "restore_requested":
            fields["image_path"] = data.draw(st.sampled_from((None, "/ck/1", "/ck/2")))
        event = make_event(event_type, actor_id, **fields)
        try:
            live.check(event)
            checked: tuple[object, ...] = ("accepted",)
        except errors.InvalidEvent as e:
            checked = ("refused", e.state, e.problem)
        expected = _outcome(reference, event)
        assert _outcome(live, event) == expected
        if expected[0] == "refused":
            assert checked == expected
            records.append(
                format.Rejection(event=event, state=str(expected[1]), problem=str(expected[2]))
            )
        else:
            assert checked == ("accepted",)
            records.append(event.stamped(int(str(expected[-1]))))
            steps.append((actor_id, expected[0], expected[1], expected[3]))
            hypothesis.event(f"reached {expected[1]}")
        for a in ACTORS[:2]:
            ours, theirs = live.get(a), reference.get(a)
            assert (ours and ours.snapshot()) == (theirs and theirs.snapshot())
    final = {a.actor_id: a.snapshot() for a in reference}

    replayed = Replayer(SPEC)
    transitions = TransitionList()
    replayed.feed(Path("log"), records, transitions, [])
    assert replayed.views() == final
    assert [(t.actor_id, t.source, t.dest, t.reason) for t in transitions] == steps

    first = Replayer(SPEC)
    first.feed(Path("log"), records[:cut])
    resumed = Replayer(SPEC)
    resumed.load_views(first.views().values(), first.last_seq)
    resumed.feed(Path("log"), records[cut:])
    assert resumed.views() == final
