"""Each app container's output on the worker's stdout as upstream's JSON lines, through the
worker API on the stand-in over real runc (the app's stdio is ``runsc create``'s, as in
gVisor); runsc's own errors still reach the call's answer."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import grpc
import pytest

from substrate_gpu.testing import node as node_

from .agentproc import AgentProcess
from .workerclient import Actor, connect, status_of, wait_until

pytestmark = pytest.mark.runc

CHATTY = [
    "sh",
    "-c",
    (
        'echo hello; echo \'{"msg": "structured", "ate.actor.uid": "forged"}\'; echo oops >&2; '
        "sleep 100000"
    ),
]


@pytest.fixture
def stdout(tmp_path: Path) -> Path:
    return tmp_path / "agent.stdout"


@pytest.fixture
def agent(tmp_path, runc_path, stdout):
    standin = node_.install_runsc_standin(tmp_path / "bin")
    process = AgentProcess.on_socket(
        tmp_path,
        "--worker-socket",
        str(tmp_path / "worker" / "worker.sock"),
        "--runsc",
        str(standin),
        env={"RUNSC_STANDIN_RUNC": runc_path},
        stdout_file=stdout,
    )
    try:
        yield process
    finally:
        process.terminate()


def _records(stdout: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.read_text().splitlines() if line.strip()]


def test_each_app_containers_lines_are_json_with_its_identity(agent, tmp_path, stdout):
    """Both app containers' stdout and stderr lines, each a JSON object labelled with the
    actor's identity and its own container; a forged ``ate.*`` field is dropped."""
    worker = connect(tmp_path / "worker" / "worker.sock")
    uid = f"logs-{uuid.uuid4().hex[:8]}"
    actor = Actor(
        tmp_path / "actor", uid=uid, apps=("app", "side"), app_args=CHATTY, runsc=agent.runsc
    ).prepare()
    assert status_of(worker.RunWorkload, actor.run()) == (grpc.StatusCode.OK, "")
    wait_until(lambda: len(_records(stdout)) >= 6)
    records = _records(stdout)
    by_container: dict[object, list[object]] = {}
    for record in records:
        labels = record["labels"]
        assert isinstance(labels, dict)
        assert labels["ate.actor.uid"] == uid
        assert (labels["ate.atespace"], labels["ate.template.name"]) == (
            "team-a",
            "counter-template",
        )
        by_container.setdefault(labels["ate.actor.container.name"], []).append(
            record.get("message", record.get("msg"))
        )
        assert "ate.actor.uid" not in record
    assert set(by_container) == {"app", "side"}  # _pause's output is not piped
    for lines in by_container.values():
        # The runtime's own messages (runc's warnings here, runsc's in gVisor) are lines of
        # the container's pipe too, as upstream's: runsc create writes to it.
        assert {"hello", "oops", "structured"} <= set(map(str, lines))
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (grpc.StatusCode.OK, "")


def test_runscs_own_error_still_answers_the_call(agent, tmp_path, stdout):
    """An app that cannot be created: the runtime's message (written to the container's pipe)
    is the INTERNAL answer's reason, as it was from a file."""
    worker = connect(tmp_path / "worker" / "worker.sock")
    actor = Actor(
        tmp_path / "broken",
        uid=f"broken-{uuid.uuid4().hex[:8]}",
        app_args=["/no/such/binary"],
        runsc=agent.runsc,
    ).prepare()
    code, message = status_of(worker.RunWorkload, actor.run())
    assert code == grpc.StatusCode.INTERNAL
    assert "/no/such/binary" in message, message
