"""A stuck injection is abandoned: its actor fails at the timeout, the agent still closes.

The injection's file work runs in a thread; a step stuck in the kernel there (an open of a
FIFO, a read from a hung NFS server) is simulated by an ``inject_gpu`` that blocks until the
test releases it. The effect's timeout and the agent's close must not wait for it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import anyio
import pytest
from lifecycle.doubles import FakeProbe, FakeRuntime
from support.gpu_nodes import injection_options

from substrate_gpu import cdi
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.injection.injector import WorkerGpuInjector
from substrate_gpu.lifecycle import Agent, allocation, events
from substrate_gpu.testing import bundles

pytestmark = pytest.mark.anyio

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def stuck(monkeypatch):
    """Make inject_gpu block in its thread until the test ends, or 8 s have passed (so that
    a test of code that waits for the thread fails instead of hanging)."""
    release = threading.Event()
    entered = threading.Event()
    timer = threading.Timer(8, release.set)
    timer.start()

    def blocked(*args, **kwargs):
        entered.set()
        release.wait()
        raise OSError("released by the test")

    monkeypatch.setattr(bundle_, "inject_gpu", blocked)
    yield entered
    release.set()
    timer.cancel()


def _agent(tmp_path, gpu_node, node_spec, **kwargs) -> Agent:
    runtime = FakeRuntime()
    return Agent(
        runtime=runtime,
        probe=FakeProbe(runtime),
        injector=WorkerGpuInjector(spec=node_spec, options=injection_options(gpu_node)),
        checkpoint_root=tmp_path / "checkpoints",
        **kwargs,
    )


async def _run_gpu_actor(agent: Agent, bundle: Path) -> None:
    await agent.submit(events.ActorRegistered(actor_id="a", gpu=True, gpus=1, bundle=str(bundle)))
    await agent.submit(events.BundlePrepared(actor_id="a", bundle=str(bundle)))
    await agent.submit(events.RunRequested(actor_id="a"))


async def test_a_stuck_injection_fails_its_actor_at_the_timeout(
    tmp_path, gpu_node, node_spec, stuck
):
    """inject stuck in its thread: the actor lands on failed at 0.3 s and its GPU is freed."""
    allocator = allocation.GpuAllocator(
        allocation.WorkerGpus.of(cdi.list_gpus(cdi.SpecSet([node_spec]))), name="w"
    )
    bundle = bundles.make_bundle(tmp_path / "bundle", ["true"])
    agent = _agent(tmp_path, gpu_node, node_spec, timeouts={"inject": 0.3}, allocator=allocator)
    async with agent:
        started = time.monotonic()
        await _run_gpu_actor(agent, bundle)
        await agent.wait_for_state("a", "failed", timeout=5)
        assert time.monotonic() - started < 2
        assert stuck.is_set()
        assert "inject did not finish within 0.3s" in (agent.actor("a").reason or "")
        # Freed once the agent has made sure no sandbox of the actor is left (issue 30).
        await agent.settle()
        assert (allocator.allocated, allocator.free) == (0, 1)


async def test_the_agent_closes_while_an_injection_is_stuck(tmp_path, gpu_node, node_spec, stuck):
    """Leaving the agent cancels the effect at once, though its thread is still blocked."""
    bundle = bundles.make_bundle(tmp_path / "bundle", ["true"])
    async with _agent(tmp_path, gpu_node, node_spec) as agent:
        await _run_gpu_actor(agent, bundle)
        await agent.wait_for_state("a", "injecting", timeout=5)
        await anyio.to_thread.run_sync(stuck.wait, 5)
        closing = time.monotonic()
    assert time.monotonic() - closing < 2
    assert agent.state_of("a") == "injecting"  # left in flight, for recovery to reconcile


def test_a_process_with_a_stuck_injection_exits(tmp_path, gpu_node, node_spec):
    """The process exits once the agent closed: the stuck thread holds up no interpreter exit."""
    script = textwrap.dedent(
        f"""
        import sys, threading
        from pathlib import Path
        sys.path[:0] = [{str(TESTS)!r}]
        import anyio
        from lifecycle.doubles import FakeProbe, FakeRuntime
        from substrate_gpu import cdi
        from substrate_gpu.injection import bundle as bundle_
        from substrate_gpu.injection.bundle import InjectionOptions
        from substrate_gpu.injection.injector import WorkerGpuInjector
        from substrate_gpu.lifecycle import Agent, events

        entered = threading.Event()
        def blocked(*args, **kwargs):
            entered.set()
            threading.Event().wait()  # for ever
        bundle_.inject_gpu = blocked

        async def main():
            runtime = FakeRuntime()
            spec = cdi.load_spec({node_spec.source!r})
            injector = WorkerGpuInjector(spec=spec, options=InjectionOptions())
            async with Agent(runtime=runtime, probe=FakeProbe(runtime), injector=injector,
                             checkpoint_root=Path({str(tmp_path / "ck")!r})) as agent:
                b = {str(tmp_path / "b")!r}
                await agent.submit(events.ActorRegistered(actor_id="a", gpu=True, bundle=b))
                await agent.submit(events.BundlePrepared(actor_id="a", bundle=b))
                await agent.submit(events.RunRequested(actor_id="a"))
                await anyio.to_thread.run_sync(entered.wait, 5)
            print("closed", agent.state_of("a"), flush=True)

        anyio.run(main)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=20, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "closed injecting"
