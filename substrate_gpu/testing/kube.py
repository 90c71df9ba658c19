"""A real etcd + kube-apiserver on 127.0.0.1 and free ports, in a directory of its own.

For the WorkerPool tests (``tests/kube/``) and for trying the controller without a cluster
(docs/api-guide.md, "Quick start"): ``python -m substrate_gpu.testing.kube start DIR``
starts both in the background and writes ``DIR/kubeconfig``, ``apply FILE`` and ``get KIND
NAME`` talk to it, ``stop DIR`` ends it. No kubectl needed: :class:`KubeClient` is a tiny
REST client.

The binaries come from ``scripts/build-kube.sh`` (the cache it fills, or
``SUBSTRATE_GPU_KUBE_BIN``). Authentication is a static token file: an admin token in
``system:masters`` for the tests, and service-account tokens (TokenRequest, signed with a
key made at start) for the controller, so RBAC is enforced as in a cluster
(``--authorization-mode=RBAC``). Serving certificates: the API server's own self-signed
pair, written into the temp dir, trusted through ``apiserver.crt``.

There is no kube-controller-manager and no scheduler: Deployments make no ReplicaSets or
Pods, and garbage collection of owned objects never runs.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from substrate_gpu.pools import crd, model

KUBE_VERSION = "v1.37.2"
"""What ``scripts/build-kube.sh`` builds (its ``KUBE_VERSION=``; a test holds the two equal)."""
ADMIN_TOKEN = "substrate-gpu-test-admin"  # noqa: S105 (a local test server's, no secret)
START_DEADLINE_S = 60.0


def binary_dir() -> Path:
    """Where the built kube-apiserver and etcd are expected."""
    explicit = os.environ.get("SUBSTRATE_GPU_KUBE_BIN")
    if explicit:
        return Path(explicit)
    cache = Path(os.environ.get("SUBSTRATE_GPU_CACHE", "/var/cache/substrate-gpu"))
    return cache / "kube" / KUBE_VERSION / "bin"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class KubeError(AssertionError):
    """The API server refused a request, or did not start.

    An AssertionError on purpose: a test probing until something exists sees one, and the
    test kit's callers are tests first."""


@dataclass
class Response:
    status: int
    body: Any

    @property
    def causes(self) -> list[dict[str, Any]]:
        """``details.causes`` of a Status error (field errors, CEL messages)."""
        details = self.body.get("details") or {} if isinstance(self.body, dict) else {}
        return list(details.get("causes") or [])


class KubeClient:
    """A tiny REST client: enough for tests, and it shows exactly what is sent."""

    def __init__(self, host: str, port: int, ca_file: Path, token: str) -> None:
        self.host, self.port, self.token, self.ca_file = host, port, token, ca_file

    @property
    def context(self) -> ssl.SSLContext:
        # Built per request: the API server writes its certificate only once it starts.
        return ssl.create_default_context(cafile=str(self.ca_file))

    def request(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
        timeout: float = 10.0,
    ) -> Response:
        if query:
            path = f"{path}?{urllib.parse.urlencode(query)}"
        conn = http.client.HTTPSConnection(
            self.host, self.port, context=self.context, timeout=timeout
        )
        try:
            headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = content_type
            conn.request(method, path, body=data, headers=headers)
            raw = conn.getresponse()
            text = raw.read()
        finally:
            conn.close()
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = text.decode(errors="replace")
        return Response(raw.status, parsed)

    @classmethod
    def from_kubeconfig(cls, path: Path) -> KubeClient:
        """The client for a kubeconfig :meth:`KubeApiServer.kubeconfig` wrote (token, CA file)."""
        try:
            config = yaml.safe_load(path.read_text())
            [cluster] = config["clusters"]
            [user] = config["users"]
            url = urllib.parse.urlsplit(cluster["cluster"]["server"])
            ca_file = Path(cluster["cluster"]["certificate-authority"])
            token = str(user["user"]["token"])
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as e:
            raise KubeError(
                f"while reading the kubeconfig {path}: {type(e).__name__}: {e} "
                "(this client reads the kubeconfig `start` writes)"
            ) from e
        return cls(url.hostname or "127.0.0.1", url.port or 443, ca_file, token)

    def ok(self, method: str, path: str, body: object = None, **kwargs: Any) -> Any:
        """The answer's body; :class:`KubeError` unless the status is 2xx."""
        response = self.request(method, path, body, **kwargs)
        if not 200 <= response.status < 300:
            raise KubeError(f"{method} {path}: {response.status} {response.body}")
        return response.body

    def apply(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> Response:
        """Server-side apply with strict field validation (unknown fields are errors)."""
        query = {
            "fieldManager": "substrate-gpu-tests",
            "force": "true",
            "fieldValidation": "Strict",
        }
        if dry_run:
            query["dryRun"] = "All"
        return self.request(
            "PATCH",
            object_path(obj),
            obj,
            content_type="application/apply-patch+yaml",
            query=query,
        )

    def create_namespace(self, name: str) -> None:
        response = self.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        if response.status not in (201, 409):
            raise KubeError(f"creating namespace {name}: {response.status} {response.body}")


_CORE_PLURALS = {
    "Namespace": "namespaces",
    "ServiceAccount": "serviceaccounts",
    "Deployment": "deployments",
    "DaemonSet": "daemonsets",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "CustomResourceDefinition": "customresourcedefinitions",
    "WorkerPool": "workerpools",
}
_CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


def object_path(obj: Mapping[str, Any]) -> str:
    """The REST path of ``obj`` (the kinds our manifests use)."""
    api_version, kind = obj["apiVersion"], obj["kind"]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    plural = _CORE_PLURALS[kind]
    name = obj["metadata"]["name"]
    if kind in _CLUSTER_SCOPED:
        return f"{base}/{plural}/{name}"
    namespace = obj["metadata"].get("namespace", "default")
    return f"{base}/namespaces/{namespace}/{plural}/{name}"


class KubeApiServer:
    """etcd and kube-apiserver as child processes; the API server can be restarted alone."""

    def __init__(self, bin_dir: Path, workdir: Path, *, detached: bool = False) -> None:
        self.bin_dir, self.workdir = bin_dir, workdir
        self.detached = detached
        """Children in their own session, outliving this process (``start``)."""
        self.etcd_port, self.peer_port, self.port = free_port(), free_port(), free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.apiserver: subprocess.Popen[bytes] | None = None
        self.certs = workdir / "certs"
        self.admin = KubeClient("127.0.0.1", self.port, self.ca_file, ADMIN_TOKEN)

    @property
    def ca_file(self) -> Path:
        return self.certs / "apiserver.crt"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.certs.mkdir(exist_ok=True)
        (self.workdir / "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n')
        key = self.workdir / "sa.key"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True
        )
        self._start_etcd()
        self.start_apiserver()

    def _log(self, name: str) -> int:
        # A raw descriptor, closed right after Popen has dup'ed it into the child.
        return os.open(self.workdir / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.etcd = subprocess.Popen(
            [
                str(self.bin_dir / "etcd"),
                "--name=test",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=test={peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            stdout=(log := self._log("etcd")),
            stderr=subprocess.STDOUT,
            start_new_session=self.detached,
        )
        os.close(log)

    def start_apiserver(self) -> None:
        key = self.workdir / "sa.key"
        self.apiserver = subprocess.Popen(
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # No kubernetes Service endpoints: a loopback address may not be one.
                "--endpoint-reconciler-type=none",
                f"--secure-port={self.port}",
                f"--cert-dir={self.certs}",
                f"--token-auth-file={self.workdir / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={key}",
                f"--service-account-signing-key-file={key}",
                "--service-cluster-ip-range=10.96.0.0/24",
                # Privileged containers are refused: nothing we ship may need one.
                "--allow-privileged=false",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                "--v=1",
            ],
            stdout=(log := self._log("kube-apiserver")),
            stderr=subprocess.STDOUT,
            start_new_session=self.detached,
        )
        os.close(log)
        self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_DEADLINE_S
        last: object = None
        while time.monotonic() < deadline:
            if self.apiserver is None or self.apiserver.poll() is not None:
                raise KubeError(f"kube-apiserver exited:\n{self.log_tail()}")
            if self.ca_file.exists():
                try:
                    response = self.admin.request("GET", "/readyz", timeout=2)
                    if response.status == 200:
                        return
                    last = response.body
                except (OSError, ssl.SSLError) as e:
                    last = e
            time.sleep(0.2)
        raise KubeError(f"kube-apiserver not ready: {last}\n{self.log_tail()}")

    def log_tail(self, name: str = "kube-apiserver", lines: int = 40) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop_apiserver(self, sig: int = signal.SIGTERM) -> None:
        if self.apiserver is not None and self.apiserver.poll() is None:
            self.apiserver.send_signal(sig)
            try:
                self.apiserver.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.apiserver.kill()
                self.apiserver.wait()
        self.apiserver = None

    def stop(self) -> None:
        self.stop_apiserver()
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait()

    def kubeconfig(self, path: Path, token: str) -> Path:
        """A kubeconfig for ``token`` (what the controller reads through KUBECONFIG)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": "test", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
            "current-context": "test",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def service_account_token(self, namespace: str, name: str) -> str:
        """A bound token for a ServiceAccount (TokenRequest), as a pod would mount."""
        body = self.admin.ok(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )
        return str(body["status"]["token"])


def install_crd(client: KubeClient) -> None:
    """Apply deploy's CRD and wait until the API server serves it."""
    response = client.apply(crd.render_crd())
    if response.status not in (200, 201):
        raise KubeError(f"applying the WorkerPool CRD: {response.status} {response.body}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        body = client.ok(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd.CRD_NAME}"
        )
        # Right after creation the status (and its conditions) may still be null.
        listed = (body.get("status") or {}).get("conditions") or []
        conditions = {c["type"]: c["status"] for c in listed}
        # Discovery lags Established by a moment; list once to be sure it is served.
        if (
            conditions.get("Established") == "True"
            and client.request("GET", f"/apis/{model.API_VERSION}/{crd.PLURAL}").status == 200
        ):
            return
        time.sleep(0.2)
    raise KubeError(f"the WorkerPool CRD never became Established: {body.get('status')}")


@contextlib.contextmanager
def running_apiserver(bin_dir: Path, workdir: Path) -> Iterator[KubeApiServer]:
    server = KubeApiServer(bin_dir, workdir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


# --- the command line: a local API server for the quick start ------------------------------

_PIDS = "pids"
"""In the directory: the pids of etcd and kube-apiserver, which outlive ``start``."""
_KINDS = {"workerpool": "WorkerPool", "deployment": "Deployment"}


def start_detached(workdir: Path) -> Path:
    """Start etcd and kube-apiserver in the background under ``workdir``, install the CRD;
    the kubeconfig (cluster-admin) written there."""
    bin_dir = binary_dir()
    for name in ("etcd", "kube-apiserver"):
        if not (bin_dir / name).is_file():
            raise KubeError(f"{bin_dir / name} is not built: run scripts/build-kube.sh first")
    if _running_pids(workdir):
        raise KubeError(
            f"an API server already runs from {workdir}: stop it first (stop {workdir})"
        )
    server = KubeApiServer(bin_dir, workdir, detached=True)
    try:
        server.start()
        install_crd(server.admin)
    except BaseException:
        server.stop()
        raise
    assert server.etcd is not None and server.apiserver is not None
    (workdir / _PIDS).write_text(f"{server.apiserver.pid} {server.etcd.pid}\n")
    return server.kubeconfig(workdir / "kubeconfig", ADMIN_TOKEN)


def _running_pids(workdir: Path) -> list[int]:
    try:
        pids = [int(p) for p in (workdir / _PIDS).read_text().split()]
    except (OSError, ValueError):
        return []
    return [pid for pid in pids if _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


def stop_detached(workdir: Path) -> int:
    """SIGTERM what :func:`start_detached` started (the API server first); how many ran."""
    pids = _running_pids(workdir)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    (workdir / _PIDS).unlink(missing_ok=True)
    return len(pids)


def _client(args: argparse.Namespace) -> KubeClient:
    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG")
    if not kubeconfig:
        raise KubeError("no kubeconfig: give --kubeconfig or set KUBECONFIG (start prints it)")
    return KubeClient.from_kubeconfig(Path(kubeconfig))


def _apply(args: argparse.Namespace) -> int:
    client = _client(args)
    path: Path = args.file
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        raise KubeError(f"while reading {path}: {e}") from e
    for doc in docs:
        response = client.apply(doc)
        name = f"{doc['kind'].lower()}/{doc['metadata']['name']}"
        if response.status not in (200, 201):
            message = response.body.get("message") if isinstance(response.body, dict) else None
            raise KubeError(f"{path}: {name}: {response.status} {message or response.body}")
        print(f"{name} {'created' if response.status == 201 else 'configured'}")
    return 0


def _observed(kind: str, body: Mapping[str, Any]) -> bool:
    """Whether the controller has handled the object's current generation (a pool's status)."""
    if kind != "WorkerPool":
        return True
    status = body.get("status") or {}
    return bool(status.get("observedGeneration") == body["metadata"].get("generation"))


def _get(args: argparse.Namespace) -> int:
    client = _client(args)
    kind = _KINDS[args.kind]
    api_version = "apps/v1" if kind == "Deployment" else model.API_VERSION
    metadata = {"name": args.name, "namespace": args.namespace}
    path = object_path({"apiVersion": api_version, "kind": kind, "metadata": metadata})
    deadline = time.monotonic() + args.timeout
    while True:
        response = client.request("GET", path)
        if response.status == 200 and _observed(kind, response.body):
            break
        if time.monotonic() > deadline:
            what = "has no status yet" if response.status == 200 else f"answers {response.status}"
            raise KubeError(
                f"{args.kind} {args.namespace}/{args.name} {what} after {args.timeout:g} s "
                "(is the controller running?)"
            )
        time.sleep(0.2)
    body = dict(response.body)
    body["metadata"] = {k: v for k, v in body["metadata"].items() if k != "managedFields"}
    sys.stdout.write("---\n" + yaml.safe_dump(body, sort_keys=False))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m substrate_gpu.testing.kube start|stop|apply|get``."""
    parser = argparse.ArgumentParser(
        prog="python -m substrate_gpu.testing.kube",
        description="A local etcd + kube-apiserver (scripts/build-kube.sh builds them) with "
        "the WorkerPool CRD, and enough of a client to apply and read objects.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start both in the background; print KUBECONFIG")
    start.add_argument("dir", type=Path, help="their data, logs, certificates and kubeconfig")
    stop = commands.add_parser("stop", help="stop what start started in DIR")
    stop.add_argument("dir", type=Path)
    apply = commands.add_parser("apply", help="server-side apply every document of FILE")
    apply.add_argument("file", type=Path, metavar="FILE")
    get = commands.add_parser(
        "get", help="print an object as YAML, once it exists (a pool: once the controller saw it)"
    )
    get.add_argument("kind", choices=sorted(_KINDS))
    get.add_argument("name")
    get.add_argument("--namespace", default="default")
    get.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (default 30)")
    for sub in (apply, get):
        sub.add_argument("--kubeconfig", help="default: $KUBECONFIG")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            kubeconfig = start_detached(args.dir.resolve())
            print(f"kube-apiserver {KUBE_VERSION} serving, WorkerPool CRD installed")
            print(f"export KUBECONFIG={kubeconfig}")
            return 0
        if args.command == "stop":
            print(f"stopped {stop_detached(args.dir.resolve())} process(es)")
            return 0
        return _apply(args) if args.command == "apply" else _get(args)
    except (KubeError, OSError) as e:
        print(f"{parser.prog} {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
