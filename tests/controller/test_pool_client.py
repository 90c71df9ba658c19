"""The Python WorkerPool client's pure parts: stored pools read, API errors worded.

The calls themselves run against a real API server in tests/kube/test_pool_client_on_apiserver.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from pools.pool_cases import flat, pool

from substrate_gpu import exceptions
from substrate_gpu.controller import credentials, pool_client
from substrate_gpu.pools import Code, load_pool


def stored(doc: dict[str, Any], status: dict[str, Any] | None = None, generation: int = 2) -> dict:
    metadata = doc["metadata"] | {
        "namespace": "ns",
        "uid": "u-1",
        "resourceVersion": "42",
        "generation": generation,
    }
    return doc | {"metadata": metadata, "status": status or {}}


READY_STATUS = {
    "observedGeneration": 2,
    "replicas": 2,
    "deployment": "p-workers",
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Reconciled",
            "message": "the worker Deployment is up to date",
            "lastTransitionTime": "2026-12-01T00:00:00Z",
            "observedGeneration": 2,
        },
        {"type": "Rejected", "status": "False", "reason": "Accepted", "message": "ok"},
    ],
}


def test_a_stored_pool_carries_the_model_and_what_the_server_keeps() -> None:
    body = stored(pool(flat("1")), READY_STATUS)
    got = pool_client.stored_pool(body)
    assert got.pool == load_pool(body)
    assert (got.uid, got.resource_version, got.generation, got.problems) == ("u-1", "42", 2, ())
    assert (got.status.replicas, got.status.deployment) == (2, "p-workers")
    ready = got.status.condition("Ready")
    assert ready is not None and ready.last_transition_time == "2026-12-01T00:00:00Z"
    assert got.ready and got.reconciled


@pytest.mark.parametrize(
    ("status", "generation"),
    [
        pytest.param({}, 2, id="never-seen"),
        pytest.param(READY_STATUS, 3, id="spec-changed-since"),
        pytest.param(
            READY_STATUS
            | {
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "InvalidSpec", "message": "x"}
                ]
            },
            2,
            id="rejected",
        ),
    ],
)
def test_a_pool_is_ready_only_once_its_current_generation_is(
    status: dict[str, Any], generation: int
) -> None:
    assert not pool_client.stored_pool(stored(pool(flat("1")), status, generation)).ready


def test_a_stored_pool_the_validator_refuses_is_read_with_its_problems() -> None:
    """Stored under an older CRD: read (not raised), the problems carried."""
    got = pool_client.stored_pool(stored(pool(flat("1", sandboxClass="microvm"))))
    assert [p.code for p in got.problems] == [Code.GPU_SANDBOX_CLASS]
    assert got.pool.sandbox_class == "microvm"


def api_exception(status: int, body: dict[str, Any], reason: str = "Reason") -> client.ApiException:
    error = client.ApiException(status=status, reason=reason)
    error.body = json.dumps(body).encode()
    return error


# Bodies as kube-apiserver answers them.
POOL_NOT_FOUND = {
    "kind": "Status",
    "message": 'workerpools.substrate.agent-substrate.github.com "gpu" not found',
    "reason": "NotFound",
    "details": {
        "name": "gpu",
        "group": "substrate.agent-substrate.github.com",
        "kind": "workerpools",
    },
    "code": 404,
}
NO_SUCH_RESOURCE = {
    "kind": "Status",
    "message": "the server could not find the requested resource",
    "reason": "NotFound",
    "details": {},
    "code": 404,
}


def test_a_missing_pool_is_not_found_naming_it() -> None:
    error = pool_client._error(
        "getting WorkerPool ns/gpu", "ns/gpu", api_exception(404, POOL_NOT_FOUND)
    )
    assert isinstance(error, pool_client.PoolNotFoundError)
    assert str(error) == "while getting WorkerPool ns/gpu: no such WorkerPool"
    assert (error.pool, error.status, error.retryable) == ("ns/gpu", 404, False)


def test_a_missing_crd_says_to_install_it() -> None:
    error = pool_client._error(
        "getting WorkerPool ns/gpu", "ns/gpu", api_exception(404, NO_SUCH_RESOURCE)
    )
    assert isinstance(error, pool_client.PoolNotFoundError)
    assert "kubectl apply -f deploy/crd.yaml" in str(error)


def test_a_refusal_carries_the_api_servers_causes() -> None:
    body = {
        "message": "WorkerPool is invalid",
        "details": {"causes": [{"field": "spec.replicas", "message": "must not be negative"}]},
    }
    error = pool_client._error("creating WorkerPool ns/gpu", "ns/gpu", api_exception(422, body))
    assert isinstance(error, pool_client.PoolRejectedError)
    assert error.causes == (("spec.replicas", "must not be negative"),)
    assert (
        str(error)
        == "while creating WorkerPool ns/gpu: the API server refused it: WorkerPool is invalid"
    )


@pytest.mark.parametrize(
    ("status", "retryable", "words"),
    [
        pytest.param(401, False, "credentials were refused", id="unauthorized"),
        pytest.param(403, False, "RBAC", id="forbidden"),
        pytest.param(503, True, "503", id="unavailable"),
        pytest.param(429, True, "429", id="throttled"),
    ],
)
def test_other_answers_say_whether_a_retry_can_help(
    status: int, retryable: bool, words: str
) -> None:
    error = pool_client._error("listing", "ns", api_exception(status, {"message": "no"}))
    assert type(error) is pool_client.PoolApiError
    assert isinstance(error, exceptions.SubstrateGpuError)
    assert (error.retryable, words in str(error)) == (retryable, True)


def test_an_unreachable_api_server_is_retryable() -> None:
    error = pool_client._error("listing", "ns", aiohttp.ClientConnectionError("refused"))
    assert (error.status, error.retryable) == (None, True)
    assert "is the API server reachable?" in str(error)


@pytest.mark.anyio
async def test_connect_with_a_missing_kubeconfig_is_a_credentials_error(tmp_path: Path) -> None:
    with pytest.raises(credentials.CredentialsError, match="No such file or directory"):
        async with pool_client.connect(tmp_path / "nope"):
            pass
