"""Suspending GPU actors that hold a live CUDA context, scenario by scenario.

Each scenario drives the Agent over the runsc stand-in (real runc containers), the fd-scan
probe and the cuda-checkpoint stand-in, records every event in an event log, and ends with
the actor alive (running, or suspended with its checkpoint) and the log replaying to the
same actor. The container's pid 1 holds ``/dev/nvidia0`` open: a live CUDA client.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from cudackpt.sandbox import TOOL_IN_CONTAINER

from gpu_suspend.conftest import DRIVER, World
from substrate_gpu import preflight
from substrate_gpu.eventlog import EventLog, replay
from substrate_gpu.lifecycle import Agent, events, hooks
from substrate_gpu.lifecycle.actors import ActorView
from substrate_gpu.lifecycle.gpu import exec_tool
from substrate_gpu.probes.fd_scan import FdScanProbe
from substrate_gpu.runsc import api as runsc

pytestmark = [pytest.mark.anyio, pytest.mark.runc]

WAIT = 30
#: The actor (and container) id: unique per run, since runc's default cgroup path is named
#: after the container id and `runc ps` lists by cgroup (a concurrent run's "a" would show).
A = f"gs-{secrets.token_hex(4)}"


class Seen:
    """Every transition, as (source, dest, trigger), and the refusals counted."""

    def __init__(self) -> None:
        self.transitions: list[hooks.Transition] = []
        self.refusals: list[str] = []

    def on_transition(self, t: hooks.Transition) -> None:
        self.transitions.append(t)

    def path(self, actor_id: str = A) -> list[str]:
        """The states the actor went through, in order (reflexive steps left out)."""
        out: list[str] = []
        for t in self.transitions:
            if t.actor_id == actor_id and t.source != t.dest:
                out.append(t.dest)
        return out

    # LifecycleMetrics, the parts the scenarios look at.
    def transition(self, source: str, dest: str, trigger: str) -> None:
        pass

    def checkpoint_refused(self, reason: str) -> None:
        self.refusals.append(reason)

    def effect_finished(self, effect: str, outcome: str, seconds: float) -> None:
        pass

    def devices_injected(self, count: int) -> None:
        pass

    def queue_depth(self, depth: int) -> None:
        pass


@asynccontextmanager
async def scenario(world: World, seen: Seen, **gpu: object) -> AsyncIterator[Agent]:
    """An Agent on ``world`` recording into its event log; on leaving, the log must replay
    to the agent's final actors (none lost)."""
    finals: dict[str, ActorView] = {}
    async with await EventLog.open(world.event_log) as log:
        agent = world.agent(log, seen, **gpu)
        async with agent:
            yield agent
            await agent.settle()
            finals = {a: view_of(agent, a) for a in {t.actor_id for t in seen.transitions}}
    replayed = replay(world.event_log)
    assert replayed.actors == finals
    for view in finals.values():
        assert view.state in {"running", "suspended"}, view  # never lost


async def start_actor(
    agent: Agent, world: World, bundle: Path, actor_id: str = A, policy: str = "auto"
) -> None:
    await agent.submit(
        events.ActorRegistered(
            actor_id=actor_id, gpu=True, bundle=str(bundle), suspend_policy=policy
        )
    )
    await agent.submit(events.BundlePrepared(actor_id=actor_id, bundle=str(bundle)))
    await agent.submit(events.RunRequested(actor_id=actor_id))
    await agent.wait_for_state(actor_id, "running", timeout=WAIT)
    with anyio.fail_after(WAIT):
        while not await holds_gpu(world, actor_id):
            await anyio.sleep(0.02)


async def holds_gpu(world: World, actor_id: str = A) -> bool:
    """The container's workload holds a GPU node (a live CUDA client, as the probe sees it)."""
    state = await world.runtime.state(actor_id)
    return bool(state.pid and await FdScanProbe().live_clients((state.pid,)))


async def cuda_state(world: World, actor_id: str = A, pid: int = 1) -> str:
    """The CUDA state of ``pid`` as cuda-checkpoint inside the sandbox reports it."""
    return await exec_tool(world.runtime, TOOL_IN_CONTAINER)(actor_id).get_state(pid)


def view_of(agent: Agent, actor_id: str = A) -> ActorView:
    view = agent.actor(actor_id)
    assert view is not None
    return view


def manifest_of(agent: Agent, actor_id: str = A) -> preflight.CheckpointManifest:
    view = view_of(agent, actor_id)
    assert view.checkpoint is not None
    manifest = preflight.read_manifest(Path(view.checkpoint))
    assert manifest is not None
    return manifest


async def test_runsc_route_suspends_a_live_context_and_restores(world: World) -> None:
    """runsc has --cuda-checkpoint-path: it checkpoints the live context itself."""
    seen = Seen()
    bundle, _ = world.bundle("runsc-route", tool_inside=False)
    async with scenario(world, seen) as agent:
        await start_actor(agent, world, bundle)
        await agent.submit(events.SuspendRequested(actor_id=A))
        await agent.wait_for_state(A, "suspended", timeout=WAIT)
        assert seen.path()[-3:] == ["probing", "checkpointing", "suspended"]
        manifest = manifest_of(agent)
        assert (manifest.cuda_state_included, manifest.route) == (True, events.ROUTE_RUNSC)
        assert (manifest.driver_version, manifest.gpu_count) == (DRIVER, 1)
        await agent.submit(events.RestoreRequested(actor_id=A))
        await agent.wait_for_state(A, "running", timeout=WAIT)
    (command,) = world.checkpoint_commands()
    assert "--leave-running" in command
    assert command[command.index("--cuda-checkpoint-path") + 1].endswith("cuda-checkpoint")
    assert seen.refusals == []


async def test_exec_route_suspends_through_the_sandbox_and_resumes_after_restore(
    world: World,
) -> None:
    """No runsc flag, cuda-checkpoint in the sandbox: lock+checkpoint via exec, then
    runsc checkpoint, and restore+unlock after the restore."""
    world.set_features("leave-running", "nvproxy-list")
    seen = Seen()
    bundle, _ = world.bundle("exec-route")
    async with scenario(world, seen) as agent:
        await start_actor(agent, world, bundle)
        await agent.submit(events.SuspendRequested(actor_id=A))
        await agent.wait_for_state(A, "suspended", timeout=WAIT)
        assert seen.path()[-4:] == ["probing", "cuda_suspending", "checkpointing", "suspended"]
        assert view_of(agent).checkpoint_cuda_pids == "1"  # kept with the checkpoint
        manifest = manifest_of(agent)
        assert (manifest.cuda_state_included, manifest.route) == (True, events.ROUTE_EXEC)
        await agent.submit(events.RestoreRequested(actor_id=A))
        await agent.wait_for_state(A, "running", timeout=WAIT)
        assert seen.path()[-4:] == ["restoring", "cuda_resuming", "verifying", "running"]
        assert await cuda_state(world) == "running"
        assert await holds_gpu(world)
    (command,) = world.checkpoint_commands()
    assert "--cuda-checkpoint-path" not in command
    triggers = [t.trigger for t in seen.transitions]
    assert "cuda_suspended" in triggers and "cuda_resumed" in triggers


@pytest.mark.parametrize(
    ("policy", "features", "refusal"),
    [
        # Neither route: old runsc, no cuda-checkpoint in the image.
        pytest.param(
            "auto", ("leave-running", "nvproxy-list"), events.REFUSED_LIVE_CONTEXT_PROBED,
            id="no-route",
        ),
        # Both routes exist, the pool says no.
        pytest.param(
            "refuse",
            ("leave-running", "cuda-checkpoint-path", "nvproxy-list"),
            events.REFUSED_SUSPEND_POLICY,
            id="pool-policy",
        ),
    ],
)  # fmt: skip
async def test_suspend_is_refused_without_a_route_and_the_actor_keeps_running(
    world: World, policy: str, features: tuple[str, ...], refusal: str
) -> None:
    """Refused as a transition (counted, with its reason); nothing was attempted."""
    world.set_features(*features)
    seen = Seen()
    bundle, _ = world.bundle("refused", tool_inside=False)
    async with scenario(world, seen) as agent:
        await start_actor(agent, world, bundle, policy=policy)
        await agent.submit(events.SuspendRequested(actor_id=A))
        await agent.settle()
        assert agent.state_of(A) == "running"
        assert seen.path()[-2:] == ["probing", "running"]
        assert seen.transitions[-1].trigger == "checkpoint_refused"
        assert await holds_gpu(world)
    assert seen.refusals == [refusal]
    assert world.checkpoint_commands() == []


async def test_lock_timeout_refuses_the_suspend_and_leaves_the_process_running(
    world: World,
) -> None:
    """pid 1 cannot be locked in time: rolled back, refused, nothing half-done."""
    world.set_features("leave-running", "nvproxy-list")
    seen = Seen()
    bundle, _ = world.bundle(
        "lock-timeout", knobs={"CUDA_CHECKPOINT_STANDIN_LOCK_TIMEOUT_PIDS": "1"}
    )
    async with scenario(world, seen) as agent:
        await start_actor(agent, world, bundle)
        await agent.submit(events.SuspendRequested(actor_id=A))
        await agent.settle()
        assert agent.state_of(A) == "running"
        assert seen.path()[-3:] == ["probing", "cuda_suspending", "running"]
        assert "lock timeout" in (view_of(agent).reason or "")
        assert await cuda_state(world) == "running"
        assert await holds_gpu(world)
    assert seen.refusals == [events.REFUSED_CUDA_LOCK_TIMEOUT]
    assert world.checkpoint_commands() == []


@pytest.mark.parametrize("leave_running", [True, False], ids=["leave-running", "no-leave-running"])
async def test_a_failed_runsc_route_checkpoint_never_loses_the_actor(
    world: World, leave_running: bool
) -> None:
    """cuda-checkpoint fails under runsc: with --leave-running the actor keeps running;
    without it the sandbox dies, the actor is stopped, and runs again from its bundle."""
    features = ["cuda-checkpoint-path", "nvproxy-list"]
    world.set_features(*(["leave-running", *features] if leave_running else features))
    seen = Seen()
    bundle, _ = world.bundle("runsc-fails", tool_inside=False)
    async with scenario(world, seen) as agent:
        await start_actor(agent, world, bundle)
        host_pid = (await world.runtime.state(A)).pid
        # The host tool's toggle of pid 1 cannot lock it (it gives up quickly).
        world.monkeypatch.setenv("CUDA_CHECKPOINT_STANDIN_LOCK_TIMEOUT_PIDS", str(host_pid))
        world.monkeypatch.setenv("CUDA_CHECKPOINT_STANDIN_HANG_SECONDS", "0.1")
        await agent.submit(events.SuspendRequested(actor_id=A))
        await agent.settle()
        outcome = seen.transitions[-1]
        assert outcome.trigger == "checkpoint_failed"
        assert "cuda-checkpoint --toggle" in (outcome.reason or "")
        if leave_running:
            assert agent.state_of(A) == "running"
            assert await holds_gpu(world)
        else:
            assert agent.state_of(A) == "stopped"
            assert (await world.runtime.state(A)).status == "stopped"
            world.monkeypatch.delenv("CUDA_CHECKPOINT_STANDIN_LOCK_TIMEOUT_PIDS")
            await agent.submit(events.RunRequested(actor_id=A))
            await agent.wait_for_state(A, "running", timeout=WAIT)
    (command,) = world.checkpoint_commands()
    assert ("--leave-running" in command) == leave_running


async def test_a_failed_exec_route_checkpoint_resumes_every_process(world: World) -> None:
    """After the CUDA suspend runsc still finds a client (here: /dev/zero counted as one):
    the sandbox survives (--leave-running) and every checkpointed process is resumed."""
    world.set_features("leave-running", "nvproxy-list")
    world.monkeypatch.setenv("RUNSC_STANDIN_DEVICE_PATTERN", "/dev/(nvidia[0-9]+|zero)")
    seen = Seen()
    bundle, _ = world.bundle("exec-fails")
    async with scenario(world, seen) as agent:
        await start_actor(agent, world, bundle)
        await agent.submit(events.SuspendRequested(actor_id=A))
        await agent.settle()
        assert agent.state_of(A) == "running"
        assert seen.path()[-6:] == [
            "probing", "cuda_suspending", "checkpointing", "cuda_resuming", "verifying",
            "running",
        ]  # fmt: skip
        assert "live nvproxy clients" in (view_of(agent).reason or "")
        assert view_of(agent).cuda_pids == ""
        assert await cuda_state(world) == "running"
        assert await holds_gpu(world)
    assert seen.refusals == [events.REFUSED_LIVE_NVPROXY_CLIENTS]


async def test_an_unsupported_driver_is_refused_before_any_sandbox_exists(world: World) -> None:
    """The node's driver is not in runsc's list: preflight refuses create; once the node is
    fixed a retry runs the actor."""
    world.set_driver("545.23.08")
    seen = Seen()
    bundle, _ = world.bundle("old-driver", tool_inside=False)
    async with scenario(world, seen) as agent:
        await agent.submit(events.ActorRegistered(actor_id=A, gpu=True, bundle=str(bundle)))
        await agent.submit(events.BundlePrepared(actor_id=A, bundle=str(bundle)))
        await agent.submit(events.RunRequested(actor_id=A))
        await agent.wait_for_state(A, "failed", timeout=WAIT)
        refused = seen.transitions[-1]
        assert (refused.trigger, refused.source) == ("preflight_refused", "creating")
        assert "545.23.08 is not supported" in (refused.reason or "")
        assert not [c for c in world.runsc_commands() if "create" in c and "help" not in c]
        world.set_driver(DRIVER)
        await agent.submit(events.RetryRequested(actor_id=A))
        await agent.wait_for_state(A, "running", timeout=WAIT)
    assert seen.refusals == ["driver-unsupported"]


@pytest.mark.parametrize(
    ("change", "code"),
    [
        pytest.param("driver", "restore-other-driver", id="other-driver"),
        pytest.param("gpus", "restore-fewer-gpus", id="fewer-gpus"),
    ],
)
async def test_a_restore_onto_a_mismatched_node_is_refused_and_the_checkpoint_kept(
    world: World, change: str, code: str
) -> None:
    """The checkpoint's manifest does not fit this node: refused before restoring, the actor
    stays suspended, and restores once the node fits."""
    seen = Seen()
    bundle, _ = world.bundle("mismatch", tool_inside=False)
    async with scenario(world, seen) as agent:
        await start_actor(agent, world, bundle)
        await agent.submit(events.SuspendRequested(actor_id=A))
        await agent.wait_for_state(A, "suspended", timeout=WAIT)
        image = Path(view_of(agent).checkpoint or "")
        manifest_path = image / preflight.MANIFEST_NAME
        original = manifest_path.read_text()
        if change == "driver":
            world.set_driver("550.90.07")
        else:  # a checkpoint taken on a worker with four GPUs
            manifest_path.write_text(json.dumps({**json.loads(original), "gpu_count": 4}))
        await agent.submit(events.RestoreRequested(actor_id=A))
        await agent.wait_for_state(A, "suspended", timeout=WAIT)
        refused = seen.transitions[-1]
        assert (refused.trigger, refused.source) == ("restore_refused", "restoring")
        assert view_of(agent).checkpoint == str(image)
        assert (image / "checkpoint.img").exists()
        assert not [c for c in world.runsc_commands() if "restore" in c and "help" not in c]
        world.set_driver(DRIVER)
        manifest_path.write_text(original)
        await agent.submit(events.RestoreRequested(actor_id=A))
        await agent.wait_for_state(A, "running", timeout=WAIT)
    assert seen.refusals == [code]


@pytest.mark.parametrize(
    ("gpus", "features", "sequential"),
    [
        pytest.param(2, ("cuda-checkpoint-sequential",), True, id="two-gpus"),
        pytest.param(1, ("cuda-checkpoint-sequential",), False, id="one-gpu"),
        pytest.param(2, (), False, id="runsc-without-the-flag"),
    ],
)
async def test_a_multi_gpu_runsc_route_checkpoint_runs_cuda_checkpoint_sequentially(
    world: World, gpus: int, features: tuple[str, ...], sequential: bool
) -> None:
    """--cuda-checkpoint-sequential exactly when runsc has it and the actor holds more than
    one GPU (runsc's parallel cuda-checkpoint calls are what multi-GPU jobs cannot take)."""
    world.set_features("leave-running", "cuda-checkpoint-path", "nvproxy-list", *features)
    for index in range(1, gpus):
        (world.node / "dev" / f"nvidia{index}").touch()
    seen = Seen()
    bundle, _ = world.bundle("sequential", tool_inside=False)
    async with scenario(world, seen) as agent:
        await start_actor(agent, world, bundle)
        await agent.submit(events.SuspendRequested(actor_id=A))
        await agent.wait_for_state(A, "suspended", timeout=WAIT)
    (command,) = world.checkpoint_commands()
    assert ("--cuda-checkpoint-sequential" in command) is sequential
    assert "--cuda-checkpoint-path" in command


async def test_a_restore_that_leaves_a_process_locked_fails_the_actor_naming_it(
    world: World,
) -> None:
    """Exec route: after the restore every unlock 'succeeds', but pid 1 still reads
    'locked' (its first CUDA call would hang while the container looks running): the actor
    is failed, with the pid and the state read, never 'running'."""
    world.set_features("leave-running", "nvproxy-list")
    seen = Seen()
    bundle, tool_state = world.bundle(
        "left-locked", knobs={"CUDA_CHECKPOINT_STANDIN_UNLOCK_STUCK_PIDS": "1"}
    )
    async with await EventLog.open(world.event_log) as log:
        agent = world.agent(log, seen)
        async with agent:
            await start_actor(agent, world, bundle)
            await agent.submit(events.SuspendRequested(actor_id=A))
            await agent.wait_for_state(A, "suspended", timeout=WAIT)
            # The restored process comes back locked (the stand-in restores afresh).
            (tool_state / "new-process-state").write_text("locked\n")
            await agent.submit(events.RestoreRequested(actor_id=A))
            await agent.wait_for_state(A, "failed", timeout=WAIT)
            view = view_of(agent)
            await agent.settle()
    assert seen.path()[-3:] == ["restoring", "cuda_resuming", "failed"]
    assert "pid 1" in view.reason and "reads 'locked'" in view.reason
    assert await cuda_state(world) == "locked"
    assert replay(world.event_log).actors[A] == view


async def test_a_runsc_route_restore_that_leaves_a_process_locked_fails_the_actor(
    world: World,
) -> None:
    """runsc's route restores CUDA state inside runsc restore: the actor is verified before it
    runs; pid 1 reading 'locked' through runsc exec fails it, naming the pid and the state,
    and the sandbox is deleted (a hung GPU sandbox is not left running)."""
    seen = Seen()
    bundle, tool_state = world.bundle("runsc-locked")
    async with await EventLog.open(world.event_log) as log:
        agent = world.agent(log, seen, sandbox_exec=world.runtime)
        async with agent:
            await start_actor(agent, world, bundle)
            await agent.submit(events.SuspendRequested(actor_id=A))
            await agent.wait_for_state(A, "suspended", timeout=WAIT)
            assert manifest_of(agent).route == events.ROUTE_RUNSC
            (tool_state / "new-process-state").write_text("locked\n")
            await agent.submit(events.RestoreRequested(actor_id=A))
            await agent.wait_for_state(A, "failed", timeout=WAIT)
            view = view_of(agent)
            await agent.settle()
    assert seen.path()[-3:] == ["restoring", "verifying", "failed"]
    assert view.reason is not None
    assert "pid 1 reads 'locked'" in view.reason and "after runsc restored" in view.reason
    with pytest.raises(runsc.ContainerNotFoundError):
        await world.runtime.state(A)
    assert replay(world.event_log).actors[A] == view


async def test_a_runsc_route_restore_whose_processes_run_reaches_running(world: World) -> None:
    seen = Seen()
    bundle, _ = world.bundle("runsc-verified")
    async with scenario(world, seen, sandbox_exec=world.runtime) as agent:
        await start_actor(agent, world, bundle)
        await agent.submit(events.SuspendRequested(actor_id=A))
        await agent.wait_for_state(A, "suspended", timeout=WAIT)
        await agent.submit(events.RestoreRequested(actor_id=A))
        await agent.wait_for_state(A, "running", timeout=WAIT)
        assert seen.path()[-3:] == ["restoring", "verifying", "running"]
    logged = [json.loads(line) for line in world.event_log.read_text().splitlines()[1:]]
    verified = [e for e in logged if e.get("type") == "gpus_verified"]
    assert "every restored CUDA process reads 'running'" in verified[-1]["message"]
