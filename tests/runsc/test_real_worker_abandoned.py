"""On real gVisor, from outside through the worker API: nothing of an activation outlives it.

- **Abandoned calls** (issue 31 §3): Run and Restore calls whose deadlines fall at random
  points of their work (0.02–0.6 × the time this machine's first Run took, measured at the
  start: registering, booting ``_pause``, starting the app, after it runs — fixed
  deadlines let most calls finish on a fast machine); each is followed by a Terminate,
  which answers OK, and nothing of the UID is left: no live activation, no container, no
  runsc root, no mount. A last Run runs.
- **No leak per activation** (issue 31 §4): with ``--network=none`` runsc mounts each
  sandbox's network namespace (``nsfs``) at ``<root>/null-netns``. After Terminate, a
  checkpoint's teardown, a failed Run, a failed Restore and an agent SIGKILLed and
  recovered, ``/proc/self/mountinfo`` holds no mount under the agent's runsc root and every
  activation's root is gone.

The agent runs in this test's mount namespace, so its mount table is this process's.
``SUBSTRATE_GPU_ABANDON_SEED`` replays one random sequence (it is printed on failure).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from service.agentproc import AgentProcess
from service.workerclient import Actor, connect, status_of
from support import real_runsc as runsc_

from substrate_gpu.service.ateworker import ateworker_pb2 as pb

OK = grpc.StatusCode.OK
#: The abandoned calls: as issue 31 §3 tried them from outside.
ROUNDS = 50
#: Deadlines as fractions of the first Run's time here (a cold one: later runs are faster).
DEADLINES = (0.02, 0.6)
#: A Terminate waits out the effect in flight: within the effect timeouts, far less here.
TERMINATE_TIMEOUT = 120.0


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below ``root`` in /proc/self/mountinfo (octal escapes undone)."""
    real = os.path.realpath(root)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split(" ")[4])
        if point == real or point.startswith(real + "/"):
            found.append(point)
    return found


@pytest.fixture
def root(real_runsc: Path, tmp_path: Path) -> Iterator[Path]:
    """The agent's runsc root; anything left under it is cleaned up at teardown."""
    root = tmp_path / "runsc-root"
    yield root
    if root.exists():
        for actor_root in root.iterdir():
            if actor_root.is_dir():
                runsc_.delete_all(real_runsc, actor_root)


def _args(real_runsc: Path, tmp_path: Path, root: Path) -> tuple[str, ...]:
    """The agent's flags (its runsc root is ``root``: AgentProcess gives it)."""
    assert root == tmp_path / "runsc-root"
    flags = [f"--runsc-flag={f}" for f in runsc_.GLOBAL_FLAGS]
    return ("--runsc", str(real_runsc), *flags, "--worker-socket", str(tmp_path / "worker.sock"))


@pytest.fixture
def agent(real_runsc: Path, tmp_path: Path, root: Path) -> Iterator[AgentProcess]:
    process = AgentProcess.on_socket(tmp_path, *_args(real_runsc, tmp_path, root))
    try:
        yield process
    finally:
        assert process.terminate() == 0, process.stderr()[-3000:]


def _nothing_left(worker, agent: AgentProcess, root: Path, uid: str, where: str) -> None:
    """No live activation of ``uid`` (stats, the JSON door), no root, no mount."""
    samples = worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest(), timeout=10)
    assert [s.actor_uid for s in samples.samples] == [], where
    with agent.client() as client:
        listed = client.request({"query": "actors"})["actors"]
    left = [(a["actor_id"], a["state"]) for a in listed if a["actor_id"].startswith(uid)]
    assert all(state == "deleted" for _, state in left), (where, left)
    assert mounts_under(root) == [], where
    assert not root.exists() or list(root.iterdir()) == [], (where, list(root.iterdir()))


def _checkpointed(worker, actor: Actor) -> float:
    """Run, Checkpoint (the teardown), and the image copied where a Restore reads it; the
    seconds the Run took."""
    started = time.monotonic()
    assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
    took = time.monotonic() - started
    worker.CheckpointWorkload(actor.checkpoint_request(), timeout=120)
    shutil.copytree(actor.checkpoint, actor.restore)
    return took


def test_abandoned_runs_and_restores_never_strand_the_uid(
    worker_and_agent, real_runsc: Path, root: Path, tmp_path: Path
) -> None:
    """50 Run or Restore calls abandoned at random deadlines, each followed by Terminate:
    OK every time, nothing left after each; then a Run of the UID runs."""
    worker, agent = worker_and_agent
    seed = int(os.environ.get("SUBSTRATE_GPU_ABANDON_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    actor = Actor(tmp_path / "actor", uid="abandoned", runsc=str(real_runsc)).prepare()
    run_took = _checkpointed(worker, actor)
    _nothing_left(worker, agent, root, actor.uid, "after the checkpoint's teardown")
    outcomes: dict[str, int] = {}
    low, high = DEADLINES
    for n in range(ROUNDS):
        # Within the Run this machine just did, so most calls are abandoned at some step.
        deadline = rng.uniform(low, high) * run_took
        restore = rng.random() < 0.3
        where = f"round {n} ({'Restore' if restore else 'Run'} at {deadline * 1000:.0f} ms, seed {seed})"
        request = actor.restore_request(preserve_restore_dir=True) if restore else actor.run()
        call = worker.RestoreWorkload if restore else worker.RunWorkload
        code, message = status_of(call, request, timeout=deadline)
        assert code in {OK, grpc.StatusCode.DEADLINE_EXCEEDED}, (where, code, message)
        outcomes[code.name] = outcomes.get(code.name, 0) + 1
        started = time.monotonic()
        code, message = status_of(worker.TerminateWorkload, actor.terminate(), TERMINATE_TIMEOUT)
        assert (code, message) == (OK, ""), where
        assert time.monotonic() - started < TERMINATE_TIMEOUT, where
        _nothing_left(worker, agent, root, actor.uid, where)
    assert outcomes.get("DEADLINE_EXCEEDED", 0) > ROUNDS // 2, outcomes  # mostly abandoned
    assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
    listed = worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest(), timeout=10)
    assert [s.actor_uid for s in listed.samples] == [actor.uid]
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
    _nothing_left(worker, agent, root, actor.uid, "after the last Run")


@pytest.fixture
def worker_and_agent(agent: AgentProcess, tmp_path: Path):
    return connect(tmp_path / "worker.sock"), agent


def test_twenty_activations_leave_no_mount_and_no_root(
    real_runsc: Path, root: Path, tmp_path: Path
) -> None:
    """20 activations ended every way an activation ends: Terminate, a checkpoint's teardown
    (then restored and terminated), a failed Run, a failed Restore, and sandboxes running
    when the agent was SIGKILLed, terminated by the agent recovered from its log. Each
    sandbox booted under --network=none mounted its null-netns; none is left, nor a root."""
    args = _args(real_runsc, tmp_path, root)
    first = AgentProcess.on_socket(tmp_path, *args)
    activations = 0
    try:
        worker = connect(tmp_path / "worker.sock")
        for n in range(6):  # Run, Terminate
            actor = Actor(tmp_path / f"t{n}", uid=f"t{n}", runsc=str(real_runsc)).prepare()
            assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
            assert mounts_under(root / f"t{n}.1"), "runsc mounted no null-netns: nothing tested"
            assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
            activations += 1
        for n in range(3):  # Run, Checkpoint (teardown); Restore, Terminate
            actor = Actor(tmp_path / f"c{n}", uid=f"c{n}", runsc=str(real_runsc)).prepare()
            _checkpointed(worker, actor)
            assert mounts_under(root) == [] and not (root / f"c{n}.1").exists()
            restore = actor.restore_request(preserve_restore_dir=True)
            assert status_of(worker.RestoreWorkload, restore) == (OK, "")
            assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
            activations += 2
        for n in range(4):  # a Run whose app cannot start
            broken = Actor(
                tmp_path / f"f{n}", uid=f"f{n}", runsc=str(real_runsc), app_args=["/no/such/binary"]
            )
            code, message = status_of(worker.RunWorkload, broken.prepare().run())
            assert code == grpc.StatusCode.INTERNAL, message
            activations += 1
        for n in range(2):  # a Restore of an image runsc cannot read
            bad = Actor(tmp_path / f"r{n}", uid=f"r{n}", runsc=str(real_runsc)).prepare()
            bad.restore.mkdir()
            (bad.restore / "checkpoint.img").write_bytes(b"not an image")
            code, message = status_of(worker.RestoreWorkload, bad.restore_request())
            assert code != OK, message
            activations += 1
        assert mounts_under(root) == []
        kept = [
            Actor(tmp_path / f"k{n}", uid=f"k{n}", runsc=str(real_runsc)).prepare()
            for n in range(2)
        ]
        for actor in kept:
            assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
            activations += 1
        assert len(mounts_under(root)) >= 2  # the running sandboxes' own
        first.process.send_signal(9)
        first.wait()
    finally:
        first.kill()
    second = AgentProcess.on_socket(tmp_path, *args)
    try:
        worker = connect(tmp_path / "worker.sock")
        for actor in kept:
            assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
    finally:
        assert second.terminate() == 0, second.stderr()[-3000:]
    assert activations == 20
    assert mounts_under(root) == []
    assert not root.exists() or list(root.iterdir()) == []
