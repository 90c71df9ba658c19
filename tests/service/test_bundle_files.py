"""The real agent (both doors, liveness) against bundle directories another party broke: a
FIFO where a config.json should be, a container directory that is a link elsewhere.

Every read and write of a file under a bundle directory goes through one confined helper
(``substrate_gpu._bundle``), in a thread: a FIFO is refused at once, naming it, and a link
anywhere under the directory is refused, never written through.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from substrate_gpu.service.ateworker import ateworker_pb2 as pb
from substrate_gpu.testing import node as node_

from .agentproc import AgentProcess, event, free_port, probe
from .workerclient import Actor, connect, status_of

INVALID = grpc.StatusCode.INVALID_ARGUMENT


class Doors:
    """An agent serving the JSON socket, the worker API and the probes (1 s liveness)."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.worker_socket = tmp / "worker" / "worker.sock"
        self.agent = AgentProcess.on_socket(
            tmp,
            "--worker-socket",
            str(self.worker_socket),
            "--metrics-port",
            str(self.port),
            "--liveness-timeout",
            "1",
            # requests name it (runsc_path is required); the calls here never reach runsc
            "--runsc",
            str(node_.install_runsc_standin(tmp / "bin")),
        )
        self.worker = connect(self.worker_socket)

    def actor_state(self, actor_id: str) -> dict[str, object]:
        with self.agent.client() as client:
            answer = client.request({"query": "actor", "actor_id": actor_id})
        assert answer["ok"], answer
        actor: dict[str, object] = answer["actor"]
        return actor

    def close(self) -> None:
        try:
            self.agent.terminate(timeout=10)
        except subprocess.TimeoutExpired:  # a loop blocked for good (the bug this guards)
            self.agent.kill()


@pytest.fixture
def doors(tmp_path: Path) -> Iterator[Doors]:
    opened = Doors(tmp_path)
    try:
        yield opened
    finally:
        opened.close()


def test_a_fifo_config_is_refused_at_once_and_both_doors_and_liveness_keep_answering(
    doors: Doors, tmp_path: Path
) -> None:
    """``_pause/config.json`` a FIFO nobody writes: the worker API's Run is INVALID_ARGUMENT
    naming it, the JSON door's sandbox actor fails naming it (its annotations are read),
    stats (which read ``_pause``'s cgroup back) answer, and /healthz stays 200."""
    actor = Actor(tmp_path / "actor", runsc=doors.agent.runsc).prepare()
    fifo = actor.bundles / "_pause" / "config.json"
    fifo.unlink()
    os.mkfifo(fifo)

    code, message = status_of(doors.worker.RunWorkload, actor.run(), timeout=10)
    assert code == INVALID, message
    assert f"refusing {fifo}: it is not a regular file (a FIFO)" in message

    with doors.agent.client() as client:
        for line in (
            event(
                "actor_registered",
                "jd",
                v=3,
                gpu=False,
                bundle=str(actor.bundles),
                containers=["app"],
                identity={"actor_uid": "u-jd"},
            ),
            event("bundle_prepared", "jd", bundle=str(actor.bundles)),
            event("run_requested", "jd"),
        ):
            assert client.request(line)["ok"], line
    deadline = time.monotonic() + 10
    while (state := doors.actor_state("jd"))["state"] != "failed":
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    assert "it is not a regular file (a FIFO)" in str(state["reason"])

    stats = doors.worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest(), timeout=10)
    assert [s.actor_uid for s in stats.samples] == ["u-jd"]
    assert stats.samples[0].source == pb.STATS_SOURCE_UNSPECIFIED  # no cgroup read back
    assert probe(doors.port, "/healthz")[0] == 200


def test_a_symlinked_container_directory_is_refused_and_nothing_is_written_through_it(
    doors: Doors, tmp_path: Path
) -> None:
    """``oci_bundle_dir/_pause`` a link to a bundle elsewhere: RunWorkload is INVALID_ARGUMENT
    naming the link, the bundle it points at is byte-for-byte as it was (no cgroupsPath, no
    CRI annotations), and nothing is registered."""
    actor = Actor(tmp_path / "actor", runsc=doors.agent.runsc).prepare()
    pause = actor.bundles / "_pause"
    elsewhere = tmp_path / "elsewhere"
    pause.rename(elsewhere)
    pause.symlink_to(elsewhere)
    before = (elsewhere / "config.json").read_bytes()

    code, message = status_of(doors.worker.RunWorkload, actor.run(), timeout=10)
    assert code == INVALID, message
    assert f"refusing {pause}/config.json: '_pause' on its path is a symbolic link" in message
    assert (elsewhere / "config.json").read_bytes() == before
    stats = doors.worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest(), timeout=10)
    assert list(stats.samples) == []
