"""Argument types shared by subcommands."""

from __future__ import annotations

from pathlib import Path

__all__ = ["absolute_path"]


def absolute_path(text: str) -> Path:
    """A path option taken from the current directory now (``--toolkit-dir toolkit``): it
    ends up where only an absolute path is valid (a hook's ``path`` in config.json), and
    messages then name the directory that was actually used."""
    return Path(text).absolute()
