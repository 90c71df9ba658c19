"""The pause-container path on real gVisor: a pod's pause (root) container boots the sandbox
and the actor's container joins it (CRI annotations), through RunscDriver's argv."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import real_runsc as runsc_
from support import runc_bundle

from substrate_gpu.runsc import api, driver

pytestmark = [pytest.mark.anyio]

CONTAINER_TYPE = "io.kubernetes.cri.container-type"
SANDBOX_ID = "io.kubernetes.cri.sandbox-id"


def _bundle(directory: Path, args: list[str], annotations: dict[str, str]) -> Path:
    bundle = runc_bundle.make_busybox_bundle(directory, args)
    config = json.loads((bundle / "config.json").read_text())
    config["annotations"] = annotations
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


@pytest.fixture
def pod(real_runsc: Path, tmp_path: Path) -> Iterator[tuple[driver.RunscDriver, Path, Path]]:
    """A driver on real runsc, a pause bundle for sandbox ``pod1`` and an app bundle in it."""
    root = tmp_path / "root"
    runtime = driver.RunscDriver(
        driver.RunscConfig(root=root, runsc=str(real_runsc), global_flags=runsc_.GLOBAL_FLAGS)
    )
    pause = _bundle(tmp_path / "pause", ["/bin/sleep", "100000"], {CONTAINER_TYPE: "sandbox"})
    app = _bundle(
        tmp_path / "app",
        ["/bin/sleep", "100000"],
        {CONTAINER_TYPE: "container", SANDBOX_ID: "pod1"},
    )
    yield runtime, pause, app
    runsc_.delete_all(real_runsc, root)


async def test_the_app_container_joins_the_pause_containers_sandbox(
    pod: tuple[driver.RunscDriver, Path, Path], real_runsc: Path, tmp_path: Path
) -> None:
    """pause then app: both running in one sandbox (one host pid); the sandbox checkpoints;
    deleting both leaves nothing."""
    runtime, pause, app = pod
    await runtime.create("pod1", pause, nvproxy=False)
    await runtime.start("pod1")
    await runtime.create("app1", app, nvproxy=False)
    await runtime.start("app1")
    pod_state, app_state = await runtime.state("pod1"), await runtime.state("app1")
    assert (pod_state.status, app_state.status) == ("running", "running")
    assert pod_state.pid == app_state.pid  # the same sandbox process
    await runtime.checkpoint("pod1", tmp_path / "img", leave_running=True)
    assert (tmp_path / "img" / "pages.img").stat().st_size > 0
    await runtime.delete("app1", force=True)
    await runtime.delete("pod1", force=True)
    assert runsc_.list_ids(real_runsc, tmp_path / "root") == []


async def test_a_gpu_pods_pause_container_gets_nvproxy_and_fails_typed_here(
    pod: tuple[driver.RunscDriver, Path, Path], real_runsc: Path, tmp_path: Path
) -> None:
    """The pause container of a GPU pod is created with --nvproxy (it holds no device, so
    runsc would not turn nvproxy on by itself); on this driver-less host that is
    NvproxyUnavailableError, and no sandbox is left."""
    runtime, pause, _ = pod
    with pytest.raises(api.NvproxyUnavailableError, match="while creating container pod1") as e:
        await runtime.create("pod1", pause, nvproxy=True)
    argv = e.value.argv
    assert argv.index("--nvproxy") < argv.index("create")
    assert runsc_.list_ids(real_runsc, tmp_path / "root") == []
