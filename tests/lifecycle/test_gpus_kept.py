"""GPUs are never freed while a sandbox that has them may still run (issue 30 §1, §5).

On the doubles: an actor failing with its sandbox possibly up keeps its GPUs until the
pipeline has deleted what is left; GPUs recovery found injected in a live sandbox are held
whatever the log says, and the difference is warned about and counted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import structlog
from prometheus_client import CollectorRegistry

from lifecycle.doubles import FakeInjector, FakeRuntime
from substrate_gpu.eventlog import EventLog, recover
from substrate_gpu.eventlog import recovery as recovery_
from substrate_gpu.lifecycle import Agent, actors, events, hooks, machine
from substrate_gpu.lifecycle.agent import ResumePoint
from substrate_gpu.lifecycle.allocation import GpuAllocator, LiveSandbox, WorkerGpus
from substrate_gpu.observability.metrics import AgentMetrics
from substrate_gpu.probes.api import GpuClient
from substrate_gpu.service.wiring import LifecycleMetricsBridge

pytestmark = pytest.mark.anyio

MakeAgent = Callable[..., Agent]
SPEC = machine.load_spec()
NAMES = tuple(f"nvidia.com/gpu={i}" for i in range(4))
FOUR = WorkerGpus(
    names=NAMES,
    aliases={n: n for n in NAMES},
    nodes={f"/dev/nvidia{i}": n for i, n in enumerate(NAMES)},
)


async def _run(agent: Agent, actor_id: str, state: str = "running", **request: object) -> None:
    bundle = f"/b/{actor_id}"
    await agent.submit(
        events.ActorRegistered(actor_id=actor_id, gpu=True, bundle=bundle, **request)  # type: ignore[arg-type]
    )
    await agent.submit(events.BundlePrepared(actor_id=actor_id, bundle=bundle))
    await agent.submit(events.RunRequested(actor_id=actor_id))
    await agent.wait_for_state(actor_id, state, timeout=5)


def test_only_failed_may_be_entered_with_a_sandbox_left() -> None:
    """The machine marks the one resting state a failed, timed-out or interrupted effect
    lands in; stopped, suspended and deleted are entered with the sandbox gone."""
    assert SPEC.sandbox_leaving_states == {"failed"}
    assert not SPEC.sandbox_leaving_states & SPEC.gpu_holding_states


async def test_a_failed_start_keeps_the_gpus_until_its_container_is_deleted(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """``runsc start`` fails with the container created: the actor fails, and its GPUs stay
    held while that container cannot be deleted (a second actor waits); once a delete
    succeeds they go to the waiting actor."""
    allocator = GpuAllocator(FOUR, name="w1")
    runtime.fail["start"] = "runsc: the sandbox is busy"
    runtime.fail["delete"] = "runsc: cannot lock container"
    async with make_agent(allocator=allocator) as agent:
        await _run(agent, "a", "failed", gpus=4)
        await agent.settle()
        assert runtime.containers["a"].status == "created"  # it may still start
        assert allocator.table == {"a": NAMES}
        await _run(agent, "b", "awaiting_gpus", gpus=1)
        del runtime.fail["start"], runtime.fail["delete"]
        await agent.submit(events.DeleteRequested(actor_id="a"))
        await agent.wait_for_state("b", "running", timeout=5)
    assert "a" not in runtime.containers
    assert allocator.table == {"b": NAMES[:1]}


async def test_a_timed_out_start_frees_the_gpus_only_after_the_leftover_is_deleted(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """A hung ``runsc start`` times out (the actor fails recoverably); the waiting actor is
    granted the GPUs only after the pipeline's delete of the leftover container."""
    allocator = GpuAllocator(FOUR, name="w1")
    runtime.hang.add("start")
    async with make_agent(allocator=allocator, timeouts={"start": 0.2}) as agent:
        await _run(agent, "a", "starting", gpus=4)
        await _run(agent, "b", "awaiting_gpus", gpus=2)
        await agent.wait_for_state("b", "starting", timeout=5)
        assert allocator.table == {"b": NAMES[:2]}
    ops = [(c[0], c[-1]) for c in runtime.calls]
    assert ops.index(("delete", "a")) < ops.index(("state", "a")) < ops.index(("create", "b"))


async def test_a_failed_actor_may_get_back_the_gpus_it_still_holds(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """An actor whose leftover could not be deleted asks for its own GPU again: granted (its
    create deletes the leftover first), not an endless wait on itself."""
    allocator = GpuAllocator(FOUR, name="w1")
    runtime.fail["start"] = "runsc: the sandbox is busy"
    runtime.fail["delete"] = "runsc: cannot lock container"
    async with make_agent(allocator=allocator) as agent:
        await _run(agent, "a", "failed", gpu_names=(NAMES[2],))
        await agent.settle()
        assert allocator.table == {"a": NAMES[2:3]}
        del runtime.fail["start"], runtime.fail["delete"]
        await agent.submit(events.RetryRequested(actor_id="a"))
        await agent.wait_for_state("a", "running", timeout=5)
    assert allocator.table == {"a": NAMES[2:3]}


def _sandbox_bundle(tmp_path: Path) -> Path:
    """A sandbox bundle directory: ``_pause`` and two app containers, each a config."""
    top = tmp_path / "bundles" / "s"
    for name in ("_pause", "app", "side"):
        (top / name).mkdir(parents=True)
        (top / name / "config.json").write_text('{"ociVersion": "1.0.2"}')
    return top


async def test_a_failed_restore_whose_leftovers_cannot_be_deleted_keeps_the_gpus(
    make_agent: MakeAgent, runtime: FakeRuntime, tmp_path: Path
) -> None:
    """A GPU sandbox's restore fails at its last container with ``_pause`` and ``app``
    restored, and no delete succeeds: the actor fails (not suspended), its GPUs held while
    those run (a second actor waits), and they go to it once a delete succeeds."""
    allocator = GpuAllocator(FOUR, name="w1")
    bundle = str(_sandbox_bundle(tmp_path))
    async with make_agent(allocator=allocator) as agent:
        await agent.submit(
            events.ActorRegistered(
                actor_id="s", gpu=True, gpus=4, bundle=bundle, containers=("app", "side")
            )
        )
        await agent.submit(events.BundlePrepared(actor_id="s", bundle=bundle))
        await agent.submit(events.RunRequested(actor_id="s"))
        await agent.wait_for_state("s", "running", timeout=5)
        await agent.submit(events.SuspendRequested(actor_id="s"))
        await agent.wait_for_state("s", "suspended", timeout=5)
        runtime.fail_on["restore", "side"] = "runsc: restoring side failed"
        runtime.fail["delete"] = "runsc: cannot lock container"
        await agent.submit(events.RestoreRequested(actor_id="s"))
        await agent.wait_for_state("s", "failed", timeout=5)
        await agent.settle()
        rooted = runtime.roots["s"].containers
        assert (rooted["_pause"].status, rooted["app"].status) == ("running", "running")
        assert allocator.table == {"s": NAMES}
        await _run(agent, "b", "awaiting_gpus", gpus=1)
        del runtime.fail_on["restore", "side"], runtime.fail["delete"]
        await agent.submit(events.DeleteRequested(actor_id="s"))
        await agent.wait_for_state("b", "running", timeout=5)
    assert runtime.roots["s"].containers == {}
    assert allocator.table == {"b": NAMES[:1]}


async def test_a_checkpoint_whose_teardown_fails_keeps_the_running_sandbox_and_its_gpus(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """The image is written (``--leave-running``) but the sandbox cannot be deleted: it runs
    on with its GPUs, and the actor is running, not suspended with its GPUs freed."""
    allocator = GpuAllocator(FOUR, name="w1")
    async with make_agent(allocator=allocator) as agent:
        await _run(agent, "a", gpus=4)
        runtime.fail["delete"] = "runsc: cannot lock container"
        await agent.submit(events.SuspendRequested(actor_id="a"))
        await agent.wait_for_state("a", "running", timeout=5)
        assert runtime.containers["a"].status == "running"
        assert allocator.table == {"a": NAMES}
        await _run(agent, "b", "awaiting_gpus", gpus=1)
        del runtime.fail["delete"]
        await agent.submit(events.DeleteRequested(actor_id="a"))
        await agent.wait_for_state("b", "running", timeout=5)
    assert allocator.table == {"b": NAMES[:1]}


class _FailStateIn:
    """From the moment the actor enters ``state``, ``runsc state`` fails (not "no such
    container": an error that says nothing about whether it runs)."""

    def __init__(self, runtime: FakeRuntime, state: str) -> None:
        self.runtime = runtime
        self.state = state

    def on_transition(self, transition: hooks.Transition) -> None:
        if transition.dest == self.state:
            self.runtime.fail["state"] = "runsc: permission denied"


@pytest.mark.parametrize(
    ("failing", "fails_in"),
    [
        pytest.param("state", "probing", id="probe"),
        pytest.param("checkpoint", "checkpointing", id="checkpoint"),
    ],
)
async def test_an_unreadable_sandbox_state_after_a_failed_suspend_keeps_the_gpus(
    make_agent: MakeAgent, runtime: FakeRuntime, failing: str, fails_in: str
) -> None:
    """The suspend fails and ``runsc state`` cannot say whether the sandbox runs: it is
    taken as running (the actor running, its GPUs held) and the doubt is logged; only a
    definite "no such container" would have freed them."""
    allocator = GpuAllocator(FOUR, name="w1")
    observer = _FailStateIn(runtime, fails_in)
    with structlog.testing.capture_logs() as logged:
        async with make_agent(allocator=allocator, observers=[observer]) as agent:
            await _run(agent, "a", gpus=4)
            runtime.fail[failing] = "runsc: something went wrong"
            await agent.submit(events.SuspendRequested(actor_id="a"))
            await agent.wait_for_state("a", "running", timeout=5)
            assert allocator.table == {"a": NAMES}
            runtime.fail.clear()
    (warning,) = [e for e in logged if "could not be read" in e["event"]]
    assert warning["actor_id"] == "a"


class _RaisingProbe:
    """A probe with a bug: every call raises something no effect expects."""

    async def live_clients(self, pids: tuple[int, ...]) -> tuple[GpuClient, ...]:
        raise RuntimeError("a bug in the probe")


async def test_an_effect_that_raises_keeps_the_gpus_until_the_sandbox_is_deleted(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """The probe raises (a bug): its failure outcome stops the actor, but what the effect
    did to the sandbox is unknown, so its GPUs stay held until the pipeline has deleted it
    (here only once a delete succeeds)."""
    allocator = GpuAllocator(FOUR, name="w1")
    runtime.fail["delete"] = "runsc: cannot lock container"
    async with make_agent(allocator=allocator, probe=_RaisingProbe()) as agent:
        await _run(agent, "a", gpus=4)
        await agent.submit(events.SuspendRequested(actor_id="a"))
        await agent.wait_for_state("a", "stopped", timeout=5)
        await agent.settle()
        assert runtime.containers["a"].status == "running"
        assert allocator.table == {"a": NAMES}
        await _run(agent, "b", "awaiting_gpus", gpus=1)
        del runtime.fail["delete"]
        await agent.submit(events.DeleteRequested(actor_id="a"))
        await agent.wait_for_state("b", "running", timeout=5)
    assert "a" not in runtime.containers
    assert allocator.table == {"b": NAMES[:1]}


def _view(actor_id: str, state: str, devices: str) -> actors.ActorView:
    """A GPU actor as a log left it: allocated ``devices``, a sandbox made."""
    actor = actors.Actor(actor_id, state)
    actor.gpu = True
    actor.uses_allocator = True
    actor.gpu_devices = devices
    actor.sandbox = True
    actor.bundle = f"/b/{actor_id}"
    return actor.snapshot()


async def test_a_forged_record_does_not_hand_out_a_gpu_a_live_sandbox_has(
    make_agent: MakeAgent,
) -> None:
    """The log says a and b both hold GPU 0, while b's live sandbox has GPU 1 injected: GPU 1
    stays b's (a new actor gets GPU 2), and the difference is warned about and counted."""
    a = _view("a", "running", NAMES[0])
    b = _view("b", "running", NAMES[0])
    resume = ResumePoint(
        actors=(a, b),
        last_seq=10,
        live=(
            LiveSandbox("a", ("/dev/nvidia0",), ("a",)),
            LiveSandbox("b", ("/dev/nvidia1",), ("b",)),
        ),
    )
    registry = CollectorRegistry()
    metrics = LifecycleMetricsBridge(AgentMetrics(registry=registry))
    allocator = GpuAllocator(FOUR, name="w1")
    with structlog.testing.capture_logs() as logged:
        agent = make_agent(allocator=allocator, resume=resume, metrics=metrics)
    async with agent:
        await _run(agent, "c", gpus=1)
    assert allocator.table["c"] == (NAMES[2],)
    assert allocator.table["b"] == (NAMES[0], NAMES[1])
    (warning,) = [e for e in logged if "differ" in e["event"]]
    assert (warning["actor_id"], warning["logged"], warning["injected"]) == (
        "b",
        [NAMES[0]],
        [NAMES[1]],
    )
    samples = {"worker": "w1"}
    assert registry.get_sample_value("substrate_gpu_gpu_record_mismatches_total", samples) == 1


async def test_a_live_sandbox_of_an_actor_holding_no_gpus_is_deleted_before_they_are_free(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    """Recovery found a failed actor's sandbox live with GPU 3 injected (its delete failed):
    GPU 3 is held until the agent has deleted that sandbox, then it is free again."""
    a = _view("a", "failed", "")
    resume = ResumePoint(actors=(a,), last_seq=5, live=(LiveSandbox("a", (NAMES[3],), ("a",)),))
    allocator = GpuAllocator(FOUR, name="w1")
    runtime.fail["delete"] = "runsc: cannot lock container"
    await runtime.create("a", Path("/b/a"), nvproxy=True)
    async with make_agent(allocator=allocator, resume=resume) as agent:
        await agent.settle()
        assert allocator.table == {"a": (NAMES[3],)}
        await _run(agent, "d", "awaiting_gpus", gpu_names=(NAMES[3],))
        del runtime.fail["delete"]
        await agent.submit(events.DeleteRequested(actor_id="a"))
        await agent.wait_for_state("d", "running", timeout=5)
    assert "a" not in runtime.containers
    assert allocator.table == {"d": (NAMES[3],)}


async def test_recovery_of_a_half_started_sandbox_deletes_every_container(
    runtime: FakeRuntime, injector: FakeInjector, tmp_path: Path
) -> None:
    """An agent killed mid-start (``_pause`` and ``app`` running, ``side`` only created):
    recovery deletes the leftovers apps first, ``_pause`` last, before the actor fails; the
    report says so (issue 30: the sandbox used to be left running)."""
    from lifecycle.doubles import FakeProbe, _Container

    bundle = tmp_path / "bundles" / "s"
    for name in ("_pause", "app", "side"):
        (bundle / name).mkdir(parents=True)
        (bundle / name / "config.json").write_text('{"ociVersion": "1.0.2"}')
    log_path = tmp_path / "events.jsonl"

    class HangStarts:
        """Once the sandbox is created (``_pause`` started), every ``start`` hangs."""

        def on_transition(self, transition: hooks.Transition) -> None:
            if transition.dest == "starting":
                runtime.hang.add("start")

    async with (
        await EventLog.open(log_path) as log,
        Agent(
            runtime=runtime,
            probe=FakeProbe(runtime),
            injector=injector,
            checkpoint_root=tmp_path / "ck",
            recorder=log,
            observers=[HangStarts()],
        ) as agent,
    ):
        await agent.submit(
            events.ActorRegistered(
                actor_id="s", gpu=False, bundle=str(bundle), containers=("app", "side")
            )
        )
        await agent.submit(events.BundlePrepared(actor_id="s", bundle=str(bundle)))
        await agent.submit(events.RunRequested(actor_id="s"))
        await agent.wait_for_state("s", "starting", timeout=5)
    runtime.hang.clear()
    rooted = runtime.for_actor("s")
    rooted.containers = {
        name: _Container(status, 7, f"/b/{name}", False)  # type: ignore[arg-type]
        for name, status in {"_pause": "running", "app": "running", "side": "created"}.items()
    }
    runtime.calls.clear()
    recovery = await recover(log_path, runtime=runtime, checkpoint_root=tmp_path / "ck")
    assert [e.type for e in recovery.reconcile_events] == ["effect_failed"]
    assert rooted.containers == {}
    deletes = [c[-1] for c in runtime.calls if c[0] == "delete"]
    assert deletes[:3] == ["side", "app", "_pause"]
    assert "leftover container deleted" in recovery.report[0].describe()


@pytest.mark.parametrize(
    ("config", "found"),
    [
        pytest.param(
            {"linux": {"devices": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia1"}]}},
            ("/dev/nvidia1",),
            id="device-nodes",
        ),
        pytest.param(
            {"annotations": {"cdi.k8s.io/x": "nvidia.com/gpu=0, nvidia.com/gpu=2", "o": "y=1"}},
            ("nvidia.com/gpu=0", "nvidia.com/gpu=2"),
            id="cdi-annotations",
        ),
        pytest.param({"linux": {"devices": "nope"}, "annotations": []}, (), id="malformed"),
        pytest.param({"linux": {"devices": [{"path": "/dev/nvidia-caps/nvidia-cap1"}]}}, (), id="caps"),
    ],
)  # fmt: skip
def test_the_gpus_a_config_injects_are_read_from_nodes_and_cdi_annotations(
    config: dict[str, object], found: tuple[str, ...]
) -> None:
    assert recovery_.injected_gpus(config) == found


def test_a_worker_identifies_gpus_by_node_and_by_name() -> None:
    gpus, unknown = FOUR.identify(("/dev/nvidia2", NAMES[0], "/dev/nvidia9", "nvidia.com/gpu=2"))
    assert (gpus, unknown) == ((NAMES[0], NAMES[2]), ("/dev/nvidia9",))
