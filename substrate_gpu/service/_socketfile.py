"""The socket files the agent serves on (the JSON door and the worker API): one way to make
their directory, bind them private, count their connections and remove them only while
they are still ours."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from substrate_gpu import exceptions
from substrate_gpu._log import get_logger

log = get_logger(__name__)

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


#: ``/proc/net/unix``'s ``St`` column: a connected socket, one still being connected.
_CONNECTED, _CONNECTING = b"03", b"02"


@dataclass(frozen=True)
class Connections:
    """The connections of one listening socket, as the kernel lists them."""

    held: int
    """Accepted by the server and open."""
    waiting: int
    """In the listener's backlog: connected by their client, not accepted yet."""


UNIX_SOCKETS: Final = Path("/proc/net/unix")
"""The kernel's table of this network namespace's Unix sockets."""


def connections(path: Path, table: Path = UNIX_SOCKETS) -> Connections:
    """The connections of the server of the socket file ``path`` now (blocks: a file read;
    ``OSError`` when the table cannot be opened, EMFILE among others)."""
    with table.open("rb") as opened:
        return read_connections(opened, path)


def read_connections(table: BinaryIO, path: Path) -> Connections:
    """:func:`connections` from ``table`` kept open (read again from its start: a reader
    that holds it needs no descriptor to count, even when the process has none to spare).

    The kernel lists every Unix socket: a socket the server accepted carries the listener's
    path, is connected and has an inode; one still in the backlog carries the path too,
    connecting, with no inode yet (a client's own socket carries no path)."""
    table.seek(0)
    name = os.fsencode(path)
    held = waiting = 0
    for line in table.read().splitlines()[1:]:  # after the header
        fields = line.split(maxsplit=7)
        if len(fields) != 8 or fields[7] != name:
            continue
        state, inode = fields[5], fields[6]
        if state == _CONNECTED and inode != b"0":
            held += 1
        elif state == _CONNECTING and inode == b"0":
            waiting += 1
    return Connections(held, waiting)
