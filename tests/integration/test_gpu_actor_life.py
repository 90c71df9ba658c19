"""A GPU actor's whole life through the Agent, with real components underneath.

The Agent drives the production runsc driver against the runsc stand-in (which delegates
create/start/state/kill/delete to real runc and reproduces gVisor's checkpoint failure
modes), the fd-scanning CUDA probe against the container's real processes, and the real
injector on a simulated node. The workload in the actor holds ``/dev/nvidia0`` open — a
live CUDA client — until the test tells it to let go.
"""

from __future__ import annotations

import anyio
import pytest

from substrate_gpu.lifecycle import Agent, events
from substrate_gpu.probes.fd_scan import FdScanProbe
from substrate_gpu.testing import bundles

pytestmark = [pytest.mark.anyio, pytest.mark.runc]

# Hold the GPU open until /tmp/release appears, then let go and idle.
WORKLOAD = """
exec 3</dev/nvidia0
while [ ! -e /tmp/release ]; do sleep 0.05; done
exec 3<&-
touch /tmp/released
while true; do sleep 1; done
"""


SUBCOMMANDS = {
    "create",
    "start",
    "checkpoint",
    "restore",
    "state",
    "kill",
    "delete",
    "help",
    "flags",
    "nvproxy",
    "ps",
    "exec",
}


def gpu_bundle(world, tmp_path):
    return bundles.make_bundle(tmp_path / "bundle", ["sh", "-c", WORKLOAD], env=["PATH=/bin"])


async def start_actor(agent: Agent, actor_id: str, bundle) -> None:
    await agent.submit(events.ActorRegistered(actor_id=actor_id, gpu=True, bundle=str(bundle)))
    await agent.submit(events.BundlePrepared(actor_id=actor_id, bundle=str(bundle)))
    await agent.submit(events.RunRequested(actor_id=actor_id))
    await agent.wait_for_state(actor_id, "running", timeout=60)


async def wait_for(predicate, timeout: float = 20) -> None:
    with anyio.fail_after(timeout):
        while not await predicate():
            await anyio.sleep(0.05)


async def live_clients(world, actor_id: str):
    state = await world.runtime.state(actor_id)
    return await world.probe.live_clients((state.pid,))


def agent_for(world, probe=None) -> Agent:
    return Agent(
        runtime=world.runtime,
        probe=probe or world.probe,
        injector=world.injector,
        checkpoint_root=world.checkpoints,
    )


async def test_suspend_refused_while_context_live_then_accepted(world, tmp_path):
    """A live context refuses the suspend (actor keeps running); once closed it suspends."""
    bundle = gpu_bundle(world, tmp_path)
    async with agent_for(world) as agent, agent.subscribe() as transitions:
        await start_actor(agent, "gpu-actor", bundle)
        await wait_for(lambda: _has_clients(world, "gpu-actor"))

        await agent.submit(events.SuspendRequested(actor_id="gpu-actor"))
        refusal = await _next(
            transitions, lambda t: t.trigger in {"checkpoint_refused", "checkpoint_written"}
        )
        assert (refusal.trigger, refusal.dest) == ("checkpoint_refused", "running")
        assert (await world.runtime.state("gpu-actor")).status == "running"

        (bundle / "rootfs/tmp/release").touch()
        await wait_for(lambda: _no_clients(world, "gpu-actor"))
        await agent.submit(events.SuspendRequested(actor_id="gpu-actor"))
        await agent.wait_for_state("gpu-actor", "suspended", timeout=60)

        await agent.submit(events.RestoreRequested(actor_id="gpu-actor"))
        await agent.wait_for_state("gpu-actor", "running", timeout=60)
        await agent.submit(events.DeleteRequested(actor_id="gpu-actor"))
        await agent.wait_for_state("gpu-actor", "deleted", timeout=60)

    # --nvproxy exactly on create and restore, as a global flag before the subcommand.
    subcommands = []
    for command in world.runsc_commands():
        sub = next((a for a in command if a in SUBCOMMANDS), command[-1])
        subcommands.append(sub)
        if "--nvproxy" in command:
            assert command.index("--nvproxy") < command.index(sub), command
        assert ("--nvproxy" in command) == (sub in {"create", "restore"}), command
    assert {"create", "start", "checkpoint", "restore", "delete"} <= set(subcommands)


async def test_probe_miss_with_leave_running_keeps_the_actor(world, tmp_path):
    """If the probe misses a live context, runsc's refusal is recorded and the sandbox survives."""
    blind = FdScanProbe(device_pattern=r"^/nothing-matches$")
    bundle = gpu_bundle(world, tmp_path)
    async with agent_for(world, probe=blind) as agent, agent.subscribe() as transitions:
        await start_actor(agent, "racy", bundle)
        await wait_for(lambda: _has_clients(world, "racy"))
        await agent.submit(events.SuspendRequested(actor_id="racy"))
        outcome = await _next(
            transitions,
            lambda t: (
                t.trigger in {"checkpoint_refused", "checkpoint_failed", "checkpoint_written"}
            ),
        )
        assert (outcome.trigger, outcome.dest) == ("checkpoint_refused", "running")
        assert "live nvproxy clients" in (outcome.reason or "")
        assert (await world.runtime.state("racy")).status == "running"
    checkpoints = [c for c in world.runsc_commands() if "checkpoint" in c and "help" not in c]
    assert all("--leave-running" in c for c in checkpoints)


async def test_probe_miss_without_leave_running_is_recorded_not_lost(world, tmp_path, monkeypatch):
    """Without --leave-running the sandbox dies; the actor is stopped (recoverable), never gone."""
    monkeypatch.setenv("RUNSC_STANDIN_FEATURES", "nvproxy-list")
    blind = FdScanProbe(device_pattern=r"^/nothing-matches$")
    bundle = gpu_bundle(world, tmp_path)
    async with agent_for(world, probe=blind) as agent:
        await start_actor(agent, "old-runsc", bundle)
        await wait_for(lambda: _has_clients(world, "old-runsc"))
        await agent.submit(events.SuspendRequested(actor_id="old-runsc"))
        await agent.wait_for_state("old-runsc", "stopped", timeout=60)
        assert agent.actor("old-runsc").reason
        # Recoverable: run it again from its bundle.
        await agent.submit(events.RunRequested(actor_id="old-runsc"))
        await agent.wait_for_state("old-runsc", "running", timeout=60)


async def _has_clients(world, actor_id: str) -> bool:
    return bool(await live_clients(world, actor_id))


async def _no_clients(world, actor_id: str) -> bool:
    return not await live_clients(world, actor_id)


async def _next(transitions, predicate, timeout: float = 60):
    with anyio.fail_after(timeout):
        async for t in transitions:
            if predicate(t):
                return t
    raise AssertionError("subscription ended")
