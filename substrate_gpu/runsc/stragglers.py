"""A killed agent's runsc commands that still run: found under its runsc root, and killed.

Every runsc command the agent starts dies with it (``PR_SET_PDEATHSIG``, see
:mod:`substrate_gpu._process`), but not where ``setpriv`` is missing, nor when the agent
died between the fork and the ``prctl``. Such a straggler would land later: a ``runsc
start side`` of a sandbox recovery just found half-started, a ``runsc create`` of one it
just deleted. So recovery first kills every runsc *command* whose ``--root`` is the agent's
root or an actor's root under it, and waits until each is gone; only then does it ask what
the runtime holds.

A command is told from a sandbox by its subcommand: runsc's sandbox and gofer processes
(``runsc-sandbox … boot``, ``runsc-gofer … gofer``) are the containers themselves and are
never touched; ``create``, ``start``, ``restore``, ``checkpoint``, ``delete``, ``state``,
``exec``, ``kill`` and friends are commands. Each command runs in a session of its own, so
its process group (the runsc stand-in's ``runc`` child, a wrapper's grandchildren) is
killed with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

#: runsc subcommands that act on containers from outside (the commands the agent runs).
COMMANDS: Final = frozenset(
    {
        "checkpoint",
        "create",
        "delete",
        "events",
        "exec",
        "kill",
        "list",
        "pause",
        "ps",
        "restore",
        "resume",
        "run",
        "start",
        "state",
        "wait",
    }
)
#: Subcommands of the processes that *are* a sandbox: never stragglers.
_SANDBOX_PROCESSES: Final = frozenset({"boot", "gofer"})


def _root_of(argv: Sequence[str]) -> str | None:
    """The value of ``--root``/``-root`` (``--root R`` or ``--root=R``), if any."""
    for i, arg in enumerate(argv):
        for flag in ("--root", "-root"):
            if arg == flag and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(flag + "="):
                return arg[len(flag) + 1 :]
    return None


def _under(path: str, root: Path) -> bool:
    candidate = Path(os.path.normpath(path))
    return candidate == root or root in candidate.parents


def is_straggler(argv: Sequence[str], root: Path) -> bool:
    """``argv`` is a runsc command (not a sandbox or gofer) rooted at ``root`` or under it.

    Pure: ``argv`` is a process's command line (``/proc/<pid>/cmdline``); an interpreter
    running a runsc script, or ``setpriv`` about to exec one, still reads as one.
    """
    value = _root_of(argv)
    if value is None or not _under(value, Path(os.path.normpath(root))):
        return False
    for arg in argv[1:]:
        if arg in _SANDBOX_PROCESSES:
            return False
        if arg in COMMANDS:
            return True
    return False


def _cmdlines() -> Iterator[tuple[int, list[str]]]:
    me = os.getpid()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                raw = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile, or not ours to read
            if raw:
                yield int(entry.name), raw.rstrip(b"\0").decode(errors="replace").split("\0")


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a dead straggler whose reaper is slow)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state follows the parenthesised command name, which may itself hold ") ".
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def find(root: Path) -> tuple[int, ...]:
    """The pids of every runsc command under ``root`` (module doc)."""
    return tuple(pid for pid, argv in _cmdlines() if is_straggler(argv, root))


def kill(pids: Sequence[int], *, timeout: float) -> tuple[int, ...]:
    """SIGKILL each of ``pids`` (its process group when it leads one) and wait up to
    ``timeout`` seconds until all are gone; the pids still alive then (blocking)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in left if _alive(p)]
    return tuple(left)
