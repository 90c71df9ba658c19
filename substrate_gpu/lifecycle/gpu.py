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

The actor's own GPUs: :func:`own_gpu_uuids` resolves the GPUs the allocator gave
an actor to UUIDs through the CDI spec's UUID names (the allocator's aliases; all of the
host's GPUs, from ``/proc/driver/nvidia/gpus``, for an actor given every GPU). Checkpoints
record them with their used memory (:func:`gpus_now`), restores pair them with the new
grant's (:func:`plan_restore`: the device map, the remap and memory refusals), and
``verify`` (:mod:`.verify`) holds the sandbox's view to them.

*Multi-container sandboxes*: these functions take an actor's grant, not a container; where a
sandbox holds several GPU containers, each container's grant (its ``<name>`` under the
per-actor runsc root) goes through them the same way, and the sandbox's GPUs are their union.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from substrate_gpu import cudackpt, preflight
from substrate_gpu._log import get_logger
from substrate_gpu.cudackpt import api as cudackpt_api
from substrate_gpu.injection import toolkit
from substrate_gpu.lifecycle import allocation, events
from substrate_gpu.runsc import api as runsc_api

_log = get_logger(__name__)

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
    nvidia_smi: str | None = "nvidia-smi"
    """The host's ``nvidia-smi``, for each GPU's used memory at checkpoint and free memory
    before a restore; None: memory is neither recorded nor checked."""
    gpus_root: Path = preflight.PROC_NVIDIA_GPUS
    """The driver's GPU list (an actor given every GPU holds these)."""
    sandbox_exec: runsc_api.SandboxExec | None = None
    """Runs ``nvidia-smi -L`` and ``cuda-checkpoint --get-state`` in a started or restored
    GPU sandbox (``verify``); None: nothing is run there."""
    sandbox_nvidia_smi: str = "nvidia-smi"
    """``nvidia-smi`` as the sandbox sees it (the toolkit's CDI spec mounts the host's)."""

    def host_facts(self) -> preflight.HostGpuFacts | preflight.Refusal:
        """The driver version and GPU count of this node (no runsc involved)."""
        return preflight.host_facts(
            driver_root=self.driver_root, proc_version=self.proc_version, dev_root=self.dev_root
        )

    async def check_host(
        self, drivers: preflight.DriverLister | None = None
    ) -> preflight.HostGpuFacts | preflight.Refusal:
        """The host's facts, or why no GPU sandbox may be created or restored here; against
        ``drivers`` (the runsc a sandbox runs under, when it is its own), else
        :attr:`drivers`."""
        if not self.driver_preflight:
            return self.host_facts()
        return await preflight.preflight_host(
            drivers or self.drivers,
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
        if chosen.refuses and pool == "auto":
            reason = chosen.reason
            if features.cuda_checkpoint_path:  # runsc has the flag; its route is unusable here
                reason = (
                    "runsc's checkpoint --cuda-checkpoint-path cannot be used here and "
                    "cuda-checkpoint is not available inside the sandbox"
                )
            if notes:
                reason = f"{reason} ({'; '.join(notes)})"
            return cudackpt.Route(chosen.name, reason)
        return chosen


def _uuid_of(name: str, aliases: Mapping[str, str]) -> str | None:
    """The UUID of the GPU a qualified CDI name requests: the name's own (``…=GPU-…``), or
    the UUID name the spec gives the same GPU."""
    device = name.partition("=")[2]
    if device.startswith("GPU-"):
        return device
    canonical = aliases.get(name, name)
    for alias, target in aliases.items():
        if target == canonical and alias.partition("=")[2].startswith("GPU-"):
            return alias.partition("=")[2]
    return None


def own_gpu_uuids(
    settings: GpuSettings, allocator: allocation.GpuAllocator | None, granted: str
) -> tuple[str, ...]:
    """The UUIDs of the GPUs an actor holds (``granted``: its ``gpu_devices``), in grant
    order; all of the host's for an actor given every GPU (no grant). Empty when one cannot
    be resolved (a spec naming GPUs by index only, no driver list): unknown, never guessed."""
    if not granted:
        return tuple(g.uuid for g in preflight.read_gpu_identities(settings.gpus_root))
    aliases = allocator.worker.aliases if allocator is not None else {}
    uuids = [_uuid_of(name, aliases) for name in granted.split(",")]
    if any(u is None for u in uuids):
        return ()
    return tuple(u for u in uuids if u is not None)


async def gpus_now(
    settings: GpuSettings, uuids: tuple[str, ...]
) -> tuple[preflight.CheckpointGpu, ...]:
    """``uuids`` with each GPU's used device memory now (None where it cannot be read:
    logged, the checkpoint goes on without it)."""
    if not uuids:
        return ()
    used: dict[str, int | None] = {}
    if settings.nvidia_smi is not None:
        try:
            memory = await preflight.read_gpu_memory(settings.nvidia_smi)
        except preflight.PreflightError as e:
            _log.warning("GPU memory not recorded", reason=str(e))
        else:
            used = {m.uuid: m.used_mib for m in memory}
    return tuple(preflight.CheckpointGpu(u, used.get(u)) for u in uuids)


def encode_gpus(gpus: tuple[preflight.CheckpointGpu, ...]) -> str:
    """``uuid=MiB,…`` (``uuid=`` when unread): ``cuda_suspended.gpu_memory``."""
    return ",".join(
        f"{g.uuid}={'' if g.memory_used_mib is None else g.memory_used_mib}" for g in gpus
    )


def decode_gpus(text: str) -> tuple[preflight.CheckpointGpu, ...]:
    """The inverse of :func:`encode_gpus` (a malformed amount reads as unread)."""
    found = []
    for item in text.split(",") if text else ():
        uuid, _, used = item.partition("=")
        found.append(preflight.CheckpointGpu(uuid, int(used) if used.isdigit() else None))
    return tuple(found)


async def gpus_at_checkpoint(
    settings: GpuSettings | None,
    allocator: allocation.GpuAllocator | None,
    granted: str,
    event: events.Event,
) -> tuple[preflight.CheckpointGpu, ...]:
    """The actor's GPUs for its checkpoint's manifest: their memory as ``cuda_suspend``
    measured it before moving the CUDA state to the host (exec route), else now, before
    ``runsc checkpoint`` (runsc's route toggles CUDA state inside it)."""
    if settings is None:
        return ()
    if isinstance(event, events.CudaSuspended) and event.gpu_memory:
        return decode_gpus(event.gpu_memory)
    return await gpus_now(settings, own_gpu_uuids(settings, allocator, granted))


async def plan_restore(
    settings: GpuSettings,
    manifest: preflight.CheckpointManifest,
    driver_version: str,
    uuids: tuple[str, ...],
    *,
    runsc_creates_device_files: bool | None,
) -> preflight.Refusal | str:
    """Before a GPU restore: a refusal (a remap the route or the runsc build cannot do, too
    little free device memory on the target GPUs), or the ``--device-map`` to restore the
    CUDA state with (empty: the same GPUs, or an image that does not name its GPUs).
    ``runsc_creates_device_files``: the restoring runsc's
    :attr:`~substrate_gpu.runsc.api.RunscFeatures.restore_creates_gpu_device_files`."""
    pairs = preflight.gpu_pairs(manifest, uuids)
    device_map = preflight.device_map(pairs)
    route = manifest.route if manifest.cuda_state_included else ""
    refusal = preflight.check_remap(
        device_map,
        route=route,
        driver_version=driver_version,
        runsc_creates_device_files=runsc_creates_device_files,
    )
    if refusal is not None:
        return refusal
    recorded = any(g.memory_used_mib is not None for g in manifest.actor_gpus)
    if pairs and recorded and settings.nvidia_smi is not None:
        memory = await preflight.read_gpu_memory(settings.nvidia_smi)
        refusal = preflight.check_gpu_memory(manifest, pairs, memory)
        if refusal is not None:
            return refusal
    return device_map
