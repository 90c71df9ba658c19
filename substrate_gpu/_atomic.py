"""Crash-safe file replacement: a reader sees the old file or the new one, never a torn one.

Write to a temporary file in the same directory, fsync it, rename it over the target, then
fsync the directory so the rename itself survives a power loss. The original file's mode
is kept (runc and runsc read config.json; a 0600 temp file must not tighten it silently).
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
    target = os.fspath(path)
    directory, name = os.path.split(target)
    directory = directory or "."
    if mode is None:
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)  # noqa: PTH116
        except FileNotFoundError:
            mode = default_mode
    fd, tmp = _create_temp(directory, name)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)  # noqa: PTH105  (str paths: no Path built on the hot path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # noqa: PTH108
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


#: Temp names: unique per process (pid) and call (counter); O_EXCL refuses any name that
#: exists, a symlink included, so they need not be unpredictable (no getrandom per write).
_counter = itertools.count()


def _create_temp(directory: str, name: str) -> tuple[int, str]:
    """A new, empty, private file next to ``name`` in ``directory``
    (``.<name>.<pid>-<n>.tmp``)."""
    for _attempt in range(100):
        tmp = f"{directory}/.{name}.{os.getpid()}-{next(_counter)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        return fd, tmp
    raise FileExistsError(errno.EEXIST, f"no free temporary name next to {directory}/{name}")
