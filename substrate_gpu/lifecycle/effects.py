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
- Checkpoint asks ``runtime.features()`` and passes ``leave_running=True`` when supported,
  so a failed checkpoint does not kill the sandbox. Before it, GPU actors are probed for
  live CUDA clients (a refusal, not an attempt). If runsc still reports live nvproxy clients
  (the probe raced a new context) the outcome is ``checkpoint_refused`` and whether the
  sandbox survived is *asked of the runtime*, not assumed.
- Each checkpoint goes to a fresh directory ``<checkpoint_root>/<actor>/<seq>``: a failed
  attempt never overwrites the last good image the actor can be recovered from.
- A successful checkpoint is followed by ``delete --force`` (``--leave-running`` resumed the
  sandbox; without it the stopped container still holds the id a restore needs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from substrate_gpu import exceptions
from substrate_gpu.lifecycle import events
from substrate_gpu.lifecycle.actors import ActorView
from substrate_gpu.probes.api import CudaContextProbe
from substrate_gpu.runsc import api as runsc

#: The outcome event types each effect can produce (the loader checks the effect's state
#: accepts every one of them). ``effect_timed_out`` comes from the pipeline's timeout.
OUTCOMES: Mapping[str, tuple[str, ...]] = {
    "inject": ("gpu_injected", "injection_failed", "effect_timed_out"),
    "create": ("sandbox_created", "effect_failed", "effect_timed_out"),
    "start": ("sandbox_started", "effect_failed", "effect_timed_out"),
    "checkpoint": (
        "checkpoint_written",
        "checkpoint_refused",
        "checkpoint_failed",
        "effect_timed_out",
    ),
    "restore": ("restored", "restore_failed", "effect_timed_out"),
    "delete": ("deleted", "effect_failed", "effect_timed_out"),
}

#: Default timeout per effect, seconds. Injection is local file work; runsc checkpoint and
#: restore move the whole sandbox memory.
DEFAULT_TIMEOUTS: Mapping[str, float] = {
    "inject": 60.0,
    "create": 60.0,
    "start": 30.0,
    "checkpoint": 600.0,
    "restore": 600.0,
    "delete": 60.0,
}


class GpuInjector(Protocol):
    """Injects the worker's GPUs into an OCI bundle (idempotent)."""

    async def __call__(self, bundle: Path) -> int:
        """Edit ``bundle``/config.json in place; return the number of device nodes injected."""
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


Effect = Callable[[EffectContext, ActorView, events.Event], Awaitable[events.Event]]


def _message(error: BaseException) -> str:
    return str(error) or type(error).__name__


async def _delete_quietly(ctx: EffectContext, actor_id: str) -> None:
    """Best-effort ``delete --force`` of a leftover container (cleanup, never the outcome)."""
    with contextlib.suppress(exceptions.SubstrateGpuError):
        await ctx.runtime.delete(actor_id, force=True)


async def inject(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """Inject the worker's GPUs into the actor's bundle."""
    try:
        devices = await ctx.injector(Path(actor.bundle))
    except exceptions.SubstrateGpuError as e:
        return events.InjectionFailed(actor_id=actor.actor_id, message=_message(e))
    return events.GpuInjected(actor_id=actor.actor_id, devices=devices)


async def create(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """``runsc [--nvproxy] create``, after deleting a leftover container of the actor."""
    if actor.sandbox:
        await _delete_quietly(ctx, actor.actor_id)
    try:
        await ctx.runtime.create(actor.actor_id, Path(actor.bundle), nvproxy=actor.gpu)
    except exceptions.SubstrateGpuError as e:
        await _delete_quietly(ctx, actor.actor_id)
        return events.EffectFailed(actor_id=actor.actor_id, effect="create", message=_message(e))
    return events.SandboxCreated(actor_id=actor.actor_id)


async def start(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """``runsc start``."""
    try:
        await ctx.runtime.start(actor.actor_id)
    except exceptions.SubstrateGpuError as e:
        return events.EffectFailed(actor_id=actor.actor_id, effect="start", message=_message(e))
    return events.SandboxStarted(actor_id=actor.actor_id)


async def _sandbox_runs(ctx: EffectContext, actor_id: str) -> bool:
    try:
        state = await ctx.runtime.state(actor_id)
    except exceptions.SubstrateGpuError:
        return False
    return state.status in {"running", "paused"}


async def checkpoint(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """Probe for live CUDA clients (GPU actors), then checkpoint and stop the sandbox."""
    actor_id = actor.actor_id
    if actor.gpu:
        try:
            state = await ctx.runtime.state(actor_id)
            clients = await ctx.probe.live_clients((state.pid,)) if state.pid else ()
        except exceptions.SubstrateGpuError as e:
            return events.CheckpointFailed(
                actor_id=actor_id,
                message=f"while probing for live CUDA contexts: {_message(e)}",
                sandbox_survived=await _sandbox_runs(ctx, actor_id),
            )
        if clients:
            first = clients[0]
            return events.CheckpointRefused(
                actor_id=actor_id,
                reason=events.REFUSED_LIVE_CONTEXT_PROBED,
                sandbox_survived=True,
                message=f"{len(clients)} live GPU handle(s), e.g. {first.target} "
                f"held by pid {first.pid} (fd {first.fd})",
            )
    features = await ctx.runtime.features()
    image = ctx.checkpoint_root / actor_id / str(event.seq)
    try:
        await ctx.runtime.checkpoint(actor_id, image, leave_running=features.leave_running)
    except runsc.LiveNvproxyClientsError as e:
        return events.CheckpointRefused(
            actor_id=actor_id,
            reason=events.REFUSED_LIVE_NVPROXY_CLIENTS,
            sandbox_survived=await _sandbox_runs(ctx, actor_id),
            message=_message(e),
        )
    except runsc.NotRestorableError as e:
        return events.CheckpointRefused(
            actor_id=actor_id,
            reason=events.REFUSED_NOT_RESTORABLE,
            sandbox_survived=await _sandbox_runs(ctx, actor_id),
            message=_message(e),
        )
    except exceptions.SubstrateGpuError as e:
        return events.CheckpointFailed(
            actor_id=actor_id,
            message=_message(e),
            sandbox_survived=await _sandbox_runs(ctx, actor_id),
        )
    # The image is good; the sandbox (resumed by --leave-running, or stopped) must go so the
    # id is free for the restore. A failure here leaves a container the next restore deletes.
    await _delete_quietly(ctx, actor_id)
    return events.CheckpointWritten(actor_id=actor_id, image_path=str(image))


async def restore(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """Re-inject GPUs (the bundle is re-unpacked before each restore), then restore."""
    actor_id = actor.actor_id
    image = actor.checkpoint
    if image is None:  # the machine's has_checkpoint guard makes this unreachable
        return events.RestoreFailed(actor_id=actor_id, message="no checkpoint to restore from")
    devices = 0
    try:
        if actor.gpu:
            devices = await ctx.injector(Path(actor.bundle))
        if actor.sandbox:
            await _delete_quietly(ctx, actor_id)
        await ctx.runtime.restore(actor_id, Path(actor.bundle), Path(image), nvproxy=actor.gpu)
    except exceptions.SubstrateGpuError as e:
        await _delete_quietly(ctx, actor_id)
        return events.RestoreFailed(actor_id=actor_id, message=_message(e))
    return events.Restored(actor_id=actor_id, image_path=image, devices=devices)


async def delete(ctx: EffectContext, actor: ActorView, event: events.Event) -> events.Event:
    """``runsc delete --force`` (a container the runtime does not know is already gone)."""
    if actor.sandbox:
        try:
            await ctx.runtime.delete(actor.actor_id, force=True)
        except runsc.ContainerNotFoundError:
            pass
        except exceptions.SubstrateGpuError as e:
            return events.EffectFailed(
                actor_id=actor.actor_id, effect="delete", message=_message(e)
            )
    return events.Deleted(actor_id=actor.actor_id)


#: Effect implementations by the name used in ``machines/actor.yaml``.
EFFECTS: Mapping[str, Effect] = {
    "inject": inject,
    "create": create,
    "start": start,
    "checkpoint": checkpoint,
    "restore": restore,
    "delete": delete,
}


def failure_outcome(effect: str, actor: ActorView, message: str) -> events.Event:
    """The failure outcome of ``effect`` for an unexpected error (a bug in a collaborator)."""
    actor_id = actor.actor_id
    if effect == "inject":
        return events.InjectionFailed(actor_id=actor_id, message=message)
    if effect == "checkpoint":
        # Unknown whether the sandbox survived: assume not, so the actor is recoverable from
        # its last good checkpoint rather than believed running.
        return events.CheckpointFailed(actor_id=actor_id, message=message, sandbox_survived=False)
    if effect == "restore":
        return events.RestoreFailed(actor_id=actor_id, message=message)
    return events.EffectFailed(actor_id=actor_id, effect=effect, message=message)
