"""What every pool's worker pod gets, as upstream's controller gives it: posture, grace, rollout.

Upstream's controller (agent-substrate ``cmd/atecontroller/internal/controllers/
workerpool_apply.go`` at 533900d: ``buildDeploymentApplyConfig``, ``workerSecurityContext``,
``applySandboxClassToleration``) renders every WorkerPool's worker pod alike, whatever its
image runs. This module transcribes the part that does not depend on the worker's own
command line, and :func:`.shaping.render_worker_deployment` gives it to **every** pool, CPU
or GPU, gVisor or micro-VM, as upstream does:

- the worker runtime container is named ``worker`` (its downward-API capacity files name
  it), runs as root, with the sandbox class's capabilities and nothing else, AppArmor and
  seccomp ``Unconfined`` (:func:`container_security_context`);
- the pod runs as root (uid and gid 0);
- ``POD_UID``, ``POD_NAMESPACE`` and ``WORKER_POOL_NAME`` from the downward API;
- ``terminationGracePeriodSeconds`` 3600: a worker drains on SIGTERM (checkpoints in flight
  finish, then the apps get SIGTERM and at a deadline SIGKILL), within it;
- rollout ``RollingUpdate`` with ``maxSurge: 0`` and ``maxUnavailable: 10%`` (at least one
  pod), ``progressDeadlineSeconds`` 4800 (above the grace, with room for the replacement to
  start, so a batch waiting out a drain is not reported a failed rollout). No surge matters
  most for a GPU pool: a surged pod would wait for a GPU no worker has given back yet;
- the toleration ``ate.dev/sandboxClass=<class>:NoSchedule``, beside the pool's own, so a
  cluster that reserves nodes per sandbox class with that taint still places workers.

What the worker's process is told (command, flags, the volumes and ports its flags name) is
rendered only where that process is this project's agent, a GPU pool on gVisor
(:mod:`.worker_agent`). ``/var/lib/ate`` is among those volumes; it is mounted there with
upstream's propagation (:data:`ATE_MOUNT_PROPAGATION`).

**Posture**, on purpose, the same for a GPU worker as for any other gVisor worker (upstream
replaced its former privileged worker with this set): **never** ``privileged`` (``false``
is written out, as upstream writes it), **never** a user namespace (``hostUsers: false``:
runsc's gofer maps its own identity in a user namespace of its own, and a pod-level one
would break per-actor cgroup delegation), **never** ``procMount: Unmasked`` (the one toolkit
hook that would need it, ``update-ldcache``, is replaced by SONAME links the agent stages
itself). ``allowPrivilegeEscalation`` is left unset, as upstream leaves it: Kubernetes
refuses ``false`` beside ``CAP_SYS_ADMIN``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from substrate_gpu.pools import model

__all__ = [
    "ATE_MOUNT_PROPAGATION",
    "CAPABILITIES",
    "CONTAINER",
    "GVISOR_CAPABILITIES",
    "MICROVM_CAPABILITIES",
    "POD_NAMESPACE_ENV",
    "POD_UID_ENV",
    "PROGRESS_DEADLINE_S",
    "ROLLOUT_MAX_SURGE",
    "ROLLOUT_MAX_UNAVAILABLE",
    "SANDBOX_CLASS_TAINT_KEY",
    "TERMINATION_GRACE_S",
    "WORKER_POOL_ENV",
    "container_security_context",
    "downward_env",
    "pod_security_context",
    "rollout_strategy",
    "sandbox_class_toleration",
]

CONTAINER: Final = "worker"
"""The worker runtime container (upstream's name): the one that gets the GPUs."""

TERMINATION_GRACE_S: Final = 3600
"""Upstream's ``workerTerminationGracePeriodSeconds``: 60 minutes for a worker to drain."""

ROLLOUT_MAX_SURGE: Final = 0
ROLLOUT_MAX_UNAVAILABLE: Final = "10%"
PROGRESS_DEADLINE_S: Final = 4800
"""Above :data:`TERMINATION_GRACE_S`, with room for the replacement to start."""

SANDBOX_CLASS_TAINT_KEY: Final = "ate.dev/sandboxClass"
"""The taint a cluster puts on a node pool reserved for one sandbox class (its value)."""

ATE_MOUNT_PROPAGATION: Final = "HostToContainer"
"""Of ``/var/lib/ate``: what atelet mounts there on the host after the worker started is seen
in the worker. Never ``Bidirectional``, which needs a privileged container: the worker's own
mounts (the rootfs overlays) stay in its mount namespace."""

POD_UID_ENV: Final = "POD_UID"
POD_NAMESPACE_ENV: Final = "POD_NAMESPACE"
WORKER_POOL_ENV: Final = "WORKER_POOL_NAME"
_DOWNWARD: Final = (
    (POD_UID_ENV, "metadata.uid"),
    (POD_NAMESPACE_ENV, "metadata.namespace"),
    (WORKER_POOL_ENV, f"metadata.labels['{model.UPSTREAM_POOL_LABEL}']"),
)

GVISOR_CAPABILITIES: Final = (
    # Upstream's reasons, group by group. Actor networking programs the veth and nftables
    # rules (ours programs none, the sandbox being on the pod's network: kept, so that a
    # GPU worker's posture stays any gVisor worker's).
    "NET_ADMIN",
    # The sandbox pivots root and traces the application; the worker mounts the rootfs
    # overlays it composes from atelet's layers.
    "SYS_ADMIN",
    "SYS_CHROOT",
    "SYS_PTRACE",
    # runsc's gofer maps a full-range identity in a user namespace.
    "SETUID",
    "SETGID",
    "SETPCAP",
    # The OCI rootfs is unpacked and device nodes made as root over image-owned trees
    # (ours: the whiteouts, 0:0 char devices, made when atelet's layers are finalised).
    "DAC_OVERRIDE",
    "FOWNER",
    "CHOWN",
    "MKNOD",
    "NET_RAW",
    "SETFCAP",
)
"""Upstream's ``workerGvisorCapabilities``, in its order."""

MICROVM_CAPABILITIES: Final = (*GVISOR_CAPABILITIES, "FSETID", "DAC_READ_SEARCH")
"""Upstream's ``workerMicroVMCapabilities``: the gVisor set plus what virtiofsd re-applies to
its sandboxed child (the kernel refuses to raise a capability the bounding set omits)."""

CAPABILITIES: Final[Mapping[model.SandboxClass, tuple[str, ...]]] = MappingProxyType(
    {"gvisor": GVISOR_CAPABILITIES, "microvm": MICROVM_CAPABILITIES}
)
"""The capabilities each sandbox class's worker is given, all others dropped."""


def container_security_context(sandbox_class: model.SandboxClass) -> dict[str, object]:
    """Upstream's ``workerSecurityContext(class)``: root, not privileged, the class's
    capabilities and no other, AppArmor and seccomp ``Unconfined``.

    AppArmor, because runsc's mounts (and the worker's own) trip the default profile, which
    denies mount (enforced on GKE's COS and Ubuntu; a no-op on nodes that load no AppArmor).
    Seccomp, because runsc's sandbox child pivot_root()s, which ``RuntimeDefault`` denies
    whatever capabilities the worker holds: written out, so the worker does not depend on
    the cluster leaving the profile unset."""
    return {
        "runAsUser": 0,
        "runAsGroup": 0,
        "privileged": False,
        "capabilities": {"drop": ["ALL"], "add": list(CAPABILITIES[sandbox_class])},
        "appArmorProfile": {"type": "Unconfined"},
        "seccompProfile": {"type": "Unconfined"},
    }


def pod_security_context() -> dict[str, object]:
    """The pod runs as root, as upstream's (its container says so too)."""
    return {"runAsUser": 0, "runAsGroup": 0}


def downward_env() -> list[dict[str, object]]:
    """``POD_UID``, ``POD_NAMESPACE``, ``WORKER_POOL_NAME``: upstream's worker env, its order."""
    return [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}} for name, path in _DOWNWARD
    ]


def rollout_strategy() -> dict[str, object]:
    """``RollingUpdate``: at most 10 % of the workers (at least one) at a time, no surge."""
    return {
        "type": "RollingUpdate",
        "rollingUpdate": {
            "maxSurge": ROLLOUT_MAX_SURGE,
            "maxUnavailable": ROLLOUT_MAX_UNAVAILABLE,
        },
    }


def sandbox_class_toleration(sandbox_class: model.SandboxClass) -> dict[str, object]:
    """``ate.dev/sandboxClass=<class>:NoSchedule``, tolerated."""
    return {
        "key": SANDBOX_CLASS_TAINT_KEY,
        "operator": "Equal",
        "value": sandbox_class,
        "effect": "NoSchedule",
    }
