"""Lifecycle events: frozen, typed, versioned values with a JSON form.

Each event class's ``type`` is the trigger it fires in ``machines/actor.yaml`` (the loader
checks that every trigger names an event type here and every type has a transition).
Two kinds:

- **external** events come from the node agent (``actor_registered``, ``run_requested``,
  ``cuda_context_opened``, ...) through :meth:`Agent.submit`;
- **outcomes** are produced by the pipeline's effects (``gpu_injected``,
  ``checkpoint_failed``, ...) and fed back into the machine.

Events are msgspec ``Struct`` s: a tagged union keyed on ``type``, decoded strictly by
:mod:`substrate_gpu.lifecycle.codec` (the one codec of the wire, the log, snapshots and
replay). The JSON form (one object, the event log's line) is ``{"type", ...fields, "v",
"actor_id", "seq", "at"}`` (msgspec writes a subclass's fields before the base's; a reader
takes the keys in any order). ``v`` is the schema version of that type, a ``Literal`` field:
decoding refuses an unknown type or version instead of guessing, so an old agent never
misreads a newer log. ``seq`` is stamped by the agent when it accepts the event (a per-agent
monotonically increasing number: the order of the event log); ``at`` is the wall-clock
time of creation, bounded to what a timestamp can mean (:data:`AT_MAX`).

**Versioning one type.** A change that keeps old lines meaningful adds a field with a
default (old lines read with it, ``v`` stays). Any other change bumps that type's ``v``:
its field becomes ``v: Literal[1, 2] = 2`` (reads both, writes 2) and ``__post_init__``
upgrades a ``v == 1`` value to the new meaning, with a test on a v1 line.

Events compare equal field by field, hash, and order by ``(seq, at)`` so a log sorts.
"""

from __future__ import annotations

import functools
import operator
import re
import time
import typing
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, ClassVar, Final, Literal, TypeVar

import msgspec

from substrate_gpu.lifecycle import codec, errors

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

SuspendPolicy = Literal["auto", "refuse"]
"""A pool's GPU suspend policy (``actor_registered.suspend_policy``)."""
#: The pools' GPU suspend policies.
SUSPEND_POLICIES: Final[tuple[str, ...]] = typing.get_args(SuspendPolicy)
#: Suspend routes for an actor with a live CUDA context (``live_context_found.route``).
ROUTE_RUNSC = "runsc-cuda-checkpoint"
ROUTE_EXEC = "exec-cuda-checkpoint"

AT_MIN: Final = 0.0
"""The earliest ``at`` decoded: the epoch (a negative time is a client's mistake)."""
AT_MAX: Final = 253402300799.0
"""The latest ``at`` decoded: 9999-12-31T23:59:59Z, the last second a timestamp can be
rendered as a date (``substrate-gpu replay`` prints every event's)."""
SEQ_MAX: Final = 2**63 - 1
"""The largest ``seq`` decoded (a signed 64-bit counter: never reached in practice)."""

Timestamp = Annotated[
    float,
    msgspec.Meta(
        ge=AT_MIN,
        le=AT_MAX,
        description="Creation time, seconds since the epoch (0 to 9999-12-31T23:59:59Z).",
    ),
]
Seq = Annotated[
    int,
    msgspec.Meta(
        ge=0, le=SEQ_MAX, description="Acceptance order, stamped by the agent (0 until then)."
    ),
]


class Event(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    tag_field="type",
    forbid_unknown_fields=True,
    gc=False,  # fields are strings and numbers: no cycle, and a million events stay untracked
):
    """Base of every lifecycle event."""

    type: ClassVar[str]
    """The event type name (its msgspec tag), which is also its trigger in the machine."""
    external: ClassVar[bool] = True
    """Submitted by the node agent (True) or produced by an effect (False)."""

    v: Literal[1] = 1
    """The schema version of this event type (see the module doc to bump one)."""
    actor_id: str
    """The actor (also its sandbox container id)."""
    seq: Seq = 0
    """Acceptance order, stamped by the agent (0 until accepted)."""
    at: Timestamp = msgspec.field(default_factory=time.time)
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
        """The JSON-ready mapping of this event (what :meth:`to_json` writes)."""
        return codec.to_builtins(self)  # type: ignore[no-any-return]

    def to_json(self) -> str:
        """One compact JSON line (no newline)."""
        return codec.encode(self).decode()

    def stamped(self, seq: int) -> Event:
        """A copy carrying acceptance sequence number ``seq``."""
        return msgspec.structs.replace(self, seq=seq)

    def describe(self) -> str:
        """A short human reason carried by this event, if it has one."""
        return ""


E = TypeVar("E", bound=type[Event])

#: Every event class by type name.
REGISTRY: dict[str, type[Event]] = {}


def union_of(classes: Iterable[type[msgspec.Struct]]) -> Any:
    """The union type ``A | B | ...`` of tagged Struct classes (what msgspec decodes by tag)."""
    return functools.reduce(operator.or_, classes)


def register(cls: E) -> E:
    """Class decorator: add an event class to :data:`REGISTRY` (type names are unique)."""
    tag = cls.__struct_config__.tag
    if not isinstance(tag, str) or tag == cls.__name__:
        raise TypeError(f"event class {cls.__name__} needs an explicit tag= (its type name)")
    if tag in REGISTRY:
        raise TypeError(f"event type {tag!r} registered twice")
    cls.type = tag
    REGISTRY[tag] = cls
    return cls


# --- external events: from the node agent --------------------------------------------------


#: The root container of a multi-container sandbox (implied, never listed in ``containers``).
PAUSE_CONTAINER: Final = "_pause"
#: What an app container's name may be: it becomes a runsc container id and a directory
#: name under the actor's bundle directory (``_pause`` cannot match: it starts with ``_``).
CONTAINER_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
#: The most app containers one sandbox may name (a bound for the door, not a runsc limit).
CONTAINERS_MAX: Final = 64
#: The most identity entries a registration may carry (upstream sends five).
IDENTITY_MAX: Final = 32


@register
class ActorRegistered(Event, frozen=True, kw_only=True, tag="actor_registered"):
    """The node agent knows a new actor.

    Version 2 (GPU allocation): a GPU actor's GPUs come from the worker's allocator. A v1
    line (written before allocation existed) keeps its meaning: all of the worker's GPUs,
    injected without allocation (:attr:`allocates_gpus` is False), so old logs replay as
    they were written.

    Version 3 (sandboxes, issue 23): ``containers`` names the app containers of a
    multi-container sandbox and ``identity`` carries the caller's opaque identity. A v1 or
    v2 line has neither (both empty: a single-container actor, as it was written); one that
    carries them is refused, so an older agent's meaning is never silently extended.

    Version 4 (issue 31 §10 and §5): ``container_gpus`` names, per app container, the GPUs
    its own config asked for (the other app containers get none), and ``runsc`` the runsc
    binary the sandbox runs under (atelet's staged ``runsc_path``). A v1 to v3 line has
    neither (every app container gets the actor's GPUs, the agent's own runsc, as it was
    written); one that carries either is refused.
    """

    v: Literal[1, 2, 3, 4] = 4  # type: ignore[assignment]  # reads v1 to v4 (see above)
    gpu: bool
    """The actor's pool requests GPUs: inject them and use nvproxy."""
    bundle: str
    """The OCI bundle directory of the actor's container; for a sandbox (``containers``
    given), the directory holding one bundle per container: ``<bundle>/_pause/`` and
    ``<bundle>/<name>/`` for each app container."""
    suspend_policy: SuspendPolicy = "auto"
    """The pool's GPU suspend policy: ``auto`` suspends a live CUDA context through the best
    route the node has (refusing when there is none), ``refuse`` always refuses while a
    context is live (the upstream behaviour). Optional: older logs read as ``auto``."""
    gpus: Annotated[int, msgspec.Meta(ge=0, le=1024)] = 0
    """How many of the worker's GPUs (lowest free indices first); 0: see ``gpu_names``, else
    all of them. Optional: older logs read as 0 (``gpu`` alone means all GPUs, as before)."""
    gpu_names: tuple[str, ...] = ()
    """Fully qualified CDI names (``nvidia.com/gpu=0``, ``nvidia.com/gpu=GPU-<uuid>``, a DRA
    claim's names): exactly these GPUs. Optional: older logs read as none."""
    containers: Annotated[tuple[str, ...], msgspec.Meta(max_length=CONTAINERS_MAX)] = ()
    """The app containers of the actor's sandbox, in order (``_pause``, its root, is implied
    and never listed). Empty: one container whose id is the actor id (before v3). Every app
    container gets the actor's GPUs, unless ``container_gpus`` says otherwise; ``_pause``
    none."""
    identity: Annotated[dict[str, str], msgspec.Meta(max_length=IDENTITY_MAX)] = {}
    """The caller's identity of the actor (upstream: atespace, actor_name, actor_uid, ...):
    opaque to the lifecycle, kept on the actor record and shown by queries."""
    container_gpus: Annotated[
        dict[str, tuple[str, ...]], msgspec.Meta(max_length=CONTAINERS_MAX)
    ] = {}
    """App container -> the qualified CDI names its own config requests (v4). Empty: every
    app container gets the actor's GPUs (the seed PR's rule). Given: each named container
    gets exactly its own, every app container not named gets none, ``_pause`` never; the
    names together are ``gpu_names`` (the sandbox's allocation is their union)."""
    runsc: str = ""
    """The runsc binary the sandbox runs under (v4; an absolute path, e.g. the one atelet
    staged for this activation); empty: the agent's own (``--runsc``). Only a sandbox
    (``containers`` given) runs under a binary of its own."""

    @property
    def allocates_gpus(self) -> bool:
        """GPUs come from the allocator: every registration since v2."""
        return self.v >= 2

    @property
    def wants_gpus(self) -> bool:
        """A GPU actor: ``gpu``, a count or names."""
        return self.gpu or self.gpus > 0 or bool(self.gpu_names)

    @property
    def is_sandbox(self) -> bool:
        """A multi-container sandbox (``_pause`` plus the app ``containers``)."""
        return bool(self.containers)

    @property
    def per_container(self) -> bool:
        """Each app container gets its own GPUs (``container_gpus`` given), not all of them."""
        return bool(self.container_gpus)

    def __hash__(self) -> int:
        # ``identity`` and ``container_gpus`` are dicts (JSON objects): hashed by their items.
        identity = tuple(sorted(self.identity.items()))
        gpus = tuple(sorted(self.container_gpus.items()))
        key = (self.actor_id, self.seq, self.at, self.bundle, self.containers, self.runsc)
        return hash((*key, *identity, *gpus))

    def __post_init__(self) -> None:
        for name, given in (
            ("container_gpus", bool(self.container_gpus)),
            ("runsc", bool(self.runsc)),
        ):
            if self.v < 4 and given:
                raise errors.EventFieldError(
                    f"actor_registered for {self.actor_id!r}: {name} needs v 4 "
                    f"(this line is v {self.v})",
                    name,
                )
        if self.runsc and not (self.runsc.startswith("/") and self.containers):
            problem = (
                "is not an absolute path"
                if not self.runsc.startswith("/")
                else "needs containers: only a sandbox runs under a runsc of its own"
            )
            raise errors.EventFieldError(
                f"actor_registered for {self.actor_id!r}: runsc {self.runsc!r} {problem}",
                "runsc",
            )
        if self.v < 3:
            for name, value in (("containers", self.containers), ("identity", self.identity)):
                if value:
                    raise errors.EventFieldError(
                        f"actor_registered for {self.actor_id!r}: {name} needs v 3 "
                        f"(this line is v {self.v})",
                        name,
                    )
        seen: set[str] = set()
        for i, container in enumerate(self.containers):
            if container == PAUSE_CONTAINER:
                problem = f"{PAUSE_CONTAINER} is the sandbox's root container, always implied"
            elif not CONTAINER_NAME.fullmatch(container):
                problem = (
                    f"it must match {CONTAINER_NAME.pattern} (letters, digits, '_', '.', "
                    "'-'; 1-63 characters): it names a runsc container and a bundle directory"
                )
            elif container in seen:
                problem = "it is named twice"
            else:
                seen.add(container)
                continue
            raise errors.EventFieldError(
                f"actor_registered for {self.actor_id!r}: container name {container!r}: {problem}",
                f"containers[{i}]",
            )
        if self.gpus and self.gpu_names:
            raise errors.EventFieldError(
                f"actor_registered for {self.actor_id!r}: give gpus ({self.gpus}) or "
                f"gpu_names ({', '.join(self.gpu_names)}), not both",
                "gpu_names",
            )
        for i, name in enumerate(self.gpu_names):
            if "/" not in name or "=" not in name:
                raise errors.EventFieldError(
                    f"actor_registered for {self.actor_id!r}: gpu_names must be fully "
                    f"qualified CDI names (vendor/class=name), got {name!r}",
                    f"gpu_names[{i}]",
                )
        self._check_container_gpus()
        if self.suspend_policy not in SUSPEND_POLICIES:
            raise errors.EventFieldError(
                f"actor_registered for {self.actor_id!r}: unknown suspend_policy "
                f"{self.suspend_policy!r} (expected one of {', '.join(SUSPEND_POLICIES)})",
                "suspend_policy",
            )

    def _check_container_gpus(self) -> None:
        """Every key an app container, every list non-empty and without repeats, and the
        names together exactly ``gpu_names``."""
        if not self.container_gpus:
            return
        where = f"actor_registered for {self.actor_id!r}: container_gpus"
        union: dict[str, None] = {}
        for container, names in self.container_gpus.items():
            field = f"container_gpus.{container}"
            if container not in self.containers:
                raise errors.EventFieldError(
                    f"{where}: {container!r} is not one of the app containers "
                    f"({', '.join(self.containers) or 'none'})",
                    field,
                )
            if not names:
                raise errors.EventFieldError(
                    f"{where}: {container!r} lists no GPU (leave a container with none out)",
                    field,
                )
            if len(set(names)) != len(names):
                raise errors.EventFieldError(f"{where}: {container!r} names a GPU twice", field)
            for i, name in enumerate(names):
                if "/" not in name or "=" not in name:
                    raise errors.EventFieldError(
                        f"{where}: {container!r}: not a fully qualified CDI name "
                        f"(vendor/class=name): {name!r}",
                        f"{field}[{i}]",
                    )
                union.setdefault(name)
        if set(union) != set(self.gpu_names):
            raise errors.EventFieldError(
                f"{where}: the containers' GPUs ({', '.join(union)}) are not gpu_names "
                f"({', '.join(self.gpu_names) or 'none'}): the sandbox's GPUs are their union",
                "gpu_names",
            )


@register
class BundlePrepared(Event, frozen=True, tag="bundle_prepared"):
    """The actor's OCI bundle is (re-)unpacked and ready."""

    bundle: str
    """The bundle directory (may differ from the registered one)."""


@register
class RunRequested(Event, frozen=True, tag="run_requested"):
    """Run the actor from its bundle (inject, create, start)."""


@register
class SuspendRequested(Event, frozen=True, tag="suspend_requested"):
    """Checkpoint the actor and stop its sandbox.

    Version 2 (issue 23): ``image_path`` chooses the checkpoint's directory. A v1 line has
    none (the checkpoint goes where it always went); one that carries it is refused.
    """

    v: Literal[1, 2] = 2  # type: ignore[assignment]  # reads v1 and v2 (see above)
    image_path: str | None = None
    """Write the checkpoint into this directory (absolute; it must not already hold a
    checkpoint) instead of ``<checkpoint_root>/<actor>/<seq>``: it becomes the actor's
    checkpoint."""

    def __post_init__(self) -> None:
        if self.image_path is None:
            return
        if self.v < 2:
            raise errors.EventFieldError(
                f"suspend_requested for {self.actor_id!r}: image_path needs v 2 "
                f"(this line is v {self.v})",
                "image_path",
            )
        if not self.image_path.startswith("/") or "\x00" in self.image_path:
            raise errors.EventFieldError(
                f"suspend_requested for {self.actor_id!r}: image_path must be an absolute "
                f"directory path, got {self.image_path!r}",
                "image_path",
            )


@register
class RestoreRequested(Event, frozen=True, tag="restore_requested"):
    """Restore the actor from a checkpoint (its last one, or ``image_path``)."""

    image_path: str | None = None
    """The checkpoint to restore (from another worker); default: the actor's last one."""
    worker: str | None = None
    """The worker the checkpoint was taken on, when not this one (informational)."""


@register
class RetryRequested(Event, frozen=True, tag="retry_requested"):
    """Recover a failed actor: from its last good checkpoint, else from its bundle."""


@register
class DeleteRequested(Event, frozen=True, tag="delete_requested"):
    """Delete the actor's sandbox and forget the actor."""


@register
class CudaContextOpened(Event, frozen=True, tag="cuda_context_opened"):
    """A process of the actor's sandbox opened a CUDA context."""

    pid: int = 0
    """The process inside the sandbox, when known."""


@register
class CudaContextClosed(Event, frozen=True, tag="cuda_context_closed"):
    """A CUDA context of the actor's sandbox was closed."""

    pid: int = 0
    """The process inside the sandbox, when known."""


@register
class SandboxExited(Event, frozen=True, tag="sandbox_exited"):
    """The actor's sandbox exited on its own."""

    status: int = 0
    """The exit status of the container's init process."""

    def describe(self) -> str:
        return f"sandbox exited with status {self.status}"


# --- outcomes: produced by the pipeline's effects ------------------------------------------


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


# --- decoding ---------------------------------------------------------------------------------

if typing.TYPE_CHECKING:
    AnyEvent: typing.TypeAlias = Event
    ExternalEvent: typing.TypeAlias = Event
    OutcomeEvent: typing.TypeAlias = Event
else:
    AnyEvent = union_of(REGISTRY.values())
    """Every event type: the tagged union the codec decodes (``type`` picks the class)."""
    ExternalEvent = union_of(c for c in REGISTRY.values() if c.external)
    """What a client may send: the external events."""
    OutcomeEvent = union_of(c for c in REGISTRY.values() if not c.external)
    """What only the agent's effects produce."""

DECODER: Final[codec.Decoder[Event]] = codec.Decoder(AnyEvent, what="event", kinds=REGISTRY)
"""The decoder of one event's JSON (the wire, snapshots, :func:`from_json`)."""


def from_dict(data: Mapping[str, object]) -> Event:
    """Rebuild an event from its JSON mapping; :class:`EventSchemaError` when invalid."""
    return DECODER.convert(data)


def from_json(text: str | bytes) -> Event:
    """Rebuild an event from :meth:`Event.to_json` output; :class:`EventSchemaError`."""
    return DECODER.decode(text)
