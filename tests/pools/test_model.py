"""Normalising both YAML forms into one frozen WorkerPool."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pool_cases import IMAGE, pool

from substrate_gpu.pools import (
    GpuSharing,
    Toleration,
    WorkerPool,
    load_pool,
    read_documents,
    validate_document,
)
from substrate_gpu.pools.model import (
    NodeAffinity,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    is_extended_resource,
)

USER_DOC = pool(
    {
        "nodeSelector": {"accelerator": "nvidia-gpu"},
        "resourceRequests": {"nvidia.com/gpu": "1"},
        "maxWorkers": 10,
    },
    name="gpu-pool",
)


def test_user_documented_pool_normalises() -> None:
    """The user's documented YAML becomes a gVisor pool of 10 workers with 1 GPU each."""
    p = load_pool(USER_DOC)
    assert (p.name, p.namespace, p.replicas, p.sandbox_class) == (
        "gpu-pool",
        "default",
        10,
        "gvisor",
    )
    assert (p.gpu_count, dict(p.node_selector)) == (1, {"accelerator": "nvidia-gpu"})


def test_flat_and_upstream_forms_give_the_same_pool() -> None:
    """The two forms of one pool normalise to equal models."""
    flat_form = pool(
        {
            "nodeSelector": {"accelerator": "nvidia-gpu"},
            "resourceRequests": {"nvidia.com/gpu": "2", "cpu": "1"},
            "maxWorkers": 3,
            "annotations": {"k8s.v1.cni.cncf.io/networks": "gpu-net"},
            "workerImage": IMAGE,
        }
    )
    upstream_form = pool(
        {
            "replicas": 3,
            "workerImage": IMAGE,
            "template": {
                "nodeSelector": {"accelerator": "nvidia-gpu"},
                "annotations": {"k8s.v1.cni.cncf.io/networks": "gpu-net"},
                "resources": {
                    "requests": {"nvidia.com/gpu": 2, "cpu": 1},
                    "limits": {"nvidia.com/gpu": 2},
                },
            },
        }
    )
    assert load_pool(flat_form) == load_pool(upstream_form)


def test_flat_form_limits_only_extended_resources() -> None:
    """resourceRequests implies limits for extended resources, never for cpu or memory."""
    p = load_pool(
        pool({"resourceRequests": {"nvidia.com/gpu": 1, "memory": "1Gi"}, "maxWorkers": 1})
    )
    assert dict(p.requests) == {"nvidia.com/gpu": "1", "memory": "1Gi"}
    assert dict(p.limits) == {"nvidia.com/gpu": "1"}


def test_limit_only_gets_its_request() -> None:
    """An upstream limit without a request shows the request Kubernetes would default."""
    p = load_pool(
        pool({"replicas": 1, "template": {"resources": {"limits": {"nvidia.com/gpu": 4}}}})
    )
    assert (dict(p.effective_requests), p.gpu_count) == ({"nvidia.com/gpu": "4"}, 4)
    assert dict(p.requests) == {}  # as written: replacing the limit leaves no stale request


def test_upstream_fields_are_carried() -> None:
    """Tolerations, labels, priority class, sharing and upstream extras reach the model."""
    p = load_pool(
        pool(
            {
                "replicas": 2,
                "sandboxConfigName": "default",
                "maxActorsPerWorker": 2,
                "runtimeClassName": "nvidia",
                "gpuSharing": {"strategy": "mps", "clientsPerGpu": 4},
                "template": {
                    "labels": {"team": "a"},
                    "priorityClassName": "high",
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                },
            }
        )
    )
    assert p.tolerations == (Toleration(key="nvidia.com/gpu", operator="Exists"),)
    assert p.gpu_sharing == GpuSharing(strategy="mps", clients_per_gpu=4)
    assert (dict(p.labels), p.priority_class_name, p.runtime_class_name) == (
        {"team": "a"},
        "high",
        "nvidia",
    )
    assert (p.sandbox_config_name, p.max_actors_per_worker) == ("default", 2)


def test_model_is_frozen() -> None:
    """A WorkerPool cannot be changed after validation, nor can its maps."""
    p = load_pool(USER_DOC)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.replicas = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.node_selector["x"] = "y"  # type: ignore[index]


def test_cpu_pool_is_not_a_gpu_pool() -> None:
    """A pool without nvidia.com/gpu has no GPUs."""
    assert not WorkerPool(name="p", namespace="d", replicas=1).is_gpu_pool


@pytest.mark.parametrize(
    ("name", "extended"),
    [
        pytest.param("nvidia.com/gpu", True, id="vendor"),
        pytest.param("cpu", False, id="native"),
        pytest.param("hugepages-2Mi", False, id="hugepages"),
        pytest.param("kubernetes.io/something", False, id="kubernetes-domain"),
        pytest.param("requests.nvidia.com/gpu", False, id="quota-name"),
    ],
)
def test_extended_resource_names(name: str, extended: bool) -> None:
    """Extended resources are told apart from native ones as Kubernetes does."""
    assert is_extended_resource(name) is extended


VALID = sorted((Path(__file__).resolve().parents[1] / "data" / "pools" / "valid").glob("*.yaml"))


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_a_pools_document_is_valid_and_gives_the_same_pool(path: Path) -> None:
    """to_document() is a valid upstream-form WorkerPool that normalises back to the pool."""
    for document in read_documents(path):
        original = load_pool(document.content)
        report = validate_document(original.to_document())
        assert (report.errors, report.warnings) == ((), ())
        assert load_pool(original.to_document()) == original


def test_a_pool_built_in_python_is_frozen_whatever_it_was_given() -> None:
    """Plain dicts and lists given to WorkerPool become read-only maps and tuples."""
    labels = {"team": "a"}
    p = WorkerPool(name="p", namespace="d", replicas=1, labels=labels, image_pull_secrets=["s"])
    labels["team"] = "b"
    assert dict(p.labels) == {"team": "a"}
    assert p.image_pull_secrets == ("s",)
    with pytest.raises(TypeError):
        p.labels["x"] = "y"  # type: ignore[index]


def test_a_pool_built_in_python_writes_the_upstream_form() -> None:
    """The document names every field in the upstream form, and leaves defaults out."""
    p = WorkerPool(
        name="gpu",
        namespace="agents",
        replicas=2,
        worker_image=IMAGE,
        limits={"nvidia.com/gpu": "1"},
        node_affinity=NodeAffinity(
            required=(
                NodeSelectorTerm(
                    match_expressions=(NodeSelectorRequirement("zone", "In", ("a",)),)
                ),
            )
        ),
    )
    assert p.to_document() == {
        "apiVersion": "substrate.agent-substrate.github.com/v1alpha1",
        "kind": "WorkerPool",
        "metadata": {"name": "gpu", "namespace": "agents"},
        "spec": {
            "replicas": 2,
            "sandboxClass": "gvisor",
            "workerImage": IMAGE,
            "template": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            }
                        ]
                    }
                },
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
            },
        },
    }
