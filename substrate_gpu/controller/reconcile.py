"""What the controller wants for one WorkerPool: pure functions, plain data in and out.

:func:`plan` turns a pool object (as the API server returns it) into either an
:class:`Apply` (the worker Deployment, owned by the pool) or a :class:`Reject` (a reason
and a message for the pool's status). :func:`pool_status` turns that outcome into the
``status`` the user reads with ``kubectl get workerpool -o yaml``.

Two kinds of rejection reach the controller although the CRD's CEL rules exist:

- ``InvalidSpec``: the pool fails the Python validator. The API server refuses such pools
  at admission when our CRD is installed; the controller checks again because an older
  CRD (or a pool stored before a rule existed) can still hold one.
- ``NoWorkerImage``: the pool is valid but names no ``spec.workerImage``, the controller
  has no ``ATE_DEFAULT_WORKER_IMAGE``, and the pool is not one with a built-in default (a
  GPU pool on gVisor): nothing to run, so nothing is rendered.

The validator's warnings (a deprecated ``ateomImage``, a distroless GPU image) do not stop
a pool: they are appended to its ``Ready`` message, where ``kubectl get -o yaml`` shows them.

A third, ``DeploymentRefused``, is set by the controller when the API server refuses the
rendered Deployment itself (a 4xx other than a conflict): retrying would not help.

A rejected pool keeps whatever Deployment it had: taking running workers away because the
controller's environment lost a setting would turn a configuration slip into an outage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, cast

from substrate_gpu.pools import model, shaping, validation

__all__ = [
    "FIELD_MANAGER",
    "READY",
    "REJECTED",
    "Apply",
    "Plan",
    "Reject",
    "deployment_name",
    "owner_reference",
    "plan",
    "pool_status",
]

FIELD_MANAGER = "substrate-gpu-controller"
"""Server-side apply field manager of everything the controller writes."""
READY = "Ready"
"""Condition: the pool's worker Deployment matches the pool's current generation."""
REJECTED = "Rejected"
"""Condition: the controller refuses the pool (``reason`` says why, ``message`` what to do)."""


@dataclass(frozen=True)
class Apply:
    """The pool is fine: server-side apply this Deployment."""

    deployment: Mapping[str, object]
    """The worker Deployment, owner reference included."""
    replicas: int
    """Workers the Deployment asks for."""
    warnings: tuple[str, ...] = ()
    """The validator's warnings about the pool (``PATH: MESSAGE``), for its status."""


@dataclass(frozen=True)
class Reject:
    """The pool cannot be turned into workers."""

    reason: Literal["InvalidSpec", "NoWorkerImage", "DeploymentRefused"]
    """CamelCase reason of the ``Rejected`` condition."""
    message: str
    """What is wrong and what to do about it."""


Plan = Apply | Reject


def deployment_name(pool_name: str) -> str:
    """The worker Deployment's name: fixed per pool, so a retried create can never duplicate."""
    return f"{pool_name}-workers"


def owner_reference(body: Mapping[str, object]) -> dict[str, object]:
    """The controller owner reference that ties a Deployment to its pool (and to its GC)."""
    metadata = _mapping(body.get("metadata"))
    return {
        "apiVersion": model.API_VERSION,
        "kind": model.KIND,
        "name": str(metadata.get("name", "")),
        "uid": str(metadata.get("uid", "")),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def plan(body: Mapping[str, object], settings: shaping.ControllerSettings) -> Plan:
    """What to do for the pool ``body`` (a WorkerPool object read from the API server)."""
    document = {key: body[key] for key in ("apiVersion", "kind", "metadata", "spec") if key in body}
    report = validation.validate_document(document)
    if report.errors:
        details = "; ".join(str(p) for p in report.errors)
        return Reject("InvalidSpec", f"the pool is invalid: {details}")
    pool = model.pool_from_document(document)
    try:
        deployment = shaping.render_worker_deployment(pool, settings)
    except shaping.MissingWorkerImageError as e:
        return Reject("NoWorkerImage", str(e))
    metadata = _mapping(deployment["metadata"])
    deployment["metadata"] = {**metadata, "ownerReferences": [owner_reference(body)]}
    return Apply(deployment, pool.replicas, tuple(str(w) for w in report.warnings))


def pool_status(
    outcome: Plan,
    *,
    generation: int,
    previous: Sequence[Mapping[str, object]],
    now: str,
) -> dict[str, object]:
    """The pool's ``status`` after ``outcome`` was carried out.

    ``previous`` is the current ``status.conditions``: a condition whose status did not
    change keeps its ``lastTransitionTime`` (the Kubernetes convention), so the time says
    when the pool became Ready or Rejected, not when it was last looked at.
    """
    if isinstance(outcome, Apply):
        message = "the worker Deployment is up to date"
        if outcome.warnings:
            message += "; warning: " + "; warning: ".join(outcome.warnings)
        ready = _condition(READY, "True", "Reconciled", message)
        rejected = _condition(REJECTED, "False", "Accepted", "the pool is valid and renderable")
    else:
        ready = _condition(READY, "False", outcome.reason, outcome.message)
        rejected = _condition(REJECTED, "True", outcome.reason, outcome.message)
    before = {str(c.get("type")): c for c in previous}
    conditions = []
    for condition in (ready, rejected):
        old = before.get(str(condition["type"]))
        changed = old is None or old.get("status") != condition["status"]
        since = now if changed or old is None else str(old.get("lastTransitionTime", now))
        conditions.append(
            {**condition, "lastTransitionTime": since, "observedGeneration": generation}
        )
    status: dict[str, object] = {"observedGeneration": generation, "conditions": conditions}
    if isinstance(outcome, Apply):
        status["replicas"] = outcome.replicas
        status["deployment"] = str(_mapping(outcome.deployment["metadata"])["name"])
    return status


def _condition(kind: str, status: str, reason: str, message: str) -> dict[str, object]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def _mapping(raw: object) -> dict[str, object]:
    return dict(cast("Mapping[str, object]", raw)) if isinstance(raw, Mapping) else {}
