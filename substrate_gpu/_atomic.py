"""Crash-safe file replacement: a reader sees the old file or the new one, never a torn one.

Write to a temporary file in the same directory, fsync it, rename it over the target, then
fsync the directory so the rename itself survives a power loss. The original file's mode
is kept (runc and runsc read config.json; a 0600 temp file must not tighten it silently).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes, *, default_mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically, keeping the existing file's mode.

    Raises ``OSError`` on failure; the target is then untouched and no temp file is left.
    """
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = default_mode
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
