"""Reading a file an untrusted party may have replaced: never through a symlink, never
blocking, never unbounded.

A bundle's config.json comes from the image and a checkpoint's manifest from a directory
another component ships; either may be a FIFO (``open`` then blocks for ever, holding the
effect, its GPU and the agent's shutdown), a symlink to a host file, a device or a file of
gigabytes. :func:`read_regular_file` refuses each with a reason a message can quote.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["NotReadable", "read_regular_file"]

#: Never through a symlink, never blocking on a FIFO or a device.
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


class NotReadable(Exception):
    """A file that is no regular file of bounded size (the message says which)."""


def read_regular_file(path: str, *, max_bytes: int, what: str) -> tuple[bytes, int]:
    """The bytes and permission bits of the regular file at ``path``; :class:`NotReadable`
    for a symlink, a FIFO, a device, a directory or a file over ``max_bytes``. ``what``
    names the file in the reason ("a bundle's config.json"). Other ``OSError``\\ s (missing,
    permission) are raised as they are."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
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


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a file"
