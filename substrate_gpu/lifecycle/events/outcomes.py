"""Outcomes: the events the pipeline's effects produce and feed back into the machine, one
class per result (``gpu_injected``, ``checkpoint_failed``, …). Only the agent makes them:
a client that sends one is refused."""

from __future__ import annotations

from typing import ClassVar, Literal

from substrate_gpu.lifecycle.events.base import (
    Event,
    register,
)


class Outcome(Event, frozen=True):
    """An effect's result."""

    external: ClassVar[bool] = False


@register
class GpuInjected(Outcome, frozen=True, tag="gpu_injected"):
    """The GPUs were injected into the bundle."""

    devices: int
    """Device nodes injected."""


@register
class GpusAllocated(Outcome, frozen=True, tag="gpus_allocated"):
    """The worker's allocator handed these GPUs to the actor (before injection)."""

    names: tuple[str, ...]
    """The GPUs' canonical qualified CDI names, in index order."""


@register
class GpusUnavailable(Outcome, frozen=True, tag="gpus_unavailable"):
    """Other actors hold GPUs the actor asked for: it waits until GPUs are freed."""

    message: str

    def describe(self) -> str:
        return self.message


@register
class GpusRefused(Outcome, frozen=True, tag="gpus_refused"):
    """This worker can never meet the actor's GPU request (too many, unknown names)."""

    message: str

    def describe(self) -> str:
        return self.message


@register
class GpusFreed(Outcome, frozen=True, tag="gpus_freed"):
    """GPUs were freed while the actor waited for some: ask the allocator again."""


@register
class InjectionFailed(Outcome, frozen=True, tag="injection_failed"):
    """GPU injection failed; the bundle is untouched."""

    message: str

    def describe(self) -> str:
        return self.message


@register
class SandboxCreated(Outcome, frozen=True, tag="sandbox_created"):
    """``runsc create`` succeeded."""


@register
class SandboxStarted(Outcome, frozen=True, tag="sandbox_started"):
    """``runsc start`` succeeded."""

    v: Literal[1, 2] = 2  # type: ignore[assignment]  # reads v1 and v2 (see above)
    """v2: written by an agent that verifies a GPU sandbox before it runs (``verifying``);
    a v1 line (an older agent) replays as it ran: a GPU actor straight to ``running``."""


@register
class CheckpointWritten(Outcome, frozen=True, tag="checkpoint_written"):
    """The checkpoint image is written and the sandbox is gone."""

    image_path: str
    """The checkpoint directory: the actor's new last good checkpoint."""


@register
class CheckpointRefused(Outcome, frozen=True, tag="checkpoint_refused"):
    """The checkpoint was not taken because a CUDA context is live."""

    reason: str
    """A bounded code (``live_context_probed``, ``live_nvproxy_clients``, ...)."""
    sandbox_survived: bool
    """The sandbox still runs (probe refusal, or runsc with ``--leave-running``)."""
    message: str = ""
    """Details: the probe's findings or the runtime's message."""

    def describe(self) -> str:
        detail = f": {self.message}" if self.message else ""
        return f"checkpoint refused ({self.reason}){detail}"


@register
class CheckpointFailed(Outcome, frozen=True, tag="checkpoint_failed"):
    """The runtime failed to checkpoint."""

    message: str
    """The runtime's message."""
    sandbox_survived: bool
    """The sandbox still runs (``--leave-running``); otherwise runsc terminated it."""

    def describe(self) -> str:
        return f"checkpoint failed: {self.message}"


@register
class Restored(Outcome, frozen=True, kw_only=True, tag="restored"):
    """The sandbox was restored from a checkpoint and runs."""

    v: Literal[1, 2] = 2  # type: ignore[assignment]  # reads v1 and v2 (see above)
    """v2: written by an agent that verifies a GPU sandbox before it runs (``verifying``);
    a v1 line (an older agent) replays as it ran: a GPU actor straight to ``running``."""
    image_path: str
    devices: int = 0
    """Device nodes injected into the bundle before restoring (GPU actors)."""
    cuda_route: str = ""
    """The route that put CUDA state in the image (its manifest's), or empty: with
    ``exec-cuda-checkpoint`` the processes must be resumed through the sandbox."""
    device_map: str = ""
    """``oldUuid=newUuid,…`` when the restore got other GPUs than the checkpoint's (the
    exec route's ``cuda-checkpoint --action restore --device-map``); empty: the same GPUs,
    or unknown (an image that does not name its GPUs)."""


@register
class RestoreFailed(Outcome, frozen=True, tag="restore_failed"):
    """Restoring failed; the checkpoint is still there."""

    message: str

    def describe(self) -> str:
        return f"restore failed: {self.message}"


@register
class EffectFailed(Outcome, frozen=True, tag="effect_failed"):
    """A runtime effect (create, start, delete) failed, or a restore whose leftovers could
    not be deleted (they may still run)."""

    effect: str
    message: str

    def describe(self) -> str:
        return f"{self.effect} failed: {self.message}"


@register
class EffectTimedOut(Outcome, frozen=True, tag="effect_timed_out"):
    """An effect did not finish within its timeout and was cancelled."""

    effect: str
    seconds: float

    def describe(self) -> str:
        return f"{self.effect} did not finish within {self.seconds:g}s and was cancelled"


@register
class Deleted(Outcome, frozen=True, tag="deleted"):
    """The sandbox is deleted."""


# --- GPU-aware suspend (docs/gpu-suspend.md) -------------------------------------------------


@register
class NoLiveContext(Outcome, frozen=True, tag="no_live_context"):
    """The probe found no live CUDA context: a plain checkpoint will do."""


@register
class LiveContextFound(Outcome, frozen=True, tag="live_context_found"):
    """A CUDA context is live and the node has a route to suspend it with its state."""

    route: str
    """``runsc-cuda-checkpoint`` or ``exec-cuda-checkpoint`` (see ``cudackpt.routing``)."""
    message: str = ""
    """Why this route, and what the probe found."""

    def describe(self) -> str:
        return f"live CUDA context: suspending via {self.route}: {self.message}"


@register
class CudaSuspended(Outcome, frozen=True, tag="cuda_suspended"):
    """Every CUDA process of the sandbox is checkpointed (exec route): it can be saved."""

    pids: str
    """The sandbox pids suspended, comma-separated (resumed after restore or a failure)."""
    gpu_memory: str = ""
    """Each of the actor's GPUs' used device memory before the suspend moved it to the host
    (``uuid=MiB,…``, ``uuid=`` when unread), for the checkpoint's manifest; empty: its GPUs
    are unknown."""


@register
class CudaSuspendRefused(Outcome, frozen=True, tag="cuda_suspend_refused"):
    """The exec route's suspend was rolled back: every process runs, as before."""

    reason: str
    """A bounded code (``cuda_lock_timeout``, ``cuda_suspend_refused``)."""
    message: str = ""
    """The tool's account (pid, CUDA error)."""

    def describe(self) -> str:
        detail = f": {self.message}" if self.message else ""
        return f"suspend refused ({self.reason}){detail}"


@register
class CudaSuspendFailed(Outcome, frozen=True, tag="cuda_suspend_failed"):
    """The exec route's suspend failed and its rollback did not bring every process back."""

    message: str
    pids: str = ""
    """Every pid the suspend touched, comma-separated: all are to be resumed."""

    def describe(self) -> str:
        return f"CUDA suspend failed: {self.message}"


@register
class CudaResumed(Outcome, frozen=True, tag="cuda_resumed"):
    """Every suspended CUDA process of the sandbox runs again (restored and unlocked)."""

    v: Literal[1, 2] = 2  # type: ignore[assignment]  # reads v1 and v2 (see above)
    """v2: written by an agent that verifies a GPU sandbox before it runs (``verifying``);
    a v1 line (an older agent) replays as it ran: a GPU actor straight to ``running``."""

    pids: str = ""
    """The sandbox pids resumed, comma-separated."""


@register
class CudaResumeFailed(Outcome, frozen=True, tag="cuda_resume_failed"):
    """Some CUDA processes could not be brought back (left checkpointed or locked)."""

    message: str
    sandbox_survived: bool
    """The sandbox still runs (its stuck processes are recovered by a retry)."""

    def describe(self) -> str:
        return f"CUDA resume failed: {self.message}"


@register
class PreflightRefused(Outcome, frozen=True, tag="preflight_refused"):
    """Driver preflight refused to create a GPU sandbox on this node (none was created)."""

    code: str
    """A bounded code (``driver-unsupported``, ``driver-mismatch``, ``driver-unreadable``)."""
    message: str

    def describe(self) -> str:
        return f"preflight refused ({self.code}): {self.message}"


@register
class RestoreRefused(Outcome, frozen=True, tag="restore_refused"):
    """The checkpoint cannot be restored on this node; it is kept, untouched."""

    code: str
    """A bounded code (``restore-other-driver``, ``restore-fewer-gpus``, a preflight code)."""
    message: str

    def describe(self) -> str:
        return f"restore refused ({self.code}): {self.message}"


@register
class GpusVerified(Outcome, frozen=True, tag="gpus_verified"):
    """After start or restore of a GPU actor: its sandbox sees exactly its own GPUs, and
    every CUDA process a restore brought back reads ``running``."""

    message: str = ""
    """What was checked (and what could not be, with why)."""


@register
class GpuVerificationFailed(Outcome, frozen=True, tag="gpu_verification_failed"):
    """The sandbox sees GPUs other than the actor's, or a restored CUDA process is not
    ``running``: the sandbox was deleted (or is to be, by the next create/restore)."""

    message: str

    def describe(self) -> str:
        return f"GPU verification failed: {self.message}"
