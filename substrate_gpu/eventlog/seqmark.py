"""The event log's seq high-water mark: ``<log>.seq``, durable outside the log's last line.

A log's last line says the last seq written, unless the file lost its tail (a disk or a
copy cut it, an operator truncated it): then the seqs of the lost lines would be handed out
again, and an acknowledged ``seq`` would name two different events. So the writer keeps the
highest seq it ever made durable in a file of its own, updated after each batch's fsync and
before any of the batch is acknowledged: every acknowledged seq is at most the mark. On
open, seqs above the log's last line and up to the mark are known gone (and possibly
acknowledged), and new events are numbered after the mark.

The file is one fixed-width decimal line (21 bytes) rewritten in place at offset 0 and
``fdatasync``-ed: a write that small never straddles a sector, so it lands whole, at the cost
of one small fsync per batch (a rename would cost a directory fsync too). It is created
atomically when absent (a log written before the mark existed: its last line is all there
is to know).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from substrate_gpu import _atomic
from substrate_gpu.eventlog import errors

_WIDTH: Final = 20
"""Digits of the mark (a seq is at most 2**63 - 1: 19 digits)."""


def path_of(log: Path) -> Path:
    """Where ``log``'s mark lives (beside it: rotation replaces the log's file, not this)."""
    return log.with_name(log.name + ".seq")


def read(log: Path) -> int:
    """``log``'s mark; 0 when it has none yet. A mark that is not one is an error."""
    path = path_of(log)
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise errors.EventLogError(
            f"while reading the seq mark {path} of event log {log}: {e.strerror or e}"
        ) from e
    if len(text) != _WIDTH + 1 or not text[:_WIDTH].isdigit() or text[_WIDTH:] != b"\n":
        raise errors.EventLogError(
            f"the seq mark {path} of event log {log} is damaged ({text[:40]!r}): it must hold "
            f"the highest seq logged, {_WIDTH} digits; write the highest seq you know was "
            "acknowledged (at least the log's last) into it, or remove it to trust the log alone"
        )
    return int(text[:_WIDTH])


def encode(seq: int) -> bytes:
    """The mark's bytes for ``seq``."""
    return f"{seq:0{_WIDTH}d}\n".encode()


def open_for_update(log: Path, seq: int) -> int:
    """Write ``seq`` as ``log``'s mark (atomically) and return a descriptor to update it."""
    path = path_of(log)
    _atomic.write_atomically(path, encode(seq), default_mode=0o600)
    return os.open(path, os.O_WRONLY | os.O_CLOEXEC)


def update(fd: int, seq: int) -> None:
    """Make ``seq`` the mark, durably (the fixed-width line rewritten in place)."""
    os.pwrite(fd, encode(seq), 0)
    os.fdatasync(fd)
