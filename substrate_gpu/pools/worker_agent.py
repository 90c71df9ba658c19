"""How the agent runs in a GPU worker pod: its command, state, socket, probes and drain.

The device plugin hands a pool's GPUs to one container of the worker pod, ``worker``, and
the toolkit is mounted there: that is where the CDI spec must be generated, the GPUs
injected and runsc run, so that is where ``substrate-gpu agent`` runs — as the container's
own process, not beside another one:

- it sees exactly the pool's allocation (``/dev/nvidiaN`` of the GPUs the device plugin
  gave this pod), never the node's other GPUs;
- the kubelet's SIGTERM, probes and restarts act on the agent itself: a hung agent is
  restarted by its liveness probe, and SIGTERM starts its drain directly (a supervisor
  between them would have to forward both);
- the command is explicit (``substrate-gpu agent …``), so neither the image's
  entrypoint nor its default command (the demo, in an old image) decides what runs.

State that must outlive the container lives on the node (hostPath), so a restarted
container resumes from its event log and restores suspended actors from their checkpoints:

- ``/var/lib/substrate-gpu/workers/<namespace>/<pool>/<pod>`` on the host, mounted at
  ``/var/lib/substrate-gpu``: the event log and the checkpoint root. Keyed by pod name
  through the downward API and ``subPathExpr``: two workers never share a log (the agent
  locks it), and a pod's directory stays on the node after the pod is gone, for the actor
  tooling to restore from and then remove;
- ``/var/lib/substrate-gpu/workers/<namespace>/<pool>`` again, read-only, at
  ``/var/lib/substrate-gpu-pool``: the checkpoints of the pool's earlier workers on this
  node, which a new worker restores from (``restore_requested`` with ``image_path``) when
  the pod that took them was replaced. Nothing of another pool is visible;
- ``/run/substrate-gpu/workers/<pod uid>`` on the host, mounted at ``/run/substrate-gpu``:
  the agent's Unix socket, reachable by the node's lifecycle driver (a process on the host
  or a container mounting the same path). Keyed by the pod's uid, not its name, because
  a Unix socket path is limited to 107 bytes: ``/run/substrate-gpu/workers/<36>/agent.sock``
  is 74;
- ``/var/lib/ate`` on the host, at the same path (upstream's ``nodepath.BasePath``, which
  atelet and every worker pod mount alike), with upstream's ``HostToContainer`` propagation
  (what atelet mounts there after the worker started is seen in it): the worker API socket
  atelet dials,
  ``/var/lib/ate/workers/<pod uid>/worker.sock`` (upstream's ``nodepath.WorkerSocketPath``;
  70 bytes), and the per-actor directories atelet prepares under ``/var/lib/ate/actors``
  (bundles, checkpoint and restore directories) that the worker API's calls name. The agent
  serves ``ateworker.Worker`` there (``--worker-socket``, docs/worker-api.md), and reports
  its capacity to atelet on ``/var/lib/ate/worker-support.sock`` beside it.

What that report needs, given as upstream's controller gives its worker
(``workerpool_apply.go`` at 533900d; docs/worker-api.md, "Registering with atelet"):

- ``atunnel-identity``, a projected volume at ``/run/podidentity.podcert.ate.dev``: the pod's
  own certificate (a ``podCertificate`` of the Pod identity signer, ECDSA P-256, written as
  ``credential-bundle.pem``) and that signer's trust bundle (``clusterTrustBundle``, the
  ``podcert.ate.dev/canarying: live`` bundles, as ``trust-bundle.pem``), named to the agent
  by ``--atunnel-credential-bundle`` and ``--atunnel-trust-bundle``;
- ``worker-capacity``, a downward-API volume at ``/run/worker-capacity``: the container's
  own ``limits.cpu`` in millicores (``cpu_milli``) and ``limits.memory`` in bytes
  (``memory_bytes``), which the agent reports.

``--max-actors`` is left at its default, as upstream's controller leaves it (the pool's
``maxActorsPerWorker`` is the control plane's placement bound), and so is atelet's SPIFFE ID
(the canonical install's).

Every actor has a network, as every actor of upstream's gVisor worker has one: its
``hostActor`` gives each a veth network whatever the pool or template says, and neither
upstream's WorkerPool nor its ActorTemplate (533900d) has a field that asks for one or turns
it off. So the agent runs every sandbox on the worker pod's network namespace
(``--sandbox-network pod``: runsc ``--network=host``), the one network of upstream's design a
worker can give without per-actor namespaces, and waits for wakeup probes there as
upstream's Run and Restore do (docs/worker-api.md, "The actor's network").

Metrics, ``/healthz`` and ``/readyz`` are served on the agent's port (9477), on every
address (the kubelet probes the pod's IP).

SIGTERM fits the pod's grace (upstream's 3600 s, :data:`.worker_pod.TERMINATION_GRACE_S`),
in the agent's two steps, each passed explicitly so they cannot drift from the grace:
``--workload-grace`` 1800 s, upstream's ``workloadGracePeriod`` (checkpoints in flight finish,
then every app container gets SIGTERM and, at that deadline, SIGKILL and 5 s more), then
``--drain-timeout``, what is left of the grace but a margin: effects still running (a JSON
door's suspend, a Run let go on) finish, and the event log is closed before the kubelet's
SIGKILL. Upstream's comment says why the worker's own deadline sits well inside the grace:
the escalation to SIGKILL happens in the worker, container by container, not to the worker.

Posture: nothing here adds privileges or capabilities: the pod's security context is every
worker's (:mod:`.worker_pod`). The hostPath volumes are plain directories, like the
toolkit's; a GPU worker keeps the posture of any other gVisor worker.
"""

from __future__ import annotations

from typing import Final

from substrate_gpu import _defaults
from substrate_gpu.pools import model, worker_pod

__all__ = [
    "AGENT_ARGS",
    "AGENT_COMMAND",
    "ATE_BASE_PATH",
    "ATE_VOLUME",
    "CAPACITY_VOLUME",
    "CHECKPOINT_ROOT",
    "DRAIN_TIMEOUT_S",
    "EVENT_LOG",
    "GPU_TOLERATION",
    "IDENTITY_SIGNER",
    "IDENTITY_VOLUME",
    "METRICS_PORT",
    "METRICS_PORT_NAME",
    "POOL_STATE_MOUNT_PATH",
    "SANDBOX_NETWORK",
    "SOCKET",
    "SOCKET_HOST_PATH",
    "SOCKET_MOUNT_PATH",
    "SOCKET_VOLUME",
    "STATE_HOST_PATH",
    "STATE_MOUNT_PATH",
    "STATE_VOLUME",
    "WORKER_SOCKET",
    "WORKLOAD_GRACE_S",
    "run_agent_in",
]

STATE_VOLUME: Final = "substrate-gpu-state"
STATE_HOST_PATH: Final = "/var/lib/substrate-gpu/workers"
STATE_MOUNT_PATH: Final = "/var/lib/substrate-gpu"
POOL_STATE_MOUNT_PATH: Final = "/var/lib/substrate-gpu-pool"
SOCKET_VOLUME: Final = "substrate-gpu-socket"
SOCKET_HOST_PATH: Final = "/run/substrate-gpu/workers"
SOCKET_MOUNT_PATH: Final = "/run/substrate-gpu"

ATE_VOLUME: Final = "ate-base"
ATE_BASE_PATH: Final = "/var/lib/ate"
"""Upstream's ``nodepath.BasePath`` at 533900d: mounted at the same path in atelet and workers."""

IDENTITY_VOLUME: Final = "atunnel-identity"
IDENTITY_SIGNER: Final = "podidentity.podcert.ate.dev/identity"
"""The Pod identity signer of upstream's install: it issues the pod certificates atelet trusts."""
CAPACITY_VOLUME: Final = "worker-capacity"

EVENT_LOG: Final = f"{STATE_MOUNT_PATH}/events.jsonl"
CHECKPOINT_ROOT: Final = f"{STATE_MOUNT_PATH}/checkpoints"
SOCKET: Final = f"{SOCKET_MOUNT_PATH}/agent.sock"
_POD_UID: Final = worker_pod.POD_UID_ENV
WORKER_SOCKET: Final = f"{ATE_BASE_PATH}/workers/$({_POD_UID})/worker.sock"
"""Where atelet dials the worker API (``nodepath.WorkerSocketPath(podUID)``); the kubelet
expands ``$(POD_UID)`` (the downward API's ``metadata.uid``) in the args, as upstream's
controller passes ``--pod-uid=$(POD_UID)``."""

SANDBOX_NETWORK: Final = "pod"
"""``--sandbox-network``: every actor on the worker pod's network (see the module docstring)."""

METRICS_PORT: Final = _defaults.METRICS_PORT
METRICS_PORT_NAME: Final = "metrics"
WORKLOAD_GRACE_S: Final = 1800
"""``--workload-grace``: upstream's ``workloadGracePeriod`` (30 minutes), the worker API's one
deadline for calls in flight and then for the app containers' SIGTERM, before SIGKILL."""
_KILL_WAIT_S: Final = 5
"""After the SIGKILLs, how long the worker API waits for the containers to go (upstream's
``containerKillTimeout``, ``service.worker_shutdown.KILL_TIMEOUT``: the pools package sits below
the service, so the test that the shutdown fits the grace adds the service's own)."""
_CLOSE_MARGIN_S: Final = 15
"""Closing the event log, the sockets and the metrics server, with room to spare."""
DRAIN_TIMEOUT_S: Final = (
    worker_pod.TERMINATION_GRACE_S - WORKLOAD_GRACE_S - _KILL_WAIT_S - _CLOSE_MARGIN_S
)
"""``--drain-timeout``: what the grace leaves after the worker API's shutdown (1780 s)."""

GPU_TOLERATION: Final = {"key": model.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
"""GPU node pools are tainted ``nvidia.com/gpu:NoSchedule`` (GKE, the GPU Operator): the
agent must land there, whether or not the cluster's ExtendedResourceToleration adds it."""

# Downward API values the args and subPathExprs expand (they must be the container's env):
# upstream's three, which every worker has (.worker_pod), and the pod's name, added here.
_POD_NAME: Final = "POD_NAME"
_POD_NAMESPACE: Final = worker_pod.POD_NAMESPACE_ENV
_POOL: Final = worker_pod.WORKER_POOL_ENV

AGENT_COMMAND: Final = ("substrate-gpu",)
AGENT_ARGS: Final = (
    "agent",
    "--socket",
    SOCKET,
    "--worker-socket",
    WORKER_SOCKET,
    "--sandbox-network",
    SANDBOX_NETWORK,
    "--event-log",
    EVENT_LOG,
    "--checkpoint-root",
    CHECKPOINT_ROOT,
    "--toolkit-dir",
    str(_defaults.TOOLKIT_DIR),
    "--metrics-host",
    "0.0.0.0",  # noqa: S104  (the kubelet probes the pod's IP; see the module docstring)
    "--metrics-port",
    str(METRICS_PORT),
    "--workload-grace",
    str(WORKLOAD_GRACE_S),
    "--drain-timeout",
    str(DRAIN_TIMEOUT_S),
    f"--atunnel-credential-bundle={_defaults.CREDENTIAL_BUNDLE}",
    f"--atunnel-trust-bundle={_defaults.TRUST_BUNDLE}",
)
"""``substrate-gpu`` arguments of the agent in a GPU worker. Logs are JSON lines (stderr is
no terminal); ``--driver-root`` comes from ``ATE_NVIDIA_DRIVER_ROOT`` when the controller
forwards it."""


def run_agent_in(container: dict[str, object], pod_spec: dict[str, object]) -> None:
    """Make ``container`` (the GPU container of ``pod_spec``) run the agent, in place."""
    container["command"] = list(AGENT_COMMAND)
    container["args"] = list(AGENT_ARGS)
    _list(container, "env").append(
        {"name": _POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    )
    _list(container, "ports").append(
        {"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"}
    )
    # Startup covers recovery (replaying the log, asking runsc about interrupted effects)
    # for up to 10 minutes before liveness may restart the agent.
    container["startupProbe"] = _probe("/healthz", period=5, failures=120)
    container["livenessProbe"] = _probe("/healthz", period=10, failures=3)
    container["readinessProbe"] = _probe("/readyz", period=5, failures=2)
    pool_key = f"$({_POD_NAMESPACE})/$({_POOL})"
    _list(container, "volumeMounts").extend(
        [
            {
                "name": STATE_VOLUME,
                "mountPath": STATE_MOUNT_PATH,
                "subPathExpr": f"{pool_key}/$({_POD_NAME})",
            },
            {
                "name": STATE_VOLUME,
                "mountPath": POOL_STATE_MOUNT_PATH,
                "subPathExpr": pool_key,
                "readOnly": True,
            },
            {
                "name": SOCKET_VOLUME,
                "mountPath": SOCKET_MOUNT_PATH,
                "subPathExpr": f"$({_POD_UID})",
            },
            {
                "name": ATE_VOLUME,
                "mountPath": ATE_BASE_PATH,
                "mountPropagation": worker_pod.ATE_MOUNT_PROPAGATION,
            },
            {
                "name": IDENTITY_VOLUME,
                "mountPath": str(_defaults.POD_IDENTITY_DIR),
                "readOnly": True,
            },
            {
                "name": CAPACITY_VOLUME,
                "mountPath": str(_defaults.CAPACITY_DIR),
                "readOnly": True,
            },
        ]
    )
    _list(pod_spec, "volumes").extend(
        [
            {
                "name": STATE_VOLUME,
                "hostPath": {"path": STATE_HOST_PATH, "type": "DirectoryOrCreate"},
            },
            {
                "name": SOCKET_VOLUME,
                "hostPath": {"path": SOCKET_HOST_PATH, "type": "DirectoryOrCreate"},
            },
            {
                "name": ATE_VOLUME,
                "hostPath": {"path": ATE_BASE_PATH, "type": "DirectoryOrCreate"},
            },
            _identity_volume(),
            _capacity_volume(str(container["name"])),
        ]
    )
    tolerations = _list(pod_spec, "tolerations")
    if GPU_TOLERATION not in tolerations:
        tolerations.append(dict(GPU_TOLERATION))


def _identity_volume() -> dict[str, object]:
    """The pod's certificate and its signer's trust bundle, where the agent's flags say."""
    return {
        "name": IDENTITY_VOLUME,
        "projected": {
            "sources": [
                {
                    "podCertificate": {
                        "signerName": IDENTITY_SIGNER,
                        "keyType": "ECDSAP256",
                        "credentialBundlePath": _defaults.CREDENTIAL_BUNDLE.name,
                    }
                },
                {
                    "clusterTrustBundle": {
                        "signerName": IDENTITY_SIGNER,
                        "labelSelector": {"matchLabels": {"podcert.ate.dev/canarying": "live"}},
                        "path": _defaults.TRUST_BUNDLE.name,
                    }
                },
            ]
        },
    }


def _capacity_volume(container: str) -> dict[str, object]:
    """The container's own CPU and memory limits as files. The downward API writes
    ceil(limit / divisor): in millicores, so a fractional CPU is not rounded up to a core."""

    def limit(path: str, resource: str, divisor: str) -> dict[str, object]:
        return {
            "path": path,
            "resourceFieldRef": {
                "containerName": container,
                "resource": resource,
                "divisor": divisor,
            },
        }

    return {
        "name": CAPACITY_VOLUME,
        "downwardAPI": {
            "items": [
                limit(_defaults.CPU_LIMIT_FILE, "limits.cpu", "1m"),
                limit(_defaults.MEMORY_LIMIT_FILE, "limits.memory", "1"),
            ]
        },
    }


def _probe(path: str, *, period: int, failures: int) -> dict[str, object]:
    return {
        "httpGet": {"path": path, "port": METRICS_PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _list(parent: dict[str, object], key: str) -> list[object]:
    value = parent.setdefault(key, [])
    assert isinstance(value, list)
    return value
