"""Errors of the event log, all under :class:`~substrate_gpu.exceptions.SubstrateGpuError`."""

from __future__ import annotations

from pathlib import Path

from substrate_gpu import exceptions


class EventLogError(exceptions.SubstrateGpuError):
    """Reading, writing or replaying an event log failed; the message names the file."""


class EventLogLocked(EventLogError):
    """Another process holds the log's lock: two writers would both append ``seq`` N+1.

    ``holder`` is the pid the lock file names (None when it names none yet).
    """

    def __init__(self, path: Path, lock_path: Path, holder: int | None) -> None:
        self.path = path
        self.lock_path = lock_path
        self.holder = holder
        who = f"another process (pid {holder})" if holder else "another process"
        super().__init__(
            f"while locking event log {path}: {who} holds its lock {lock_path}; "
            "one agent per event log: stop the other agent or give this one another --event-log"
        )


class CorruptLogError(EventLogError):
    """A complete line of the log (or its snapshot) cannot be read.

    ``path`` and ``line`` (1-based; 0 for a snapshot file as a whole) say where, ``problem``
    what. A torn *last* line is not corruption: it is dropped and reported instead.
    """

    def __init__(self, path: Path, line: int, problem: str) -> None:
        self.path = path
        self.line = line
        self.problem = problem
        where = f"{path}:{line}" if line else str(path)
        super().__init__(
            f"corrupt event log {where}: {problem} (the log cannot be replayed past this "
            "point; restore it from a backup or move it aside to start afresh)"
        )


class ReplayDivergence(EventLogError):
    """Replaying a logged event did not reproduce what the agent did (another machine?)."""

    def __init__(self, path: Path, line: int, problem: str) -> None:
        self.path = path
        self.line = line
        self.problem = problem
        super().__init__(
            f"while replaying event log {path}:{line}: {problem} (was the log written with "
            "another version of machines/actor.yaml?)"
        )
