"""The worker API's stats: a sample per live activation, from its sandbox's cgroup.

**Stats never wait.** They read the actor table and the sandbox's cgroup
(:mod:`.cgroup_stats`), never the per-UID lock the lifecycle calls hold. Each live
activation's cgroup files stay open (a :class:`~.cgroup_stats.CgroupReader` per
activation), and one stats call reads all of them in one thread hop, under a lock of the
stats' own, so no descriptor is closed while read. Readers of activations no longer live
are closed at the next stats call (its cost at 1,000 live: docs/worker-api.md, Performance).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import anyio
import anyio.to_thread

from substrate_gpu import _blocking
from substrate_gpu.lifecycle import Agent, actors
from substrate_gpu.service import cgroup_stats, worker_requests
from substrate_gpu.service.ateworker import ateworker_pb2 as pb

#: Where the activation's start is kept beside the identity (``epoch_unix_nano`` of the
#: samples).
EPOCH_KEY: Final = "epoch_unix_nano"
#: States whose sandbox has no cgroup yet, whatever the bundle says.
_NOT_BOOTED: Final = frozenset({"registered", "bundle_prepared"})


class Stats:
    """Samples of the worker's activations, their cgroups and open readers."""

    def __init__(self, agent: Agent, is_live: Callable[[str], bool], cgroup_root: Path) -> None:
        """``is_live``: whether an activation is still live (its reader is kept);
        ``cgroup_root``: where the sandboxes' cgroups are read."""
        self._agent = agent
        self._is_live = is_live
        self._cgroup_root = cgroup_root
        self._cgroups: dict[str, str | None] = {}
        self._readers: dict[str, cgroup_stats.CgroupReader] = {}
        # Held while the readers' descriptors are read (in a thread) or closed.
        self._lock = anyio.Lock()

    def place(self, actor_id: str, cgroup: str | None) -> None:
        """The cgroup a Run or Restore gave ``actor_id``'s sandbox (None: not a cgroupfs
        path it can read)."""
        self._cgroups[actor_id] = cgroup

    async def samples(self, views: list[actors.ActorView]) -> list[pb.WorkloadStatsSample]:
        """A sample per view. Every sandbox's cgroup is read in one thread hop (the loop
        serves the lifecycle calls meanwhile)."""
        readers: list[cgroup_stats.CgroupReader | None] = []
        for view in views:
            cgroup = await self._cgroup_of(view)
            if cgroup is None or view.state in _NOT_BOOTED:
                readers.append(None)
                continue
            reader = self._readers.get(view.actor_id)
            if reader is None:
                files = cgroup_stats.files_of(cgroup, self._cgroup_root)
                reader = self._readers[view.actor_id] = cgroup_stats.CgroupReader(files)
            readers.append(reader)
        async with self._lock:
            for actor_id in [a for a in self._readers if not self._is_live(a)]:
                self._readers.pop(actor_id).close()
            for actor_id in [a for a in self._cgroups if self._agent.state_of(a) == "deleted"]:
                del self._cgroups[actor_id]
            readings = await anyio.to_thread.run_sync(cgroup_stats.read_many, readers)
        return [sample(v, r) for v, r in zip(views, readings, strict=True)]

    async def _cgroup_of(self, view: actors.ActorView) -> str | None:
        """The sandbox's cgroup: set at Run/Restore, else read back from ``_pause``'s bundle
        (an agent restarted on its log; in a thread); None when not an absolute cgroupfs
        path."""
        if view.actor_id not in self._cgroups:
            path = None
            with contextlib.suppress(worker_requests.BadRequest):
                # A ``_pause``-alone activation's bundle is ``_pause``'s own.
                bundle_dir = Path(view.bundle) if view.containers else Path(view.bundle).parent
                config = await _blocking.run_abandonable(
                    functools.partial(worker_requests.read_pause_config, bundle_dir),
                    name="substrate-gpu read bundle",
                )
                linux = config.get("linux")
                if isinstance(linux, dict) and isinstance(linux.get("cgroupsPath"), str):
                    path = linux["cgroupsPath"]
            self._cgroups[view.actor_id] = path
        path = self._cgroups[view.actor_id]
        return path if path is not None and path.startswith("/") else None


def sample(
    view: actors.ActorView, reading: cgroup_stats.CgroupSample | None
) -> pb.WorkloadStatsSample:
    """``view``'s sample: its identity, and ``reading`` when its cgroup was read (else the
    source stays unspecified: no numbers right now)."""
    identity = view.identity
    made = pb.WorkloadStatsSample(
        sandbox_class=pb.SANDBOX_CLASS_GVISOR,
        observed_at_unix_nano=time.time_ns(),
        epoch_unix_nano=int(identity.get(EPOCH_KEY, "0") or 0),
        atespace=identity.get("atespace", ""),
        actor_name=identity.get("actor_name", ""),
        actor_uid=identity.get("actor_uid", ""),
        actor_template_atespace=identity.get("actor_template_atespace", ""),
        actor_template_name=identity.get("actor_template_name", ""),
    )
    if reading is not None:
        made.source = pb.STATS_SOURCE_CGROUP
        made.memory_current_bytes = reading.memory_current_bytes
        made.memory_peak_bytes = reading.memory_peak_bytes
        made.memory_working_set_bytes = reading.memory_working_set_bytes
        made.cpu_usage_usec = reading.cpu_usage_usec
    return made
