"""A process hosting an Agent over an EventLog, for the SIGKILL tests (run as a subprocess).

    python kill_driver.py DIR first [ROTATE]    # drive every actor through its goals, acking
    python kill_driver.py DIR recover [ROTATE]  # recover from DIR/events.jsonl, drive to the end
    python kill_driver.py DIR window:TYPE       # drive a0 until an event of TYPE is appended,
                                                # then never make anything durable again

``ROTATE`` is the log's ``rotate_bytes`` (default 4096, so kills also hit rotations), or
``none``.

The runtime is :class:`DiskRuntime`: containers are files under ``DIR/runtime`` (so they
survive the kill, as runsc's state does), each operation takes a few milliseconds (so kills
land mid-effect) and appends what it *did* to ``DIR/runtime-calls.jsonl`` after doing it.
Every event the Agent accepted is acknowledged on stdout as one JSON line
``{"ack": [actor, type, at, seq]}`` once ``submit`` returned (i.e. once it was fsynced).
The ``recover`` phase ends by printing ``{"final": {actor: state}}``.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
from pathlib import Path

import anyio
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from substrate_gpu import eventlog
from substrate_gpu.lifecycle import Agent, errors, events, machine
from substrate_gpu.observability import configure_logging
from substrate_gpu.probes.api import GpuClient
from substrate_gpu.runsc import api as runsc

ACTORS = [f"a{i}" for i in range(6)]
#: Each actor's goals, in order; the last one is where it must end, crash or not.
GOALS = {
    actor: [
        "running",
        "suspended",
        "running",
        "suspended",
        ["running", "suspended", "deleted"][i % 3],
    ]
    for i, actor in enumerate(ACTORS)
}
#: The states that run an effect, from the machine (never a hand copy).
IN_FLIGHT = machine.load_spec().in_flight_states


def _error(cls: type[runsc.RunscError], message: str) -> runsc.RunscError:
    return cls(message, argv=("runsc",), returncode=1, stderr=message)


class DiskRuntime:
    """A SandboxRuntime whose containers live in files (see the module doc)."""

    def __init__(self, root: Path) -> None:
        self.root = root / "runtime"
        self.root.mkdir(parents=True, exist_ok=True)
        self.journal = root / "runtime-calls.jsonl"

    def _file(self, cid: str) -> Path:
        return self.root / f"{cid}.json"

    def _get(self, cid: str) -> dict[str, object] | None:
        try:
            return json.loads(self._file(cid).read_text())  # type: ignore[no-any-return]
        except FileNotFoundError:
            return None

    def _put(self, cid: str, status: str | None) -> None:
        if status is None:
            self._file(cid).unlink(missing_ok=True)
        else:
            tmp = self._file(cid).with_suffix(".tmp")
            tmp.write_text(json.dumps({"status": status}))
            tmp.replace(self._file(cid))

    def _did(self, op: str, cid: str, **extra: object) -> None:
        with self.journal.open("a") as f:
            f.write(json.dumps({"op": op, "cid": cid, **extra}) + "\n")

    async def _work(self) -> None:
        await anyio.sleep(random.uniform(0.001, 0.006))

    async def features(self) -> runsc.RunscFeatures:
        return runsc.RunscFeatures("fake", False, False, False, False)

    async def create(self, container_id: str, bundle: Path, *, nvproxy: bool) -> None:
        await self._work()
        if self._get(container_id) is not None:
            self._did("error", container_id, message="create: already exists")
            raise _error(runsc.RunscError, f"container {container_id} already exists")
        self._put(container_id, "created")
        self._did("create", container_id)

    async def start(self, container_id: str) -> None:
        await self._work()
        c = self._get(container_id)
        if c is None or c["status"] != "created":
            self._did("error", container_id, message=f"start: in state {c and c['status']}")
            raise _error(runsc.RunscError, "cannot start")
        self._put(container_id, "running")
        self._did("start", container_id)

    async def checkpoint(
        self,
        container_id: str,
        image_path: Path,
        *,
        leave_running: bool,
        cuda_checkpoint_path: Path | None = None,
        cuda_checkpoint_sequential: bool = False,
    ) -> None:
        await self._work()
        c = self._get(container_id)
        if c is None or c["status"] != "running":
            raise _error(runsc.ContainerStoppedError, "cannot checkpoint: stopped")
        image_path.mkdir(parents=True, exist_ok=True)
        image = image_path / "checkpoint.img"
        if image.exists():
            self._did("error", container_id, message=f"checkpoint: {image} exists")
            raise _error(runsc.RunscError, f"{image} exists")
        image.write_text(container_id)
        self._put(container_id, "stopped")
        self._did("checkpoint", container_id, image=str(image_path))

    async def restore(
        self, container_id: str, bundle: Path, image_path: Path, *, nvproxy: bool
    ) -> None:
        await self._work()
        if self._get(container_id) is not None:
            self._did("error", container_id, message="restore: already exists")
            raise _error(runsc.RunscError, "already exists")
        self._put(container_id, "running")
        self._did("restore", container_id, image=str(image_path))

    async def state(self, container_id: str) -> runsc.ContainerState:
        c = self._get(container_id)
        if c is None:
            raise _error(runsc.ContainerNotFoundError, f"container {container_id} does not exist")
        return runsc.ContainerState(id=container_id, status=c["status"], pid=0, bundle="/b")  # type: ignore[arg-type]

    async def kill(self, container_id: str, signal: str = "KILL") -> None:
        self._put(container_id, "stopped")

    async def delete(self, container_id: str, *, force: bool = False) -> None:
        await self._work()
        if self._get(container_id) is None:
            raise _error(runsc.ContainerNotFoundError, f"container {container_id} does not exist")
        self._put(container_id, None)
        self._did("delete", container_id)


class NoContexts:
    """A probe that never finds a live CUDA context."""

    async def live_clients(self, pids: tuple[int, ...]) -> tuple[GpuClient, ...]:
        return ()


async def inject(bundle: Path) -> int:
    """Injection stand-in (idempotent)."""
    await anyio.sleep(0.001)
    return 2


_clock = [0.0]


class SeqNoting:
    """The EventLog (group commit, as the agent's), noting each recorded event's seq so the
    ack can carry it. ``window``: once an event of that type is appended, no later wait for
    durability ever returns (its fsync never comes): the driver says so on stdout and the
    test kills it there."""

    def __init__(self, log: eventlog.EventLog, window: str | None = None) -> None:
        self.log = log
        self.seqs: dict[tuple[str, str, float], int] = {}
        self._window = window
        self._stuck = False

    async def record(self, event: events.Event) -> None:
        self.append(event)
        await self.durable()

    def append(self, event: events.Event) -> None:
        self.seqs[(event.actor_id, event.type, event.at)] = event.seq
        self.log.append(event)
        if event.type == self._window and not self._stuck:
            self._stuck = True
            print(json.dumps({"window": event.type}), flush=True)

    async def durable(self) -> None:
        if self._stuck:
            await anyio.sleep(math.inf)
        await self.log.durable()

    async def record_rejected(self, event: events.Event, state: str, problem: str) -> None:
        await self.log.record_rejected(event, state, problem)


def _next_event(
    actor_id: str, state: str | None, goal: str, checkpoint: str | None
) -> events.Event | None:
    if state in IN_FLIGHT:
        return None
    if state is None:
        return events.ActorRegistered(actor_id=actor_id, gpu=True, bundle=f"/b/{actor_id}")
    if state == "registered":
        return events.BundlePrepared(actor_id=actor_id, bundle=f"/b/{actor_id}")
    if goal == "deleted":
        return events.DeleteRequested(actor_id=actor_id)
    if state == "failed":
        return events.RetryRequested(actor_id=actor_id)
    if state == "running":
        return events.SuspendRequested(actor_id=actor_id)  # goal suspended
    if state in {"suspended", "stopped", "bundle_prepared"}:
        if state == "suspended" or (checkpoint and goal == "running"):
            return events.RestoreRequested(actor_id=actor_id)
        return events.RunRequested(actor_id=actor_id)
    return None


async def _drive(agent: Agent, recorder: SeqNoting, actor_id: str, goals: list[str]) -> None:
    for goal in goals:
        while True:
            view = agent.actor(actor_id)
            state = view.state if view is not None else None
            if state == goal:
                break
            event = _next_event(actor_id, state, goal, view.checkpoint if view else None)
            if event is None:
                await anyio.sleep(0.001)
                continue
            _clock[0] += 1
            event = msgspec.structs.replace(event, at=1000.0 + _clock[0] / 1000)
            try:
                await agent.submit(event)
            except errors.InvalidEvent:
                await anyio.sleep(0.001)
                continue
            seq = recorder.seqs.pop((event.actor_id, event.type, event.at))
            print(json.dumps({"ack": [event.actor_id, event.type, event.at, seq]}), flush=True)


async def main(root: Path, phase: str, rotate: str) -> None:
    runtime = DiskRuntime(root)
    path = root / "events.jsonl"
    resume = None
    if phase == "recover":
        recovery = await eventlog.recover(
            path, runtime=runtime, checkpoint_root=root / "checkpoints"
        )
        resume = recovery.resume
        print(json.dumps({"reconciled": [r.describe() for r in recovery.report]}), flush=True)
        _clock[0] = 10_000.0 + os.getpid() % 1000
    window = phase.partition(":")[2] or None
    async with await eventlog.EventLog.open(
        path, rotate_bytes=None if rotate == "none" else int(rotate)
    ) as log:
        recorder = SeqNoting(log, window)
        async with Agent(
            runtime=runtime,
            probe=NoContexts(),
            injector=inject,
            checkpoint_root=root / "checkpoints",
            recorder=recorder,
            resume=resume,
        ) as agent:
            async with anyio.create_task_group() as tg:
                if window is not None:
                    # One actor, to running and suspended: nothing else makes its way durable.
                    tg.start_soon(_drive, agent, recorder, ACTORS[0], GOALS[ACTORS[0]][:2])
                for actor_id in ACTORS if window is None else ():
                    goals = GOALS[actor_id] if phase == "first" else GOALS[actor_id][-1:]
                    tg.start_soon(_drive, agent, recorder, actor_id, goals)
            await agent.settle()
            final = {a: agent.state_of(a) for a in ACTORS}
    print(json.dumps({"final": final}), flush=True)


if __name__ == "__main__":
    # As the agent's CLI does: stdout carries only the acks, logs go to stderr.
    configure_logging(stream=sys.stderr)
    anyio.run(main, Path(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "4096")
