"""``substrate-gpu demo``: a simulated GPU node running actors through their whole life.

What runs is the production path end to end: the standalone agent's service
(:mod:`substrate_gpu.service`: the event log, the lifecycle Agent, acknowledgements), the
runsc driver, the fd-scanning CUDA probe, and the worker's GPU injector generating its CDI
spec with the toolkit stand-in (toolkit-1.20-shaped) on a simulated node: char device
nodes that a workload can really hold open, real ELF driver libraries.

The runtime is chosen, and said:

- **root, runc and real runsc built here** (``scripts/build-runsc.sh``, or
  ``$SUBSTRATE_GPU_RUNSC``): the CPU actor runs in **real gVisor** (``--platform=systrap
  --network=none``), real checkpoint and restore included (:class:`CpuOnGvisor`); the GPU
  actors stay on the stand-in below (no NVIDIA driver here: nvproxy cannot start), labelled.
- **root and runc present**: the runsc driver drives the runsc stand-in
  (:mod:`substrate_gpu.testing.runsc`, installed as a ``runsc`` script on the node),
  which runs every sandbox as a real runc container and fails a checkpoint exactly as
  gVisor does while a GPU handle is open. A GPU workload holds ``/dev/nvidia0`` open until
  told to let go: the fd probe sees it in ``/proc``.
- **otherwise**: :class:`~substrate_gpu.testing.sandboxes.SimulatedSandboxes`, an in-process
  model of runsc (and of the workload's GPU handle) with the same failure modes, because runc
  needs root. Everything above the runtime (injection into real bundle files, the machine,
  the log) is unchanged.

The demo's actors: ``gpu-trainer`` (holds a CUDA context: its suspend is refused, then
accepted once the context closes, then it is restored and deleted), ``gpu-notebook`` (a GPU
actor between workloads: suspended and restored straight away) and ``cpu-sandbox`` (no GPU:
injection is skipped). The event log is left behind and replayed: the replayed final states
must equal the live ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import anyio
import anyio.abc

from substrate_gpu import eventlog, exceptions
from substrate_gpu._log import get_logger
from substrate_gpu.injection import toolkit
from substrate_gpu.lifecycle import Agent, Transition, events
from substrate_gpu.probes.api import CudaContextProbe, GpuClient
from substrate_gpu.probes.fd_scan import FdScanProbe
from substrate_gpu.runsc import api as runsc
from substrate_gpu.runsc import driver
from substrate_gpu.service import (
    AgentConfig,
    AgentService,
    Components,
    running_agent,
    server,
    wiring,
)
from substrate_gpu.testing import bundles, sandboxes
from substrate_gpu.testing import node as node_

RELEASE_FILE: Final = "/tmp/release"  # noqa: S108  (a path inside the actor's rootfs)

#: Holds ``/dev/nvidia0`` open (a live CUDA client) until the release file appears.
HOLDING_WORKLOAD: Final = f"""
exec 3</dev/nvidia0
while [ ! -e {RELEASE_FILE} ]; do sleep 0.05; done
exec 3<&-
while true; do sleep 1; done
"""
IDLE_WORKLOAD: Final = "while true; do sleep 1; done"

#: What a GPU actor sees of its injected GPU (run inside the sandbox with ``runsc exec``).
ACTOR_VIEW: Final = r"""
echo "devices: $(ls /dev | grep nvidia | tr '\n' ' ')"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
echo "NVIDIA_VISIBLE_DEVICES=${{NVIDIA_VISIBLE_DEVICES:-(unset)}}"
echo "{lib64}/libcuda.so.1 -> $(readlink {lib64}/libcuda.so.1)"
"""

WAIT_S: Final = 30.0

log = get_logger(__name__)


@dataclass(frozen=True)
class DemoResult:
    """What the demo did, for tests and the summary."""

    workdir: Path
    """Where the node, bundles, log and checkpoints are."""
    runtime: str
    """``runc`` (runsc stand-in over real runc) or ``simulated`` (in-process)."""
    event_log: Path
    """The event log the run left behind."""
    final_states: Mapping[str, str]
    """Every actor's state when the demo ended."""
    replayed_states: Mapping[str, str]
    """The same, rebuilt by replaying the event log."""
    refusals: tuple[Transition, ...]
    """The suspend attempts refused because a CUDA context was live."""
    transitions: tuple[Transition, ...] = field(default=(), repr=False)
    """Every transition, in order."""


# --- the node and its runtime ---------------------------------------------------------------


@dataclass(frozen=True)
class DemoNode:
    """A simulated node wired for an agent."""

    node: node_.SimulatedNode
    components: Components
    runtime: str
    """``gvisor`` (CPU actor in real gVisor, GPU actors on the stand-in), ``runc`` or
    ``simulated``."""
    runtime_detail: str
    """Which runtime, and why (printed)."""
    config: AgentConfig


#: Global flags for real runsc here (docs/runsc.md, "Flags on this machine").
GVISOR_FLAGS: Final = ("--platform=systrap", "--network=none")


def find_built_runsc() -> Path | None:
    """Real runsc: ``$SUBSTRATE_GPU_RUNSC``, else the newest build in the cache of
    ``scripts/build-runsc.sh`` (one with its recorded sha256), else None."""
    override = os.environ.get("SUBSTRATE_GPU_RUNSC")
    if override:
        path = Path(override)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    cache = Path(os.environ.get("SUBSTRATE_GPU_CACHE", "/var/cache/substrate-gpu")) / "runsc"
    built = sorted(
        (p for p in cache.glob("*/runsc") if (p.parent / "runsc.sha256").is_file()),
        key=lambda p: p.stat().st_mtime,
    )
    return built[-1] if built and os.access(built[-1], os.X_OK) else None


class CpuOnGvisor(driver.RunscDriver):
    """The demo's runtime with real runsc at hand: a sandbox created or restored without
    ``--nvproxy`` (a CPU actor) runs in real gVisor; GPU sandboxes go to the stand-in this
    driver was built for. Every later command follows the sandbox to where it lives.

    ``features()`` and the driver list are the stand-in's (they serve the GPU paths);
    ``sandbox_features`` answers for the runsc a sandbox lives in, so a CPU checkpoint's
    manifest records the real build's version and a GPU one the stand-in's."""

    def __init__(self, standin: driver.RunscConfig, gvisor: driver.RunscConfig) -> None:
        super().__init__(standin)
        self.gvisor = driver.RunscDriver(gvisor)
        self.in_gvisor: set[str] = set()
        """Container ids living in real gVisor."""

    async def create(self, container_id: str, bundle: Path, *, nvproxy: bool) -> None:
        if nvproxy:
            return await super().create(container_id, bundle, nvproxy=True)
        self.in_gvisor.add(container_id)
        return await self.gvisor.create(container_id, bundle, nvproxy=False)

    async def restore(
        self, container_id: str, bundle: Path, image_path: Path, *, nvproxy: bool
    ) -> None:
        if nvproxy:
            return await super().restore(container_id, bundle, image_path, nvproxy=True)
        self.in_gvisor.add(container_id)
        return await self.gvisor.restore(container_id, bundle, image_path, nvproxy=False)

    async def sandbox_features(self, container_id: str) -> runsc.RunscFeatures:
        if container_id in self.in_gvisor:
            return await self.gvisor.features()
        return await self.features()

    async def start(self, container_id: str) -> None:
        if container_id in self.in_gvisor:
            return await self.gvisor.start(container_id)
        return await super().start(container_id)

    async def checkpoint(
        self,
        container_id: str,
        image_path: Path,
        *,
        leave_running: bool,
        cuda_checkpoint_path: Path | None = None,
        cuda_checkpoint_sequential: bool = False,
    ) -> None:
        if container_id in self.in_gvisor:
            return await self.gvisor.checkpoint(
                container_id, image_path, leave_running=leave_running
            )
        return await super().checkpoint(
            container_id,
            image_path,
            leave_running=leave_running,
            cuda_checkpoint_path=cuda_checkpoint_path,
            cuda_checkpoint_sequential=cuda_checkpoint_sequential,
        )

    async def state(self, container_id: str) -> runsc.ContainerState:
        if container_id in self.in_gvisor:
            return await self.gvisor.state(container_id)
        return await super().state(container_id)

    async def kill(self, container_id: str, signal: str = "KILL") -> None:
        if container_id in self.in_gvisor:
            return await self.gvisor.kill(container_id, signal)
        return await super().kill(container_id, signal)

    async def delete(self, container_id: str, *, force: bool = False) -> None:
        if container_id in self.in_gvisor:
            return await self.gvisor.delete(container_id, force=force)
        return await super().delete(container_id, force=force)


def choose_runtime() -> tuple[str | None, str]:
    """(runc path or None, what is used and why)."""
    runc = shutil.which("runc")
    if runc is None:
        return None, "in-process simulated runsc (runc is not installed)"
    if os.geteuid() != 0:
        return None, "in-process simulated runsc (not running as root: runc needs root)"
    try:
        bundles.find_busybox()
    except exceptions.ConfigError:
        return None, "in-process simulated runsc (no static busybox for the actors' rootfs)"
    version = subprocess.run(
        [runc, "--version"], capture_output=True, text=True, check=False
    ).stdout.split("\n", 1)[0]
    return runc, f"runsc driver -> runsc stand-in -> real runc ({version})"


def build_demo_node(
    workdir: Path, *, metrics_host: str = "127.0.0.1", metrics_port: int = 0
) -> DemoNode:
    """The simulated node, its runtime, and the agent configuration for it under ``workdir``."""
    sim = node_.build_node(workdir / "node", gpus=(0,), openable_devices=True)
    runc, detail = choose_runtime()
    env = {
        "NVIDIA_CTK_STANDIN_SYSTEM_ROOT": str(sim.root),
        toolkit.ENV_DRIVER_ROOT: str(sim.driver_root),
    }
    config = AgentConfig(
        event_log=workdir / "events.jsonl",
        metrics_host=metrics_host,
        metrics_port=metrics_port,
        runsc=str(node_.install_runsc_standin(sim.toolkit_dir)),
        runsc_root=workdir / "runsc-root",
        driver_root=sim.driver_root,
        toolkit_dir=sim.toolkit_dir,
        cdi_output_dir=workdir / "cdi",
        dev_root=sim.root,
        checkpoint_root=workdir / "checkpoints",
        drain_timeout=10.0,
        extra_env=tuple(env.items()),
    )
    injector = wiring.build_injector(config)
    runtime: runsc.SandboxRuntime
    probe: CudaContextProbe
    gvisor = find_built_runsc() if runc is not None else None
    if runc is not None:
        config.runsc_root.mkdir(parents=True, exist_ok=True)
        timeouts = driver.Timeouts(
            create=30, start=15, checkpoint=30, restore=30, state=10, delete=20
        )
        standin = driver.RunscConfig(root=config.runsc_root, runsc=config.runsc, timeouts=timeouts)
        if gvisor is not None:
            runtime = CpuOnGvisor(
                standin,
                driver.RunscConfig(
                    root=workdir / "gvisor-root",
                    runsc=str(gvisor),
                    global_flags=GVISOR_FLAGS,
                    timeouts=timeouts,
                ),
            )
            kind = "gvisor"
            version = subprocess.run(
                [str(gvisor), "--version"], capture_output=True, text=True, check=False
            ).stdout.split("\n", 1)[0]
            detail = (
                f"CPU actor: REAL gVisor ({version}, {' '.join(GVISOR_FLAGS)}), real "
                f"checkpoint/restore; GPU actors: {detail} (no GPU here: stand-in)"
            )
        else:
            runtime = driver.RunscDriver(standin)
            kind = "runc"
        probe = FdScanProbe()
    else:
        simulated = sandboxes.SimulatedSandboxes()
        runtime, probe, kind = simulated, simulated, "simulated"
    return DemoNode(
        node=sim,
        components=Components(runtime=runtime, probe=probe, injector=injector),
        runtime=kind,
        runtime_detail=detail,
        config=config,
    )


def actor_bundle(directory: Path, *, holds_gpu: bool) -> Path:
    """A busybox bundle (or, without busybox, a bare one for the simulated runtime)."""
    script = HOLDING_WORKLOAD if holds_gpu else IDLE_WORKLOAD
    annotations = {sandboxes.HOLDS_GPU_UNTIL: RELEASE_FILE} if holds_gpu else None
    try:
        return bundles.make_bundle(
            directory, ["sh", "-c", script], env=["PATH=/bin"], annotations=annotations
        )
    except exceptions.ConfigError:
        # No busybox: only the simulated runtime runs here, and it reads just the config.
        (directory / "rootfs" / "tmp").mkdir(parents=True, exist_ok=True)
        config = bundles.runc_spec()
        config["annotations"] = dict(annotations or {})
        (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        return directory


# --- the scripted lives ---------------------------------------------------------------------


class Script:
    """Submits events through the agent's service, as a client would (acks checked)."""

    def __init__(
        self,
        service: AgentService,
        components: Components,
        *,
        lib64: Path | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.service = service
        self.agent: Agent = service.agent
        self._components = components
        self._lib64 = lib64
        self._say = say

    async def send(self, event: events.Event) -> dict[str, object]:
        """Submit; the parsed acknowledgement (an error response raises)."""
        response: dict[str, object] = json.loads(await self.service.answer(event))
        if response.get("ok") is not True:
            raise exceptions.SubstrateGpuError(
                f"while running the demo: the agent refused {event.type} for "
                f"{event.actor_id}: {response.get('error')}"
            )
        return response

    async def show_actor_view(self, actor_id: str) -> None:
        """Print what the actor sees inside its sandbox (``runsc exec``; runc runtime only)."""
        runtime = self._components.runtime
        if self._say is None or self._lib64 is None or not isinstance(runtime, driver.RunscDriver):
            return
        script = ACTOR_VIEW.format(lib64=self._lib64)
        try:
            result = await runtime.exec(actor_id, ["sh", "-c", script], timeout=15)
        except runsc.RunscError as e:
            self._say(f"  (could not look inside {actor_id}: {e})")
            return
        self._say(f"  inside {actor_id}'s sandbox (runsc exec):")
        for line in (result.stdout + result.stderr).splitlines():
            self._say(f"    {line}")

    def show_gvisor_checkpoint(self, actor_id: str) -> None:
        """Say where a real gVisor checkpoint of ``actor_id`` lies, and how big it is."""
        runtime = self._components.runtime
        view = self.agent.actor(actor_id)
        if (
            self._say is None
            or not isinstance(runtime, CpuOnGvisor)
            or actor_id not in runtime.in_gvisor
            or view is None
            or view.checkpoint is None
        ):
            return
        files = sorted(p for p in Path(view.checkpoint).iterdir() if p.suffix == ".img")
        sizes = ", ".join(f"{p.name} {p.stat().st_size:,} B" for p in files)
        self._say(f"  {actor_id}: real gVisor checkpoint in {view.checkpoint}: {sizes}")

    async def live_clients(self, actor_id: str) -> tuple[GpuClient, ...]:
        """What the probe sees in the actor's sandbox now."""
        try:
            state = await self._components.runtime.state(actor_id)
        except runsc.RunscError:
            return ()
        return await self._components.probe.live_clients((state.pid,)) if state.pid else ()

    async def until(self, predicate: Callable[[], Awaitable[bool]], what: str) -> None:
        """Poll ``predicate`` until true (a clear error after :data:`WAIT_S`)."""
        with anyio.move_on_after(WAIT_S):
            while not await predicate():
                await anyio.sleep(0.05)
            return
        raise exceptions.SubstrateGpuError(f"while running the demo: gave up waiting for {what}")

    async def state(self, actor_id: str, state: str) -> None:
        await self.agent.wait_for_state(actor_id, state, timeout=WAIT_S)

    async def start(self, actor_id: str, bundle: Path, *, gpu: bool) -> None:
        await self.send(events.ActorRegistered(actor_id=actor_id, gpu=gpu, bundle=str(bundle)))
        await self.send(events.BundlePrepared(actor_id=actor_id, bundle=str(bundle)))
        await self.send(events.RunRequested(actor_id=actor_id))
        await self.state(actor_id, "running")

    async def suspend(self, actor_id: str) -> str:
        """Ask for a suspend; the state it settles in (``running`` when refused)."""
        await self.send(events.SuspendRequested(actor_id=actor_id))
        await self.until(
            lambda: _settled(self.agent, actor_id), f"{actor_id}'s checkpoint to finish"
        )
        return self.agent.state_of(actor_id) or "unknown"

    async def restore_and_delete(self, actor_id: str) -> None:
        await self.send(events.RestoreRequested(actor_id=actor_id))
        await self.state(actor_id, "running")
        await self.send(events.DeleteRequested(actor_id=actor_id))
        await self.state(actor_id, "deleted")


async def _settled(agent: Agent, actor_id: str) -> bool:
    """The actor rests: no effect in flight (probing, checkpointing, ... are in flight)."""
    return agent.state_of(actor_id) not in agent.spec.effects


async def gpu_trainer(script: Script, bundle: Path) -> None:
    """Suspend refused while the CUDA context is live; accepted after it closes."""
    actor = bundle.name
    await script.start(actor, bundle, gpu=True)
    await script.until(
        lambda: _truthy(script.live_clients(actor)), f"{actor}'s workload to open /dev/nvidia0"
    )
    refused = await script.suspend(actor)
    if refused != "running":
        raise exceptions.SubstrateGpuError(
            f"while running the demo: {actor}'s suspend with a live context ended {refused!r}"
        )
    (bundle / "rootfs" / RELEASE_FILE.lstrip("/")).touch()
    await script.until(
        lambda: _falsy(script.live_clients(actor)), f"{actor}'s workload to close /dev/nvidia0"
    )
    if await script.suspend(actor) != "suspended":
        raise exceptions.SubstrateGpuError(
            f"while running the demo: {actor}'s suspend after the context closed was not accepted"
        )
    await script.restore_and_delete(actor)


async def between_workloads(script: Script, bundle: Path, *, gpu: bool) -> None:
    """Run, suspend (no context: accepted), restore, delete."""
    actor = bundle.name
    await script.start(actor, bundle, gpu=gpu)
    if gpu:
        await script.show_actor_view(actor)
    if await script.suspend(actor) != "suspended":
        raise exceptions.SubstrateGpuError(f"while running the demo: {actor} did not suspend")
    script.show_gvisor_checkpoint(actor)
    await script.restore_and_delete(actor)


async def _truthy(value: Awaitable[tuple[GpuClient, ...]]) -> bool:
    return bool(await value)


async def _falsy(value: Awaitable[tuple[GpuClient, ...]]) -> bool:
    return not await value


#: The demo's actors (ids get a ``-<round>`` suffix in ``agent --demo``'s loop).
ACTORS: Final = ("gpu-trainer", "gpu-notebook", "cpu-sandbox")


async def run_lives(script: Script, bundles_dir: Path, suffix: str = "") -> None:
    """The three demo actors' lives, concurrently."""
    trainer = actor_bundle(bundles_dir / f"gpu-trainer{suffix}", holds_gpu=True)
    notebook = actor_bundle(bundles_dir / f"gpu-notebook{suffix}", holds_gpu=False)
    sandbox = actor_bundle(bundles_dir / f"cpu-sandbox{suffix}", holds_gpu=False)
    async with anyio.create_task_group() as tg:
        tg.start_soon(gpu_trainer, script, trainer)
        tg.start_soon(lambda: between_workloads(script, notebook, gpu=True))
        tg.start_soon(lambda: between_workloads(script, sandbox, gpu=False))


# --- printing ---------------------------------------------------------------------------------


def describe(t: Transition, started: float) -> str:
    """One transition as a line of the demo's output."""
    arrow = f"{t.source} -> {t.dest}" if t.source != t.dest else f"{t.source} (stays)"
    reason = (t.reason or "").splitlines()[0] if t.reason else ""
    if len(reason) > 140:
        reason = reason[:139] + "…"
    why = f"  [{reason}]" if reason else ""
    return f"  {time.monotonic() - started:6.2f}s  {t.actor_id:<13} {arrow:<30} {t.trigger}{why}"


def replayed_states(path: Path) -> dict[str, str]:
    """Each actor's final state, rebuilt from the event log alone."""
    result = eventlog.replay(path)
    return {actor_id: view.state for actor_id, view in result.actors.items()}


def _own_command() -> str:
    """``substrate-gpu`` as the reader can run it: by name when it is on PATH, else the
    script they ran (``.venv/bin/substrate-gpu``), else this interpreter's ``-m``."""
    if shutil.which("substrate-gpu"):
        return "substrate-gpu"
    script = Path(sys.argv[0])
    if script.name == "substrate-gpu":
        return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m substrate_gpu"


async def run_demo_async(workdir: Path, out: TextIO, keep_log_as: Path | None = None) -> DemoResult:
    """Build the node, run the lives through the agent, replay the log.

    ``keep_log_as``: copy the event log there (outside a workdir about to be removed)."""
    print(f"simulated GPU node in {workdir} (no GPU, no NVIDIA driver here)", file=out)
    demo = build_demo_node(workdir)
    sim = demo.node
    kind = "char devices (mknod)" if sim.real_device_nodes else "links to /dev/null (not root)"
    print(
        f"  GPU {sim.gpus[0]} (driver {sim.driver_version}, simulated): /dev/nvidia* are {kind} "
        "with /dev/null's numbers (1:3), not NVIDIA's (195:N), so a workload can really hold "
        "one open: the live GPU handle the suspend probe finds. Driver libraries: gcc-built, "
        "real SONAMEs; nvidia-ctk: a stand-in writing the toolkit 1.20 spec.",
        file=out,
    )
    print(f"runtime: {demo.runtime_detail}", file=out)
    started = time.monotonic()
    seen: list[Transition] = []
    async with running_agent(demo.config, demo.components) as running:
        agent = running.service.agent
        async with agent.subscribe(buffer=10_000) as transitions, anyio.create_task_group() as tg:

            async def show() -> None:
                async for t in transitions:
                    seen.append(t)
                    print(describe(t, started), file=out, flush=True)

            tg.start_soon(show)
            script = Script(
                running.service,
                demo.components,
                lib64=sim.lib64,
                say=lambda line: print(line, file=out, flush=True),
            )
            await run_lives(script, workdir / "bundles")
            await agent.settle()
            tg.cancel_scope.cancel()
        final = {a: agent.state_of(a) or "unknown" for a in ACTORS}
    assert demo.config.event_log is not None
    event_log = demo.config.event_log
    if keep_log_as is not None:
        shutil.copyfile(event_log, keep_log_as)
        event_log = keep_log_as
    replayed = replayed_states(event_log)
    refusals = tuple(t for t in seen if t.trigger == "checkpoint_refused" and t.dest == "running")
    same = all(replayed.get(a) == s for a, s in final.items())
    print(f"final states: {', '.join(f'{a}={s}' for a, s in sorted(final.items()))}", file=out)
    print(
        "replayed the event log: "
        + ("same final states" if same else f"DIFFERENT final states: {replayed}"),
        file=out,
    )
    # Named once, at the end: the path that outlives the run (a temporary workdir does not).
    print(f"event log (kept): {event_log}", file=out)
    print(f"every actor's timeline: {_own_command()} replay {event_log}", file=out)
    return DemoResult(
        workdir=workdir,
        runtime=demo.runtime,
        event_log=event_log,
        final_states=final,
        replayed_states=replayed,
        refusals=refusals,
        transitions=tuple(seen),
    )


class Terminated(KeyboardInterrupt):
    """The demo was stopped by SIGTERM, after the same cleanup as Ctrl-C (a
    KeyboardInterrupt too, so whatever handles an interrupted run handles this one)."""


def main(workdir: Path | None, out: TextIO) -> DemoResult:
    """Run in ``workdir`` (everything kept) or a temporary directory (removed afterwards,
    except the event log, copied next to it so ``replay`` can read it).

    ``workdir`` must be empty or absent: a previous run's node, event log and checkpoints
    would be mixed into this one (its log already holds the demo's actors).

    SIGTERM stops it as Ctrl-C does (:func:`_sigterm_as_ctrl_c`): sandboxes deleted, the
    gVisor network namespace unmounted, a temporary directory removed, its event log kept;
    then :class:`Terminated` is raised."""
    with _sigterm_as_ctrl_c() as terminated:
        try:
            return _run(workdir, out)
        except KeyboardInterrupt:
            if terminated:
                raise Terminated from None
            raise


def _run(workdir: Path | None, out: TextIO) -> DemoResult:
    if workdir is not None:
        workdir = _fresh_workdir(workdir)
        try:
            return anyio.run(run_demo_async, workdir, out)
        finally:
            cleanup_containers(workdir)
    with tempfile.TemporaryDirectory(prefix="substrate-gpu-demo-") as tmp:
        fd, kept = tempfile.mkstemp(prefix="substrate-gpu-demo-", suffix=".events.jsonl")
        os.close(fd)
        try:
            return anyio.run(run_demo_async, Path(tmp), out, Path(kept))
        except BaseException:
            # Interrupted or failed: what happened so far is kept, not an empty file.
            _keep_log(Path(tmp) / "events.jsonl", Path(kept), out)
            raise
        finally:
            cleanup_containers(Path(tmp))


def _keep_log(log: Path, kept: Path, out: TextIO) -> None:
    """Copy an unfinished run's event log out of the directory about to be removed, and say
    where (an empty placeholder is removed when the run never wrote one)."""
    if not log.is_file():
        kept.unlink(missing_ok=True)
        return
    shutil.copyfile(log, kept)
    with contextlib.suppress(OSError, ValueError):  # a reader gone, a closed stream
        print(f"stopped early; event log (kept): {kept}", file=out, flush=True)


@contextlib.contextmanager
def _sigterm_as_ctrl_c() -> Iterator[list[int]]:
    """While inside, SIGTERM takes Ctrl-C's way out: it calls whatever SIGINT handler is in
    place (asyncio's, which cancels the run so every ``finally`` and ``async with`` unwinds,
    or Python's, which raises KeyboardInterrupt). Yields the SIGTERMs received.

    Without it SIGTERM kills the process at once, leaving a live gVisor sandbox, its nsfs
    mount and the temporary directory behind. Only the main thread can take signals."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def on_sigterm(signum: int, frame: types.FrameType | None) -> None:
        received.append(signum)
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:  # SIGINT ignored or default at the C level: interrupt as Python would
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


def _fresh_workdir(workdir: Path) -> Path:
    """``workdir``, made if absent and resolved; a clear error when it cannot be the demo's."""
    if workdir.exists() and not workdir.is_dir():
        raise exceptions.ConfigError(
            f"while starting the demo in {workdir}: it exists and is not a directory; give a "
            "new or empty directory as --workdir"
        )
    if workdir.is_dir() and any(workdir.iterdir()):
        raise exceptions.ConfigError(
            f"while starting the demo in {workdir}: the directory is not empty (a previous "
            "run's files?); give a new or empty --workdir, or remove this one"
        )
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a parent that is a file, no permission, a read-only place
        raise exceptions.ConfigError(f"while making the demo's --workdir {workdir}: {e}") from e
    return workdir.resolve()


def cleanup_containers(workdir: Path) -> None:
    """Force-delete any container the demo left behind (after a failure), in runc and in
    real gVisor (whose ``--network=none`` namespace mount is dropped too)."""
    gvisor, gvisor_root = find_built_runsc(), workdir / "gvisor-root"
    if gvisor is not None and gvisor_root.is_dir():
        flags = (str(gvisor), "--root", str(gvisor_root), *GVISOR_FLAGS)
        listed = subprocess.run(
            [*flags, "list", "--quiet"], capture_output=True, text=True, check=False
        )
        for container_id in listed.stdout.split():
            subprocess.run(
                [*flags, "delete", "--force", container_id], capture_output=True, check=False
            )
        if (gvisor_root / "null-netns").exists():
            subprocess.run(
                ["umount", "-l", str(gvisor_root / "null-netns")], capture_output=True, check=False
            )
    runc = shutil.which("runc")
    root = workdir / "runsc-root"
    if runc is None or not root.is_dir():
        return
    for entry in root.iterdir():
        if entry.is_dir():
            subprocess.run(
                [runc, "--root", str(root), "delete", "--force", entry.name],
                capture_output=True,
                check=False,
            )


# --- agent --demo: the same lives, in a loop ------------------------------------------------


async def workload_forever(
    service: AgentService, components: Components, bundles_dir: Path, pause: float = 2.0
) -> None:
    """``agent --demo``'s workload: the demo's lives, round after round, until cancelled."""
    script = Script(service, components)
    round_ = 0
    while True:
        round_ += 1
        try:
            await run_lives(script, bundles_dir, f"-{round_}")
        except exceptions.SubstrateGpuError as e:
            log.warning("demo round failed", round=round_, error=str(e))
        await anyio.sleep(pause)


def _start(
    tg: anyio.abc.TaskGroup,
    task: Callable[[server.Running], Coroutine[Any, Any, None]],
    running: server.Running,
) -> None:
    tg.start_soon(task, running)


async def serve_with_workload(config: AgentConfig, node: DemoNode, bundles_dir: Path) -> int:
    """``agent --demo``: the agent serving as :func:`server.run` does, the lives looping beside it.

    The loop is a client of the running agent (started from ``on_ready``, stopped when the
    agent is asked to stop), so the agent's server knows nothing of the demo.
    """

    async def loop_until_stopped(running: server.Running) -> None:
        async with anyio.create_task_group() as loop:
            loop.start_soon(workload_forever, running.service, node.components, bundles_dir)
            await running.stop.wait()
            loop.cancel_scope.cancel()

    failure: exceptions.SubstrateGpuError | None = None
    code = 1
    async with anyio.create_task_group() as tg:
        try:
            code = await server.run(
                config,
                components=node.components,
                on_ready=lambda running: _start(tg, loop_until_stopped, running),
            )
        except exceptions.SubstrateGpuError as e:
            failure = e
        tg.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return code
