"""Lifecycle events: frozen, typed, versioned values with a JSON form.

The base class and registry are in :mod:`.base`, the event types in :mod:`.external` and
:mod:`.outcomes`; every name is re-exported here, so code writes ``events.RunRequested``.

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

import typing
from collections.abc import Mapping
from typing import Final

from substrate_gpu.lifecycle import codec
from substrate_gpu.lifecycle.events.base import (
    AT_MAX,
    AT_MIN,
    REFUSED_CUDA_LOCK_TIMEOUT,
    REFUSED_CUDA_SUSPEND,
    REFUSED_LIVE_CONTEXT_OBSERVED,
    REFUSED_LIVE_CONTEXT_PROBED,
    REFUSED_LIVE_NVPROXY_CLIENTS,
    REFUSED_NOT_RESTORABLE,
    REFUSED_SUSPEND_POLICY,
    REGISTRY,
    ROUTE_EXEC,
    ROUTE_RUNSC,
    SEQ_MAX,
    SUSPEND_POLICIES,
    Event,
    Seq,
    SuspendPolicy,
    Timestamp,
    register,
    union_of,
)
from substrate_gpu.lifecycle.events.external import (
    CONTAINER_NAME,
    CONTAINERS_MAX,
    IDENTITY_MAX,
    PAUSE_CONTAINER,
    ActorRegistered,
    BundlePrepared,
    CudaContextClosed,
    CudaContextOpened,
    DeleteRequested,
    RestoreRequested,
    RetryRequested,
    RunRequested,
    SandboxExited,
    SuspendRequested,
)
from substrate_gpu.lifecycle.events.outcomes import (
    CheckpointFailed,
    CheckpointRefused,
    CheckpointWritten,
    CudaResumed,
    CudaResumeFailed,
    CudaSuspended,
    CudaSuspendFailed,
    CudaSuspendRefused,
    Deleted,
    EffectFailed,
    EffectTimedOut,
    GpuInjected,
    GpusAllocated,
    GpusFreed,
    GpusRefused,
    GpusUnavailable,
    GpusVerified,
    GpuVerificationFailed,
    InjectionFailed,
    LiveContextFound,
    NoLiveContext,
    Outcome,
    PreflightRefused,
    Restored,
    RestoreFailed,
    RestoreRefused,
    SandboxCreated,
    SandboxStarted,
)

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


__all__ = [
    "AT_MAX",
    "AT_MIN",
    "CONTAINERS_MAX",
    "CONTAINER_NAME",
    "DECODER",
    "IDENTITY_MAX",
    "PAUSE_CONTAINER",
    "REFUSED_CUDA_LOCK_TIMEOUT",
    "REFUSED_CUDA_SUSPEND",
    "REFUSED_LIVE_CONTEXT_OBSERVED",
    "REFUSED_LIVE_CONTEXT_PROBED",
    "REFUSED_LIVE_NVPROXY_CLIENTS",
    "REFUSED_NOT_RESTORABLE",
    "REFUSED_SUSPEND_POLICY",
    "REGISTRY",
    "ROUTE_EXEC",
    "ROUTE_RUNSC",
    "SEQ_MAX",
    "SUSPEND_POLICIES",
    "ActorRegistered",
    "AnyEvent",
    "BundlePrepared",
    "CheckpointFailed",
    "CheckpointRefused",
    "CheckpointWritten",
    "CudaContextClosed",
    "CudaContextOpened",
    "CudaResumeFailed",
    "CudaResumed",
    "CudaSuspendFailed",
    "CudaSuspendRefused",
    "CudaSuspended",
    "DeleteRequested",
    "Deleted",
    "EffectFailed",
    "EffectTimedOut",
    "Event",
    "ExternalEvent",
    "GpuInjected",
    "GpuVerificationFailed",
    "GpusAllocated",
    "GpusFreed",
    "GpusRefused",
    "GpusUnavailable",
    "GpusVerified",
    "InjectionFailed",
    "LiveContextFound",
    "NoLiveContext",
    "Outcome",
    "OutcomeEvent",
    "PreflightRefused",
    "RestoreFailed",
    "RestoreRefused",
    "RestoreRequested",
    "Restored",
    "RetryRequested",
    "RunRequested",
    "SandboxCreated",
    "SandboxExited",
    "SandboxStarted",
    "Seq",
    "SuspendPolicy",
    "SuspendRequested",
    "Timestamp",
    "from_dict",
    "from_json",
    "register",
    "union_of",
]
