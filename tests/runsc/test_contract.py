"""Contract: the same scenarios against the stand-in runsc and the real one (gVisor), which
must agree on what substrate-gpu reads — exit statuses, ``state`` JSON fields, error classes.

Every error text the classifier relies on is provoked here from the real binary; the
stand-in must produce the same class (its messages were copied from these runs). GPU paths
cannot be compared here (no driver): see tests/standins/README.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from runsc.conftest import STANDIN
from support import real_runsc, runc_bundle

from substrate_gpu.runsc import api, driver

pytestmark = [pytest.mark.anyio]

SLEEPER = ["/bin/sleep", "1000"]


@dataclass
class Runtime:
    """One runsc under test, with a fresh root and a bundle maker."""

    kind: str
    driver: driver.RunscDriver
    tmp: Path
    runc: str

    def bundle(self, name: str, args: list[str] | None = None) -> Path:
        return runc_bundle.make_busybox_bundle(self.tmp / name, args or SLEEPER, runc=self.runc)

    async def running(self, cid: str) -> Path:
        bundle = self.bundle(f"b-{cid}")
        await self.driver.create(cid, bundle, nvproxy=False)
        await self.driver.start(cid)
        return bundle

    async def stopped(self, cid: str) -> None:
        await self.running(cid)
        await self.driver.kill(cid, "KILL")
        with anyio.fail_after(10):
            while (await self.driver.state(cid)).status != "stopped":
                await anyio.sleep(0.05)


@pytest.fixture(params=["standin", "real"])
def runtime(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    runc_path: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Runtime]:
    """The stand-in (over runc) or real runsc (gVisor, systrap), each on its own root."""
    root = tmp_path / "root"
    if request.param == "real":
        binary = str(request.getfixturevalue("real_runsc"))
        flags = real_runsc.GLOBAL_FLAGS
    else:
        monkeypatch.setenv("RUNSC_STANDIN_RUNC", runc_path)
        binary, flags = str(STANDIN), ()
    config = driver.RunscConfig(root=root, runsc=binary, global_flags=flags)
    yield Runtime(request.param, driver.RunscDriver(config), tmp_path, runc_path)
    if request.param == "real":
        real_runsc.delete_all(Path(binary), root)
    else:
        runc_bundle.delete_all(root, runc=runc_path)


async def test_state_reports_id_status_pid_and_bundle(runtime: Runtime) -> None:
    """created → running → stopped, with the fields the lifecycle reads."""
    bundle = runtime.bundle("b")
    await runtime.driver.create("s1", bundle, nvproxy=False)
    created = await runtime.driver.state("s1")
    assert (created.id, created.status, created.bundle) == ("s1", "created", str(bundle))
    assert created.pid > 0
    await runtime.driver.start("s1")
    assert (await runtime.driver.state("s1")).status == "running"
    await runtime.driver.kill("s1", "KILL")
    with anyio.fail_after(10):
        while (await runtime.driver.state("s1")).status != "stopped":
            await anyio.sleep(0.05)


async def test_an_unknown_container_is_not_found(runtime: Runtime) -> None:
    """state of an id runsc never saw: ContainerNotFoundError, exit status 128."""
    with pytest.raises(api.ContainerNotFoundError) as info:
        await runtime.driver.state("ghost")
    assert info.value.returncode == 128


async def test_force_deleting_an_unknown_container_succeeds(runtime: Runtime) -> None:
    """delete --force of an id runsc never saw is not an error (recovery relies on it)."""
    await runtime.driver.delete("ghost", force=True)


async def test_creating_an_existing_id_is_typed(runtime: Runtime) -> None:
    """A second create under the same id: ContainerExistsError."""
    await runtime.running("dup")
    with pytest.raises(api.ContainerExistsError, match="while creating container dup"):
        await runtime.driver.create("dup", runtime.bundle("b2"), nvproxy=False)


async def test_a_bundle_without_config_json_is_typed(runtime: Runtime) -> None:
    """create from a directory without config.json: BundleError, nothing created."""
    empty = runtime.tmp / "empty-bundle"
    empty.mkdir()
    with pytest.raises(api.BundleError, match="config.json"):
        await runtime.driver.create("nob", empty, nvproxy=False)
    with pytest.raises(api.ContainerNotFoundError):
        await runtime.driver.state("nob")


async def test_restore_from_a_missing_image_is_typed(runtime: Runtime) -> None:
    """restore from a directory without checkpoint.img: CheckpointImageError, no container."""
    with pytest.raises(api.CheckpointImageError, match="checkpoint.img"):
        await runtime.driver.restore(
            "r1", runtime.bundle("b"), runtime.tmp / "no-image", nvproxy=False
        )
    with pytest.raises(api.ContainerNotFoundError):
        await runtime.driver.state("r1")


async def test_checkpoint_into_an_existing_image_fails_and_the_sandbox_runs_on(
    runtime: Runtime,
) -> None:
    """checkpoint.img is created O_EXCL: a second checkpoint into the same directory is a
    CheckpointImageError; with --leave-running the sandbox keeps running."""
    await runtime.running("c1")
    image = runtime.tmp / "img"
    await runtime.driver.checkpoint("c1", image, leave_running=True)
    with pytest.raises(api.CheckpointImageError, match="file exists"):
        await runtime.driver.checkpoint("c1", image, leave_running=True)
    assert (await runtime.driver.state("c1")).status == "running"


async def test_checkpoint_into_an_unwritable_path_is_typed(runtime: Runtime) -> None:
    """An image path under a regular file cannot be made: CheckpointImageError."""
    await runtime.running("c2")
    blocker = runtime.tmp / "a-file"
    blocker.write_text("")
    with pytest.raises(api.CheckpointImageError, match="not a directory"):
        await runtime.driver.checkpoint("c2", blocker / "img", leave_running=True)
    assert (await runtime.driver.state("c2")).status == "running"


async def test_checkpoint_of_a_stopped_container_is_typed(runtime: Runtime) -> None:
    """checkpoint after the sandbox stopped: ContainerStoppedError ('in state stopped')."""
    await runtime.stopped("c3")
    with pytest.raises(api.ContainerStoppedError, match="in state stopped"):
        await runtime.driver.checkpoint("c3", runtime.tmp / "img3", leave_running=True)


async def test_starting_a_running_container_is_a_wrong_state(runtime: Runtime) -> None:
    """start of a running container: WrongStateError (not 'stopped')."""
    await runtime.running("c4")
    with pytest.raises(api.WrongStateError, match="in state running") as info:
        await runtime.driver.start("c4")
    assert not isinstance(info.value, api.ContainerStoppedError)


async def test_checkpoint_without_leave_running_stops_the_sandbox(runtime: Runtime) -> None:
    """A good checkpoint without --leave-running writes the image and the sandbox stops."""
    await runtime.running("c5")
    image = runtime.tmp / "img5"
    await runtime.driver.checkpoint("c5", image, leave_running=False)
    assert (image / "checkpoint.img").is_file()
    with anyio.fail_after(10):
        while (await runtime.driver.state("c5")).status != "stopped":
            await anyio.sleep(0.05)
