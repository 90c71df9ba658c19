"""Removing a sandbox's own runsc root once its containers are gone: mounts first.

runsc leaves mounts behind in its ``--root``: with ``--network=none`` each sandbox's
network namespace is bind-mounted (an ``nsfs`` mount) at ``<root>/null-netns``, one more per
sandbox that ran under that root, and ``runsc delete`` leaves them there. A per-actor root
(``<root>/<actor_id>``, :meth:`~substrate_gpu.runsc.driver.RunscDriver.for_actor`) is then
never removable: ``rm -rf`` fails "Device or resource busy" and every activation leaks a
mount and a directory. Upstream's worker clears its root the same way at Run, Restore and
Terminate (``resetRunscStateAndPidFileDirs``: ``imagecache.UnmountAllUnder``, then remove).

Decisions worth knowing:

- The mounts are detached as :mod:`substrate_gpu._mountinfo` says (the agent's own mount
  table, deepest first, lazily, only at or below the root), then the tree is removed.
- Blocking (a thread's work: :func:`remove` reads files and calls the kernel).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from substrate_gpu._mountinfo import MOUNTINFO, mount_points, mounts_under, under, unescape
from substrate_gpu._mountinfo import MountsLeft as RootRemovalError
from substrate_gpu._mountinfo import unmount_all_under as _unmount_all_under

__all__ = [
    "MOUNTINFO",
    "RootRemovalError",
    "mount_points",
    "mounts_under",
    "remove",
    "under",
    "unescape",
]


def remove(root: Path, mountinfo: Path = MOUNTINFO) -> None:
    """Unmount everything at or below ``root``, then remove it (absent already: nothing to
    do). :class:`RootRemovalError` when a mount or a file stays."""
    if not os.path.lexists(root):
        return
    _unmount_all_under(root, mountinfo)
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
