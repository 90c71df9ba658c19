"""The production :class:`~substrate_gpu.cudackpt.api.CudaCheckpointTool`: ``cuda-checkpoint``
run **inside the sandbox**, through the runtime's exec (``runsc exec ID cuda-checkpoint …``).

Why inside: under gVisor the CUDA processes live in the sentry's own process table; their
pids, and the driver handles nvproxy keeps for them, are invisible to a host-side tool. The
tool must therefore be in the sandbox (the image ships it, or the bundle bind-mounts the
host's read-only: ``tool_path`` names it as the sandbox sees it) and pids are
**sandbox pids**.

Decisions:

- Every call has its own timeout, enforced by the exec (the process group of ``runsc exec``
  is killed). A lock gets ``--timeout`` too, so the *tool* gives up first and reports a
  clean ``CUDA_ERROR_TIMEOUT`` (process still running) before our timeout fires; the exec
  timeout stays the backstop for a hung tool.
- A non-zero exit is classified from the tool's output (:mod:`.errors`); runsc's own
  failures (container gone) surface as the runtime's errors, unchanged.
- ``get_state`` refuses output that is not one of the four states: a tool that printed
  something else is not a tool we understand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast, get_args

from substrate_gpu import _process, exceptions
from substrate_gpu.cudackpt import api, argv, errors
from substrate_gpu.runsc import api as runsc_api

#: Where the tool is looked up in the sandbox when not told otherwise (the exec's PATH).
DEFAULT_TOOL = "cuda-checkpoint"

_STATES: frozenset[str] = frozenset(get_args(api.CudaProcessState))

#: A POSIX sh scan of the sandbox's /proc for processes holding an NVIDIA device: the
#: candidates to suspend, as sandbox pids (needs ``sh`` and ``readlink`` in the image).
#: Same nodes as the host-side probe (``probes.fd_scan``): ctl, uvm and the GPUs.
GPU_PROCESS_SCAN = (
    'for d in /proc/[0-9]*; do for f in "$d"/fd/*; do '
    'case "$(readlink "$f" 2>/dev/null)" in '
    "/dev/nvidiactl|/dev/nvidia-uvm|/dev/nvidia-uvm-tools|/dev/nvidia[0-9]*) "
    'echo "${d#/proc/}"; break;; esac; done; done'
)


@dataclass(frozen=True)
class ToolTimeouts:
    """Seconds each ``cuda-checkpoint`` call may take (through the exec)."""

    get_state: float = 10.0
    """``--get-state``: a query."""
    lock_grace: float = 10.0
    """Added to the lock's own ``--timeout``: the exec's backstop beyond the tool's."""
    checkpoint: float = 300.0
    """``checkpoint``: copies device memory to the host (GiBs)."""
    restore: float = 300.0
    """``restore``: copies it back."""
    unlock: float = 30.0
    """``unlock``."""
    probe: float = 10.0
    """``--help``: is the tool there at all."""


@dataclass
class ExecCudaCheckpoint:
    """``cuda-checkpoint`` for the processes of sandbox ``container_id``, via ``runsc exec``."""

    runtime: runsc_api.SandboxExec
    """Runs commands in the sandbox (:class:`~substrate_gpu.runsc.driver.RunscDriver`)."""
    container_id: str
    """The container whose processes are suspended (a GPU container of the sandbox)."""
    tool_path: str = DEFAULT_TOOL
    """The tool as the sandbox sees it (a path, or a name on the container's PATH)."""
    timeouts: ToolTimeouts = field(default_factory=ToolTimeouts)
    """Per-call timeouts."""

    async def _run(
        self, args: tuple[str, ...], *, pid: int, action: str, timeout: float
    ) -> _process.CommandResult:
        doing = f"running cuda-checkpoint {action} on pid {pid} in container {self.container_id}"
        try:
            result = await self.runtime.exec(self.container_id, args, timeout)
        except exceptions.ExternalCommandError as e:
            if not e.timed_out:
                raise
            raise api.CudaCheckpointError(
                f"while {doing}: no answer within {timeout:g}s; the exec was killed and the "
                "process's CUDA state is unknown (query it before deciding)",
                pid=pid,
                action=action,
                argv=e.argv,
                returncode=None,
                stderr=e.stderr,
                timed_out=True,
            ) from e
        if result.returncode != 0:
            output = f"{result.stderr}\n{result.stdout}".strip()
            cls = errors.error_class(output)
            if cls is api.LockTimeoutError and action != "lock":
                cls = api.CudaCheckpointError
            raise cls(
                f"while {doing}: cuda-checkpoint exited with status {result.returncode}: "
                f"{_process.tail(output) or '(no output)'}",
                pid=pid,
                action=action,
                argv=result.argv,
                returncode=result.returncode,
                stderr=result.stderr,
            )
        return result

    async def available(self) -> bool:
        """Whether ``cuda-checkpoint`` runs in the sandbox (``--help`` exits 0).

        Runtime failures (the container is gone) propagate: "no tool" and "no sandbox" are
        different answers.
        """
        args = argv.help_(self.tool_path)
        result = await self.runtime.exec(self.container_id, args, self.timeouts.probe)
        return result.returncode == 0

    async def gpu_processes(self) -> tuple[int, ...]:
        """Sandbox pids holding an NVIDIA device now (:data:`GPU_PROCESS_SCAN`), sorted.

        A checkpointed process holds none: resume the pids a suspend recorded, not these.
        """
        args = ("/bin/sh", "-c", GPU_PROCESS_SCAN)
        result = await self.runtime.exec(self.container_id, args, self.timeouts.probe)
        if result.returncode != 0:
            raise api.CudaCheckpointError(
                f"while listing the GPU processes of container {self.container_id}: the scan "
                f"exited with status {result.returncode}: "
                f"{_process.tail(result.stderr) or '(no output)'}",
                pid=0,
                action="scan",
                argv=result.argv,
                returncode=result.returncode,
                stderr=result.stderr,
            )
        return tuple(sorted({int(w) for w in result.stdout.split() if w.isdigit()}))

    async def get_state(self, pid: int) -> api.CudaProcessState:
        """``--get-state --pid P``, checked against the four states."""
        result = await self._run(
            argv.get_state(self.tool_path, pid),
            pid=pid,
            action="get-state",
            timeout=self.timeouts.get_state,
        )
        state = result.stdout.strip()
        if state not in _STATES:
            raise api.CudaCheckpointError(
                f"while querying the CUDA state of pid {pid} in container {self.container_id}: "
                f"cuda-checkpoint printed {_process.tail(state, 200) or '(nothing)'!r}, "
                f"not one of {sorted(_STATES)}",
                pid=pid,
                action="get-state",
                argv=result.argv,
                returncode=result.returncode,
                stderr=result.stderr,
            )
        return cast("api.CudaProcessState", state)

    async def lock(self, pid: int, timeout_ms: int) -> None:
        """``--action lock --timeout MS --pid P``."""
        await self._run(
            argv.action(self.tool_path, "lock", pid, timeout_ms=timeout_ms),
            pid=pid,
            action="lock",
            timeout=timeout_ms / 1000 + self.timeouts.lock_grace,
        )

    async def checkpoint(self, pid: int) -> None:
        """``--action checkpoint --pid P``."""
        await self._run(
            argv.action(self.tool_path, "checkpoint", pid),
            pid=pid,
            action="checkpoint",
            timeout=self.timeouts.checkpoint,
        )

    async def restore(self, pid: int, device_map: str = "") -> None:
        """``--action restore --pid P [--device-map M]``."""
        await self._run(
            argv.action(self.tool_path, "restore", pid, device_map=device_map),
            pid=pid,
            action="restore",
            timeout=self.timeouts.restore,
        )

    async def unlock(self, pid: int) -> None:
        """``--action unlock --pid P``."""
        await self._run(
            argv.action(self.tool_path, "unlock", pid),
            pid=pid,
            action="unlock",
            timeout=self.timeouts.unlock,
        )
