"""Suspending GPU actors with their CUDA state: NVIDIA's ``cuda-checkpoint``.

``api`` holds the contract (:class:`CudaCheckpointTool`, the outcomes, the typed errors);
``argv`` builds the command lines; ``errors`` maps the tool's messages to typed errors;
``tool`` runs it inside the sandbox through ``runsc exec``; ``suspend`` suspends and resumes
all CUDA processes of a sandbox, all or nothing; ``routing`` picks the suspend route. See
``docs/gpu-suspend.md``.
"""

from __future__ import annotations

from substrate_gpu.cudackpt.api import (
    CheckpointUnsupportedError,
    CudaCheckpointError,
    CudaCheckpointTool,
    CudaProcessState,
    IllegalStateError,
    LockTimeoutError,
    NotACudaProcessError,
    ProcessStep,
    ResumeOutcome,
    SuspendOutcome,
    ToolUnavailableError,
)
from substrate_gpu.cudackpt.routing import (
    Route,
    RouteName,
    SuspendPolicy,
    choose_suspend_route,
)
from substrate_gpu.cudackpt.suspend import (
    DEFAULT_LOCK_TIMEOUT_MS,
    resume_processes,
    suspend_processes,
)
from substrate_gpu.cudackpt.tool import ExecCudaCheckpoint, ToolTimeouts

__all__ = [
    "DEFAULT_LOCK_TIMEOUT_MS",
    "CheckpointUnsupportedError",
    "CudaCheckpointError",
    "CudaCheckpointTool",
    "CudaProcessState",
    "ExecCudaCheckpoint",
    "IllegalStateError",
    "LockTimeoutError",
    "NotACudaProcessError",
    "ProcessStep",
    "ResumeOutcome",
    "Route",
    "RouteName",
    "SuspendOutcome",
    "SuspendPolicy",
    "ToolTimeouts",
    "ToolUnavailableError",
    "choose_suspend_route",
    "resume_processes",
    "suspend_processes",
]
