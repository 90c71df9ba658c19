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
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    output: CommandOutput | None = None,
) -> CommandResult:
    """Run ``argv`` to completion within ``timeout`` seconds.

    ``what`` describes the operation for error messages ("generating the CDI spec for
    worker w1"). Raises :class:`~substrate_gpu.exceptions.ExternalCommandError` when the
    command cannot be started, times out (its whole process group is killed), or, with
    ``check``, exits non-zero. Cancellation of the caller kills the process group too.
    ``umask`` (when not negative) is the command's own, set in the child before it runs:
    this process's umask is untouched. ``output``: the command's stdout and stderr go to
    its file descriptor instead (a pipe that outlives the command: a container's stdio), and
    what it wrote there is the result's ``stderr`` (``output.drain()``, called however the
    command ends).
    """
    args = tuple(str(a) for a in argv)
    with (
        tempfile.TemporaryFile(prefix="substrate-gpu-out-") as out,
        tempfile.TemporaryFile(prefix="substrate-gpu-err-") as err,
    ):
        try:
            process = await anyio.open_process(
                list(args),
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
