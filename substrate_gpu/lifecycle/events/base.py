"""The base of every lifecycle event, their registry, and the constants events carry.

:class:`Event` is the msgspec ``Struct`` every event type derives from; :func:`register`
adds a type to :data:`REGISTRY` (type names are unique). The event types themselves are in
:mod:`.external` (what the node agent submits) and :mod:`.outcomes` (what effects produce);
:mod:`substrate_gpu.lifecycle.events` gathers them all.
"""

from __future__ import annotations

import functools
import operator
import time
import typing
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Final, Literal, TypeVar

import msgspec

from substrate_gpu.lifecycle import codec

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
