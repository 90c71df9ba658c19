"""Checkpoint images hold the sandbox's memory (its keys and tokens): through either door of
the real agent process, running under umask 022, the directories made for an image are 0700
and its files 0600 (runsc: the stand-in over real runc, which writes them 0755/0644 as runsc
does; real runsc: tests/runsc/test_real_lifecycle.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from substrate_gpu.testing import bundles
from substrate_gpu.testing import node as node_

from .agentproc import AgentProcess, event
from .workerclient import PAUSE_ARGS, Actor, connect, status_of

pytestmark = pytest.mark.runc

OK = grpc.StatusCode.OK


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, runc_path: str) -> Iterator[AgentProcess]:
    """One agent for the module, umask 022, runsc: the stand-in over runc."""
    tmp = tmp_path_factory.mktemp("modes")
    standin = node_.install_runsc_standin(tmp / "bin")
    process = AgentProcess.on_socket(
        tmp,
        "--worker-socket",
        str(tmp / "worker" / "worker.sock"),
        "--runsc",
        str(standin),
        env={"RUNSC_STANDIN_RUNC": runc_path},
        umask=0o022,
    )
    try:
        yield process
    finally:
        process.terminate()


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def _files(directory: Path) -> dict[str, int]:
    return {p.name: _mode(p) for p in directory.iterdir() if p.is_file()}


@pytest.mark.parametrize(
    ("made_by_atelet", "directory_mode"),
    [
        pytest.param(False, 0o700, id="made-by-the-agent"),
        pytest.param(True, 0o755, id="atelets-own-kept"),
    ],
)
def test_a_worker_api_checkpoint_is_private(
    agent: AgentProcess, tmp_path: Path, made_by_atelet: bool, directory_mode: int
) -> None:
    """``actor_dirs.checkpoint_dir``: made 0700 when absent, atelet's own directory left as
    it is; every file in it 0600 before CheckpointWorkload answers."""
    worker = connect(agent.tmp / "worker" / "worker.sock")
    actor = Actor(
        tmp_path / "actor", runsc=agent.runsc, uid=f"modes-{int(made_by_atelet)}"
    ).prepare()
    if made_by_atelet:
        actor.checkpoint.mkdir(mode=0o755)
    assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
    reply = worker.CheckpointWorkload(actor.checkpoint_request(), timeout=120)
    assert "checkpoint.img" in reply.snapshot_files
    assert _mode(actor.checkpoint) == directory_mode
    files = _files(actor.checkpoint)
    assert set(files) == set(reply.snapshot_files) and set(files.values()) == {0o600}, files


def test_a_json_door_suspend_is_private(agent: AgentProcess, tmp_path: Path) -> None:
    """``<checkpoint-root>/<actor>/<seq>``: each directory made 0700, each file 0600."""
    bundle = bundles.make_bundle(tmp_path / "bundle", PAUSE_ARGS)
    with agent.client() as client:
        for line in (
            event("actor_registered", "jd", gpu=False, bundle=str(bundle)),
            event("bundle_prepared", "jd", bundle=str(bundle)),
            event("run_requested", "jd"),
        ):
            assert client.request(line)["ok"], line
        _wait_for(client, "jd", "running")
        assert client.request(event("suspend_requested", "jd"))["ok"]
        actor = _wait_for(client, "jd", "suspended")
        assert client.request(event("delete_requested", "jd"))["ok"]
        _wait_for(client, "jd", "deleted")
    image = Path(actor["checkpoint"])
    root = agent.tmp / "checkpoints"
    assert image.parent.parent == root
    assert [_mode(d) for d in (root, image.parent, image)] == [0o700] * 3
    files = _files(image)
    assert "checkpoint.img" in files and set(files.values()) == {0o600}, files


def _wait_for(client, actor_id: str, state: str) -> dict[str, object]:
    deadline = time.monotonic() + 30
    while True:
        actor = client.request({"query": "actor", "actor_id": actor_id})["actor"]
        if actor["state"] == state:
            return actor
        assert time.monotonic() < deadline, actor
        time.sleep(0.05)
