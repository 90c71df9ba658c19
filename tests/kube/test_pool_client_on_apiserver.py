"""The Python WorkerPool client (substrate_gpu.controller.pool_client) on a real kube-apiserver.

Create, apply, replace, get, list, watch and delete against the session's API server with
the WorkerPool CRD; failures mapped into the package's errors, naming the pool; validation
before sending, with the problems ``pool validate`` prints; docs/api-guide.md's example run
as written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from docs.test_doc_examples import example, run_python, trailing_comments
from pools.pool_cases import IMAGE
from support.kube_apiserver import ADMIN_TOKEN, KubeApiServer, KubeClient

from substrate_gpu.cli import EXIT_INVALID, main
from substrate_gpu.controller import pool_client
from substrate_gpu.pools import PoolValidationError, WorkerPool

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def admin_kubeconfig(
    apiserver: KubeApiServer, workerpool_crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return apiserver.kubeconfig(tmp_path_factory.mktemp("client") / "kubeconfig", ADMIN_TOKEN)


@pytest.fixture
async def pools(admin_kubeconfig: Path) -> AsyncIterator[pool_client.PoolClient]:
    async with pool_client.connect(admin_kubeconfig) as client:
        yield client


def gpu_pool(namespace: str, name: str = "gpu", replicas: int = 2) -> WorkerPool:
    return WorkerPool(
        name=name,
        namespace=namespace,
        replicas=replicas,
        node_selector={"accelerator": "nvidia-gpu"},
        limits={"nvidia.com/gpu": "1"},
    )


async def test_a_created_pool_is_stored_and_read_back_as_the_same_pool(
    pools: pool_client.PoolClient, namespace: str
) -> None:
    """create, then get: the same model, with the server's uid, version and generation."""
    created = await pools.create(gpu_pool(namespace))
    fetched = await pools.get(namespace, "gpu")
    assert created.pool == fetched.pool == gpu_pool(namespace)
    assert (fetched.uid, fetched.generation, fetched.problems) == (created.uid, 1, ())
    assert fetched.resource_version
    assert not fetched.reconciled  # no controller runs here


async def test_creating_a_pool_that_exists_is_a_conflict_naming_it(
    pools: pool_client.PoolClient, namespace: str
) -> None:
    await pools.create(gpu_pool(namespace))
    with pytest.raises(pool_client.PoolConflictError) as caught:
        await pools.create(gpu_pool(namespace))
    assert caught.value.pool == f"{namespace}/gpu"
    assert f"while creating WorkerPool {namespace}/gpu: conflict: " in str(caught.value)
    assert "already exists" in str(caught.value)


async def test_replace_changes_the_spec_and_refuses_a_stale_resource_version(
    pools: pool_client.PoolClient, namespace: str, admin: KubeClient
) -> None:
    """replace: the new spec at a new generation; from an old version, a conflict; the
    stored metadata (a finalizer, say) kept."""
    created = await pools.create(gpu_pool(namespace))
    path = f"/apis/{pool_client.model.API_VERSION}/namespaces/{namespace}/workerpools/gpu"
    admin.ok(
        "PATCH",
        path,
        {"metadata": {"finalizers": ["example.com/keep"]}},
        content_type="application/merge-patch+json",
    )
    current = await pools.get(namespace, "gpu")
    bigger = dataclasses.replace(gpu_pool(namespace), replicas=5, worker_image=IMAGE)
    replaced = await pools.replace(bigger, resource_version=current.resource_version)
    assert (replaced.pool, replaced.generation) == (bigger, 2)
    assert admin.ok("GET", path)["metadata"]["finalizers"] == ["example.com/keep"]
    with pytest.raises(pool_client.PoolConflictError, match=f"WorkerPool {namespace}/gpu"):
        await pools.replace(gpu_pool(namespace), resource_version=created.resource_version)
    admin.ok(
        "PATCH", path, {"metadata": {"finalizers": []}}, content_type="application/merge-patch+json"
    )


async def test_apply_creates_then_updates_idempotently(
    pools: pool_client.PoolClient, namespace: str
) -> None:
    """Server-side apply: the first call creates, a changed pool updates, the same pool
    again changes nothing (same resourceVersion)."""
    first = await pools.apply(gpu_pool(namespace, replicas=1))
    second = await pools.apply(gpu_pool(namespace, replicas=3))
    again = await pools.apply(gpu_pool(namespace, replicas=3))
    assert (first.generation, second.pool.replicas, second.generation) == (1, 3, 2)
    assert again.resource_version == second.resource_version


async def test_apply_over_a_created_pool_conflicts_unless_forced(
    pools: pool_client.PoolClient, namespace: str
) -> None:
    """create is an update-style write: applying other values over its fields is a
    conflict (Kubernetes' server-side apply), named and explained, until forced."""
    await pools.create(gpu_pool(namespace))
    with pytest.raises(pool_client.PoolConflictError) as caught:
        await pools.apply(gpu_pool(namespace, replicas=4))
    assert ".spec.replicas" in str(caught.value)
    assert (await pools.apply(gpu_pool(namespace, replicas=4), force=True)).pool.replicas == 4


async def test_list_finds_the_namespaces_pools_and_a_watch_goes_on_from_it(
    pools: pool_client.PoolClient, namespace: str
) -> None:
    """list, then watch from its resourceVersion: the changes after it, in order."""
    await pools.create(gpu_pool(namespace, "a"))
    listed = await pools.list(namespace)
    assert [p.name for p in listed.items] == ["a"]
    events = pools.watch(namespace, resource_version=listed.resource_version, timeout_s=30)
    async with contextlib.aclosing(events):
        await pools.apply(gpu_pool(namespace, "b"))
        await pools.apply(gpu_pool(namespace, "b", replicas=4))
        await pools.delete(namespace, "a")
        seen = []
        async for event in events:
            seen.append((event.type, event.pool.name, event.pool.pool.replicas))
            if len(seen) == 3:
                break
    assert seen == [("ADDED", "b", 2), ("MODIFIED", "b", 4), ("DELETED", "a", 2)]


async def test_a_watch_without_a_resource_version_starts_with_the_current_pools(
    pools: pool_client.PoolClient, namespace: str
) -> None:
    await pools.create(gpu_pool(namespace, "old"))
    async with contextlib.aclosing(pools.watch(namespace, timeout_s=30)) as events:
        first = await anext(events)
    assert (first.type, first.pool.name) == ("ADDED", "old")


async def test_watching_from_an_expired_version_says_to_list_again(
    pools: pool_client.PoolClient, namespace: str
) -> None:
    """A resourceVersion etcd has compacted away (here: one never issued, far ahead is
    refused as too large; an ancient one as gone): a PoolWatchExpiredError or a clear error."""
    with pytest.raises(pool_client.PoolApiError) as caught:
        async with contextlib.aclosing(
            pools.watch(namespace, resource_version="1", timeout_s=5)
        ) as events:
            async for _ in events:
                pass
    assert isinstance(caught.value, pool_client.PoolWatchExpiredError)
    assert "list the pools again" in str(caught.value)


async def test_getting_or_deleting_a_missing_pool_is_not_found_naming_it(
    pools: pool_client.PoolClient, namespace: str
) -> None:
    for call in (pools.get(namespace, "nope"), pools.delete(namespace, "nope")):
        with pytest.raises(pool_client.PoolNotFoundError) as caught:
            await call
        assert caught.value.pool == f"{namespace}/nope"
        assert str(caught.value).endswith(f"WorkerPool {namespace}/nope: no such WorkerPool")


async def test_an_invalid_pool_is_refused_before_sending_with_pool_validates_problems(
    pools: pool_client.PoolClient,
    namespace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A typo'd GPU and a negative count: PoolValidationError with exactly the problems
    `pool validate` prints for the same document; nothing was created."""
    bad = dataclasses.replace(gpu_pool(namespace), replicas=-1, limits={"nvidia.com/gpus": "1"})
    with pytest.raises(PoolValidationError) as caught:
        await pools.create(bad)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad.to_document()))
    assert main(["pool", "validate", str(path)]) == EXIT_INVALID
    printed = [
        line.split(": error: ", 1)[1]
        for line in capsys.readouterr().err.splitlines()
        if ": error: " in line
    ]
    assert [str(p) for p in caught.value.problems] == printed
    assert any("did you mean nvidia.com/gpu?" in line for line in printed)
    assert (await pools.list(namespace)).items == ()


async def test_a_stored_pool_todays_validator_refuses_is_listed_with_its_problems(
    pools: pool_client.PoolClient, namespace: str, admin: KubeClient
) -> None:
    """A pool stored past the rules (here: sent by a client that does not check, and a
    field the CRD lets through) is listed, not fatal, and carries its problems."""
    body = gpu_pool(namespace, "odd").to_document()
    body["spec"]["template"]["annotations"] = {"example.com/x": "y" * (256 * 1024)}  # type: ignore[index]
    response = admin.request(
        "POST", f"/apis/{pool_client.model.API_VERSION}/namespaces/{namespace}/workerpools", body
    )
    assert response.status == 201, response.body
    [stored] = (await pools.list(namespace)).items
    assert [p.code for p in stored.problems] == ["annotations-too-long"]


async def test_the_api_guides_example_runs_as_written(
    admin_kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/api-guide.md's Python example, with KUBECONFIG naming this API server: what it
    prints is what its trailing comments say."""
    language, code = example("api-guide.md", "pool-client")
    assert language == "python"
    monkeypatch.setenv("KUBECONFIG", str(admin_kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    printed = await run_python(code, "api-guide.md", {})
    assert printed.splitlines() == trailing_comments(code)
    assert os.environ["KUBECONFIG"] == str(admin_kubeconfig)
