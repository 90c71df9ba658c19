"""A GPU sandbox actor (``_pause`` + two app containers) on the runsc stand-in over real runc,
with the real injector on a simulated GPU node (issue 23): ``--nvproxy`` on ``_pause``'s
create and on every restore, the GPUs injected into every app container's bundle while
``_pause``'s config.json stays byte-identical, nothing left under the actor's root."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support import runc_bundle

from substrate_gpu.lifecycle import Agent, events, sandbox
from substrate_gpu.runsc import api
from substrate_gpu.testing import bundles

pytestmark = [pytest.mark.anyio, pytest.mark.runc]

APPS = ("app", "side")
VERBS = ("create", "start", "restore", "checkpoint", "delete")


def _sandbox_bundles(directory: Path) -> Path:
    """Every container sleeps; the bundles carry the CRI annotations, as atelet writes them."""
    for name in ("_pause", *APPS):
        bundles.make_bundle(
            directory / name,
            ["sh", "-c", "while true; do sleep 1; done"],
            env=["PATH=/bin"],
            annotations=sandbox.cri_annotations(name),
        )
    return directory


def _devices(bundle: Path) -> list[str]:
    config = json.loads((bundle / "config.json").read_text())
    return sorted(d["path"] for d in config.get("linux", {}).get("devices", []))


def _on_actor_root(world, actor_id: str) -> list[list[str]]:  # type: ignore[no-untyped-def]
    """The stand-in's command lines under ``<root>/<actor_id>`` (program name dropped)."""
    actor_root = str(world.runtime.config.root / actor_id)
    return [c for c in world.runsc_commands() if c[1:2] == [actor_root] and set(c) & set(VERBS)]


def _verb_and_id(command: list[str]) -> tuple[str, ...]:
    """(subcommand, [--nvproxy,] container id) of one command line."""
    verb = next(a for a in command if a in VERBS)
    return (verb, *(["--nvproxy"] if "--nvproxy" in command else []), command[-1])


async def test_a_gpu_sandbox_runs_suspends_restores_and_is_deleted(world, tmp_path, runc_path):  # type: ignore[no-untyped-def]
    """The whole life of a GPU sandbox on the stand-in, command by command."""
    bundle = _sandbox_bundles(tmp_path / "s")
    pause_before = (bundle / "_pause" / "config.json").read_bytes()
    agent = Agent(
        runtime=world.runtime,
        probe=world.probe,
        injector=world.injector,
        checkpoint_root=world.checkpoints,
    )
    try:
        async with agent:
            await agent.submit(
                events.ActorRegistered(actor_id="s", gpu=True, bundle=str(bundle), containers=APPS)
            )
            await agent.submit(events.BundlePrepared(actor_id="s", bundle=str(bundle)))
            await agent.submit(events.RunRequested(actor_id="s"))
            await agent.wait_for_state("s", "running", timeout=60)
            ran = [_verb_and_id(c) for c in _on_actor_root(world, "s")]
            for name in APPS:
                assert "/dev/nvidia0" in _devices(bundle / name), name
            assert _devices(bundle / "_pause") == []
            await agent.submit(events.SuspendRequested(actor_id="s"))
            await agent.wait_for_state("s", "suspended", timeout=60)
            image = Path(str(agent.actor("s").checkpoint))  # type: ignore[union-attr]
            await agent.submit(events.RestoreRequested(actor_id="s"))
            await agent.wait_for_state("s", "running", timeout=60)
            await agent.submit(events.DeleteRequested(actor_id="s"))
            await agent.wait_for_state("s", "deleted", timeout=60)
    finally:
        runc_bundle.delete_all(world.runtime.config.root / "s", runc=runc_path)
    assert ran == [
        ("create", "--nvproxy", "_pause"),
        ("start", "_pause"),
        ("create", "--nvproxy", "app"),
        ("create", "--nvproxy", "side"),
        ("start", "app"),
        ("start", "side"),
    ]
    every = [_verb_and_id(c) for c in _on_actor_root(world, "s")]
    assert [c for c in every if c[0] == "checkpoint"] == [("checkpoint", "_pause")]
    assert [c for c in every if c[0] == "restore"] == [
        ("restore", "--nvproxy", n) for n in ("_pause", *APPS)
    ]
    # The stand-in's image is the whole sandbox's: the apps went with _pause.
    record = json.loads((image / "checkpoint.img").read_text())
    assert (record["id"], record["containers"]) == ("_pause", list(APPS))
    assert (bundle / "_pause" / "config.json").read_bytes() == pause_before
    listed = subprocess.run(
        [runc_path, "--root", str(world.runtime.config.root / "s"), "list", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert listed.stdout.split() == []
    # Nothing under the worker's shared root, either.
    assert [c for c in world.runsc_commands() if c[1:2] == [str(world.runtime.config.root)]] == []


async def test_a_gpu_container_joining_a_sandbox_booted_without_nvproxy_crashes_it(
    world, tmp_path, runc_path
):  # type: ignore[no-untyped-def]
    """The pitfall --nvproxy on _pause's create avoids, as the stand-in reproduces it."""
    bundle = _sandbox_bundles(tmp_path / "s")
    await world.injector(bundle / "app")
    runtime = world.runtime.for_actor("x")
    try:
        await runtime.create("_pause", bundle / "_pause", nvproxy=False)
        await runtime.start("_pause")
        with pytest.raises(api.RunscError, match="booted without nvproxy"):
            await runtime.create("app", bundle / "app", nvproxy=True)
        assert (await runtime.state("_pause")).status == "stopped"
    finally:
        runc_bundle.delete_all(world.runtime.config.root / "x", runc=runc_path)
