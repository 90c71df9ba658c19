"""The contract for suspending CUDA processes with NVIDIA's ``cuda-checkpoint``.

``cuda-checkpoint`` (driver ≥ 550; ``--timeout`` needs 570) moves one process's CUDA state
between the GPU and host memory, through the driver's four-state machine::

    running --lock--> locked --checkpoint--> checkpointed --restore--> locked --unlock--> running

A process whose CUDA state is ``checkpointed`` holds no GPU resource, so gVisor can save the
sandbox. The lifecycle codes against :class:`CudaCheckpointTool` (one sandbox's CUDA
processes) and gets back :class:`SuspendOutcome` / :class:`ResumeOutcome` values that say
exactly what happened to every process, so each outcome can become a transition.

Errors are typed from the CUDA error string the tool prints (``cuGetErrorString``: stable
across driver releases), never from the prose around it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NewType, Protocol

from substrate_gpu import exceptions

#: A process id as the tool sees it: **inside the sandbox** (the exec route), or on the host.
Pid = NewType("Pid", int)

#: ``cuda-checkpoint --get-state`` output (``CUprocessState``).
CudaProcessState = Literal["running", "locked", "checkpointed", "failed"]

#: The per-process actions of ``--action``.
Action = Literal["lock", "checkpoint", "restore", "unlock"]

#: Where one suspend attempt ended.
SuspendStatus = Literal["suspended", "refused", "failed"]


class CudaCheckpointError(exceptions.ExternalCommandError):
    """``cuda-checkpoint`` failed on one process; subclasses name the cases callers react to.

    ``pid`` is the process, ``action`` what was asked (``get-state``, ``lock``, …).
    """

    def __init__(
        self,
        message: str,
        *,
        pid: int,
        action: str,
        argv: tuple[str, ...],
        returncode: int | None,
        stderr: str,
        timed_out: bool = False,
    ) -> None:
        self.pid = pid
        self.action = action
        super().__init__(
            message, argv=argv, returncode=returncode, stderr=stderr, timed_out=timed_out
        )


class LockTimeoutError(CudaCheckpointError):
    """The lock did not succeed within ``--timeout`` (``CUDA_ERROR_TIMEOUT``): the process
    keeps running, untouched."""


class NotACudaProcessError(CudaCheckpointError):
    """The pid is unknown, or holds no CUDA context (``invalid argument``,
    ``initialization error``)."""


class IllegalStateError(CudaCheckpointError):
    """The action does not fit the process's state (``CUDA_ERROR_ILLEGAL_STATE``), e.g.
    checkpointing a process that is not locked."""


class CheckpointUnsupportedError(CudaCheckpointError):
    """The driver cannot checkpoint this process or at all (``operation not supported``,
    ``OS call failed or operation not supported on this OS``): driver < 550, UVM or IPC
    memory."""


class ToolUnavailableError(CudaCheckpointError):
    """``cuda-checkpoint`` is not in the sandbox (the exec found no such executable)."""


@dataclass(frozen=True)
class ProcessStep:
    """One thing done (or attempted) to one process during a suspend or resume."""

    pid: int
    """The process."""
    action: Action
    """What was done."""
    ok: bool
    """Whether it succeeded."""
    error: str = ""
    """The tool's message when it did not."""


@dataclass(frozen=True)
class SuspendOutcome:
    """What :func:`~substrate_gpu.cudackpt.suspend.suspend_processes` did, all of it."""

    status: SuspendStatus
    """``suspended``: every process is ``checkpointed``. ``refused``: nothing is changed —
    a lock timed out (or a process was not suspendable) and every process already touched
    was rolled back to ``running``. ``failed``: a step failed *and* the rollback did not
    bring every process back (see ``stranded``)."""
    pids: tuple[int, ...]
    """The processes asked for, in the order they were handled."""
    reason: str = ""
    """Why it was not ``suspended``: ``lock timeout``, ``checkpoint failed``, … with the pid
    and the tool's message."""
    steps: tuple[ProcessStep, ...] = ()
    """Every action run, in order, rollback included."""
    stranded: tuple[int, ...] = ()
    """Processes left neither ``running`` nor ``checkpointed`` by a failed rollback."""

    @property
    def suspended(self) -> bool:
        """Every process is checkpointed: the sandbox may be saved."""
        return self.status == "suspended"


@dataclass(frozen=True)
class ResumeOutcome:
    """What :func:`~substrate_gpu.cudackpt.suspend.resume_processes` did."""

    resumed: tuple[int, ...]
    """Processes now ``running``."""
    failed: tuple[int, ...] = ()
    """Processes that could not be brought back (still ``checkpointed`` or ``locked``)."""
    steps: tuple[ProcessStep, ...] = ()
    """Every action run, in order."""
    reason: str = ""
    """The first failure, with the pid and the tool's message."""

    @property
    def ok(self) -> bool:
        """Every process runs again."""
        return not self.failed


class CudaCheckpointTool(Protocol):
    """``cuda-checkpoint`` for the CUDA processes of one sandbox."""

    async def get_state(self, pid: int) -> CudaProcessState:
        """``--get-state --pid P``."""
        ...

    async def lock(self, pid: int, timeout_ms: int) -> None:
        """``--action lock --timeout MS --pid P``; :class:`LockTimeoutError` leaves it running."""
        ...

    async def checkpoint(self, pid: int) -> None:
        """``--action checkpoint --pid P`` (the process must be locked)."""
        ...

    async def restore(self, pid: int, device_map: str = "") -> None:
        """``--action restore --pid P [--device-map old=new,…]`` (checkpointed → locked;
        ``device_map``: onto other GPUs, driver ≥ 580)."""
        ...

    async def unlock(self, pid: int) -> None:
        """``--action unlock --pid P`` (locked → running)."""
        ...
