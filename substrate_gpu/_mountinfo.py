"""The agent's mount table, and detaching every mount at or below a directory.

Two things leave mounts under directories the agent owns and must remove: runsc (with
``--network=none`` each sandbox's network namespace is bind-mounted at
``<root>/null-netns``; :mod:`substrate_gpu.runsc.roots`) and the rootfs the worker composes
from atelet's layers (:mod:`substrate_gpu.rootfs.overlay`). Both are taken apart here:

- **The mount table is the agent's own** (``/proc/self/mountinfo``): the mounts are in the
  mount namespace the agent (and the runsc it ran) lives in. Mount points are octal-escaped
  there (``\\040`` for a space); :func:`mount_points` undoes it.
- **Detached, deepest first** (``umount2(MNT_DETACH | UMOUNT_NOFOLLOW)``): a mount may still
  be held by a process that is going away; a lazy detach takes it out of the tree at once,
  which is all that removing the directory needs. Stacked mounts at one point come off one
  by one, so the table is read again until nothing under the directory is left (bounded
  rounds; what stays is an error naming it).
- **Only below the directory, never beside it**: a mount point counts when it is the
  directory or under ``<dir>/`` (``/r/a1`` is not under ``/r/a``); the directory is resolved
  first, as the mount table names real paths.
- Blocking (a thread's work).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "MOUNTINFO",
    "MountsLeft",
    "mount_points",
    "mounts_under",
    "under",
    "unescape",
    "unmount_all_under",
]

MOUNTINFO = Path("/proc/self/mountinfo")
"""The mount table of the agent's own mount namespace."""
MNT_DETACH = 2
"""``umount2`` flag: detach now, release when the last user goes (``umount -l``)."""
UMOUNT_NOFOLLOW = 8
"""``umount2`` flag: a symlink at the path is not followed."""
_ROUNDS = 256
"""Passes over the mount table before giving up (one per mount stacked at one point)."""
_ESCAPE = re.compile(r"\\([0-7]{3})")


class MountsLeft(OSError):
    """Mounts under a directory would not detach; the message names them and why."""


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


def mounts_under(root: Path | str, mountinfo: Path | str = MOUNTINFO) -> list[str]:
    """The mount points at or below ``root`` now, deepest first. ``mountinfo``: the table's
    file, or its text already read (one read for many directories)."""
    real = os.path.realpath(root)
    text = (
        mountinfo.read_text(encoding="utf-8", errors="surrogateescape")
        if isinstance(mountinfo, Path)
        else mountinfo
    )
    return [p for _, p in under(mount_points(text), real)]


def _umount_detach(path: str) -> int:
    """``umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW)``: 0, or the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(path), MNT_DETACH | UMOUNT_NOFOLLOW) == 0:
        return 0
    return ctypes.get_errno()


def unmount_all_under(root: Path | str, mountinfo: Path = MOUNTINFO) -> list[str]:
    """Detach every mount at or below ``root``; the mount points detached, or
    :class:`MountsLeft` naming what stays."""
    previous: list[str] | None = None
    done: list[str] = []
    for _ in range(_ROUNDS):
        left = mounts_under(root, mountinfo)
        if not left:
            return done
        failures: list[str] = []
        for point in left:
            # EINVAL: no longer a mount point (a parent's detach took it); ENOENT: gone.
            code = _umount_detach(point)
            if code == 0:
                done.append(point)
            elif code not in (errno.EINVAL, errno.ENOENT):
                failures.append(f"{point} ({os.strerror(code)})")
        if failures and left == previous:
            raise MountsLeft(f"while unmounting under {root}: cannot unmount {', '.join(failures)}")
        previous = left
    raise MountsLeft(
        f"while unmounting under {root}: still mounted after {_ROUNDS} passes: "
        f"{', '.join(mounts_under(root, mountinfo))}"
    )
