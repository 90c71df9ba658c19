"""The worker API's app containers at SIGTERM, as upstream's ``gracefulShutdown`` stops them.

Once the lifecycle calls in flight have finished (:meth:`.WorkerService.shutdown` waits for
them), every app container of every running sandbox gets SIGTERM, and SIGKILL at the one
deadline (``--workload-grace``), then up to :data:`KILL_TIMEOUT` to be gone. ``_pause`` is
left: it is the sandbox, deleted by a later Terminate or by recovery. Each actor whose apps
all exited is recorded ``sandbox_exited`` (``running`` → ``stopped``), so the log says what
happened to it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Final

import anyio

from substrate_gpu import exceptions
from substrate_gpu._log import get_logger
from substrate_gpu.lifecycle import Agent, events, hooks
from substrate_gpu.runsc import api as runsc_api
from substrate_gpu.service import activations
from substrate_gpu.service.worker_calls import CallError

log = get_logger(__name__)

#: After SIGKILL, how long an app container may take to be gone (upstream's
#: ``containerKillTimeout``: not drawn from the grace, which has passed by then).
KILL_TIMEOUT: Final = 5.0
#: How often a container's state is read while waiting for it to exit.
EXIT_POLL: Final = 0.1


async def stop_apps(
    agent: Agent,
    runtime: runsc_api.SandboxRuntime | None,
    deadline: float,
    submit: Callable[[events.Event], Awaitable[hooks.Transition]],
) -> None:
    """SIGTERM every app container of every running activation, SIGKILL what is left at
    ``deadline`` (``anyio.current_time()``'s clock); ``submit`` records ``sandbox_exited``
    of each actor whose apps all exited."""
    sessions = [
        v for v in agent.actors() if activations.uid_of(v) and v.state == "running" and v.containers
    ]
    if not sessions or runtime is None:
        log.info("no app container to stop at shutdown", actors=len(sessions))
        return
    if not isinstance(runtime, runsc_api.PerActorRoot):
        log.warning("the runtime has no per-actor roots: app containers left running")
        return
    stopped: dict[str, list[bool]] = {v.actor_id: [] for v in sessions}
    async with anyio.create_task_group() as group:
        for view in sessions:
            actor_runtime = runtime.for_actor(view.actor_id)
            for name in view.containers:
                group.start_soon(
                    _stop_container, actor_runtime, view.actor_id, name, deadline, stopped
                )
    for actor_id, outcomes in stopped.items():
        if outcomes and all(outcomes):
            with contextlib.suppress(CallError):
                await submit(events.SandboxExited(actor_id=actor_id))
    log.info("app containers stopped at shutdown", actors=len(sessions))


async def _stop_container(
    runtime: runsc_api.SandboxRuntime,
    actor_id: str,
    name: str,
    deadline: float,
    stopped: dict[str, list[bool]],
) -> None:
    """SIGTERM ``name``, wait for it until ``deadline``, then SIGKILL (upstream's
    ``killContainer``); whether it is gone is appended to ``stopped[actor_id]``."""
    log.info("sending SIGTERM to container", actor=actor_id, container=name)
    try:
        await runtime.kill(name, "SIGTERM")
    except runsc_api.ContainerNotFoundError:
        stopped[actor_id].append(True)
        return
    except exceptions.SubstrateGpuError as e:
        log.warning("SIGTERM to container failed", actor=actor_id, container=name, error=str(e))
    with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
        if await _exited(runtime, name):
            stopped[actor_id].append(True)
            return
    log.warning("grace period expired; killing container", actor=actor_id, container=name)
    with contextlib.suppress(exceptions.SubstrateGpuError):
        await runtime.kill(name, "SIGKILL")
    with anyio.move_on_after(KILL_TIMEOUT):
        if await _exited(runtime, name):
            stopped[actor_id].append(True)
            return
    log.error("container did not exit even after SIGKILL", actor=actor_id, container=name)
    stopped[actor_id].append(False)


async def _exited(runtime: runsc_api.SandboxRuntime, name: str) -> bool:
    """Wait until ``runsc state`` says ``name`` is stopped (or gone); True then."""
    while True:
        try:
            state = await runtime.state(name)
        except runsc_api.ContainerNotFoundError:
            return True
        except exceptions.SubstrateGpuError:
            state = None
        if state is not None and state.status == "stopped":
            return True
        await anyio.sleep(EXIT_POLL)
