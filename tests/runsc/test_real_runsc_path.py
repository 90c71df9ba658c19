"""``runsc_path`` on real gVisor (issue 31 §5): one agent, two different runsc builds staged
under its ``--runsc-static-dir`` (the real runsc ``scripts/build-runsc.sh`` built, and a
stand-in build), its own ``--runsc`` a third; each sandbox runs the build its request
names, and its checkpoint's manifest records that build's version and SHA-256."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from service.agentproc import AgentProcess
from service.workerclient import Actor, connect, status_of
from support import real_runsc as runsc_
from support.runsc_builds import build

from substrate_gpu import preflight

OK = grpc.StatusCode.OK


def _stage(binary: Path, static: Path, name: str) -> Path:
    """``binary`` staged as atelet does: a regular file of its own under the static dir (a
    hard link when the file system allows, else a copy: never a symbolic link)."""
    target = static / name / "runsc"
    target.parent.mkdir(parents=True)
    try:
        os.link(binary, target)
    except OSError:
        shutil.copy2(binary, target)
    return target


@pytest.fixture
def root(real_runsc: Path, tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "runsc-root"
    yield root
    if root.exists():
        for actor_root in root.iterdir():
            if actor_root.is_dir():
                runsc_.delete_all(real_runsc, actor_root)


@pytest.fixture
def agent(real_runsc: Path, tmp_path: Path, root: Path, runc_path: str) -> Iterator[AgentProcess]:
    own = build(tmp_path / "builds" / "agents", "release-20250512.0", "550.90.07")
    process = AgentProcess.on_socket(
        tmp_path,
        "--runsc",
        str(own),
        *[f"--runsc-flag={f}" for f in runsc_.GLOBAL_FLAGS],
        "--runsc-static-dir",
        str(tmp_path / "static-files"),
        "--worker-socket",
        str(tmp_path / "worker.sock"),
        env={"RUNSC_STANDIN_RUNC": runc_path},
    )
    try:
        yield process
    finally:
        assert process.terminate() == 0, process.stderr()[-3000:]


def test_two_staged_builds_each_run_the_sandbox_that_names_it(
    agent: AgentProcess, real_runsc: Path, root: Path, runc_path: str, tmp_path: Path
) -> None:
    """The real runsc's sandbox is a gVisor sandbox (runsc itself lists it), the stand-in
    build's is runc's; each checkpoint's manifest names its own build."""
    static = tmp_path / "static-files"
    gvisor = _stage(real_runsc, static, "sha256-real")
    other = build(static / "sha256-standin", "release-20261101.0", "550.90.07")
    worker = connect(tmp_path / "worker.sock")
    on_gvisor = Actor(tmp_path / "gvisor", uid="on-gvisor").prepare()
    on_standin = Actor(tmp_path / "standin", uid="on-standin").prepare()
    assert status_of(worker.RunWorkload, on_gvisor.run(runsc_path=str(gvisor))) == (OK, "")
    assert status_of(worker.RunWorkload, on_standin.run(runsc_path=str(other))) == (OK, "")

    gvisor_root = root / "on-gvisor.1"
    assert sorted(runsc_.list_ids(real_runsc, gvisor_root)) == ["_pause", "app"]
    listed = subprocess.run(
        [runc_path, "--root", str(root / "on-standin.1"), "list", "-q"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert sorted(listed.stdout.split()) == ["_pause", "app"]
    assert runsc_.list_ids(real_runsc, root / "on-standin.1") == []

    version = subprocess.run(
        [str(real_runsc), "--version"], capture_output=True, text=True, check=True
    ).stdout.splitlines()[0]
    for actor, binary, runs in (
        (on_gvisor, gvisor, version),
        (on_standin, other, "runsc version release-20261101.0"),
    ):
        worker.CheckpointWorkload(actor.checkpoint_request(runsc_path=str(binary)), timeout=120)
        manifest = json.loads((actor.checkpoint / preflight.MANIFEST_NAME).read_text())
        assert manifest["runsc_version"] == runs
        assert manifest["runsc_sha256"] == hashlib.sha256(binary.read_bytes()).hexdigest()
    assert runsc_.list_ids(real_runsc, gvisor_root) == []

    # The gVisor snapshot restores under the build that wrote it.
    shutil.copytree(on_gvisor.checkpoint, on_gvisor.restore)
    on_gvisor.prepare()
    restored = status_of(worker.RestoreWorkload, on_gvisor.restore_request(runsc_path=str(gvisor)))
    assert restored == (OK, "")
    assert sorted(runsc_.list_ids(real_runsc, root / "on-gvisor.2")) == ["_pause", "app"]
    for actor, binary in ((on_gvisor, gvisor), (on_standin, other)):
        worker.TerminateWorkload(actor.terminate(runsc_path=str(binary)), timeout=120)
    assert runsc_.list_ids(real_runsc, root / "on-gvisor.2") == []
