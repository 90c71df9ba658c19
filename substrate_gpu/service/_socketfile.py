"""The socket files the agent serves on (the JSON door and the worker API): one way to make
their directory, bind them private, count their connections and remove them only while
they are still ours."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from substrate_gpu import exceptions


def make_private_dir(path: Path, what: str, hint: str) -> None:
    """Create ``path``'s directory, private like the socket (systemd's
    RuntimeDirectoryMode=0700); an existing one is kept. ``what`` names the socket and
    ``hint`` what to do instead, in the error."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise exceptions.ConfigError(
            f"while creating the {what}'s directory {path.parent}: {e.strerror or e}; {hint}"
        ) from e


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
