"""A sandbox's resource usage, read from its cgroup (the worker API's stats calls).

gVisor runs a whole sandbox (every container of it) as one host process tree started from
the root container's ``create``, inside the cgroup the root container's
``linux.cgroupsPath`` names; the app containers' cgroups stay empty markers. So the
``_pause`` container's cgroup is the sandbox's, and its figures are the sandbox's: the
sentry's own overhead and the gofers included (upstream measures the same way).

Both cgroup layouts are read, so the figures mean the same on either:

- **v2** (``<root>/cgroup.controllers`` exists): ``memory.current``, ``memory.peak``,
  ``memory.stat``'s ``inactive_file``, ``cpu.stat``'s ``usage_usec``;
- **v1** (one hierarchy per controller): ``memory/…/memory.usage_in_bytes``,
  ``memory.max_usage_in_bytes``, ``memory.stat``'s ``total_inactive_file`` (the
  hierarchical one, as v2's is), ``cpuacct/…/cpuacct.usage`` (ns, turned into µs).

A missing memory figure means "nothing to measure" (the sandbox is not created yet, or is
gone): :func:`read` answers None. Every other figure missing reads as 0 (an older kernel has
no ``memory.peak``; a cgroup without the cpu controller has no usage), so one absent file
never hides the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final

CGROUP_ROOT: Final = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CgroupSample:
    """One reading of a sandbox's cgroup."""

    memory_current_bytes: int
    """Bytes charged to the cgroup now, page cache included."""
    memory_peak_bytes: int
    """The high-water mark of :attr:`memory_current_bytes` (0: the kernel does not say)."""
    memory_working_set_bytes: int
    """:attr:`memory_current_bytes` less the reclaimable page cache, at least 0."""
    cpu_usage_usec: int
    """CPU time used since the cgroup was made, in microseconds."""


def read(cgroup: str, root: Path = CGROUP_ROOT) -> CgroupSample | None:
    """The sample of the cgroup at path ``cgroup`` (as ``linux.cgroupsPath`` names it), or
    None while it has no memory figure (not created yet, or removed)."""
    relative = PurePosixPath(cgroup).relative_to("/")
    if (root / "cgroup.controllers").exists():
        where = root / relative
        current = _number(where / "memory.current")
        if current is None:
            return None
        peak = _number(where / "memory.peak") or 0
        inactive = _keyed(where / "memory.stat", "inactive_file")
        cpu = _keyed(where / "cpu.stat", "usage_usec") or 0
    else:
        memory = root / "memory" / relative
        current = _number(memory / "memory.usage_in_bytes")
        if current is None:
            return None
        peak = _number(memory / "memory.max_usage_in_bytes") or 0
        inactive = _keyed(memory / "memory.stat", "total_inactive_file")
        cpu = (_number(root / "cpuacct" / relative / "cpuacct.usage") or 0) // 1000
    # The files are read a moment apart: inactive_file can exceed the current figure.
    working_set = current if inactive is None else max(current - inactive, 0)
    return CgroupSample(
        memory_current_bytes=current,
        memory_peak_bytes=peak,
        memory_working_set_bytes=working_set,
        cpu_usage_usec=cpu,
    )


def _number(path: Path) -> int | None:
    """A file holding one unsigned number, or None when it is absent or not a number."""
    try:
        text = path.read_text()
    except OSError:
        return None
    text = text.strip()
    return int(text) if text.isdigit() else None


def _keyed(path: Path, key: str) -> int | None:
    """The value of ``key`` in a flat-keyed file (``key value`` lines), or None."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value.strip())
    return None
