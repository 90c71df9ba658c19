"""A rootfs next to a decoy host tree, and tree snapshots (shared by the rootfs tests)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class World:
    """An actor rootfs and, beside it, a decoy host tree our writes must never touch."""

    root: Path
    host: Path

    def snapshot(self) -> dict[str, tuple[str, str]]:
        """Every entry under the host tree: kind and (for links) target or (for files) bytes."""
        return tree_snapshot(self.host)


def tree_snapshot(top: Path) -> dict[str, tuple[str, str]]:
    """Every entry under ``top`` (links not followed), with its kind and content."""
    entries: dict[str, tuple[str, str]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = str(path.relative_to(top))
            if path.is_symlink():
                entries[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                entries[rel] = ("dir", "")
            else:
                entries[rel] = ("file", path.read_bytes().hex())
    return entries
