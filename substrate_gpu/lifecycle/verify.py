"""The ``verify`` effect: a started or restored GPU sandbox runs only once it is seen to be
what the actor was given (issue 26 items 2 and 6).

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
sandbox, the GPU containers are each checked the same way, under the per-actor runsc root.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from substrate_gpu import _process, exceptions, preflight
from substrate_gpu.lifecycle import allocation, events, gpu
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


def _cuda_tools(settings: gpu.GpuSettings, container_id: str) -> list[gpu.SandboxCudaTool]:
    """cuda-checkpoint in the sandbox, in the order asked: the exec route's, then the one runsc
    ran (``--cuda-checkpoint-path`` is a path in the container, as gVisor's flag says)."""
    tools = [settings.sandbox_tool(container_id)] if settings.sandbox_tool is not None else []
    if settings.sandbox_exec is not None and settings.cuda_checkpoint_path is not None:
        path = str(settings.cuda_checkpoint_path)
        tools.append(gpu.exec_tool(settings.sandbox_exec, path)(container_id))
    return tools


async def _stuck_process(settings: gpu.GpuSettings, container_id: str) -> str | None:
    """Why a restored CUDA process will not run (None: every one reads ``running``); raises
    :class:`CannotCheck` when there is no tool to ask."""
    tools = _cuda_tools(settings, container_id)
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
    settings: gpu.GpuSettings, container_id: str, own: tuple[str, ...]
) -> str | None:
    """Why the sandbox's GPUs are not exactly ``own`` (None: they are)."""
    if settings.sandbox_exec is None:
        raise CannotCheck("no sandbox exec to list its GPUs with")
    result = await settings.sandbox_exec.exec(
        container_id, (settings.sandbox_nvidia_smi, "-L"), LIST_TIMEOUT
    )
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
        f"({', '.join(own)}): other actors' {', '.join(extra) or 'none'}; missing "
        f"{', '.join(missing) or 'none'}"
    )


async def verify(ctx: Context, actor: ActorView, event: events.Event) -> events.Event:
    """Check a started or restored GPU sandbox (see the module doc)."""
    settings = ctx.gpu
    actor_id = actor.actor_id
    if settings is None:
        return events.GpusVerified(actor_id=actor_id, message="no GPU settings: nothing checked")
    notes: list[str] = []
    try:
        problem = None
        if isinstance(event, events.Restored) and event.cuda_route == events.ROUTE_RUNSC:
            try:
                problem = await _stuck_process(settings, actor_id)
                notes.append("every restored CUDA process reads 'running'")
            except CannotCheck as e:
                notes.append(f"CUDA states not read: {e}")
        own = gpu.own_gpu_uuids(settings, ctx.allocator, actor.gpu_devices)
        if problem is None and not own:
            notes.append("visible GPUs not checked: the actor's GPU UUIDs are unknown")
        elif problem is None:
            try:
                problem = await _foreign_gpus(settings, actor_id, own)
                notes.append(f"the sandbox sees exactly {', '.join(own)}")
            except CannotCheck as e:
                notes.append(f"visible GPUs not checked: {e}")
    except exceptions.SubstrateGpuError as e:
        problem = f"while checking the sandbox's GPUs: {e}"
    if problem is None:
        return events.GpusVerified(actor_id=actor_id, message="; ".join(notes))
    # Not left running with a GPU it was not given, or hung; a failure here leaves the
    # container for the next create/restore to delete (the actor keeps ``sandbox``).
    with contextlib.suppress(exceptions.SubstrateGpuError):
        await ctx.runtime.delete(actor_id, force=True)
    return events.GpuVerificationFailed(actor_id=actor_id, message=problem)
