"""Crash-safe file replacement: a reader sees the old file or the new one, never a torn one.

Write to a temporary file in the same directory, fsync it, rename it over the target, then
fsync the directory so the rename itself survives a power loss. The original file's mode
is kept (runc and runsc read config.json; a 0600 temp file must not tighten it silently).

:func:`write_atomically_at` does it inside a directory given by its descriptor (every step
is relative to it, so a directory renamed or replaced by a symlink meanwhile cannot send the
write elsewhere); :func:`write_atomically` opens the directory of a path and does the same.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
from pathlib import Path


def write_atomically(
    path: Path | str, data: bytes, *, default_mode: int = 0o644, mode: int | None = None
) -> None:
    """Replace ``path`` with ``data`` atomically, keeping the existing file's mode.

    ``mode``: the permission bits to give the file, when the caller knows them already (it
    read the file); else the existing file's, or ``default_mode`` for a new file.
    Raises ``OSError`` on failure; the target is then untouched and no temp file is left.
    """
    directory, name = os.path.split(os.fspath(path))
    dir_fd = os.open(directory or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        write_atomically_at(dir_fd, name, data, default_mode=default_mode, mode=mode)
    finally:
        os.close(dir_fd)


def write_atomically_at(
    dir_fd: int, name: str, data: bytes, *, default_mode: int = 0o644, mode: int | None = None
) -> None:
    """:func:`write_atomically` of ``name`` in the directory ``dir_fd`` (an ``O_PATH``
    descriptor will do); ``name`` is one directory entry, never followed when a symlink
    (the rename replaces the link itself)."""
    if mode is None:
        try:
            found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            found = None
        # A symlink's own bits (0777) say nothing of the file that replaces it.
        mode = default_mode if found is None or stat.S_ISLNK(found) else stat.S_IMODE(found)
    fd, tmp = _create_temp(dir_fd, name)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    # fsync needs a descriptor opened for reading; an O_PATH one is refused (EBADF).
    sync_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.fsync(sync_fd)
    finally:
        os.close(sync_fd)


#: Temp names: unique per process (pid) and call (counter); O_EXCL refuses any name that
#: exists, a symlink included, so they need not be unpredictable (no getrandom per write).
_counter = itertools.count()


def _create_temp(dir_fd: int, name: str) -> tuple[int, str]:
    """A new, empty, private file next to ``name`` in ``dir_fd`` (``.<name>.<pid>-<n>.tmp``)."""
    for _attempt in range(100):
        tmp = f".{name}.{os.getpid()}-{next(_counter)}.tmp"
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
            )
        except FileExistsError:
            continue
        return fd, tmp
    raise FileExistsError(errno.EEXIST, f"no free temporary name next to {name}")
