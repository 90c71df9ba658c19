"""A sandbox's whole life through RunscDriver, the stand-in runsc and real runc containers.

The container "uses the GPU" by holding ``/dev/nvidia0`` (a (1,3) node: /dev/null) open,
and closes it when sent SIGUSR1 — the end of a CUDA workload, as the host sees it.
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from support import runc_bundle
from support.umask import current as umask_current
from support.umask import umask as umask_

from substrate_gpu.probes import fd_scan
from substrate_gpu.runsc import api, driver

pytestmark = [pytest.mark.anyio, pytest.mark.runc]

MakeDriver = Callable[..., driver.RunscDriver]

# Holds /dev/nvidia0 on fd 3 until SIGUSR1, then keeps running without it.
GPU_WORKLOAD = (
    "trap 'exec 3<&-' USR1; exec 3</dev/nvidia0; while true; do /bin/busybox sleep 0.05; done"
)


@pytest.fixture
def gpu_bundle(tmp_path: Path, runc_path: str) -> Path:
    """A busybox bundle whose process holds /dev/nvidia0 open until SIGUSR1."""
    return runc_bundle.make_busybox_bundle(
        tmp_path / "bundle",
        ["/bin/sh", "-c", GPU_WORKLOAD],
        devices=[runc_bundle.DeviceNode("/dev/nvidia0")],
        runc=runc_path,
    )


async def _status(runtime: driver.RunscDriver, cid: str) -> str:
    return (await runtime.state(cid)).status


async def _release_gpu(runtime: driver.RunscDriver, cid: str) -> None:
    """Ask the workload to close its device handle; wait until the host sees it closed."""
    await runtime.kill(cid, "USR1")
    probe = fd_scan.FdScanProbe()
    pid = (await runtime.state(cid)).pid
    with anyio.fail_after(5):
        while await probe.live_clients((pid,)):
            await anyio.sleep(0.02)


async def _running(runtime: driver.RunscDriver, cid: str, bundle: Path) -> None:
    await runtime.create(cid, bundle, nvproxy=True)
    assert await _status(runtime, cid) == "created"
    await runtime.start(cid)
    assert await _status(runtime, cid) == "running"
    # The workload has the device open before anything else happens.
    probe = fd_scan.FdScanProbe()
    pid = (await runtime.state(cid)).pid
    with anyio.fail_after(5):
        while not await probe.live_clients((pid,)):
            await anyio.sleep(0.02)


async def test_a_whole_life(
    make_driver: MakeDriver, runc_root: Path, gpu_bundle: Path, tmp_path: Path, argv_log
) -> None:
    """create → start → refused checkpoint (kept) → release → checkpoint → restore → delete."""
    runtime, cid = make_driver(), "actor-1"
    await _running(runtime, cid, gpu_bundle)

    with pytest.raises(api.LiveNvproxyClientsError, match="while checkpointing container"):
        await runtime.checkpoint(cid, tmp_path / "img-1", leave_running=True)
    assert await _status(runtime, cid) == "running"

    await _release_gpu(runtime, cid)
    image = tmp_path / "img-2"
    await runtime.checkpoint(cid, image, leave_running=False)
    assert (image / "checkpoint.img").is_file()
    assert await _status(runtime, cid) == "stopped"

    await runtime.delete(cid)
    await runtime.restore(cid, gpu_bundle, image, nvproxy=True)
    assert await _status(runtime, cid) == "running"

    await runtime.kill(cid, "KILL")
    with anyio.fail_after(5):
        while await _status(runtime, cid) != "stopped":
            await anyio.sleep(0.02)
    await runtime.delete(cid)
    with pytest.raises(api.ContainerNotFoundError):
        await runtime.state(cid)

    commands = [a for a in argv_log.entries() if "--root" in a]
    with_nvproxy = [_subcommand(a) for a in commands if "--nvproxy" in a]
    assert with_nvproxy == ["create", "restore"]
    assert {_subcommand(a) for a in commands} >= {
        "create",
        "start",
        "state",
        "checkpoint",
        "kill",
        "delete",
        "restore",
    }


def _subcommand(argv: list[str]) -> str:
    # Skip the binary, --root R and boolean/--flag=value global flags.
    i = 1
    while argv[i].startswith("-"):
        i += 2 if argv[i] == "--root" else 1
    return argv[i]


async def test_failed_checkpoint_without_leave_running_kills_the_sandbox(
    make_driver: MakeDriver, runc_root: Path, gpu_bundle: Path, tmp_path: Path
) -> None:
    """Live clients without --leave-running: the sandbox dies, and a retry is 'in state stopped'."""
    runtime, cid = make_driver(), "actor-2"
    await _running(runtime, cid, gpu_bundle)
    with pytest.raises(api.LiveNvproxyClientsError):
        await runtime.checkpoint(cid, tmp_path / "img-1", leave_running=False)
    assert await _status(runtime, cid) == "stopped"
    with pytest.raises(api.ContainerStoppedError, match="in state stopped"):
        await runtime.checkpoint(cid, tmp_path / "img-2", leave_running=True)


async def test_not_restorable_object_is_typed(
    make_driver: MakeDriver,
    runc_root: Path,
    gpu_bundle: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Newer gVisor's 'object handle … is not restorable' maps to NotRestorableError."""
    monkeypatch.setenv("RUNSC_STANDIN_LIVE_CLIENT_ERROR", "not-restorable")
    runtime, cid = make_driver(), "actor-3"
    await _running(runtime, cid, gpu_bundle)
    with pytest.raises(api.NotRestorableError, match="object handle"):
        await runtime.checkpoint(cid, tmp_path / "img", leave_running=True)
    assert await _status(runtime, cid) == "running"


async def test_restore_without_an_image_fails(
    make_driver: MakeDriver, runc_root: Path, gpu_bundle: Path, tmp_path: Path
) -> None:
    """Restoring from a directory with no checkpoint image is a RunscError, no container made."""
    runtime = make_driver()
    with pytest.raises(api.RunscError, match="while restoring container actor-4"):
        await runtime.restore("actor-4", gpu_bundle, tmp_path / "empty", nvproxy=True)
    with pytest.raises(api.ContainerNotFoundError):
        await runtime.state("actor-4")


async def test_cpu_sandbox_never_gets_nvproxy(
    make_driver: MakeDriver, runc_root: Path, tmp_path: Path, runc_path: str, argv_log
) -> None:
    """A CPU-only container is created without --nvproxy and checkpoints fine."""
    bundle = runc_bundle.make_busybox_bundle(
        tmp_path / "cpu", ["/bin/sleep", "1000"], runc=runc_path
    )
    runtime, cid = make_driver(), "cpu-1"
    await runtime.create(cid, bundle, nvproxy=False)
    await runtime.start(cid)
    await runtime.checkpoint(cid, tmp_path / "img", leave_running=True)
    assert await _status(runtime, cid) == "running"
    assert not any("--nvproxy" in a for a in argv_log.entries())


async def test_runsc_writes_the_checkpoint_image_private_under_umask_022(
    make_driver: MakeDriver, runc_root: Path, tmp_path: Path, runc_path: str
) -> None:
    """runsc's checkpoint runs under umask 077 of its own: the directory it makes is 0700 and
    its image 0600 (the stand-in creates them 0755 and 0644, as runsc does), while the
    agent's own umask stays 022."""
    bundle = runc_bundle.make_busybox_bundle(
        tmp_path / "cpu", ["/bin/sleep", "1000"], runc=runc_path
    )
    runtime, cid = make_driver(), "private-1"
    await runtime.create(cid, bundle, nvproxy=False)
    await runtime.start(cid)
    image = tmp_path / "img"
    with umask_(0o022):
        await runtime.checkpoint(cid, image, leave_running=True)
        assert umask_current() == 0o022
    assert stat.S_IMODE(image.stat().st_mode) == 0o700
    assert stat.S_IMODE((image / "checkpoint.img").stat().st_mode) == 0o600


async def test_starting_a_stopped_container_is_typed(
    make_driver: MakeDriver, runc_root: Path, tmp_path: Path, runc_path: str
) -> None:
    """Starting a container whose process has exited raises ContainerStoppedError."""
    bundle = runc_bundle.make_busybox_bundle(tmp_path / "cpu", ["/bin/true"], runc=runc_path)
    runtime, cid = make_driver(), "short-1"
    await runtime.create(cid, bundle, nvproxy=False)
    await runtime.start(cid)
    with anyio.fail_after(5):
        while await _status(runtime, cid) != "stopped":
            await anyio.sleep(0.02)
    with pytest.raises(api.ContainerStoppedError, match="while starting container short-1"):
        await runtime.start(cid)
