"""``substrate-gpu controller`` against a real kube-apiserver, logged in as its ServiceAccount.

The controller runs as a child process with the ServiceAccount, ClusterRole and binding
of ``deploy/controller.yaml`` (a TokenRequest token), so every test also proves that
RBAC is enough. The create/update/delete tests share one controller and one namespace
(each with its own pool); the rejection and restart tests start their own.

What this API server cannot show: there is no kube-controller-manager, so Deployments
make no Pods (``status.replicas`` is what the Deployment asks for, not running workers)
and owner references are never garbage-collected: a deleted pool's Deployment vanishing
here is the controller's own delete, behind its finalizer.
"""

from __future__ import annotations

import copy
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pools.pool_cases import flat, pool
from support.kube_apiserver import KubeApiServer, KubeClient
from support.kube_controller import ControllerProcess

from substrate_gpu.controller import operator, reconcile
from substrate_gpu.pools import (
    ControllerSettings,
    load_pool,
    manifests,
    render_worker_deployment,
    validate_document,
)

REPO = Path(__file__).resolve().parents[2]
WORKER_IMAGE = "ateom:test"
CONTROLLER_ENV = {
    "ATE_DEFAULT_WORKER_IMAGE": WORKER_IMAGE,
    "ATE_NVIDIA_DRIVER_ROOT": "/run/nvidia/driver",
}
SETTINGS = ControllerSettings.from_env(CONTROLLER_ENV)
POOLS = f"/apis/{reconcile.model.API_VERSION}"


def install_controller_rbac(admin: KubeClient) -> str:
    """Apply deploy/controller.yaml's account and RBAC; the Deployment is dry-run only."""
    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "controller.yaml").read_text()) if d]
    admin.create_namespace(manifests.AGENT_NAMESPACE)
    for doc in docs:
        response = admin.apply(doc, dry_run=doc["kind"] == "Deployment")
        assert response.status in (200, 201), response.body
    return manifests.CONTROLLER_NAME


def controller_kubeconfig(server: KubeApiServer, path: Path) -> Path:
    account = install_controller_rbac(server.admin)
    token = server.service_account_token(manifests.AGENT_NAMESPACE, account)
    return server.kubeconfig(path, token)


@pytest.fixture(scope="module")
def kubeconfig(
    apiserver: KubeApiServer, workerpool_crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return controller_kubeconfig(apiserver, tmp_path_factory.mktemp("controller") / "kubeconfig")


def start_controller(
    kubeconfig: Path, namespace: str, log: Path, env: dict[str, str] = CONTROLLER_ENV
) -> ControllerProcess:
    controller = ControllerProcess(kubeconfig, namespace, log, env)
    controller.start()
    return controller


@pytest.fixture(scope="module")
def watched(admin: KubeClient) -> str:
    """One namespace for the tests that share :func:`controller` (each uses its own pools)."""
    name = f"watched-{int(time.time() * 1000) % 100000}"
    admin.create_namespace(name)
    return name


@pytest.fixture(scope="module")
def controller(
    kubeconfig: Path, watched: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerProcess]:
    """One controller for the create/update/delete tests: starting one takes seconds."""
    log = tmp_path_factory.mktemp("controller") / "controller.log"
    process = start_controller(kubeconfig, watched, log)
    yield process
    process.kill()  # a graceful stop takes kopf a second or two, and proves nothing here


# --- reading the cluster ----------------------------------------------------------------


def pool_path(namespace: str, name: str = "") -> str:
    return f"{POOLS}/namespaces/{namespace}/workerpools" + (f"/{name}" if name else "")


def deployments(admin: KubeClient, namespace: str, pool_name: str = "") -> list[dict[str, Any]]:
    """The namespace's Deployments (only ``pool_name``'s when given)."""
    found = admin.ok("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments")["items"]
    wanted = reconcile.deployment_name(pool_name) if pool_name else None
    return [d for d in found if wanted in (None, d["metadata"]["name"])]


def condition(body: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in body.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return dict(c)
    return None


def ready_at(
    admin: KubeClient, namespace: str, name: str, generation: int
) -> dict[str, Any] | None:
    """The pool once Ready for ``generation`` (None before)."""
    body = admin.ok("GET", pool_path(namespace, name))
    ready = condition(body, "Ready")
    if (
        body.get("status", {}).get("observedGeneration") == generation
        and ready
        and ready["status"] == "True"
    ):
        return dict(body)
    return None


def logged(controller: ControllerProcess, event: str, pool: str) -> bool | None:
    """Whether the controller's log has a line for ``event`` on ``pool`` (None: not yet)."""
    text = controller.log.read_text(errors="replace")
    return (
        True
        if any(event in line and f"pool={pool}" in line for line in text.splitlines())
        else None
    )


def create_pool(admin: KubeClient, namespace: str, doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["metadata"]["namespace"] = namespace
    return dict(admin.ok("POST", pool_path(namespace), doc))


def gpu_pool(name: str = "gpu", workers: int = 2) -> dict[str, Any]:
    return pool(
        flat("1", maxWorkers=workers, nodeSelector={"accelerator": "nvidia-gpu"}), name=name
    )


def expected_deployment(created: dict[str, Any]) -> dict[str, Any]:
    return render_worker_deployment(load_pool(created), SETTINGS)


def _without_default_mode(volume: dict[str, Any]) -> dict[str, Any]:
    """A volume without the file mode the API server defaults projected files to (0644)."""
    return {
        key: {k: v for k, v in value.items() if (k, v) != ("defaultMode", 0o644)}
        if key in ("downwardAPI", "projected") and isinstance(value, dict)
        else value
        for key, value in volume.items()
    }


def without_server_fields(deployment: dict[str, Any]) -> dict[str, Any]:
    """The parts of a stored Deployment the controller wrote (for comparison with the renderer)."""
    metadata = deployment["metadata"]
    template = deployment["spec"]["template"]
    container = template["spec"]["containers"][0]
    return {
        "labels": metadata["labels"],
        "replicas": deployment["spec"]["replicas"],
        "selector": deployment["spec"]["selector"],
        "pod_labels": template["metadata"]["labels"],
        "node_selector": template["spec"].get("nodeSelector"),
        "volumes": [_without_default_mode(v) for v in template["spec"].get("volumes") or []],
        "image": container["image"],
        "resources": container.get("resources"),
        "mounts": container.get("volumeMounts"),
        "env": [e["name"] for e in container.get("env", [])],
        "privileged": (container.get("securityContext") or {}).get("privileged"),
        "host_users": template["spec"].get("hostUsers"),
    }


# --- create, update, delete ---------------------------------------------------------------


def test_a_new_pool_gets_one_shaped_owned_deployment_and_a_ready_status(
    admin: KubeClient, watched: str, controller: ControllerProcess
) -> None:
    """Create: the renderer's Deployment (GPU shape included), owned by the pool, Ready at gen 1."""
    namespace = watched
    created = create_pool(admin, namespace, gpu_pool("created"))
    body = controller.wait_for("Ready", lambda: ready_at(admin, namespace, "created", 1))
    [deployment] = deployments(admin, namespace, "created")
    want = expected_deployment(created)
    assert without_server_fields(deployment) == without_server_fields(want)
    # The whole pod template, after the API server's defaulting, is the renderer's.
    rendered = admin.request(
        "POST",
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        {**want, "metadata": {**want["metadata"], "name": "rendered"}},
        query={"dryRun": "All"},
    )
    assert deployment["spec"]["template"] == rendered.body["spec"]["template"]
    # Today's shaping, seen on the server: GPUs, toolkit mount, driver root, no privilege.
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {
        "name": "nvidia-toolkit",
        "mountPath": "/opt/nvidia-toolkit",
        "readOnly": True,
    } in container["volumeMounts"]
    assert {"name": "ATE_NVIDIA_DRIVER_ROOT", "value": "/run/nvidia/driver"} in container["env"]
    # Upstream's worker pod (workerpool_apply.go at 533900d), as stored: unprivileged, the
    # gVisor capability set, a 3600 s grace, no-surge rollout.
    assert container["name"] == "worker"
    assert container["securityContext"]["privileged"] is False
    assert "SYS_ADMIN" in container["securityContext"]["capabilities"]["add"]
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 3600
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 0,
        "maxUnavailable": "10%",
    }
    [owner] = deployment["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "WorkerPool",
        "created",
        created["metadata"]["uid"],
        True,
    )
    assert body["status"]["replicas"] == 2
    assert body["status"]["deployment"] == "created-workers"
    assert condition(body, "Rejected")["status"] == "False"  # type: ignore[index]
    assert operator.FINALIZER in body["metadata"]["finalizers"]
    # At its default level the controller says what it did.
    assert logged(controller, "workerpool created", f"{namespace}/created")


def test_an_updated_pool_updates_its_deployment_and_observed_generation(
    admin: KubeClient, watched: str, controller: ControllerProcess
) -> None:
    """Update: maxWorkers 2 -> 5 reaches the Deployment, status follows generation 2."""
    namespace = watched
    create_pool(admin, namespace, gpu_pool("updated"))
    controller.wait_for("Ready", lambda: ready_at(admin, namespace, "updated", 1))
    admin.ok(
        "PATCH",
        pool_path(namespace, "updated"),
        {"spec": {"maxWorkers": 5}},
        content_type="application/merge-patch+json",
    )
    body = controller.wait_for("Ready at 2", lambda: ready_at(admin, namespace, "updated", 2))
    [deployment] = deployments(admin, namespace, "updated")
    assert deployment["spec"]["replicas"] == 5
    assert body["status"]["replicas"] == 5
    assert logged(controller, "workerpool updated", f"{namespace}/updated")


def earlier_controllers_deployment(created: dict[str, Any]) -> dict[str, Any]:
    """The Deployment a controller before issue 31 applied for ``created``: container
    ``ateom``, no security context, a 45 s grace, the default rollout."""
    old = expected_deployment(created)
    old["metadata"]["ownerReferences"] = [
        {
            "apiVersion": reconcile.model.API_VERSION,
            "kind": "WorkerPool",
            "name": created["metadata"]["name"],
            "uid": created["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    del old["spec"]["strategy"], old["spec"]["progressDeadlineSeconds"]
    spec = old["spec"]["template"]["spec"]
    del spec["securityContext"]
    spec["terminationGracePeriodSeconds"] = 45
    [container] = spec["containers"]
    container["name"] = "ateom"
    del container["securityContext"]
    for volume in spec["volumes"]:
        for item in volume.get("downwardAPI", {}).get("items", []):
            item["resourceFieldRef"]["containerName"] = "ateom"
    return old


def test_a_worker_deployment_of_an_earlier_controller_becomes_upstreams_worker_pod(
    admin: KubeClient, watched: str, controller: ControllerProcess
) -> None:
    """Upgrade: a Deployment an earlier controller applied (same field manager) with the
    container ``ateom`` and no security context is reconciled into exactly the renderer's
    pod: the one container ``worker``, nothing of ``ateom`` left behind by the apply."""
    namespace = watched
    created = create_pool(admin, namespace, gpu_pool("upgraded"))
    controller.wait_for("Ready", lambda: ready_at(admin, namespace, "upgraded", 1))
    old = earlier_controllers_deployment(created)
    response = admin.request(
        "PATCH",
        f"/apis/apps/v1/namespaces/{namespace}/deployments/{old['metadata']['name']}",
        old,
        content_type="application/apply-patch+yaml",
        query={"fieldManager": reconcile.FIELD_MANAGER, "force": "true"},
    )
    assert response.status == 200, response.body
    assert [c["name"] for c in response.body["spec"]["template"]["spec"]["containers"]] == ["ateom"]
    # Any change to the pool makes the controller apply its Deployment again.
    admin.ok(
        "PATCH",
        pool_path(namespace, "upgraded"),
        {"spec": {"maxWorkers": 3}},
        content_type="application/merge-patch+json",
    )
    controller.wait_for("Ready at 2", lambda: ready_at(admin, namespace, "upgraded", 2))
    [deployment] = deployments(admin, namespace, "upgraded")
    template = deployment["spec"]["template"]["spec"]
    [container] = template["containers"]
    want = expected_deployment(admin.ok("GET", pool_path(namespace, "upgraded")))
    [want_container] = want["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "worker"
    assert container["securityContext"] == want_container["securityContext"]
    assert template["securityContext"] == want["spec"]["template"]["spec"]["securityContext"]
    assert template["terminationGracePeriodSeconds"] == 3600
    assert deployment["spec"]["strategy"] == want["spec"]["strategy"]
    assert without_server_fields(deployment) == without_server_fields(want)


def test_a_deleted_pool_takes_its_deployment_along(
    admin: KubeClient, watched: str, controller: ControllerProcess
) -> None:
    """Delete: the controller deletes the Deployment itself (no garbage collector runs here)."""
    namespace = watched
    create_pool(admin, namespace, gpu_pool("deleted"))
    controller.wait_for("Ready", lambda: ready_at(admin, namespace, "deleted", 1))
    admin.ok("DELETE", pool_path(namespace, "deleted"))
    controller.wait_for(
        "the pool gone",
        lambda: (
            True if admin.request("GET", pool_path(namespace, "deleted")).status == 404 else None
        ),
    )
    assert deployments(admin, namespace, "deleted") == []
    controller.wait_for(
        "the delete logged",
        lambda: logged(controller, "workerpool deleted", f"{namespace}/deleted"),
    )


def test_an_invalid_pool_is_refused_at_admission_and_never_reaches_the_controller(
    admin: KubeClient, watched: str, controller: ControllerProcess
) -> None:
    """A GPU on a micro-VM pool: 422 from the API server's CEL, no object, no Deployment."""
    namespace = watched
    doc = pool(flat("1", sandboxClass="microvm"), name="bad")
    doc["metadata"]["namespace"] = namespace
    response = admin.request("POST", pool_path(namespace), doc)
    assert response.status == 422
    # What `pool validate` says, on the same field.
    [problem] = validate_document(doc).errors
    assert problem.message == "nvidia.com/gpu is only supported when sandboxClass is 'gvisor'"
    assert [(c["field"], c["message"]) for c in response.causes] == [
        (problem.path, f"Invalid value: {problem.message}")
    ]
    assert admin.request("GET", pool_path(namespace, "bad")).status == 404
    # Prove the controller is alive and watching, then that it made nothing for "bad".
    create_pool(admin, namespace, gpu_pool("good"))
    controller.wait_for("Ready", lambda: ready_at(admin, namespace, "good", 1))
    assert deployments(admin, namespace, "bad") == []
    assert len(deployments(admin, namespace, "good")) == 1


def test_a_pool_that_cannot_be_rendered_is_rejected_with_the_reason(
    admin: KubeClient, namespace: str, kubeconfig: Path, tmp_path: Path
) -> None:
    """A CPU pool without spec.workerImage, a controller without ATE_DEFAULT_WORKER_IMAGE
    (and no built-in image for CPU workers): Rejected NoWorkerImage, no Deployment."""
    controller = start_controller(kubeconfig, namespace, tmp_path / "c.log", env={})
    cpu = pool({"replicas": 1, "template": {"resources": {"requests": {"cpu": "1"}}}}, name="cpu")
    try:
        create_pool(admin, namespace, cpu)

        def rejected() -> dict[str, Any] | None:
            body = admin.ok("GET", pool_path(namespace, "cpu"))
            c = condition(body, "Rejected")
            return c if c and c["status"] == "True" else None

        rejected_condition = controller.wait_for("Rejected", rejected)
        assert logged(controller, "workerpool rejected", f"{namespace}/cpu")
    finally:
        controller.stop()
    assert rejected_condition["reason"] == "NoWorkerImage"
    assert "ATE_DEFAULT_WORKER_IMAGE" in rejected_condition["message"]
    body = admin.ok("GET", pool_path(namespace, "cpu"))
    assert condition(body, "Ready")["status"] == "False"  # type: ignore[index]
    assert body["status"]["observedGeneration"] == 1
    assert deployments(admin, namespace) == []


# --- restarts -----------------------------------------------------------------------------


def test_a_controller_killed_mid_reconcile_converges_on_exactly_one_deployment(
    admin: KubeClient, namespace: str, kubeconfig: Path, tmp_path: Path
) -> None:
    """SIGKILL as soon as the Deployment exists, change the pool while it is down, restart."""
    log = tmp_path / "controller.log"
    controller = start_controller(kubeconfig, namespace, log)
    try:
        create_pool(admin, namespace, gpu_pool())
        controller.wait_for("the Deployment", lambda: deployments(admin, namespace) or None)
        controller.kill()
        admin.ok(
            "PATCH",
            pool_path(namespace, "gpu"),
            {"spec": {"maxWorkers": 3}},
            content_type="application/merge-patch+json",
        )
        controller.start()
        controller.wait_for("Ready at 2", lambda: ready_at(admin, namespace, "gpu", 2))
    finally:
        controller.stop()
    [deployment] = deployments(admin, namespace)
    assert deployment["spec"]["replicas"] == 3


def test_the_controller_waits_for_the_api_server_and_converges_after_it_restarts(
    apiserver: KubeApiServer, namespace: str, kubeconfig: Path, tmp_path: Path
) -> None:
    """Started while the API server is down, the controller waits (no exit); once it is up,
    pools are reconciled; the API server killed right after a pool is created and started
    again: the controller reconnects, reconciles the pool it missed, follows an update."""
    admin = apiserver.admin
    controller = ControllerProcess(
        kubeconfig, namespace, tmp_path / "controller.log", CONTROLLER_ENV
    )
    try:
        apiserver.stop_apiserver(signal.SIGKILL)  # a graceful stop takes seconds
        controller.start()
        controller.wait_for(
            "the controller to wait for the API server",
            lambda: True if "waiting for the API server" in controller.log_tail() else None,
        )
        apiserver.start_apiserver()
        create_pool(admin, namespace, gpu_pool(workers=1))
        controller.wait_for("Ready", lambda: ready_at(admin, namespace, "gpu", 1))
        create_pool(admin, namespace, gpu_pool("second", workers=2))
        apiserver.stop_apiserver(signal.SIGKILL)
        apiserver.start_apiserver()
        controller.wait_for("second Ready", lambda: ready_at(admin, namespace, "second", 1))
        admin.ok(
            "PATCH",
            pool_path(namespace, "gpu"),
            {"spec": {"maxWorkers": 4}},
            content_type="application/merge-patch+json",
        )
        controller.wait_for("Ready at 2", lambda: ready_at(admin, namespace, "gpu", 2))
        replicas = {
            d["metadata"]["name"]: d["spec"]["replicas"] for d in deployments(admin, namespace)
        }
    finally:
        controller.kill()
        if apiserver.apiserver is None:  # the session's other tests need it
            apiserver.start_apiserver()
    assert replicas == {"gpu-workers": 4, "second-workers": 2}
