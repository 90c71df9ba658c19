"""The node's GPU settings for the lifecycle: driver preflight, the checkpoint manifest, and
the routes for suspending an actor that holds a live CUDA context.

Given to the :class:`~substrate_gpu.lifecycle.agent.Agent` as ``gpu=GpuSettings(...)``.
Without it the lifecycle behaves as upstream: no preflight, no manifest, and the suspend of
a GPU actor with a live CUDA context is refused (there is no route). With it:

- ``create`` and ``restore`` of a GPU sandbox first check the host's driver against
  ``runsc nvproxy list-supported-drivers`` (:func:`substrate_gpu.preflight.preflight_host`);
- every GPU checkpoint gets a :class:`~substrate_gpu.preflight.CheckpointManifest`, and a
  restore onto a node with another driver or fewer GPUs is refused;
- a live context is suspended through runsc (``cuda_checkpoint_path``: the host's
  ``cuda-checkpoint``, for runsc's ``checkpoint --cuda-checkpoint-path``) or through the
  sandbox (``sandbox_tool``: ``cuda-checkpoint`` run by ``runsc exec``), whichever the node
  has (``cudackpt.routing``), unless the actor's pool says ``refuse``.

Which route is *available* is a fact found here; what happens next is the machine's
(``machines/actor.yaml``: ``live_context_found`` → ``checkpointing`` or ``cuda_suspending``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from substrate_gpu import cudackpt, preflight
from substrate_gpu.cudackpt import api as cudackpt_api
from substrate_gpu.injection import toolkit
from substrate_gpu.runsc import api as runsc_api

#: The driver root when none is configured (``ATE_NVIDIA_DRIVER_ROOT``'s default).
DEFAULT_DRIVER_ROOT = toolkit.DEFAULT_DRIVER_ROOT


class SandboxCudaTool(cudackpt_api.CudaCheckpointTool, Protocol):
    """``cuda-checkpoint`` for one sandbox, plus the two questions a suspend asks first
    (:class:`~substrate_gpu.cudackpt.tool.ExecCudaCheckpoint` is one)."""

    async def available(self) -> bool:
        """Whether the tool runs in the sandbox."""
        ...

    async def gpu_processes(self) -> tuple[int, ...]:
        """Sandbox pids holding an NVIDIA device now."""
        ...


#: Builds the tool for a sandbox (container id → tool).
SandboxToolFactory = Callable[[str], SandboxCudaTool]


def exec_tool(
    runtime: runsc_api.SandboxExec,
    tool_path: str = "cuda-checkpoint",
    timeouts: cudackpt.ToolTimeouts | None = None,
) -> SandboxToolFactory:
    """A factory of :class:`~substrate_gpu.cudackpt.ExecCudaCheckpoint` for ``runtime``
    (``tool_path`` as the sandbox sees it: the image ships it, or the bundle binds it)."""
    per_call = timeouts or cudackpt.ToolTimeouts()

    def build(container_id: str) -> SandboxCudaTool:
        return cudackpt.ExecCudaCheckpoint(
            runtime, container_id, tool_path=tool_path, timeouts=per_call
        )

    return build


@dataclass(frozen=True)
class GpuSettings:
    """How this node checks drivers and suspends live CUDA contexts (see the module doc)."""

    drivers: preflight.DriverLister
    """Asked for runsc's features and supported drivers (the runsc driver)."""
    driver_root: Path = DEFAULT_DRIVER_ROOT
    """The NVIDIA driver root (``libcuda.so.<version>`` under ``lib64``)."""
    proc_version: Path = preflight.PROC_VERSION
    """The kernel module's version file (wins over the driver root)."""
    dev_root: Path = Path("/")
    """Where ``/dev/nvidiaN`` are counted."""
    driver_preflight: bool = True
    """Refuse a driver runsc does not list before create and restore."""
    cuda_checkpoint_path: Path | None = None
    """The host's ``cuda-checkpoint``, for runsc's ``--cuda-checkpoint-path`` (that route
    is off without it, whatever runsc supports)."""
    sandbox_tool: SandboxToolFactory | None = None
    """``cuda-checkpoint`` inside the sandbox (:func:`exec_tool`); the exec route is off
    without it."""
    lock_timeout_ms: int = cudackpt.DEFAULT_LOCK_TIMEOUT_MS
    """The exec route's ``--action lock --timeout``: beyond it the suspend is refused."""

    def host_facts(self) -> preflight.HostGpuFacts | preflight.Refusal:
        """The driver version and GPU count of this node (no runsc involved)."""
        return preflight.host_facts(
            driver_root=self.driver_root, proc_version=self.proc_version, dev_root=self.dev_root
        )

    async def check_host(self) -> preflight.HostGpuFacts | preflight.Refusal:
        """The host's facts, or why no GPU sandbox may be created or restored here."""
        if not self.driver_preflight:
            return self.host_facts()
        return await preflight.preflight_host(
            self.drivers,
            driver_root=self.driver_root,
            proc_version=self.proc_version,
            dev_root=self.dev_root,
        )

    async def route(
        self, features: runsc_api.RunscFeatures, container_id: str, policy: str
    ) -> cudackpt.Route:
        """The route for suspending ``container_id``'s live CUDA context on this node.

        runsc's route needs its flag, a host tool and driver ≥ 550; the exec route a tool in
        the sandbox and driver ≥ 570 (``--action`` and ``--timeout``). A driver that cannot
        be read is not held against a route (preflight refuses such nodes at create).
        """
        pool: cudackpt.SuspendPolicy = "refuse" if policy == "refuse" else "auto"
        facts = self.host_facts()
        version = facts.driver_version if isinstance(facts, preflight.HostGpuFacts) else None
        notes: list[str] = []
        runsc_ok = features.cuda_checkpoint_path and self.cuda_checkpoint_path is not None
        if features.cuda_checkpoint_path and self.cuda_checkpoint_path is None:
            notes.append("no host cuda-checkpoint is configured for --cuda-checkpoint-path")
        if runsc_ok and version is not None:
            too_old = preflight.check_cuda_checkpoint_driver(version)
            if too_old is not None:
                runsc_ok = False
                notes.append(too_old.reason)
        exec_ok = False
        if pool == "auto" and not runsc_ok and self.sandbox_tool is not None:
            too_old = (
                preflight.check_cuda_checkpoint_driver(version, need_actions=True)
                if version is not None
                else None
            )
            if too_old is not None:
                notes.append(too_old.reason)
            else:
                exec_ok = await self.sandbox_tool(container_id).available()
        chosen = cudackpt.choose_suspend_route(
            dataclasses.replace(features, cuda_checkpoint_path=runsc_ok), exec_ok, pool
        )
        if chosen.refuses and notes and pool == "auto":
            return cudackpt.Route(chosen.name, f"{chosen.reason} ({'; '.join(notes)})")
        return chosen
