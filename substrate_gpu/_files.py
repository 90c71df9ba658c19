"""Reading a file an untrusted party may have replaced: never through a symlink, never
blocking, never unbounded.

A bundle's config.json comes from the image and a checkpoint's manifest from a directory
another component ships; either may be a FIFO (``open`` then blocks for ever, holding the
effect, its GPU and the agent's shutdown), a symlink to a host file, a device or a file of
gigabytes. :func:`read_regular_file` refuses each with a reason a message can quote.

A directory on the way may have been replaced too (a bundle's ``_pause`` made a symlink to a
directory elsewhere): :func:`open_directory` walks to a directory one component at a time,
each opened from its parent's descriptor with ``O_NOFOLLOW``, so a symlink anywhere on the
path is refused rather than followed, and the descriptor it returns keeps naming that
directory whatever is renamed afterwards (reads and writes then go through it).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence

__all__ = ["NotReadable", "open_directory", "read_regular_at", "read_regular_file"]

#: Never through a symlink, never blocking on a FIFO or a device.
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
#: A directory on the way: never through a symlink; O_PATH asks only for search permission.
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class NotReadable(Exception):
    """A file that is no regular file of bounded size, or a path to it through something
    other than real directories (the message says which)."""


def open_directory(start: int | str, names: Sequence[str]) -> int:
    """An ``O_PATH`` descriptor of the directory reached from ``start`` through ``names``.

    ``start`` is a directory descriptor, or a path opened as given (the caller's own: it
    may hold symlinks). Each of ``names`` must be a plain name of a real directory in the
    one before: a symlink, a FIFO or any other non-directory is :class:`NotReadable`
    (``'_pause' on its path is a symbolic link``), never followed nor opened. A missing
    component is the ``FileNotFoundError`` it is. The caller closes the descriptor.
    """
    fd = os.open(start, _DIR_FLAGS & ~os.O_NOFOLLOW) if isinstance(start, str) else os.dup(start)
    try:
        for name in names:
            _check_plain(name)
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise NotReadable(f"{name!r} on its path is {_kind_at(name, fd)}") from e
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_plain(name: str) -> None:
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise NotReadable(f"{name!r} on its path is not a plain directory name")


def read_regular_file(path: str, *, max_bytes: int, what: str) -> tuple[bytes, int]:
    """The bytes and permission bits of the regular file at ``path``; :class:`NotReadable`
    for a symlink, a FIFO, a device, a directory or a file over ``max_bytes``. ``what``
    names the file in the reason ("a bundle's config.json"). Other ``OSError``\\ s (missing,
    permission) are raised as they are."""
    return _read(path, None, max_bytes=max_bytes, what=what)


def read_regular_at(dir_fd: int, name: str, *, max_bytes: int, what: str) -> tuple[bytes, int]:
    """:func:`read_regular_file` of ``name`` in the directory ``dir_fd`` (an ``O_PATH``
    descriptor of :func:`open_directory` will do)."""
    return _read(name, dir_fd, max_bytes=max_bytes, what=what)


def _read(path: str, dir_fd: int | None, *, max_bytes: int, what: str) -> tuple[bytes, int]:
    try:
        fd = os.open(path, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotReadable(f"it is a symbolic link; {what} must be a file") from e
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotReadable(
                f"it is not a regular file ({_kind(st.st_mode)}); {what} must be a file"
            )
        if st.st_size > max_bytes:
            raise NotReadable(f"it is {st.st_size} bytes, over {max_bytes}")
        # One read of the whole file as fstat sizes it (one byte more shows the end); a
        # huge fixed buffer would cost an mmap and munmap of its own on every read.
        chunks = [os.read(fd, st.st_size + 1)]
        size = len(chunks[0])
        if size > st.st_size:  # it grew since fstat: read on to the end, bounded
            while size <= max_bytes and (chunk := os.read(fd, 1 << 16)):
                chunks.append(chunk)
                size += len(chunk)
            if size > max_bytes:
                raise NotReadable(f"it grew over {max_bytes} bytes while being read")
    finally:
        os.close(fd)
    return b"".join(chunks), stat.S_IMODE(st.st_mode)


def _kind_at(name: str, dir_fd: int) -> str:
    """What ``name`` in ``dir_fd`` is, for a message ("a symbolic link", "a FIFO")."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return "not a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return f"not a directory ({_kind(mode)})"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return name
    return "not a file"
