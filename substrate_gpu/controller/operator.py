"""The WorkerPool controller: kopf handlers that turn pools into worker Deployments.

Why kopf: it is the maintained Python operator framework, and it already does what a
hand-written controller would get wrong first: list-then-watch with reconnects (the API
server restarting is a reconnect, not a crash), a per-object queue so one pool is never
reconciled twice at once, retries with back-off, finalizers for delete handling, and a
``resume`` cause so every existing pool is reconciled again after the controller restarts.

What a reconcile does (create, update and resume alike): :func:`.reconcile.plan`, then a
server-side apply of the Deployment (:mod:`.kube`), then the pool's status through kopf's
patch (the ``status`` subresource). Everything is idempotent and the Deployment's name is
fixed per pool, so a controller killed mid-reconcile and started again converges on
exactly one Deployment.

Deletes: the Deployment carries a controller owner reference (so Kubernetes' garbage
collector removes it in a real cluster), *and* the controller deletes it itself behind a
finalizer, so a pool's workers go away even where no garbage collector runs.

kopf's bookkeeping lives in annotations under our API group (no ``status.kopf``), and
the controller runs standalone (one replica, no peering objects to install).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kopf

from substrate_gpu._log import get_logger
from substrate_gpu.controller import credentials, kube, reconcile
from substrate_gpu.pools import crd, model, shaping

__all__ = [
    "FINALIZER",
    "ControllerOptions",
    "build_registry",
    "log_reconciled",
    "operator_settings",
    "run_controller",
]

FINALIZER = f"{model.API_GROUP}/worker-deployment"
"""Held on every pool until its worker Deployment is deleted."""

_RESOURCE = (model.API_GROUP, model.API_VERSION.rsplit("/", 1)[1], crd.PLURAL)

_log = get_logger(__name__)


@dataclass(frozen=True)
class ControllerOptions:
    """How the controller runs (the worker pods' shape is :class:`~.shaping.ControllerSettings`)."""

    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty means the whole cluster."""
    retry_delay: float = 5.0
    """Seconds before a failed reconcile (API server away, 5xx, 409) is tried again."""
    liveness_endpoint: str | None = None
    """kopf's health endpoint, e.g. ``http://0.0.0.0:8080/healthz``; ``None`` for none."""
    refusal_grace: float = credentials.REFUSAL_GRACE_S
    """Seconds a 401 or 403 at start may last before the controller gives up (exit 1)."""


def operator_settings(options: ControllerOptions) -> kopf.OperatorSettings:
    """kopf's settings: our finalizer, bookkeeping in our annotations, prompt reconnects."""
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=model.API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=model.API_GROUP, key="last-handled-configuration"
    )
    # The server closes a quiet watch after this long and kopf re-lists; a lost
    # connection (the API server restarting) is retried after the back-offs below.
    settings.watching.server_timeout = 300
    settings.watching.reconnect_backoff = 0.5
    settings.networking.error_backoffs = (0.5, 1, 2, 3, 5)
    settings.networking.request_timeout = 60
    # Watching named namespaces needs no namespace listing (kopf would try it, and without
    # the right to, retry it through every back-off above, ~12 s, before falling back).
    # The CRD is known to exist by then (:func:`.credentials.ensure_access` waits for it).
    settings.scanning.disabled = bool(options.namespaces)
    return settings


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_registry(
    pool_settings: shaping.ControllerSettings, options: ControllerOptions
) -> kopf.OperatorRegistry:
    """A fresh kopf registry with the controller's handlers (no module-level state)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    async def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # Also configures kubernetes_asyncio, which :mod:`.kube` uses for Deployments.
        return await kopf.login_via_async_client(**kwargs)

    @kopf.on.resume(*_RESOURCE, registry=registry, backoff=options.retry_delay)
    @kopf.on.create(*_RESOURCE, registry=registry, backoff=options.retry_delay)
    @kopf.on.update(*_RESOURCE, registry=registry, backoff=options.retry_delay)
    async def reconcile_pool(body: kopf.Body, patch: kopf.Patch, reason: str, **_: Any) -> None:
        outcome = reconcile.plan(body, pool_settings)
        if isinstance(outcome, reconcile.Apply):
            try:
                await kube.apply_deployment(outcome.deployment)
            except kube.KubeApiError as e:
                if e.retryable:
                    raise kopf.TemporaryError(str(e), delay=options.retry_delay) from e
                outcome = reconcile.Reject("DeploymentRefused", str(e))
        log_reconciled(f"{body.metadata.namespace}/{body.metadata.name}", reason, outcome)
        previous = body.status.get("conditions") or []
        status = reconcile.pool_status(
            outcome,
            generation=int(body.metadata.get("generation") or 0),
            previous=_conditions(previous),
            now=_now(),
        )
        for key, value in status.items():
            patch.status[key] = value

    @kopf.on.delete(*_RESOURCE, registry=registry, backoff=options.retry_delay)
    async def delete_workers(body: kopf.Body, **_: Any) -> None:
        namespace, name = str(body.metadata.namespace), str(body.metadata.name)
        try:
            deleted = await kube.delete_deployment(
                namespace, reconcile.deployment_name(name), owner_uid=str(body.metadata.uid)
            )
        except kube.KubeApiError as e:
            raise kopf.TemporaryError(str(e), delay=options.retry_delay) from e
        _log.info(
            "workerpool deleted",
            pool=f"{namespace}/{name}",
            deployment=reconcile.deployment_name(name),
            deployment_deleted=deleted,
        )

    return registry


_ACTIONS: dict[str, str] = {kopf.Reason.CREATE: "created", kopf.Reason.UPDATE: "updated"}
"""What an applied pool's cause did to its Deployment; on resume (a restart) it is checked."""


def log_reconciled(pool: str, cause: str, outcome: reconcile.Plan) -> None:
    """One INFO line per reconcile, naming what was done: an operator's only trace of it."""
    if isinstance(outcome, reconcile.Reject):
        _log.warning(
            "workerpool rejected", pool=pool, reason=outcome.reason, message=outcome.message
        )
        return
    metadata = outcome.deployment["metadata"]
    assert isinstance(metadata, Mapping)
    _log.info(
        f"workerpool {_ACTIONS.get(cause, 'resumed')}",
        pool=pool,
        deployment=metadata["name"],
        replicas=outcome.replicas,
    )
    for warning in outcome.warnings:
        _log.warning("workerpool warning", pool=pool, warning=warning)


def _conditions(raw: object) -> Sequence[Mapping[str, object]]:
    if not isinstance(raw, list):
        return []
    return [c for c in raw if isinstance(c, Mapping)]


def run_controller(
    pool_settings: shaping.ControllerSettings,
    options: ControllerOptions,
    environ: Mapping[str, str],
) -> None:
    """Run until SIGTERM or SIGINT (kopf handles both and finishes in-flight handlers).

    Raises :class:`~.credentials.CredentialsError` before kopf starts when the credentials
    cannot work (see :mod:`.credentials`); an unreachable API server is waited for.
    """
    registry = build_registry(pool_settings, options)

    async def main() -> None:
        source = await credentials.ensure_access(
            options.namespaces, environ, refusal_grace=options.refusal_grace
        )
        _log.info("controller starting", server=source.server, credentials=source.description)
        await kopf.operator(
            registry=registry,
            settings=operator_settings(options),
            standalone=True,
            clusterwide=not options.namespaces,
            namespaces=options.namespaces,
            liveness_endpoint=options.liveness_endpoint,
        )

    asyncio.run(main())
