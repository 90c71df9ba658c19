"""The effects an actor's in-flight states start, and the outcome events they produce.

Effects run in the pipeline, outside the machine: each takes a snapshot of the actor and the
event that started it, talks to the injected :class:`SandboxRuntime`,
:class:`CudaContextProbe` and :class:`GpuInjector`, and *returns* an outcome event. They
never raise for an expected failure: a failure is an outcome too (``injection_failed``,
``checkpoint_failed``, ``effect_failed``), so every result lands on an explicit transition.
Timeouts and cancellation are the pipeline's job (:mod:`substrate_gpu.lifecycle.pipeline`).

Decisions worth knowing:

- The container id is the actor id; GPU actors get ``nvproxy=True`` on **create and
  restore** (brief §4: the pause container needs it too), never on start or checkpoint.
  An actor registered with ``containers`` is a sandbox (``_pause`` plus app containers,
  under a runsc root of its own): each effect acts on all of it, in the order
  :mod:`substrate_gpu.lifecycle.sandbox` owns; GPUs go into every app container's bundle,
  or, when its containers name their own (``container_gpus``), into each its own.
- A GPU actor's suspend starts with ``probe``: live CUDA clients (found by the probe, or
  observed by the node agent) with a route to suspend them give ``live_context_found``
  (the machine picks the next state from its route); without a route, ``checkpoint_refused``
  (a refusal, not an attempt); none, ``no_live_context``.
- Checkpoint asks ``runtime.features()`` (or, for a runtime running sandboxes under more
  than one runsc, ``sandbox_features(id)``: the version its manifest records is the one
  that wrote the image) and passes ``leave_running=True`` when supported,
  so a failed checkpoint does not kill the sandbox; on runsc's route it passes
  ``--cuda-checkpoint-path``. If runsc still reports live nvproxy clients (the probe raced
  a new context) the outcome is ``checkpoint_refused`` and whether the sandbox survived is
  *asked of the runtime*, not assumed. A good GPU checkpoint gets its manifest (driver, GPU
  count, whether CUDA state is inside) when the node has :class:`GpuSettings`.
- ``cuda_suspend``/``cuda_resume`` (the exec route) lock and checkpoint every CUDA process
  through the sandbox, all or nothing, and bring them back (``cudackpt.suspend``). A lock
  that times out is a refusal (everything was rolled back); a rollback that strands a
  process is a failure, which the machine follows with a resume.
- With :class:`GpuSettings`, ``create`` and ``restore`` of a GPU sandbox run the driver
  preflight first (``preflight_refused`` / ``restore_refused``: no sandbox was made), and
  ``restore`` checks the image's manifest against this node.
- Each checkpoint goes to a fresh directory ``<checkpoint_root>/<actor>/<seq>``: a failed
  attempt never overwrites the last good image the actor can be recovered from. A suspend
  naming its ``image_path`` writes there instead, refused (``checkpoint_failed``, the
  sandbox untouched) when that directory already holds a ``checkpoint.img``.
- An image is the sandbox's memory: the directories made for it are 0700 and its files
  0600 before ``checkpoint_written``, whatever the umask (:mod:`substrate_gpu._private`).
- A successful checkpoint is followed by ``delete --force`` (``--leave-running`` resumed the
  sandbox; without it the stopped container still holds the id a restore needs).
- **No outcome frees GPUs under a sandbox that may still run**: an outcome that
  leaves a ``holds_gpus`` state for one the machine does not mark ``may_leave_sandbox``
  (``stopped``, ``suspended``) is produced only when the sandbox is known gone. A failed
  restore whose leftovers cannot be deleted is ``effect_failed`` (``failed``: the pipeline
  keeps the GPUs until it has deleted them), a checkpoint whose teardown cannot delete a
  sandbox that may run is ``checkpoint_failed`` with the sandbox survived, and
  ``sandbox_survived`` is False only on a definite answer (:func:`_sandbox_runs`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from substrate_gpu import _blocking, _private, cudackpt, exceptions, preflight
from substrate_gpu._log import get_logger
from substrate_gpu.lifecycle import allocation, errors, events, registry, sandbox, verify
from substrate_gpu.lifecycle import gpu as gpu_
from substrate_gpu.lifecycle.actors import ActorView
from substrate_gpu.lifecycle.gpu import GpuSettings
from substrate_gpu.probes.api import CudaContextProbe
from substrate_gpu.runsc import api as runsc

_log = get_logger(__name__)

#: The outcome event types each effect can produce (from the registry; the loader checks
#: the effect's state accepts every one). ``effect_timed_out`` comes from the pipeline.
OUTCOMES: Mapping[str, tuple[str, ...]] = {e: registry.outcomes(e) for e in registry.REGISTRY}

#: Default timeout per effect, seconds (from the registry).
DEFAULT_TIMEOUTS: Mapping[str, float] = registry.DEFAULT_TIMEOUTS


class GpuInjector(Protocol):
    """Injects the worker's GPUs into an OCI bundle (idempotent)."""

    async def __call__(
        self, bundle: Path, *, devices: Sequence[str] | None = None, container: str | None = None
    ) -> int:
        """Edit ``bundle``/config.json in place; return the number of device nodes injected.

        ``devices``: the qualified CDI names the allocator granted; ``None``: all GPUs;
        empty, for a sandbox's app container: none (GPUs per container: no device node, no
        mount, no CDI env, the image's ``NVIDIA_VISIBLE_DEVICES`` dropped; 0 returned).
        ``container``: a sandbox's app container, whose bundle is ``bundle``/``container``
        (a real directory, never a link out of ``bundle``); only passed for sandboxes."""
        ...


@dataclass(frozen=True)
class EffectContext:
    """What effects talk to."""

    runtime: runsc.SandboxRuntime
    """The sandbox runtime (runsc driver)."""
    probe: CudaContextProbe
    """Finds live CUDA clients before a checkpoint."""
    injector: GpuInjector
    """Injects GPUs into a bundle."""
    checkpoint_root: Path
    """Checkpoint images go to ``<checkpoint_root>/<actor>/<seq>``."""
    gpu: GpuSettings | None = None
    """Driver preflight, manifests and CUDA suspend routes; None: upstream behaviour."""
    allocator: allocation.GpuAllocator | None = None
    """The worker's GPU allocator; None: every GPU actor gets all GPUs (upstream)."""


Effect = Callable[[EffectContext, ActorView, events.Event], Awaitable[events.Event]]


def _message(error: BaseException) -> str:
    return str(error) or type(error).__name__


async def _delete_quietly(ctx: EffectContext, actor: ActorView) -> bool:
    """Best-effort ``delete --force`` of a leftover container, or of every container of a
    sandbox (cleanup, never the outcome). Whether each delete succeeded or found nothing to
    delete; False: a container may still run (ask the runtime before freeing its GPUs)."""
    if sandbox.is_sandbox(actor):
        try:
            return await sandbox.delete_quietly(sandbox.of(ctx.runtime, actor))
        except sandbox.SandboxError:
            return True  # a runtime without per-actor roots never made this sandbox
    try:
        await ctx.runtime.delete(actor.actor_id, force=True)
    except runsc.ContainerNotFoundError:
        return True
    except exceptions.SubstrateGpuError:
        return False
    return True


async def delete_leftover(ctx: EffectContext, actor: ActorView) -> bool:
    """Delete whatever may be left of the actor's sandbox (its one container, or every
    container, apps first and ``_pause`` last) and say whether it is gone: the runtime knows
    none of its containers any more. Never raises (an unreadable state is not gone)."""
    await _delete_quietly(ctx, actor)
    if sandbox.is_sandbox(actor):
        try:
            sandboxed = sandbox.of(ctx.runtime, actor)
        except sandbox.SandboxError:
            return True  # a runtime without per-actor roots never made this sandbox
        found = await sandbox.statuses(sandboxed)
        return all(status == "missing" for status in found.values())
    try:
        await ctx.runtime.state(actor.actor_id)
    except runsc.ContainerNotFoundError:
        return True
    except exceptions.SubstrateGpuError:
        return False
    return False


def _root_container(ctx: EffectContext, actor: ActorView) -> tuple[runsc.SandboxRuntime, str]:
    """The runtime and container that stand for the actor's whole sandbox: its one container,
    or a sandbox's ``_pause`` under the actor's own root. A SandboxError (a
    SubstrateGpuError) when the runtime cannot host a sandbox."""
    if sandbox.is_sandbox(actor):
        return sandbox.of(ctx.runtime, actor).runtime, sandbox.PAUSE
    return ctx.runtime, actor.actor_id


def _drivers_of(ctx: EffectContext, actor: ActorView) -> preflight.DriverLister | None:
    """The runsc a sandbox under a binary of its own runs (its supported drivers are that
    binary's); None: the node's (:attr:`GpuSettings.drivers`). A SandboxError when the
    runtime cannot run the actor's binary."""
    if not actor.runsc:
        return None
    runtime = sandbox.of(ctx.runtime, actor).runtime
    return runtime if isinstance(runtime, preflight.DriverLister) else None


def _granted(actor: ActorView) -> tuple[str, ...] | None:
    """The allocated GPUs to inject, or ``None`` for all of them (no allocator)."""
    return tuple(actor.gpu_devices.split(",")) if actor.gpu_devices else None


async def _inject(ctx: EffectContext, actor: ActorView) -> int:
    """Inject the actor's GPUs into its bundle, or into every app container's bundle of a
    sandbox (``_pause`` never): the same GPUs each, or with GPUs per container each its own
    (:func:`~substrate_gpu.lifecycle.sandbox.container_gpus`; none withheld). The device
    nodes injected, in all."""
    devices = _granted(actor)
    bundle = Path(actor.bundle)
    if not sandbox.is_sandbox(actor):
        if devices is None:
            return await ctx.injector(bundle)
        return await ctx.injector(bundle, devices=devices)
    aliases = ctx.allocator.worker.aliases if ctx.allocator is not None else {}
    injected = 0
    for name in actor.containers:
        own = sandbox.container_gpus(actor, name, aliases)
        chosen = devices if own is None else own
        injected += await ctx.injector(bundle, devices=chosen, container=name)
    return injected


async def allocate(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """Ask the worker's allocator for the actor's GPUs.

    No await between the decision and the acceptance of its outcome (which updates the
    table), so no other actor's allocation comes in between: grants are disjoint. While
    the worker's GPUs are unknown (no CDI spec yet), or a name asked for is not known yet
    (a DRA claim's spec), they are looked for again first.
    """
    request = allocation.request_of(actor)
    if ctx.allocator is None:
        # No allocator: the upstream behaviour (all GPUs, or exactly the names asked for).
        return events.GpusAllocated(actor_id=actor.actor_id, names=request.names)
    await ctx.allocator.ensure_known(request.names)
    decision = ctx.allocator.decide(request, actor.actor_id)
    if isinstance(decision, allocation.Granted):
        return events.GpusAllocated(actor_id=actor.actor_id, names=decision.devices)
    if isinstance(decision, allocation.Wait):
        return events.GpusUnavailable(actor_id=actor.actor_id, message=decision.reason)
    return events.GpusRefused(
        actor_id=actor.actor_id,
        message=f"while allocating GPUs on worker {ctx.allocator.name!r}: {decision.reason}",
    )


async def inject(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """Inject the allocated GPUs (all of the worker's without an allocator) into the bundle."""
    try:
        devices = await _inject(ctx, actor)
    except exceptions.SubstrateGpuError as e:
        return events.InjectionFailed(actor_id=actor.actor_id, message=_message(e))
    return events.GpuInjected(actor_id=actor.actor_id, devices=devices)


async def create(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """Driver preflight (GPU actors, when configured), then ``runsc [--nvproxy] create``,
    after deleting a leftover container of the actor."""
    if actor.gpu and ctx.gpu is not None:
        try:
            facts = await ctx.gpu.check_host(_drivers_of(ctx, actor))
        except exceptions.SubstrateGpuError as e:
            return events.EffectFailed(
                actor_id=actor.actor_id,
                effect="create",
                message=f"while checking the NVIDIA driver before create: {_message(e)}",
            )
        if isinstance(facts, preflight.Refusal):
            return events.PreflightRefused(
                actor_id=actor.actor_id, code=facts.code, message=facts.reason
            )
    if actor.sandbox:
        await _delete_quietly(ctx, actor)
    try:
        if sandbox.is_sandbox(actor):
            # Cleans up after itself: a failure part-way leaves no container.
            await sandbox.create(sandbox.of(ctx.runtime, actor), nvproxy=actor.gpu)
        else:
            await ctx.runtime.create(actor.actor_id, Path(actor.bundle), nvproxy=actor.gpu)
    except exceptions.SubstrateGpuError as e:
        await _delete_quietly(ctx, actor)
        return events.EffectFailed(actor_id=actor.actor_id, effect="create", message=_message(e))
    return events.SandboxCreated(actor_id=actor.actor_id)


async def start(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """``runsc start`` (of each app container of a sandbox)."""
    try:
        if sandbox.is_sandbox(actor):
            await sandbox.start(sandbox.of(ctx.runtime, actor))
        else:
            await ctx.runtime.start(actor.actor_id)
    except exceptions.SubstrateGpuError as e:
        return events.EffectFailed(actor_id=actor.actor_id, effect="start", message=_message(e))
    return events.SandboxStarted(actor_id=actor.actor_id)


async def _sandbox_runs(ctx: EffectContext, actor: ActorView) -> bool:
    """Whether the actor's sandbox may still run: its root container is running or paused,
    or its state cannot be read. Only a definite answer means it does not (runsc knows no
    such container, or says it stopped; a runtime that cannot host the sandbox never made
    it): any other error keeps the GPUs held and the actor where its sandbox is believed to
    run, and is logged, since the agent's belief may now differ from what runs."""
    try:
        runtime, container = _root_container(ctx, actor)
    except sandbox.SandboxError:
        return False
    try:
        state = await runtime.state(container)
    except runsc.ContainerNotFoundError:
        return False
    except exceptions.SubstrateGpuError as e:
        _log.warning(
            "the sandbox's state could not be read: taken as still running, its GPUs held",
            actor_id=actor.actor_id,
            container=container,
            error=_message(e),
        )
        return True
    return state.status in {"running", "paused"}


async def probe(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """Look for live CUDA clients of a GPU actor's sandbox and choose how to suspend it."""
    actor_id = actor.actor_id
    try:
        runtime, container = _root_container(ctx, actor)
        state = await runtime.state(container)
        clients = await ctx.probe.live_clients((state.pid,)) if state.pid else ()
    except exceptions.SubstrateGpuError as e:
        return events.CheckpointFailed(
            actor_id=actor_id,
            message=f"while probing for live CUDA contexts: {_message(e)}",
            sandbox_survived=await _sandbox_runs(ctx, actor),
        )
    if not clients and actor.live_contexts == 0:
        return events.NoLiveContext(actor_id=actor_id)
    if clients:
        first = clients[0]
        found = (
            f"{len(clients)} live GPU handle(s), e.g. {first.target} "
            f"held by pid {first.pid} (fd {first.fd})"
        )
    else:
        found = f"{actor.live_contexts} live CUDA context(s) observed"
    try:
        route = await _suspend_route(ctx, actor)
    except exceptions.SubstrateGpuError as e:
        return events.CheckpointFailed(
            actor_id=actor_id,
            message=f"while choosing how to suspend a live CUDA context: {_message(e)}",
            sandbox_survived=await _sandbox_runs(ctx, actor),
        )
    if route.refuses:
        if actor.suspend_policy == "refuse":
            reason = events.REFUSED_SUSPEND_POLICY
        elif clients:
            reason = events.REFUSED_LIVE_CONTEXT_PROBED
        else:
            reason = events.REFUSED_LIVE_CONTEXT_OBSERVED
        return events.CheckpointRefused(
            actor_id=actor_id,
            reason=reason,
            sandbox_survived=True,
            message=f"{found}; {route.reason}",
        )
    return events.LiveContextFound(
        actor_id=actor_id, route=route.name, message=f"{found}; {route.reason}"
    )


async def _suspend_route(ctx: EffectContext, actor: ActorView) -> cudackpt.Route:
    if ctx.gpu is None:
        # No GPU settings, no cuda-checkpoint to hand to runsc or to run in the sandbox.
        if actor.suspend_policy == "refuse":
            return cudackpt.Route("refuse", "the pool's GPU suspend policy is 'refuse'")
        return cudackpt.Route(
            "refuse", "this agent has no GPU settings: no cuda-checkpoint route is configured"
        )
    # The runsc the sandbox runs under: a sandbox's own binary has its own features.
    features = await _root_container(ctx, actor)[0].features()
    gpu = ctx.gpu
    if sandbox.is_sandbox(actor):
        # The exec route runs cuda-checkpoint in the actor's container: a sandbox's CUDA
        # processes live in its app containers, which it does not reach (not built yet).
        gpu = dataclasses.replace(gpu, sandbox_tool=None)
    return await gpu.route(features, actor.actor_id, actor.suspend_policy)


def _write_manifest(
    ctx: EffectContext,
    actor: ActorView,
    image: Path,
    features: runsc.RunscFeatures,
    actor_gpus: tuple[preflight.CheckpointGpu, ...] = (),
) -> None:
    """The manifest of a good checkpoint: runsc version, host CPU flags, and for a GPU actor
    the driver, GPU count and identities (best effort: without it, restore is unchecked and
    an exec-route image is not resumed; logged). The count is the actor's: the GPUs the
    allocator gave it (its sandbox saw no other), else all of the worker's."""
    driver, count = "", 0
    if actor.gpu and ctx.gpu is not None:
        facts = ctx.gpu.host_facts()
        if isinstance(facts, preflight.Refusal):
            _log.warning("checkpoint has no manifest", image=str(image), reason=facts.reason)
            return
        granted = _granted(actor)
        driver = facts.driver_version
        count = facts.gpu_count if granted is None else len(granted)
    try:
        manifest = preflight.CheckpointManifest(
            driver_version=driver,
            gpu_count=count,
            cuda_state_included=bool(actor.suspend_route),
            route=actor.suspend_route,
            runsc_version=features.version,
            cpu_flags=preflight.read_cpu_flags(),
            gpus=preflight.read_gpu_identities() if actor.gpu else (),
            architecture=preflight.host_architecture(),
            runsc_sha256=features.binary_sha256,
            actor_gpus=actor_gpus,
        )
        preflight.write_manifest(image, manifest)
    except preflight.PreflightError as e:
        _log.warning("checkpoint has no manifest", image=str(image), reason=str(e))


def _gpus_held(ctx: EffectContext, actor: ActorView) -> int:
    """How many GPUs the actor's sandbox holds: its grant, else all of the worker's."""
    granted = _granted(actor)
    if granted is not None:
        return len(granted)
    facts = ctx.gpu.host_facts() if ctx.gpu is not None else None
    return facts.gpu_count if isinstance(facts, preflight.HostGpuFacts) else 0


async def _features_of(runtime: runsc.SandboxRuntime, container_id: str) -> runsc.RunscFeatures:
    """What the runsc hosting ``container_id`` supports (the runtime's, unless it runs
    sandboxes under more than one runsc build)."""
    if isinstance(runtime, runsc.PerSandboxFeatures):
        return await runtime.sandbox_features(container_id)
    return await runtime.features()


def checkpoint_image(checkpoint_root: Path, actor: ActorView, seq: int) -> Path:
    """Where the checkpoint entered by the event of ``seq`` goes: the suspend's
    ``image_path``, else a fresh ``<checkpoint_root>/<actor>/<seq>``."""
    if actor.checkpoint_target:
        return Path(actor.checkpoint_target)
    return checkpoint_root / actor.actor_id / str(seq)


async def checkpoint(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """Checkpoint and stop the sandbox (via runsc's cuda-checkpoint on that route)."""
    actor_id = actor.actor_id
    cuda_path = (
        ctx.gpu.cuda_checkpoint_path
        if ctx.gpu is not None and actor.suspend_route == events.ROUTE_RUNSC
        else None
    )
    image = checkpoint_image(ctx.checkpoint_root, actor, event.seq)
    if actor.checkpoint_target and (image / "checkpoint.img").exists():
        # A directory the caller chose: never overwrite (or mix into) an image in it.
        return events.CheckpointFailed(
            actor_id=actor_id,
            message=f"while checkpointing into {image}: it already holds a checkpoint "
            "(checkpoint.img); ask for an empty directory",
            sandbox_survived=True,
        )
    # Read before runsc moves any CUDA state off the GPUs (the exec route read it earlier).
    held = (
        await gpu_.gpus_at_checkpoint(ctx.gpu, ctx.allocator, actor.gpu_devices, event)
        if actor.gpu
        else ()
    )
    try:
        runtime, container = _root_container(ctx, actor)
    except exceptions.SubstrateGpuError as e:
        return events.CheckpointFailed(
            actor_id=actor_id, message=_message(e), sandbox_survived=False
        )
    features = await _features_of(runtime, container)
    try:
        await _blocking.run_abandonable(
            functools.partial(_private.make_private_dirs, image), name="substrate-gpu image dir"
        )
    except OSError as e:
        return events.CheckpointFailed(
            actor_id=actor_id,
            message=f"while making checkpoint directory {image}: {e.strerror or e}",
            sandbox_survived=True,
        )
    try:
        # A sandbox's checkpoint is its _pause's: every container in the one image.
        await runtime.checkpoint(
            container,
            image,
            leave_running=features.leave_running,
            cuda_checkpoint_path=cuda_path,
            cuda_checkpoint_sequential=(
                cuda_path is not None
                and features.cuda_checkpoint_sequential
                and _gpus_held(ctx, actor) > 1
            ),
        )
    except runsc.LiveNvproxyClientsError as e:
        return events.CheckpointRefused(
            actor_id=actor_id,
            reason=events.REFUSED_LIVE_NVPROXY_CLIENTS,
            sandbox_survived=await _sandbox_runs(ctx, actor),
            message=_message(e),
        )
    except runsc.NotRestorableError as e:
        return events.CheckpointRefused(
            actor_id=actor_id,
            reason=events.REFUSED_NOT_RESTORABLE,
            sandbox_survived=await _sandbox_runs(ctx, actor),
            message=_message(e),
        )
    except exceptions.SubstrateGpuError as e:
        return events.CheckpointFailed(
            actor_id=actor_id,
            message=_message(e),
            sandbox_survived=await _sandbox_runs(ctx, actor),
        )
    _write_manifest(ctx, actor, image, features, held)
    try:
        # The image is the sandbox's memory: private before it is reported written.
        await _blocking.run_abandonable(
            functools.partial(_private.make_files_private, image), name="substrate-gpu image"
        )
    except OSError as e:
        return events.CheckpointFailed(
            actor_id=actor_id,
            message=f"while making checkpoint {image} private: {e.strerror or e}",
            sandbox_survived=await _sandbox_runs(ctx, actor),
        )
    # The image is good; the sandbox (resumed by --leave-running, or stopped) must go so the
    # id is free for the restore. A stopped one left behind is deleted by the next restore;
    # one that may still run keeps its GPUs: the suspend did not happen (as recovery reads a
    # live sandbox mid-checkpoint), the image is left unused.
    if not await _delete_quietly(ctx, actor) and await _sandbox_runs(ctx, actor):
        return events.CheckpointFailed(
            actor_id=actor_id,
            message=f"checkpointed into {image}, but the sandbox could not be deleted and may "
            "still run: it keeps its GPUs and the image is not used (suspend again, or delete)",
            sandbox_survived=True,
        )
    return events.CheckpointWritten(actor_id=actor_id, image_path=str(image))


async def restore(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """Re-inject GPUs (the bundle is re-unpacked before each restore), then restore."""
    actor_id = actor.actor_id
    image = actor.checkpoint
    if image is None:  # the machine's has_checkpoint guard makes this unreachable
        return events.RestoreFailed(actor_id=actor_id, message="no checkpoint to restore from")
    if actor.sandbox:
        await _delete_quietly(ctx, actor)
    try:
        # The runsc the sandbox runs under (its own binary's build is the one to match).
        runtime, container = _root_container(ctx, actor)
        features = await _features_of(runtime, container)
    except exceptions.SubstrateGpuError as e:
        return events.RestoreFailed(actor_id=actor_id, message=_message(e))
    cpu_refusal = _check_cpu_features(actor_id, Path(image), features)
    if cpu_refusal is not None:
        return cpu_refusal
    cuda_route = device_map = ""
    if actor.gpu and ctx.gpu is not None:
        uuids = gpu_.own_gpu_uuids(ctx.gpu, ctx.allocator, actor.gpu_devices)
        try:
            checked = await _check_restore(
                ctx.gpu,
                actor_id,
                Path(image),
                _granted(actor),
                uuids,
                drivers=_drivers_of(ctx, actor),
                features=features,
            )
        except exceptions.SubstrateGpuError as e:
            return events.RestoreFailed(
                actor_id=actor_id, message=f"while checking the node before restore: {_message(e)}"
            )
        if isinstance(checked, events.RestoreRefused):
            return checked
        cuda_route, device_map = checked
    devices = 0
    try:
        if actor.gpu:
            devices = await _inject(ctx, actor)
        if sandbox.is_sandbox(actor):
            await sandbox.restore(sandbox.of(ctx.runtime, actor), Path(image), nvproxy=actor.gpu)
        else:
            await ctx.runtime.restore(actor_id, Path(actor.bundle), Path(image), nvproxy=actor.gpu)
    except exceptions.SubstrateGpuError as e:
        if not await delete_leftover(ctx, actor):
            # What the restore made may still run: the actor fails (its GPUs held until the
            # pipeline has deleted it) instead of resting suspended with its GPUs freed.
            return events.EffectFailed(
                actor_id=actor_id,
                effect="restore",
                message=f"{_message(e)}; what the restore made could not be deleted and "
                "may still run (its GPUs stay held until it is gone)",
            )
        return events.RestoreFailed(actor_id=actor_id, message=_message(e))
    return events.Restored(
        actor_id=actor_id,
        image_path=image,
        devices=devices,
        cuda_route=cuda_route,
        device_map=device_map,
    )


def _check_cpu_features(
    actor_id: str, image: Path, features: runsc.RunscFeatures
) -> events.Event | None:
    """Refuse, before runsc runs, an image of another architecture, CPU or runsc build."""
    try:
        manifest = preflight.read_manifest(image)
        if manifest is None:
            return None
        refusal = preflight.check_sandbox_compat(
            manifest,
            architecture=preflight.host_architecture(),
            cpu_flags=preflight.read_cpu_flags(),
            runsc_sha256=features.binary_sha256,
        )
    except preflight.PreflightError as e:
        return events.RestoreFailed(
            actor_id=actor_id, message=f"while checking the node before restore: {_message(e)}"
        )
    if refusal is None:
        return None
    return events.RestoreRefused(actor_id=actor_id, code=refusal.code, message=refusal.reason)


async def _check_restore(
    gpu: GpuSettings,
    actor_id: str,
    image: Path,
    granted: tuple[str, ...] | None,
    uuids: tuple[str, ...],
    *,
    features: runsc.RunscFeatures,
    drivers: preflight.DriverLister | None = None,
) -> events.RestoreRefused | tuple[str, str]:
    """Driver preflight and the image's manifest against this node: a refusal, or the route
    that put CUDA state in the image (empty when none) and the device map onto the
    restore's GPUs ``uuids`` (empty: the same GPUs, or unknown). An actor given GPUs by the
    allocator is checked against those (other indices are fine where the route can remap,
    fewer never; each needs the free memory its checkpointed GPU used). ``drivers``: the
    runsc the sandbox runs under, when it is its own."""
    facts = await gpu.check_host(drivers)
    if isinstance(facts, preflight.Refusal):
        return events.RestoreRefused(actor_id=actor_id, code=facts.code, message=facts.reason)
    manifest = preflight.read_manifest(image)
    if manifest is None:
        return "", ""
    refusal = preflight.check_restore(manifest, facts)
    if refusal is None and granted is not None and len(granted) < manifest.gpu_count:
        refusal = preflight.Refusal(
            "restore-fewer-gpus",
            f"the checkpoint holds {manifest.gpu_count} GPU(s), this restore was allocated "
            f"{len(granted)} ({', '.join(granted)}): restore asking for at least as many GPUs",
        )
    if refusal is not None:
        return events.RestoreRefused(actor_id=actor_id, code=refusal.code, message=refusal.reason)
    planned = await gpu_.plan_restore(
        gpu,
        manifest,
        facts.driver_version,
        uuids,
        runsc_creates_device_files=features.restore_creates_gpu_device_files,
    )
    if isinstance(planned, preflight.Refusal):
        return events.RestoreRefused(actor_id=actor_id, code=planned.code, message=planned.reason)
    return (manifest.route if manifest.cuda_state_included else ""), planned


def _pids(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(",") if p.strip().isdigit())


def _join(pids: tuple[int, ...]) -> str:
    return ",".join(str(p) for p in pids)


async def cuda_suspend(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """Lock, then checkpoint, every CUDA process of the sandbox through ``runsc exec``."""
    actor_id = actor.actor_id
    tool_factory = ctx.gpu.sandbox_tool if ctx.gpu is not None else None
    if ctx.gpu is None or tool_factory is None:  # the route needs both: unreachable
        return events.CudaSuspendRefused(
            actor_id=actor_id,
            reason=events.REFUSED_CUDA_SUSPEND,
            message="no cuda-checkpoint tool is configured for the sandbox",
        )
    tool = tool_factory(actor_id)
    try:
        pids = await tool.gpu_processes()
    except exceptions.SubstrateGpuError as e:
        # Nothing was touched: a refusal while the sandbox runs.
        message = f"while listing the sandbox's CUDA processes: {_message(e)}"
        if await _sandbox_runs(ctx, actor):
            return events.CudaSuspendRefused(
                actor_id=actor_id, reason=events.REFUSED_CUDA_SUSPEND, message=message
            )
        return events.CudaSuspendFailed(actor_id=actor_id, message=message)
    # Each GPU's used memory while the CUDA state is still on it, for the manifest.
    held = await gpu_.gpus_at_checkpoint(ctx.gpu, ctx.allocator, actor.gpu_devices, event)
    try:
        outcome = await cudackpt.suspend_processes(
            tool, pids, lock_timeout_ms=ctx.gpu.lock_timeout_ms
        )
    except exceptions.SubstrateGpuError as e:
        # The runtime failed mid-way (the sandbox went away): resume whatever can be.
        return events.CudaSuspendFailed(
            actor_id=actor_id,
            message=f"while suspending CUDA processes {_join(pids)}: {_message(e)}",
            pids=_join(pids),
        )
    if outcome.suspended:
        return events.CudaSuspended(
            actor_id=actor_id, pids=_join(outcome.pids), gpu_memory=gpu_.encode_gpus(held)
        )
    if outcome.status == "refused":
        reason = (
            events.REFUSED_CUDA_LOCK_TIMEOUT
            if outcome.reason.startswith("lock timeout")
            else events.REFUSED_CUDA_SUSPEND
        )
        return events.CudaSuspendRefused(actor_id=actor_id, reason=reason, message=outcome.reason)
    return events.CudaSuspendFailed(
        actor_id=actor_id,
        message=f"{outcome.reason}; rollback left pid(s) {_join(outcome.stranded)} stranded",
        pids=_join(outcome.pids),
    )


async def cuda_resume(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """Restore and unlock every CUDA process the suspend checkpointed (safe to repeat)."""
    actor_id = actor.actor_id
    tool_factory = ctx.gpu.sandbox_tool if ctx.gpu is not None else None
    if tool_factory is None:
        return events.CudaResumeFailed(
            actor_id=actor_id,
            message="no cuda-checkpoint tool is configured for the sandbox",
            sandbox_survived=await _sandbox_runs(ctx, actor),
        )
    pids = _pids(actor.cuda_pids)
    try:
        # After a restore onto other GPUs, each restore carries the map (NVIDIA driver 580+).
        device_map = event.device_map if isinstance(event, events.Restored) else ""
        outcome = await cudackpt.resume_processes(
            tool_factory(actor_id), pids, device_map=device_map
        )
    except exceptions.SubstrateGpuError as e:
        return events.CudaResumeFailed(
            actor_id=actor_id,
            message=f"while resuming CUDA processes {actor.cuda_pids}: {_message(e)}",
            sandbox_survived=await _sandbox_runs(ctx, actor),
        )
    if outcome.ok:
        return events.CudaResumed(actor_id=actor_id, pids=_join(outcome.resumed))
    return events.CudaResumeFailed(
        actor_id=actor_id,
        message=f"{outcome.reason}; pid(s) {_join(outcome.failed)} not running",
        sandbox_survived=await _sandbox_runs(ctx, actor),
    )


async def delete(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """``runsc delete --force`` (a container the runtime does not know is already gone); a
    sandbox's app containers first, ``_pause`` last, then its root unmounted and removed.
    A sandbox believed gone whose root is still there (a teardown after a checkpoint that
    failed part-way) is deleted all the same: nothing of the activation may stay."""
    if actor.sandbox or _root_left(ctx, actor):
        try:
            if sandbox.is_sandbox(actor):
                await sandbox.delete(sandbox.of(ctx.runtime, actor))
            else:
                await ctx.runtime.delete(actor.actor_id, force=True)
        except runsc.ContainerNotFoundError:
            pass
        except exceptions.SubstrateGpuError as e:
            return events.EffectFailed(
                actor_id=actor.actor_id, effect="delete", message=_message(e)
            )
    return events.Deleted(actor_id=actor.actor_id)


def _root_left(ctx: EffectContext, actor: ActorView) -> bool:
    if not sandbox.is_sandbox(actor):
        return False
    try:
        return sandbox.has_root(sandbox.of(ctx.runtime, actor))
    except sandbox.SandboxError:
        return False


#: Effect implementations by the name used in ``machines/actor.yaml``.
EFFECTS: Mapping[str, Effect] = {
    "allocate": allocate,
    "inject": inject,
    "create": create,
    "start": start,
    "verify": verify.verify,
    "checkpoint": checkpoint,
    "restore": restore,
    "delete": delete,
    "probe": probe,
    "cuda_suspend": cuda_suspend,
    "cuda_resume": cuda_resume,
}


if set(EFFECTS) != set(registry.REGISTRY):
    raise errors.MachineDefinitionError(
        "effect implementations and the effect registry differ: "
        f"{sorted(set(EFFECTS) ^ set(registry.REGISTRY))}"
    )

#: The failure outcome of an effect for an unexpected error (a bug in a collaborator).
failure_outcome = registry.failure_outcome
