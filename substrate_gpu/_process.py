"""Running external tools (nvidia-ctk, runsc, cuda-checkpoint, ldconfig) safely.

Design decisions, each guarding a failure mode seen in production:

- Every command starts in a **new session** (its own process group). On timeout or
  cancellation the whole group is killed with SIGKILL: anyio's ``run_process`` kills only
  the direct child, so a wrapper script (``nvidia-ctk`` is often a shell wrapper around
  ``nvidia-ctk.real``) would leave its grandchildren running.
- stdout and stderr go to anonymous temporary files, not pipes, and we wait for the
  *process* to exit, not for EOF: ``runsc create`` / ``runc create`` hand their stdio to
  the sandbox, which outlives the command; reading a pipe to EOF would hang until the
  sandbox exits.
- A successful command's process group is left alone: sandboxes started by ``create``
  must keep running.
- **A command can die with the agent** (``die_with_parent``, used for every runsc
  command): it runs under ``setpriv --pdeathsig KILL`` (util-linux), which sets
  ``PR_SET_PDEATHSIG`` and execs the tool, so a SIGKILL of the agent kills its in-flight
  ``runsc start``/``create``/``restore`` instead of letting it land after a restarted agent
  decided what the runtime holds. Only the command itself: what it forks (a
  sandbox, its gofer) is unaffected, as it must be. ``setpriv`` rather than a
  ``preexec_fn``: Python code between fork and exec can deadlock in a process with threads
  (the agent has them), and the pdeathsig survives the exec of a non-setuid binary. Without
  ``setpriv`` on PATH the command runs plainly (recovery still finds and kills a killed
  agent's stragglers: :meth:`substrate_gpu.runsc.driver.RunscDriver.reap_stragglers`).
  The parent is the *thread* that forked: commands are started from the event loop's
  thread, which lives as long as the agent.
- **No thread per command.** Python 3.11's asyncio waits for each child in a thread of its
  own (``ThreadedChildWatcher``: a thread started, and a hop back to the loop, per runsc
  command; on a saturated node each waits for a CPU). On Linux with ``pidfd_open`` the loop
  is given a ``PidfdChildWatcher`` instead (:func:`ensure_pidfd_child_watcher`): the
  child's exit is one more readable descriptor in the loop's epoll, as 3.12 does itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

import anyio

from substrate_gpu import exceptions

#: Output kept from a command in error messages, so a chatty tool cannot flood the logs.
MAX_OUTPUT_IN_ERROR = 4000


class CommandOutput(Protocol):
    """Where a command's stdout and stderr go instead of a file of ours (``run_command``)."""

    def fileno(self) -> int:
        """The descriptor the command writes to."""
        ...

    def drain(self) -> bytes:
        """What the command wrote, once it has ended."""
        ...


@dataclass(frozen=True)
class CommandResult:
    """What a finished command left behind."""

    argv: tuple[str, ...]
    """The argv that was run, as given."""
    returncode: int
    """The exit status (negative: killed by that signal)."""
    stdout: str
    """Everything the command wrote to stdout, decoded as UTF-8 with replacement."""
    stderr: str
    """Everything the command wrote to stderr, decoded as UTF-8 with replacement."""


#: ``setpriv`` arguments that make the command it execs get SIGKILL when its parent dies.
PDEATHSIG_ARGS = ("--pdeathsig", "KILL", "--")


@functools.cache
def setpriv() -> str | None:
    """The ``setpriv`` executable (util-linux), or None when this host has none."""
    return shutil.which("setpriv")


@functools.cache
def _pidfd_works() -> bool:
    """``pidfd_open`` is there and this kernel has it (Linux 5.3+)."""
    try:
        fd = os.pidfd_open(os.getpid())
    except (AttributeError, OSError):
        return False
    os.close(fd)
    return True


def ensure_pidfd_child_watcher() -> None:
    """Have asyncio wait for children through a pidfd in the loop that started each, instead
    of a thread per child (module doc), once per process; a no-op off asyncio, on Python
    3.12+ (which does so itself) and where pidfds do not work."""
    if sys.version_info >= (3, 12) or sys.platform != "linux":
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return  # not on asyncio (anyio's trio backend waits without threads)
    if isinstance(asyncio.get_child_watcher(), _PidfdWatcher) or not _pidfd_works():
        return
    asyncio.set_child_watcher(_PidfdWatcher())


if sys.version_info < (3, 12):

    class _PidfdWatcher(asyncio.AbstractChildWatcher):
        """3.12's ``PidfdChildWatcher``, for 3.11: each child's pidfd is read by the loop
        that started it (3.11's own is bound to one loop: a second event loop in the
        process, as in a test run, would find it inactive)."""

        def add_child_handler(
            self, pid: int, callback: Callable[..., object], *args: object
        ) -> None:
            loop = asyncio.get_running_loop()
            pidfd = os.pidfd_open(pid)
            loop.add_reader(pidfd, self._reap, loop, pid, pidfd, callback, args)

        @staticmethod
        def _reap(
            loop: asyncio.AbstractEventLoop,
            pid: int,
            pidfd: int,
            callback: Callable[..., object],
            args: tuple[object, ...],
        ) -> None:
            loop.remove_reader(pidfd)
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:
                returncode = 255  # reaped elsewhere: as asyncio's own watchers report it
            else:
                returncode = os.waitstatus_to_exitcode(status)
            os.close(pidfd)
            callback(pid, returncode, *args)

        def remove_child_handler(self, pid: int) -> bool:
            return True  # the reader goes with the child's exit (as 3.12's)

        def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
            pass

        def close(self) -> None:
            pass

        def is_active(self) -> bool:
            return True

        def __enter__(self) -> _PidfdWatcher:
            return self

        def __exit__(self, *exc: object) -> None:
            pass


def _executable(name: str, cwd: str | os.PathLike[str] | None) -> bool:
    """``name`` (a path, relative to ``cwd`` when given, or a name looked up on PATH) can be
    executed."""
    if os.sep in name:
        path = Path(cwd, name) if cwd is not None else Path(name)
        return path.is_file() and os.access(path, os.X_OK)
    return shutil.which(name) is not None


def _read_all(stream: IO[bytes]) -> str:
    stream.seek(0)
    return stream.read().decode("utf-8", errors="replace")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def tail(text: str, limit: int = MAX_OUTPUT_IN_ERROR) -> str:
    """The last ``limit`` characters of ``text``, stripped, marked when cut."""
    text = text.strip()
    return text if len(text) <= limit else "…" + text[-limit:]


async def run_command(
    argv: Sequence[str],
    *,
    timeout: float,
    what: str,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    check: bool = True,
    umask: int = -1,
    die_with_parent: bool = False,
    output: CommandOutput | None = None,
) -> CommandResult:
    """Run ``argv`` to completion within ``timeout`` seconds.

    ``what`` describes the operation for error messages ("generating the CDI spec for
    worker w1"). Raises :class:`~substrate_gpu.exceptions.ExternalCommandError` when the
    command cannot be started, times out (its whole process group is killed), or, with
    ``check``, exits non-zero. Cancellation of the caller kills the process group too.
    ``umask`` (when not negative) is the command's own, set in the child before it runs:
    this process's umask is untouched. ``die_with_parent``: the command is sent SIGKILL when
    this process dies (module doc); ``CommandResult.argv`` is still ``argv``.
    ``output``: the command's stdout and stderr go to
    its file descriptor instead (a pipe that outlives the command: a container's stdio), and
    what it wrote there is the result's ``stderr`` (``output.drain()``, called however the
    command ends).
    """
    args = tuple(str(a) for a in argv)
    spawned: tuple[str, ...] = args
    wrapper = setpriv() if die_with_parent else None
    if wrapper is not None:
        if not _executable(args[0], cwd):
            # What the exec would have said, not setpriv's exit status 127.
            raise exceptions.ExternalCommandError(
                f"while {what}: cannot start {args[0]}: No such file or directory "
                "(or not executable)",
                argv=args,
                returncode=None,
                stderr="",
            )
        spawned = (wrapper, *PDEATHSIG_ARGS, *args)
    with contextlib.ExitStack() as files:
        try:
            out = files.enter_context(tempfile.TemporaryFile(prefix="substrate-gpu-out-"))
            err = files.enter_context(tempfile.TemporaryFile(prefix="substrate-gpu-err-"))
        except OSError as e:
            # Out of descriptors (EMFILE) or a full temporary directory: this command
            # fails, clearly, like one that cannot start; nothing of the caller ends.
            raise exceptions.ExternalCommandError(
                f"while {what}: cannot start {args[0]}: no file for its output: {e.strerror or e}",
                argv=args,
                returncode=None,
                stderr="",
            ) from e
        ensure_pidfd_child_watcher()
        try:
            process = await anyio.open_process(
                list(spawned),
                stdin=subprocess.DEVNULL,
                stdout=out if output is None else output.fileno(),
                stderr=err if output is None else output.fileno(),
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
                umask=umask,
            )
        except OSError as e:
            raise exceptions.ExternalCommandError(
                f"while {what}: cannot start {args[0]}: {e.strerror or e}",
                argv=args,
                returncode=None,
                stderr="",
            ) from e

        timed_out = False
        try:
            with anyio.move_on_after(timeout) as scope:
                returncode = await process.wait()
            if scope.cancelled_caught:
                timed_out = True
        finally:
            # Reached on timeout and on cancellation (the caller's scope, Ctrl-C): never leave
            # the group behind. Shielded so the kill and reap happen even while cancelled.
            if process.returncode is None:
                _kill_group(process.pid)
                with anyio.CancelScope(shield=True):
                    await process.wait()
            await process.aclose()
            captured = output.drain() if output is not None else None

        stdout, stderr = _read_all(out), _read_all(err)
        if captured is not None:
            stderr = captured.decode("utf-8", errors="replace")

    if timed_out:
        raise exceptions.ExternalCommandError(
            f"while {what}: {args[0]} did not finish within {timeout:g}s and was killed "
            f"with its process group; stderr: {tail(stderr) or '(empty)'}",
            argv=args,
            returncode=None,
            stderr=stderr,
            timed_out=True,
        )
    if check and returncode != 0:
        raise exceptions.ExternalCommandError(
            f"while {what}: {args[0]} exited with status {returncode}; "
            f"stderr: {tail(stderr) or '(empty)'}",
            argv=args,
            returncode=returncode,
            stderr=stderr,
        )
    return CommandResult(argv=args, returncode=returncode, stdout=stdout, stderr=stderr)
