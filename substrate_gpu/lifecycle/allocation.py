"""The per-worker GPU allocator: which of the worker's GPUs each GPU actor holds.

A pure, deterministic functional core (:func:`decide`) and a small stateful shell
(:class:`GpuAllocator`, the allocation table). The rules:

- An actor asks for all of the worker's GPUs (``actor_registered.gpu`` alone, as before), a
  count (``gpus: N``: the lowest free indices first), or fully qualified CDI names
  (``nvidia.com/gpu=0``, ``nvidia.com/gpu=GPU-<uuid>``, a DRA claim's
  ``k8s.gpu.nvidia.com/claim=<uid>-gpu-N``: exactly those; ``nvidia.com/gpu=all``: every
  GPU, as ``gpu: true``, whatever is named beside it; a GPU named twice, by the same name or
  by two of its names, counts once, as the CDI reference library and nvidia-container-toolkit
  resolve such lists). A claim name is one more name
  of the GPU whose node it holds; since the DRA driver writes a claim's spec just before
  the pod's containers start, a name the worker does not know yet makes the allocator look
  at the specs again before it refuses.
- A named device that is not a full GPU (MIG, or a claim device whose edits carry no
  ``/dev/nvidia*`` node) is refused with why (:func:`substrate_gpu.cdi.refused_devices`).
- GPUs are never shared: a request that the free GPUs cannot meet **waits** (the machine's
  ``awaiting_gpus`` state, retried when GPUs are freed); one that this worker can never meet
  (more GPUs than it has, a name it does not have) is **refused**
  with the reason (``gpus_refused`` → ``failed``).
- **GPUs per container**: a sandbox whose app containers name their own
  GPUs asks for their union, in ``groups`` (one per container). The same GPU named by two
  containers is one GPU of the sandbox, shared by them (they are one actor); named twice
  by one container (by two of its names), it is that GPU once, as in any request.
- The table is not a second source of truth: it is the projection of the actors' records
  (``gpu_devices``, set by ``gpus_allocated``, held while the actor is in a state the YAML
  marks ``holds_gpus``). Replay and recovery rebuild it from the same records
  (:meth:`GpuAllocator.rebuild`), so it is exactly the live one.
- **The worker's GPUs may be unknown** (no CDI spec yet: nvidia-ctk failed, or a worker
  without GPUs). The allocator then says why (``unknown``) and refuses GPU requests with
  that reason; given a ``discover`` callback it asks again before each decision while
  unknown, since a failed spec generation is never memoised (the driver may have been
  mid-install).
- **Records the worker cannot honour are kept, not fought.** A rebuild from a log written
  when the worker had other GPUs (its spec changed between restarts) may name a GPU this
  worker no longer has: the actor keeps holding it in the table (it is counted neither
  allocated nor free) until it leaves its holding state; it is logged. Two records holding
  the same GPU (a log written before ``deleting`` held GPUs) are kept the same way: the GPU
  stays taken until both let go. Live grants never do either (:meth:`GpuAllocator.hold`).
- **What runs wins over what the log says.** A GPU injected into a sandbox the runtime
  shows live (its bundles' ``/dev/nvidiaN`` nodes and CDI annotations, read by recovery:
  :class:`LiveSandbox`) is held by that actor whatever its record says, beside what the
  record holds; every difference is reported. The pipeline keeps such GPUs, and
  the GPUs of an actor whose sandbox may outlive its holding state (an interrupted or
  timed-out effect), until the sandbox is known gone.
- **A legacy GPU actor holds every GPU.** One registered ``gpu: true`` before requests were
  upgraded at the door (logged by an earlier agent, never allocated) was given all of the
  worker's GPUs; resumed in a holding state it holds them all (:data:`EVERY_GPU`).
"""

from __future__ import annotations

import collections
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol

from substrate_gpu import cdi, exceptions
from substrate_gpu._log import get_logger
from substrate_gpu.lifecycle import errors

if TYPE_CHECKING:
    from substrate_gpu.lifecycle.actors import ActorView

_log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What one actor asks for: all GPUs, a count, or names (exactly one of them)."""

    count: int = 0
    """How many GPUs (``gpus: N``); 0 with no names means all of the worker's GPUs."""
    names: tuple[str, ...] = ()
    """Fully qualified CDI names: each one GPU (a GPU named twice counts once), or the
    kind's ``all`` (every GPU)."""
    groups: tuple[tuple[str, ...], ...] = ()
    """Per app container, the names it asked for (``names`` is their union); empty: one
    group, ``names``."""

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
    groups = tuple(
        tuple(actor.container_gpus[c].split(","))
        for c in actor.containers
        if actor.container_gpus.get(c)
    )
    return GpuRequest(count=actor.gpus, names=names, groups=groups)


class _Holder(Protocol):
    @property
    def state(self) -> str: ...
    @property
    def gpu(self) -> bool: ...
    @property
    def uses_allocator(self) -> bool: ...
    @property
    def gpu_devices(self) -> str: ...


EVERY_GPU: Final = ("*",)
"""What a legacy GPU actor holds: every GPU of the worker, whichever they turn out to be."""


def held_by(actor: _Holder, holding_states: frozenset[str]) -> tuple[str, ...]:
    """The GPUs ``actor`` holds: its last allocation while in a ``holds_gpus`` state.

    A GPU actor registered before requests were upgraded at the door (a v1 ``gpu: true``
    logged by an earlier agent) was never allocated: it was given all of the worker's GPUs,
    so it holds :data:`EVERY_GPU` (else a new actor would be given GPUs it uses).
    """
    if actor.state not in holding_states:
        return ()
    if actor.gpu_devices:
        return tuple(actor.gpu_devices.split(","))
    if actor.gpu and not actor.uses_allocator:
        return EVERY_GPU
    return ()


@dataclass(frozen=True, slots=True)
class WorkerGpus:
    """A worker's GPUs in allocation order, and every name that requests each one."""

    names: tuple[str, ...]
    """Canonical name per GPU (``cdi.Gpu.name``), lowest index first."""
    aliases: Mapping[str, str]
    """Any qualified name (index, UUID, DRA claim, ...) -> canonical name."""
    refused: Mapping[str, str] = field(default_factory=dict)
    """Qualified names the specs define that are not full GPUs -> why."""
    nodes: Mapping[str, str] = field(default_factory=dict)
    """A GPU's ``/dev/nvidiaN`` node (container path) -> canonical name."""

    @classmethod
    def of(cls, gpus: Iterable[cdi.Gpu], refused: Mapping[str, str] | None = None) -> WorkerGpus:
        """From :func:`substrate_gpu.cdi.list_gpus` (already in index order) and
        :func:`substrate_gpu.cdi.refused_devices`."""
        ordered = tuple(gpus)
        aliases: dict[str, str] = {}
        for gpu in ordered:
            for name in (gpu.name, *gpu.names):
                aliases[name] = gpu.name
        return cls(
            names=tuple(g.name for g in ordered),
            aliases=aliases,
            refused=dict(refused or {}),
            nodes={g.node: g.name for g in ordered},
        )

    def identify(self, injected: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(GPUs, unknown)``: the canonical names of the GPUs that ``injected`` (device
        node paths and qualified CDI names found in a bundle) stand for, in index order, and
        the entries naming no GPU of this worker."""
        found: set[str] = set()
        unknown: list[str] = []
        for entry in injected:
            canonical = self.nodes.get(entry) or self.aliases.get(entry)
            if canonical is None:
                unknown.append(entry)
            else:
                found.add(canonical)
        order = {n: i for i, n in enumerate(self.names)}
        return tuple(sorted(found, key=order.__getitem__)), tuple(unknown)

    @classmethod
    def named(cls, names: Sequence[str]) -> WorkerGpus:
        """GPUs known by one name each, in the given order."""
        return cls(names=tuple(names), aliases={n: n for n in names})


@dataclass(frozen=True, slots=True)
class LiveSandbox:
    """What recovery found of one GPU actor's sandbox in the runtime: it may run (a
    container of it exists and is not stopped), with these GPUs injected."""

    actor_id: str
    injected: tuple[str, ...]
    """The ``/dev/nvidiaN`` nodes of its bundles' ``linux.devices`` and the qualified names
    of their ``cdi.k8s.io/*`` annotations, as found (mapped by :meth:`WorkerGpus.identify`)."""
    containers: tuple[str, ...] = ()
    """The containers found live (report lines)."""


def decide(request: GpuRequest, worker: WorkerGpus, taken: Container[str]) -> Decision:
    """The allocation for ``request`` given the GPUs ``taken`` by other actors.

    Pure and deterministic: the same inputs give the same decision.
    """
    total = len(worker.names)
    if request.names and not _names_every_gpu(request.names, worker):
        wanted: dict[str, None] = {}
        for group in request.groups or (request.names,):
            for name in group:
                canonical = worker.aliases.get(name)
                if canonical is None:
                    why = worker.refused.get(name)
                    if why is not None:
                        return Refused(f"{name!r} is not a GPU this worker can give: {why}")
                    return Refused(f"this worker has no GPU named {name!r}")
                # Index, UUID, claim, or named by two containers: one GPU, counted once.
                wanted.setdefault(canonical)
        busy = [n for n in wanted if n in taken]
        if busy:
            return Wait(f"GPU(s) {', '.join(busy)} held by other actors")
        order = {n: i for i, n in enumerate(worker.names)}
        return Granted(tuple(sorted(wanted, key=order.__getitem__)))
    if total == 0:
        return Refused("this worker has no GPU")
    count = total if request.everything or request.names else request.count
    if count > total:
        return Refused(f"{count} GPU(s) requested, this worker has {total}")
    free = [n for n in worker.names if n not in taken]
    if len(free) < count:
        return Wait(f"{count} GPU(s) requested, {len(free)} of {total} free")
    return Granted(tuple(free[:count]))


def _names_every_gpu(names: Sequence[str], worker: WorkerGpus) -> bool:
    """Whether ``names`` holds the ``all`` device of the worker's GPUs' kind
    (``nvidia.com/gpu=all``): every GPU of the worker, as ``gpu: true``, whatever else is
    named beside it (the CDI reference library and nvidia-container-toolkit both resolve
    ``all`` plus more names to the union: every GPU)."""
    kinds = {n.partition("=")[0] for n in worker.names}
    return any(
        device == cdi.ALL_DEVICES and (kind in kinds or not kinds)
        for kind, _, device in (n.partition("=") for n in names)
    )


class GpuDiscovery(Protocol):
    """Learns the worker's GPUs (from the CDI spec it injects from)."""

    async def __call__(self) -> WorkerGpus:
        """The worker's GPUs; a :class:`SubstrateGpuError` saying why they are unknown."""
        ...


NO_GPUS = WorkerGpus.named(())


class GpuAllocator:
    """The allocation table of one worker: actor id -> the GPUs it holds."""

    def __init__(
        self,
        worker: WorkerGpus,
        name: str = "",
        *,
        unknown: str | None = None,
        discover: GpuDiscovery | None = None,
    ) -> None:
        self.worker = worker
        self.name = name
        """The worker's name (a metric label)."""
        self.unknown = unknown
        """Why the worker's GPUs are not known (None: ``worker`` is the truth)."""
        self._discover = discover
        self._table: dict[str, tuple[str, ...]] = {}
        self._taken: collections.Counter[str] = collections.Counter()
        self._everything: set[str] = set()
        """Legacy actors holding :data:`EVERY_GPU` (expanded again if the worker changes)."""

    @classmethod
    async def discovered(cls, discover: GpuDiscovery, name: str = "") -> GpuAllocator:
        """An allocator for the GPUs ``discover`` finds now (or knowing why there are none)."""
        allocator = cls(NO_GPUS, name, unknown="not discovered yet", discover=discover)
        await allocator.ensure_known()
        return allocator

    async def ensure_known(self, names: Iterable[str] = ()) -> None:
        """While the worker's GPUs are unknown, or ``names`` holds a name they lack (a DRA
        claim's spec written since), ask ``discover`` again; otherwise a no-op."""
        if self._discover is None:
            return
        known = self.worker.aliases
        if self.unknown is None and all(
            n in known or _names_every_gpu((n,), self.worker) for n in names
        ):
            return
        try:
            worker = await self._discover()
        except exceptions.SubstrateGpuError as e:
            if self.unknown is None:
                # Known GPUs stay known: only the new names are missing (refused as such).
                _log.warning("worker GPUs not re-read", worker=self.name, reason=str(e))
                return
            self.unknown = str(e)
            _log.warning("worker GPUs unknown", worker=self.name, reason=self.unknown)
            return
        self.unknown = None
        self._set_worker(worker)
        _log.info("worker GPUs", worker=self.name, gpus=list(worker.names))

    @property
    def table(self) -> Mapping[str, tuple[str, ...]]:
        """Actor id -> devices held (a copy)."""
        return dict(self._table)

    @property
    def allocated(self) -> int:
        """GPUs of this worker held by some actor."""
        return sum(1 for n in self.worker.names if n in self._taken)

    @property
    def free(self) -> int:
        """GPUs of this worker held by none."""
        return len(self.worker.names) - self.allocated

    def decide(self, request: GpuRequest, actor_id: str | None = None) -> Decision:
        """What :func:`decide` says for ``request`` against this table; GPUs ``actor_id``
        itself still holds (kept for a sandbox of its own that may still run, which its next
        create or restore replaces) count as free for it."""
        if self.unknown is not None:
            return Refused(f"this worker has no known GPU: {self.unknown}")
        own = self._table.get(actor_id, ()) if actor_id is not None else ()
        if not own:
            return decide(request, self.worker, self._taken.keys())
        others = {d for d, n in self._taken.items() if n > (1 if d in own else 0)}
        return decide(request, self.worker, others)

    def held(self, actor_id: str) -> tuple[str, ...]:
        """The GPUs the table says ``actor_id`` holds."""
        return self._table.get(actor_id, ())

    def hold(self, actor_id: str, devices: tuple[str, ...]) -> bool:
        """Record that ``actor_id`` holds exactly ``devices`` (none: it holds nothing).

        Returns whether GPUs were freed. A device another actor holds, or one this worker
        does not have, is an error: the table is never oversubscribed.
        """
        devices = self._expand(actor_id, devices)
        before = self._table.get(actor_id, ())
        if before == devices:
            return False
        for device in devices:
            if self._taken[device] and device not in before:
                raise errors.AllocationError(
                    f"while giving {device!r} to actor {actor_id!r}: another actor holds it"
                )
            if device not in self.worker.aliases:
                raise errors.AllocationError(
                    f"while giving {device!r} to actor {actor_id!r}: this worker has no such GPU"
                )
        return self._put(actor_id, devices)

    def _put(self, actor_id: str, devices: tuple[str, ...]) -> bool:
        before = self._table.pop(actor_id, ())
        self._taken.subtract(before)
        self._taken.update(devices)
        freed = False
        for device in before:
            if self._taken[device] <= 0:
                del self._taken[device]
                freed = True
        if devices:
            self._table[actor_id] = devices
        return freed

    def rebuild(self, held: Iterable[tuple[str, tuple[str, ...]]]) -> None:
        """Replace the table with ``(actor_id, devices)`` pairs (replay, recovery).

        Records are taken as they are (see the module doc): a GPU this worker lacks, or
        one two records hold, is logged, never an error.
        """
        self._table.clear()
        self._taken.clear()
        self._everything.clear()
        for actor_id, record in held:
            devices = self._expand(actor_id, record)
            if devices:
                self._put(actor_id, tuple(self._canonical(d) for d in devices))
        self._check_records()

    def _expand(self, actor_id: str, devices: tuple[str, ...]) -> tuple[str, ...]:
        if devices == EVERY_GPU:
            self._everything.add(actor_id)
            return self.worker.names
        self._everything.discard(actor_id)
        return devices

    def _canonical(self, device: str) -> str:
        return self.worker.aliases.get(device, device)

    def _set_worker(self, worker: WorkerGpus) -> None:
        self.worker = worker
        held = dict.fromkeys(self._everything, EVERY_GPU)
        self.rebuild({**self._table, **held}.items())

    def _check_records(self) -> None:
        if self.unknown is not None:
            return
        for actor_id, devices in self._table.items():
            for device in devices:
                if device not in self.worker.aliases:
                    _log.warning(
                        "an actor holds a GPU this worker does not have (its spec changed)",
                        worker=self.name,
                        actor_id=actor_id,
                        gpu=device,
                    )
                elif self._taken[device] > 1:
                    _log.warning(
                        "GPU held by several actors in the log's records",
                        worker=self.name,
                        actor_id=actor_id,
                        gpu=device,
                    )
