"""A layered image on real gVisor through the worker API: atelet's bundles carry an empty
rootfs and rootfs-overlay.json, the agent composes each container's rootfs from the cached
layers, the sandbox sees the merged image, and every path that ends the activation (Terminate,
a checkpoint's teardown, a Restore's Terminate, a Run failing after the rootfs is composed)
leaves nothing mounted and no runsc root (issue 31 items 2 and 4)."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from service.agentproc import AgentProcess
from service.layered import OBSERVER_ARGS, SEEN, layered_actor_bundles
from service.workerclient import Actor, connect, status_of
from support import real_runsc as runsc_

from substrate_gpu.rootfs import overlay

OK = grpc.StatusCode.OK


@pytest.fixture
def layers(tmp_path: Path) -> Path:
    return tmp_path / "ate" / "image-cache" / "layers"


@pytest.fixture
def root(real_runsc: Path, tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "runsc-root"
    yield root
    if root.exists():
        for actor_root in root.iterdir():
            if actor_root.is_dir():
                runsc_.delete_all(real_runsc, actor_root)
    overlay.unmount_all_under(tmp_path)


@pytest.fixture
def worker(real_runsc: Path, tmp_path: Path, root: Path, layers: Path) -> Iterator[object]:
    flags = [f"--runsc-flag={f}" for f in runsc_.GLOBAL_FLAGS]
    process = AgentProcess.on_socket(
        tmp_path,
        "--runsc",
        str(real_runsc),
        *flags,
        "--worker-socket",
        str(tmp_path / "worker.sock"),
        "--image-layers-dir",
        str(tmp_path / "ate"),
    )
    try:
        yield connect(tmp_path / "worker.sock")
    finally:
        assert process.terminate() == 0, process.stderr()[-3000:]


def _seen(runsc: Path, actor_root: Path) -> str:
    deadline = time.monotonic() + 30
    while True:
        out = runsc_.run(runsc, actor_root, "exec", "app", "/bin/cat", "/seen", check=False)
        if out.stdout.count("\n") >= 3 or time.monotonic() > deadline:
            return out.stdout
        time.sleep(0.1)


def test_a_layered_image_runs_checkpoints_and_restores_with_nothing_left_mounted(
    worker, real_runsc: Path, root: Path, tmp_path: Path, layers: Path
) -> None:
    uid = str(uuid.uuid4())  # its own: the sandbox's cgroup is named after it
    actor = Actor(tmp_path / "actor", uid=uid, app_args=list(OBSERVER_ARGS), runsc=str(real_runsc))
    actor.prepare()
    layered_actor_bundles(actor.bundles, layers, actor.apps)
    assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
    assert len(overlay.mount_points_under(actor.bundles)) == 2  # _pause's and app's rootfs
    assert _seen(real_runsc, root / f"{actor.uid}.1") == SEEN

    assert status_of(worker.CheckpointWorkload, actor.checkpoint_request()) == (OK, "")
    assert overlay.mount_points_under(actor.bundles) == []  # the teardown detached them

    actor.checkpoint.rename(actor.restore)
    assert status_of(worker.RestoreWorkload, actor.restore_request()) == (OK, "")
    assert len(overlay.mount_points_under(actor.bundles)) == 2
    assert _seen(real_runsc, root / f"{actor.uid}.2") == SEEN  # the restored app's own file
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
    assert overlay.mount_points_under(actor.bundles) == []
    assert runsc_.list_ids(real_runsc, root / f"{actor.uid}.2") == []


def test_a_run_failing_after_the_rootfs_is_composed_leaves_no_mount_and_no_root(
    worker, real_runsc: Path, root: Path, tmp_path: Path, layers: Path
) -> None:
    """The app's command is ``/etc/motd``, a file only the layers have: ``runsc start``
    finds it through the composed overlay and refuses to run it (``permission denied``, not
    ``no such file``: the app's bundle rootfs is empty, so the overlay was mounted and seen).
    The failed Run deletes the sandbox, detaches both containers' overlays and removes the
    activation's runsc root (its ``null-netns`` mount too); the UID then runs afresh."""
    uid = str(uuid.uuid4())
    actor = Actor(tmp_path / "actor", uid=uid, app_args=["/etc/motd"], runsc=str(real_runsc))
    actor.prepare()
    layered_actor_bundles(actor.bundles, layers, actor.apps)
    code, message = status_of(worker.RunWorkload, actor.run())
    assert code == grpc.StatusCode.INTERNAL
    assert "start failed" in message and "failed to load /etc/motd: permission denied" in message
    assert overlay.mount_points_under(tmp_path) == []  # bundles and runsc roots alike
    assert not (root / f"{uid}.1").exists()
    assert [p.name for p in (actor.bundles / "app" / "rootfs").iterdir()] == []

    # atelet prepares the bundles afresh for the next activation (the uppers it wipes hold
    # the failed one's copy-ups, gVisor's filestore among them), this time a working app.
    shutil.rmtree(actor.bundles)
    actor.app_args = list(OBSERVER_ARGS)
    actor.prepare()
    layered_actor_bundles(actor.bundles, layers, actor.apps)
    assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
    assert _seen(real_runsc, root / f"{uid}.2") == SEEN
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
    assert overlay.mount_points_under(tmp_path) == []
    assert not (root / f"{uid}.2").exists()
