"""The agent end to end on in-process doubles: lives, refusals, failures, timeouts, hooks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from support.umask import umask

from lifecycle.doubles import FakeInjector, FakeProbe, FakeRuntime, RecordingMetrics
from lifecycle.factories import bring_to_running
from substrate_gpu import exceptions
from substrate_gpu.lifecycle import Agent, errors, events, hooks

pytestmark = pytest.mark.anyio

MakeAgent = Callable[..., Agent]


async def test_gpu_actor_runs_with_gpus_injected_and_nvproxy(
    make_agent: MakeAgent, runtime: FakeRuntime, injector: FakeInjector
) -> None:
    """A GPU actor is injected, then created with --nvproxy, then started."""
    async with make_agent() as agent:
        await bring_to_running(agent, gpu=True)
    assert injector.calls == [Path("/b/a")]
    assert runtime.ops("create") == [("runsc", "--nvproxy", "create", "a")]
    assert runtime.ops("start") == [("runsc", "start", "a")]


async def test_cpu_actor_skips_injection_and_nvproxy(
    make_agent: MakeAgent, runtime: FakeRuntime, injector: FakeInjector
) -> None:
    """A CPU actor goes straight to create, without --nvproxy, and nothing is injected."""
    seen: list[str] = []
    async with make_agent(observers=[_Collect(seen)]) as agent:
        await bring_to_running(agent, gpu=False)
    assert injector.calls == []
    assert runtime.ops("create") == [("runsc", "create", "a")]
    assert "injecting" not in seen


class _Collect:
    def __init__(self, into: list[str]) -> None:
        self.into = into

    def on_transition(self, t: hooks.Transition) -> None:
        self.into.append(t.dest)


async def test_suspend_refused_while_context_observed_then_accepted_after_close(
    make_agent: MakeAgent, runtime: FakeRuntime, metrics: RecordingMetrics
) -> None:
    """Pool policy 'refuse': an observed context refuses the suspend at once (recorded);
    after the close it suspends."""
    async with make_agent() as agent:
        await agent.submit(
            events.ActorRegistered(actor_id="a", gpu=True, bundle="/b/a", suspend_policy="refuse")
        )
        await agent.submit(events.BundlePrepared(actor_id="a", bundle="/b/a"))
        await agent.submit(events.RunRequested(actor_id="a"))
        await agent.wait_for_state("a", "running", timeout=5)
        runtime.open_context("a")
        await agent.submit(events.CudaContextOpened(actor_id="a", pid=7))
        refused = await agent.submit(events.SuspendRequested(actor_id="a"))
        assert (refused.source, refused.dest) == ("running", "running")
        assert refused.reason is not None
        assert "1 live CUDA context" in refused.reason
        assert runtime.ops("checkpoint") == []
        runtime.close_context("a")
        await agent.submit(events.CudaContextClosed(actor_id="a", pid=7))
        await agent.submit(events.SuspendRequested(actor_id="a"))
        await agent.wait_for_state("a", "suspended", timeout=5)
        assert agent.actor("a").checkpoint is not None
    assert metrics.named("checkpoint_refused") == [(events.REFUSED_SUSPEND_POLICY,)]


async def test_observed_context_without_a_route_is_refused_after_probing(
    make_agent: MakeAgent, runtime: FakeRuntime, metrics: RecordingMetrics
) -> None:
    """Policy 'auto' on an agent without GPU settings: no route, so the probe refuses."""
    async with make_agent() as agent:
        await bring_to_running(agent)
        await agent.submit(events.CudaContextOpened(actor_id="a", pid=7))
        await agent.submit(events.SuspendRequested(actor_id="a"))
        await agent.settle()
        assert agent.state_of("a") == "running"
        assert "1 live CUDA context(s) observed" in (agent.actor("a").reason or "")
    assert runtime.ops("checkpoint") == []
    assert metrics.named("checkpoint_refused") == [(events.REFUSED_LIVE_CONTEXT_OBSERVED,)]


async def test_probe_finding_a_live_context_refuses_without_checkpointing(
    make_agent: MakeAgent, runtime: FakeRuntime, metrics: RecordingMetrics
) -> None:
    """A context the node agent did not report is found by the probe: refused, still running."""
    async with make_agent() as agent:
        await bring_to_running(agent)
        runtime.open_context("a")
        async with agent.subscribe() as transitions:
            await agent.submit(events.SuspendRequested(actor_id="a"))
            await agent.settle()
            last = [t async for t in _drain(transitions)][-1]
        assert agent.state_of("a") == "running"
        assert (last.trigger, last.dest) == ("checkpoint_refused", "running")
    assert runtime.ops("checkpoint") == []
    assert metrics.named("checkpoint_refused") == [(events.REFUSED_LIVE_CONTEXT_PROBED,)]


async def _drain(transitions: object) -> object:
    from substrate_gpu.lifecycle.agent import Subscription

    assert isinstance(transitions, Subscription)
    while transitions._buffer:
        yield await transitions.__anext__()


@pytest.mark.parametrize(
    ("leave_running", "state_after", "sandbox_status"),
    [
        pytest.param(True, "running", "running", id="leave-running-keeps-sandbox"),
        pytest.param(False, "stopped", "stopped", id="no-leave-running-records-stop"),
    ],
)
async def test_probe_miss_then_live_nvproxy_error_never_loses_the_actor(
    make_agent: MakeAgent,
    runtime: FakeRuntime,
    probe: FakeProbe,
    leave_running: bool,
    state_after: str,
    sandbox_status: str,
) -> None:
    """runsc's live-clients error after a probe miss is a refusal; the actor is kept."""
    runtime.leave_running = leave_running
    probe.blind = True
    async with make_agent() as agent:
        await bring_to_running(agent)
        runtime.open_context("a")
        await agent.submit(events.SuspendRequested(actor_id="a"))
        await agent.settle()
        actor = agent.actor("a")
    assert actor.state == state_after
    assert "live nvproxy clients" in (actor.reason or "")
    assert runtime.containers["a"].status == sandbox_status
    leave = ["--leave-running"] if leave_running else []
    assert runtime.ops("checkpoint") == [("runsc", "checkpoint", *leave, "a")]


async def test_stopped_actor_is_recoverable_from_its_last_checkpoint(
    make_agent: MakeAgent, runtime: FakeRuntime, probe: FakeProbe
) -> None:
    """After a checkpoint killed the sandbox, a restore brings back the last good image."""
    runtime.leave_running = False
    async with make_agent() as agent:
        await bring_to_running(agent)
        await agent.submit(events.SuspendRequested(actor_id="a"))
        await agent.wait_for_state("a", "suspended", timeout=5)
        good = agent.actor("a").checkpoint
        await agent.submit(events.RestoreRequested(actor_id="a"))
        await agent.wait_for_state("a", "running", timeout=5)
        probe.blind = True
        runtime.open_context("a")
        await agent.submit(events.SuspendRequested(actor_id="a"))
        await agent.wait_for_state("a", "stopped", timeout=5)
        assert agent.actor("a").checkpoint == good
        await agent.submit(events.RestoreRequested(actor_id="a"))
        await agent.wait_for_state("a", "running", timeout=5)
    restores = runtime.ops("restore")
    assert restores == [("runsc", "--nvproxy", "restore", "a")] * 2
    # The stopped container was deleted before the id was reused.
    assert ("runsc", "delete", "--force", "a") in runtime.ops("delete")


async def test_checkpoint_runtime_failure_with_leave_running_returns_to_running(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """A runtime error during checkpoint with --leave-running: the actor keeps running."""
    async with make_agent() as agent:
        await bring_to_running(agent, gpu=False)
        runtime.fail["checkpoint"] = "checkpoint failed: disk full"
        await agent.submit(events.SuspendRequested(actor_id="a"))
        await agent.settle()
        actor = agent.actor("a")
    assert actor.state == "running"
    assert "disk full" in (actor.reason or "")


async def test_restore_onto_another_worker_from_a_named_image(
    make_agent: MakeAgent, runtime: FakeRuntime, injector: FakeInjector, tmp_path: Path
) -> None:
    """A fresh worker restores an actor from an image taken elsewhere, re-injecting GPUs."""
    image = tmp_path / "elsewhere" / "a" / "9"
    image.mkdir(parents=True)
    (image / "checkpoint.img").write_text("a")
    async with make_agent() as agent:
        await agent.submit(events.ActorRegistered(actor_id="a", gpu=True, bundle="/b/a"))
        await agent.submit(events.BundlePrepared(actor_id="a", bundle="/b/a"))
        await agent.submit(
            events.RestoreRequested(actor_id="a", image_path=str(image), worker="w2")
        )
        await agent.wait_for_state("a", "running", timeout=5)
    assert injector.calls == [Path("/b/a")]
    assert runtime.ops("restore") == [("runsc", "--nvproxy", "restore", "a")]


async def test_injection_failure_fails_the_actor_with_the_reason(
    make_agent: MakeAgent, injector: FakeInjector
) -> None:
    """An injection error lands the actor in failed with the error's message."""
    injector.error = exceptions.InjectionError("while injecting GPUs into /b/a: no 'all' device")
    async with make_agent() as agent:
        await agent.submit(events.ActorRegistered(actor_id="a", gpu=True, bundle="/b/a"))
        await agent.submit(events.BundlePrepared(actor_id="a", bundle="/b/a"))
        await agent.submit(events.RunRequested(actor_id="a"))
        await agent.wait_for_state("a", "failed", timeout=5)
        assert "no 'all' device" in (agent.actor("a").reason or "")


async def test_retry_after_failure_runs_from_the_bundle(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """A failed create is retried from the bundle and then runs."""
    runtime.fail["create"] = "boom"
    async with make_agent() as agent:
        await agent.submit(events.ActorRegistered(actor_id="a", gpu=False, bundle="/b/a"))
        await agent.submit(events.BundlePrepared(actor_id="a", bundle="/b/a"))
        await agent.submit(events.RunRequested(actor_id="a"))
        await agent.wait_for_state("a", "failed", timeout=5)
        del runtime.fail["create"]
        await agent.submit(events.RetryRequested(actor_id="a"))
        await agent.wait_for_state("a", "running", timeout=5)


async def test_unexpected_effect_error_still_lands_on_a_failure_transition(
    make_agent: MakeAgent, injector: FakeInjector
) -> None:
    """A collaborator raising a non-substrate error fails the actor instead of the agent."""
    injector.error = ZeroDivisionError("bug")
    async with make_agent() as agent:
        await agent.submit(events.ActorRegistered(actor_id="a", gpu=True, bundle="/b/a"))
        await agent.submit(events.BundlePrepared(actor_id="a", bundle="/b/a"))
        await agent.submit(events.RunRequested(actor_id="a"))
        await agent.wait_for_state("a", "failed", timeout=5)
        assert "ZeroDivisionError" in (agent.actor("a").reason or "")


async def test_hung_effect_times_out_to_failed_while_other_actors_proceed(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """A runtime call that never returns fails its actor on timeout; others keep running."""
    async with make_agent(timeouts={"checkpoint": 0.2}) as agent:
        await bring_to_running(agent, "stuck", gpu=False)
        runtime.hang.add("checkpoint")
        await agent.submit(events.SuspendRequested(actor_id="stuck"))
        await bring_to_running(agent, "other", gpu=False)
        assert agent.state_of("stuck") == "checkpointing"
        await agent.wait_for_state("stuck", "failed", timeout=5)
        assert "checkpoint did not finish within 0.2s" in (agent.actor("stuck").reason or "")
        runtime.hang.clear()
        await agent.submit(events.DeleteRequested(actor_id="other"))
        await agent.wait_for_state("other", "deleted", timeout=5)


async def test_sandbox_exit_during_start_ends_stopped_not_running(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """An exit reported while start is in flight is noted; the actor ends stopped."""
    runtime.gates["start"] = anyio.Event()
    async with make_agent() as agent:
        await agent.submit(events.ActorRegistered(actor_id="a", gpu=False, bundle="/b/a"))
        await agent.submit(events.BundlePrepared(actor_id="a", bundle="/b/a"))
        await agent.submit(events.RunRequested(actor_id="a"))
        await agent.wait_for_state("a", "starting", timeout=5)
        noted = await agent.submit(events.SandboxExited(actor_id="a", status=3))
        assert (noted.source, noted.dest) == ("starting", "starting")
        runtime.gates["start"].set()
        await agent.wait_for_state("a", "stopped", timeout=5)
        assert agent.actor("a").reason == "sandbox exited with status 3"


async def test_submit_waits_when_the_queue_is_full(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """With every slot held by a running effect, submit awaits instead of queueing more."""
    runtime.hang.add("create")
    async with make_agent(queue_size=1, timeouts={"create": 0.5}) as agent:
        for actor_id in ("a", "b"):
            await agent.submit(events.ActorRegistered(actor_id=actor_id, gpu=False, bundle="/b"))
            await agent.submit(events.BundlePrepared(actor_id=actor_id, bundle="/b"))
        await agent.submit(events.RunRequested(actor_id="a"))
        with anyio.move_on_after(0.1) as scope:
            await agent.submit(events.RunRequested(actor_id="b"))
        assert scope.cancelled_caught
        assert agent.state_of("b") == "bundle_prepared"
        # Once the hung effect times out the slot frees and the submit goes through.
        with anyio.fail_after(5):
            await agent.submit(events.RunRequested(actor_id="b"))
        assert agent.state_of("a") == "failed"


async def test_invalid_submit_raises_and_changes_nothing(make_agent: MakeAgent) -> None:
    """Submitting an event the state refuses raises InvalidEvent; the actor is unchanged."""
    async with make_agent() as agent:
        await agent.submit(events.ActorRegistered(actor_id="a", gpu=True, bundle="/b/a"))
        before = agent.actor("a")
        with pytest.raises(errors.InvalidEvent, match="actor 'a' in state 'registered'"):
            await agent.submit(events.SuspendRequested(actor_id="a"))
        assert agent.actor("a") == before


async def test_outcome_events_cannot_be_submitted(make_agent: MakeAgent) -> None:
    """Effect outcomes come from the agent's effects, never from the caller."""
    async with make_agent() as agent:
        await agent.submit(events.ActorRegistered(actor_id="a", gpu=True, bundle="/b/a"))
        with pytest.raises(errors.InvalidEvent, match="submit external events only"):
            await agent.submit(events.SandboxStarted(actor_id="a"))


async def test_submit_outside_the_context_is_refused(make_agent: MakeAgent) -> None:
    """An agent that is not entered refuses events clearly."""
    agent = make_agent()
    with pytest.raises(errors.AgentClosedError, match="async with Agent"):
        await agent.submit(events.ActorRegistered(actor_id="a", gpu=True, bundle="/b/a"))


async def test_recorder_sees_each_event_before_its_effect_starts(
    make_agent: MakeAgent, injector: FakeInjector
) -> None:
    """The run_requested event is recorded before the injector is called."""
    recorded: list[events.Event] = []
    seen_at_injection: list[list[str]] = []

    class Recorder:
        async def record(self, event: events.Event) -> None:
            recorded.append(event)

    async def inject(bundle: Path) -> int:
        seen_at_injection.append([e.type for e in recorded])
        return 1

    async with make_agent(recorder=Recorder(), injector=inject) as agent:
        await bring_to_running(agent)
    assert seen_at_injection == [
        ["actor_registered", "bundle_prepared", "run_requested", "gpus_allocated"]
    ]
    assert [e.seq for e in recorded] == list(range(1, len(recorded) + 1))


async def test_recorder_failure_stops_the_agent_accepting(make_agent: MakeAgent) -> None:
    """When the event log cannot record, later submits fail with the cause named."""

    class Broken:
        async def record(self, event: events.Event) -> None:
            raise OSError("disk full")

    async with make_agent(recorder=Broken()) as agent:
        with pytest.raises(OSError, match="disk full"):
            await agent.submit(events.ActorRegistered(actor_id="a", gpu=True, bundle="/b/a"))
        with pytest.raises(errors.AgentClosedError, match="event recorder failed: disk full"):
            await agent.submit(events.ActorRegistered(actor_id="b", gpu=True, bundle="/b/b"))


async def test_metrics_report_transitions_effects_devices_and_queue(
    make_agent: MakeAgent, metrics: RecordingMetrics
) -> None:
    """Every hook of the metrics protocol is called during a GPU actor's run."""
    async with make_agent() as agent:
        await bring_to_running(agent)
    assert ("bundle_prepared", "allocating", "run_requested") in metrics.named("transition")
    assert ("allocating", "injecting", "gpus_allocated") in metrics.named("transition")
    assert ("inject", "gpu_injected") in metrics.named("effect_finished")
    assert metrics.named("devices_injected") == [(2,)]
    assert metrics.named("queue_depth")


async def test_state_counts_follow_every_actor(make_agent: MakeAgent) -> None:
    """state_counts matches a recount of the actors' states."""
    async with make_agent() as agent:
        await bring_to_running(agent, "a")
        await agent.submit(events.ActorRegistered(actor_id="b", gpu=False, bundle="/b/b"))
        counts = agent.state_counts()
    assert counts["running"] == 1
    assert counts["registered"] == 1
    assert sum(counts.values()) == 2


async def test_slow_subscriber_is_disconnected_not_waited_for(make_agent: MakeAgent) -> None:
    """A subscriber that does not read is cut off with SubscriptionOverflow; the agent goes on."""
    async with make_agent() as agent, agent.subscribe(buffer=2) as transitions:
        await bring_to_running(agent)
        assert agent.state_of("a") == "running"
        received = [await transitions.__anext__(), await transitions.__anext__()]
        with pytest.raises(errors.SubscriptionOverflow, match="fell behind its buffer of 2"):
            await transitions.__anext__()
    assert [t.dest for t in received] == ["registered", "bundle_prepared"]
    assert transitions.dropped == 1


async def test_subscriber_receives_transitions_in_order(make_agent: MakeAgent) -> None:
    """A subscriber sees one actor's transitions in the order they happened."""
    async with make_agent() as agent:
        async with agent.subscribe() as transitions:
            await bring_to_running(agent, gpu=False)
            got = []
            async for t in transitions:
                got.append((t.source, t.dest))
                if t.dest == "running":
                    break
    assert got == [
        ("new", "registered"),
        ("registered", "bundle_prepared"),
        ("bundle_prepared", "creating"),
        ("creating", "starting"),
        ("starting", "running"),
    ]


async def test_wait_for_state_times_out_with_the_current_state(make_agent: MakeAgent) -> None:
    """Waiting for a state that never comes raises StateWaitTimeout naming where it is."""
    async with make_agent() as agent:
        await agent.submit(events.ActorRegistered(actor_id="a", gpu=True, bundle="/b/a"))
        with pytest.raises(errors.StateWaitTimeout, match="it is 'registered'"):
            await agent.wait_for_state("a", "running", timeout=0.05)


async def test_waiting_for_running_ends_at_once_when_the_create_fails(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """``wait_for_state(…, "running", timeout=60)``: the create fails, the actor rests in
    ``failed``, and the wait ends then (StateUnreachable, a StateWaitTimeout) with its reason."""
    runtime.fail["create"] = "no space left on the sandbox's device"
    async with make_agent() as agent:
        await agent.submit(events.ActorRegistered(actor_id="a", gpu=False, bundle="/b/a"))
        await agent.submit(events.BundlePrepared(actor_id="a", bundle="/b/a"))
        await agent.submit(events.RunRequested(actor_id="a"))
        with anyio.fail_after(5), pytest.raises(errors.StateUnreachable) as raised:
            await agent.wait_for_state("a", "running", timeout=60)
    assert isinstance(raised.value, errors.StateWaitTimeout)
    message = str(raised.value)
    assert "it is 'failed'" in message and "no space left on the sandbox's device" in message


async def test_a_wait_begun_after_the_failure_ends_at_once(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """The actor failed before the wait began: no waiting at all."""
    runtime.fail["create"] = "boom"
    async with make_agent() as agent:
        await agent.submit(events.ActorRegistered(actor_id="a", gpu=False, bundle="/b/a"))
        await agent.submit(events.BundlePrepared(actor_id="a", bundle="/b/a"))
        await agent.submit(events.RunRequested(actor_id="a"))
        await agent.settle()
        assert agent.state_of("a") == "failed"
        with anyio.fail_after(1), pytest.raises(errors.StateUnreachable, match="boom"):
            await agent.wait_for_state("a", "running", timeout=60)


async def test_waiting_for_suspended_ends_when_the_suspend_is_refused(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """Probed, a live context without a route: back to ``running`` with the refusal as its
    reason; a wait for ``suspended`` ends there, naming it."""
    async with make_agent() as agent:
        await bring_to_running(agent, gpu=True)
        runtime.open_context("a")
        await agent.submit(events.CudaContextOpened(actor_id="a", pid=7))
        await agent.submit(events.SuspendRequested(actor_id="a"))
        with anyio.fail_after(5), pytest.raises(errors.StateUnreachable) as raised:
            await agent.wait_for_state("a", "suspended", timeout=60)
    assert "it is 'running'" in str(raised.value) and "live GPU handle" in str(raised.value)


async def test_an_actor_at_rest_without_a_reason_is_still_waited_for(
    make_agent: MakeAgent,
) -> None:
    """Waiting first, then sending the event: ``bundle_prepared`` (and a re-unpack noted
    there) is not given up on; the wait ends when the run gets there."""
    async with make_agent() as agent:
        await agent.submit(events.ActorRegistered(actor_id="a", gpu=False, bundle="/b/a"))
        await agent.submit(events.BundlePrepared(actor_id="a", bundle="/b/a"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: agent.wait_for_state("a", "running", timeout=5))
            await anyio.sleep(0.05)
            await agent.submit(events.BundlePrepared(actor_id="a", bundle="/b/a"))
            await agent.submit(events.RunRequested(actor_id="a"))
        assert agent.state_of("a") == "running"


async def test_delete_removes_the_sandbox(make_agent: MakeAgent, runtime: FakeRuntime) -> None:
    """Deleting a running actor deletes its container and ends in deleted."""
    async with make_agent() as agent:
        await bring_to_running(agent)
        await agent.submit(events.DeleteRequested(actor_id="a"))
        await agent.wait_for_state("a", "deleted", timeout=5)
    assert "a" not in runtime.containers


async def test_leaving_the_agent_cancels_running_effects(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """Closing the agent cancels a hung effect promptly; the actor stays in flight."""
    runtime.hang.add("create")
    with anyio.fail_after(5):
        async with make_agent() as agent:
            await agent.submit(events.ActorRegistered(actor_id="a", gpu=False, bundle="/b"))
            await agent.submit(events.BundlePrepared(actor_id="a", bundle="/b"))
            await agent.submit(events.RunRequested(actor_id="a"))
            await anyio.sleep(0.01)
    assert agent.state_of("a") == "creating"


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


async def test_a_checkpoint_is_private_under_umask_022_whatever_the_runtime_wrote(
    make_agent: MakeAgent, tmp_path: Path
) -> None:
    """The runtime writes its image 0644 under umask 022; before ``checkpoint_written`` the
    directories made for it are 0700 and its files 0600 (they hold the sandbox's memory)."""
    with umask(0o022):
        async with make_agent() as agent:
            await bring_to_running(agent, gpu=False)
            await agent.submit(events.SuspendRequested(actor_id="a"))
            await agent.wait_for_state("a", "suspended", timeout=5)
            view = agent.actor("a")
    assert view is not None and view.checkpoint is not None
    image = Path(view.checkpoint)
    assert (image.parent.parent, image.parent) == (
        tmp_path / "checkpoints",
        tmp_path / "checkpoints" / "a",
    )
    assert [_mode(p) for p in (image.parent.parent, image.parent, image)] == [0o700] * 3
    files = {p.name: _mode(p) for p in image.iterdir()}
    assert "checkpoint.img" in files and set(files.values()) == {0o600}, files


async def test_a_chosen_image_directory_keeps_its_mode_and_its_files_are_private(
    make_agent: MakeAgent, tmp_path: Path
) -> None:
    """A suspend's ``image_path`` that exists is the caller's: its mode is left alone."""
    chosen = tmp_path / "chosen"
    chosen.mkdir(mode=0o755)
    with umask(0o022):
        async with make_agent() as agent:
            await bring_to_running(agent, gpu=False)
            await agent.submit(events.SuspendRequested(actor_id="a", image_path=str(chosen)))
            await agent.wait_for_state("a", "suspended", timeout=5)
    assert _mode(chosen) == 0o755
    assert _mode(chosen / "checkpoint.img") == 0o600


async def test_an_image_directory_that_cannot_be_made_fails_the_checkpoint_before_runsc(
    make_agent: MakeAgent, runtime: FakeRuntime, tmp_path: Path
) -> None:
    """A file where the checkpoint root should be: checkpoint_failed naming the directory,
    no checkpoint asked of the runtime, the actor still running."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    async with make_agent(checkpoint_root=blocker) as agent:
        await bring_to_running(agent, gpu=False)
        await agent.submit(events.SuspendRequested(actor_id="a"))
        await agent.wait_for_state("a", "running", timeout=5)
        await agent.settle()
        actor = agent.actor("a")
    assert actor is not None and actor.state == "running"
    assert f"while making checkpoint directory {blocker}/a/" in (actor.reason or "")
    assert runtime.ops("checkpoint") == []
