"""What a test run must not leave behind: processes, runc/runsc containers, mounts.

The suite starts real processes (agents, runc and runsc sandboxes, Prometheus, a
kube-apiserver) and mounts (runsc's ``--network=none`` netns, bind mounts); one forgotten
used to live on for good (issue 30 §9: a counting ``sh -c`` loop, PID 1 of its namespace,
~20 % of a core, after every run). This module finds them at the end of the run and fails
it: a pytest plugin (``tests/conftest.py`` registers it; ``-p support.leaks`` elsewhere)
whose session fixture, torn down after every other fixture, lists what is left, kills and
unmounts it (so the next run starts clean) and then fails, naming each thing and the test
directory it came from.

**What is this run's.** Other suites may run on the same machine at once, so nothing is
judged by name; a thing is this run's when it points at the run's base temp directory
(``tmp_path_factory.getbasetemp()``: per xdist worker, so each worker checks its own):

- a process that descends from this pytest process; or whose environment or command line
  names the base temp directory (the session sets :data:`MARKER` to it, and children keep
  it through any daemonising fork; runsc's sandbox and gofer carry ``--root=<dir>``); or
  whose root directory lies under it (a runc container's processes: their root is the
  bundle's rootfs, found through their mount table);
- a runc container (``state.json``) or a runsc one (``<id>_sandbox:<id>.state``) whose state
  lies under it and whose process is still alive;
- a mount whose mount point lies under it (in this mount namespace).

pytest keeps a running session's base temp directory (its lock file) from the clean-up of
other sessions, so the directory is there to compare against until the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

#: The environment variable the session sets to its base temp directory: every process a
#: test starts inherits it (unless given a whole new environment).
MARKER = "SUBSTRATE_GPU_TEST_RUN"

#: How long a leftover may take to go away by itself (a process being reaped, a SIGTERM
#: being acted on) before it counts; ``SUBSTRATE_GPU_LEAK_SETTLE`` overrides it.
SETTLE_SECONDS = float(os.environ.get("SUBSTRATE_GPU_LEAK_SETTLE", "10"))

#: ``multiprocessing`` helpers live as long as the process that started them: not leaks.
_OWN_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


@dataclass(frozen=True)
class Leak:
    """One thing left behind."""

    kind: str
    """``process``, ``container`` or ``mount``."""
    description: str
    """What it is and why it is this run's, for the failure message."""
    pids: tuple[int, ...] = ()
    """Processes to kill to clean it up."""
    mountpoint: str | None = None
    """The mount point to unmount to clean it up."""


@dataclass
class _Proc:
    pid: int
    ppid: int
    state: str
    start: int
    cmdline: str = field(repr=False)


def _octal_unescape(text: str) -> str:
    """mountinfo's escapes (``\\040`` for a space, …) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _mounts(pid: int | str = "self") -> list[tuple[str, str, str, str]]:
    """``(major:minor, root, mount point, fs type)`` of each mount ``pid`` sees, in order."""
    try:
        text = Path(f"/proc/{pid}/mountinfo").read_text()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        fields = line.split()
        dash = fields.index("-")
        found.append(
            (
                fields[2],
                _octal_unescape(fields[3]),
                _octal_unescape(fields[4]),
                fields[dash + 1],
            )
        )
    return found


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _processes() -> dict[int, _Proc]:
    found: dict[int, _Proc] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        rest = stat[stat.rindex(")") + 2 :].split()
        found[pid] = _Proc(
            pid=pid,
            ppid=int(rest[1]),
            state=rest[0],
            start=int(rest[19]),
            cmdline=cmdline.replace(b"\0", b" ").decode(errors="replace").strip(),
        )
    return found


def _root_in_our_namespace(pid: int, ours: list[tuple[str, str, str, str]]) -> str | None:
    """Where ``pid``'s root directory lies as seen from here, when it lives in another mount
    namespace (a container), else None: its ``/`` mount's filesystem and root, mapped
    through a mount of the same filesystem here."""
    try:
        if os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
            return None
    except OSError:
        return None
    tops = [(dev, root) for dev, root, point, _ in _mounts(pid) if point == "/"]
    if not tops:
        return None
    dev, root = tops[-1]
    root = root.removesuffix("//deleted")
    for our_dev, our_root, point, _ in ours:
        if our_dev == dev and _under(root, our_root):
            return os.path.normpath(os.path.join(point, os.path.relpath(root, our_root)))
    return None


def _names(pid: int, directory: str) -> str | None:
    """How ``pid``'s environment or command line names ``directory``, or None. The name must
    end there or go on below it (xdist's ``popen-gw1`` is not ``popen-gw10``)."""
    named = re.compile(re.escape(directory) + r"(?![^/\s:,;=])")
    for what in ("environ", "cmdline"):
        try:
            data = Path(f"/proc/{pid}/{what}").read_bytes()
        except OSError:
            continue
        for item in data.split(b"\0"):
            text = item.decode(errors="replace")
            if named.search(text):
                return f"its {what} names {text[:160]!r}"
    return None


def _alive(pid: int, start: int | None = None) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    rest = stat[stat.rindex(")") + 2 :].split()
    return rest[0] not in "ZX" and (start is None or int(rest[19]) == start)


def _walk_state_files(directory: Path, mountpoints: set[str]) -> Iterator[Path]:
    """runc's ``state.json`` and runsc's ``*.state`` under ``directory`` (not through mount
    points, links, or bundle rootfs trees, where no runtime keeps its state)."""
    stack = [directory]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name != "rootfs" and entry.path not in mountpoints:
                    stack.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False) and (
                entry.name == "state.json" or entry.name.endswith(".state")
            ):
                yield Path(entry.path)


def _containers(directory: Path, mountpoints: set[str]) -> list[Leak]:
    found = []
    for path in _walk_state_files(directory, mountpoints):
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(state, dict):
            continue
        where = path.relative_to(directory)
        if "init_process_pid" in state:  # runc: <root>/<id>/state.json
            pid, start = int(state["init_process_pid"]), state.get("init_process_start")
            if _alive(pid, int(start) if start is not None else None):
                found.append(
                    Leak(
                        "container",
                        f"runc container {state.get('id')!r} ({where}): init pid {pid} alive",
                        pids=(pid,),
                    )
                )
        elif isinstance(state.get("sandbox"), dict) and "pid" in state["sandbox"]:
            pids = tuple(
                p
                for p in (int(state["sandbox"]["pid"] or 0), int(state.get("goferPid") or 0))
                if p > 0 and _alive(p) and _under_any(_cmdline(p), str(directory))
            )
            if pids:
                found.append(
                    Leak(
                        "container",
                        f"runsc container {state.get('id')!r} ({where}, "
                        f"{state.get('status')}): pids {list(pids)} alive",
                        pids=pids,
                    )
                )
    return found


def _under_any(cmdline: str, directory: str) -> bool:
    """Whether a word of ``cmdline`` (or its value after ``=``) lies under ``directory``."""
    return any(_under(word.rpartition("=")[2], directory) for word in cmdline.split())


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, UnicodeDecodeError):
        return ""


def find(directory: Path, me: int | None = None) -> list[Leak]:
    """Everything this run left behind: processes, containers and mounts that are
    ``directory``'s (the run's base temp directory) or ``me``'s (this process)."""
    me = os.getpid() if me is None else me
    base = str(directory)
    ours = _mounts()
    mountpoints = {point for _, _, point, _ in ours if _under(point, base)}
    leaks = _containers(directory, mountpoints)
    table = _processes()
    ancestors = {me}
    parent = table[me].ppid if me in table else 0
    while parent in table and parent not in ancestors:
        ancestors.add(parent)
        parent = table[parent].ppid
    for proc in table.values():
        if proc.pid in ancestors or proc.state in "ZX" or not proc.cmdline:
            continue
        if any(helper in proc.cmdline for helper in _OWN_HELPERS):
            continue
        why = None
        up, seen = proc.ppid, set()
        while up in table and up not in seen:
            if up == me:
                why = "a descendant of this pytest process"
                break
            seen.add(up)
            up = table[up].ppid
        why = why or _names(proc.pid, base)
        if why is None:
            root = _root_in_our_namespace(proc.pid, ours)
            if root is not None and _under(root, base):
                why = f"its root is {os.path.relpath(root, base)}"
        if why is not None:
            leaks.append(
                Leak("process", f"pid {proc.pid} {proc.cmdline[:200]!r}: {why}", (proc.pid,))
            )
    # Deepest first, so a mount under another comes off before it.
    for point in sorted(mountpoints, key=len, reverse=True):
        kind = next(t for _, _, p, t in reversed(ours) if p == point)
        leaks.append(
            Leak("mount", f"{kind} mount on {os.path.relpath(point, base)}", mountpoint=point)
        )
    return leaks


def clean(leaks: list[Leak]) -> None:
    """Kill the processes and unmount the mounts of ``leaks`` (SIGKILL: a container's init
    ignores every other signal from outside its namespace)."""
    for pid in {pid for leak in leaks for pid in leak.pids}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for leak in leaks:
        # Stacked mounts (runsc mounts its netns once per sandbox under one root): all of them.
        for _ in range(64):
            if leak.mountpoint is None or not os.path.ismount(leak.mountpoint):
                break
            subprocess.run(["umount", "-l", leak.mountpoint], capture_output=True, check=False)
    deadline = time.monotonic() + 5
    while any(_alive(p) for leak in leaks for p in leak.pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def settled(directory: Path, timeout: float = SETTLE_SECONDS) -> list[Leak]:
    """:func:`find`, again until it finds nothing or ``timeout`` has passed."""
    deadline = time.monotonic() + timeout
    while (leaks := find(directory)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return leaks


def report(leaks: list[Leak], directory: Path) -> str:
    lines = [f"  {leak.kind}: {leak.description}" for leak in leaks]
    return (
        f"the tests left {len(leaks)} thing(s) behind under {directory} (killed and unmounted "
        "now; the path names the test directory that made each):\n" + "\n".join(lines)
    )


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fails the run (an error at its last test) when its tests left a process, a container
    or a mount behind; set up before, so torn down after, every other session fixture."""
    directory = tmp_path_factory.getbasetemp()
    os.environ[MARKER] = str(directory)
    yield
    leaks = settled(directory)
    if leaks:
        clean(leaks)
        pytest.fail(report(leaks, directory), pytrace=False)
