"""SIGTERM to an agent serving the worker API: upstream's ``gracefulShutdown`` (runsc: the
stand-in over real runc, so the app containers are real processes that get real signals).
The whole sequence on real gVisor is tests/runsc/test_real_worker_api.py's."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from support import runc_bundle

from substrate_gpu.testing import node as node_

from .agentproc import AgentProcess
from .workerclient import Actor, connect, status_of, wait_until

pytestmark = pytest.mark.runc

#: An app that exits on SIGTERM, leaving a mark in its rootfs. Each app marks when its trap
#: is set: Run answers once the container started, maybe before its shell's first line, and a
#: SIGTERM before the trap would test nothing (:func:`_trapped` waits for the mark).
POLITE = [
    "sh", "-c",
    "trap 'echo bye > /tmp/bye; exit 0' TERM; echo > /tmp/trapped; while true; do sleep 0.1; done",
]  # fmt: skip
#: An app that never exits on SIGTERM (it ignores it).
STUBBORN = ["sh", "-c", "trap '' TERM; echo > /tmp/trapped; while true; do sleep 0.1; done"]


def _trapped(actor: Actor) -> None:
    """Wait until every app container of ``actor`` has set its TERM trap."""
    for app in actor.apps:
        wait_until((actor.bundles / app / "rootfs" / "tmp" / "trapped").exists, every=0.02)


def _agent(tmp_path: Path, runc_path: str, grace: float) -> AgentProcess:
    standin = node_.install_runsc_standin(tmp_path / "bin")
    return AgentProcess.on_socket(
        tmp_path,
        "--worker-socket", str(tmp_path / "worker" / "worker.sock"),
        "--atelet-socket", "",
        "--runsc", str(standin),
        "--workload-grace", str(grace),
        env={"RUNSC_STANDIN_RUNC": runc_path},
    )  # fmt: skip


def _sandbox_exited(log: Path) -> list[str]:
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    events = [line.get("event", line) for line in lines]
    return [e["actor_id"] for e in events if e.get("type") == "sandbox_exited"]


@pytest.fixture
def cleanup(tmp_path: Path, runc_path: str):
    yield
    for actor_root in (tmp_path / "runsc-root").glob("*"):
        runc_bundle.delete_all(actor_root, runc=runc_path)


def test_sigterm_reaches_each_app_container_and_the_agent_exits_when_they_have(
    tmp_path: Path, runc_path: str, cleanup: None
) -> None:
    """Each app container gets SIGTERM (its handler runs), the agent does not wait out the
    grace once they exited, and the log records the actor's sandbox_exited."""
    agent = _agent(tmp_path, runc_path, grace=60)
    worker = connect(tmp_path / "worker" / "worker.sock")
    actor = Actor(
        tmp_path / "polite", runsc=agent.runsc, uid="polite", apps=("app", "side"), app_args=POLITE
    ).prepare()
    assert status_of(worker.RunWorkload, actor.run()) == (grpc.StatusCode.OK, "")
    _trapped(actor)
    started = time.monotonic()
    assert agent.terminate(signal.SIGTERM, timeout=40) == 0
    assert time.monotonic() - started < 30  # not the 60 s grace: the apps exited
    for app in ("app", "side"):
        assert (actor.bundles / app / "rootfs" / "tmp" / "bye").read_text() == "bye\n"
    assert _sandbox_exited(agent.log) == ["polite.1"]
    stderr = agent.stderr()
    assert stderr.count("sending SIGTERM to container") == 2
    assert "killing container" not in stderr


def test_an_app_that_ignores_sigterm_is_killed_at_the_grace_deadline(
    tmp_path: Path, runc_path: str, cleanup: None
) -> None:
    """No exit after SIGTERM: SIGKILL once --workload-grace has passed, then the agent exits."""
    agent = _agent(tmp_path, runc_path, grace=2)
    worker = connect(tmp_path / "worker" / "worker.sock")
    actor = Actor(tmp_path / "stubborn", runsc=agent.runsc, uid="stubborn", app_args=STUBBORN)
    assert status_of(worker.RunWorkload, actor.prepare().run()) == (grpc.StatusCode.OK, "")
    _trapped(actor)
    started = time.monotonic()
    assert agent.terminate(signal.SIGTERM, timeout=40) == 0
    took = time.monotonic() - started
    assert 2 <= took < 25, took
    assert "grace period expired; killing container" in agent.stderr()
    assert _sandbox_exited(agent.log) == ["stubborn.1"]
    state = subprocess.run(
        [runc_path, "--root", str(tmp_path / "runsc-root" / "stubborn.1"), "state", "app"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(state.stdout)["status"] == "stopped"


def test_a_checkpoint_in_flight_finishes_before_the_apps_are_signalled(
    tmp_path: Path, runc_path: str, cleanup: None
) -> None:
    """SIGTERM while a CheckpointWorkload runs: it completes and answers OK (its actor is
    saved), and the agent then exits."""
    agent = _agent(tmp_path, runc_path, grace=60)
    worker = connect(tmp_path / "worker" / "worker.sock")
    actor = Actor(tmp_path / "saved", runsc=agent.runsc, uid="saved").prepare()
    assert status_of(worker.RunWorkload, actor.run()) == (grpc.StatusCode.OK, "")
    checkpoint = worker.CheckpointWorkload.future(actor.checkpoint_request(), timeout=120)
    time.sleep(0.05)
    agent.process.send_signal(signal.SIGTERM)
    reply = checkpoint.result(timeout=60)
    assert "checkpoint.img" in reply.snapshot_files
    assert agent.wait(timeout=40) == 0


def test_while_draining_an_actor_can_still_be_checkpointed_and_terminated(
    tmp_path: Path, runc_path: str, cleanup: None
) -> None:
    """After SIGTERM, while the agent waits for app containers that ignore it, a Checkpoint
    saves its actor and a Terminate ends another (upstream's worker serves both while it
    drains, so an actor can be suspended on the way out); a new Run is UNAVAILABLE. With
    both sandboxes gone, the agent exits before the grace."""
    agent = _agent(tmp_path, runc_path, grace=60)
    worker = connect(tmp_path / "worker" / "worker.sock")
    saved = Actor(tmp_path / "saved", runsc=agent.runsc, uid="saved", app_args=STUBBORN)
    ended = Actor(tmp_path / "ended", runsc=agent.runsc, uid="ended", app_args=STUBBORN)
    for actor in (saved.prepare(), ended.prepare()):
        assert status_of(worker.RunWorkload, actor.run()) == (grpc.StatusCode.OK, "")
        _trapped(actor)
    started = time.monotonic()
    agent.process.send_signal(signal.SIGTERM)
    # Not prepared: INVALID_ARGUMENT (no bundle) until the drain refuses it before reading.
    late = Actor(tmp_path / "late", runsc=agent.runsc, uid="late")
    code, message = grpc.StatusCode.OK, ""
    for _ in range(100):  # the signal lands a moment later
        code, message = status_of(worker.RunWorkload, late.run(), timeout=10)
        if code == grpc.StatusCode.UNAVAILABLE:
            break
        time.sleep(0.05)
    assert code == grpc.StatusCode.UNAVAILABLE and "worker draining" in message, message
    reply = worker.CheckpointWorkload(saved.checkpoint_request(), timeout=30)
    assert "checkpoint.img" in reply.snapshot_files
    assert status_of(worker.TerminateWorkload, ended.terminate(), timeout=30) == (
        grpc.StatusCode.OK,
        "",
    )
    assert agent.wait(timeout=40) == 0
    assert time.monotonic() - started < 45  # not the 60 s grace: nothing was left to stop
