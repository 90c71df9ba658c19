"""The worker Deployment and its GPU shape."""

from __future__ import annotations

import json
from importlib import metadata
from typing import Any

import pytest
from pool_cases import IMAGE, pool

from substrate_gpu.exceptions import ConfigError
from substrate_gpu.pools import ControllerSettings, load_pool, render_worker_deployment

SETTINGS = ControllerSettings()
GPU_POOL = load_pool(
    pool(
        {
            "resourceRequests": {"nvidia.com/gpu": "2", "cpu": "1"},
            "maxWorkers": 3,
            "nodeSelector": {"accelerator": "nvidia-gpu"},
            "runtimeClassName": "nvidia",
            "annotations": {"k8s.v1.cni.cncf.io/networks": "gpu-net"},
            "workerImage": IMAGE,
        },
        name="gpu-pool",
    )
)


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def worker(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(deployment)["containers"]
    return container


def test_gpu_count_on_runtime_container_with_request_equal_to_limit() -> None:
    """The worker runtime container requests and is limited to the pool's GPU count."""
    resources = worker(render_worker_deployment(GPU_POOL, SETTINGS))["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == "2"


def toolkit_volume(deployment: dict[str, Any]) -> dict[str, Any]:
    [volume] = [v for v in pod_spec(deployment)["volumes"] if v["name"] == "nvidia-toolkit"]
    return volume


def toolkit_mount(deployment: dict[str, Any]) -> dict[str, Any]:
    [mount] = [m for m in worker(deployment)["volumeMounts"] if m["name"] == "nvidia-toolkit"]
    return mount


def test_toolkit_is_mounted_read_only_from_the_default_host_path() -> None:
    """The host toolkit is a read-only hostPath at /opt/nvidia-toolkit."""
    d = render_worker_deployment(GPU_POOL, SETTINGS)
    assert toolkit_volume(d) == {
        "name": "nvidia-toolkit",
        "hostPath": {"path": "/usr/local/nvidia/toolkit", "type": "Directory"},
    }
    assert toolkit_mount(d) == {
        "name": "nvidia-toolkit",
        "mountPath": "/opt/nvidia-toolkit",
        "readOnly": True,
    }


def test_toolkit_host_path_comes_from_the_controller_env() -> None:
    """ATE_NVIDIA_TOOLKIT_HOST_PATH moves the hostPath, not the mount point."""
    settings = ControllerSettings.from_env({"ATE_NVIDIA_TOOLKIT_HOST_PATH": "/opt/tk"})
    d = render_worker_deployment(GPU_POOL, settings)
    assert toolkit_volume(d)["hostPath"]["path"] == "/opt/tk"
    assert toolkit_mount(d)["mountPath"] == "/opt/nvidia-toolkit"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # Forwarded when the controller has it...
        pytest.param(
            {"ATE_NVIDIA_DRIVER_ROOT": "/home/kubernetes/bin/nvidia"},
            [{"name": "ATE_NVIDIA_DRIVER_ROOT", "value": "/home/kubernetes/bin/nvidia"}],
            id="set",
        ),
        # ...and absent, not empty, when it does not (the agent's default then applies).
        pytest.param({}, None, id="unset"),
        pytest.param({"ATE_NVIDIA_DRIVER_ROOT": ""}, None, id="empty"),
    ],
)
def test_driver_root_is_forwarded_only_when_set(env: dict[str, str], expected: object) -> None:
    """ATE_NVIDIA_DRIVER_ROOT reaches GPU workers exactly when the controller sets it."""
    d = render_worker_deployment(GPU_POOL, ControllerSettings.from_env(env))
    forwarded = [e for e in worker(d)["env"] if e["name"] == "ATE_NVIDIA_DRIVER_ROOT"]
    assert (forwarded or None) == expected


def test_scheduling_and_metadata_are_carried() -> None:
    """nodeSelector, runtimeClassName and annotations reach the worker pods."""
    d = render_worker_deployment(GPU_POOL, SETTINGS)
    spec = pod_spec(d)
    assert (spec["nodeSelector"], spec["runtimeClassName"]) == (
        {"accelerator": "nvidia-gpu"},
        "nvidia",
    )
    assert d["spec"]["template"]["metadata"]["annotations"] == {
        "k8s.v1.cni.cncf.io/networks": "gpu-net"
    }


def test_workers_carry_both_pool_labels() -> None:
    """Workers are labelled substrate.io/worker-pool and ate.dev/worker-pool with the pool."""
    labels = render_worker_deployment(GPU_POOL, SETTINGS)["spec"]["template"]["metadata"]["labels"]
    assert labels == {"substrate.io/worker-pool": "gpu-pool", "ate.dev/worker-pool": "gpu-pool"}


def test_tolerations_are_carried() -> None:
    """template.tolerations reach the worker pods as given."""
    p = load_pool(
        pool(
            {
                "replicas": 1,
                "workerImage": IMAGE,
                "template": {
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ]
                },
            }
        )
    )
    assert pod_spec(render_worker_deployment(p, SETTINGS))["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        # The sandbox class's, added after the pool's own (upstream's order).
        {
            "key": "ate.dev/sandboxClass",
            "operator": "Equal",
            "value": "gvisor",
            "effect": "NoSchedule",
        },
    ]


def test_a_pools_own_sandbox_class_toleration_is_not_doubled() -> None:
    """A pool that already tolerates its class's taint keeps the one toleration."""
    own = {
        "key": "ate.dev/sandboxClass",
        "operator": "Equal",
        "value": "gvisor",
        "effect": "NoSchedule",
    }
    p = load_pool(pool({"replicas": 1, "workerImage": IMAGE, "template": {"tolerations": [own]}}))
    assert pod_spec(render_worker_deployment(p, SETTINGS))["tolerations"] == [own]


@pytest.mark.parametrize("word", ["hostUsers", "procMount", "allowPrivilegeEscalation"])
def test_gpu_worker_asks_for_no_user_namespace_or_proc_change(word: str) -> None:
    """No user namespace, no procMount change, no privilege escalation flag anywhere in a GPU
    worker: upstream's worker sets none of them."""
    assert word not in json.dumps(render_worker_deployment(GPU_POOL, SETTINGS))


def test_gpu_worker_is_never_privileged_and_holds_only_upstreams_capabilities() -> None:
    """``privileged: false`` written out, every capability dropped but upstream's gVisor set."""
    context = worker(render_worker_deployment(GPU_POOL, SETTINGS))["securityContext"]
    assert context["privileged"] is False
    assert context["capabilities"] == {
        "drop": ["ALL"],
        "add": [
            "NET_ADMIN",
            "SYS_ADMIN",
            "SYS_CHROOT",
            "SYS_PTRACE",
            "SETUID",
            "SETGID",
            "SETPCAP",
            "DAC_OVERRIDE",
            "FOWNER",
            "CHOWN",
            "MKNOD",
            "NET_RAW",
            "SETFCAP",
        ],
    }


def test_gpu_shaping_adds_no_privilege() -> None:
    """The security contexts of a GPU worker are those of the same pool rendered without the
    GPU step: GPU shaping changes no posture."""
    plain = render_worker_deployment(GPU_POOL, SETTINGS, gpu_shaping=False)
    shaped = render_worker_deployment(GPU_POOL, SETTINGS)
    assert pod_spec(shaped)["securityContext"] == pod_spec(plain)["securityContext"]
    assert worker(shaped)["securityContext"] == worker(plain)["securityContext"]


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(
            {
                "replicas": 2,
                "template": {"resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}},
            },
            id="cpu-pool",
        ),
        pytest.param(
            {"maxWorkers": 1, "resourceRequests": {"example.com/fpga": 1}},
            id="other-extended-resource",
        ),
        pytest.param({"replicas": 1, "sandboxClass": "microvm"}, id="microvm-pool"),
    ],
)
def test_non_gpu_pool_renders_as_without_the_gpu_feature(spec: dict[str, Any]) -> None:
    """A pool without GPUs renders exactly as with GPU shaping disabled."""
    p = load_pool(pool({**spec, "workerImage": IMAGE}))
    assert render_worker_deployment(p, SETTINGS) == render_worker_deployment(
        p, SETTINGS, gpu_shaping=False
    )


def test_gpu_shaping_only_adds() -> None:
    """GPU shaping adds to a GPU pool's rendering; the rest is the plain rendering."""
    plain = render_worker_deployment(GPU_POOL, SETTINGS, gpu_shaping=False)
    shaped = render_worker_deployment(GPU_POOL, SETTINGS)
    worker(shaped)["resources"]["requests"].pop("nvidia.com/gpu")
    worker(shaped)["resources"]["limits"].pop("nvidia.com/gpu")
    assert not worker(shaped)["resources"]["limits"]
    del worker(shaped)["resources"]["limits"]
    # Appended to what every worker has: the base's env and tolerations come first.
    for parent, key in ((worker(shaped), "env"), (pod_spec(shaped), "tolerations")):
        base = len(worker(plain)[key] if key == "env" else pod_spec(plain)[key])
        del parent[key][base:]
    # The agent as the container's process (tests/pools/test_worker_agent.py).
    for key in ("volumeMounts", "command", "args", "ports"):
        del worker(shaped)[key]
    for key in ("startupProbe", "livenessProbe", "readinessProbe"):
        del worker(shaped)[key]
    del pod_spec(shaped)["volumes"]
    assert shaped == plain


AGENT_IMAGE = f"substrate-gpu:{metadata.version('substrate-gpu')}"
CPU_POOL = load_pool(pool({"replicas": 1, "template": {"resources": {"requests": {"cpu": 1}}}}))
GPU_POOL_WITHOUT_IMAGE = load_pool(
    pool({"maxWorkers": 1, "resourceRequests": {"nvidia.com/gpu": 1}})
)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"ATE_DEFAULT_WORKER_IMAGE": "w:1"}, "w:1", id="controller-default"),
        # The variable's former name is still read...
        pytest.param({"ATE_DEFAULT_ATEOM_IMAGE": "a:1"}, "a:1", id="former-name"),
        # ...and loses to the new one.
        pytest.param(
            {"ATE_DEFAULT_WORKER_IMAGE": "w:1", "ATE_DEFAULT_ATEOM_IMAGE": "a:1"},
            "w:1",
            id="both-names",
        ),
        # Without either, a GPU gVisor pool runs this version's agent image.
        pytest.param({}, AGENT_IMAGE, id="built-in"),
    ],
)
def test_a_gpu_pool_without_an_image_gets_the_controllers_or_the_built_in(
    env: dict[str, str], expected: str
) -> None:
    d = render_worker_deployment(GPU_POOL_WITHOUT_IMAGE, ControllerSettings.from_env(env))
    assert worker(d)["image"] == expected


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(CPU_POOL, id="cpu-pool"),
        pytest.param(
            load_pool(
                pool(
                    {
                        "replicas": 1,
                        "sandboxClass": "microvm",
                        "template": {"resources": {"requests": {"cpu": 1}}},
                    }
                )
            ),
            id="microvm-pool",
        ),
    ],
)
def test_a_pool_whose_worker_is_not_the_agent_has_no_built_in_image(doc: object) -> None:
    """A CPU or micro-VM worker is someone else's image: without one, rendering fails clearly."""
    with pytest.raises(ConfigError, match="ATE_DEFAULT_WORKER_IMAGE"):
        render_worker_deployment(doc, SETTINGS)  # type: ignore[arg-type]
    d = render_worker_deployment(doc, ControllerSettings(default_image="w:1"))  # type: ignore[arg-type]
    assert worker(d)["image"] == "w:1"


def test_the_pools_own_image_wins() -> None:
    assert (
        worker(render_worker_deployment(GPU_POOL, ControllerSettings(default_image="w:1")))["image"]
        == IMAGE
    )


def test_node_affinity_and_pull_secrets_reach_the_pod() -> None:
    """Upstream's template.nodeAffinity is the pod's affinity.nodeAffinity, as written."""
    node_affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
            ]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 5,
                "preference": {
                    "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]
                },
            }
        ],
    }
    p = load_pool(
        pool(
            {
                "replicas": 1,
                "workerImage": IMAGE,
                "template": {
                    "nodeAffinity": node_affinity,
                    "imagePullSecrets": [{"name": "registry"}],
                },
            }
        )
    )
    spec = pod_spec(render_worker_deployment(p, SETTINGS))
    assert spec["affinity"] == {"nodeAffinity": node_affinity}
    assert spec["imagePullSecrets"] == [{"name": "registry"}]


def test_replicas_come_from_max_workers() -> None:
    """maxWorkers sizes the Deployment."""
    assert render_worker_deployment(GPU_POOL, SETTINGS)["spec"]["replicas"] == 3
