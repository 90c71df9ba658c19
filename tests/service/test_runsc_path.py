"""``runsc_path`` as atelet stages it (issue 31 §5): the sandbox runs the binary the request
names, a regular executable file under ``--runsc-static-dir``, and its checkpoint's manifest
records that binary; anything else is INVALID_ARGUMENT and registers nothing.

The agent's own ``--runsc`` and the staged one are two stand-in "builds" that differ in their
bytes and in the version they report (``tests/support/runsc_builds.py``);
each logs its invocations, so the test sees which one ran. The same on real gVisor, with a
real runsc staged beside the stand-in: ``tests/runsc/test_real_runsc_path.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import grpc
import pytest

from substrate_gpu import preflight
from substrate_gpu.service.ateworker import ateworker_pb2 as pb

from .agentproc import AgentProcess
from .workerclient import Actor, connect, status_of

pytestmark = pytest.mark.runc

OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
AGENTS = "release-20250512.0"
STAGED = "release-20261101.0"


def _build(directory: Path, version: str) -> Path:
    from runsc.test_runsc_binaries import build

    return build(directory, version, "550.90.07")


def _calls(build_dir: Path) -> list[str]:
    """The binaries that ran, one per invocation (each build logs beside its siblings)."""
    log = build_dir.parent / "calls.log"
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def static(tmp_path: Path) -> Path:
    return tmp_path / "static-files"


@pytest.fixture
def agent(tmp_path: Path, static: Path, runc_path: str):
    own = _build(tmp_path / "builds" / "agents", AGENTS)
    process = AgentProcess.on_socket(
        tmp_path,
        "--worker-socket",
        str(tmp_path / "worker" / "worker.sock"),
        "--runsc",
        str(own),
        "--runsc-static-dir",
        str(static),
        env={"RUNSC_STANDIN_RUNC": runc_path},
    )
    try:
        yield process
    finally:
        process.terminate()


@pytest.fixture
def worker(agent: AgentProcess, tmp_path: Path):
    return connect(tmp_path / "worker" / "worker.sock")


@pytest.fixture
def staged(static: Path) -> Path:
    """The build atelet staged, content-addressed as it does."""
    return _build(static / "sha256-0f1e", STAGED)


def _refusals(static: Path, staged: Path, tmp: Path) -> dict[str, tuple[str, str]]:
    """id -> (runsc_path, what the message must say), each staged as named."""
    (static / "dir").mkdir()
    plain = static / "plain" / "runsc"
    plain.parent.mkdir()
    shutil.copy2(staged, plain)
    plain.chmod(0o644)
    (static / "link").symlink_to(staged)
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    shutil.copy2(staged, elsewhere / "runsc")
    (static / "linked-dir").symlink_to(elsewhere)
    os.mkfifo(static / "fifo")
    return {
        "traversal": (f"{static}/sha256-0f1e/../../builds/agents/runsc", "absolute, clean path"),
        "dot-dot-inside": (f"{static}/dir/../sha256-0f1e/runsc", "absolute, clean path"),
        "relative": ("static-files/runsc", "absolute, clean path"),
        # Another build than the agent's own (whose --runsc path is honoured wherever it is).
        "outside": (str(elsewhere / "runsc"), f"must be inside {static}"),
        "the-directory-itself": (str(static), f"must be inside {static}"),
        "symlink": (str(static / "link"), "must not traverse a symbolic link"),
        "symlinked-directory": (
            str(static / "linked-dir" / "runsc"),
            "must not traverse a symbolic link",
        ),
        "not-executable": (str(plain), "must be executable (mode 0644)"),
        "a-directory": (str(static / "dir"), "must be a regular file"),
        "a-fifo": (str(static / "fifo"), "must be a regular file"),
        "missing": (str(static / "nothing"), "No such file or directory"),
    }


REFUSALS = [
    "traversal",
    "dot-dot-inside",
    "relative",
    "outside",
    "the-directory-itself",
    "symlink",
    "symlinked-directory",
    "not-executable",
    "a-directory",
    "a-fifo",
    "missing",
]


@pytest.mark.parametrize("case", REFUSALS)
def test_a_runsc_path_atelet_cannot_have_staged_is_invalid_and_registers_nothing(
    worker, agent, static, staged, tmp_path, case
):
    """Upstream's ValidateRuntimeAssetPath, plus the execute bit: INVALID_ARGUMENT naming
    the field and the rule, for Run, Restore and Checkpoint alike; nothing is logged."""
    path, says = _refusals(static, staged, tmp_path)[case]
    actor = Actor(tmp_path / "actor").prepare()
    actor.restore.mkdir()
    (actor.restore / "checkpoint.img").write_text("{}")  # a snapshot to restore, but for the path
    for call, request in (
        (worker.RunWorkload, actor.run(runsc_path=path)),
        (worker.RestoreWorkload, actor.restore_request(runsc_path=path)),
        (worker.CheckpointWorkload, actor.checkpoint_request(runsc_path=path)),
    ):
        code, message = status_of(call, request)
        assert code == INVALID, (case, message)
        assert f"runsc_path {path!r}" in message and says in message, message
    logged = [json.loads(line) for line in agent.log.read_text().splitlines()[1:]]
    assert [e for e in logged if e.get("type") == "actor_registered"] == []


def test_the_staged_build_runs_the_sandbox_and_its_manifest_names_it(
    worker, agent, static, staged, tmp_path
):
    """Run and Checkpoint under the staged build (every runsc command of the sandbox is
    its); the manifest records its version and SHA-256; the snapshot restores under it,
    and is refused before runsc runs under the agent's own build (another runsc build)."""
    actor = Actor(tmp_path / "actor").prepare()
    assert status_of(worker.RunWorkload, actor.run(runsc_path=str(staged))) == (OK, "")
    ran = _calls(staged.parent)
    assert str(staged) in ran
    sandbox_commands = [
        line
        for line in (staged.parent.parent / "calls.log").read_text().splitlines()
        if str(tmp_path / "runsc-root") in line
    ]
    assert sandbox_commands and all(line.startswith(str(staged)) for line in sandbox_commands)
    logged = [json.loads(line) for line in agent.log.read_text().splitlines()[1:]]
    (registered,) = [e for e in logged if e.get("type") == "actor_registered"]
    assert registered["runsc"] == str(staged)

    answer = worker.CheckpointWorkload(actor.checkpoint_request(runsc_path=str(staged)))
    assert preflight.MANIFEST_NAME in answer.snapshot_files
    manifest = json.loads((actor.checkpoint / preflight.MANIFEST_NAME).read_text())
    assert manifest["runsc_version"] == f"runsc version {STAGED}"
    assert manifest["runsc_sha256"] == hashlib.sha256(staged.read_bytes()).hexdigest()

    shutil.copytree(actor.checkpoint, actor.restore)
    actor.prepare()
    own = str(tmp_path / "builds" / "agents" / "runsc")  # the agent's --runsc
    refused = status_of(worker.RestoreWorkload, actor.restore_request(runsc_path=own))
    assert refused[0] == grpc.StatusCode.FAILED_PRECONDITION, refused
    assert "another sandbox runtime" in refused[1] and "runsc_sha256" in refused[1]
    actor.prepare()
    restored = worker.RestoreWorkload(actor.restore_request(runsc_path=str(staged)))
    assert isinstance(restored, pb.RestoreWorkloadResponse)
    worker.TerminateWorkload(actor.terminate(runsc_path=str(staged)))


def test_the_agents_own_runsc_path_runs_the_agents_runsc(worker, agent, staged, tmp_path):
    """runsc_path naming the agent's --runsc (outside the static-files directory): the
    agent's own runtime, as before; an empty one is required (upstream's answer)."""
    own = str(tmp_path / "builds" / "agents" / "runsc")
    actor = Actor(tmp_path / "actor", runsc=own).prepare()
    assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
    assert str(staged) not in _calls(staged.parent)
    worker.TerminateWorkload(actor.terminate())
    assert status_of(worker.RunWorkload, actor.run(runsc_path="")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "runsc_path: Required value",
    )
