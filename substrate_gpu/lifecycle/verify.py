"""The ``verify`` effect: a started or restored GPU sandbox runs only once it is seen to be
what the actor was given.

Two failures look healthy from outside:

- **Another actor's GPUs are visible.** nvproxy has exposed every host GPU under DRA
  allocations; GPUs are never shared here, so ``nvidia-smi -L`` through ``runsc exec`` must
  list exactly the actor's own UUIDs (:func:`~substrate_gpu.lifecycle.gpu.own_gpu_uuids`).
- **A restored CUDA process is left locked** (beta9 #1918): its first CUDA call blocks for
  ever while the container looks running. After runsc's route restored CUDA state (inside
  ``runsc restore``), every sandbox process holding an NVIDIA device must read ``running``
  from ``cuda-checkpoint --get-state``. (The exec route reads each pid back in
  ``cuda_resume`` already.)

Either failure deletes the sandbox (it must not keep running with a GPU it was not given,
or hang) and fails the actor, naming the UUIDs or the pid and the state read; a retry
starts again. What cannot be checked is said in the outcome's message, never failed: the
actor's UUIDs unknown (a spec naming GPUs by index only), no ``sandbox_exec``, no tool.

The container checked is the actor's (container id = actor id). In a multi-container
sandbox, the app containers are each checked the same way, under the per-actor runsc root:
each against the actor's GPUs, or, when its containers name their own (GPUs per container),
each against its own set. A container given none must list none; one with no
``nvidia-smi`` at all (only the driver mounts bring it) lists none.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Protocol

from substrate_gpu import _process, exceptions, preflight
from substrate_gpu.lifecycle import allocation, events, gpu, sandbox
from substrate_gpu.lifecycle.actors import ActorView
from substrate_gpu.runsc import api as runsc_api


class Context(Protocol):
    """What ``verify`` reads of :class:`~substrate_gpu.lifecycle.effects.EffectContext`
    (a Protocol: effects imports this module to register the effect)."""

    @property
    def runtime(self) -> runsc_api.SandboxRuntime: ...
    @property
    def gpu(self) -> gpu.GpuSettings | None: ...
    @property
    def allocator(self) -> allocation.GpuAllocator | None: ...


#: Seconds ``nvidia-smi -L`` may take in the sandbox.
LIST_TIMEOUT = 30.0


class CannotCheck(Exception):
    """A check this node cannot make (said in the outcome, not a failure)."""


@dataclass(frozen=True)
class _Target:
    """A container the checks run in, and the exec that reaches it."""

    runner: runsc_api.SandboxExec | None
    container_id: str
    own_root: bool
    """A sandbox's app container under the actor's own runsc root (the node's exec-route
    tool, bound to the node's root, cannot reach it)."""
    granted: str | None = None
    """The container's own GPUs, comma-separated ("": none), with GPUs per container;
    None: the actor's."""


def _targets(ctx: Context, settings: gpu.GpuSettings, actor: ActorView) -> list[_Target]:
    """Where the GPUs live: the actor's one container, or each app container of its sandbox
    (``_pause`` holds none) through the actor's own runsc root."""
    if not sandbox.is_sandbox(actor):
        return [_Target(settings.sandbox_exec, actor.actor_id, own_root=False)]
    runtime = sandbox.of(ctx.runtime, actor).runtime
    runner = runtime if isinstance(runtime, runsc_api.SandboxExec) else None
    aliases = ctx.allocator.worker.aliases if ctx.allocator is not None else {}
    targets = []
    for name in actor.containers:
        own = sandbox.container_gpus(actor, name, aliases)
        granted = None if own is None else ",".join(own)
        targets.append(_Target(runner, name, own_root=True, granted=granted))
    return targets


def _own_uuids(
    ctx: Context, settings: gpu.GpuSettings, actor: ActorView, target: _Target
) -> tuple[str, ...] | None:
    """The UUIDs ``target`` must see; None when they cannot be resolved."""
    if target.granted == "":
        return ()
    granted = actor.gpu_devices if target.granted is None else target.granted
    return gpu.own_gpu_uuids(settings, ctx.allocator, granted) or None


def _cuda_tools(settings: gpu.GpuSettings, target: _Target) -> list[gpu.SandboxCudaTool]:
    """cuda-checkpoint in the sandbox, in the order asked: the exec route's, then the one runsc
    ran (``--cuda-checkpoint-path`` is a path in the container, as gVisor's flag says)."""
    tools = (
        [settings.sandbox_tool(target.container_id)]
        if settings.sandbox_tool is not None and not target.own_root
        else []
    )
    if target.runner is not None and settings.cuda_checkpoint_path is not None:
        path = str(settings.cuda_checkpoint_path)
        tools.append(gpu.exec_tool(target.runner, path)(target.container_id))
    return tools


async def _stuck_process(settings: gpu.GpuSettings, target: _Target) -> str | None:
    """Why a restored CUDA process will not run (None: every one reads ``running``); raises
    :class:`CannotCheck` when there is no tool to ask."""
    tools = _cuda_tools(settings, target)
    if not tools:
        raise CannotCheck("no cuda-checkpoint is configured to read them with")
    for tool in tools:
        if await tool.available():
            break
    else:
        raise CannotCheck("cuda-checkpoint does not run in the sandbox")
    for pid in await tool.gpu_processes():
        state = await tool.get_state(pid)
        if state != "running":
            return (
                f"pid {pid} reads {state!r} from cuda-checkpoint --get-state after runsc "
                "restored its CUDA state, not 'running' (its next CUDA call would block)"
            )
    return None


async def _foreign_gpus(
    settings: gpu.GpuSettings, target: _Target, own: tuple[str, ...]
) -> str | None:
    """Why the sandbox's GPUs are not exactly ``own`` (None: they are). A GPU named twice
    (by index and by UUID) is in ``own`` once."""
    own = tuple(dict.fromkeys(own))
    if target.runner is None:
        raise CannotCheck("no sandbox exec to list its GPUs with")
    try:
        result = await target.runner.exec(
            target.container_id, (settings.sandbox_nvidia_smi, "-L"), LIST_TIMEOUT
        )
    except runsc_api.RunscError as e:
        if not own and _no_such_program(str(e)):
            return None  # no nvidia-smi: no driver mounts, and none expected
        raise
    if result.returncode != 0 and not own and _no_such_program(result.stderr + result.stdout):
        return None
    if result.returncode != 0:
        output = _process.tail(f"{result.stderr}\n{result.stdout}") or "(no output)"
        return (
            f"its GPUs could not be listed: {settings.sandbox_nvidia_smi} -L exited with "
            f"status {result.returncode}: {output}"
        )
    seen = preflight.parse_gpu_list(result.stdout)
    if sorted(seen) == sorted(own):
        return None
    extra = [u for u in seen if u not in own]
    missing = [u for u in own if u not in seen]
    return (
        f"the sandbox sees GPU(s) {', '.join(seen) or 'none'}, not exactly its own "
        f"({', '.join(own) or 'none'}): other actors' {', '.join(extra) or 'none'}; missing "
        f"{', '.join(missing) or 'none'}"
    )


def _no_such_program(output: str) -> bool:
    """The exec failed because the program is not in the container."""
    text = output.lower()
    return "no such file or directory" in text or "not found" in text


async def verify(ctx: Context, actor: ActorView, event: events.Event) -> events.Event:
    """Check a started or restored GPU sandbox (see the module doc)."""
    settings = ctx.gpu
    actor_id = actor.actor_id
    if settings is None:
        return events.GpusVerified(actor_id=actor_id, message="no GPU settings: nothing checked")
    notes: list[str] = []
    try:
        problem = None
        targets = _targets(ctx, settings, actor)
        if isinstance(event, events.Restored) and event.cuda_route == events.ROUTE_RUNSC:
            try:
                for target in targets:
                    problem = problem or await _stuck_process(settings, target)
                notes.append("every restored CUDA process reads 'running'")
            except CannotCheck as e:
                notes.append(f"CUDA states not read: {e}")
        owns = [(target, _own_uuids(ctx, settings, actor, target)) for target in targets]
        if problem is None and any(own is None for _, own in owns):
            notes.append("visible GPUs not checked: the actor's GPU UUIDs are unknown")
        elif problem is None:
            try:
                seen: list[str] = []
                for target, resolved in owns:
                    own = resolved or ()
                    found = await _foreign_gpus(settings, target, own)
                    if found is not None and sandbox.is_sandbox(actor):
                        found = f"container {target.container_id}: {found}"
                    problem = problem or found
                    if target.granted is not None:
                        seen.append(f"{target.container_id} {', '.join(own) or 'none'}")
                    elif not seen:
                        seen.append(", ".join(own))
                if any(t.granted is not None for t, _ in owns):
                    notes.append(f"each container sees exactly its own: {'; '.join(seen)}")
                else:
                    notes.append(f"the sandbox sees exactly {seen[0] if seen else ''}")
            except CannotCheck as e:
                notes.append(f"visible GPUs not checked: {e}")
    except exceptions.SubstrateGpuError as e:
        problem = f"while checking the sandbox's GPUs: {e}"
    if problem is None:
        return events.GpusVerified(actor_id=actor_id, message="; ".join(notes))
    # Not left running with a GPU it was not given, or hung; a failure here leaves the
    # container for the next create/restore to delete (the actor keeps ``sandbox``).
    with contextlib.suppress(exceptions.SubstrateGpuError):
        if sandbox.is_sandbox(actor):
            await sandbox.delete_quietly(sandbox.of(ctx.runtime, actor))
        else:
            await ctx.runtime.delete(actor_id, force=True)
    return events.GpuVerificationFailed(actor_id=actor_id, message=problem)
