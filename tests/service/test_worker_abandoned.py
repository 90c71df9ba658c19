"""An abandoned Run or Restore (its caller's deadline, a cancel) never strands an actor.

In-process, on the agent's real machine, pipeline and event log, with the in-process
runtime double (``FakeRuntime``) whose operations wait on gates: the caller goes away at a
chosen step of the call, every step in turn, and each time the call stops there and undoes
what it made before the UID's lock is released. A Terminate of the UID then answers OK and
finds nothing (no container, no runsc root, no activation resting in ``registered``,
``bundle_prepared`` or an effect), and a new Run of the UID runs. The same on real gVisor,
from outside, at random deadlines: tests/runsc/test_real_worker_abandoned.py.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest
from lifecycle.doubles import FakeInjector, FakeProbe, FakeRuntime

from substrate_gpu.lifecycle import events, hooks
from substrate_gpu.service import (
    AgentConfig,
    Components,
    protocol,
    running_agent,
    worker_api,
    worker_calls,
    worker_requests,
)
from substrate_gpu.service.ateworker import ateworker_pb2 as pb
from substrate_gpu.testing import node as node_

from .agentproc import AgentProcess, logged_events
from .workerclient import Actor, connect, status_of, wait_until

pytestmark = pytest.mark.anyio

UID = "abandoned"
#: States an actor must never be left in by an abandoned call (it would strand the UID).
STRANDED = {"registered", "bundle_prepared"}


class _GatedDoor:
    """The agent's door, whose ``accept`` of one event type waits on a gate once accepted
    (the call is between two of its own submits there)."""

    def __init__(self, service: Any) -> None:
        self._service = service
        self.agent = service.agent
        self.hold: str | None = None
        self.reached = anyio.Event()
        self.release = anyio.Event()

    async def offer(self, event: events.Event) -> hooks.Transition | protocol.RequestError:
        accepted = await self._service.offer(event)
        if event.type == self.hold:
            self.reached.set()
            await self.release.wait()
        return accepted

    async def offer_all(
        self, group: list[events.Event]
    ) -> list[hooks.Transition] | protocol.RequestError:
        accepted = await self._service.offer_all(group)
        if any(event.type == self.hold for event in group):
            self.reached.set()
            await self.release.wait()
        return accepted  # type: ignore[no-any-return]

    async def durable(self) -> protocol.RequestError | None:
        return await self._service.durable()  # type: ignore[no-any-return]

    def reject(self, error: protocol.RequestError, line_number: int) -> bytes:
        return self._service.reject(error, line_number)  # type: ignore[no-any-return]


@dataclass
class World:
    worker: worker_api.WorkerService
    door: _GatedDoor
    runtime: FakeRuntime
    agent: Any
    tmp: Path

    def activations(self) -> list[tuple[str, str]]:
        return [
            (v.actor_id, v.state) for v in self.agent.actors() if v.identity.get("actor_uid") == UID
        ]

    def assert_nothing_left(self) -> None:
        """No live activation, no container in any of the UID's roots, no root left."""
        assert [a for a in self.activations() if a[1] != "deleted"] == []
        for actor_id, root in self.runtime.roots.items():
            assert root.containers == {}, actor_id
            assert not root.has_root(), f"the runsc root of {actor_id} is still there"


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    runtime = FakeRuntime()
    components = Components(runtime=runtime, probe=FakeProbe(runtime), injector=FakeInjector())
    config = AgentConfig(event_log=tmp_path / "events.jsonl", checkpoint_root=tmp_path / "ck")
    async with running_agent(config, components) as running:
        door = _GatedDoor(running.service)
        runsc = tmp_path / "runsc"  # runsc_path names the agent's binary (required)
        runsc.write_text("#!/bin/sh\nexit 0\n")
        runsc.chmod(0o755)
        worker = worker_api.WorkerService(door, runsc=str(runsc), dev_root=tmp_path)
        async with worker.open():
            yield World(worker, door, runtime, running.service.agent, tmp_path)


@asynccontextmanager
async def _abandoned(call: Callable[[], Any]) -> AsyncIterator[anyio.CancelScope]:
    """``call()`` in a task its caller abandons on leaving (as grpc cancels a handler
    whose client's deadline passed)."""
    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def caller() -> None:
            with scope:
                await call()

        tg.start_soon(caller)
        try:
            yield scope
        finally:
            scope.cancel()


async def _until(predicate: Callable[[], bool], what: str) -> None:
    with anyio.fail_after(10):
        while not predicate():
            await anyio.sleep(0.005)


def _called(runtime: FakeRuntime, op: str, container: str) -> Callable[[], bool]:
    return lambda: any(c[0] == op and c[-1] == container for c in runtime.calls)


async def _terminate_and_run_again(world: World, actor: Actor) -> None:
    """Terminate answers OK and leaves nothing; a new Run of the UID runs."""
    with anyio.fail_after(10):
        await world.worker.TerminateWorkload(actor.terminate())
    world.assert_nothing_left()
    again = Actor(world.tmp / "again", uid=UID, runsc=str(world.tmp / "runsc")).prepare()
    with anyio.fail_after(10):
        await world.worker.RunWorkload(again.run())
    live = [a for a in world.activations() if a[1] != "deleted"]
    assert len(live) == 1 and live[0][1] == "running"
    with anyio.fail_after(10):
        await world.worker.TerminateWorkload(again.terminate())
    world.assert_nothing_left()


@pytest.mark.parametrize(
    "step",
    [
        pytest.param("run_requested", id="once-registered-and-asked-to-run"),
        pytest.param(("create", "_pause"), id="in-create-of-pause"),
        pytest.param(("start", "_pause"), id="in-create-starting-pause"),
        pytest.param(("create", "app"), id="in-create-of-app"),
        pytest.param(("start", "app"), id="in-start"),
    ],
)
async def test_a_run_abandoned_at_any_step_is_undone(
    world: World, step: str | tuple[str, str]
) -> None:
    """The caller goes away at ``step`` (between two submits, or in a runsc command of an
    effect): the call stops there (an effect in flight runs to its end), the activation it
    registered is deleted, the UID is free for the next call."""
    actor = Actor(world.tmp / "actor", uid=UID, runsc=str(world.tmp / "runsc")).prepare()
    if isinstance(step, tuple):
        world.runtime.gates_on[step] = gate = anyio.Event()
        reached = _called(world.runtime, *step)
    else:
        world.door.hold, gate = step, world.door.release
        reached = world.door.reached.is_set
    async with _abandoned(lambda: world.worker.RunWorkload(actor.run())):
        await _until(reached, step)
    gate.set()
    # The abandoned call undoes itself before it lets go of the UID: nothing is left even
    # before anyone terminates it.
    await _until(lambda: UID not in world.worker._locks.locks, "the undo")
    world.assert_nothing_left()
    assert not {state for _, state in world.activations()} & STRANDED
    await _terminate_and_run_again(world, actor)
    assert len(world.activations()) == 2  # the abandoned one and the next Run's


async def test_a_terminate_during_the_undo_waits_for_it_and_answers_ok(world: World) -> None:
    """Terminate arriving while the abandoned call waits out its effect (it holds the UID's
    lock): it answers OK once the effect ends and the undo is done, and nothing is left."""
    actor = Actor(world.tmp / "actor", uid=UID, runsc=str(world.tmp / "runsc")).prepare()
    world.runtime.gates_on["create", "_pause"] = gate = anyio.Event()
    async with _abandoned(lambda: world.worker.RunWorkload(actor.run())):
        await _until(_called(world.runtime, "create", "_pause"), "create")
    answered = anyio.Event()

    async def terminate() -> None:
        with anyio.fail_after(10):
            await world.worker.TerminateWorkload(actor.terminate())
        answered.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(terminate)
        await anyio.sleep(0.1)
        assert not answered.is_set()  # behind the undo, which is behind the effect
        gate.set()
    world.assert_nothing_left()
    await _terminate_and_run_again(world, actor)


async def test_a_run_abandoned_while_its_bundles_are_prepared_is_undone(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Abandoned while the bundles are composed and sized (a blocking step, in a thread,
    before anything is registered): nothing is registered, nothing is left mounted."""
    actor = Actor(world.tmp / "actor", uid=UID, runsc=str(world.tmp / "runsc")).prepare()
    entered, release = threading.Event(), threading.Event()
    real = worker_requests.edit_configs

    def slow_edit(*args: Any, **kwargs: Any) -> str:
        entered.set()
        release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(worker_requests, "edit_configs", slow_edit)
    async with _abandoned(lambda: world.worker.RunWorkload(actor.run())):
        await _until(entered.is_set, "sizing")
    release.set()
    await _until(lambda: UID not in world.worker._locks.locks, "the undo")
    monkeypatch.setattr(worker_requests, "edit_configs", real)
    assert world.activations() == []
    await _terminate_and_run_again(world, actor)
    assert not {state for _, state in world.activations()} & STRANDED


async def test_a_run_abandoned_while_waiting_for_the_uids_lock_makes_nothing(
    world: World,
) -> None:
    """A Run queued behind another call of the UID and abandoned there registers nothing."""
    actor = Actor(world.tmp / "actor", uid=UID, runsc=str(world.tmp / "runsc")).prepare()
    async with world.worker._locks.held(UID):
        async with _abandoned(lambda: world.worker.RunWorkload(actor.run())):
            await anyio.sleep(0.05)
    assert world.activations() == []
    await _terminate_and_run_again(world, actor)


async def test_a_restore_abandoned_in_restore_is_undone(world: World) -> None:
    """The same for a Restore: abandoned while runsc restores, it is deleted once restored."""
    actor = Actor(world.tmp / "actor", uid=UID, runsc=str(world.tmp / "runsc")).prepare()
    actor.restore.mkdir()
    (actor.restore / "checkpoint.img").write_bytes(b"image")
    world.runtime.gates_on["restore", "_pause"] = gate = anyio.Event()
    async with _abandoned(lambda: world.worker.RestoreWorkload(actor.restore_request())):
        await _until(_called(world.runtime, "restore", "_pause"), "restore")
    gate.set()
    await _terminate_and_run_again(world, actor)
    assert (actor.restore / "checkpoint.img").read_bytes() == b"image"


async def test_a_run_right_after_an_abandoned_one_runs(world: World) -> None:
    """No Terminate in between: the next Run waits for the undo, then runs (the UID is not
    left "already executing")."""
    actor = Actor(world.tmp / "actor", uid=UID, runsc=str(world.tmp / "runsc")).prepare()
    world.runtime.gates_on["start", "app"] = gate = anyio.Event()
    async with _abandoned(lambda: world.worker.RunWorkload(actor.run())):
        await _until(_called(world.runtime, "start", "app"), "start")
    async with anyio.create_task_group() as tg:

        async def run_again() -> None:
            with anyio.fail_after(10):
                await world.worker.RunWorkload(actor.run())

        tg.start_soon(run_again)
        await anyio.sleep(0.05)
        gate.set()
    assert [s for _, s in world.activations()] == ["deleted", "running"]
    await world.worker.TerminateWorkload(actor.terminate())
    world.assert_nothing_left()


async def test_abandoning_the_startups_undoes_each_and_answers_why(world: World) -> None:
    """``abandon_startups`` (upstream's cancelStartups at SIGTERM): the waiting caller is
    answered (UNAVAILABLE once draining) and the activation undone."""
    actor = Actor(world.tmp / "actor", uid=UID, runsc=str(world.tmp / "runsc")).prepare()
    world.runtime.gates_on["start", "app"] = gate = anyio.Event()
    answers: list[BaseException] = []

    async def run() -> None:
        try:
            await world.worker.RunWorkload(actor.run())
        except worker_calls.CallError as e:
            answers.append(e)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await _until(_called(world.runtime, "start", "app"), "start")
        world.worker.draining = True
        assert world.worker.abandon_startups() == [UID]
        gate.set()
    [answer] = answers
    assert isinstance(answer, worker_calls.CallError)
    assert answer.code.name == "UNAVAILABLE" and "draining" in answer.message
    world.assert_nothing_left()


async def test_a_checkpoint_abandoned_mid_way_still_tears_down_and_frees_the_uid(
    world: World,
) -> None:
    """A Checkpoint is neither undone nor stopped when its caller leaves (upstream's is not
    cancellable): it writes the image, tears the sandbox down and deletes the activation;
    the next Restore of the UID runs."""
    actor = Actor(world.tmp / "actor", uid=UID, runsc=str(world.tmp / "runsc")).prepare()
    await world.worker.RunWorkload(actor.run())
    world.runtime.gates_on["checkpoint", "_pause"] = gate = anyio.Event()
    async with _abandoned(lambda: world.worker.CheckpointWorkload(actor.checkpoint_request())):
        await _until(_called(world.runtime, "checkpoint", "_pause"), "checkpoint")
    gate.set()
    await _until(lambda: world.activations() == [(f"{UID}.1", "deleted")], "deleted")
    assert (
        world.runtime.roots.get(f"{UID}.1") is None
        or not world.runtime.roots[f"{UID}.1"].containers
    )
    assert (actor.checkpoint / "checkpoint.img").is_file()
    actor.checkpoint.rename(actor.restore)
    with anyio.fail_after(10):
        await world.worker.RestoreWorkload(actor.restore_request())
    assert world.activations() == [(f"{UID}.1", "deleted"), (f"{UID}.2", "running")]
    await world.worker.TerminateWorkload(actor.terminate())
    world.assert_nothing_left()


# --- from outside: grpc deadlines on the agent process (runsc: the stand-in) ----------------


@pytest.mark.runc
@pytest.mark.parametrize(
    ("delayed", "where"),
    [
        pytest.param("create", "in create _pause", id="create"),
        pytest.param("start", "in start _pause", id="start"),
    ],
)
def test_a_grpc_deadline_in_a_slow_step_is_undone(
    tmp_path: Path, runc_path: str, delayed: str, where: str
) -> None:
    """The stand-in takes 3 s over ``delayed``; the client's 1.5 s deadline falls in its
    first one. The Run is answered DEADLINE_EXCEEDED and undone by the agent itself: once
    the step ends, nothing of it is left (no container, no root), with no Terminate; then
    Terminate answers OK and a new Run runs."""
    standin = node_.install_runsc_standin(tmp_path / "bin")
    env = {"RUNSC_STANDIN_RUNC": runc_path, "RUNSC_STANDIN_DELAY": f"{delayed}=3"}
    socket = tmp_path / "worker" / "worker.sock"
    agent = AgentProcess.on_socket(
        tmp_path, "--worker-socket", str(socket), "--runsc", str(standin), env=env
    )
    try:
        worker = connect(socket)
        actor = Actor(tmp_path / "actor", uid=UID, runsc=str(standin)).prepare()
        code, _ = status_of(worker.RunWorkload, actor.run(), timeout=1.5)
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED, where

        def undone() -> bool:
            return (f"{UID}.1", "deleted") in [
                (e["actor_id"], e["type"]) for e in logged_events(agent.log)
            ]

        wait_until(undone, timeout=60)
        root = tmp_path / "runsc-root" / f"{UID}.1"
        assert not root.exists(), f"{where}: {sorted(root.rglob('*'))}"
        assert worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest()).samples == []
        ok = grpc.StatusCode.OK
        assert status_of(worker.TerminateWorkload, actor.terminate(), timeout=60) == (ok, "")
        assert status_of(worker.RunWorkload, actor.run(), timeout=60) == (ok, "")
        assert status_of(worker.TerminateWorkload, actor.terminate(), timeout=60) == (ok, "")
        assert not (tmp_path / "runsc-root" / f"{UID}.2").exists()
    finally:
        assert agent.terminate() == 0, agent.stderr()[-3000:]
