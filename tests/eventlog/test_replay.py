"""Replay: the same states and transitions as the live agent, deterministically, no effects."""

from __future__ import annotations

import contextlib
from pathlib import Path
from tempfile import TemporaryDirectory

import anyio
import hypothesis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lifecycle.doubles import FakeInjector, FakeProbe, FakeRuntime

from eventlog import logs
from substrate_gpu import eventlog
from substrate_gpu.eventlog import EventLog, replay
from substrate_gpu.eventlog.replayer import Replayer
from substrate_gpu.lifecycle import Agent, errors, events

ACTORS = ("a0", "a1", "a2")
ACTIONS = (
    "register_gpu", "register_cpu", "bundle", "run", "suspend", "suspend", "restore", "retry",
    "delete", "open", "open", "close", "exit", "settle", "break_create", "fix_create",
)  # fmt: skip


async def _act(agent: Agent, runtime: FakeRuntime, actor_id: str, action: str) -> None:
    container = runtime.containers.get(actor_id)
    running = container is not None and container.status == "running"
    event: events.Event | None = {
        "register_gpu": events.ActorRegistered(
            actor_id=actor_id, gpu=True, bundle=f"/b/{actor_id}"
        ),
        "register_cpu": events.ActorRegistered(
            actor_id=actor_id, gpu=False, bundle=f"/b/{actor_id}"
        ),
        "bundle": events.BundlePrepared(actor_id=actor_id, bundle=f"/b/{actor_id}"),
        "run": events.RunRequested(actor_id=actor_id),
        "suspend": events.SuspendRequested(actor_id=actor_id),
        "restore": events.RestoreRequested(actor_id=actor_id),
        "retry": events.RetryRequested(actor_id=actor_id),
        "delete": events.DeleteRequested(actor_id=actor_id),
    }.get(action)
    if action == "open" and running:
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
    if event is not None:
        # A refusal is logged as a rejection; replay must reproduce it.
        with contextlib.suppress(errors.InvalidEvent):
            await agent.submit(event)


async def _random_run(
    steps: list[tuple[int, str]], rotate_bytes: int | None, tmp: Path
) -> tuple[dict[str, object], list[object], Path, int]:
    runtime = FakeRuntime()
    collector = logs.Collector()
    path = tmp / "events.jsonl"
    async with await EventLog.open(path, rotate_bytes=rotate_bytes) as log:
        async with Agent(
            runtime=runtime,
            probe=FakeProbe(runtime),
            injector=FakeInjector(),
            checkpoint_root=tmp / "checkpoints",
            recorder=log,
            observers=[collector],
            concurrency=2,
            queue_size=3,
        ) as agent:
            for index, action in steps:
                await _act(agent, runtime, ACTORS[index], action)
            await agent.settle()
            live = {a: agent.actor(a) for a in ACTORS if agent.actor(a) is not None}
        rotations = log.rotations
    return live, collector.transitions, path, rotations


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(st.integers(0, len(ACTORS) - 1), st.sampled_from(ACTIONS)), max_size=50
    ),
    rotate_bytes=st.sampled_from([None, 700, 3000]),
)
def test_replaying_any_run_gives_exactly_the_live_states(
    steps: list[tuple[int, str]], rotate_bytes: int | None
) -> None:
    """Property: every actor's replayed view equals the live agent's, field for field, with
    or without rotations; the transition sequence is the one the agent's observers saw
    (its tail since the last snapshot, after a rotation)."""
    with TemporaryDirectory() as tmp:
        live, seen, path, rotations = anyio.run(_random_run, steps, rotate_bytes, Path(tmp))
        result = replay(path)
        hypothesis.event(f"rotated: {rotations > 0}")
        hypothesis.event(f"refusals: {bool(result.rejections)}")
        assert result.actors == live
        if rotations == 0:
            assert result.transitions == seen
        else:
            assert result.transitions == seen[len(seen) - len(result.transitions) :]
        # Deterministic: the same log, the same states and the same transitions.
        again = replay(path)
        assert (again.actors, again.transitions) == (result.actors, result.transitions)


@pytest.mark.anyio
async def test_replay_runs_no_effect(log_path: Path, tmp_path: Path) -> None:
    """Outcomes are read from the log: the runtime is never asked anything."""
    live = await logs.short_life(log_path, tmp_path)
    result = replay(log_path)
    assert result.actors == live
    assert result.actors["g1"].state == "suspended" and result.actors["g2"].state == "running"
    assert result.actors["c1"].state == "deleted"


@pytest.mark.anyio
async def test_replay_of_one_actor_sees_only_its_events(log_path: Path, tmp_path: Path) -> None:
    """--actor: the actor's own transitions, the same final state as a full replay."""
    await logs.short_life(log_path, tmp_path)
    full = replay(log_path)
    one = replay(log_path, actor="g2")
    assert list(one.actors) == ["g2"] and one.actors["g2"] == full.actors["g2"]
    assert one.transitions == [t for t in full.transitions if t.actor_id == "g2"]
    assert ("running", "running", "suspend_requested") in [
        (t.source, t.dest, t.trigger) for t in one.transitions
    ]


@pytest.mark.anyio
async def test_a_logged_refusal_is_reproduced(log_path: Path, tmp_path: Path) -> None:
    """An event refused live is refused again on replay, in the same state."""
    runtime = FakeRuntime()
    async with await EventLog.open(log_path) as log:
        async with Agent(
            runtime=runtime,
            probe=FakeProbe(runtime),
            injector=FakeInjector(),
            checkpoint_root=tmp_path,
            recorder=log,
        ) as agent:
            await agent.submit(events.ActorRegistered(actor_id="a", gpu=False, bundle="/b"))
            with pytest.raises(errors.InvalidEvent):
                await agent.submit(events.SuspendRequested(actor_id="a"))
    result = replay(log_path)
    assert [(r.event.type, r.state) for r in result.rejections] == [
        ("suspend_requested", "registered")
    ]


def test_an_accepted_event_the_machine_now_refuses_is_a_divergence(log_path: Path) -> None:
    """A log from another machine definition is not silently replayed into other states."""
    bad = events.RunRequested(actor_id="a", seq=2, at=1.0).to_json()
    logs.write_lines(log_path, logs.header(), logs.registered("a", 1), bad)
    with pytest.raises(
        eventlog.ReplayDivergence, match=r"events.jsonl:3: the logged event was accepted"
    ):
        replay(log_path)


def test_a_refusal_the_machine_now_accepts_is_a_divergence(log_path: Path) -> None:
    """A rejection record must be reproduced, or replay says where it differs."""
    rejected = eventlog.Rejection(
        event=events.ActorRegistered(actor_id="b", gpu=False, bundle="/b", at=1.0),
        state="new",
        problem="x",
    ).to_json()
    logs.write_lines(log_path, logs.header(), logs.registered("a", 1), rejected)
    with pytest.raises(
        eventlog.ReplayDivergence, match=":3: the event 'actor_registered' was refused"
    ):
        replay(log_path)


def test_a_divergence_in_one_actors_replay_names_its_line_in_the_whole_log(
    log_path: Path,
) -> None:
    """--actor replays a subset of the lines; the line named is still the log's own."""
    bad = events.RunRequested(actor_id="b", seq=4, at=1.0).to_json()
    logs.write_lines(
        log_path, logs.header(), logs.registered("a", 1), logs.registered("b", 2),
        logs.registered("c", 3), bad,
    )  # fmt: skip
    with pytest.raises(eventlog.ReplayDivergence, match=r"events.jsonl:5: the logged event"):
        replay(log_path, actor="b")


@pytest.mark.anyio
async def test_replayed_state_counts_equal_a_recount_and_stay_right_after(
    log_path: Path, tmp_path: Path
) -> None:
    """Replay moves actors without counting them per event; the table's counts, asked for
    afterwards, are a recount, and later live applies keep them right."""
    await logs.short_life(log_path, tmp_path)
    replayer = Replayer()
    replayer.feed(log_path, eventlog.read_log(log_path).records)
    counts = replayer.table.state_counts()
    assert {s: n for s, n in counts.items() if n} == {"suspended": 1, "running": 1, "deleted": 1}
    replayer.apply(events.DeleteRequested(actor_id="g2", seq=replayer.last_seq + 1))
    after = replayer.table.state_counts()
    assert (after["running"], after["deleting"]) == (0, 1)
    assert sum(after.values()) == len(replayer)
