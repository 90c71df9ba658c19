"""A CPU actor's whole life through the Agent on real gVisor (runsc built by
scripts/build-runsc.sh, ``--platform=systrap --network=none``), and the GPU path's failure on
this GPU-less machine.

The actor's process counts in memory (a shell variable) and mirrors the count into a file in
its own tmpfs; after a checkpoint and a restore the count goes on from where it was, which
only a real memory image can do.
"""

from __future__ import annotations

import dataclasses
import json
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from support import real_runsc as runsc_
from support import runc_bundle
from support.umask import umask

from substrate_gpu import preflight
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.injection import toolkit
from substrate_gpu.injection.injector import WorkerGpuInjector
from substrate_gpu.lifecycle import Agent, events
from substrate_gpu.probes.fd_scan import FdScanProbe
from substrate_gpu.runsc import api, driver
from substrate_gpu.testing import node as node_

pytestmark = [pytest.mark.anyio]

COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done"


async def _no_gpu(bundle: Path) -> int:
    raise AssertionError(f"a CPU actor's bundle {bundle} must never be injected")


@dataclass
class Gvisor:
    """The real runsc behind a RunscDriver, with a root, checkpoint dir and bundles."""

    runsc: Path
    root: Path
    runtime: driver.RunscDriver
    tmp: Path

    def agent(self, **kwargs: object) -> Agent:
        options: dict[str, object] = {
            "runtime": self.runtime,
            "probe": FdScanProbe(),
            "injector": _no_gpu,
            "checkpoint_root": self.tmp / "checkpoints",
        }
        options.update(kwargs)
        return Agent(**options)  # type: ignore[arg-type]

    def counter_bundle(self, name: str = "bundle") -> Path:
        return runc_bundle.make_busybox_bundle(self.tmp / name, ["/bin/sh", "-c", COUNTER])

    async def count(self, actor_id: str) -> int:
        result = await self.runtime.exec(actor_id, ["/bin/cat", "/tmp/count"])
        assert result.returncode == 0, result.stderr
        return int(result.stdout.strip() or 0)

    def listed(self) -> list[str]:
        return runsc_.list_ids(self.runsc, self.root)


@pytest.fixture
def gvisor(real_runsc: Path, tmp_path: Path) -> Iterator[Gvisor]:
    """The real runsc on a fresh root; every container deleted at teardown."""
    root = tmp_path / "runsc-root"
    runtime = driver.RunscDriver(
        driver.RunscConfig(root=root, runsc=str(real_runsc), global_flags=runsc_.GLOBAL_FLAGS)
    )
    yield Gvisor(real_runsc, root, runtime, tmp_path)
    runsc_.delete_all(real_runsc, root)


async def _start(agent: Agent, actor_id: str, bundle: Path, *, gpu: bool = False) -> None:
    await agent.submit(events.ActorRegistered(actor_id=actor_id, gpu=gpu, bundle=str(bundle)))
    await agent.submit(events.BundlePrepared(actor_id=actor_id, bundle=str(bundle)))
    await agent.submit(events.RunRequested(actor_id=actor_id))


async def _count_reaches(gv: Gvisor, actor_id: str, at_least: int) -> int:
    with anyio.fail_after(20):
        while (n := await gv.count(actor_id)) < at_least:
            await anyio.sleep(0.05)
    return n


async def test_a_cpu_actor_lives_suspends_and_restores_with_its_memory(gvisor: Gvisor) -> None:
    """create → running → suspend (a real image) → restore → the count goes on → delete."""
    bundle = gvisor.counter_bundle()
    async with gvisor.agent() as agent:
        await _start(agent, "cpu-1", bundle)
        await agent.wait_for_state("cpu-1", "running", timeout=30)
        assert (await gvisor.runtime.state("cpu-1")).status == "running"
        before = await _count_reaches(gvisor, "cpu-1", 10)

        await agent.submit(events.SuspendRequested(actor_id="cpu-1"))
        await agent.wait_for_state("cpu-1", "suspended", timeout=30)
        view = agent.actor("cpu-1")
        assert view is not None and view.checkpoint is not None
        image = Path(view.checkpoint)
        assert {"checkpoint.img", "pages.img", preflight.MANIFEST_NAME} <= {
            p.name for p in image.iterdir()
        }
        assert (image / "pages.img").stat().st_size > 0
        assert gvisor.listed() == []  # suspended: no sandbox left behind

        await agent.submit(events.RestoreRequested(actor_id="cpu-1"))
        await agent.wait_for_state("cpu-1", "running", timeout=30)
        after = await gvisor.count("cpu-1")
        assert after >= before  # from the image's memory, not from zero
        assert await _count_reaches(gvisor, "cpu-1", after + 2) > after  # and it still counts

        await agent.submit(events.DeleteRequested(actor_id="cpu-1"))
        await agent.wait_for_state("cpu-1", "deleted", timeout=30)
    assert gvisor.listed() == []


async def test_every_checkpoint_records_where_it_was_taken(gvisor: Gvisor) -> None:
    """The manifest names the real runsc's version and this host's CPU flags; no GPUs."""
    async with gvisor.agent() as agent:
        await _start(agent, "m-1", gvisor.counter_bundle())
        await agent.wait_for_state("m-1", "running", timeout=30)
        await agent.submit(events.SuspendRequested(actor_id="m-1"))
        await agent.wait_for_state("m-1", "suspended", timeout=30)
        view = agent.actor("m-1")
        assert view is not None and view.checkpoint is not None
        manifest = preflight.read_manifest(Path(view.checkpoint))
    assert manifest is not None
    features = await gvisor.runtime.features()
    assert manifest.runsc_version == features.version
    assert manifest.cpu_flags == preflight.read_cpu_flags()
    assert (manifest.gpu_count, manifest.gpus, manifest.driver_version) == (0, (), "")


async def test_restore_onto_a_cpu_lacking_a_feature_is_refused_before_runsc(
    gvisor: Gvisor,
) -> None:
    """An image whose host had a flag this CPU lacks: restore_refused naming it, the actor
    stays suspended, and runsc never ran (no container)."""
    async with gvisor.agent() as agent, agent.subscribe() as transitions:
        await _start(agent, "cpu-2", gvisor.counter_bundle())
        await agent.wait_for_state("cpu-2", "running", timeout=30)
        await agent.submit(events.SuspendRequested(actor_id="cpu-2"))
        await agent.wait_for_state("cpu-2", "suspended", timeout=30)
        view = agent.actor("cpu-2")
        assert view is not None and view.checkpoint is not None
        path = Path(view.checkpoint) / preflight.MANIFEST_NAME
        raw = json.loads(path.read_text())
        raw["cpu_flags"] = sorted([*raw["cpu_flags"], "amx_tile", "avx512_fp16_test"])
        path.write_text(json.dumps(raw))

        await agent.submit(events.RestoreRequested(actor_id="cpu-2"))
        async for t in transitions:
            if t.trigger == "restore_refused":
                refused = t
                break
        assert refused.dest == "suspended"
        assert "avx512_fp16_test" in (refused.reason or "")
        assert agent.state_of("cpu-2") == "suspended"
    assert gvisor.listed() == []


class _OlderRunsc(driver.RunscDriver):
    """The real binary, driven as if it had no ``checkpoint --leave-running``."""

    async def features(self) -> api.RunscFeatures:
        return dataclasses.replace(await super().features(), leave_running=False)


@pytest.mark.parametrize("leave_running", [True, False], ids=["leave-running", "without"])
async def test_a_failing_checkpoint_leaves_actor_and_sandbox_where_runsc_says(
    gvisor: Gvisor, leave_running: bool, require_root: None
) -> None:
    """An image directory runsc cannot write in (a read-only mount): checkpoint_failed; the
    actor is running exactly when runsc says its sandbox is, and nothing is lost."""
    runtime = gvisor.runtime if leave_running else _OlderRunsc(gvisor.runtime.config)
    image = gvisor.tmp / "read-only"
    image.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(image)], check=True)
    try:
        async with gvisor.agent(runtime=runtime) as agent:
            async with agent.subscribe() as transitions:
                await _start(agent, "f-1", gvisor.counter_bundle())
                await agent.wait_for_state("f-1", "running", timeout=30)
                await agent.submit(events.SuspendRequested(actor_id="f-1", image_path=str(image)))
                async for t in transitions:
                    if t.trigger in {"checkpoint_failed", "checkpoint_written"}:
                        outcome = t
                        break
            assert outcome.trigger == "checkpoint_failed"
            assert "creating checkpoint state file" in (outcome.reason or "")
            status = (await gvisor.runtime.state("f-1")).status
            assert agent.state_of("f-1") == ("running" if status == "running" else "stopped")
            assert status == "running"  # runsc failed before touching the sandbox
            await agent.submit(events.DeleteRequested(actor_id="f-1"))
            await agent.wait_for_state("f-1", "deleted", timeout=30)
    finally:
        subprocess.run(["umount", str(image)], check=True)
    assert gvisor.listed() == []


async def test_a_real_checkpoint_image_is_private_under_umask_022(gvisor: Gvisor) -> None:
    """The image is the sandbox's memory: under the usual umask, every directory made for it
    is 0700 and every file runsc (and the agent) wrote in it 0600."""
    with umask(0o022):
        async with gvisor.agent() as agent:
            await _start(agent, "p-1", gvisor.counter_bundle())
            await agent.wait_for_state("p-1", "running", timeout=30)
            await agent.submit(events.SuspendRequested(actor_id="p-1"))
            await agent.wait_for_state("p-1", "suspended", timeout=30)
            view = agent.actor("p-1")
            await agent.submit(events.DeleteRequested(actor_id="p-1"))
            await agent.wait_for_state("p-1", "deleted", timeout=30)
    assert view is not None and view.checkpoint is not None
    image = Path(view.checkpoint)
    made = [image, image.parent, image.parent.parent]  # <root>/<actor>/<seq>
    assert [_mode(d) for d in made] == [0o700] * 3
    files = {p.name: _mode(p) for p in image.iterdir()}
    assert {"checkpoint.img", "pages.img", preflight.MANIFEST_NAME} <= set(files)
    assert set(files.values()) == {0o600}, files


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_good_checkpoint_without_leave_running_suspends(gvisor: Gvisor) -> None:
    """Driven without --leave-running, the checkpoint stops the sandbox and the actor is
    suspended with its image; restore brings it back."""
    async with gvisor.agent(runtime=_OlderRunsc(gvisor.runtime.config)) as agent:
        await _start(agent, "n-1", gvisor.counter_bundle())
        await agent.wait_for_state("n-1", "running", timeout=30)
        await agent.submit(events.SuspendRequested(actor_id="n-1"))
        await agent.wait_for_state("n-1", "suspended", timeout=30)
        assert gvisor.listed() == []
        await agent.submit(events.RestoreRequested(actor_id="n-1"))
        await agent.wait_for_state("n-1", "running", timeout=30)
        await agent.submit(events.DeleteRequested(actor_id="n-1"))
        await agent.wait_for_state("n-1", "deleted", timeout=30)
    assert gvisor.listed() == []


async def test_a_gpu_actor_on_a_gpu_less_host_fails_with_nvproxy_unavailable(
    gvisor: Gvisor, tmp_path: Path, require_root: None
) -> None:
    """GPUs injected into the bundle, then ``runsc --nvproxy create``: real runsc cannot find
    the NVIDIA driver; the actor ends failed with that reason (never stuck in creating) and
    no sandbox is left."""
    node = node_.build_node(tmp_path / "node", gpus=(0,))
    generation = toolkit.ToolkitConfig.from_env(
        {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "NVIDIA_CTK_STANDIN_SYSTEM_ROOT": str(node.root),
            toolkit.ENV_DRIVER_ROOT: str(node.driver_root),
        },
        output_dir=tmp_path / "cdi",
        toolkit_dir=node.toolkit_dir,
    )
    injector = WorkerGpuInjector(
        generator=toolkit.CdiSpecGenerator(generation),
        options=bundle_.InjectionOptions(
            driver_root=str(node.driver_root), dev_root=node.root, toolkit_dir=node.toolkit_dir
        ),
    )
    bundle = runc_bundle.make_busybox_bundle(tmp_path / "gpu-bundle", ["/bin/sleep", "100"])
    async with gvisor.agent(injector=injector) as agent:
        await _start(agent, "gpu-1", bundle, gpu=True)
        await agent.wait_for_state("gpu-1", "failed", timeout=60)
        view = agent.actor("gpu-1")
    assert view is not None
    assert "failed to get Nvidia driver version" in (view.reason or "")
    spec = json.loads((bundle / "config.json").read_text())
    assert any(d["path"] == "/dev/nvidia0" for d in spec["linux"]["devices"])  # injected
    assert gvisor.listed() == []
    with pytest.raises(api.NvproxyUnavailableError):
        await gvisor.runtime.create("gpu-2", bundle, nvproxy=True)
