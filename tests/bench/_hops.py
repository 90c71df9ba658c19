"""Counting an agent's thread hops, fsyncs and runsc commands per worker call (imported by
bench_worker_api.py's ``--hops``; not a benchmark itself).

On a saturated machine each hop from the event loop to a thread (and back) waits for a CPU,
so a call's count of them is its exposure to load, which wall time on a shared 2-core VM
measures only through noise. The agent runs as a real process started through :func:`argv`:
before the CLI starts, :func:`install` wraps

- ``anyio.to_thread.run_sync`` and ``substrate_gpu._blocking.run_abandonable`` (every thread
  hop the agent makes: both are looked up through their module at each call);
- ``os.fsync`` and ``os.fdatasync`` (in whichever thread they run);
- the event log's flush (one batch: its records written, one fdatasync of the log, one of
  its seq mark) and each wait for a batch (a task that waits until its records are durable);
- ``substrate_gpu._process.run_command`` (each runsc command);
- ``threading.Thread.start`` (a thread started: each blocking step's own, asyncio's
  waiter for a child process, a log pipe's);

and notes each one with its wall-clock time. At exit the notes are written as JSON lines; the
benchmark buckets them by the times at which its calls began and ended (one clock: both
processes read ``time.time()``).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

#: What is counted, in the order it is printed.
KINDS = (
    "thread hops",
    "threads started",
    "fsyncs",
    "log records",
    "log batches",
    "log waits",
    "runsc commands",
)


def argv(notes: Path, cli: Sequence[str]) -> list[str]:
    """The command line of ``python -m substrate_gpu CLI…`` with the counters installed."""
    here = str(Path(__file__).resolve().parent)
    return [
        sys.executable,
        "-c",
        (
            "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); import _hops; "
            "_hops.install(sys.argv.pop(1)); sys.argv[0] = 'substrate_gpu'; "
            "runpy.run_module('substrate_gpu', run_name='__main__', alter_sys=True)"
        ),
        here,
        str(notes),
        *cli,
    ]


#: ``python -c`` of an agent profiled in windows: each SIGUSR1 starts a cProfile of the event
#: loop's thread, the next one stops it and writes ``<out>.<n>`` (n = 0, 1, ...).
_PROFILED = """
import cProfile, itertools, signal, sys, runpy
out = sys.argv.pop(1)
on = [None]
n = itertools.count()
def toggle(*_):
    if on[0] is None:
        on[0] = cProfile.Profile()
        on[0].enable()
    else:
        on[0].disable()
        on[0].dump_stats(f"{out}.{next(n)}")
        on[0] = None
signal.signal(signal.SIGUSR1, toggle)
sys.argv[0] = "substrate_gpu"
runpy.run_module("substrate_gpu", run_name="__main__", alter_sys=True)
"""


def profiled_argv(out: Path, cli: Sequence[str]) -> list[str]:
    """``python -m substrate_gpu CLI…``, profiled between pairs of SIGUSR1 (``_PROFILED``)."""
    return [sys.executable, "-c", _PROFILED, str(out), *cli]


def python_calls(out: Path, window: int) -> int:
    """The Python calls the event loop's thread made in profile window ``window``."""
    import pstats

    return int(pstats.Stats(f"{out}.{window}").total_calls)  # type: ignore[attr-defined]


def install(notes_path: str) -> None:
    """Wrap what is counted (module doc); write the notes at exit."""
    import anyio.to_thread

    from substrate_gpu import _blocking, _process
    from substrate_gpu.eventlog import writer

    notes: list[tuple[float, str, str]] = []

    def note(kind: str, what: str) -> None:
        notes.append((time.time(), kind, what))  # list.append: atomic under the GIL

    def named(func: Callable[..., Any]) -> str:
        inner = func.func if isinstance(func, functools.partial) else func
        return getattr(inner, "__qualname__", repr(inner))

    to_thread = anyio.to_thread.run_sync

    async def run_sync(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        note("thread hops", named(func))
        return await to_thread(func, *args, **kwargs)

    anyio.to_thread.run_sync = run_sync  # type: ignore[assignment]

    abandonable = _blocking.run_abandonable

    async def run_abandonable(func: Callable[[], Any], *, name: str) -> Any:
        note("thread hops", name)
        return await abandonable(func, name=name)

    _blocking.run_abandonable = run_abandonable  # type: ignore[assignment]

    for sync in ("fsync", "fdatasync"):
        original = getattr(os, sync)

        def synced(fd: int, _original: Callable[[int], None] = original, _n: str = sync) -> None:
            note("fsyncs", _n)
            _original(fd)

        setattr(os, sync, synced)

    until_durable = writer.EventLog._until_durable

    async def waited(self: writer.EventLog, batch: Any) -> None:
        note("log waits", "")
        await until_durable(self, batch)

    writer.EventLog._until_durable = waited  # type: ignore[method-assign]

    append = writer.EventLog._append

    def appended(self: writer.EventLog, data: bytes, last_seq: int) -> None:
        note("log batches", f"{len(data.splitlines())} line(s)")
        for line in data.splitlines():
            note("log records", json.loads(line).get("type", "?"))
        append(self, data, last_seq)

    appended.__qualname__ = "EventLog._append"
    writer.EventLog._append = appended  # type: ignore[method-assign]

    start = threading.Thread.start

    def started(self: threading.Thread) -> None:
        note("threads started", self.name.rstrip("0123456789-"))
        start(self)

    threading.Thread.start = started  # type: ignore[method-assign]

    command = _process.run_command

    async def run_command(args: Sequence[str], **kwargs: Any) -> Any:
        verbs = [a for a in args[1:] if not a.startswith("-") and "/" not in a]
        note("runsc commands", verbs[0] if verbs else args[0])
        return await command(args, **kwargs)

    _process.run_command = run_command  # type: ignore[assignment]

    def dump() -> None:
        with open(notes_path, "w") as out:
            out.writelines(json.dumps({"at": a, "kind": k, "what": w}) + "\n" for a, k, w in notes)

    atexit.register(dump)


def read(notes: Path) -> list[dict[str, Any]]:
    """The notes an agent wrote at exit."""
    return [json.loads(line) for line in notes.read_text().splitlines()]


def count(
    notes: Iterable[dict[str, Any]], start: float, end: float
) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    """Per kind, and per (kind, what), the notes taken from ``start`` to ``end``."""
    kinds: Counter[str] = Counter()
    detail: Counter[tuple[str, str]] = Counter()
    for n in notes:
        if start <= n["at"] <= end:
            kinds[n["kind"]] += 1
            detail[(n["kind"], n["what"])] += 1
    return kinds, detail
