"""docs/api-guide.md's controller quick start, run as written (``mktemp`` under the test's
temporary directory, through ``TMPDIR``).

The seed's pool, unchanged, reaches Ready and gets its GPU-shaped worker Deployment, with
only what the project builds (scripts/build-kube.sh) and installs (no kubectl).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from docs.test_doc_examples import example
from service.agentproc import REPO

from substrate_gpu.pools import shaping
from substrate_gpu.testing import kube


def test_the_quick_start_runs_as_written(kube_bin: Path, tmp_path: Path) -> None:
    """start, controller, apply, get pool, get Deployment, stop: the pool Ready, 1 GPU a worker."""
    language, script = example("api-guide.md", "quick-start")
    assert language == "sh"
    assert "/tmp/" not in script  # one shared directory would collide between users
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATE_", "KUBE"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["TMPDIR"] = str(tmp_path)
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        for made in tmp_path.iterdir():
            kube.stop_detached(made)
    [workdir] = list(tmp_path.iterdir())  # mktemp's, under TMPDIR
    log = workdir / "controller.log"
    controller_log = log.read_text(errors="replace") if log.exists() else ""
    assert done.returncode == 0, f"{done.stderr}\n{controller_log}"
    lines = done.stdout.splitlines()
    assert "workerpool/gpu-pool created" in lines
    # Each `get` prints one YAML document after a `---` line; `stop` ends the output.
    first, second = (i for i, line in enumerate(lines) if line == "---")
    assert lines[-1] == "stopped 2 process(es)"
    pool = yaml.safe_load("\n".join(lines[first + 1 : second]))
    deployment = yaml.safe_load("\n".join(lines[second + 1 : -1]))
    # The pool as written, plus the one default the CRD's schema fills in.
    assert pool["spec"] == {
        "nodeSelector": {"accelerator": "nvidia-gpu"},
        "resourceRequests": {"nvidia.com/gpu": "1"},
        "maxWorkers": 10,
        "sandboxClass": "gvisor",
    }
    ready = {c["type"]: c["status"] for c in pool["status"]["conditions"]}
    assert ready == {"Ready": "True", "Rejected": "False"}
    assert pool["status"]["replicas"] == 10
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == shaping.agent_image()
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "workerpool created" in controller_log
    assert kube._running_pids(workdir) == []  # the doc's stop stopped both


def test_the_kit_pins_the_version_the_build_script_builds() -> None:
    """The kit looks for the binaries where scripts/build-kube.sh puts them."""
    script = (REPO / "scripts" / "build-kube.sh").read_text()
    assert f"\nKUBE_VERSION={kube.KUBE_VERSION}\n" in script


def test_start_without_the_binaries_says_to_build_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``start`` before scripts/build-kube.sh: exit 1, one line naming the script."""
    monkeypatch.setenv("SUBSTRATE_GPU_KUBE_BIN", str(tmp_path / "bin"))
    assert kube.main(["start", str(tmp_path / "k")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run scripts/build-kube.sh first" in err


def test_get_without_a_kubeconfig_says_where_to_find_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --kubeconfig and no KUBECONFIG: exit 1, pointing at what ``start`` prints."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert kube.main(["get", "workerpool", "gpu-pool"]) == 1
    assert "set KUBECONFIG (start prints it)" in capsys.readouterr().err
