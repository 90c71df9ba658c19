"""The worker API composes each container's rootfs from atelet's cached layers before runsc
creates it, and detaches it on Terminate, after a checkpoint's teardown, after a failed Run
and at start for activations already deleted (issue 31 item 2). runsc: the stand-in over
real runc, so what the app sees is the real composed overlay; the same on real gVisor is in
tests/runsc/test_real_worker_api_rootfs.py."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import grpc
import pytest

from substrate_gpu.rootfs import overlay
from substrate_gpu.testing import node as node_

from .agentproc import AgentProcess
from .layered import OBSERVER_ARGS, SEEN, layered_actor_bundles
from .workerclient import Actor, connect, status_of

pytestmark = pytest.mark.runc

OK = grpc.StatusCode.OK


@pytest.fixture
def layers(tmp_path: Path) -> Path:
    return tmp_path / "var-lib-ate" / "image-cache" / "layers"


@pytest.fixture
def agent(tmp_path: Path, runc_path: str, layers: Path):
    standin = node_.install_runsc_standin(tmp_path / "bin")
    process = AgentProcess.on_socket(
        tmp_path,
        "--worker-socket",
        str(tmp_path / "worker" / "worker.sock"),
        "--runsc",
        str(standin),
        "--image-layers-dir",
        str(layers.parent.parent),
        env={"RUNSC_STANDIN_RUNC": runc_path},
    )
    try:
        yield process
    finally:
        process.terminate()
        overlay.unmount_all_under(tmp_path)


@pytest.fixture
def worker(agent: AgentProcess, tmp_path: Path):
    return connect(tmp_path / "worker" / "worker.sock")


def _layered(tmp_path: Path, layers: Path) -> Actor:
    runsc = str(tmp_path / "bin" / "runsc")
    # A UID of its own: the sandbox's cgroup is named after it, and tests run in parallel.
    uid = str(uuid.uuid4())
    actor = Actor(tmp_path / "actor", uid=uid, app_args=list(OBSERVER_ARGS), runsc=runsc)
    actor.prepare()
    layered_actor_bundles(actor.bundles, layers, actor.apps)
    return actor


def _seen(actor: Actor) -> str:
    """What the app wrote into ``/seen``: through the overlay, into its private upper."""
    seen = actor.bundles / "app" / "upper" / "seen"
    deadline = time.monotonic() + 20
    while not (seen.exists() and seen.read_text().count("\n") >= 3):
        assert time.monotonic() < deadline, "the app never reported what it sees"
        time.sleep(0.05)
    return seen.read_text()


def test_run_composes_the_layers_and_terminate_detaches_them(
    worker, tmp_path: Path, layers: Path, agent: AgentProcess
) -> None:
    actor = _layered(tmp_path, layers)
    assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
    mounted = sorted(overlay.mount_points_under(actor.bundles))
    assert mounted == sorted(
        [str(actor.bundles / "_pause/rootfs"), str(actor.bundles / "app/rootfs")]
    )
    assert _seen(actor) == SEEN  # the whiteout, the opaque dir and the top layer's file
    assert (actor.bundles / "app/upper/run/identity").is_dir()  # extraDirs, in the upper
    assert not (layers / "sha256-base/fs/seen").exists()  # never into a shared layer
    assert "rootfs composed" in agent.stderr()

    assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
    assert overlay.mount_points_under(actor.bundles) == []

    # A new Run of the same bundles composes again (the earlier volatile work dir renewed).
    assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
    assert len(overlay.mount_points_under(actor.bundles)) == 2
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
    assert overlay.mount_points_under(actor.bundles) == []


def test_checkpoint_teardown_detaches_the_rootfs(worker, tmp_path: Path, layers: Path) -> None:
    actor = _layered(tmp_path, layers)
    assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
    assert status_of(worker.CheckpointWorkload, actor.checkpoint_request()) == (OK, "")
    assert overlay.mount_points_under(actor.bundles) == []


def test_a_failed_run_leaves_no_mount(worker, tmp_path: Path, layers: Path) -> None:
    actor = _layered(tmp_path, layers)
    config = actor.bundles / "app" / "config.json"
    doc = json.loads(config.read_text())
    doc["process"]["args"] = ["/no/such/binary"]
    config.write_text(json.dumps(doc))
    code, _ = status_of(worker.RunWorkload, actor.run())
    assert code == grpc.StatusCode.INTERNAL
    assert overlay.mount_points_under(actor.bundles) == []


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ("/etc", "is not under the image layers directory"),
        ("relative", "is not an absolute, normalised path"),
    ],
)
def test_a_layer_outside_the_layers_dir_is_invalid_argument(
    worker, tmp_path: Path, layers: Path, layer: str, message: str
) -> None:
    actor = _layered(tmp_path, layers)
    spec = actor.bundles / "app" / overlay.OVERLAY_SPEC
    spec.write_text(json.dumps({"version": 1, "layers": [layer]}))
    code, details = status_of(worker.RunWorkload, actor.run())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in details and str(spec) in details
    assert overlay.mount_points_under(actor.bundles) == []  # _pause's, made first, undone


def test_a_restarted_agent_detaches_a_deleted_activations_rootfs(
    tmp_path: Path, layers: Path, runc_path: str
) -> None:
    """An agent killed after the delete and before the unmount: the next one detaches it."""
    standin = node_.install_runsc_standin(tmp_path / "bin")
    args = (
        "--worker-socket",
        str(tmp_path / "worker" / "worker.sock"),
        "--runsc",
        str(standin),
        "--image-layers-dir",
        str(layers.parent.parent),
    )
    env = {"RUNSC_STANDIN_RUNC": runc_path}
    actor = _layered(tmp_path, layers)
    first = AgentProcess.on_socket(tmp_path, *args, env=env)
    try:
        worker = connect(tmp_path / "worker" / "worker.sock")
        assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
        assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
    finally:
        first.terminate()
    # Stand in for the kill between delete and unmount: compose the deleted bundle again.
    overlay.compose_bundle(actor.bundles, ("_pause", "app"), layers_dir=layers.parent.parent)
    assert len(overlay.mount_points_under(actor.bundles)) == 2
    second = AgentProcess.on_socket(tmp_path, *args, env=env)
    try:
        connect(tmp_path / "worker" / "worker.sock")
        assert overlay.mount_points_under(actor.bundles) == []
    finally:
        second.terminate()
        overlay.unmount_all_under(tmp_path)
