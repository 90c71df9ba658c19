"""A process umask for the length of a ``with`` block (tests of file modes)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """This process's umask is ``mask`` inside, what it was after."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def current() -> int:
    """This process's umask (read by setting it and back: there is no getter)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
