"""The demo's CpuOnGvisor runtime: a CPU actor's checkpoint manifest names the runsc that
wrote its image (the gVisor build), not the stand-in that serves the GPU actors."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest
from support import real_runsc as runsc_
from support import runc_bundle

from substrate_gpu import exceptions, preflight
from substrate_gpu.lifecycle import Agent, events
from substrate_gpu.probes.fd_scan import FdScanProbe
from substrate_gpu.runsc import driver
from substrate_gpu.testing import demo
from substrate_gpu.testing import node as node_

pytestmark = [pytest.mark.anyio, pytest.mark.runc]

FAKE_GVISOR_VERSION = "release-20990101.0-fake-gvisor"


async def _no_gpu(bundle: Path) -> int:
    raise AssertionError(f"a CPU actor's bundle {bundle} must never be injected")


def _fake_gvisor(directory: Path) -> Path:
    """A second runsc stand-in that says it is another build (the real one, absent here)."""
    standin = node_.install_runsc_standin(directory / "standin")
    script = directory / "gvisor-runsc"
    script.write_text(
        f'#!/bin/sh\nRUNSC_STANDIN_VERSION={FAKE_GVISOR_VERSION} exec {standin} "$@"\n'
    )
    script.chmod(0o755)
    return script


def _version(runsc: Path) -> str:
    return subprocess.run(
        [str(runsc), "--version"], capture_output=True, text=True, check=True
    ).stdout.split("\n", 1)[0]


async def _suspended_cpu_actor_manifest(
    tmp_path: Path, gvisor: Path, global_flags: tuple[str, ...]
) -> preflight.CheckpointManifest:
    standin = driver.RunscConfig(
        root=tmp_path / "standin-root",
        runsc=str(node_.install_runsc_standin(tmp_path / "toolkit")),
    )
    runtime = demo.CpuOnGvisor(
        standin,
        driver.RunscConfig(
            root=tmp_path / "gvisor-root", runsc=str(gvisor), global_flags=global_flags
        ),
    )
    bundle = runc_bundle.make_busybox_bundle(tmp_path / "bundle", ["/bin/sleep", "1000"])
    checkpoints = tmp_path / "checkpoints"
    try:
        async with Agent(
            runtime=runtime, probe=FdScanProbe(), injector=_no_gpu, checkpoint_root=checkpoints
        ) as agent:
            await agent.submit(
                events.ActorRegistered(actor_id="cpu", gpu=False, bundle=str(bundle))
            )
            await agent.submit(events.BundlePrepared(actor_id="cpu", bundle=str(bundle)))
            await agent.submit(events.RunRequested(actor_id="cpu"))
            await agent.wait_for_state("cpu", "running", timeout=60)
            await agent.submit(events.SuspendRequested(actor_id="cpu"))
            await agent.wait_for_state("cpu", "suspended", timeout=60)
    finally:
        with contextlib.suppress(exceptions.SubstrateGpuError):
            await runtime.delete("cpu", force=True)
    (image,) = list((checkpoints / "cpu").iterdir())
    manifest = preflight.read_manifest(image)
    assert manifest is not None
    return manifest


async def test_a_cpu_checkpoint_records_the_gvisor_builds_version(
    tmp_path: Path, runc_path: str
) -> None:
    """With a gVisor build that is not the stand-in (a fake one here), the CPU actor's
    manifest records that build's ``runsc --version``."""
    gvisor = _fake_gvisor(tmp_path)
    manifest = await _suspended_cpu_actor_manifest(tmp_path, gvisor, ())
    assert manifest.runsc_version == f"runsc version {FAKE_GVISOR_VERSION}"
    assert manifest.runsc_version != _version(node_.install_runsc_standin(tmp_path / "other"))


async def test_a_real_gvisor_checkpoint_records_the_real_version(
    tmp_path: Path, real_runsc: Path
) -> None:
    """On real gVisor (scripts/build-runsc.sh): the manifest names the real build."""
    try:
        manifest = await _suspended_cpu_actor_manifest(tmp_path, real_runsc, demo.GVISOR_FLAGS)
    finally:
        runsc_.delete_all(real_runsc, tmp_path / "gvisor-root")  # and its null-netns mount
    assert manifest.runsc_version == _version(real_runsc)
    assert manifest.runsc_version != _version(node_.install_runsc_standin(tmp_path / "other"))
