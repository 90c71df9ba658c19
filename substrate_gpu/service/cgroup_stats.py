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

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final, Literal

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


@dataclass(frozen=True)
class CgroupFiles:
    """Where one cgroup's figures are read, resolved once (the worker keeps one per
    activation, so a stats call opens four files per sandbox and builds no path)."""

    current: str
    """The memory figure; absent: nothing to measure."""
    peak: str
    stat: str
    """The flat-keyed memory.stat, read for :attr:`inactive_key`."""
    inactive_key: bytes
    cpu: str
    cpu_key: bytes | None
    """The key of the CPU figure in its flat-keyed file; None: the file is one number."""
    cpu_divisor: int
    """What turns the CPU figure into µs (v1's cpuacct.usage is in ns)."""


def files_of(cgroup: str, root: Path = CGROUP_ROOT) -> CgroupFiles:
    """The files of the cgroup at path ``cgroup`` (as ``linux.cgroupsPath`` names it), in the
    layout ``root`` has now."""
    relative = PurePosixPath(cgroup).relative_to("/")
    if (root / "cgroup.controllers").exists():
        where = f"{root / relative}/"
        return CgroupFiles(
            current=where + "memory.current",
            peak=where + "memory.peak",
            stat=where + "memory.stat",
            inactive_key=b"inactive_file",
            cpu=where + "cpu.stat",
            cpu_key=b"usage_usec",
            cpu_divisor=1,
        )
    memory = f"{root / 'memory' / relative}/"
    return CgroupFiles(
        current=memory + "memory.usage_in_bytes",
        peak=memory + "memory.max_usage_in_bytes",
        stat=memory + "memory.stat",
        inactive_key=b"total_inactive_file",
        cpu=f"{root / 'cpuacct' / relative}/cpuacct.usage",
        cpu_key=None,
        cpu_divisor=1000,
    )


def read(cgroup: str, root: Path = CGROUP_ROOT) -> CgroupSample | None:
    """The sample of the cgroup at path ``cgroup`` (as ``linux.cgroupsPath`` names it), or
    None while it has no memory figure (not created yet, or removed)."""
    return read_files(files_of(cgroup, root))


class CgroupReader:
    """One cgroup's figure files, held open while its sandbox lives: a sample is then four
    ``pread``-s at offset 0 (a cgroup file is regenerated on each read from its start), with
    no path walk and no open, the bulk of a read's cost when each file is opened per read
    (tests/bench/README.md, "Figures behind design choices").

    Not thread-safe: one sample at a time, and :meth:`close` never while one is being read
    (a closed descriptor's number can be reused by any file). When the cgroup is removed,
    its open files read ``ENODEV``: the reader closes them and opens the path afresh once
    (a sandbox re-made at the same path), else it answers None until the path is back. A
    process out of descriptors reads by path instead (:func:`read_files`), holding none.
    """

    def __init__(self, files: CgroupFiles) -> None:
        self.files = files
        self._fds: tuple[int, int, int, int] | None = None

    def read(self) -> CgroupSample | None:
        """The sample now, or None while the cgroup has no memory figure."""
        for _ in range(2):
            if self._fds is None:
                opened = self._open()
                if opened == "out of descriptors":
                    return read_files(self.files)
                if opened == "absent":
                    return None
            assert self._fds is not None
            current_fd, peak_fd, stat_fd, cpu_fd = self._fds
            current = _number(_pread(current_fd))
            if current is not None:
                break
            self.close()  # the cgroup went (ENODEV): open its path once more
        else:
            return None
        inactive = _keyed(_pread(stat_fd), self.files.inactive_key)
        cpu_text = _pread(cpu_fd)
        key = self.files.cpu_key
        cpu = _number(cpu_text) if key is None else _keyed(cpu_text, key)
        working_set = current if inactive is None else max(current - inactive, 0)
        return CgroupSample(
            memory_current_bytes=current,
            memory_peak_bytes=_number(_pread(peak_fd)) or 0,
            memory_working_set_bytes=working_set,
            cpu_usage_usec=(cpu or 0) // self.files.cpu_divisor,
        )

    def close(self) -> None:
        """Close the files (idempotent); a later :meth:`read` opens them again."""
        fds, self._fds = self._fds, None
        for fd in fds or ():
            if fd >= 0:
                os.close(fd)

    def _open(self) -> Literal["open", "absent", "out of descriptors"]:
        """Open the four files ("absent": no memory figure, nothing to measure yet)."""
        files = self.files
        opened: list[int] = []
        try:
            for path in (files.current, files.peak, files.stat, files.cpu):
                try:
                    opened.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
                except OSError as e:
                    if e.errno in (errno.EMFILE, errno.ENFILE):
                        raise
                    if not opened:
                        return "absent"
                    opened.append(-1)  # an optional figure this kernel lacks: reads 0
        except OSError:
            for fd in opened:
                if fd >= 0:
                    os.close(fd)
            return "out of descriptors"
        self._fds = (opened[0], opened[1], opened[2], opened[3])
        return "open"


def _pread(fd: int) -> bytes | None:
    if fd < 0:
        return None
    try:
        return os.pread(fd, _READ_SIZE, 0)
    except OSError:
        return None


def read_many(readers: Sequence[CgroupReader | None]) -> list[CgroupSample | None]:
    """Each reader's sample (None stays None): one call for a whole stats answer, so the
    worker makes one thread hop for it, not one per sandbox."""
    return [None if reader is None else reader.read() for reader in readers]


def read_files(files: CgroupFiles) -> CgroupSample | None:
    """The sample of one cgroup's files; None while it has no memory figure."""
    current = _number(_contents(files.current))
    if current is None:
        return None
    peak = _number(_contents(files.peak)) or 0
    inactive = _keyed(_contents(files.stat), files.inactive_key)
    cpu_text = _contents(files.cpu)
    cpu = _number(cpu_text) if files.cpu_key is None else _keyed(cpu_text, files.cpu_key)
    # The files are read a moment apart: inactive_file can exceed the current figure.
    working_set = current if inactive is None else max(current - inactive, 0)
    return CgroupSample(
        memory_current_bytes=current,
        memory_peak_bytes=peak,
        memory_working_set_bytes=working_set,
        cpu_usage_usec=(cpu or 0) // files.cpu_divisor,
    )


_READ_SIZE: Final = 1 << 16
"""More than any of these files holds (memory.stat is ~1.5 KiB): one read returns it all."""


def _contents(path: str) -> bytes | None:
    """The file's bytes; None when it cannot be read (absent, or its cgroup went)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, _READ_SIZE)
    except OSError:
        return None
    finally:
        os.close(fd)


def _number(data: bytes | None) -> int | None:
    """A file holding one unsigned number, or None when it is absent or not a number."""
    if data is None:
        return None
    text = data.strip()
    return int(text) if text.isdigit() else None


def _keyed(data: bytes | None, key: bytes) -> int | None:
    """The value of ``key`` in a flat-keyed file (``key value`` lines), or None."""
    if data is None:
        return None
    if data.startswith(key + b" "):
        start = len(key) + 1
    else:
        at = data.find(b"\n" + key + b" ")
        if at < 0:
            return None
        start = at + len(key) + 2
    end = data.find(b"\n", start)
    value = data[start : end if end >= 0 else len(data)].strip()
    return int(value) if value.isdigit() else None
