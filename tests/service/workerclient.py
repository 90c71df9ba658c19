"""Driving ``substrate-gpu agent --worker-socket`` with a gRPC client built from our stubs."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from substrate_gpu.service.ateworker import ateworker_pb2 as pb
from substrate_gpu.service.ateworker import ateworker_pb2_grpc as pb_grpc
from substrate_gpu.testing import bundles

PAUSE_ARGS = ["sleep", "100000"]
#: An app whose count lives only in its memory: a restore that goes on from it proves the
#: process state came back (the log file is in the rootfs: it is part of the image too).
COUNTER_ARGS = ["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done"]

#: Counts on from what durable-dir volume ``data`` (at ``/data``) holds: a restored volume
#: shows in the next value.
DURABLE_COUNTER = [
    "sh",
    "-c",
    (
        "i=$(cat /data/count 2>/dev/null || echo 0); "
        "while true; do i=$((i+1)); echo $i > /data/count.new; mv /data/count.new /data/count; "
        "sleep 0.1; done"
    ),
]


def connect(path: Path, timeout: float = 20) -> pb_grpc.WorkerStub:
    """A stub on the worker socket, once it answers."""
    channel = grpc.insecure_channel(f"unix:{path}")
    grpc.channel_ready_future(channel).result(timeout=timeout)
    return pb_grpc.WorkerStub(channel)


@dataclass
class Actor:
    """One upstream actor: its identity and the directories atelet would prepare."""

    root: Path
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    """Unique unless given: the sandbox's cgroup is named after it (``/substrate-gpu/<uid>.1``),
    and two tests running at once (xdist workers, or another run on the machine) must never
    share one (a checkpoint freezing one sandbox's cgroup failed the other's create)."""
    apps: tuple[str, ...] = ("app",)
    app_args: list[str] = field(default_factory=lambda: list(COUNTER_ARGS))
    annotations: dict[str, str] | None = None
    runsc: str = ""
    """``runsc_path`` of every request: the agent's ``--runsc`` (required, as upstream)."""

    def __post_init__(self) -> None:
        self.bundles = self.root / "bundles"
        self.checkpoint = self.root / "checkpoint"
        self.restore = self.root / "restore"
        self.durable = self.root / "durable"

    def prepare(self) -> Actor:
        """Fresh bundles for ``_pause`` and every app container (as atelet does per call)."""
        bundles.make_bundle(self.bundles / "_pause", PAUSE_ARGS)
        for name in self.apps:
            bundles.make_bundle(self.bundles / name, self.app_args, annotations=self.annotations)
        return self

    def dirs(self, **overrides: str) -> pb.ActorDirs:
        values = {
            "root_dir": str(self.root),
            "oci_bundle_dir": str(self.bundles),
            "checkpoint_dir": str(self.checkpoint),
            "restore_dir": str(self.restore),
            "durable_dir_volume_mounts_dir": str(self.durable),
            "system_info_volume_roots_dir": str(self.root / "system-info"),
            "volumes_dir": str(self.root / "volumes"),
            **overrides,
        }
        return pb.ActorDirs(**values)

    def identity(self) -> dict[str, str]:
        """The identity fields and ``runsc_path``, which every lifecycle request carries."""
        return {
            "runsc_path": self.runsc,
            "atespace": "team-a",
            "actor_name": "counter",
            "actor_uid": self.uid,
            "actor_template_atespace": "team-a",
            "actor_template_name": "counter-template",
        }

    def spec(self) -> pb.WorkloadSpec:
        return pb.WorkloadSpec(containers=[pb.Container(name=n) for n in self.apps])

    def run(self, **fields: Any) -> pb.RunWorkloadRequest:
        return pb.RunWorkloadRequest(
            **{**self.identity(), "spec": self.spec(), "actor_dirs": self.dirs(), **fields}
        )

    def checkpoint_request(self, **fields: Any) -> pb.CheckpointWorkloadRequest:
        return pb.CheckpointWorkloadRequest(
            **{
                **self.identity(),
                "spec": self.spec(),
                "actor_dirs": self.dirs(),
                "scope": pb.SNAPSHOT_SCOPE_FULL,
                **fields,
            }
        )

    def restore_request(self, **fields: Any) -> pb.RestoreWorkloadRequest:
        return pb.RestoreWorkloadRequest(
            **{
                **self.identity(),
                "spec": self.spec(),
                "actor_dirs": self.dirs(),
                "scope": pb.SNAPSHOT_SCOPE_FULL,
                **fields,
            }
        )

    def terminate(self, **fields: Any) -> pb.TerminateWorkloadRequest:
        return pb.TerminateWorkloadRequest(
            **{**self.identity(), "spec": self.spec(), "actor_dirs": self.dirs(), **fields}
        )


class DurableActor(Actor):
    """An actor whose app mounts durable-dir volume ``data`` at ``/data``."""

    def spec(self) -> pb.WorkloadSpec:
        mount = pb.DurableDirVolumeMount(volume_name="data", mount_path="/data")
        return pb.WorkloadSpec(
            containers=[pb.Container(name="app", durable_dir_volume_mounts=[mount])]
        )

    def count(self) -> int:
        text = (self.durable / "data" / "count").read_text() if self.counting() else ""
        return int(text) if text.strip() else 0

    def counting(self) -> bool:
        return (self.durable / "data" / "count").is_file()


def status_of(call: Any, request: Any, timeout: float = 120) -> tuple[grpc.StatusCode, str]:
    """The status code and message ``call(request)`` is answered with (OK: "")."""
    try:
        call(request, timeout=timeout)
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def logged_types(log: Path, actor_prefix: str) -> list[tuple[str, str]]:
    """``(actor_id, type)`` of every logged event of the actors whose id starts so."""
    found = []
    for line in log.read_text().splitlines():
        record = json.loads(line)
        event = record.get("event", record)
        if str(event.get("actor_id", "")).startswith(actor_prefix):
            found.append((event["actor_id"], event["type"]))
    return found


def wait_until(predicate: Any, timeout: float = 30, every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
        time.sleep(every)
