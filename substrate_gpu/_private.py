"""Checkpoint images are the sandbox's memory: only their owner may read them, whatever
the umask.

An image holds everything the actor had in memory, its keys and tokens included. Under the
usual umask (022) runsc's ``checkpoint`` makes the image directory 0755 and the files 0644
(``os.MkdirAll(dir, 0755)``, ``os.OpenFile(..., 0644)``): world-readable. Three measures,
each closing a different gap:

- the directories we make for images (and their missing parents) are 0700, set with
  ``fchmod`` after ``mkdir`` so no umask widens or narrows them (:func:`make_private_dirs`);
- runsc's ``checkpoint`` runs with the child-only umask :data:`UMASK` (the runsc driver
  passes it to the process it spawns; the agent's own umask is untouched), so runsc
  creates its files 0600 and a directory of its own 0700 from the first byte;
- before a checkpoint is reported written, every regular file directly in the image
  directory loses its group and other bits (:func:`make_files_private`): whatever wrote
  them (another runtime, a newer runsc that sets modes itself) and our manifest.

A directory that already exists is left as it is: it is the caller's (a worker request's
``actor_dirs.checkpoint_dir``, which atelet may have made, or a suspend's ``image_path``),
and the files inside are private whatever its mode.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Final

__all__ = ["DIR_MODE", "UMASK", "make_files_private", "make_private_dirs"]

DIR_MODE: Final = 0o700
"""The mode of every directory made for checkpoint images."""
UMASK: Final = 0o077
"""The umask runsc's ``checkpoint`` runs with: its files 0600, its directories 0700."""
_NOT_OWNER: Final = 0o077
"""The group and other permission bits."""
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def make_private_dirs(path: Path) -> None:
    """Make ``path`` and each missing parent, mode 0700 whatever the umask; directories that
    exist already keep their mode. ``OSError`` when one cannot be made."""
    missing: list[Path] = []
    at = path
    while not os.path.lexists(at):
        missing.append(at)
        at = at.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(DIR_MODE)
        except FileExistsError:
            continue  # a racing maker: its mode is its own
        # mkdir's mode passes through the umask; set it exactly, on what we just made.
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, DIR_MODE)
        finally:
            os.close(fd)


def make_files_private(directory: Path) -> None:
    """Clear the group and other bits of every regular file directly in ``directory``
    (never through a symlink; other entries are left alone). Nothing to do for a directory
    that does not exist. ``OSError`` when a file cannot be changed."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        for name in os.listdir(dir_fd):  # noqa: PTH208 (by descriptor: no path re-walked)
            try:
                # O_NONBLOCK: a FIFO dropped here opens at once (and is skipped below).
                fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOENT):
                    continue  # a symlink, or gone meanwhile: nothing of ours to change
                raise
            try:
                mode = os.fstat(fd).st_mode
                if stat.S_ISREG(mode) and stat.S_IMODE(mode) & _NOT_OWNER:
                    os.fchmod(fd, stat.S_IMODE(mode) & ~_NOT_OWNER)
            finally:
                os.close(fd)
    finally:
        os.close(dir_fd)
