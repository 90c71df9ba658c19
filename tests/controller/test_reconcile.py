"""The controller's decisions, as pure functions: the Deployment a pool wants, its status."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from pools.pool_cases import IMAGE, flat, pool

from substrate_gpu.controller import reconcile
from substrate_gpu.pools import ControllerSettings, load_pool, manifests, render_worker_deployment

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "deploy" / "examples").glob("*.yaml"))

SETTINGS = ControllerSettings(driver_root="/usr/local/nvidia", default_image="ateom:1")
NOW = "2026-11-30T12:00:00Z"
LATER = "2026-11-30T13:00:00Z"


def stored(doc: dict[str, Any], *, uid: str = "uid-1", generation: int = 1) -> dict[str, Any]:
    """``doc`` as the API server returns it: namespace, uid, generation, a status."""
    metadata = doc["metadata"] | {"namespace": "ns", "uid": uid, "generation": generation}
    return doc | {"metadata": metadata, "status": {}}


def test_a_valid_pool_plans_its_rendered_deployment_with_an_owner_reference() -> None:
    """The Deployment is the renderer's, plus a controller reference to the pool."""
    body = stored(pool(flat("1")))
    outcome = reconcile.plan(body, SETTINGS)
    assert isinstance(outcome, reconcile.Apply)
    expected = render_worker_deployment(load_pool(body), SETTINGS)
    owners = outcome.deployment["metadata"].pop("ownerReferences")  # type: ignore[attr-defined]
    assert outcome.deployment == expected
    assert owners == [
        {
            "apiVersion": "substrate.agent-substrate.github.com/v1alpha1",
            "kind": "WorkerPool",
            "name": "p",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert outcome.replicas == 2


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_the_controller_shapes_each_example_pools_workers_as_pool_render_does(path: Path) -> None:
    """Same pod (the agent in the GPU container, state, probes, grace) from both paths."""
    for document in manifests.read_documents(path):
        outcome = reconcile.plan(stored(document.content), SETTINGS)
        assert isinstance(outcome, reconcile.Apply)
        rendered = render_worker_deployment(load_pool(stored(document.content)), SETTINGS)
        assert outcome.deployment["spec"] == rendered["spec"]


def test_the_controllers_gpu_workers_run_their_actors_on_the_pods_network() -> None:
    """The Deployment the controller applies starts the GPU worker's agent with
    ``--sandbox-network pod`` (upstream's worker gives every actor a network)."""
    outcome = reconcile.plan(stored(pool(flat("1"))), SETTINGS)
    assert isinstance(outcome, reconcile.Apply)
    [container] = [
        c
        for c in outcome.deployment["spec"]["template"]["spec"]["containers"]  # type: ignore[index]
        if c["name"] == "worker"
    ]
    args = container["args"]
    assert args[args.index("--sandbox-network") + 1] == "pod"


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(pool(flat("1")), id="gpu-pool"),
        pytest.param(pool({"replicas": 2, "template": {}}), id="cpu-pool"),
    ],
)
def test_the_controllers_workers_have_upstreams_worker_pod_posture(doc: dict[str, Any]) -> None:
    """Every Deployment the controller applies, GPU or not, runs its ``worker`` container as
    upstream's controller does: root, never privileged, the gVisor capability set, AppArmor
    and seccomp Unconfined, a 3600 s grace, a no-surge rollout, the sandbox-class toleration."""
    outcome = reconcile.plan(stored(doc), SETTINGS)
    assert isinstance(outcome, reconcile.Apply)
    spec: Any = outcome.deployment["spec"]
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert container["name"] == "worker"
    context = container["securityContext"]
    assert (context["runAsUser"], context["privileged"]) == (0, False)
    assert context["capabilities"]["drop"] == ["ALL"]
    assert "SYS_ADMIN" in context["capabilities"]["add"]
    assert context["appArmorProfile"] == context["seccompProfile"] == {"type": "Unconfined"}
    assert "hostUsers" not in pod
    assert pod["terminationGracePeriodSeconds"] == 3600
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": "10%"}
    assert {
        "key": "ate.dev/sandboxClass",
        "operator": "Equal",
        "value": "gvisor",
        "effect": "NoSchedule",
    } in pod["tolerations"]


def test_the_deployment_name_is_fixed_per_pool() -> None:
    """A retried create can only ever address the same Deployment."""
    outcome = reconcile.plan(stored(pool(flat("1"), name="gpu")), SETTINGS)
    assert isinstance(outcome, reconcile.Apply)
    assert outcome.deployment["metadata"]["name"] == reconcile.deployment_name("gpu")  # type: ignore[index]


CPU_POOL = pool({"replicas": 2, "template": {"resources": {"requests": {"cpu": "1"}}}})


def test_a_cpu_pool_without_any_worker_image_is_rejected_as_no_worker_image() -> None:
    """Valid, but nothing to run (a CPU worker is not ours to guess): Rejected, with the
    reason and what to set."""
    outcome = reconcile.plan(stored(CPU_POOL), ControllerSettings())
    assert isinstance(outcome, reconcile.Reject)
    assert outcome.reason == "NoWorkerImage"
    assert "spec.workerImage" in outcome.message
    assert "ATE_DEFAULT_WORKER_IMAGE" in outcome.message


def test_a_gpu_pool_without_any_worker_image_runs_this_versions_agent_image() -> None:
    """The seed's pool (no image) under a controller without a default: substrate-gpu:<version>."""
    outcome = reconcile.plan(stored(pool(flat("1"))), ControllerSettings())
    assert isinstance(outcome, reconcile.Apply)
    (container,) = outcome.deployment["spec"]["template"]["spec"]["containers"]  # type: ignore[index]
    assert container["image"] == f"substrate-gpu:{metadata.version('substrate-gpu')}"


@pytest.mark.parametrize("field", ["workerImage", "ateomImage"])
def test_the_pool_image_wins_over_the_controller_default(field: str) -> None:
    outcome = reconcile.plan(stored(pool(flat("1", **{field: IMAGE}))), SETTINGS)
    assert isinstance(outcome, reconcile.Apply)
    (container,) = outcome.deployment["spec"]["template"]["spec"]["containers"]  # type: ignore[index]
    assert container["image"] == IMAGE


def test_a_pool_with_a_gpu_typo_is_rejected_not_ready_as_a_cpu_pool() -> None:
    """nvidia.com/gpus stored under an older CRD: the status says InvalidSpec, did you mean."""
    doc = pool({"resourceRequests": {"nvidia.com/gpus": "1"}, "maxWorkers": 10})
    outcome = reconcile.plan(stored(doc), SETTINGS)
    assert isinstance(outcome, reconcile.Reject)
    assert outcome.reason == "InvalidSpec"
    assert "did you mean nvidia.com/gpu?" in outcome.message
    status = reconcile.pool_status(outcome, generation=1, previous=[], now=NOW)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")  # type: ignore[attr-defined]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "nvidia.com/gpus" in ready["message"]


def test_a_warning_reaches_the_ready_condition_of_an_applied_pool() -> None:
    """A deprecated ateomImage is applied, and the status says so (kubectl get -o yaml)."""
    outcome = reconcile.plan(stored(pool(flat("1", ateomImage=IMAGE))), SETTINGS)
    status = reconcile.pool_status(outcome, generation=1, previous=[], now=NOW)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")  # type: ignore[attr-defined]
    assert ready["status"] == "True"
    assert ready["message"].startswith(
        "the worker Deployment is up to date; warning: spec.ateomImage: is deprecated"
    )


def test_a_pool_the_validator_refuses_is_rejected_as_invalid_spec() -> None:
    """An invalid pool that got past admission (older CRD) is still refused, with the problems."""
    outcome = reconcile.plan(stored(pool(flat("1", sandboxClass="microvm"))), SETTINGS)
    assert isinstance(outcome, reconcile.Reject)
    assert outcome.reason == "InvalidSpec"
    assert "nvidia.com/gpu is only supported when sandboxClass is 'gvisor'" in outcome.message


def test_status_of_an_applied_pool_is_ready_with_generation_and_replicas() -> None:
    outcome = reconcile.plan(stored(pool(flat("1")), generation=3), SETTINGS)
    status = reconcile.pool_status(outcome, generation=3, previous=[], now=NOW)
    assert status["observedGeneration"] == 3
    assert status["replicas"] == 2
    assert status["deployment"] == "p-workers"
    conditions = {c["type"]: c for c in status["conditions"]}  # type: ignore[attr-defined]
    assert conditions["Ready"] | {} == {
        "type": "Ready",
        "status": "True",
        "reason": "Reconciled",
        "message": "the worker Deployment is up to date",
        "lastTransitionTime": NOW,
        "observedGeneration": 3,
    }
    assert conditions["Rejected"]["status"] == "False"


def test_status_of_a_rejected_pool_carries_the_reason_on_both_conditions() -> None:
    status = reconcile.pool_status(
        reconcile.Reject("NoWorkerImage", "set one"), generation=1, previous=[], now=NOW
    )
    conditions = {c["type"]: c for c in status["conditions"]}  # type: ignore[attr-defined]
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == (
        "False",
        "NoWorkerImage",
    )
    assert (conditions["Rejected"]["status"], conditions["Rejected"]["message"]) == (
        "True",
        "set one",
    )
    assert "replicas" not in status


@pytest.mark.parametrize(
    ("before", "expected"),
    [
        pytest.param("True", NOW, id="unchanged-status-keeps-its-transition-time"),
        pytest.param("False", LATER, id="flipped-status-gets-a-new-transition-time"),
    ],
)
def test_last_transition_time_moves_only_when_the_status_changes(
    before: str, expected: str
) -> None:
    previous = [{"type": "Ready", "status": before, "lastTransitionTime": NOW}]
    outcome = reconcile.plan(stored(pool(flat("1"))), SETTINGS)
    status = reconcile.pool_status(outcome, generation=2, previous=previous, now=LATER)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")  # type: ignore[attr-defined]
    assert ready["lastTransitionTime"] == expected
