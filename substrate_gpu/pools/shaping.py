"""Render a pool's worker Deployment, and shape it for GPUs.

Pure functions: a :class:`~.model.WorkerPool` and the controller's environment (an explicit
mapping, never ``os.environ`` read from in here) in, a Kubernetes object (plain dicts) out.

The worker image is the pool's ``workerImage`` (or its deprecated ``ateomImage``), else the
controller's ``ATE_DEFAULT_WORKER_IMAGE``, else the built-in default of the pools whose
worker is this project's agent (GPU pools on gVisor): ``substrate-gpu:<this version>``, the
image the Dockerfile builds, versioned with the controller so the two never drift. Other
pools have no built-in default: their worker is someone else's (upstream's ateom for a CPU
pool, a micro-VM worker), and guessing it would start workers no node agent can drive.

:func:`render_worker_deployment` builds the shape every pool gets, then
:func:`maybe_shape_for_gpu` adds what a GPU gVisor pool needs and nothing else:

- the GPU count on the worker runtime container, request equal to limit;
- the host's NVIDIA Container Toolkit (``ATE_NVIDIA_TOOLKIT_HOST_PATH``, default
  ``/usr/local/nvidia/toolkit``) as a read-only hostPath at ``/opt/nvidia-toolkit``.
  It must sit outside ``/usr/local/nvidia``, which the device plugin mounts read-only
  into the container: a mount nested in it would fail;
- ``ATE_NVIDIA_DRIVER_ROOT`` forwarded to the worker when the controller has it set;
- the agent as that container's process, with its state on the node, its socket, metrics
  port, probes, a drain that fits the grace period, and the GPU nodes' taint tolerated
  (:mod:`.worker_agent`).

The shape every pool gets is the pool's own (image, resources, scheduling, labels and
annotations) plus what upstream's controller gives every worker pod whatever it runs
(:mod:`.worker_pod`): the container ``worker``, upstream's security context for the sandbox
class, root, the downward-API env, a 3600 s grace, a no-surge rolling update and the
sandbox-class toleration. A CPU or micro-VM worker is upstream's, so it keeps upstream's
posture too; what it is told to run (its flags, volumes, ports) is upstream's controller's
business, not rendered here: its container runs the image's own command.

Posture, on purpose: upstream's unprivileged worker, capabilities named one by one, never
privileged mode, a user namespace (``hostUsers: false``) or a ``procMount`` change
(:mod:`.worker_pod` says why each). GPU shaping adds no privilege: a GPU worker keeps the
posture of any other gVisor worker, and a pool without GPUs renders exactly as it would
without this module's GPU step (tests compare the two renderings).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass

from substrate_gpu import _defaults, _version
from substrate_gpu.exceptions import ConfigError
from substrate_gpu.pools import model, worker_agent, worker_pod

__all__ = [
    "AGENT_IMAGE_REPOSITORY",
    "DEFAULT_TOOLKIT_HOST_PATH",
    "DRIVER_ROOT_ENV",
    "TOOLKIT_CONTAINER_PATH",
    "TOOLKIT_HOST_PATH_ENV",
    "TOOLKIT_VOLUME",
    "WORKER_CONTAINER",
    "WORKER_IMAGE_ENV",
    "ControllerSettings",
    "MissingWorkerImageError",
    "agent_image",
    "builtin_worker_image",
    "maybe_shape_for_gpu",
    "render_worker_deployment",
    "runs_agent",
    "worker_image",
]

TOOLKIT_HOST_PATH_ENV = _defaults.TOOLKIT_HOST_PATH_ENV
DEFAULT_TOOLKIT_HOST_PATH = "/usr/local/nvidia/toolkit"
TOOLKIT_CONTAINER_PATH = str(_defaults.TOOLKIT_DIR)
TOOLKIT_VOLUME = "nvidia-toolkit"
DRIVER_ROOT_ENV = _defaults.DRIVER_ROOT_ENV
WORKER_IMAGE_ENV = _defaults.WORKER_IMAGE_ENV
"""Controller setting: the worker image for pools without ``spec.workerImage``."""
LEGACY_WORKER_IMAGE_ENV = _defaults.LEGACY_WORKER_IMAGE_ENV
"""The former name of :data:`WORKER_IMAGE_ENV`, read when it is unset."""
AGENT_IMAGE_REPOSITORY = "substrate-gpu"
"""The name this project's image is built and tagged with (``docker build -t
substrate-gpu:<version> .``): the controller's image, and GPU workers' by default."""
WORKER_CONTAINER = worker_pod.CONTAINER
"""Name of the worker runtime container (the one that gets the GPUs): upstream's ``worker``."""


class MissingWorkerImageError(ConfigError):
    """A pool names no worker image and the controller has no default one."""


@dataclass(frozen=True)
class ControllerSettings:
    """What the controller's environment decides about worker pods."""

    toolkit_host_path: str = DEFAULT_TOOLKIT_HOST_PATH
    """Host directory of the NVIDIA Container Toolkit."""
    driver_root: str | None = None
    """``ATE_NVIDIA_DRIVER_ROOT`` to forward to GPU workers; ``None`` when unset."""
    default_image: str | None = None
    """Worker image for pools that name none (before the built-in default)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ControllerSettings:
        """Read the settings from an environment mapping (empty values count as unset)."""
        return cls(
            toolkit_host_path=env.get(TOOLKIT_HOST_PATH_ENV) or DEFAULT_TOOLKIT_HOST_PATH,
            driver_root=env.get(DRIVER_ROOT_ENV) or None,
            default_image=env.get(WORKER_IMAGE_ENV) or env.get(LEGACY_WORKER_IMAGE_ENV) or None,
        )


def agent_image() -> str:
    """``substrate-gpu:<this package's version>``."""
    return f"{AGENT_IMAGE_REPOSITORY}:{_version.VERSION}"


def runs_agent(pool: model.WorkerPool) -> bool:
    """Whether the pool's worker container runs this project's agent: a GPU gVisor pool."""
    return (
        pool.is_gpu_pool
        and pool.sandbox_class in model.GPU_RESOURCES[model.GPU_RESOURCE].sandbox_classes
    )


def builtin_worker_image(pool: model.WorkerPool) -> str | None:
    """The image a pool gets when neither it nor the controller names one (module docstring)."""
    return agent_image() if runs_agent(pool) else None


def worker_image(pool: model.WorkerPool, settings: ControllerSettings) -> str | None:
    """The pool's worker image: its own, else the controller's default, else the built-in."""
    return pool.worker_image or settings.default_image or builtin_worker_image(pool)


def _pool_labels(pool: model.WorkerPool) -> dict[str, str]:
    return {model.POOL_LABEL: pool.name, model.UPSTREAM_POOL_LABEL: pool.name}


def render_worker_deployment(
    pool: model.WorkerPool,
    settings: ControllerSettings,
    *,
    gpu_shaping: bool = True,
) -> dict[str, object]:
    """The worker Deployment of ``pool``; ``gpu_shaping=False`` renders it without the GPU step."""
    image = worker_image(pool, settings)
    if image is None:
        raise MissingWorkerImageError(
            f"while rendering WorkerPool {pool.namespace}/{pool.name}: it has no "
            f"spec.workerImage and the controller has no {WORKER_IMAGE_ENV}; only GPU pools on "
            "gVisor, whose worker is this project's agent, have a built-in default: set "
            "one of them"
        )
    labels = _pool_labels(pool)
    # Extended resources are GPU shaping's business; native ones are the base shape.
    requests = {k: v for k, v in pool.requests.items() if k != model.GPU_RESOURCE}
    limits = {k: v for k, v in pool.limits.items() if k != model.GPU_RESOURCE}
    container: dict[str, object] = {"name": WORKER_CONTAINER, "image": image}
    resources: dict[str, object] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    if resources:
        container["resources"] = resources
    container["env"] = worker_pod.downward_env()
    container["securityContext"] = worker_pod.container_security_context(pool.sandbox_class)
    pod_spec: dict[str, object] = {
        "securityContext": worker_pod.pod_security_context(),
        "containers": [container],
    }
    if pool.runtime_class_name:
        pod_spec["runtimeClassName"] = pool.runtime_class_name
    if pool.node_selector:
        pod_spec["nodeSelector"] = dict(pool.node_selector)
    tolerations: list[object] = [t.to_dict() for t in pool.tolerations]
    class_toleration = worker_pod.sandbox_class_toleration(pool.sandbox_class)
    if class_toleration not in tolerations:
        tolerations.append(class_toleration)
    pod_spec["tolerations"] = tolerations
    if pool.priority_class_name:
        pod_spec["priorityClassName"] = pool.priority_class_name
    if pool.node_affinity is not None:
        pod_spec["affinity"] = {"nodeAffinity": dict(pool.node_affinity.to_dict())}
    if pool.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in pool.image_pull_secrets]
    pod_spec["terminationGracePeriodSeconds"] = worker_pod.TERMINATION_GRACE_S
    pod_metadata: dict[str, object] = {"labels": {**pool.labels, **labels}}
    if pool.annotations:
        pod_metadata["annotations"] = dict(pool.annotations)
    deployment: dict[str, object] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": f"{pool.name}-workers",
            "namespace": pool.namespace,
            "labels": {**labels, "app.kubernetes.io/managed-by": "substrate-gpu"},
        },
        "spec": {
            "replicas": pool.replicas,
            "strategy": worker_pod.rollout_strategy(),
            "progressDeadlineSeconds": worker_pod.PROGRESS_DEADLINE_S,
            # One key only: a selector is immutable, and upstream selects on this one.
            "selector": {"matchLabels": {model.UPSTREAM_POOL_LABEL: pool.name}},
            "template": {"metadata": pod_metadata, "spec": pod_spec},
        },
    }
    if gpu_shaping:
        deployment = maybe_shape_for_gpu(deployment, pool, settings)
    return deployment


def maybe_shape_for_gpu(
    deployment: Mapping[str, object],
    pool: model.WorkerPool,
    settings: ControllerSettings,
) -> dict[str, object]:
    """A copy of ``deployment`` with the GPU shape added; unchanged unless a GPU gVisor pool."""
    shaped = copy.deepcopy(dict(deployment))
    if not runs_agent(pool):
        return shaped
    spec = _child(shaped, "spec")
    pod_spec = _child(_child(spec, "template"), "spec")
    container = _worker_container(pod_spec)
    count = str(pool.gpu_count)
    resources = _child(container, "resources")
    _child(resources, "requests")[model.GPU_RESOURCE] = count
    _child(resources, "limits")[model.GPU_RESOURCE] = count
    volumes = pod_spec.setdefault("volumes", [])
    assert isinstance(volumes, list)
    volumes.append(
        {
            "name": TOOLKIT_VOLUME,
            "hostPath": {"path": settings.toolkit_host_path, "type": "Directory"},
        }
    )
    mounts = container.setdefault("volumeMounts", [])
    assert isinstance(mounts, list)
    mounts.append({"name": TOOLKIT_VOLUME, "mountPath": TOOLKIT_CONTAINER_PATH, "readOnly": True})
    if settings.driver_root is not None:
        env = container.setdefault("env", [])
        assert isinstance(env, list)
        env.append({"name": DRIVER_ROOT_ENV, "value": settings.driver_root})
    worker_agent.run_agent_in(container, pod_spec)
    return shaped


def _child(parent: dict[str, object], key: str) -> dict[str, object]:
    value = parent.setdefault(key, {})
    assert isinstance(value, dict)
    return value


def _worker_container(pod_spec: dict[str, object]) -> dict[str, object]:
    containers = pod_spec.get("containers")
    assert isinstance(containers, list)
    for container in containers:
        if isinstance(container, dict) and container.get("name") == WORKER_CONTAINER:
            return container
    raise AssertionError(f"the worker pod has no {WORKER_CONTAINER} container")
