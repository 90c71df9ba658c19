"""The per-worker GPU allocator: its pure core, and the machine's allocating/awaiting_gpus."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from lifecycle.doubles import FakeInjector, FakeRuntime
from substrate_gpu import preflight
from substrate_gpu.eventlog import EventLog, replay
from substrate_gpu.lifecycle import Agent, actors, allocation, events, machine
from substrate_gpu.lifecycle.agent import ResumePoint
from substrate_gpu.lifecycle.allocation import (
    GpuAllocator,
    GpuRequest,
    Granted,
    Refused,
    Wait,
    WorkerGpus,
    decide,
    held_by,
)
from substrate_gpu.lifecycle.errors import AllocationError, EventSchemaError
from substrate_gpu.lifecycle.gpu import GpuSettings
from substrate_gpu.observability.metrics import AgentMetrics
from substrate_gpu.service.wiring import LifecycleMetricsBridge

MakeAgent = Callable[..., Agent]
SPEC = machine.load_spec()
REPO = Path(__file__).resolve().parents[2]
FOUR = WorkerGpus.named([f"nvidia.com/gpu={i}" for i in range(4)])


def _worker() -> WorkerGpus:
    return WorkerGpus(
        names=tuple(f"nvidia.com/gpu={i}" for i in range(4)),
        aliases={
            **{f"nvidia.com/gpu={i}": f"nvidia.com/gpu={i}" for i in range(4)},
            "nvidia.com/gpu=GPU-bbbb": "nvidia.com/gpu=1",
        },
    )


# --- the pure core ------------------------------------------------------------------------


def test_a_count_gets_the_lowest_free_indices() -> None:
    taken = {"nvidia.com/gpu=0", "nvidia.com/gpu=2"}
    assert decide(GpuRequest(count=2), FOUR, taken) == Granted(
        ("nvidia.com/gpu=1", "nvidia.com/gpu=3")
    )


def test_names_get_exactly_those_gpus_by_any_of_their_names() -> None:
    got = decide(
        GpuRequest(names=("nvidia.com/gpu=GPU-bbbb", "nvidia.com/gpu=0")), _worker(), set()
    )
    assert got == Granted(("nvidia.com/gpu=0", "nvidia.com/gpu=1"))


def test_gpu_true_alone_asks_for_every_gpu_of_the_worker() -> None:
    assert decide(GpuRequest(), FOUR, set()) == Granted(FOUR.names)
    assert isinstance(decide(GpuRequest(), FOUR, {"nvidia.com/gpu=3"}), Wait)


def test_a_held_gpu_makes_the_request_wait_with_the_reason() -> None:
    got = decide(GpuRequest(count=3), FOUR, {"nvidia.com/gpu=0", "nvidia.com/gpu=1"})
    assert got == Wait("3 GPU(s) requested, 2 of 4 free")
    named = decide(GpuRequest(names=("nvidia.com/gpu=1",)), FOUR, {"nvidia.com/gpu=1"})
    assert named == Wait("GPU(s) nvidia.com/gpu=1 held by other actors")


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (GpuRequest(count=5), "5 GPU(s) requested, this worker has 4"),
        (
            GpuRequest(names=("nvidia.com/gpu=7",)),
            "this worker has no GPU named 'nvidia.com/gpu=7'",
        ),
    ],
)
def test_a_request_the_worker_can_never_meet_is_refused(request_: GpuRequest, reason: str) -> None:
    assert decide(request_, _worker(), set()) == Refused(reason)


def test_a_worker_without_gpus_refuses_every_request() -> None:
    assert decide(GpuRequest(), WorkerGpus.named([]), set()) == Refused("this worker has no GPU")
    everything = GpuRequest(names=("nvidia.com/gpu=all",))
    assert decide(everything, WorkerGpus.named([]), set()) == Refused("this worker has no GPU")


@pytest.mark.parametrize(
    "names",
    [
        pytest.param(("nvidia.com/gpu=1", "nvidia.com/gpu=GPU-bbbb"), id="index-and-uuid"),
        pytest.param(("nvidia.com/gpu=GPU-bbbb", "nvidia.com/gpu=1"), id="uuid-and-index"),
        pytest.param(("nvidia.com/gpu=1", "nvidia.com/gpu=1"), id="the-same-name-twice"),
    ],
)
def test_one_gpu_named_twice_counts_once(names: tuple[str, ...]) -> None:
    """Two names of one GPU (or one name twice) ask for that GPU, once: the CDI reference
    library and nvidia-container-toolkit resolve such a list to the one device."""
    assert decide(GpuRequest(names=names), _worker(), set()) == Granted(("nvidia.com/gpu=1",))
    held = decide(GpuRequest(names=names), _worker(), {"nvidia.com/gpu=1"})
    assert held == Wait("GPU(s) nvidia.com/gpu=1 held by other actors")


@pytest.mark.parametrize(
    "names",
    [
        pytest.param(("nvidia.com/gpu=all",), id="all"),
        pytest.param(("nvidia.com/gpu=0", "nvidia.com/gpu=all"), id="an-index-and-all"),
        pytest.param(("nvidia.com/gpu=all", "nvidia.com/gpu=GPU-bbbb"), id="all-and-a-uuid"),
    ],
)
def test_all_by_name_is_every_gpu_like_gpu_true(names: tuple[str, ...]) -> None:
    """``nvidia.com/gpu=all`` is ``gpu: true`` by name, whatever is named beside it: every
    GPU when all are free, a wait while one is held."""
    request = GpuRequest(names=names)
    assert decide(request, _worker(), set()) == decide(GpuRequest(), _worker(), set())
    assert decide(request, _worker(), set()) == Granted(FOUR.names)
    assert decide(request, _worker(), {"nvidia.com/gpu=3"}) == Wait(
        "4 GPU(s) requested, 3 of 4 free"
    )


def test_all_of_another_kind_is_not_this_workers() -> None:
    """``all`` names every GPU only of the worker's own kind."""
    got = decide(GpuRequest(names=("amd.com/gpu=all",)), _worker(), set())
    assert got == Refused("this worker has no GPU named 'amd.com/gpu=all'")


requests = st.one_of(
    st.builds(GpuRequest, count=st.integers(1, 5)),
    st.builds(
        GpuRequest,
        names=st.lists(st.sampled_from(FOUR.names), min_size=1, max_size=3, unique=True).map(tuple),
    ),
    st.just(GpuRequest()),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(requests, st.booleans()), max_size=30))
def test_grants_are_disjoint_whatever_the_order_of_requests_and_releases(
    ops: list[tuple[GpuRequest, bool]],
) -> None:
    allocator = GpuAllocator(FOUR)
    for i, (request, release_oldest) in enumerate(ops):
        decision = allocator.decide(request)
        if isinstance(decision, Granted):
            allocator.hold(f"a{i}", decision.devices)
        if release_oldest and allocator.table:
            allocator.hold(next(iter(allocator.table)), ())
        held = [d for devices in allocator.table.values() for d in devices]
        assert len(held) == len(set(held)) == allocator.allocated
        assert allocator.allocated + allocator.free == 4


@settings(max_examples=100, deadline=None)
@given(requests, st.sets(st.sampled_from(FOUR.names)))
def test_the_decision_is_deterministic(request: GpuRequest, taken: set[str]) -> None:
    assert decide(request, FOUR, taken) == decide(request, FOUR, frozenset(taken))
    again = {*sorted(taken, reverse=True)}
    assert decide(request, FOUR, taken) == decide(request, FOUR, again)


def test_the_table_refuses_to_give_a_held_gpu_to_another_actor() -> None:
    allocator = GpuAllocator(FOUR)
    allocator.hold("a", ("nvidia.com/gpu=0",))
    with pytest.raises(AllocationError, match="another actor holds it"):
        allocator.hold("b", ("nvidia.com/gpu=0",))
    assert allocator.table == {"a": ("nvidia.com/gpu=0",)}


def test_only_states_marked_holds_gpus_keep_the_allocation() -> None:
    view = actors.ActorView(
        actor_id="a", state="suspended", gpu=True, bundle="/b", checkpoint=None,
        live_contexts=0, sandbox=False, reason=None, gpu_devices="nvidia.com/gpu=2",
    )  # fmt: skip
    assert held_by(view, SPEC.gpu_holding_states) == ()
    running = msgspec.structs.replace(view, state="running")
    assert held_by(running, SPEC.gpu_holding_states) == ("nvidia.com/gpu=2",)
    assert "awaiting_gpus" not in SPEC.gpu_holding_states


# --- the event ----------------------------------------------------------------------------


def test_actor_registered_refuses_both_a_count_and_names() -> None:
    with pytest.raises(EventSchemaError, match="give gpus .* or gpu_names"):
        events.ActorRegistered(
            actor_id="a", gpu=True, bundle="/b", gpus=1, gpu_names=("nvidia.com/gpu=0",)
        )


def test_actor_registered_refuses_an_unqualified_gpu_name() -> None:
    with pytest.raises(EventSchemaError, match="fully qualified CDI names"):
        events.ActorRegistered(actor_id="a", gpu=True, bundle="/b", gpu_names=("0",))


def test_a_v1_registration_reads_as_all_gpus_without_the_allocator() -> None:
    line = b'{"type":"actor_registered","v":1,"actor_id":"a","gpu":true,"bundle":"/b"}'
    old = events.from_json(line)
    assert isinstance(old, events.ActorRegistered)
    assert (old.v, old.allocates_gpus, old.gpus, old.gpu_names) == (1, False, 0, ())
    assert events.ActorRegistered(actor_id="a", gpu=True, bundle="/b").allocates_gpus


# --- the machine, through the agent (async tests below) ------------------------------------

anyio_mark = pytest.mark.anyio


def _reason(agent: Agent, actor_id: str) -> str | None:
    view = agent.actor(actor_id)
    assert view is not None
    return view.reason


async def _register(agent: Agent, actor_id: str, **request: object) -> None:
    await agent.submit(
        events.ActorRegistered(actor_id=actor_id, gpu=True, bundle=f"/b/{actor_id}", **request)  # type: ignore[arg-type]
    )
    await agent.submit(events.BundlePrepared(actor_id=actor_id, bundle=f"/b/{actor_id}"))


async def _reaches(agent: Agent, event: events.Event, state: str) -> None:
    """Submit ``event`` and wait for its actor to reach ``state``."""
    await agent.submit(event)
    await agent.wait_for_state(event.actor_id, state, timeout=5)


@anyio_mark
async def test_gpus_are_allocated_before_injection_and_injected_by_name(
    make_agent: MakeAgent, injector: FakeInjector
) -> None:
    allocator = GpuAllocator(FOUR, name="w1")
    async with make_agent(allocator=allocator) as agent:
        await _register(agent, "a", gpus=2)
        await _reaches(agent, events.RunRequested(actor_id="a"), "running")
    assert allocator.table == {"a": ("nvidia.com/gpu=0", "nvidia.com/gpu=1")}
    assert injector.granted == [("nvidia.com/gpu=0", "nvidia.com/gpu=1")]


@anyio_mark
async def test_concurrent_runs_get_disjoint_gpus(make_agent: MakeAgent) -> None:
    allocator = GpuAllocator(FOUR)
    async with make_agent(allocator=allocator) as agent:
        for name in "abcd":
            await _register(agent, name, gpus=1)
        for name in "abcd":
            await agent.submit(events.RunRequested(actor_id=name))
        for name in "abcd":
            await agent.wait_for_state(name, "running", timeout=5)
    held = sorted(d for devices in allocator.table.values() for d in devices)
    assert held == list(FOUR.names)


@anyio_mark
async def test_an_actor_waits_for_held_gpus_and_runs_once_they_are_freed(
    make_agent: MakeAgent,
) -> None:
    allocator = GpuAllocator(FOUR)
    async with make_agent(allocator=allocator) as agent:
        await _register(agent, "big", gpus=3)
        await _register(agent, "late", gpus=2)
        await _reaches(agent, events.RunRequested(actor_id="big"), "running")
        await _reaches(agent, events.RunRequested(actor_id="late"), "awaiting_gpus")
        assert _reason(agent, "late") == "2 GPU(s) requested, 1 of 4 free"
        await agent.submit(events.SandboxExited(actor_id="big", status=0))
        await agent.wait_for_state("late", "running", timeout=5)
    assert allocator.table == {"late": ("nvidia.com/gpu=0", "nvidia.com/gpu=1")}


@anyio_mark
async def test_a_request_the_worker_cannot_meet_fails_with_the_reason(
    make_agent: MakeAgent,
) -> None:
    async with make_agent(allocator=GpuAllocator(FOUR, name="w1")) as agent:
        await _register(agent, "a", gpus=8)
        await _reaches(agent, events.RunRequested(actor_id="a"), "failed")
        assert _reason(agent, "a") == (
            "while allocating GPUs on worker 'w1': 8 GPU(s) requested, this worker has 4"
        )


@anyio_mark
async def test_suspend_frees_the_gpus_and_restore_allocates_again(
    make_agent: MakeAgent, injector: FakeInjector
) -> None:
    allocator = GpuAllocator(FOUR)
    async with make_agent(allocator=allocator) as agent:
        await _register(agent, "a", gpus=1)
        await _register(agent, "b", gpus=1)
        await _reaches(agent, events.RunRequested(actor_id="a"), "running")
        await _reaches(agent, events.SuspendRequested(actor_id="a"), "suspended")
        assert allocator.table == {}
        await _reaches(agent, events.RunRequested(actor_id="b"), "running")
        await _reaches(agent, events.RestoreRequested(actor_id="a"), "running")
    # Another GPU of the same count: GPU 0 is b's now.
    assert allocator.table == {"b": ("nvidia.com/gpu=0",), "a": ("nvidia.com/gpu=1",)}
    assert injector.granted[-1] == ("nvidia.com/gpu=1",)


@anyio_mark
async def test_replaying_the_log_rebuilds_the_same_allocation_table(
    make_agent: MakeAgent, tmp_path: Path
) -> None:
    allocator = GpuAllocator(FOUR)
    path = tmp_path / "events.jsonl"
    async with await EventLog.open(path) as log:
        async with make_agent(allocator=allocator, recorder=log) as agent:
            for name, count in (("a", 2), ("b", 1), ("c", 2)):
                await _register(agent, name, gpus=count)
                await agent.submit(events.RunRequested(actor_id=name))
            await agent.wait_for_state("c", "awaiting_gpus", timeout=5)
            await agent.submit(events.SuspendRequested(actor_id="a"))
            await agent.wait_for_state("c", "running", timeout=5)
            await agent.settle()
    rebuilt = GpuAllocator(FOUR)
    views = replay(path).actors.values()
    rebuilt.rebuild((v.actor_id, held_by(v, SPEC.gpu_holding_states)) for v in views)
    assert rebuilt.table == allocator.table
    assert rebuilt.table == {
        "b": ("nvidia.com/gpu=2",),
        "c": ("nvidia.com/gpu=0", "nvidia.com/gpu=1"),
    }


@anyio_mark
async def test_without_an_allocator_a_gpu_actor_gets_every_gpu_as_before(
    make_agent: MakeAgent, injector: FakeInjector
) -> None:
    async with make_agent() as agent:
        await _register(agent, "a")
        await _reaches(agent, events.RunRequested(actor_id="a"), "running")
    assert injector.granted == [None]


@anyio_mark
async def test_the_gauges_show_the_workers_gpus_allocated_and_free(make_agent: MakeAgent) -> None:
    registry = CollectorRegistry()
    metrics = LifecycleMetricsBridge(AgentMetrics(registry=registry))
    async with make_agent(allocator=GpuAllocator(FOUR, name="w1"), metrics=metrics) as agent:
        await _register(agent, "a", gpus=3)
        await _reaches(agent, events.RunRequested(actor_id="a"), "running")
        assert registry.get_sample_value("substrate_gpu_gpus_allocated", {"worker": "w1"}) == 3
        assert registry.get_sample_value("substrate_gpu_gpus_free", {"worker": "w1"}) == 1
        await agent.submit(events.SandboxExited(actor_id="a", status=0))
        await agent.wait_for_state("a", "stopped", timeout=5)
        assert registry.get_sample_value("substrate_gpu_gpus_free", {"worker": "w1"}) == 4


# --- deleting, unknown GPUs, records the worker cannot honour -------------------------------


@anyio_mark
async def test_a_deleted_running_actor_keeps_its_gpus_until_its_sandbox_is_gone(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    allocator = GpuAllocator(FOUR)
    runtime.gates["delete"] = gate = anyio.Event()
    async with make_agent(allocator=allocator) as agent:
        await _register(agent, "old", gpus=4)
        await _register(agent, "new", gpus=1)
        await _reaches(agent, events.RunRequested(actor_id="old"), "running")
        await _reaches(agent, events.RunRequested(actor_id="new"), "awaiting_gpus")
        await _reaches(agent, events.DeleteRequested(actor_id="old"), "deleting")
        await anyio.wait_all_tasks_blocked()
        assert (agent.state_of("new"), allocator.allocated) == ("awaiting_gpus", 4)
        gate.set()
        await agent.wait_for_state("new", "running", timeout=5)
    assert allocator.table == {"new": ("nvidia.com/gpu=0",)}


@anyio_mark
async def test_an_actor_deleted_while_suspended_takes_no_gpu_back(
    make_agent: MakeAgent, runtime: FakeRuntime
) -> None:
    allocator = GpuAllocator(FOUR)
    async with make_agent(allocator=allocator) as agent:
        await _register(agent, "a", gpus=1)
        await _register(agent, "b", gpus=1)
        await _reaches(agent, events.RunRequested(actor_id="a"), "running")
        await _reaches(agent, events.SuspendRequested(actor_id="a"), "suspended")
        await _reaches(agent, events.RunRequested(actor_id="b"), "running")
        runtime.gates["delete"] = anyio.Event()
        await _reaches(agent, events.DeleteRequested(actor_id="a"), "deleting")
        # a's last allocation was GPU 0, b's now: deleting a must not claim it again.
        assert allocator.table == {"b": ("nvidia.com/gpu=0",)}
        runtime.gates["delete"].set()
        await agent.wait_for_state("a", "deleted", timeout=5)


def _failing_then(worker: WorkerGpus, failures: int) -> Callable[[], Awaitable[WorkerGpus]]:
    calls = 0

    async def discover() -> WorkerGpus:
        nonlocal calls
        calls += 1
        if calls <= failures:
            raise AllocationError(f"no CDI spec at /cdi/nvidia.json: attempt {calls} failed")
        return worker

    return discover


@anyio_mark
async def test_gpu_actors_are_refused_with_the_reason_while_the_workers_gpus_are_unknown(
    make_agent: MakeAgent,
) -> None:
    allocator = await GpuAllocator.discovered(_failing_then(FOUR, 99), name="w1")
    assert allocator.unknown == "no CDI spec at /cdi/nvidia.json: attempt 1 failed"
    async with make_agent(allocator=allocator) as agent:
        await _register(agent, "a", gpus=1)
        await _reaches(agent, events.RunRequested(actor_id="a"), "failed")
        assert _reason(agent, "a") == (
            "while allocating GPUs on worker 'w1': this worker has no known GPU: "
            "no CDI spec at /cdi/nvidia.json: attempt 2 failed"
        )


@anyio_mark
async def test_the_workers_gpus_are_looked_for_again_at_the_next_allocation(
    make_agent: MakeAgent,
) -> None:
    allocator = await GpuAllocator.discovered(_failing_then(FOUR, 1))
    assert allocator.unknown is not None and allocator.free == 0
    async with make_agent(allocator=allocator) as agent:
        await _register(agent, "a", gpus=1)
        await _reaches(agent, events.RunRequested(actor_id="a"), "running")
    assert (allocator.unknown, allocator.table) == (None, {"a": ("nvidia.com/gpu=0",)})


def test_a_rebuilt_record_of_a_gpu_the_worker_no_longer_has_is_kept_but_not_counted() -> None:
    two = WorkerGpus.named(["nvidia.com/gpu=0", "nvidia.com/gpu=1"])
    allocator = GpuAllocator(two)
    allocator.rebuild([("a", ("nvidia.com/gpu=3",)), ("b", ("nvidia.com/gpu=1",))])
    assert allocator.table == {"a": ("nvidia.com/gpu=3",), "b": ("nvidia.com/gpu=1",)}
    assert (allocator.allocated, allocator.free) == (1, 1)
    assert allocator.decide(GpuRequest(count=1)) == Granted(("nvidia.com/gpu=0",))
    assert allocator.hold("a", ()) is True
    assert allocator.table == {"b": ("nvidia.com/gpu=1",)}


def test_a_rebuilt_record_is_read_by_any_name_of_its_gpu() -> None:
    allocator = GpuAllocator(_worker())
    allocator.rebuild([("a", ("nvidia.com/gpu=GPU-bbbb",))])
    assert allocator.table == {"a": ("nvidia.com/gpu=1",)}
    assert isinstance(allocator.decide(GpuRequest(names=("nvidia.com/gpu=1",))), Wait)


def test_a_gpu_two_records_hold_stays_taken_until_both_let_go() -> None:
    allocator = GpuAllocator(FOUR)
    allocator.rebuild([("a", ("nvidia.com/gpu=0",)), ("b", ("nvidia.com/gpu=0",))])
    assert allocator.allocated == 1
    allocator.hold("a", ())
    assert allocator.decide(GpuRequest(names=("nvidia.com/gpu=0",))) == Wait(
        "GPU(s) nvidia.com/gpu=0 held by other actors"
    )
    assert allocator.hold("b", ()) is True
    assert allocator.free == 4


# --- the checkpoint manifest of an allocated actor ------------------------------------------


@pytest.fixture
def four_gpu_host(tmp_path: Path, runtime: FakeRuntime) -> GpuSettings:
    """A host with /dev/nvidia0..3 and driver 580.65.06 (no runsc preflight)."""
    dev = tmp_path / "host/dev"
    dev.mkdir(parents=True)
    for i in range(4):
        (dev / f"nvidia{i}").symlink_to("/dev/null")
    version = tmp_path / "proc-driver-nvidia-version"
    version.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  x\n")
    return GpuSettings(
        drivers=runtime, dev_root=tmp_path / "host", proc_version=version, driver_preflight=False
    )


async def _suspended_with(agent: Agent, actor_id: str, gpus: int) -> Path:
    await _register(agent, actor_id, gpus=gpus)
    await agent.submit(events.RunRequested(actor_id=actor_id))
    await agent.wait_for_state(actor_id, "running", timeout=5)
    await agent.submit(events.SuspendRequested(actor_id=actor_id))
    await agent.wait_for_state(actor_id, "suspended", timeout=5)
    view = agent.actor(actor_id)
    assert view is not None and view.checkpoint
    return Path(view.checkpoint)


@anyio_mark
async def test_an_allocated_actors_checkpoint_counts_its_own_gpus(
    make_agent: MakeAgent, four_gpu_host: GpuSettings
) -> None:
    async with make_agent(allocator=GpuAllocator(FOUR), gpu=four_gpu_host) as agent:
        image = await _suspended_with(agent, "a", gpus=1)
    manifest = preflight.read_manifest(image)
    assert manifest is not None and manifest.gpu_count == 1


@anyio_mark
async def test_a_restore_is_checked_against_the_gpus_allocated_for_it(
    make_agent: MakeAgent, four_gpu_host: GpuSettings
) -> None:
    """A checkpoint of two GPUs is refused onto a one-GPU allocation of a four-GPU worker."""
    async with make_agent(allocator=GpuAllocator(FOUR), gpu=four_gpu_host) as agent:
        image = await _suspended_with(agent, "a", gpus=1)
        manifest = preflight.read_manifest(image)
        assert manifest is not None
        preflight.write_manifest(image, dataclasses.replace(manifest, gpu_count=2))
        await _reaches(agent, events.RestoreRequested(actor_id="a"), "suspended")
        assert _reason(agent, "a") == (
            "restore refused (restore-fewer-gpus): the checkpoint holds 2 GPU(s), this restore "
            "was allocated 1 (nvidia.com/gpu=0): restore asking for at least as many GPUs"
        )


@anyio_mark
async def test_a_legacy_gpu_actor_resumed_from_a_v1_log_holds_every_gpu(
    make_agent: MakeAgent, tmp_path: Path
) -> None:
    """A v1 ``gpu: true`` actor logged before upgrade-at-the-door (running, no allocation):
    after the upgrade it holds all the worker's GPUs, so a new v2 actor waits for them."""
    compat = Path(__file__).parents[1] / "eventlog/compat/v1/demo.jsonl"
    lines = compat.read_text().splitlines(keepends=True)
    # Up to gpu-trainer's sandbox_started (seq 20): it runs with every GPU, unallocated
    # (gpu-notebook, mid-injection there, is left out).
    cut = next(i for i, line in enumerate(lines) if '"seq":20,' in line)
    path = tmp_path / "events.jsonl"
    path.write_text("".join(line for line in lines[: cut + 1] if "gpu-notebook" not in line))
    logged = replay(path)
    legacy = [(v.actor_id, v.state, v.uses_allocator) for v in logged.actors.values() if v.gpu]
    assert legacy == [("gpu-trainer", "running", False)]
    allocator = GpuAllocator(FOUR)
    resume = ResumePoint(actors=tuple(logged.actors.values()), last_seq=20)
    async with make_agent(allocator=allocator, resume=resume) as agent:
        assert allocator.free == 0
        await _register(agent, "new", gpus=1)
        await _reaches(agent, events.RunRequested(actor_id="new"), "awaiting_gpus")
        await agent.submit(events.SandboxExited(actor_id="gpu-trainer", status=0))
        await agent.wait_for_state("new", "running", timeout=5)
    assert allocator.table == {"new": ("nvidia.com/gpu=0",)}


# --- GPUs per container (issue 31 §10) -------------------------------------------------------


def test_containers_naming_the_same_gpu_share_it_within_their_sandbox() -> None:
    """Two containers naming one GPU (by two of its names) ask for it once: one GPU of the
    sandbox, granted once; the union of the groups, in index order."""
    request = GpuRequest(
        names=("nvidia.com/gpu=1", "nvidia.com/gpu=3", "nvidia.com/gpu=GPU-bbbb"),
        groups=(("nvidia.com/gpu=1", "nvidia.com/gpu=3"), ("nvidia.com/gpu=GPU-bbbb",)),
    )
    assert decide(request, _worker(), set()) == Granted(("nvidia.com/gpu=1", "nvidia.com/gpu=3"))


def test_one_container_naming_a_gpu_twice_counts_it_once() -> None:
    """Within one container's group too, a GPU named twice (index and UUID) is that GPU once
    (issue 30 item 7: as the CDI reference library resolves names)."""
    request = GpuRequest(
        names=("nvidia.com/gpu=1", "nvidia.com/gpu=GPU-bbbb"),
        groups=(("nvidia.com/gpu=1", "nvidia.com/gpu=GPU-bbbb"),),
    )
    assert decide(request, _worker(), set()) == Granted(("nvidia.com/gpu=1",))


#: A clause about one container naming a GPU twice (by two of its names).
_ONE_CONTAINER_TWICE = re.compile(
    r"one container naming a GPU[^.;]*(?:twice|two of its names)|twice by one container",
    re.IGNORECASE,
)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(allocation.__doc__ or "", id="allocation-module-doc"),
        pytest.param((REPO / "docs" / "gpu-injection.md").read_text(), id="gpu-injection-md"),
    ],
)
def test_the_docs_say_one_container_naming_a_gpu_twice_is_granted_it_once(text: str) -> None:
    """What the test above shows is what the docs say: no clause about one container naming
    a GPU twice calls it refused (it was, before commit 0f2c49b; issue 30)."""
    clauses = re.split(r"[.;]\s", " ".join(text.split()))
    about = [c for c in clauses if _ONE_CONTAINER_TWICE.search(c)]
    assert about, "the rule is no longer stated where it was"
    assert not [c for c in about if "refus" in c]


@anyio_mark
async def test_each_app_container_is_injected_with_its_own_gpus_and_one_naming_none_with_none(
    make_agent: MakeAgent, injector: FakeInjector, tmp_path: Path
) -> None:
    """The grant is the union; each app container is injected with its own names (as the
    allocator's canonical names), one naming none with an empty set (withheld)."""
    apps = ("app", "side", "train")
    for name in ("_pause", *apps):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    allocator = GpuAllocator(_worker(), name="w1")
    async with make_agent(allocator=allocator) as agent:
        await agent.submit(
            events.ActorRegistered(
                actor_id="s",
                gpu=True,
                bundle=str(tmp_path),
                gpu_names=("nvidia.com/gpu=GPU-bbbb", "nvidia.com/gpu=2"),
                containers=apps,
                container_gpus={
                    "app": ("nvidia.com/gpu=GPU-bbbb",),
                    "train": ("nvidia.com/gpu=2",),
                },
            )
        )
        await agent.submit(events.BundlePrepared(actor_id="s", bundle=str(tmp_path)))
        await _reaches(agent, events.RunRequested(actor_id="s"), "running")
    assert allocator.table == {"s": ("nvidia.com/gpu=1", "nvidia.com/gpu=2")}
    assert injector.calls == [tmp_path / c for c in apps]
    assert injector.granted == [("nvidia.com/gpu=1",), (), ("nvidia.com/gpu=2",)]
