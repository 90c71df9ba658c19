"""Rendered worker pods on a real kube-apiserver: admitted, and judged by Pod Security.

A Deployment's dry-run validates its pod template; a Pod's dry-run also runs the pod
admission plugins (service account, Pod Security). The worker pods of every example pool
are created as Pods (dry-run), the worker Deployment is admitted with its security context
as rendered, and the API server's Pod Security admission compares a GPU worker's posture
with a CPU worker's (both upstream's gVisor worker's): the GPU worker's only extra is host
directories.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest
from support.kube_apiserver import KubeClient

from substrate_gpu.pools import ControllerSettings, load_pool, manifests, render_worker_deployment

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "tests" / "data" / "pools" / "valid").glob("*.yaml"))
SETTINGS = ControllerSettings(driver_root="/usr/local/nvidia", default_image="ateom:1")
GPU_POOL_FILE = REPO / "tests" / "data" / "pools" / "valid" / "user-documented.yaml"
CPU_POOL_FILE = REPO / "tests" / "data" / "pools" / "valid" / "cpu-pool.yaml"
_names = itertools.count(1)


def worker_pods(path: Path, namespace: str) -> list[dict[str, Any]]:
    """The worker pod of each pool in ``path``, as a Pod in ``namespace``."""
    pods = []
    for document in manifests.read_documents(path):
        deployment = render_worker_deployment(load_pool(document.content), SETTINGS)
        template = deployment["spec"]["template"]  # type: ignore[index]
        metadata = {**template["metadata"], "name": f"w{next(_names)}", "namespace": namespace}
        pods.append(
            {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}
        )
    return pods


def create_dry_run(admin: KubeClient, pod: dict[str, Any]) -> Any:
    namespace = pod["metadata"]["namespace"]
    return admin.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        pod,
        query={"dryRun": "All", "fieldValidation": "Strict"},
    )


def pod_namespace(admin: KubeClient, name: str, labels: dict[str, str]) -> str:
    """A namespace with ``labels`` and its ``default`` ServiceAccount (no controller makes it)."""
    body = {"metadata": {"name": name, "labels": labels}}
    assert admin.request("POST", "/api/v1/namespaces", body).status in (201, 409)
    account = {"metadata": {"name": "default"}}
    response = admin.request("POST", f"/api/v1/namespaces/{name}/serviceaccounts", account)
    assert response.status in (201, 409), response.body
    return name


@pytest.fixture(scope="module", autouse=True)
def runtime_classes(admin: KubeClient) -> None:
    """The RuntimeClasses the example pools name (admission refuses a pod naming none)."""
    for path in EXAMPLES:
        for document in manifests.read_documents(path):
            name = load_pool(document.content).runtime_class_name
            if name:
                body = {"metadata": {"name": name}, "handler": name}
                response = admin.request("POST", "/apis/node.k8s.io/v1/runtimeclasses", body)
                assert response.status in (201, 409), response.body


@pytest.fixture(scope="module", autouse=True)
def priority_classes(admin: KubeClient) -> None:
    """The PriorityClasses the example pools name (the Priority admission plugin needs them)."""
    for path in EXAMPLES:
        for document in manifests.read_documents(path):
            name = load_pool(document.content).priority_class_name
            if name:
                body = {"metadata": {"name": name}, "value": 1000}
                response = admin.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body)
                assert response.status in (201, 409), response.body


@pytest.fixture(scope="module")
def open_namespace(admin: KubeClient) -> str:
    return pod_namespace(admin, "worker-pods", {})


def violations(admin: KubeClient, level: str, path: Path) -> dict[str, str]:
    """Pod Security ``level``'s verdict on the worker pod of ``path``: check -> detail."""
    namespace = pod_namespace(admin, f"pss-{level}", {"pod-security.kubernetes.io/enforce": level})
    [pod] = worker_pods(path, namespace)
    response = create_dry_run(admin, pod)
    if response.status in (200, 201):
        return {}
    assert response.status == 403, response.body
    # `... violates PodSecurity "baseline:latest": check (detail), check (detail)`
    verdict = response.body["message"].split(':latest": ', 1)[1]
    return dict(re.findall(r"([^,()][^()]*?) \(((?:[^()]|\([^()]*\))*)\)(?:, |$)", verdict))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_rendered_worker_pod_passes_server_side_dry_run(
    admin: KubeClient, open_namespace: str, path: Path
) -> None:
    """Each example pool's worker pod (the agent's command, probes, downward-API env,
    subPathExpr mounts) is admitted as a Pod, strictly."""
    for pod in worker_pods(path, open_namespace):
        response = create_dry_run(admin, pod)
        assert response.status in (200, 201), response.body


def test_a_gpu_worker_breaks_baseline_where_a_cpu_worker_does_plus_host_directories(
    admin: KubeClient,
) -> None:
    """Under Pod Security baseline, a CPU worker is refused for upstream's gVisor posture
    alone (its capabilities, AppArmor and seccomp Unconfined: never privileged, no host
    namespaces, no procMount), and a GPU worker for exactly that plus hostPath volumes
    (toolkit, state, socket, /var/lib/ate)."""
    cpu = violations(admin, "baseline", CPU_POOL_FILE)
    assert set(cpu) == {
        "non-default capabilities",
        "forbidden AppArmor profile",
        "seccompProfile",
    }, cpu
    for capability in ("SYS_ADMIN", "SYS_PTRACE", "NET_ADMIN"):
        assert capability in cpu["non-default capabilities"]
    gpu = violations(admin, "baseline", GPU_POOL_FILE)
    assert gpu.pop("hostPath volumes")
    assert gpu == cpu
    found = violations(admin, "baseline", GPU_POOL_FILE)["hostPath volumes"]
    for volume in ("nvidia-toolkit", "substrate-gpu-state", "substrate-gpu-socket", "ate-base"):
        assert f'"{volume}"' in found


def test_a_gpu_worker_breaks_restricted_where_a_cpu_worker_does_plus_host_directories(
    admin: KubeClient,
) -> None:
    """Under Pod Security restricted, the GPU worker's findings are the CPU worker's, plus
    its hostPath volumes: the same posture, host directories aside."""
    cpu = violations(admin, "restricted", CPU_POOL_FILE)
    gpu = violations(admin, "restricted", GPU_POOL_FILE)
    assert cpu
    assert set(gpu) == set(cpu) | {"restricted volume types"}, (cpu, gpu)
    assert 'type "hostPath"' in gpu["restricted volume types"]


def test_the_api_server_keeps_the_identity_and_capacity_volumes(
    admin: KubeClient, open_namespace: str
) -> None:
    """The pod certificate, its trust bundle and the capacity files the report to atelet
    reads survive admission as written: an API server with those projections off would drop
    them (a disabled feature's fields are dropped, not refused)."""
    [pod] = worker_pods(GPU_POOL_FILE, open_namespace)
    response = create_dry_run(admin, pod)
    assert response.status in (200, 201), response.body
    volumes = {v["name"]: v for v in response.body["spec"]["volumes"]}
    sources = volumes["atunnel-identity"]["projected"]["sources"]
    assert [sorted(s) for s in sources] == [["podCertificate"], ["clusterTrustBundle"]]
    assert sources[0]["podCertificate"]["signerName"] == "podidentity.podcert.ate.dev/identity"
    items = volumes["worker-capacity"]["downwardAPI"]["items"]
    assert [
        (i["path"], i["resourceFieldRef"]["resource"], i["resourceFieldRef"]["divisor"])
        for i in items
    ] == [
        ("cpu_milli", "limits.cpu", "1m"),
        ("memory_bytes", "limits.memory", "1"),
    ]


def test_the_worker_deployment_is_admitted_with_upstreams_worker_pod_shape(
    admin: KubeClient, open_namespace: str
) -> None:
    """The GPU pool's Deployment, created (dry-run, strict) on an API server that refuses
    privileged pods (``--allow-privileged=false``), comes back with every field of the worker
    pod's shape as rendered: the security contexts (an API server that did not know
    ``appArmorProfile`` would drop it), the rollout, the grace, the sandbox-class toleration,
    the /var/lib/ate mount's propagation."""
    [document] = manifests.read_documents(GPU_POOL_FILE)
    deployment = render_worker_deployment(load_pool(document.content), SETTINGS)
    deployment["metadata"]["namespace"] = open_namespace  # type: ignore[index]
    response = admin.request(
        "POST",
        f"/apis/apps/v1/namespaces/{open_namespace}/deployments",
        deployment,
        query={"dryRun": "All", "fieldValidation": "Strict"},
    )
    assert response.status == 201, response.body
    rendered: dict[str, Any] = deployment["spec"]  # type: ignore[assignment]
    admitted = response.body["spec"]
    assert admitted["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "10%"},
    }
    assert admitted["progressDeadlineSeconds"] == 4800
    pod, pod_rendered = admitted["template"]["spec"], rendered["template"]["spec"]
    assert pod["securityContext"] == pod_rendered["securityContext"]
    assert pod["terminationGracePeriodSeconds"] == 3600
    assert pod["tolerations"] == pod_rendered["tolerations"]
    [container], [container_rendered] = pod["containers"], pod_rendered["containers"]
    assert container["name"] == "worker"
    assert container["securityContext"] == container_rendered["securityContext"]
    assert container["securityContext"]["privileged"] is False
    assert container["securityContext"]["appArmorProfile"] == {"type": "Unconfined"}
    [ate] = [m for m in container["volumeMounts"] if m["mountPath"] == "/var/lib/ate"]
    assert ate["mountPropagation"] == "HostToContainer"
