"""Suspending and resuming every CUDA process of a sandbox, all or nothing.

:func:`suspend_processes` brings each process to ``checkpointed`` so the sandbox can be
saved; :func:`resume_processes` brings them back to ``running``. Both return a value that
records every step, for the state machine, metrics and the event log.

Decisions:

- **Lock everything, then checkpoint everything** (NVIDIA's own CRIU integration does the
  same): all CUDA work of the sandbox is quiesced before any device memory moves, and a lock
  that times out — the common failure — is undone by a cheap unlock of the others.
- **Every lock has a timeout.** Without one a lock can wait for ever on a kernel that never
  ends; with one the driver gives up with ``CUDA_ERROR_TIMEOUT`` and leaves that process
  running. The suspend is then **refused**, never half-done.
- **Rollback is driven by the state the tool reports**, not by what we think we did: a call
  killed by our own timeout leaves the process in an unknown state, so each touched process
  is queried and walked back (checkpointed → restore → unlock; locked → unlock). Rollback
  goes in reverse order and keeps going past a failure; processes it cannot bring back are
  reported as ``stranded`` and the outcome is ``failed`` — never silently lost.
- **Resumed means read back as ``running``.** After a process's restore and unlock its
  state is queried once more; anything but ``running`` (a process left ``locked`` hangs
  its first CUDA call for ever) makes it a failed process, named with the state read.
- **Onto other GPUs, with a device map.** A resume after a restore onto other GPUs passes
  ``--device-map`` to every process's restore (a rollback of a suspend never does: its
  processes never left their GPUs).
- Resume keeps going past a failed process too (bring back as many as possible) and names
  the ones left behind: a failed restore leaves a process ``checkpointed`` (the driver's
  behaviour), which the caller may retry.
"""

from __future__ import annotations

from collections.abc import Sequence

from substrate_gpu.cudackpt import api

#: The default ``--timeout`` of each lock, in milliseconds.
DEFAULT_LOCK_TIMEOUT_MS = 10_000


def _step(pid: int, action: api.Action, error: BaseException | None = None) -> api.ProcessStep:
    return api.ProcessStep(pid=pid, action=action, ok=error is None, error=str(error or ""))


def failure_cause(error: api.CudaCheckpointError) -> str:
    """A short, bounded label for a failure (a metric label, the head of a reason)."""
    if error.timed_out:
        return "tool timeout"
    if isinstance(error, api.LockTimeoutError):
        return "lock timeout"
    if isinstance(error, api.ToolUnavailableError):
        return "tool unavailable"
    if isinstance(error, api.NotACudaProcessError):
        return "not a CUDA process"
    if isinstance(error, api.CheckpointUnsupportedError):
        return "unsupported"
    return f"{error.action} failed"


async def _walk_back(
    tool: api.CudaCheckpointTool, pid: int, steps: list[api.ProcessStep], device_map: str = ""
) -> bool:
    """Bring one process back to ``running`` (its restore onto ``device_map``'s GPUs, when
    given); True when it got there."""
    try:
        state = await tool.get_state(pid)
    except api.CudaCheckpointError:
        return False
    if state == "failed":
        return False
    actions: list[api.Action] = []
    if state == "checkpointed":
        actions = ["restore", "unlock"]
    elif state == "locked":
        actions = ["unlock"]
    for action in actions:
        try:
            if action == "unlock":
                await tool.unlock(pid)
            elif device_map:
                await tool.restore(pid, device_map)
            else:
                await tool.restore(pid)
        except api.CudaCheckpointError as e:
            steps.append(_step(pid, action, e))
            return False
        steps.append(_step(pid, action))
    return True


async def suspend_processes(
    tool: api.CudaCheckpointTool,
    pids: Sequence[int],
    *,
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
) -> api.SuspendOutcome:
    """Lock, then checkpoint, every process of ``pids``; on any failure roll all back.

    Never raises for a tool failure (the outcome says it); errors of the runtime itself
    (the sandbox is gone) propagate.
    """
    order = tuple(dict.fromkeys(pids))
    steps: list[api.ProcessStep] = []
    touched: list[int] = []
    for phase in ("lock", "checkpoint"):
        for pid in order:
            try:
                if phase == "lock":
                    await tool.lock(pid, lock_timeout_ms)
                else:
                    await tool.checkpoint(pid)
            except api.CudaCheckpointError as e:
                steps.append(_step(pid, phase, e))
                if e.timed_out and pid not in touched:
                    touched.append(pid)  # killed mid-call: its state is unknown
                return await _roll_back(tool, order, touched, steps, e)
            steps.append(_step(pid, phase))
            if pid not in touched:
                touched.append(pid)
    return api.SuspendOutcome(status="suspended", pids=order, steps=tuple(steps))


async def _roll_back(
    tool: api.CudaCheckpointTool,
    order: tuple[int, ...],
    touched: list[int],
    steps: list[api.ProcessStep],
    cause: api.CudaCheckpointError,
) -> api.SuspendOutcome:
    stranded = [pid for pid in reversed(touched) if not await _walk_back(tool, pid, steps)]
    reason = f"{failure_cause(cause)}: pid {cause.pid}: {cause}"
    return api.SuspendOutcome(
        status="failed" if stranded else "refused",
        pids=order,
        reason=reason,
        steps=tuple(steps),
        stranded=tuple(sorted(stranded)),
    )


async def _not_running(tool: api.CudaCheckpointTool, pid: int) -> str:
    """Why ``pid`` is not ``running`` after its restore and unlock; empty when it is.

    The tool's exit status is not trusted alone: a restore can leave a process locked with
    every call succeeding (beta9 #1918), and a locked process's first CUDA call blocks for
    ever while its container looks healthy. Only ``--get-state`` reading ``running`` counts.
    """
    try:
        state = await tool.get_state(pid)
    except api.CudaCheckpointError as e:
        return f"its CUDA state could not be read after the resume: {e}"
    if state == "running":
        return ""
    return (
        f"reads {state!r} from cuda-checkpoint --get-state after restore and unlock, not "
        "'running' (its next CUDA call would block)"
    )


async def resume_processes(
    tool: api.CudaCheckpointTool, pids: Sequence[int], *, device_map: str = ""
) -> api.ResumeOutcome:
    """Bring every process of ``pids`` back to ``running`` (restore and unlock as needed;
    each restore onto ``device_map``'s GPUs when given: ``old=new,…``).

    Safe to repeat: a process already running is left alone. Never raises for a tool
    failure; errors of the runtime itself propagate.
    """
    steps: list[api.ProcessStep] = []
    resumed: list[int] = []
    failed: list[int] = []
    reason = ""
    for pid in dict.fromkeys(pids):
        before = len(steps)
        detail = ""
        if await _walk_back(tool, pid, steps, device_map):
            if len(steps) == before:  # it read 'running' and was left alone
                resumed.append(pid)
                continue
            detail = await _not_running(tool, pid)
            if not detail:
                resumed.append(pid)
                continue
        failed.append(pid)
        if not reason:
            errors = [s.error for s in steps[before:] if not s.ok]
            detail = detail or (
                errors[0] if errors else "its CUDA state could not be read, or is 'failed'"
            )
            reason = f"resume failed: pid {pid}: {detail}"
    return api.ResumeOutcome(
        resumed=tuple(resumed), failed=tuple(failed), steps=tuple(steps), reason=reason
    )
