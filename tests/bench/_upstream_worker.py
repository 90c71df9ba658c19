"""Upstream's own gVisor worker (agent-substrate's ``ateom-gvisor``) as a benchmark arm
(imported by bench_worker_api.py; not a benchmark itself).

The binary is built from an upstream snapshot outside this repository (the Go module proxy
does not serve agent-substrate, and CI cannot reach GitHub, so CI cannot build it): the arm
runs only when it is given one, ``--upstream-worker PATH`` or ``SUBSTRATE_GPU_UPSTREAM_WORKER``.
``scripts/build-upstream-worker.sh SRC_DIR`` builds it from an agent-substrate checkout or
bare mirror (commit 86e138f, checked; ``go build -mod=vendor ./cmd/ateom-gvisor``, its
dependencies vendored) into ``${SUBSTRATE_GPU_CACHE:-/var/cache/substrate-gpu}/upstream-worker/86e138f/``,
with the snapshot's source beside it in ``src/`` (what :func:`default_source` finds), reused
while its recorded sha256 matches, and prints the path to pass::

    python tests/bench/bench_worker_api.py --upstream-worker \
        "$(scripts/build-upstream-worker.sh /path/to/agent-substrate)" Its gRPC service at that
snapshot (86e138f) is ``ateom.Ateom``; the client is generated at run time with grpcio-tools
from that snapshot's own ``internal/proto/ateompb/ateom.proto`` into a temporary directory, so
no upstream file is committed here.

What the worker needs, read from its ``cmd/ateom-gvisor/main.go``, ``runsc.go`` and
``internal/ateompath``, and given here as a pod would give it:

- **A pod's namespaces**: ``unshare --mount --net``, with a veth ``eth0`` holding an IPv4
  address (``podIPv4()`` reads it for its nftables DNAT rule) and ``lo`` up. At start it makes
  the named netns ``/run/netns/ateom:<pod-uid>``, into which each Run and Restore moves one
  end of a fresh veth pair; the bundles name that netns (atelet's ``buildActorOCISpec``).
- **``/run``** its own tmpfs, so the named netns (and the mount of ``/run/netns`` the Go
  netns library makes) go with the namespace instead of landing on the host's ``/run``.
- **``/var/lib``** bind-mounted from a scratch directory: every path it uses is fixed under
  ``/var/lib/ateom-gvisor`` (socket ``ateoms/<pod-uid>/ateom.sock``; per actor
  ``actors/<ns>:<template>:<id>/{bundles,runsc-state,pidfiles,checkpoint-state,restore-state}``).
- **Bundles as atelet writes them**: ``pause`` (not ``_pause``) and each app container, with
  the CRI annotations gVisor's multi-container sandbox reads (``container-type``,
  ``sandbox-id``, ``container-name``).

It has no Terminate at that snapshot (atelet resets the actor's directories after a
checkpoint's upload): a round's sandbox is deleted here, inside the worker's namespaces
(``nsenter``), outside the timings, and the directories reset as atelet does.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from service import workerclient

from substrate_gpu.testing import bundles

ENV = "SUBSTRATE_GPU_UPSTREAM_WORKER"
POD_UID = "bench"
NAMESPACE, TEMPLATE = "bench", "counter"
APP = "app"
#: The pod's own address (any IPv4 address on ``eth0``: the worker DNATs to its actor).
POD_CIDR = "10.213.0.2/24"
_VAR_LIB = "/var/lib/ateom-gvisor"


def default_source(binary: Path) -> Path:
    """Where the snapshot's source sits beside a binary built as the cache builds it."""
    return binary.parent / "src"


def generate_client(source: Path, out: Path) -> tuple[ModuleType, ModuleType]:
    """``ateom_pb2`` and ``ateom_pb2_grpc`` compiled from the snapshot's own .proto."""
    from grpc_tools import protoc  # a test dependency; only this arm needs it

    proto_dir = source / "internal" / "proto" / "ateompb"
    if not (proto_dir / "ateom.proto").is_file():
        raise FileNotFoundError(
            f"no ateom.proto under {proto_dir}: pass --upstream-source, the snapshot the "
            "worker was built from"
        )
    out.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    status = protoc.main(
        [
            "protoc",
            f"-I{proto_dir}",
            f"-I{include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            str(proto_dir / "ateom.proto"),
        ]
    )
    if status != 0:
        raise RuntimeError(f"protoc of {proto_dir / 'ateom.proto'} exited {status}")
    sys.path.insert(0, str(out))
    return importlib.import_module("ateom_pb2"), importlib.import_module("ateom_pb2_grpc")


_BOOT = """set -e
mount --bind "$1" /var/lib
mount -t tmpfs tmpfs /run
ip link set lo up
ip link add eth0 type veth peer name eth0-peer
ip addr add {cidr} dev eth0
ip link set eth0 up
ip link set eth0-peer up
shift
exec "$@"
"""


class UpstreamWorker:
    """One ``ateom-gvisor`` process in its own pod-like namespaces, and its rounds."""

    def __init__(self, binary: Path, source: Path, base: Path, runsc: Path) -> None:
        self.binary, self.source, self.runsc = binary, source, runsc
        self.base = base / "upstream"
        self.var_lib = self.base / "var-lib"
        self.host_root = self.var_lib / "ateom-gvisor"
        self.process: subprocess.Popen[bytes] | None = None
        self.actors: list[str] = []

    # --- the process ---------------------------------------------------------------------------

    def start(self) -> None:
        self.pb, pb_grpc = generate_client(self.source, self.base / "ateompb")
        self.var_lib.mkdir(parents=True)
        self.log = (self.base / "ateom.log").open("w")
        # unshare execs (no --fork): the Popen's pid is the worker's, for nsenter.
        self.process = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--net",
                "--propagation",
                "private",
                "sh",
                "-c",
                _BOOT.format(cidr=POD_CIDR),
                "sh",
                str(self.var_lib),
                str(self.binary),
                "--pod-uid",
                POD_UID,
            ],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
        )
        sock = self.host_root / "ateoms" / POD_UID / "ateom.sock"
        workerclient.wait_until(lambda: sock.exists() or self.process.poll() is not None, 30)  # type: ignore[union-attr]
        if self.process.poll() is not None:
            raise RuntimeError(f"upstream worker exited {self.process.returncode}: {self.tail()}")
        import grpc

        channel = grpc.insecure_channel(f"unix:{sock}")
        grpc.channel_ready_future(channel).result(timeout=20)
        self.stub: Any = pb_grpc.AteomStub(channel)

    def tail(self) -> str:
        return (self.base / "ateom.log").read_text()[-4000:]

    def stop(self) -> None:
        """Every sandbox deleted (inside the worker's namespaces), then the worker stopped:
        its mount namespace, and the netns and /var/lib mounts in it, go with it."""
        if self.process is None:
            return
        for actor_id in self.actors:
            self._delete_sandbox(actor_id)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self.log.close()

    # --- one actor's life ----------------------------------------------------------------------

    def _actor_dir(self, actor_id: str) -> Path:
        return self.host_root / "actors" / f"{NAMESPACE}:{TEMPLATE}:{actor_id}"

    def _prepare(self, actor_id: str) -> None:
        """What atelet's ``prepareOCIBundles`` leaves for a Run or Restore."""
        actor = self._actor_dir(actor_id)
        netns = f"/run/netns/ateom:{POD_UID}"
        for name, args, cri in (
            (
                "pause",
                workerclient.PAUSE_ARGS,
                {
                    "io.kubernetes.cri.container-type": "sandbox",
                    "io.kubernetes.cri.container-name": "pause",
                },
            ),
            (
                APP,
                workerclient.COUNTER_ARGS,
                {
                    "io.kubernetes.cri.container-type": "container",
                    "io.kubernetes.cri.sandbox-id": "pause",
                    "io.kubernetes.cri.container-name": APP,
                },
            ),
        ):
            bundle = bundles.make_bundle(actor / "bundles" / name, args, annotations=cri)
            config = json.loads((bundle / "config.json").read_text())
            for namespace in config["linux"]["namespaces"]:
                if namespace["type"] == "network":
                    namespace["path"] = netns
            (bundle / "config.json").write_text(json.dumps(config))
        (actor / "pidfiles").mkdir(exist_ok=True)

    def _identity(self, actor_id: str) -> dict[str, Any]:
        return {
            "actor_template_namespace": NAMESPACE,
            "actor_template_name": TEMPLATE,
            "actor_id": actor_id,
            "runsc_path": str(self.runsc),
            "spec": self.pb.WorkloadSpec(containers=[self.pb.Container(name=APP)]),
        }

    def _nsenter_runsc(self, actor_id: str, *args: str) -> subprocess.CompletedProcess[bytes]:
        assert self.process is not None
        root = f"{_VAR_LIB}/actors/{NAMESPACE}:{TEMPLATE}:{actor_id}/runsc-state"
        return subprocess.run(
            [
                "nsenter",
                "-t",
                str(self.process.pid),
                "-m",
                "-n",
                str(self.runsc),
                "--root",
                root,
                *args,
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
            timeout=120,
        )

    def _delete_sandbox(self, actor_id: str) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        for name in (APP, "pause", APP):
            self._nsenter_runsc(actor_id, "delete", "--force", name)

    def round(self, i: int) -> list[float]:
        """Run→running, Checkpoint (FULL, with its teardown), Restore (FULL) of one actor."""
        actor_id = f"bench-{i}"
        self.actors.append(actor_id)
        actor = self._actor_dir(actor_id)
        self._prepare(actor_id)
        pb = self.pb
        t0 = time.perf_counter()
        self.stub.RunWorkload(pb.RunWorkloadRequest(**self._identity(actor_id)), timeout=120)
        t1 = time.perf_counter()
        answer = self.stub.CheckpointWorkload(
            pb.CheckpointWorkloadRequest(**self._identity(actor_id), scope=pb.SNAPSHOT_SCOPE_FULL),
            timeout=120,
        )
        t2 = time.perf_counter()
        if "checkpoint.img" not in answer.snapshot_files:
            raise RuntimeError(f"upstream checkpoint listed {list(answer.snapshot_files)}")
        # atelet: upload, reset the actor's runsc, bundle and pid-file directories, then for
        # the restore download the image into restore-state and prepare fresh bundles.
        os.replace(actor / "checkpoint-state", actor / "restore-state")
        for name in ("runsc-state", "bundles", "pidfiles"):
            shutil.rmtree(actor / name, ignore_errors=True)
        self._prepare(actor_id)
        t2b = time.perf_counter()
        self.stub.RestoreWorkload(
            pb.RestoreWorkloadRequest(**self._identity(actor_id), scope=pb.SNAPSHOT_SCOPE_FULL),
            timeout=120,
        )
        t3 = time.perf_counter()
        state = self._nsenter_runsc(actor_id, "state", APP)
        if state.returncode != 0 or json.loads(state.stdout).get("status") != "running":
            raise RuntimeError(f"upstream restore left {APP}: {state.stdout!r} {state.stderr!r}")
        self._delete_sandbox(actor_id)
        self.actors.remove(actor_id)
        shutil.rmtree(actor, ignore_errors=True)
        return [t1 - t0, t2 - t1, t3 - t2b]
