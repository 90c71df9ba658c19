"""Lifecycle events: frozen, typed, versioned values with a JSON form.

Each event class's ``type`` is the trigger it fires in ``machines/actor.yaml`` (the loader
checks that every trigger names an event type here and every type has a transition).
Two kinds:

- **external** events come from the node agent (``actor_registered``, ``run_requested``,
  ``cuda_context_opened``, ...) through :meth:`Agent.submit`;
- **outcomes** are produced by the pipeline's effects (``gpu_injected``,
  ``checkpoint_failed``, ...) and fed back into the machine.

The JSON form (one object, the event log's line) is ``{"type", "v", "actor_id", "seq",
"at", ...fields}``. ``v`` is the schema version of that type: :func:`from_json` refuses an
unknown type or version instead of guessing, so an old agent never misreads a newer log.
``seq`` is stamped by the agent when it accepts the event (a per-agent monotonically
increasing number: the order of the event log); ``at`` is the wall-clock time of creation.

Events compare equal field by field, hash, and order by ``(seq, at)`` so a log sorts.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from substrate_gpu.lifecycle import errors

#: Bounded reasons for ``checkpoint_refused`` (also the metrics label value).
REFUSED_LIVE_CONTEXT_OBSERVED = "live_context_observed"
REFUSED_LIVE_CONTEXT_PROBED = "live_context_probed"
REFUSED_LIVE_NVPROXY_CLIENTS = "live_nvproxy_clients"
REFUSED_NOT_RESTORABLE = "nvproxy_not_restorable"
#: The pool's GPU suspend policy is ``refuse`` and a CUDA context is live.
REFUSED_SUSPEND_POLICY = "suspend_policy"
#: The exec route's ``cuda-checkpoint --action lock --timeout`` gave up (process untouched).
REFUSED_CUDA_LOCK_TIMEOUT = "cuda_lock_timeout"
#: The exec route's suspend was rolled back for another reason (unsupported, tool missing…).
REFUSED_CUDA_SUSPEND = "cuda_suspend_refused"

#: The pools' GPU suspend policies (``actor_registered.suspend_policy``).
SUSPEND_POLICIES = ("auto", "refuse")
#: Suspend routes for an actor with a live CUDA context (``live_context_found.route``).
ROUTE_RUNSC = "runsc-cuda-checkpoint"
ROUTE_EXEC = "exec-cuda-checkpoint"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Event:
    """Base of every lifecycle event."""

    type: ClassVar[str]
    """The event type name, which is also its trigger in the machine."""
    v: ClassVar[int] = 1
    """The schema version of this event type."""
    external: ClassVar[bool] = True
    """Submitted by the node agent (True) or produced by an effect (False)."""

    actor_id: str
    """The actor (also its sandbox container id)."""
    seq: int = 0
    """Acceptance order, stamped by the agent (0 until accepted)."""
    at: float = dataclasses.field(default_factory=time.time)
    """Creation time, seconds since the epoch."""

    def _key(self) -> tuple[int, float, str, str]:
        return (self.seq, self.at, self.type, self.actor_id)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return self._key() < other._key()

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return self._key() <= other._key()

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return self._key() > other._key()

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return self._key() >= other._key()

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready mapping of this event (``type`` and ``v`` first)."""
        out: dict[str, Any] = {"type": self.type, "v": self.v}
        for f in dataclasses.fields(self):
            out[f.name] = getattr(self, f.name)
        return out

    def to_json(self) -> str:
        """One compact JSON line (no newline)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    def stamped(self, seq: int) -> Event:
        """A copy carrying acceptance sequence number ``seq``."""
        return dataclasses.replace(self, seq=seq)

    def describe(self) -> str:
        """A short human reason carried by this event, if it has one."""
        return ""


E = TypeVar("E", bound=type[Event])

#: Every event class by type name.
REGISTRY: dict[str, type[Event]] = {}

#: The JSON value check for each annotation used by event fields.
_CHECKS: dict[str, Callable[[object], bool]] = {
    "str": lambda x: isinstance(x, str),
    "int": lambda x: isinstance(x, int) and not isinstance(x, bool),
    "bool": lambda x: isinstance(x, bool),
    "float": lambda x: isinstance(x, int | float) and not isinstance(x, bool),
    "str | None": lambda x: x is None or isinstance(x, str),
}


def register(cls: E) -> E:
    """Class decorator: add an event class to :data:`REGISTRY` (type names are unique)."""
    if cls.type in REGISTRY:
        raise TypeError(f"event type {cls.type!r} registered twice")
    for f in dataclasses.fields(cls):
        if f.type not in _CHECKS:
            raise TypeError(f"event {cls.type}: field {f.name} has unsupported type {f.type}")
    REGISTRY[cls.type] = cls
    return cls


def from_dict(data: Mapping[str, object]) -> Event:
    """Rebuild an event from its JSON mapping; :class:`EventSchemaError` when invalid."""
    kind = data.get("type")
    if not isinstance(kind, str):
        raise errors.EventSchemaError(f"event {dict(data)!r} has no string 'type'")
    cls = REGISTRY.get(kind)
    if cls is None:
        raise errors.EventSchemaError(
            f"unknown event type {kind!r}; known: {', '.join(sorted(REGISTRY))}"
        )
    version = data.get("v")
    if version != cls.v:
        raise errors.EventSchemaError(
            f"event {kind!r} has schema version {version!r}; this agent reads version {cls.v} "
            "(upgrade the agent to read newer logs)"
        )
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields) - {"type", "v"}
    if unknown:
        raise errors.EventSchemaError(
            f"event {kind!r} has unknown field(s) {', '.join(sorted(unknown))}"
        )
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in data:
            has_default = f.default is not dataclasses.MISSING or (
                f.default_factory is not dataclasses.MISSING
            )
            if not has_default:
                raise errors.EventSchemaError(f"event {kind!r} lacks field {name!r}")
            continue
        value = data[name]
        if not _CHECKS[str(f.type)](value):
            raise errors.EventSchemaError(
                f"event {kind!r} field {name!r} must be {f.type}, got {value!r}"
            )
        kwargs[name] = float(value) if f.type == "float" else value  # type: ignore[arg-type]
    return cls(**kwargs)


def from_json(text: str | bytes) -> Event:
    """Rebuild an event from :meth:`Event.to_json` output."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise errors.EventSchemaError(f"event is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise errors.EventSchemaError(f"event must be a JSON object, got {type(data).__name__}")
    return from_dict(data)


# --- external events: from the node agent --------------------------------------------------


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class ActorRegistered(Event):
    """The node agent knows a new actor."""

    type: ClassVar[str] = "actor_registered"
    gpu: bool
    """The actor's pool requests GPUs: inject them and use nvproxy."""
    bundle: str
    """The OCI bundle directory of the actor's container."""
    suspend_policy: str = "auto"
    """The pool's GPU suspend policy: ``auto`` suspends a live CUDA context through the best
    route the node has (refusing when there is none), ``refuse`` always refuses while a
    context is live (the upstream behaviour). Optional: older logs read as ``auto``."""

    def __post_init__(self) -> None:
        if self.suspend_policy not in SUSPEND_POLICIES:
            raise errors.EventSchemaError(
                f"actor_registered for {self.actor_id!r}: unknown suspend_policy "
                f"{self.suspend_policy!r} (expected one of {', '.join(SUSPEND_POLICIES)})"
            )


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class BundlePrepared(Event):
    """The actor's OCI bundle is (re-)unpacked and ready."""

    type: ClassVar[str] = "bundle_prepared"
    bundle: str
    """The bundle directory (may differ from the registered one)."""


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class RunRequested(Event):
    """Run the actor from its bundle (inject, create, start)."""

    type: ClassVar[str] = "run_requested"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class SuspendRequested(Event):
    """Checkpoint the actor and stop its sandbox."""

    type: ClassVar[str] = "suspend_requested"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class RestoreRequested(Event):
    """Restore the actor from a checkpoint (its last one, or ``image_path``)."""

    type: ClassVar[str] = "restore_requested"
    image_path: str | None = None
    """The checkpoint to restore (from another worker); default: the actor's last one."""
    worker: str | None = None
    """The worker the checkpoint was taken on, when not this one (informational)."""


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryRequested(Event):
    """Recover a failed actor: from its last good checkpoint, else from its bundle."""

    type: ClassVar[str] = "retry_requested"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class DeleteRequested(Event):
    """Delete the actor's sandbox and forget the actor."""

    type: ClassVar[str] = "delete_requested"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class CudaContextOpened(Event):
    """A process of the actor's sandbox opened a CUDA context."""

    type: ClassVar[str] = "cuda_context_opened"
    pid: int = 0
    """The process inside the sandbox, when known."""


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class CudaContextClosed(Event):
    """A CUDA context of the actor's sandbox was closed."""

    type: ClassVar[str] = "cuda_context_closed"
    pid: int = 0
    """The process inside the sandbox, when known."""


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxExited(Event):
    """The actor's sandbox exited on its own."""

    type: ClassVar[str] = "sandbox_exited"
    status: int = 0
    """The exit status of the container's init process."""

    def describe(self) -> str:
        return f"sandbox exited with status {self.status}"


# --- outcomes: produced by the pipeline's effects ------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome(Event):
    """An effect's result."""

    external: ClassVar[bool] = False


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuInjected(Outcome):
    """The GPUs were injected into the bundle."""

    type: ClassVar[str] = "gpu_injected"
    devices: int
    """Device nodes injected."""


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class InjectionFailed(Outcome):
    """GPU injection failed; the bundle is untouched."""

    type: ClassVar[str] = "injection_failed"
    message: str

    def describe(self) -> str:
        return self.message


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxCreated(Outcome):
    """``runsc create`` succeeded."""

    type: ClassVar[str] = "sandbox_created"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxStarted(Outcome):
    """``runsc start`` succeeded."""

    type: ClassVar[str] = "sandbox_started"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointWritten(Outcome):
    """The checkpoint image is written and the sandbox is gone."""

    type: ClassVar[str] = "checkpoint_written"
    image_path: str
    """The checkpoint directory: the actor's new last good checkpoint."""


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointRefused(Outcome):
    """The checkpoint was not taken because a CUDA context is live."""

    type: ClassVar[str] = "checkpoint_refused"
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
@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointFailed(Outcome):
    """The runtime failed to checkpoint."""

    type: ClassVar[str] = "checkpoint_failed"
    message: str
    """The runtime's message."""
    sandbox_survived: bool
    """The sandbox still runs (``--leave-running``); otherwise runsc terminated it."""

    def describe(self) -> str:
        return f"checkpoint failed: {self.message}"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Restored(Outcome):
    """The sandbox was restored from a checkpoint and runs."""

    type: ClassVar[str] = "restored"
    image_path: str
    devices: int = 0
    """Device nodes injected into the bundle before restoring (GPU actors)."""
    cuda_route: str = ""
    """The route that put CUDA state in the image (its manifest's), or empty: with
    ``exec-cuda-checkpoint`` the processes must be resumed through the sandbox."""


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class RestoreFailed(Outcome):
    """Restoring failed; the checkpoint is still there."""

    type: ClassVar[str] = "restore_failed"
    message: str

    def describe(self) -> str:
        return f"restore failed: {self.message}"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class EffectFailed(Outcome):
    """A runtime effect (create, start, delete) failed."""

    type: ClassVar[str] = "effect_failed"
    effect: str
    message: str

    def describe(self) -> str:
        return f"{self.effect} failed: {self.message}"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class EffectTimedOut(Outcome):
    """An effect did not finish within its timeout and was cancelled."""

    type: ClassVar[str] = "effect_timed_out"
    effect: str
    seconds: float

    def describe(self) -> str:
        return f"{self.effect} did not finish within {self.seconds:g}s and was cancelled"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class Deleted(Outcome):
    """The sandbox is deleted."""

    type: ClassVar[str] = "deleted"


# --- GPU-aware suspend (docs/gpu-suspend.md) -------------------------------------------------


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class NoLiveContext(Outcome):
    """The probe found no live CUDA context: a plain checkpoint will do."""

    type: ClassVar[str] = "no_live_context"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class LiveContextFound(Outcome):
    """A CUDA context is live and the node has a route to suspend it with its state."""

    type: ClassVar[str] = "live_context_found"
    route: str
    """``runsc-cuda-checkpoint`` or ``exec-cuda-checkpoint`` (see ``cudackpt.routing``)."""
    message: str = ""
    """Why this route, and what the probe found."""

    def describe(self) -> str:
        return f"live CUDA context: suspending via {self.route}: {self.message}"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class CudaSuspended(Outcome):
    """Every CUDA process of the sandbox is checkpointed (exec route): it can be saved."""

    type: ClassVar[str] = "cuda_suspended"
    pids: str
    """The sandbox pids suspended, comma-separated (resumed after restore or a failure)."""


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class CudaSuspendRefused(Outcome):
    """The exec route's suspend was rolled back: every process runs, as before."""

    type: ClassVar[str] = "cuda_suspend_refused"
    reason: str
    """A bounded code (``cuda_lock_timeout``, ``cuda_suspend_refused``)."""
    message: str = ""
    """The tool's account (pid, CUDA error)."""

    def describe(self) -> str:
        detail = f": {self.message}" if self.message else ""
        return f"suspend refused ({self.reason}){detail}"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class CudaSuspendFailed(Outcome):
    """The exec route's suspend failed and its rollback did not bring every process back."""

    type: ClassVar[str] = "cuda_suspend_failed"
    message: str
    pids: str = ""
    """Every pid the suspend touched, comma-separated: all are to be resumed."""

    def describe(self) -> str:
        return f"CUDA suspend failed: {self.message}"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class CudaResumed(Outcome):
    """Every suspended CUDA process of the sandbox runs again (restored and unlocked)."""

    type: ClassVar[str] = "cuda_resumed"
    pids: str = ""
    """The sandbox pids resumed, comma-separated."""


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class CudaResumeFailed(Outcome):
    """Some CUDA processes could not be brought back (left checkpointed or locked)."""

    type: ClassVar[str] = "cuda_resume_failed"
    message: str
    sandbox_survived: bool
    """The sandbox still runs (its stuck processes are recovered by a retry)."""

    def describe(self) -> str:
        return f"CUDA resume failed: {self.message}"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class PreflightRefused(Outcome):
    """Driver preflight refused to create a GPU sandbox on this node (none was created)."""

    type: ClassVar[str] = "preflight_refused"
    code: str
    """A bounded code (``driver-unsupported``, ``driver-mismatch``, ``driver-unreadable``)."""
    message: str

    def describe(self) -> str:
        return f"preflight refused ({self.code}): {self.message}"


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class RestoreRefused(Outcome):
    """The checkpoint cannot be restored on this node; it is kept, untouched."""

    type: ClassVar[str] = "restore_refused"
    code: str
    """A bounded code (``restore-other-driver``, ``restore-fewer-gpus``, a preflight code)."""
    message: str

    def describe(self) -> str:
        return f"restore refused ({self.code}): {self.message}"
