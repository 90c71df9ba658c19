"""What every pool's worker pod gets, as upstream's controller at 533900d gives it."""

from __future__ import annotations

from typing import Any, get_args

import pytest
from pool_cases import IMAGE, pool

from substrate_gpu.pools import ControllerSettings, load_pool, model, render_worker_deployment
from substrate_gpu.pools import worker_pod as wp

SETTINGS = ControllerSettings(default_image=IMAGE)
CPU = {"replicas": 2, "template": {"resources": {"requests": {"cpu": "1"}}}}
GPU = {"maxWorkers": 2, "resourceRequests": {"nvidia.com/gpu": "1"}}
MICROVM = {"replicas": 1, "sandboxClass": "microvm"}

# Upstream's workerGvisorCapabilities, copied here by hand from workerpool_apply.go at 533900d:
# the table a test of the module is checked against, not the module's own constant.
UPSTREAM_GVISOR = [
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
]

POOLS = [
    pytest.param(CPU, "gvisor", UPSTREAM_GVISOR, id="cpu-gvisor"),
    pytest.param(GPU, "gvisor", UPSTREAM_GVISOR, id="gpu-gvisor"),
    # Upstream's workerMicroVMCapabilities: the gVisor set plus virtiofsd's two.
    pytest.param(MICROVM, "microvm", [*UPSTREAM_GVISOR, "FSETID", "DAC_READ_SEARCH"], id="microvm"),
]


def render(spec: dict[str, Any]) -> dict[str, Any]:
    return render_worker_deployment(load_pool(pool(spec)), SETTINGS)


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def the_worker(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(deployment)["containers"]
    return container


@pytest.mark.parametrize(("spec", "sandbox_class", "capabilities"), POOLS)
def test_the_worker_container_has_upstreams_security_context_for_its_class(
    spec: dict[str, Any], sandbox_class: str, capabilities: list[str]
) -> None:
    """Root, never privileged, every capability dropped but the class's, AppArmor and seccomp
    Unconfined (runsc's mounts and pivot_root), as upstream's ``workerSecurityContext``."""
    assert the_worker(render(spec))["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 0,
        "privileged": False,
        "capabilities": {"drop": ["ALL"], "add": capabilities},
        "appArmorProfile": {"type": "Unconfined"},
        "seccompProfile": {"type": "Unconfined"},
    }


@pytest.mark.parametrize(("spec", "sandbox_class", "capabilities"), POOLS)
def test_every_worker_pod_has_upstreams_pod_shape(
    spec: dict[str, Any], sandbox_class: str, capabilities: list[str]
) -> None:
    """Container ``worker``, the pod as root, a 3600 s grace, the sandbox class's toleration,
    upstream's downward-API env."""
    d = render(spec)
    pod = pod_spec(d)
    assert the_worker(d)["name"] == "worker"
    assert pod["securityContext"] == {"runAsUser": 0, "runAsGroup": 0}
    assert pod["terminationGracePeriodSeconds"] == 3600
    assert {
        "key": "ate.dev/sandboxClass",
        "operator": "Equal",
        "value": sandbox_class,
        "effect": "NoSchedule",
    } in pod["tolerations"]
    env = {
        e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        for e in the_worker(d)["env"]
    }
    assert {k: env[k] for k in ("POD_UID", "POD_NAMESPACE", "WORKER_POOL_NAME")} == {
        "POD_UID": "metadata.uid",
        "POD_NAMESPACE": "metadata.namespace",
        "WORKER_POOL_NAME": "metadata.labels['ate.dev/worker-pool']",
    }


@pytest.mark.parametrize(("spec", "sandbox_class", "capabilities"), POOLS)
def test_workers_roll_without_surge_within_a_deadline_above_the_grace(
    spec: dict[str, Any], sandbox_class: str, capabilities: list[str]
) -> None:
    """One batch of at most 10 % (at least one pod) at a time and no surge (a GPU pool has no
    spare GPU for a surged pod); a rollout waiting out a 3600 s drain is not failed."""
    d = render(spec)
    assert d["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "10%"},
    }
    assert d["spec"]["progressDeadlineSeconds"] == 4800
    assert d["spec"]["progressDeadlineSeconds"] > pod_spec(d)["terminationGracePeriodSeconds"]


def test_every_sandbox_class_has_a_capability_set() -> None:
    """A class the model accepts always renders (a new class must be given its set here)."""
    assert set(wp.CAPABILITIES) == set(get_args(model.SandboxClass))


def test_no_class_is_given_a_capability_upstream_never_gives() -> None:
    """Neither set holds ``ALL`` or a capability outside upstream's two lists."""
    upstream = {*UPSTREAM_GVISOR, "FSETID", "DAC_READ_SEARCH"}
    for capabilities in wp.CAPABILITIES.values():
        assert set(capabilities) <= upstream
        assert len(set(capabilities)) == len(capabilities)
