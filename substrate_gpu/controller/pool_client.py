"""WorkerPools on the API server, from Python: create, apply, replace, get, list, delete, watch.

What upstream's Go users get from the generated typed client (``pkg/client/clientset/
versioned``, its listers and informers), for Python: a :class:`~substrate_gpu.pools.WorkerPool`
(the frozen model, built in Python or read from YAML) goes in, :class:`StoredPool` values
(the model, plus what the API server keeps: uid, resourceVersion, generation, the
controller's status) come out, and every failure is one of this package's errors.

- **Validated before it is sent**, by the validator ``substrate-gpu pool validate`` runs,
  on the pool's document (:meth:`~substrate_gpu.pools.WorkerPool.to_document`): an invalid
  pool raises :class:`~substrate_gpu.pools.PoolValidationError` carrying the very problems
  ``pool validate`` prints for that document, and nothing reaches the API server.
- **Errors name the pool**: a 404 is :class:`PoolNotFoundError` (or the CRD is missing, and
  the message says so), a 409 :class:`PoolConflictError` (it exists; the resourceVersion is
  stale; another manager owns a field), a 422 :class:`PoolRejectedError` with the API
  server's causes, a 410 during a watch :class:`PoolWatchExpiredError`; anything else is
  :class:`PoolApiError`, with ``retryable`` set as the controller's own calls set it.
- **Writes**: :meth:`PoolClient.create` (POST), :meth:`PoolClient.apply` (server-side apply
  under a field manager: create or update in one idempotent request), and
  :meth:`PoolClient.replace` (PUT of the spec, guarded by a resourceVersion: optimistic
  concurrency). ``replace`` keeps the pool's metadata as stored (the controller's
  finalizer, kopf's annotations); only the spec is the caller's.
- **Reads**: :meth:`PoolClient.get`, :meth:`PoolClient.list` (its ``resource_version``
  starts a watch where the list ended, as an informer does) and :meth:`PoolClient.watch`
  (ADDED/MODIFIED/DELETED, reconnecting; from the current state when no resourceVersion
  is given). A stored pool that today's validator refuses (stored under an older CRD) is
  still returned, with its ``problems``: a list must not fail on one bad pool.

Why kubernetes_asyncio: the controller already depends on it (kopf logs it in for the
controller's Deployment calls), it is async like the rest of the stack, it loads
in-cluster and kubeconfig credentials the same way kubectl does, and it is generated from
the Kubernetes OpenAPI and kept in step with it. A typed generic-resource client (lightkube)
would add a dependency to type what :mod:`substrate_gpu.pools` already types: the body a
pool is sent and read as is the model's.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import aiohttp
from kubernetes_asyncio import client, watch

from substrate_gpu.controller import credentials, kube
from substrate_gpu.pools import crd, model, problems, validation

__all__ = [
    "FIELD_MANAGER",
    "Condition",
    "PoolApiError",
    "PoolClient",
    "PoolConflictError",
    "PoolEvent",
    "PoolList",
    "PoolNotFoundError",
    "PoolRejectedError",
    "PoolStatus",
    "PoolWatchExpiredError",
    "StoredPool",
    "connect",
    "stored_pool",
]

FIELD_MANAGER = "substrate-gpu"
"""Server-side apply field manager of :meth:`PoolClient.apply` (the controller's is another)."""

_GROUP, _VERSION = model.API_VERSION.split("/")
_EventType = Literal["ADDED", "MODIFIED", "DELETED"]


# --- what the API server keeps ------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    """One ``status.conditions`` entry the controller writes (``Ready``, ``Rejected``)."""

    type: str
    status: str
    """``True``, ``False`` or ``Unknown``."""
    reason: str
    message: str
    last_transition_time: str | None = None
    observed_generation: int | None = None


@dataclass(frozen=True)
class PoolStatus:
    """A pool's ``status``, as the controller writes it (empty before it has seen the pool)."""

    observed_generation: int | None = None
    """The spec generation the controller last acted on."""
    replicas: int | None = None
    """Workers the pool's Deployment asks for."""
    deployment: str | None = None
    """The worker Deployment's name."""
    conditions: tuple[Condition, ...] = ()

    def condition(self, kind: str) -> Condition | None:
        """The condition of type ``kind``, if the controller wrote one."""
        return next((c for c in self.conditions if c.type == kind), None)


@dataclass(frozen=True)
class StoredPool:
    """A WorkerPool as the API server returns it."""

    pool: model.WorkerPool
    """The pool, normalised (from either YAML form)."""
    uid: str
    resource_version: str
    """What :meth:`PoolClient.replace` and :meth:`PoolClient.watch` are given to go on from here."""
    generation: int
    status: PoolStatus
    problems: tuple[problems.Problem, ...] = ()
    """What today's validator refuses in the stored pool (one stored under an older CRD);
    empty for every pool this CRD admitted."""

    @property
    def name(self) -> str:
        return self.pool.name

    @property
    def namespace(self) -> str:
        return self.pool.namespace

    @property
    def reconciled(self) -> bool:
        """Whether the controller has acted on this generation of the spec."""
        return self.status.observed_generation == self.generation

    @property
    def ready(self) -> bool:
        """Reconciled, and ``Ready``: its worker Deployment matches this generation."""
        ready = self.status.condition("Ready")
        return self.reconciled and ready is not None and ready.status == "True"


@dataclass(frozen=True)
class PoolList:
    """The pools :meth:`PoolClient.list` found, and where a watch takes over."""

    items: tuple[StoredPool, ...]
    resource_version: str


@dataclass(frozen=True)
class PoolEvent:
    """One change :meth:`PoolClient.watch` saw."""

    type: _EventType
    pool: StoredPool
    """The pool after the change (for ``DELETED``: as it was last)."""


def _m(raw: object) -> Mapping[str, object]:
    return cast("Mapping[str, object]", raw) if isinstance(raw, Mapping) else {}


def _int(raw: object) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


def _str(raw: object) -> str | None:
    return raw if isinstance(raw, str) else None


def _status(raw: object) -> PoolStatus:
    status = _m(raw)
    conditions = tuple(
        Condition(
            type=str(c.get("type", "")),
            status=str(c.get("status", "")),
            reason=str(c.get("reason", "")),
            message=str(c.get("message", "")),
            last_transition_time=_str(c.get("lastTransitionTime")),
            observed_generation=_int(c.get("observedGeneration")),
        )
        for c in (_m(item) for item in cast("list[object]", status.get("conditions") or []))
    )
    return PoolStatus(
        observed_generation=_int(status.get("observedGeneration")),
        replicas=_int(status.get("replicas")),
        deployment=_str(status.get("deployment")),
        conditions=conditions,
    )


def stored_pool(body: Mapping[str, object]) -> StoredPool:
    """A WorkerPool object from the API server as a :class:`StoredPool` (never raises on a
    pool the validator refuses: its problems are carried)."""
    document = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    metadata = _m(body.get("metadata"))
    return StoredPool(
        pool=model.pool_from_document(document),
        uid=str(metadata.get("uid", "")),
        resource_version=str(metadata.get("resourceVersion", "")),
        generation=_int(metadata.get("generation")) or 0,
        status=_status(body.get("status")),
        problems=validation.validate_document(document).errors,
    )


# --- errors -------------------------------------------------------------------------------


class PoolApiError(kube.KubeApiError):
    """A WorkerPool call failed; the message names the pool and what the API server said."""

    def __init__(self, message: str, *, pool: str, status: int | None, retryable: bool) -> None:
        self.pool = pool
        """``namespace/name`` (or the namespace listed or watched)."""
        super().__init__(message, status=status, retryable=retryable)


class PoolNotFoundError(PoolApiError):
    """No such pool (404)."""


class PoolConflictError(PoolApiError):
    """409: the pool exists (create), its resourceVersion is stale (replace), or a field is
    another field manager's (apply without ``force``)."""


class PoolRejectedError(PoolApiError):
    """422: the API server refused the pool; ``causes`` are its (field, message) pairs."""

    def __init__(
        self,
        message: str,
        *,
        pool: str,
        status: int | None,
        causes: tuple[tuple[str, str], ...],
    ) -> None:
        self.causes = causes
        super().__init__(message, pool=pool, status=status, retryable=False)


class PoolWatchExpiredError(PoolApiError):
    """410 during a watch: the resourceVersion is too old; list again and watch from there."""


def _body(e: client.ApiException) -> Mapping[str, object]:
    try:
        parsed = json.loads(kube.body_text(e))
    except ValueError:
        return {}
    return _m(parsed)


def _error(doing: str, pool: str, e: Exception) -> PoolApiError:
    """``e`` in this package's words: while doing what, on which pool, and what to do."""
    if not isinstance(e, client.ApiException):
        return PoolApiError(
            f"while {doing}: {type(e).__name__}: {e} (is the API server reachable?)",
            pool=pool,
            status=None,
            retryable=True,
        )
    status = int(e.status) if e.status is not None else None
    body = _body(e)
    said = str(body.get("message") or kube.body_text(e)[:500])
    details = _m(body.get("details"))
    if status == 404:
        if details.get("kind") == crd.PLURAL and details.get("name"):
            return PoolNotFoundError(
                f"while {doing}: no such WorkerPool", pool=pool, status=status, retryable=False
            )
        return PoolNotFoundError(
            f"while {doing}: the API server does not serve WorkerPools ({said}): install the "
            "CRD (kubectl apply -f deploy/crd.yaml)",
            pool=pool,
            status=status,
            retryable=False,
        )
    if status == 409:
        return PoolConflictError(
            f"while {doing}: conflict: {said}", pool=pool, status=status, retryable=False
        )
    if status == 410:
        return PoolWatchExpiredError(
            f"while {doing}: the resourceVersion is too old ({said}): list the pools again "
            "and watch from the list's resource_version",
            pool=pool,
            status=status,
            retryable=False,
        )
    if status == 422:
        causes = tuple(
            (str(c.get("field", "")), str(c.get("message", "")))
            for c in (_m(item) for item in cast("list[object]", details.get("causes") or []))
        )
        return PoolRejectedError(
            f"while {doing}: the API server refused it: {said}",
            pool=pool,
            status=status,
            causes=causes,
        )
    hint = {
        401: "the credentials were refused: check the kubeconfig's token or certificate",
        403: "the account may not do this: grant it the WorkerPool verbs it needs (RBAC)",
    }.get(status or 0, "")
    return PoolApiError(
        f"while {doing}: the API server answered {status} {e.reason}: {said}"
        + (f"; {hint}" if hint else ""),
        pool=pool,
        status=status,
        retryable=status in {429, 500, 502, 503, 504},
    )


_FAILURES = (client.ApiException, aiohttp.ClientError, TimeoutError, OSError)


async def _json_of(response: aiohttp.ClientResponse) -> Mapping[str, object]:
    """A raw (not preloaded) answer's JSON object; an error status as ``ApiException``."""
    try:
        data = await response.read()
    finally:
        response.release()
    if not 200 <= response.status <= 299:
        error = client.ApiException(status=response.status, reason=response.reason)
        error.body = data
        raise error
    return _m(json.loads(data))


# --- the client ---------------------------------------------------------------------------


def _checked(pool: model.WorkerPool) -> dict[str, Any]:
    """The pool's document, or :class:`PoolValidationError` with ``pool validate``'s problems."""
    document = pool.to_document()
    report = validation.validate_document(document)
    if report.errors:
        raise problems.PoolValidationError(f"{pool.namespace}/{pool.name}", report.errors)
    return dict(document)


class PoolClient:
    """WorkerPool calls on one API server connection (see the module docstring)."""

    def __init__(self, api: client.ApiClient, *, field_manager: str = FIELD_MANAGER) -> None:
        self._objects = client.CustomObjectsApi(api)
        self._field_manager = field_manager

    async def create(self, pool: model.WorkerPool) -> StoredPool:
        """Create ``pool``; :class:`PoolConflictError` if one of its name exists."""
        body = _checked(pool)
        key = f"{pool.namespace}/{pool.name}"
        try:
            created = await self._objects.create_namespaced_custom_object(
                _GROUP,
                _VERSION,
                pool.namespace,
                crd.PLURAL,
                body,
                field_manager=self._field_manager,
                field_validation="Strict",
            )
        except _FAILURES as e:
            raise _error(f"creating WorkerPool {key}", key, e) from e
        return stored_pool(created)

    async def apply(self, pool: model.WorkerPool, *, force: bool = False) -> StoredPool:
        """Create or update ``pool`` by server-side apply (idempotent).

        The fields this client's manager applied before and ``pool`` no longer has are
        removed; fields another manager (kubectl) set stay, and one set to another value
        is a :class:`PoolConflictError` unless ``force`` takes it over.
        """
        body = _checked(pool)
        key = f"{pool.namespace}/{pool.name}"
        try:
            # Read raw: the generated method decodes a 200 but drops a 201 (created) body.
            response = await self._objects.patch_namespaced_custom_object(
                _GROUP,
                _VERSION,
                pool.namespace,
                crd.PLURAL,
                pool.name,
                body,
                field_manager=self._field_manager,
                force=force,
                field_validation="Strict",
                # Accepted at runtime; the package's stubs omit it.
                _content_type="application/apply-patch+yaml",  # type: ignore[call-arg]
                _preload_content=False,
            )
            applied = await _json_of(response)
        except _FAILURES as e:
            raise _error(f"applying WorkerPool {key}", key, e) from e
        return stored_pool(applied)

    async def replace(self, pool: model.WorkerPool, *, resource_version: str) -> StoredPool:
        """Replace the stored pool's spec with ``pool``'s, if it is still at ``resource_version``.

        :class:`PoolConflictError` when it changed since (read it again, redo the change);
        its metadata (labels, annotations, finalizers) is kept as stored.
        """
        spec = _checked(pool)["spec"]
        key = f"{pool.namespace}/{pool.name}"
        doing = f"replacing WorkerPool {key}"
        try:
            current = await self._objects.get_namespaced_custom_object(
                _GROUP, _VERSION, pool.namespace, crd.PLURAL, pool.name
            )
            metadata = {**_m(current.get("metadata")), "resourceVersion": resource_version}
            body = {
                "apiVersion": model.API_VERSION,
                "kind": model.KIND,
                "metadata": metadata,
                "spec": spec,
            }
            replaced = await self._objects.replace_namespaced_custom_object(
                _GROUP,
                _VERSION,
                pool.namespace,
                crd.PLURAL,
                pool.name,
                body,
                field_manager=self._field_manager,
                field_validation="Strict",
            )
        except _FAILURES as e:
            raise _error(doing, key, e) from e
        return stored_pool(replaced)

    async def get(self, namespace: str, name: str) -> StoredPool:
        """The pool ``namespace/name``; :class:`PoolNotFoundError` if there is none."""
        key = f"{namespace}/{name}"
        try:
            body = await self._objects.get_namespaced_custom_object(
                _GROUP, _VERSION, namespace, crd.PLURAL, name
            )
        except _FAILURES as e:
            raise _error(f"getting WorkerPool {key}", key, e) from e
        return stored_pool(body)

    async def list(self, namespace: str | None = None) -> PoolList:
        """The pools of ``namespace`` (``None``: every namespace), in the API server's order."""
        where = namespace or "all namespaces"
        try:
            if namespace is None:
                body = await self._objects.list_cluster_custom_object(_GROUP, _VERSION, crd.PLURAL)
            else:
                body = await self._objects.list_namespaced_custom_object(
                    _GROUP, _VERSION, namespace, crd.PLURAL
                )
        except _FAILURES as e:
            raise _error(f"listing the WorkerPools of {where}", where, e) from e
        items = tuple(stored_pool(_m(item)) for item in cast("list[object]", body.get("items", [])))
        return PoolList(items, str(_m(body.get("metadata")).get("resourceVersion", "")))

    async def delete(self, namespace: str, name: str) -> None:
        """Delete the pool (its workers go with it, once the controller has deleted them)."""
        key = f"{namespace}/{name}"
        try:
            await self._objects.delete_namespaced_custom_object(
                _GROUP, _VERSION, namespace, crd.PLURAL, name
            )
        except _FAILURES as e:
            raise _error(f"deleting WorkerPool {key}", key, e) from e

    async def watch(
        self,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        timeout_s: int | None = None,
    ) -> AsyncIterator[PoolEvent]:
        """The pools' changes, as they happen.

        Without ``resource_version`` the current pools come first, as ``ADDED``; with one
        (a :class:`PoolList`'s), the changes after it. Without ``timeout_s`` it reconnects
        when the server closes the watch and never ends; with it, it ends after about that
        many seconds. Close it (``contextlib.aclosing``) when done before its end.
        """
        where = namespace or "all namespaces"
        kwargs: dict[str, object] = {}
        if resource_version:
            kwargs["resource_version"] = resource_version
        if timeout_s is not None:
            kwargs["timeout_seconds"] = timeout_s
        func: Callable[..., Awaitable[Any]]
        args: tuple[str, ...]
        if namespace is None:
            func, args = self._objects.list_cluster_custom_object, (_GROUP, _VERSION, crd.PLURAL)
        else:
            func = self._objects.list_namespaced_custom_object
            args = (_GROUP, _VERSION, namespace, crd.PLURAL)
        stream = watch.Watch()
        try:
            async for event in stream.stream(func, *args, **kwargs):
                kind = event["type"]
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    yield PoolEvent(kind, stored_pool(_m(event["raw_object"])))
        except _FAILURES as e:
            raise _error(f"watching the WorkerPools of {where}", where, e) from e
        finally:
            await stream.close()


@contextlib.asynccontextmanager
async def connect(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    field_manager: str = FIELD_MANAGER,
) -> AsyncIterator[PoolClient]:
    """A :class:`PoolClient` logged in as kubectl would be, closed on exit.

    ``kubeconfig`` names the file; without it: the in-cluster service account when
    ``KUBERNETES_SERVICE_HOST`` is set, else ``KUBECONFIG`` or ``~/.kube/config``.
    Credentials that cannot work raise :class:`~.credentials.CredentialsError`.
    """
    environ = {"KUBECONFIG": str(Path(kubeconfig))} if kubeconfig is not None else os.environ
    configuration = client.Configuration()
    await credentials.load_credentials(environ, configuration=configuration)
    async with client.ApiClient(configuration=configuration) as api:
        yield PoolClient(api, field_manager=field_manager)
