"""The socket files the agent serves on (the JSON door and the worker API): one way to make
their directory, bind them private and remove them only while they are still ours."""

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
