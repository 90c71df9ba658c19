"""The contract for detecting live CUDA contexts in a sandbox.

A sandbox holds a CUDA context while any of its host processes (under gVisor: the sentry
and gofer) has ``/dev/nvidiactl``, ``/dev/nvidia-uvm`` or ``/dev/nvidiaN`` open. Probes are
pluggable: the fd scanner is the default; ``cuda-checkpoint --get-state`` is another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class GpuClient:
    """One open handle on an NVIDIA device by a process of the sandbox."""

    pid: int
    """The host pid holding the handle."""
    fd: int
    """The file descriptor number."""
    target: str
    """What the descriptor points at, e.g. ``/dev/nvidiactl``."""


class CudaContextProbe(Protocol):
    """Finds live GPU clients among a sandbox's processes."""

    async def live_clients(self, pids: tuple[int, ...]) -> tuple[GpuClient, ...]:
        """Every NVIDIA device handle held by ``pids`` (and their descendants)."""
        ...
