"""Removing a sandbox's own runsc root once its containers are gone: mounts first.

runsc leaves mounts behind in its ``--root``: with ``--network=none`` each sandbox's
network namespace is bind-mounted (an ``nsfs`` mount) at ``<root>/null-netns``, one more per
sandbox that ran under that root, and ``runsc delete`` leaves them there. A per-actor root
(``<root>/<actor_id>``, :meth:`~substrate_gpu.runsc.driver.RunscDriver.for_actor`) is then
never removable: ``rm -rf`` fails "Device or resource busy" and every activation leaks a
mount and a directory. Upstream's worker clears its root the same way at Run, Restore and
Terminate (``resetRunscStateAndPidFileDirs``: ``imagecache.UnmountAllUnder``, then remove).

Decisions worth knowing:

- **The mount table is the agent's own** (``/proc/self/mountinfo``): the mounts runsc made
  are in the mount namespace it ran in, the agent's. Mount points are octal-escaped there
  (``\\040`` for a space); :func:`mount_points` undoes it.
- **Detached, deepest first** (``umount2(MNT_DETACH)``): a namespace mount may still be held
  by a process that is going away; a lazy detach takes it out of the tree at once, which is
  all that removing the directory needs. Stacked mounts at one point come off one by one,
  so the table is read again until nothing under the root is left (bounded rounds; what
  stays is an error naming it).
- **Only below the root, never beside it**: a mount point counts when it is the root or
  under ``<root>/`` (``/r/a1`` is not under ``/r/a``); the root is resolved first, as the
  mount table names real paths.
- Blocking (a thread's work: :func:`remove` reads files and calls the kernel).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
"""The mount table of the agent's own mount namespace."""
MNT_DETACH = 2
"""``umount2`` flag: detach now, release when the last user goes (``umount -l``)."""
_ROUNDS = 256
"""Passes over the mount table before giving up (one per mount stacked at one point)."""
_ESCAPE = re.compile(r"\\([0-7]{3})")


class RootRemovalError(OSError):
    """A sandbox root could not be unmounted or removed; the message names what stays."""


def unescape(field: str) -> str:
    """A mountinfo path field with its octal escapes (``\\040``) undone."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def mount_points(mountinfo: str) -> list[tuple[int, str]]:
    """``(mount id, mount point)`` of every line of a ``/proc/<pid>/mountinfo`` text."""
    found: list[tuple[int, str]] = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) < 5 or not fields[0].isdigit():
            continue
        found.append((int(fields[0]), unescape(fields[4])))
    return found


def under(points: Iterable[tuple[int, str]], root: str) -> list[tuple[int, str]]:
    """The mounts at ``root`` or below it, deepest (then newest) first."""
    prefix = root.rstrip("/") + "/"
    chosen = [(i, p) for i, p in points if p == root or p.startswith(prefix)]
    return sorted(chosen, key=lambda m: (m[1].count("/"), m[0]), reverse=True)


def mounts_under(root: Path, mountinfo: Path = MOUNTINFO) -> list[str]:
    """The mount points at or below ``root`` now (deepest first)."""
    real = os.path.realpath(root)
    return [p for _, p in under(mount_points(mountinfo.read_text(encoding="utf-8")), real)]


def _umount_detach(path: str) -> int:
    """``umount2(path, MNT_DETACH)``: 0, or the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(path), MNT_DETACH) == 0:
        return 0
    return ctypes.get_errno()


def unmount_all_under(root: Path, mountinfo: Path = MOUNTINFO) -> None:
    """Detach every mount at or below ``root``; :class:`RootRemovalError` naming what stays."""
    previous: list[str] | None = None
    for _ in range(_ROUNDS):
        left = mounts_under(root, mountinfo)
        if not left:
            return
        failures: list[str] = []
        for point in left:
            # EINVAL: no longer a mount point (a parent's detach took it); ENOENT: gone.
            code = _umount_detach(point)
            if code not in (0, errno.EINVAL, errno.ENOENT):
                failures.append(f"{point} ({os.strerror(code)})")
        if failures and left == previous:
            raise RootRemovalError(
                f"while unmounting what runsc left under {root}: cannot unmount "
                f"{', '.join(failures)}"
            )
        previous = left
    raise RootRemovalError(
        f"while unmounting what runsc left under {root}: still mounted after {_ROUNDS} "
        f"passes: {', '.join(mounts_under(root, mountinfo))}"
    )


def remove(root: Path, mountinfo: Path = MOUNTINFO) -> None:
    """Unmount everything at or below ``root``, then remove it (absent already: nothing to
    do). :class:`RootRemovalError` when a mount or a file stays."""
    if not os.path.lexists(root):
        return
    unmount_all_under(root, mountinfo)
    try:
        if root.is_symlink() or not root.is_dir():
            root.unlink()
        else:
            shutil.rmtree(root)
    except FileNotFoundError:
        return
    except OSError as e:
        raise RootRemovalError(
            f"while removing runsc root {root}: {e.strerror or e}"
            + (f" ({e.filename})" if e.filename and str(e.filename) != str(root) else "")
        ) from e
