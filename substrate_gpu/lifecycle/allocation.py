"""The per-worker GPU allocator: which of the worker's GPUs each GPU actor holds.

A pure, deterministic functional core (:func:`decide`) and a small stateful shell
(:class:`GpuAllocator`, the allocation table). The rules:

- An actor asks for all of the worker's GPUs (``actor_registered.gpu`` alone, as before), a
  count (``gpus: N``: the lowest free indices first), or fully qualified CDI names
  (``nvidia.com/gpu=0``, ``nvidia.com/gpu=GPU-<uuid>``, a DRA claim's names: exactly those).
- GPUs are never shared: a request that the free GPUs cannot meet **waits** (the machine's
  ``awaiting_gpus`` state, retried when GPUs are freed); one that this worker can never meet
  (more GPUs than it has, a name it does not have, the same GPU named twice) is **refused**
  with the reason (``gpus_refused`` → ``failed``).
- The table is not a second source of truth: it is the projection of the actors' records
  (``gpu_devices``, set by ``gpus_allocated``, held while the actor is in a state the YAML
  marks ``holds_gpus``). Replay and recovery rebuild it from the same records
  (:meth:`GpuAllocator.rebuild`), so it is exactly the live one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from substrate_gpu import cdi
from substrate_gpu.lifecycle import errors

if TYPE_CHECKING:
    from substrate_gpu.lifecycle.actors import ActorView


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What one actor asks for: all GPUs, a count, or names (exactly one of them)."""

    count: int = 0
    """How many GPUs (``gpus: N``); 0 with no names means all of the worker's GPUs."""
    names: tuple[str, ...] = ()
    """Fully qualified CDI names, each one GPU."""

    @property
    def everything(self) -> bool:
        """The legacy ``gpu: true``: every GPU of the worker."""
        return self.count == 0 and not self.names


@dataclass(frozen=True, slots=True)
class Granted:
    """The GPUs handed out, by their canonical names, in index order."""

    devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    """Not now: the GPUs asked for are held by other actors."""

    reason: str


@dataclass(frozen=True, slots=True)
class Refused:
    """Never on this worker: the request cannot be met even with every GPU free."""

    reason: str


Decision = Granted | Wait | Refused


def request_of(actor: ActorView) -> GpuRequest:
    """The GPU request an actor registered with."""
    names = tuple(actor.gpu_names.split(",")) if actor.gpu_names else ()
    return GpuRequest(count=actor.gpus, names=names)


class _Holder(Protocol):
    @property
    def state(self) -> str: ...
    @property
    def gpu_devices(self) -> str: ...


def held_by(actor: _Holder, holding_states: frozenset[str]) -> tuple[str, ...]:
    """The GPUs ``actor`` holds: its last allocation while in a ``holds_gpus`` state."""
    if actor.state in holding_states and actor.gpu_devices:
        return tuple(actor.gpu_devices.split(","))
    return ()


@dataclass(frozen=True, slots=True)
class WorkerGpus:
    """A worker's GPUs in allocation order, and every name that requests each one."""

    names: tuple[str, ...]
    """Canonical name per GPU (``cdi.Gpu.name``), lowest index first."""
    aliases: Mapping[str, str]
    """Any qualified name (index, UUID, ...) -> canonical name."""

    @classmethod
    def of(cls, gpus: Iterable[cdi.Gpu]) -> WorkerGpus:
        """From :func:`substrate_gpu.cdi.list_gpus` (already in index order)."""
        ordered = tuple(gpus)
        aliases: dict[str, str] = {}
        for gpu in ordered:
            for name in (gpu.name, *gpu.names):
                aliases[name] = gpu.name
        return cls(names=tuple(g.name for g in ordered), aliases=aliases)

    @classmethod
    def named(cls, names: Sequence[str]) -> WorkerGpus:
        """GPUs known by one name each, in the given order."""
        return cls(names=tuple(names), aliases={n: n for n in names})


def decide(request: GpuRequest, worker: WorkerGpus, taken: frozenset[str] | set[str]) -> Decision:
    """The allocation for ``request`` given the GPUs ``taken`` by other actors.

    Pure and deterministic: the same inputs give the same decision.
    """
    total = len(worker.names)
    if request.names:
        wanted: list[str] = []
        for name in request.names:
            canonical = worker.aliases.get(name)
            if canonical is None:
                return Refused(f"this worker has no GPU named {name!r}")
            if canonical in wanted:
                return Refused(f"{name!r} names GPU {canonical!r} a second time")
            wanted.append(canonical)
        busy = [n for n in wanted if n in taken]
        if busy:
            return Wait(f"GPU(s) {', '.join(busy)} held by other actors")
        order = {n: i for i, n in enumerate(worker.names)}
        return Granted(tuple(sorted(wanted, key=order.__getitem__)))
    if total == 0:
        return Refused("this worker has no GPU")
    count = total if request.everything else request.count
    if count > total:
        return Refused(f"{count} GPU(s) requested, this worker has {total}")
    free = [n for n in worker.names if n not in taken]
    if len(free) < count:
        return Wait(f"{count} GPU(s) requested, {len(free)} of {total} free")
    return Granted(tuple(free[:count]))


class GpuAllocator:
    """The allocation table of one worker: actor id -> the GPUs it holds."""

    def __init__(self, worker: WorkerGpus, name: str = "") -> None:
        self.worker = worker
        self.name = name
        """The worker's name (a metric label)."""
        self._table: dict[str, tuple[str, ...]] = {}
        self._taken: set[str] = set()

    @property
    def table(self) -> Mapping[str, tuple[str, ...]]:
        """Actor id -> devices held (a copy)."""
        return dict(self._table)

    @property
    def allocated(self) -> int:
        """GPUs held by some actor."""
        return len(self._taken)

    @property
    def free(self) -> int:
        """GPUs held by none."""
        return len(self.worker.names) - len(self._taken)

    def decide(self, request: GpuRequest) -> Decision:
        """What :func:`decide` says for ``request`` against this table."""
        return decide(request, self.worker, self._taken)

    def hold(self, actor_id: str, devices: tuple[str, ...]) -> bool:
        """Record that ``actor_id`` holds exactly ``devices`` (none: it holds nothing).

        Returns whether GPUs were freed. A device another actor holds, or one this worker
        does not have, is an error: the table is never oversubscribed.
        """
        before = self._table.get(actor_id, ())
        if before == devices:
            return False
        for device in devices:
            if device in self._taken and device not in before:
                raise errors.AllocationError(
                    f"while giving {device!r} to actor {actor_id!r}: another actor holds it"
                )
            if device not in self.worker.aliases:
                raise errors.AllocationError(
                    f"while giving {device!r} to actor {actor_id!r}: this worker has no such GPU"
                )
        self._taken.difference_update(before)
        self._taken.update(devices)
        if devices:
            self._table[actor_id] = devices
        else:
            self._table.pop(actor_id, None)
        return any(d not in devices for d in before)

    def rebuild(self, held: Iterable[tuple[str, tuple[str, ...]]]) -> None:
        """Replace the table with ``(actor_id, devices)`` pairs (replay, recovery)."""
        self._table.clear()
        self._taken.clear()
        for actor_id, devices in held:
            self.hold(actor_id, devices)
