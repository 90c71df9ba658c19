"""The socket files the agent serves on (the JSON door and the worker API): one way to make
their directory, bind them private, count their connections and remove them only while
they are still ours."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import structlog

from substrate_gpu import exceptions

log = structlog.get_logger(__name__)

_WRITABLE_BY_OTHERS: Final = stat.S_IWGRP | stat.S_IWOTH


def make_private_dir(path: Path, what: str, hint: str) -> None:
    """Create ``path``'s directory, private like the socket (systemd's
    RuntimeDirectoryMode=0700); an existing one is kept, but not writable by others.
    ``what`` names the socket and ``hint`` what to do instead, in the error.

    Whoever may write the directory may rename another socket over ours and answer our
    clients in our place. So group and others lose the write bit of an existing directory
    (with a warning; what they may read and search is kept: atelet may need to reach the
    socket), and a directory that cannot be fixed so is refused. A sticky directory (``/tmp``)
    is left as it is, with a warning: there only the socket's owner may rename or remove it.
    """
    directory = path.parent
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = stat.S_IMODE(directory.stat().st_mode)
    except OSError as e:
        raise exceptions.ConfigError(
            f"while creating the {what}'s directory {directory}: {e.strerror or e}; {hint}"
        ) from e
    if not mode & _WRITABLE_BY_OTHERS:
        return
    if mode & stat.S_ISVTX:
        log.warning(
            "socket directory writable by others, kept: it is sticky",
            socket=what,
            directory=str(directory),
            mode=f"{mode:04o}",
        )
        return
    fixed = mode & ~_WRITABLE_BY_OTHERS
    try:
        directory.chmod(fixed)
    except OSError as e:
        raise exceptions.ConfigError(
            f"while securing the {what}'s directory {directory}: it is writable by others "
            f"(mode {mode:04o}) and cannot be made {fixed:04o}: {e.strerror or e}; whoever "
            f"may write it may put another socket in the {what}'s place: run chmod go-w on "
            f"it, or {hint}"
        ) from e
    log.warning(
        "socket directory was writable by others: write removed",
        socket=what,
        directory=str(directory),
        mode=f"{mode:04o}",
        now=f"{fixed:04o}",
    )


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """While binding: the socket file is never reachable by others, not even briefly."""
    old = os.umask(0o177)
    try:
        yield
    finally:
        os.umask(old)


def unlink_if_ours(path: Path, ours: os.stat_result) -> None:
    """Remove the socket file only while it is still the one we bound (never another
    agent's that replaced it)."""
    with contextlib.suppress(OSError):
        now = path.stat()
        if (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino):
            path.unlink()


#: ``/proc/net/unix``'s ``St`` column of a connected socket (``SS_CONNECTED``).
_CONNECTED = "03"


def connections(path: Path, table: Path = Path("/proc/net/unix")) -> int:
    """The connections the server of the socket file ``path`` holds now (blocks: a file read).

    The kernel lists every Unix socket of this network namespace in ``table``; a socket the
    server accepted carries the listener's path and is connected (a client's own socket
    carries no path, a connection still in the backlog no inode). Raises ``OSError`` when
    the table cannot be read (no descriptor to spare, among others)."""
    name = str(path)
    count = 0
    with table.open(encoding="utf-8", errors="replace") as lines:
        next(lines, None)  # the header
        for line in lines:
            fields = line.rstrip("\n").split(maxsplit=7)
            if len(fields) == 8 and fields[7] == name and fields[5] == _CONNECTED:
                count += fields[6] != "0"
    return count
