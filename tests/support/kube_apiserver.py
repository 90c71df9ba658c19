"""A real etcd + kube-apiserver for tests, on 127.0.0.1 and free ports, in a temp dir.

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

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from substrate_gpu.pools import crd

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-kube.sh"
ADMIN_TOKEN = "substrate-gpu-test-admin"
START_DEADLINE_S = 60.0


def kube_version() -> str:
    """The pinned Kubernetes version (one place: the build script)."""
    match = re.search(r"^KUBE_VERSION=(v\S+)$", BUILD_SCRIPT.read_text(), re.MULTILINE)
    assert match is not None, f"no KUBE_VERSION= line in {BUILD_SCRIPT}"
    return match.group(1)


def binary_dir() -> Path:
    """Where the built kube-apiserver and etcd are expected."""
    explicit = os.environ.get("SUBSTRATE_GPU_KUBE_BIN")
    if explicit:
        return Path(explicit)
    cache = Path(os.environ.get("SUBSTRATE_GPU_CACHE", "/var/cache/substrate-gpu"))
    return cache / "kube" / kube_version() / "bin"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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

    def ok(self, method: str, path: str, body: object = None, **kwargs: Any) -> Any:
        response = self.request(method, path, body, **kwargs)
        assert 200 <= response.status < 300, f"{method} {path}: {response.status} {response.body}"
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
        assert response.status in (201, 409), response.body


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

    def __init__(self, bin_dir: Path, workdir: Path) -> None:
        self.bin_dir, self.workdir = bin_dir, workdir
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
        )
        os.close(log)
        self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_DEADLINE_S
        last: object = None
        while time.monotonic() < deadline:
            assert self.apiserver is not None
            if self.apiserver.poll() is not None:
                raise AssertionError(f"kube-apiserver exited:\n{self.log_tail()}")
            if self.ca_file.exists():
                try:
                    response = self.admin.request("GET", "/readyz", timeout=2)
                    if response.status == 200:
                        return
                    last = response.body
                except (OSError, ssl.SSLError) as e:
                    last = e
            time.sleep(0.2)
        raise AssertionError(f"kube-apiserver not ready: {last}\n{self.log_tail()}")

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
    assert response.status in (200, 201), response.body
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
            and client.request("GET", f"/apis/{crd.model.API_VERSION}/{crd.PLURAL}").status == 200
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"the WorkerPool CRD never became Established: {body.get('status')}")


@contextlib.contextmanager
def running_apiserver(bin_dir: Path, workdir: Path) -> Iterator[KubeApiServer]:
    server = KubeApiServer(bin_dir, workdir)
    try:
        server.start()
        yield server
    finally:
        server.stop()
