"""The contract between the actor lifecycle and the sandbox runtime (runsc).

The lifecycle pipeline only ever talks to a :class:`SandboxRuntime`; the production
implementation drives the ``runsc`` binary (``substrate_gpu.runsc.driver``), tests may use
the same driver pointed at a stand-in executable. Failures are typed from runsc's real
messages so the state machine can decide (refuse, retry, record) without parsing text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from substrate_gpu import _process, exceptions

#: ``runsc state`` statuses (the OCI runtime state).
ContainerStatus = Literal["creating", "created", "running", "stopped", "paused"]


@dataclass(frozen=True)
class ContainerState:
    """What ``runsc --root R state ID`` reports."""

    id: str
    """The container id."""
    status: ContainerStatus
    """The OCI status."""
    pid: int
    """The container's init pid on the host (0 when stopped)."""
    bundle: str
    """The bundle directory the container was created from."""


@dataclass(frozen=True)
class RunscFeatures:
    """What the installed runsc supports, found by asking it (never assumed)."""

    version: str
    """``runsc --version`` first line, e.g. ``runsc version release-20250512.0``."""
    leave_running: bool
    """``checkpoint --leave-running`` exists: a failed checkpoint can resume the sandbox."""
    cuda_checkpoint_path: bool
    """``checkpoint --cuda-checkpoint-path`` exists: runsc drives cuda-checkpoint itself."""
    nvproxy_driver_version: bool
    """The global ``--nvproxy-driver-version`` flag exists."""
    list_supported_drivers: bool
    """``runsc nvproxy list-supported-drivers`` exists."""
    cuda_checkpoint_sequential: bool = False
    """``checkpoint --cuda-checkpoint-sequential`` exists: runsc runs cuda-checkpoint on one
    process at a time instead of all in parallel (multi-GPU jobs need it)."""
    cpu_num_from_quota: bool = False
    """The global ``--cpu-num-from-quota`` flag exists: the sentry's vCPUs from the cgroup's
    CPU quota instead of every host CPU (upstream's worker passes it on create and restore)."""
    allow_connected_on_save: bool = False
    """The global ``--allow-connected-on-save`` flag exists: established connections may
    stay open across a checkpoint (upstream's worker passes it on start)."""
    restore_background: bool = False
    """``restore --background`` exists: image loading goes on after restore exits
    (upstream's worker passes it on every restore)."""
    binary_sha256: str = ""
    """The SHA-256 of the runsc binary (a snapshot is tied to the build that wrote it);
    empty when the binary cannot be read."""
    restore_creates_gpu_device_files: bool | None = None
    """Whether a restore creates ``/dev/nvidiaN`` for every GPU the restored sandbox holds
    (google/gvisor#14525), found in the binary: True: it carries the fix's
    ``createNvproxyDeviceFilesAfterRestore``; False: it carries only the remap-metadata-gated
    ``createRemappedNvproxyDeviceFiles`` (the pinned gVisor), so an image saved with no GPU
    file open (after cuda-checkpoint) restored onto other GPUs gets no device files for
    them; None: neither name found, or the binary unreadable (cannot tell)."""
    nvproxy_flag_legacy: bool = False
    """``runsc flags`` describes ``--nvproxy`` as ``LEGACY`` (GPU support turns on by itself
    when the spec carries NVIDIA devices). We still pass it: the pause container holds no
    GPU device, so for it nothing else turns nvproxy on."""


class RunscError(exceptions.ExternalCommandError):
    """runsc failed; subclasses name the failures the lifecycle reacts to."""


class LiveNvproxyClientsError(RunscError):
    """Checkpoint refused by gVisor: a CUDA context is open
    (``can't save with live nvproxy clients``)."""


class NotRestorableError(RunscError):
    """Checkpoint failed on an nvproxy object (``nvproxy: object handle … is not restorable``)."""


class WrongStateError(RunscError):
    """The container exists but is in the wrong state for the command
    (``cannot start container "<id>" in state running``)."""


class ContainerStoppedError(WrongStateError):
    """The container is stopped (``cannot checkpoint container "<id>" in state stopped``), or
    its sandbox is gone (``connecting to control server at PID <n>: connection refused``):
    typically the aftermath of a failed checkpoint without ``--leave-running``."""


class ContainerNotFoundError(RunscError):
    """runsc does not know the container (``loading container: file does not exist``)."""


class ContainerExistsError(RunscError):
    """The id is taken (``cannot lock container metadata file: container already exists``)."""


class BundleError(RunscError):
    """The OCI bundle cannot be used (``reading spec: error opening spec file …``)."""


class CheckpointImageError(RunscError):
    """The checkpoint image cannot be read (restore: ``opening state file … failed``) or
    written (checkpoint: ``creating checkpoint state file …``, ``making directories at path
    provided: …``)."""


class NvproxyUnavailableError(RunscError):
    """nvproxy cannot start: no NVIDIA driver on this host (``failed to get Nvidia driver
    version: failed to open /dev/nvidiactl``). A GPU sandbox cannot be created here."""


class UnsupportedDriverError(RunscError):
    """nvproxy does not support the host's NVIDIA driver version."""


class SandboxRuntime(Protocol):
    """The operations the lifecycle needs from an OCI sandbox runtime."""

    async def features(self) -> RunscFeatures:
        """Detect (once, then cached) what the runtime supports."""
        ...

    async def create(self, container_id: str, bundle: Path, *, nvproxy: bool) -> None:
        """``runsc --root R [--nvproxy] create --bundle B --pid-file P ID``."""
        ...

    async def start(self, container_id: str) -> None:
        """``runsc --root R start ID`` (never ``--nvproxy``)."""
        ...

    async def checkpoint(
        self,
        container_id: str,
        image_path: Path,
        *,
        leave_running: bool,
        cuda_checkpoint_path: Path | None = None,
        cuda_checkpoint_sequential: bool = False,
    ) -> None:
        """``runsc --root R checkpoint --image-path DIR [--leave-running]
        [--cuda-checkpoint-path P [--cuda-checkpoint-sequential]] ID``. ``DIR`` may exist
        already, empty (the checkpoint effect makes it 0700 before asking)."""
        ...

    async def restore(
        self, container_id: str, bundle: Path, image_path: Path, *, nvproxy: bool
    ) -> None:
        """``runsc --root R [--nvproxy] restore --bundle B --image-path DIR --detach ID``."""
        ...

    async def state(self, container_id: str) -> ContainerState:
        """``runsc --root R state ID``."""
        ...

    async def kill(self, container_id: str, signal: str = "KILL") -> None:
        """``runsc --root R kill ID SIGNAL``."""
        ...

    async def delete(self, container_id: str, *, force: bool = False) -> None:
        """``runsc --root R delete [--force] ID``."""
        ...


@runtime_checkable
class PerSandboxFeatures(Protocol):
    """A runtime whose sandboxes do not all run under the same runsc build (the demo's
    CPU actors in real gVisor beside GPU actors on the stand-in, ``substrate_gpu.testing.demo``).

    Optional: the lifecycle asks it, when the runtime has it, what the runsc hosting one
    sandbox supports, for that sandbox's checkpoint (``--leave-running``, the runsc version
    its manifest records); otherwise :meth:`SandboxRuntime.features` answers for all.
    """

    async def sandbox_features(self, container_id: str) -> RunscFeatures:
        """What the runsc that runs ``container_id`` supports."""
        ...


@runtime_checkable
class PerActorRoot(Protocol):
    """A runtime that can give each multi-container sandbox a runsc root of its own.

    A sandbox's containers are ``_pause`` and the app containers, named as the caller named
    them: the same names in every actor, so each actor's containers live under their own
    ``--root`` (``<root>/<actor_id>``) and never meet another actor's. Single-container
    actors keep the runtime's root (their container id is the actor id).
    """

    def for_actor(self, actor_id: str) -> SandboxRuntime:
        """The same runtime with ``--root <root>/<actor_id>`` (cheap: no runsc is run)."""
        ...


class ContainerOutputs(Protocol):
    """Where an app container's stdio goes (``RunscConfig.container_output``): a pipe per
    ``create``/``restore`` of a container of a multi-container sandbox, which the sandbox
    keeps as the container's stdout and stderr (the worker API's JSON log lines)."""

    def open(
        self, sandbox: str, container_id: str, *, fresh: bool
    ) -> _process.CommandOutput | None:
        """The output of ``container_id`` of ``sandbox`` (an actor id): a new one for
        ``create`` and ``restore`` (``fresh``), ``create``'s for ``start`` (gVisor takes a
        subcontainer's stdio from ``runsc start``); None: as before."""
        ...

    def release(self, sandbox: str, container_id: str) -> None:
        """The container's last command ran: close our end of its output."""
        ...


@runtime_checkable
class SandboxPause(Protocol):
    """Freezing a sandbox and thawing it (``runsc pause`` / ``runsc resume``).

    Kept apart from :class:`SandboxRuntime`, as :class:`SandboxExec` is: the worker API
    pauses a sandbox around the archive of its durable-dir volumes (upstream's
    ``SNAPSHOT_SCOPE_DATA``), which is no lifecycle transition.
    """

    async def pause(self, container_id: str) -> None:
        """``runsc --root R pause ID``."""
        ...

    async def resume(self, container_id: str) -> None:
        """``runsc --root R resume ID``."""
        ...


@runtime_checkable
class RemovableRoot(Protocol):
    """A per-actor runtime (:meth:`PerActorRoot.for_actor`) whose root can be removed.

    Optional: once every container of a sandbox is deleted, the lifecycle asks it to
    unmount what runsc left in the actor's root (``null-netns`` under ``--network=none``)
    and remove the root, so nothing of the activation stays (docs/runsc.md).
    """

    def has_root(self) -> bool:
        """Whether this runtime's own root is there (something of the sandbox may be)."""
        ...

    async def remove_root(self) -> None:
        """Unmount everything under this runtime's own root, then remove it; an
        :class:`OSError` naming what stays."""
        ...


@runtime_checkable
class StragglerReaper(Protocol):
    """A runtime that can kill the runsc commands a killed agent left running.

    Optional: recovery calls it, when the runtime has it, before asking what the runtime
    holds, so that no command of the dead agent lands after the decision
    (:mod:`substrate_gpu.runsc.stragglers`).
    """

    async def reap_stragglers(self) -> tuple[int, ...]:
        """Kill every runsc command under this runtime's root and wait until they are gone;
        the pids killed."""
        ...


@runtime_checkable
class PerBinary(Protocol):
    """A runtime that can run a sandbox under another runsc binary (the one atelet
    staged for the activation, ``runsc_path``), with that binary's own features and
    supported-driver list.

    The binary is trusted as the caller checked it (the worker API: a regular executable
    file under atelet's static-files directory, never through a link).
    """

    def for_binary(self, runsc: str) -> SandboxRuntime:
        """The same runtime (root, flags, timeouts) running ``runsc`` instead (cheap: no
        runsc is run; :meth:`PerActorRoot.for_actor` still applies to it)."""
        ...


@runtime_checkable
class SandboxExec(Protocol):
    """Running a command inside an existing sandbox (``runsc exec``).

    Kept apart from :class:`SandboxRuntime` so the lifecycle's runtime contract stays as it
    is; :class:`~substrate_gpu.runsc.driver.RunscDriver` implements both. Used to run
    ``cuda-checkpoint`` where the CUDA processes live (``substrate_gpu.cudackpt``).
    """

    async def exec(
        self, container_id: str, argv: Sequence[str], timeout: float | None = None
    ) -> _process.CommandResult:
        """``runsc --root R exec ID CMD…``; the command's status and output are returned.

        Raises :class:`RunscError` only when runsc could not run the command (unknown or
        stopped container, timeout).
        """
        ...
