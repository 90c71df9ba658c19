"""The controller's credentials, checked before kopf starts: fail fast on what waiting cannot fix.

kopf retries a failed login every 60 s, forever, and logs a traceback each time: right for
an API server that is away for a while, wrong for a kubeconfig that does not exist or a
token the server refuses, which no amount of waiting repairs. So before handing over to
kopf, :func:`ensure_access` loads the credentials the way kopf will (in-cluster service
account when ``KUBERNETES_SERVICE_HOST`` is set, else ``KUBECONFIG`` or
``~/.kube/config``) and lists WorkerPools once with them:

- a missing, unreadable or malformed kubeconfig, a server certificate the kubeconfig does
  not trust, a 401 (the credentials are refused) or a 403 (the account lacks the
  controller's RBAC) that lasts :data:`REFUSAL_GRACE_S`: :class:`CredentialsError`, and
  the command exits 1 naming the kubeconfig and the cause;
- the API server unreachable, 5xx or 429, or a 404 (the CRD not installed yet, as when
  ``deploy/`` is applied at once): retried with back-off until it answers (a cluster
  whose control plane restarts with the controller must still converge).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml
from kubernetes_asyncio import client, config

from substrate_gpu import exceptions
from substrate_gpu._log import get_logger
from substrate_gpu.controller import kube
from substrate_gpu.pools import crd, model

__all__ = ["CredentialsError", "Source", "ensure_access", "load_credentials"]

RETRY_DELAYS = (0.5, 1.0, 2.0, 3.0, 5.0)
"""Seconds between attempts while the API server is unreachable; the last repeats."""
REFUSAL_GRACE_S = 10.0
"""How long 401 or 403 answers may last before they are final: a freshly started API
server answers them for a moment, until its authenticator and RBAC caches have synced."""

_log = get_logger(__name__)


class CredentialsError(exceptions.ConfigError):
    """The controller's credentials cannot work: missing, malformed, or refused by the server."""


@dataclass(frozen=True)
class Source:
    """Where the credentials came from, for messages."""

    description: str
    """``the kubeconfig /root/.kube/config`` or ``the in-cluster service account``."""
    server: str
    """The API server's URL."""


def _kubeconfig_paths(environ: Mapping[str, str]) -> list[Path]:
    raw = environ.get("KUBECONFIG", "")
    paths = [Path(p).expanduser() for p in raw.split(os.pathsep) if p]
    return paths or [Path("~/.kube/config").expanduser()]


async def load_credentials(
    environ: Mapping[str, str], *, configuration: client.Configuration | None = None
) -> Source:
    """Configure kubernetes_asyncio's default client as kopf will (or :class:`CredentialsError`).

    With ``configuration``, that one is configured instead and the default is left alone
    (the Python client's way: :mod:`.pool_client`).
    """
    if environ.get("KUBERNETES_SERVICE_HOST"):
        doing = "while loading the in-cluster service account credentials"
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]  # untyped upstream
        except (config.ConfigException, OSError) as e:
            raise CredentialsError(f"{doing}: {e}") from e
        return Source("the in-cluster service account", _server(configuration))
    paths = _kubeconfig_paths(environ)
    # kubectl skips the missing files of a KUBECONFIG list; one must be there.
    path = next((p for p in paths if p.exists()), paths[-1])
    origin = "from KUBECONFIG" if environ.get("KUBECONFIG") else "the default; set KUBECONFIG"
    doing = f"while loading the kubeconfig {path} ({origin})"
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as e:
        raise CredentialsError(f"{doing}: {e}") from e
    except yaml.YAMLError as e:
        raise CredentialsError(f"{doing}: it is not YAML: {' '.join(str(e).split())}") from e
    if not isinstance(document, Mapping):
        raise CredentialsError(f"{doing}: it is not a kubeconfig (a YAML mapping)")
    try:
        await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    except (config.ConfigException, KeyError, TypeError, ValueError, OSError) as e:
        raise CredentialsError(f"{doing}: {type(e).__name__}: {e}") from e
    return Source(f"the kubeconfig {path}", _server(configuration))


async def ensure_access(
    namespaces: Sequence[str],
    environ: Mapping[str, str],
    *,
    refusal_grace: float = REFUSAL_GRACE_S,
) -> Source:
    """Load the credentials and list WorkerPools once; wait out an unreachable API server.

    A refusal (401, 403) is final only once it has lasted ``refusal_grace`` seconds.
    """
    source = await load_credentials(environ)
    group, version = model.API_VERSION.split("/")
    attempt = 0
    refused_since: float | None = None
    while True:
        try:
            async with client.ApiClient() as api:
                objects = client.CustomObjectsApi(api)
                if namespaces:
                    for namespace in namespaces:
                        await objects.list_namespaced_custom_object(
                            group, version, namespace, crd.PLURAL, limit=1
                        )
                else:
                    await objects.list_cluster_custom_object(group, version, crd.PLURAL, limit=1)
        except client.ApiException as e:
            if e.status in (401, 403):
                now = time.monotonic()
                refused_since = now if refused_since is None else refused_since
                if now - refused_since >= refusal_grace:
                    raise CredentialsError(_refused(source, e)) from e
                cause = f"{e.status} {e.reason} (the API server may still be starting)"
            elif e.status == 404:
                cause = f"the {model.KIND} CRD is not installed (kubectl apply -f deploy/crd.yaml)"
            elif e.status in (429, 500, 502, 503, 504):
                cause = f"{e.status} {e.reason}"
            else:
                raise CredentialsError(
                    f"while listing WorkerPools with {source.description} at {source.server}: "
                    f"the API server answered {e.status} {e.reason}: {_body(e)}"
                ) from e
        except aiohttp.ClientConnectorCertificateError as e:
            raise CredentialsError(
                f"while connecting to {source.server} with {source.description}: the server's "
                f"certificate is not trusted: {e.certificate_error} (check "
                "certificate-authority in the kubeconfig)"
            ) from e
        except (aiohttp.ClientError, ssl.SSLError, TimeoutError, OSError) as e:
            cause = f"{type(e).__name__}: {e}"
        else:
            return source
        delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
        attempt += 1
        _log.warning(
            "waiting for the API server",
            server=source.server,
            credentials=source.description,
            cause=cause,
            retry_in_s=delay,
        )
        await asyncio.sleep(delay)


def _server(configuration: client.Configuration | None = None) -> str:
    return str((configuration or client.Configuration.get_default_copy()).host)


def _refused(source: Source, e: client.ApiException) -> str:
    if e.status == 401:
        what = "refused the credentials (401 Unauthorized): check the token or certificate"
    else:
        what = (
            "forbids listing WorkerPools to them (403 Forbidden): grant the controller's "
            "ClusterRole (deploy/controller.yaml)"
        )
    return (
        f"while logging in to {source.server} with {source.description}: "
        f"the API server {what}; it said: {_body(e)}"
    )


def _body(e: client.ApiException) -> str:
    body = kube.body_text(e)
    try:
        parsed = yaml.safe_load(body)
    except yaml.YAMLError:
        parsed = None
    if isinstance(parsed, Mapping) and isinstance(parsed.get("message"), str):
        return str(parsed["message"])
    return body[:300]
