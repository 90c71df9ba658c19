"""An in-process runsc and CUDA context probe, for machines where runc cannot run.

:class:`SimulatedSandboxes` is a :class:`~substrate_gpu.runsc.api.SandboxRuntime` and a
:class:`~substrate_gpu.probes.api.CudaContextProbe` at once: it models what the lifecycle
depends on (container states, ``--leave-running``, a checkpoint image on disk, gVisor's
refusal to save a sandbox holding a GPU handle) with runsc's own error texts, so the
production error classification runs unchanged above it. The demo falls back to it without
root or runc; embedders can drive an :class:`~substrate_gpu.lifecycle.Agent` with it in
their own tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from substrate_gpu.probes.api import GpuClient
from substrate_gpu.runsc import api as runsc

#: Bundle annotation read by :class:`SimulatedSandboxes`: the workload holds a GPU handle until
#: this path exists in its rootfs (real runc ignores it: there the workload's script does it).
HOLDS_GPU_UNTIL: Final = "substrate-gpu.demo/holds-gpu-until"


@dataclass
class _Sandbox:
    bundle: Path
    status: runsc.ContainerStatus
    pid: int
    holds_until: str | None


class SimulatedSandboxes:
    """An in-process runsc (:class:`SandboxRuntime`) and CUDA probe, for machines without runc.

    Models what the lifecycle depends on: container states, ``--leave-running``, a checkpoint
    image on disk, and gVisor's refusal to save a sandbox holding a GPU handle (the workload
    holds one while its bundle's :data:`HOLDS_GPU_UNTIL` path does not exist in its rootfs).
    """

    def __init__(self) -> None:
        self._sandboxes: dict[str, _Sandbox] = {}
        self._next_pid = 40_000

    def _error(self, cls: type[runsc.RunscError], message: str) -> runsc.RunscError:
        return cls(message, argv=("simulated-runsc",), returncode=128, stderr=message)

    def _get(self, container_id: str) -> _Sandbox:
        sandbox = self._sandboxes.get(container_id)
        if sandbox is None:
            raise self._error(
                runsc.ContainerNotFoundError,
                "FetchSpec failed: loading container: file does not exist",
            )
        return sandbox

    def _holds_gpu(self, sandbox: _Sandbox) -> bool:
        if sandbox.status != "running" or sandbox.holds_until is None:
            return False
        return not (sandbox.bundle / "rootfs" / sandbox.holds_until.lstrip("/")).exists()

    def _new(self, container_id: str, bundle: Path, status: runsc.ContainerStatus) -> None:
        if container_id in self._sandboxes:
            raise self._error(runsc.RunscError, f"container {container_id!r} already exists")
        config = json.loads((bundle / "config.json").read_text())
        holds = config.get("annotations", {}).get(HOLDS_GPU_UNTIL)
        self._next_pid += 1
        self._sandboxes[container_id] = _Sandbox(bundle, status, self._next_pid, holds)

    async def features(self) -> runsc.RunscFeatures:
        return runsc.RunscFeatures(
            version="runsc version simulated (in-process)",
            leave_running=True,
            cuda_checkpoint_path=False,
            nvproxy_driver_version=False,
            list_supported_drivers=False,
        )

    async def create(self, container_id: str, bundle: Path, *, nvproxy: bool) -> None:
        self._new(container_id, bundle, "created")

    async def start(self, container_id: str) -> None:
        sandbox = self._get(container_id)
        if sandbox.status != "created":
            raise self._error(
                runsc.WrongStateError,
                f'starting container: cannot start container "{container_id}" '
                f"in state {sandbox.status}",
            )
        sandbox.status = "running"

    async def checkpoint(
        self,
        container_id: str,
        image_path: Path,
        *,
        leave_running: bool,
        cuda_checkpoint_path: Path | None = None,
        cuda_checkpoint_sequential: bool = False,
    ) -> None:
        sandbox = self._get(container_id)
        if sandbox.status not in ("created", "running", "paused"):
            raise self._error(
                runsc.ContainerStoppedError,
                f'checkpoint failed: cannot checkpoint container "{container_id}" '
                f"in state {sandbox.status}",
            )
        if self._holds_gpu(sandbox):
            if not leave_running:
                sandbox.status = "stopped"
            raise self._error(
                runsc.LiveNvproxyClientsError,
                f'checkpoint failed: checkpointing container "{container_id}": saving kernel '
                "state: encoding error: can't save with live nvproxy clients",
            )
        image_path.mkdir(parents=True, exist_ok=True)
        (image_path / "checkpoint.img").write_text(json.dumps({"id": container_id}) + "\n")
        if not leave_running:
            sandbox.status = "stopped"

    async def restore(
        self, container_id: str, bundle: Path, image_path: Path, *, nvproxy: bool
    ) -> None:
        if not (image_path / "checkpoint.img").is_file():
            image = image_path / "checkpoint.img"
            raise self._error(
                runsc.CheckpointImageError,
                f'starting container: opening state file "{image}" failed: '
                f"open {image}: no such file or directory",
            )
        self._new(container_id, bundle, "running")

    async def state(self, container_id: str) -> runsc.ContainerState:
        sandbox = self._get(container_id)
        pid = sandbox.pid if sandbox.status in ("created", "running") else 0
        return runsc.ContainerState(
            id=container_id, status=sandbox.status, pid=pid, bundle=str(sandbox.bundle)
        )

    async def kill(self, container_id: str, signal: str = "KILL") -> None:
        self._get(container_id).status = "stopped"

    async def delete(self, container_id: str, *, force: bool = False) -> None:
        sandbox = self._get(container_id)
        if sandbox.status == "running" and not force:
            raise self._error(
                runsc.RunscError,
                "cannot delete container that is not stopped without --force flag",
            )
        del self._sandboxes[container_id]

    async def live_clients(self, pids: tuple[int, ...]) -> tuple[GpuClient, ...]:
        """The probe: the GPU handle of every holding workload among ``pids``."""
        return tuple(
            GpuClient(pid=s.pid, fd=3, target="/dev/nvidia0")
            for s in self._sandboxes.values()
            if s.pid in pids and self._holds_gpu(s)
        )
