"""The plumbing of one worker API call: its errors as gRPC statuses (:class:`CallError`),
where it gives events to the agent (:class:`Door`), the per-UID lock (:class:`UidLocks`),
a Run or Restore in flight (:class:`Call`), and which runsc a request names
(:class:`RunscBinary`). The calls themselves are :mod:`.worker_api`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import anyio
import grpc

from substrate_gpu import exceptions
from substrate_gpu.lifecycle import Agent, events, hooks
from substrate_gpu.service import protocol, worker_requests
from substrate_gpu.service.ateworker import ateworker_pb2 as pb


class Door(Protocol):
    """Where events are offered: the agent's ``AgentService`` (the JSON door's too)."""

    @property
    def agent(self) -> Agent:
        """The agent."""
        ...

    async def offer(self, event: events.Event) -> hooks.Transition | protocol.RequestError:
        """Offer ``event``: its transition, or why it was not accepted."""
        ...

    async def offer_all(
        self, group: Sequence[events.Event]
    ) -> list[hooks.Transition] | protocol.RequestError:
        """Offer ``group`` in order, durable together: the transitions, or why one was not
        accepted (those before it stay accepted)."""
        ...

    async def durable(self) -> protocol.RequestError | None:
        """Wait until every accepted event is durable; why not, once the log failed."""
        ...

    def reject(self, error: protocol.RequestError, line_number: int) -> bytes:
        """Count and log a refusal."""
        ...


LifecycleRequest = (
    pb.RunWorkloadRequest
    | pb.RestoreWorkloadRequest
    | pb.CheckpointWorkloadRequest
    | pb.TerminateWorkloadRequest
)


class CallError(exceptions.SubstrateGpuError):
    """A call answered with a gRPC status other than OK."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class UidLocks:
    """One lock per actor UID for the lifecycle calls (upstream's per-actor lock): a Run and
    a Terminate of one UID never interleave. Entries go when nobody holds or waits."""

    locks: dict[str, tuple[anyio.Lock, int]] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def held(self, uid: str) -> AsyncIterator[None]:
        lock, users = self.locks.get(uid, (anyio.Lock(), 0))
        self.locks[uid] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self.locks[uid]
            if users == 1:
                del self.locks[uid]
            else:
                self.locks[uid] = (lock, users - 1)


@dataclass(eq=False)
class Call:
    """A Run or Restore in flight (upstream's ``actorlock.InFlight`` entry, per UID)."""

    uid: str
    name: str
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    """The call's work; cancelled when its caller abandons it (or on :meth:`abandon`)."""
    made: str | None = None
    """The activation this call registered (set before its ``actor_registered`` is
    submitted): what an abandoned call deletes, and nothing else of the UID."""
    abandoned: bool = False

    def abandon(self) -> None:
        """Stop the call at the step it is in and undo what it made."""
        self.abandoned = True
        self.scope.cancel()

    def was_abandoned(self) -> bool:
        """Whether :meth:`abandon` was called (read again after each await)."""
        return self.abandoned


class RunscBinary:
    """Whether a request's ``runsc_path`` is the binary this agent runs by default.

    A ``runsc_path`` that is the agent's own ``--runsc`` (the same file, or a file with the
    same bytes: atelet stages runsc content-addressed, so a copy of our binary under its
    static-files directory is ours) runs the agent's runtime as it is; any other must be a
    binary atelet staged (``worker_requests.check_runsc_path``) and the sandbox runs that one.
    """

    def __init__(self, runsc: str) -> None:
        self.configured = runsc
        found = shutil.which(runsc)
        self.path = Path(found).resolve() if found else None
        self._digests: dict[tuple[int, int, int, int], str] = {}

    def check(self, runsc_path: str) -> None:
        """Raise :class:`CallError` unless ``runsc_path`` is our binary; empty is
        :class:`~.worker_requests.BadRequest`, as upstream's ``ValidateRuntimeAssetPath``."""
        if not runsc_path:
            raise worker_requests.BadRequest("runsc_path: Required value")
        candidate = Path(runsc_path)
        if not candidate.is_absolute() or not candidate.is_file():
            raise CallError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"runsc_path {runsc_path!r} is not an absolute path to a file",
            )
        if self.path is None:
            raise CallError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this agent's runsc ({self.configured!r}, --runsc) is not found, so "
                f"runsc_path {runsc_path!r} cannot be checked against it",
            )
        if candidate.resolve() == self.path or self._digest(candidate) == self._digest(self.path):
            return
        raise CallError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"runsc_path {runsc_path!r} is not the runsc this agent runs every sandbox with "
            f"({self.path}, --runsc): one agent runs one runsc; start it with "
            f"--runsc {runsc_path}",
        )

    def is_ours(self, runsc_path: str) -> bool:
        """Whether ``runsc_path`` names the agent's own runsc (same file or same bytes)."""
        candidate = Path(runsc_path)
        if self.path is None or not candidate.is_absolute() or not candidate.is_file():
            return False
        if os.path.normpath(runsc_path) != runsc_path:
            return False  # '..' or '.': checked (and refused) as a staged path
        if runsc_path != self.configured and os.path.realpath(runsc_path) != runsc_path:
            return False  # through a symbolic link: likewise
        return candidate.resolve() == self.path or self._digest(candidate) == self._digest(
            self.path
        )

    def _digest(self, path: Path) -> str:
        info = path.stat()
        key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        if key not in self._digests:
            with path.open("rb") as f:
                self._digests[key] = hashlib.file_digest(f, "sha256").hexdigest()
        return self._digests[key]


def refusal_code(error: protocol.RequestError) -> grpc.StatusCode:
    """The status of a call whose event the door refused, by the kind of refusal."""
    if error.kind == "unavailable":
        return grpc.StatusCode.UNAVAILABLE
    if error.kind in {"schema", "malformed"}:
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.FAILED_PRECONDITION
