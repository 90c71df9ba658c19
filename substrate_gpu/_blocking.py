"""Running a blocking step of an effect so that the effect can always be abandoned.

An effect is bounded by its timeout and the agent's shutdown by its drain timeout; a step
that blocks in the kernel (an ``open`` of a FIFO, a read from a hung NFS server) must not
hold either. anyio's ``to_thread.run_sync`` cannot give that: without
``abandon_on_cancel`` it shields the waiting task, so ``fail_after`` waits for the thread;
with it the task moves on, but anyio's worker threads are not daemon threads, and the
interpreter joins every one at exit, so a stuck one keeps the agent process alive after
SIGTERM. :func:`run_abandonable` runs the step in a daemon thread of its own: a cancelled
caller stops waiting at once, and the abandoned thread, should it ever return, reports to
no one and holds up no exit. A thread per step costs tens of microseconds, small beside the
file work of an injection (two fsyncs).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

_T = TypeVar("_T")


async def run_abandonable(func: Callable[[], _T], *, name: str) -> _T:
    """``func()`` in a daemon thread named ``name``; cancelling the caller abandons it."""
    token = anyio.lowlevel.current_token()
    done = anyio.Event()
    results: list[_T] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append(func())
        except BaseException as e:  # noqa: BLE001 (re-raised in the waiting task)
            errors.append(e)
        # The loop may be gone (an abandoned step that finished after the agent closed).
        with contextlib.suppress(Exception):
            anyio.from_thread.run_sync(done.set, token=token)

    threading.Thread(target=work, name=name, daemon=True).start()
    await done.wait()
    if errors:
        raise errors[0]
    return results[0]
