"""The default :class:`~substrate_gpu.probes.api.CudaContextProbe`: scan open file descriptors.

A sandbox holds a CUDA context while one of its host processes has an NVIDIA device open.
Under gVisor those are the sentry (nvproxy opens the host device for every guest open) and
its helpers; a stand-in sandbox (runc) holds them in the workload itself. Either way the
kernel shows them in ``/proc/<pid>/fd``, so we read the links of the given pids **and all
their descendants** (a sentry's children, a workload's forked workers).

Decisions:

- Matched by path (``re.fullmatch`` on the link text, `` (deleted)`` stripped): by default
  ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools`` and ``/dev/nvidiaN`` —
  the nodes a CUDA/NVML client opens. ``/dev/nvidia-caps/*`` (MIG capability handles) and
  ``/dev/nvidia-modeset`` are **not** clients: a process holding only those has no
  context, and counting them would refuse checkpoints that would succeed. Configurable.
- Descendants come from one pass over ``/proc/*/stat`` (the parent pid), which works on
  every kernel; ``/proc/<pid>/task/*/children`` needs ``CONFIG_PROC_CHILDREN``.
- Processes come and go during a scan: ENOENT and ESRCH mean "exited", and are skipped.
  EACCES (another user's process, when not root) is skipped with a warning: the probe is
  advisory, and ``checkpoint --leave-running`` is the safety net behind it.
- A pid can be reused between listing and reading; for a sandbox's own (long-lived)
  processes this is harmless, and nothing here kills or changes anything.
- The scan is blocking file I/O on procfs and runs in a worker thread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from substrate_gpu import _blocking
from substrate_gpu._log import get_logger
from substrate_gpu.probes import api

log = get_logger(__name__)

#: The NVIDIA device nodes whose open handles mean a live CUDA (or NVML) client.
DEFAULT_DEVICE_PATTERN = r"/dev/nvidia(?:ctl|-uvm|-uvm-tools|[0-9]+)"

_DELETED = " (deleted)"


def _ppid(stat_text: str) -> int:
    # /proc/<pid>/stat: "pid (comm) state ppid …"; comm may hold spaces and parentheses.
    return int(stat_text.rpartition(")")[2].split()[1])


@dataclass(frozen=True)
class FdScanProbe:
    """Finds NVIDIA device handles in ``/proc/<pid>/fd`` of processes and their descendants."""

    device_pattern: str = DEFAULT_DEVICE_PATTERN
    """Regular expression a descriptor's link must match in full to count as a client."""
    proc_root: Path = Path("/proc")
    """Where procfs is mounted (another mount of it, e.g. a host's /proc seen from a pod)."""
    _compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", re.compile(self.device_pattern))

    async def live_clients(self, pids: tuple[int, ...]) -> tuple[api.GpuClient, ...]:
        """Every NVIDIA device handle held by ``pids`` and their descendants."""
        # Abandonable: a /proc read stuck in the kernel must not hold the probe's timeout
        # or the agent's shutdown (substrate_gpu._blocking).
        return await _blocking.run_abandonable(lambda: self.scan(pids), name="fd-scan")

    def scan(self, pids: tuple[int, ...]) -> tuple[api.GpuClient, ...]:
        """The synchronous scan behind :meth:`live_clients`, ordered by (pid, fd)."""
        clients: list[api.GpuClient] = []
        for pid in sorted(self.with_descendants(pids)):
            clients.extend(self._scan_one(pid))
        return tuple(clients)

    def with_descendants(self, pids: tuple[int, ...]) -> set[int]:
        """``pids`` plus every live process descending from them."""
        children: dict[int, list[int]] = {}
        for pid in self._all_pids():
            try:
                parent = _ppid((self.proc_root / str(pid) / "stat").read_text())
            except (OSError, ValueError, IndexError):
                continue  # exited mid-scan (or a kernel thread without a readable stat)
            children.setdefault(parent, []).append(pid)
        found = set(pids)
        todo = list(pids)
        while todo:
            for child in children.get(todo.pop(), ()):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        return found

    def _all_pids(self) -> list[int]:
        try:
            names = [entry.name for entry in self.proc_root.iterdir()]
        except OSError:
            return []
        return [int(n) for n in names if n.isdigit()]

    def _scan_one(self, pid: int) -> list[api.GpuClient]:
        fd_dir = self.proc_root / str(pid) / "fd"
        try:
            fds = [entry.name for entry in fd_dir.iterdir()]
        except PermissionError:
            log.warning("cannot read open files of process", pid=pid, path=str(fd_dir))
            return []
        except OSError:
            return []  # ENOENT/ESRCH: exited; a zombie has no fd table
        found: list[api.GpuClient] = []
        for name in fds:
            try:
                target = str((fd_dir / name).readlink())
            except PermissionError:
                log.warning("cannot read open files of process", pid=pid, path=str(fd_dir))
                return found
            except OSError:
                continue  # the fd was closed, or the process exited, since listdir
            target = target.removesuffix(_DELETED)
            if self._compiled.fullmatch(target):
                found.append(api.GpuClient(pid=pid, fd=int(name), target=target))
        return found
