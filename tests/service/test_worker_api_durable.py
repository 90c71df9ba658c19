"""Durable-dir volumes through the worker API on the stand-in over real runc: an app that
keeps its count in a durable-dir volume, snapshotted with SNAPSHOT_SCOPE_DATA (pause, tar,
resume, teardown) and FULL (runsc's checkpoint plus the tars), restored from them (DATA: a
cold boot on the restored volume; FULL: a restore), as upstream's ``durable.go`` does.

The real-gVisor life is tests/runsc/test_real_worker_api.py's durable test.
"""

from __future__ import annotations

import json
import tarfile
import time
import uuid
from pathlib import Path

import grpc
import pytest

from substrate_gpu.service.ateworker import ateworker_pb2 as pb
from substrate_gpu.testing import node as node_

from .agentproc import AgentProcess
from .workerclient import DURABLE_COUNTER, Actor, DurableActor, connect, status_of, wait_until

pytestmark = pytest.mark.runc

OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
TAR = "durable-dir-data.tar"


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    return node_.install_runsc_standin(tmp_path / "bin")


@pytest.fixture
def argv_log(tmp_path: Path) -> Path:
    return tmp_path / "argv.jsonl"


@pytest.fixture
def agent(tmp_path, standin, runc_path, argv_log):
    env = {"RUNSC_STANDIN_RUNC": runc_path, "RUNSC_STANDIN_ARGV_LOG": str(argv_log)}
    process = AgentProcess.on_socket(
        tmp_path,
        "--worker-socket",
        str(tmp_path / "worker" / "worker.sock"),
        "--runsc",
        str(standin),
        env=env,
    )
    try:
        yield process
    finally:
        process.terminate()


@pytest.fixture
def worker(agent, tmp_path):
    return connect(tmp_path / "worker" / "worker.sock")


@pytest.fixture
def actor(tmp_path, standin):
    # A UID of its own: the sandbox's cgroup is named after it (several runs share a node).
    actor = DurableActor(
        tmp_path / "actor",
        uid=f"durable-{uuid.uuid4().hex[:12]}",
        runsc=str(standin),
        app_args=list(DURABLE_COUNTER),
    )
    (actor.durable / "data").mkdir(parents=True)  # atelet makes each volume's directory
    return actor.prepare()


def _commands(argv_log: Path) -> list[tuple[str, str]]:
    """``(subcommand, container)`` of every runsc command the stand-in ran."""
    verbs = {"create", "start", "pause", "resume", "checkpoint", "restore", "delete"}
    found = []
    for line in argv_log.read_text().splitlines():
        argv = json.loads(line)
        verb = next((a for a in argv if a in verbs), None)
        if verb is not None and "help" not in argv:  # not feature detection's ``help X``
            found.append((verb, argv[-1]))
    return found


def _ok(call, request) -> None:
    code, message = status_of(call, request)
    assert code == OK, message


def _tar_count(tar_path: Path) -> int:
    with tarfile.open(tar_path) as tar:
        member = tar.extractfile("./count")
        assert member is not None
        return int(member.read())


def test_run_binds_the_volume_into_the_app(worker, actor):
    """The app sees the volume's directory at its mount_path: its count lands there."""
    _ok(worker.RunWorkload, actor.run())
    wait_until(lambda: actor.count() >= 3)
    config = json.loads((actor.bundles / "app" / "config.json").read_text())
    [bind] = [m for m in config["mounts"] if m["destination"] == "/data"]
    assert bind == {
        "destination": "/data",
        "type": "bind",
        "source": str(actor.durable / "data"),
        "options": ["bind", "rw"],
    }
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")


def test_a_data_checkpoint_pauses_tars_resumes_and_tears_down(worker, actor, argv_log):
    """DATA: ``pause _pause``, the volume's tar (gVisor's own files left out), ``resume
    _pause``, then the teardown; the answer lists the tar in both lists."""
    _ok(worker.RunWorkload, actor.run())
    wait_until(lambda: actor.count() >= 3)
    (actor.durable / "data" / ".gvisor.filestore.7").write_bytes(b"internal")
    answer = worker.CheckpointWorkload(
        actor.checkpoint_request(scope=pb.SNAPSHOT_SCOPE_DATA), timeout=60
    )
    assert list(answer.data_snapshot_files) == [TAR]
    assert list(answer.snapshot_files) == [TAR]
    with tarfile.open(actor.checkpoint / TAR) as tar:
        assert sorted(tar.getnames()) == [".", "./count"]
    assert _tar_count(actor.checkpoint / TAR) >= 3
    commands = _commands(argv_log)
    pause = commands.index(("pause", "_pause"))
    assert commands[pause + 1] == ("resume", "_pause")
    assert ("delete", "_pause") in commands[pause + 2 :]
    assert "checkpoint" not in {verb for verb, _ in commands}
    code, _ = status_of(worker.GetWorkloadStats, pb.GetWorkloadStatsRequest(actor_uid=actor.uid))
    assert code == grpc.StatusCode.NOT_FOUND  # torn down, as upstream's worker does


def test_a_data_restore_boots_afresh_on_the_restored_volume(worker, actor, argv_log):
    """DATA restore: the tar extracted into the (empty) volume directory, then a cold boot
    (create + start, no runsc restore): the app counts on from the restored value."""
    _ok(worker.RunWorkload, actor.run())
    wait_until(lambda: actor.count() >= 5)
    worker.CheckpointWorkload(actor.checkpoint_request(scope=pb.SNAPSHOT_SCOPE_DATA), timeout=60)
    saved = _tar_count(actor.checkpoint / TAR)
    # atelet: a fresh, empty volume directory and the snapshot downloaded into restore_dir.
    actor.checkpoint.rename(actor.restore)
    for entry in (actor.durable / "data").iterdir():
        entry.unlink()
    actor.prepare()
    before = len(_commands(argv_log))
    request = actor.restore_request(scope=pb.SNAPSHOT_SCOPE_DATA)
    assert status_of(worker.RestoreWorkload, request) == (OK, "")
    assert {verb for verb, _ in _commands(argv_log)[before:]} == {"create", "start"}
    wait_until(lambda: actor.count() > saved)
    assert actor.count() < saved + 100  # went on from the snapshot, not from 0
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")


def test_a_full_checkpoint_writes_the_tars_too_and_a_full_restore_extracts_them(
    worker, actor, argv_log
):
    """FULL: runsc's checkpoint, then the tar; Restore FULL extracts it before runsc's restore."""
    _ok(worker.RunWorkload, actor.run())
    wait_until(lambda: actor.count() >= 3)
    answer = worker.CheckpointWorkload(actor.checkpoint_request(), timeout=60)
    assert list(answer.data_snapshot_files) == [TAR]
    assert {"checkpoint.img", TAR} <= set(answer.snapshot_files)
    saved = _tar_count(actor.checkpoint / TAR)
    commands = _commands(argv_log)
    assert commands.index(("checkpoint", "_pause")) < len(commands)
    assert "pause" not in {verb for verb, _ in commands}

    actor.checkpoint.rename(actor.restore)
    for entry in (actor.durable / "data").iterdir():
        entry.unlink()
    actor.prepare()
    assert status_of(worker.RestoreWorkload, actor.restore_request()) == (OK, "")
    assert ("restore", "_pause") in _commands(argv_log)
    wait_until(actor.counting)
    assert actor.count() >= saved
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")


def test_a_data_checkpoint_resumes_even_when_its_caller_gave_up(worker, agent, actor, argv_log):
    """A deadline passing mid-tar never leaves the sandbox paused: the pause, tar, resume and
    teardown finish without the caller (upstream resumes on a context of its own)."""
    _ok(worker.RunWorkload, actor.run())
    wait_until(lambda: actor.count() >= 2)
    (actor.durable / "data" / "big").write_bytes(b"\0" * (256 << 20))  # a tar that takes time
    code, _ = status_of(
        worker.CheckpointWorkload, actor.checkpoint_request(scope=pb.SNAPSHOT_SCOPE_DATA), 0.3
    )
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    try:
        wait_until(lambda: ("delete", "_pause") in _commands(argv_log), timeout=60)
    except AssertionError:
        raise AssertionError(agent.stderr()[-4000:]) from None
    commands = _commands(argv_log)
    assert commands.index(("resume", "_pause")) > commands.index(("pause", "_pause"))
    assert (actor.checkpoint / TAR).stat().st_size > 256 << 20


@pytest.mark.parametrize(
    ("call", "scope"),
    [
        pytest.param("CheckpointWorkload", pb.SNAPSHOT_SCOPE_DATA, id="checkpoint"),
    ],
)
def test_data_without_a_durable_volume_is_invalid(worker, tmp_path, standin, call, scope):
    plain = Actor(tmp_path / "plain", runsc=str(standin)).prepare()
    code, message = status_of(getattr(worker, call), plain.checkpoint_request(scope=scope))
    assert code == INVALID
    assert "no container of spec mounts a durable-dir volume" in message


def test_a_bad_volume_name_is_invalid_naming_the_field(worker, actor):
    mount = pb.DurableDirVolumeMount(volume_name="..", mount_path="/data")
    spec = pb.WorkloadSpec(containers=[pb.Container(name="app", durable_dir_volume_mounts=[mount])])
    code, message = status_of(worker.RunWorkload, actor.run(spec=spec))
    assert code == INVALID
    assert message.startswith("spec.containers[0].durable_dir_volume_mounts[0].volume_name")


def test_a_volume_directory_that_is_a_symlink_is_refused(worker, actor, tmp_path):
    """runsc binds the volume by path: a link there would expose its target to the sandbox."""
    (actor.durable / "data").rmdir()
    (actor.durable / "data").symlink_to(tmp_path)
    code, message = status_of(worker.RunWorkload, actor.run())
    assert code == INVALID
    assert "is a symbolic link" in message
    assert worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest()).samples == []


def test_a_restore_from_a_hostile_tar_is_refused_and_leaves_nothing(worker, actor, tmp_path):
    actor.restore.mkdir()
    with tarfile.open(actor.restore / TAR, "w") as tar:
        info = tarfile.TarInfo("../../escaped")
        tar.addfile(info)
    code, message = status_of(
        worker.RestoreWorkload, actor.restore_request(scope=pb.SNAPSHOT_SCOPE_DATA)
    )
    assert code == INVALID and "while restoring durable-dir volume 'data'" in message
    assert not (tmp_path / "escaped").exists()
    time.sleep(0.1)
    assert worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest()).samples == []
