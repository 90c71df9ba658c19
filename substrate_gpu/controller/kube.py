"""The controller's own Kubernetes API calls: worker Deployments, through kubernetes_asyncio.

kopf watches WorkerPools and patches their status; the Deployments are ours to write. The
client is ``kubernetes_asyncio`` (async, like kopf's loop, and kopf logs it in: its
``login_via_async_client`` loads the in-cluster or kubeconfig credentials into the
client's default configuration, which every :class:`~kubernetes_asyncio.client.ApiClient`
made afterwards copies).

Writes are **server-side apply** with one field manager and ``force``: one request
creates or updates, it is idempotent (a retry after a crash or a lost answer changes
nothing), and it carries no resourceVersion, so there is no optimistic-concurrency
conflict to lose against a concurrent writer. What still fails (the API server away, a
429 or 5xx, a 409 from a racing delete) is raised as :class:`KubeApiError` with
``retryable`` set, and the handler hands it to kopf to retry.
"""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
from kubernetes_asyncio import client

from substrate_gpu import exceptions
from substrate_gpu.controller import reconcile

__all__ = ["KubeApiError", "apply_deployment", "body_text", "delete_deployment"]

_RETRYABLE_STATUSES = frozenset({409, 429, 500, 502, 503, 504})


class KubeApiError(exceptions.SubstrateGpuError):
    """A Kubernetes API call failed; ``retryable`` says whether trying again can help."""

    def __init__(self, message: str, *, status: int | None, retryable: bool) -> None:
        self.status = status
        self.retryable = retryable
        super().__init__(message)


def _error(doing: str, e: Exception) -> KubeApiError:
    if isinstance(e, client.ApiException):
        status = int(e.status) if e.status is not None else None
        return KubeApiError(
            f"while {doing}: the API server answered {status} {e.reason}: {_body_message(e)}",
            status=status,
            retryable=status is None or status in _RETRYABLE_STATUSES,
        )
    return KubeApiError(f"while {doing}: {type(e).__name__}: {e}", status=None, retryable=True)


def body_text(e: client.ApiException) -> str:
    """The API server's answer body as text (kubernetes_asyncio gives bytes or str)."""
    return e.body.decode(errors="replace") if isinstance(e.body, bytes) else str(e.body)


def _body_message(e: client.ApiException) -> str:
    return body_text(e)[:500]


async def apply_deployment(deployment: Mapping[str, object]) -> None:
    """Create or update ``deployment`` by server-side apply (idempotent)."""
    metadata = deployment["metadata"]
    assert isinstance(metadata, Mapping)
    name, namespace = str(metadata["name"]), str(metadata["namespace"])
    doing = f"applying Deployment {namespace}/{name}"
    try:
        async with client.ApiClient() as api:
            await client.AppsV1Api(api).patch_namespaced_deployment(
                name,
                namespace,
                dict(deployment),
                field_manager=reconcile.FIELD_MANAGER,
                force=True,
                # Accepted at runtime; the package's stubs omit it.
                _content_type="application/apply-patch+yaml",  # type: ignore[call-arg]
            )
    except (client.ApiException, aiohttp.ClientError, TimeoutError, OSError) as e:
        raise _error(doing, e) from e


async def delete_deployment(namespace: str, name: str, *, owner_uid: str) -> bool:
    """Delete the Deployment if the pool with ``owner_uid`` owns it; whether one was deleted.

    The uid precondition makes the delete refuse a Deployment that was recreated in
    between (by a new pool of the same name); ownership is checked so a Deployment the
    user made by hand under our name is left alone.
    """
    doing = f"deleting Deployment {namespace}/{name}"
    try:
        async with client.ApiClient() as api:
            apps = client.AppsV1Api(api)
            try:
                current = await apps.read_namespaced_deployment(name, namespace)
            except client.ApiException as e:
                if e.status == 404:
                    return False
                raise
            owners = current.metadata.owner_references or []
            if not any(ref.uid == owner_uid and ref.controller for ref in owners):
                return False
            try:
                await apps.delete_namespaced_deployment(
                    name,
                    namespace,
                    body=client.V1DeleteOptions(
                        propagation_policy="Background",
                        preconditions=client.V1Preconditions(uid=current.metadata.uid),
                    ),
                )
            except client.ApiException as e:
                if e.status == 404:
                    return False
                raise
    except (client.ApiException, aiohttp.ClientError, TimeoutError, OSError) as e:
        raise _error(doing, e) from e
    return True
