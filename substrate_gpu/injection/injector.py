"""The node agent's GPU injector: one per worker, shared by all its actors.

Ties the pieces together for the lifecycle pipeline (it satisfies
:class:`substrate_gpu.lifecycle.effects.GpuInjector`): the worker's CDI spec is generated
once (:class:`~substrate_gpu.injection.toolkit.CdiSpecGenerator`) or given, its ``all``
edits are computed once per spec, the SONAME cache is shared so later actors pay only a
stat per library.

**The thread hop, only where the work can block.** An injection that may wait on a device
runs in a worker thread, so the event loop keeps serving other actors; that thread is
abandoned when the effect times out or the agent closes (:mod:`substrate_gpu._blocking`), so
a stuck read never holds an actor in ``injecting`` nor the agent's shutdown. That is the
first injection of an edits set (the SONAME reads of the host's driver libraries) and any
injection into a bundle on a device-backed filesystem (the config.json fsyncs; a hung
network mount). A later injection into a bundle on a memory-backed filesystem (tmpfs, as
containerd's ``/run`` and atelet's per-pod directories usually are) touches no device: a
stat per library, a read and an fsync of memory. It runs inline: the hop (a thread start,
then GIL hand-offs both ways while the loop is busy) cost more than the injection itself
(tests/bench/bench_injection.py prints both).

An actor may instead be given **named devices** (``nvidia.com/gpu=2``, a UUID name, the
names a DRA claim carries): they resolve against the worker's spec plus the specs of the
CDI directories (``spec_dirs``: where a DRA driver writes its per-claim specs), re-read
for each named request since a claim's spec appears just before its container starts.
Without names, the actor gets ``all``, as before.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from substrate_gpu import _blocking, cdi
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.rootfs import SonameCache

if TYPE_CHECKING:
    from substrate_gpu.cdi import model
    from substrate_gpu.injection.toolkit import CdiSpecGenerator


#: Distinct named-device requests whose edits are kept (a worker has a handful of GPUs).
_NAMED_CACHE_SIZE = 64


def _same_specs(a: cdi.SpecSet, b: cdi.SpecSet) -> bool:
    return len(a.specs) == len(b.specs) and all(
        x is y for x, y in zip(a.specs, b.specs, strict=True)
    )


#: Filesystems whose reads, writes and fsyncs never wait on a device.
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
MOUNT_TABLE = Path("/proc/self/mountinfo")


def _on_memory_filesystem(device: int, mount_table: Path = MOUNT_TABLE) -> bool:
    """Whether the mount of ``st_dev`` ``device`` is one of :data:`MEMORY_FILESYSTEMS`
    (proc(5) mountinfo: field 3 is ``major:minor``, the type follows ``-``). Unknown (a
    device the table does not list, as btrfs subvolumes; no /proc): not memory-backed."""
    wanted = f"{os.major(device)}:{os.minor(device)}"
    try:
        with mount_table.open(encoding="utf-8", errors="replace") as table:
            for line in table:
                fields = line.split()
                if len(fields) > 2 and fields[2] == wanted and " - " in line:
                    return line.split(" - ", 1)[1].split(" ", 1)[0] in MEMORY_FILESYSTEMS
    except OSError:
        pass
    return False


class InjectionMetrics(Protocol):
    """Where skipped toolkit hooks are counted (``AgentMetrics`` implements it)."""

    def injection_hook_skipped(self, hook: str) -> None:
        """One hook of the spec was left out of a bundle (bounded name)."""
        ...


class WorkerGpuInjector:
    """Injects this worker's GPUs into actor bundles."""

    def __init__(
        self,
        *,
        options: bundle_.InjectionOptions,
        generator: CdiSpecGenerator | None = None,
        spec: model.Spec | None = None,
        soname_cache: SonameCache | None = None,
        metrics: InjectionMetrics | None = None,
        spec_dirs: Sequence[Path] = (),
    ) -> None:
        if (generator is None) == (spec is None):
            raise ValueError("WorkerGpuInjector needs exactly one of generator= or spec=")
        self.options = options
        self._generator = generator
        self._spec = spec
        self._edits: tuple[model.Spec, model.ContainerEdits] | None = None
        self.soname_cache = soname_cache or SonameCache()
        self.plan_cache = bundle_.PlanCache()
        self.metrics = metrics
        self.spec_dirs = tuple(spec_dirs)
        self._reader = cdi.SpecDirReader(self.spec_dirs)
        self.last_report: bundle_.InjectionReport | None = None
        self._named: dict[tuple[str, ...], tuple[cdi.SpecSet, model.ContainerEdits]] = {}
        self.always_in_thread = False
        """Hop to a thread for every injection (what it did before; benchmarks compare)."""
        self._warm: set[int] = set()
        """``id()`` of the edits already injected once: their libraries' SONAMEs are cached."""
        self._memory_backed: dict[int, bool] = {}
        """Filesystem (``st_dev``) -> memory-backed, read once each from the mount table."""

    async def edits(self) -> model.ContainerEdits:
        """The spec-level + ``all`` edits, computed once per spec."""
        spec = self._spec if self._spec is not None else await self._ensure_generated()
        if self._edits is None or self._edits[0] is not spec:
            self._edits = (spec, cdi.edits_for_all(spec))
        return self._edits[1]

    async def spec_set(self) -> cdi.SpecSet:
        """The worker's spec plus the specs of ``spec_dirs`` (read now)."""
        spec = self._spec if self._spec is not None else await self._ensure_generated()
        if not self.spec_dirs:
            return cdi.SpecSet([spec])
        return await _blocking.run_abandonable(
            functools.partial(self._reader.read, extra=(spec,)), name="substrate-gpu cdi read"
        )

    async def edits_for(self, devices: Sequence[str]) -> model.ContainerEdits:
        """The spec-level + named-device edits (a DeviceRequestError names what is wrong)."""
        spec_set = await self.spec_set()
        key = tuple(devices)
        cached = self._named.get(key)
        # Reused only while the specs are the very same objects (the plan cache keys on it).
        if cached is not None and _same_specs(cached[0], spec_set):
            return cached[1]
        edits = cdi.edits_for_devices(spec_set, devices)
        if len(self._named) >= _NAMED_CACHE_SIZE:
            self._named.clear()
        self._named[key] = (spec_set, edits)
        return edits

    async def _ensure_generated(self) -> model.Spec:
        if self._generator is None:  # pragma: no cover  (the constructor guarantees one)
            raise ValueError("WorkerGpuInjector has neither a spec nor a generator")
        return await self._generator.ensure_spec()

    async def inject(
        self, bundle: Path, *, devices: Sequence[str] | None = None, container: str | None = None
    ) -> bundle_.InjectionReport:
        """Inject ``devices`` (qualified CDI names; ``None``: all GPUs) into ``bundle``, or
        into ``<bundle>/<container>`` (never through a link)."""
        edits = await self.edits() if devices is None else await self.edits_for(devices)
        injection = functools.partial(
            bundle_.inject_gpu,
            bundle,
            edits,
            options=self.options,
            soname_cache=self.soname_cache,
            plan_cache=self.plan_cache,
            container=container,
        )
        if self._may_block(bundle, edits):
            # Abandonable: a step stuck in the kernel must not outlive the effect's timeout.
            report = await _blocking.run_abandonable(injection, name="substrate-gpu inject")
            if len(self._warm) > _NAMED_CACHE_SIZE:
                self._warm.clear()
            self._warm.add(id(edits))
        else:
            report = injection()
        self.last_report = report
        if self.metrics is not None and report.outcome == "injected":
            for hook in report.hooks_skipped:
                self.metrics.injection_hook_skipped(hook)
        return report

    def _may_block(self, bundle: Path, edits: model.ContainerEdits) -> bool:
        """Whether injecting ``edits`` into ``bundle`` may wait on a device (module doc)."""
        if self.always_in_thread or id(edits) not in self._warm:
            return True
        try:
            device = bundle.stat().st_dev
        except OSError:
            return True  # the injection says what is wrong, from the thread
        backed = self._memory_backed.get(device)
        if backed is None:
            backed = self._memory_backed[device] = _on_memory_filesystem(device)
        return not backed

    async def withhold(self, bundle: Path, container: str) -> bundle_.InjectionReport:
        """Give ``<bundle>/<container>`` no GPU (:func:`~.bundle.withhold_gpus`), in a thread."""
        report = await _blocking.run_abandonable(
            functools.partial(bundle_.withhold_gpus, bundle, container),
            name="substrate-gpu withhold",
        )
        self.last_report = report
        return report

    async def __call__(
        self, bundle: Path, *, devices: Sequence[str] | None = None, container: str | None = None
    ) -> int:
        """Inject into ``bundle`` (or its ``container``'s); the number of device nodes it
        now holds from the spec. ``devices=()`` for a ``container``: it gets no GPU
        (:meth:`withhold`), 0."""
        if devices is not None and not devices and container is not None:
            await self.withhold(bundle, container)
            return 0
        return len((await self.inject(bundle, devices=devices, container=container)).devices)
