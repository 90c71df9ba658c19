"""Fixtures: one real etcd + kube-apiserver for the session, with the WorkerPool CRD.

Skipped when ``scripts/build-kube.sh`` has not run; under ``SUBSTRATE_GPU_REQUIRE_REAL=1``
(CI) a missing binary fails instead.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.kube_apiserver import (
    KubeApiServer,
    KubeClient,
    binary_dir,
    install_crd,
    running_apiserver,
)
from support.real import missing

_names = itertools.count(1)


@pytest.fixture(scope="session")
def kube_bin() -> Path:
    """The directory holding kube-apiserver and etcd (built by scripts/build-kube.sh)."""
    path = binary_dir()
    for name in ("kube-apiserver", "etcd"):
        if not (path / name).is_file():
            missing(str(path / name), "is not built (run scripts/build-kube.sh)")
    return path


@pytest.fixture(scope="session")
def apiserver(kube_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApiServer]:
    """A real API server for the whole session (etcd under it), torn down at the end."""
    with running_apiserver(kube_bin, tmp_path_factory.mktemp("kube")) as server:
        yield server


@pytest.fixture(scope="session")
def admin(apiserver: KubeApiServer) -> KubeClient:
    """A client with cluster-admin rights (system:masters)."""
    return apiserver.admin


@pytest.fixture(scope="session")
def workerpool_crd(admin: KubeClient) -> None:
    """The WorkerPool CRD, installed once."""
    install_crd(admin)


@pytest.fixture
def namespace(admin: KubeClient) -> str:
    """A fresh namespace per test (there is no namespace controller to delete it after)."""
    name = f"t{next(_names)}-{int(time.time() * 1000) % 100000}"
    admin.create_namespace(name)
    return name
