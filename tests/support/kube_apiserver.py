"""The real etcd + kube-apiserver of the tests: the test kit's (:mod:`substrate_gpu.testing.kube`),
which the quick start in docs/api-guide.md runs too."""

from __future__ import annotations

from substrate_gpu.testing.kube import (
    ADMIN_TOKEN,
    KubeApiServer,
    KubeClient,
    KubeError,
    Response,
    binary_dir,
    free_port,
    install_crd,
    object_path,
    running_apiserver,
)

__all__ = [
    "ADMIN_TOKEN",
    "KubeApiServer",
    "KubeClient",
    "KubeError",
    "Response",
    "binary_dir",
    "free_port",
    "install_crd",
    "object_path",
    "running_apiserver",
]
