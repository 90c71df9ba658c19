"""The controller's credentials: what cannot work stops it at once, an absent server is waited for.

Against the real API server: a kubeconfig that is missing, unreadable or malformed, a
token the server refuses (401) and an account without the controller's RBAC (403) each
end ``substrate-gpu controller`` with exit 1 and one line naming the kubeconfig and the
cause (a refusal once it has outlasted the grace a just-started API server needs); an
API server that does not answer is retried (the restart tests in
``test_controller.py`` show the controller converging once it is back).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from support.kube_apiserver import KubeApiServer, free_port

from substrate_gpu.cli import EXIT_FAILED
from substrate_gpu.controller import credentials

pytestmark = pytest.mark.anyio


def _env(kubeconfig: Path) -> dict[str, str]:
    return {"KUBECONFIG": str(kubeconfig)}


def _kubeconfig_for(apiserver: KubeApiServer, path: Path, *, context: bool = True) -> Path:
    apiserver.kubeconfig(path, "not-a-token")
    if not context:
        document = yaml.safe_load(path.read_text())
        del document["current-context"]
        path.write_text(yaml.safe_dump(document))
    return path


def _missing(apiserver: KubeApiServer, tmp: Path) -> Path:
    return tmp / "absent" / "kubeconfig"


def _directory(apiserver: KubeApiServer, tmp: Path) -> Path:
    return tmp


def _not_yaml(apiserver: KubeApiServer, tmp: Path) -> Path:
    path = tmp / "kubeconfig"
    path.write_text("clusters: [\n")
    return path


def _not_a_kubeconfig(apiserver: KubeApiServer, tmp: Path) -> Path:
    return _kubeconfig_for(apiserver, tmp / "kubeconfig", context=False)


@pytest.mark.parametrize(
    ("make", "cause"),
    [
        pytest.param(_missing, "No such file or directory", id="missing"),
        pytest.param(_directory, "Is a directory", id="unreadable"),
        pytest.param(_not_yaml, "it is not YAML", id="not-yaml"),
        pytest.param(_not_a_kubeconfig, "Expected key current-context", id="no-context"),
    ],
)
async def test_a_kubeconfig_that_cannot_be_loaded_is_named_with_its_cause(
    apiserver: KubeApiServer,
    tmp_path: Path,
    make: Callable[[KubeApiServer, Path], Path],
    cause: str,
) -> None:
    """Missing, unreadable, not YAML, not a kubeconfig: a CredentialsError naming the file."""
    path = make(apiserver, tmp_path)
    with pytest.raises(credentials.CredentialsError) as caught:
        await credentials.ensure_access(["default"], _env(path))
    assert f"while loading the kubeconfig {path} (from KUBECONFIG)" in str(caught.value)
    assert cause in str(caught.value)


async def test_a_token_the_api_server_refuses_is_fatal(
    apiserver: KubeApiServer, workerpool_crd: None, tmp_path: Path
) -> None:
    """401: no retry, the server and the kubeconfig named."""
    path = _kubeconfig_for(apiserver, tmp_path / "kubeconfig")
    with pytest.raises(credentials.CredentialsError) as caught:
        await credentials.ensure_access(["default"], _env(path), refusal_grace=0)
    message = str(caught.value)
    assert f"with the kubeconfig {path}" in message
    assert apiserver.url in message and "401 Unauthorized" in message


async def test_an_account_without_the_controllers_rbac_is_fatal(
    apiserver: KubeApiServer, workerpool_crd: None, namespace: str, tmp_path: Path
) -> None:
    """403: the account is named by the server, the ClusterRole to grant by us."""
    apiserver.admin.ok(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "nobody"}}
    )
    token = apiserver.service_account_token(namespace, "nobody")
    path = apiserver.kubeconfig(tmp_path / "kubeconfig", token)
    with pytest.raises(credentials.CredentialsError) as caught:
        await credentials.ensure_access([namespace], _env(path), refusal_grace=0)
    message = str(caught.value)
    assert "403 Forbidden" in message and "deploy/controller.yaml" in message
    assert f"system:serviceaccount:{namespace}:nobody" in message


async def test_an_unreachable_api_server_is_retried_not_fatal(
    apiserver: KubeApiServer, tmp_path: Path
) -> None:
    """Nothing listening: ensure_access keeps trying (the back-off, not an error)."""
    path = apiserver.kubeconfig(tmp_path / "kubeconfig", "any")
    document = yaml.safe_load(path.read_text())
    document["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    path.write_text(yaml.safe_dump(document))
    attempt = asyncio.ensure_future(credentials.ensure_access(["default"], _env(path)))
    # A connection refused, the 0.5 s back-off, refused again: still waiting, no error.
    done, _ = await asyncio.wait([attempt], timeout=1.0)
    attempt.cancel()
    assert done == set()


def test_the_command_exits_1_at_once_with_one_line_and_no_traceback(
    apiserver: KubeApiServer, workerpool_crd: None, tmp_path: Path
) -> None:
    """`substrate-gpu controller` with refused credentials: exit 1, promptly, one clear line."""
    path = _kubeconfig_for(apiserver, tmp_path / "kubeconfig")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    started = time.monotonic()
    result = subprocess.run(
        [
            *(sys.executable, "-m", "substrate_gpu", "controller", "--namespace", "default"),
            *("--refusal-grace", "1"),
        ],
        env=env | _env(path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == EXIT_FAILED, result.stderr
    assert "Traceback" not in result.stderr
    [line] = [x for x in result.stderr.splitlines() if x.startswith("substrate-gpu: error:")]
    assert str(path) in line and "401 Unauthorized" in line
    # kopf would have retried every 60 s; the start-up (imports) and the grace remain.
    assert elapsed < 30, elapsed


async def test_a_refusal_is_retried_for_the_grace_period_first(
    apiserver: KubeApiServer, workerpool_crd: None, tmp_path: Path
) -> None:
    """A fresh API server refuses for a moment (its caches syncing): 401 is final only later."""
    path = _kubeconfig_for(apiserver, tmp_path / "kubeconfig")
    started = time.monotonic()
    with pytest.raises(credentials.CredentialsError):
        await credentials.ensure_access(["default"], _env(path), refusal_grace=0.5)
    assert time.monotonic() - started >= 0.5
