"""The event log writer: durable before acted on, with group commit and rotation.

:class:`EventLog` implements the lifecycle's ``EventRecorder`` (and the pipeline's optional
``RejectionRecorder``). ``record(event)`` returns once the event's line is written **and
fsynced**; the agent awaits it before the event's effect starts.

**Group commit, without a background task.** ``record`` appends the line to the open batch
synchronously (before its first await, so the log order is the order the machine applied
events), then waits for the batch to be durable. If no flush is running, the recorder
becomes the *leader*: it lingers while more records keep arriving (at most ``max_delay``
seconds, or until ``max_batch`` are waiting; a lone recorder does not wait at all), takes
the batch, and writes and ``fdatasync``-s it in a worker thread. Records arriving during
the fsync form the next batch; when the flush ends, one of their recorders leads the next.
The flush is shielded from cancellation: a batch is written whole or the log is failed.

**Appending without waiting.** ``record`` is ``append`` (synchronous: the event takes its
place in the order) then ``durable`` (wait until everything appended so far is fsynced, as
the leader of a batch or with one). A caller may append several events and wait once (the
agent's group of a registration and its first request: one fsync), or append an outcome and
leave it to the next wait (an outcome recovery re-derives from the runtime; the rule is in
docs/event-log.md, "When an event is durable"). ``aclose`` makes what was appended durable
before closing.
Any write error fails the log for good (memory and log would disagree); every later
``record`` raises :class:`EventLogError`, which stops the agent.

**Rotation.** When the segment exceeds ``rotate_bytes`` after a flush, the leader (between
batches, so no line is half-way) compacts the log:

1. write ``<log>.snapshot-<S>.json`` atomically: every live actor at the last durable seq
   ``S`` (temp file, fsync, rename, fsync dir);
2. atomically replace the log with a new segment whose header names that snapshot
   (``base_seq`` S) and whose tail is empty: every event up to S is in the snapshot;
3. remove older snapshots.

A crash anywhere leaves a readable log: before 2 the old segment (and the snapshot it names)
is intact and the new snapshot is an unreferenced file; after 2 the new segment and its
snapshot are complete. :meth:`EventLog.open` removes unreferenced snapshots and temp files.
To snapshot, the log keeps its own copy of every actor's state (the agent's machine, fed
each batch as it is written), so rotation never reads the log back.

**The path still names the file.** Appending to an open descriptor succeeds even when the
log's file was unlinked (its directory removed) or another file was renamed over it; the
events would be gone at the next start. After each batch's fsync the writer compares the
path's ``st_dev``/``st_ino`` with the open descriptor's (one ``stat`` per batch), and fails
the log before any recorder of that batch is acknowledged.

**One writer per log.** :func:`lock` takes an exclusive ``flock`` on ``<log>.lock`` (beside
the log, not on the log itself: rotation replaces the log's file, and a lock on the old one
would no longer exclude anyone) and writes the holder's pid into it. The agent holds it for
its lifetime, from before recovery reads the log. The lock file is never removed: removing
it would let a third process lock a fresh file while the second still waits on the old one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Final, Protocol, Self

import anyio
import anyio.lowlevel
import anyio.to_thread

from substrate_gpu import _atomic
from substrate_gpu._log import get_logger
from substrate_gpu.eventlog import errors, format, reader, replayer, seqmark, snapshot
from substrate_gpu.lifecycle import codec, events, machine

_log = get_logger(__name__)


class AppendMetrics(Protocol):
    """Where the log reports each durable write (``AgentMetrics`` implements it)."""

    def event_log_append(self, seconds: float, batch_size: int) -> None:
        """One fsync made ``batch_size`` records durable ``seconds`` after the first append."""
        ...


@dataclass
class _Batch:
    lines: list[bytes] = field(default_factory=list)
    events: list[events.Event] = field(default_factory=list)
    first: float = 0.0
    last_seq: int = 0
    done: bool = False
    error: BaseException | None = None


class EventLog:
    """An append-only, fsynced, rotating event log (see the module doc).

    Open it with ``await EventLog.open(path)`` (or ``async with await EventLog.open(...)``),
    pass it to ``Agent(recorder=...)``, ``await log.aclose()`` at the end.
    """

    def __init__(
        self,
        path: Path,
        contents: reader.LogContents,
        *,
        max_batch: int,
        max_delay: float,
        metrics: AppendMetrics | None,
        rotate_bytes: int | None,
        tracker: replayer.Replayer | None,
        high_water: int,
        mark_fd: int,
    ) -> None:
        """Use :meth:`open` (``tracker``: the machine copy fed for snapshots, or None;
        ``high_water``: the seq mark's value, ``mark_fd`` its descriptor)."""
        self.path = path
        """The active segment."""
        self.last_seq = high_water
        """The seq of the last durable event (after :meth:`open`: the highest ever logged,
        which the log's last line may have lost: :mod:`.seqmark`)."""
        self.torn_tail = contents.torn_tail
        """The torn last line :meth:`open` dropped, if any."""
        self.rotations = 0
        """Segments rotated by this writer."""
        self._max_batch = max_batch
        self._max_delay = max_delay
        self._metrics = metrics
        self._rotate_bytes = rotate_bytes
        self._queued_seq = high_water
        self._size = contents.valid_bytes
        self._mark_fd: int | None = mark_fd
        self._fd: int | None = _open_for_append(path)
        self._open_batch = _Batch()
        self._in_flight: _Batch | None = None
        """The batch being written and fsynced, if any."""
        self._flushing = False
        self._flushed = anyio.Event()
        self._failed: BaseException | None = None
        self._closed = False
        self._replayer = tracker
        self._rotate_not_before = 0.0

    # --- opening -------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        max_batch: int = 1024,
        max_delay: float = 0.002,
        metrics: AppendMetrics | None = None,
        rotate_bytes: int | None = 64 << 20,
        machine_spec: machine.MachineSpec | None = None,
    ) -> EventLog:
        """Open (or create) the log at ``path`` for appending.

        An existing log is read whole and checked (a corrupt line raises
        :class:`CorruptLogError`); a torn last line is reported (:attr:`torn_tail`, and a
        warning) and truncated away before anything is appended. ``rotate_bytes`` None
        disables rotation; ``machine_spec`` must be the agent's when it is not the default.
        """
        if max_batch < 1 or max_delay < 0:
            raise ValueError("max_batch must be at least 1 and max_delay not negative")
        try:
            contents = await anyio.to_thread.run_sync(_prepare, path)
            high_water = max(contents.last_seq, seqmark.read(path))
            mark_fd = await anyio.to_thread.run_sync(seqmark.open_for_update, path, high_water)
        except OSError as e:
            raise errors.EventLogError(
                f"while opening event log {path} for appending: {_describe(e)}"
            ) from e
        if high_water > contents.last_seq:
            _log.warning(
                "event log lost its last events",
                path=str(path),
                detail=lost_seqs(path, contents, high_water),
            )
        elif contents.torn_tail is not None:
            _log.warning(
                "event log has a torn tail", path=str(path), tail=contents.torn_tail.describe()
            )
        if contents.missing:
            _log.warning(
                "event log is missing events",
                path=str(path),
                missing=contents.describe_missing(),
                detail="below its last event, so not a torn tail: a line taken out of the "
                "middle (an edit, a bad copy) or a tail lost at an earlier start; the actors "
                "they moved are replayed without them",
            )
        tracker = None
        if rotate_bytes is not None:
            tracker = await anyio.to_thread.run_sync(_tracker, contents, machine_spec)
        return cls(
            path,
            contents,
            max_batch=max_batch,
            max_delay=max_delay,
            metrics=metrics,
            rotate_bytes=rotate_bytes,
            tracker=tracker,
            high_water=high_water,
            mark_fd=mark_fd,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- recording -----------------------------------------------------------------------

    async def record(self, event: events.Event) -> None:
        """Append ``event`` (stamped); return once it is fsynced."""
        self.append(event)
        await self._until_durable(self._open_batch)

    def append(self, event: events.Event) -> None:
        """Take ``event`` (stamped) into the log's order now, synchronously; it is written
        with the next batch, durable once :meth:`durable` (or a later :meth:`record`)
        returns. Raises :class:`EventLogError` at once when the log failed or is closed."""
        self._check_usable()
        if event.seq <= self._queued_seq:
            raise errors.EventLogError(
                f"while recording {event.type!r} of actor {event.actor_id!r} in {self.path}: "
                f"its seq {event.seq} does not follow {self._queued_seq} (events are logged "
                "once each, stamped, in acceptance order)"
            )
        self._queued_seq = event.seq
        batch = self._open_batch
        if not batch.lines:
            batch.first = time.monotonic()
        batch.lines.append(codec.encode_line(event))
        batch.events.append(event)
        batch.last_seq = event.seq

    async def durable(self) -> None:
        """Return once every record appended so far is fsynced: at once when none waits;
        else with the batch being written, or as the leader of the next one (group commit
        with whatever else joins it meanwhile)."""
        if self._open_batch.lines:
            await self._until_durable(self._open_batch)
        elif self._in_flight is not None:
            await self._until_durable(self._in_flight)
        elif self._failed is not None:
            self._check_usable()  # an appended record may have been in the failed batch

    async def record_rejected(self, event: events.Event, state: str, problem: str) -> None:
        """Append the refusal of ``event`` in ``state``; return once it is fsynced."""
        self._check_usable()
        batch = self._open_batch
        if not batch.lines:
            batch.first = time.monotonic()
        rejection = format.Rejection(event=event, state=state, problem=problem)
        batch.lines.append(codec.encode_line(rejection))
        await self._until_durable(batch)

    async def aclose(self) -> None:
        """Make what was appended durable (the flush in progress, then the open batch),
        then close the file (idempotent)."""
        if self._failed is None and not self._closed:
            with contextlib.suppress(errors.EventLogError):
                await self.durable()
        while self._flushing:
            await self._flushed.wait()
        self._closed = True
        for fd in (self._fd, self._mark_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._mark_fd = None

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise errors.EventLogError(
                f"event log {self.path} failed earlier and accepts nothing more: {self._failed}"
            ) from self._failed
        if self._closed:
            raise errors.EventLogError(f"event log {self.path} is closed")

    async def _until_durable(self, batch: _Batch) -> None:
        while not batch.done:
            if self._flushing:
                await self._flushed.wait()
            else:
                await self._flush()
        if batch.error is not None:
            raise errors.EventLogError(
                f"while appending {len(batch.lines)} record(s) to event log {self.path}: "
                f"{batch.error}"
            ) from batch.error

    async def _flush(self) -> None:
        self._flushing = True
        self._flushed = anyio.Event()
        batch: _Batch | None = None
        try:
            with anyio.CancelScope(shield=True):
                await self._linger()
                batch, self._open_batch = self._open_batch, _Batch()
                self._in_flight = batch
                if self._failed is not None:
                    # Appended before an earlier batch failed: never written after it.
                    batch.error = self._failed
                    return
                try:
                    self._track(batch)
                    data = b"".join(batch.lines)
                    await anyio.to_thread.run_sync(self._append, data, batch.last_seq)
                except (OSError, errors.EventLogError) as e:
                    batch.error = e
                    self._failed = e
                    return
                if batch.last_seq:
                    self.last_seq = batch.last_seq
                if self._metrics is not None:
                    self._metrics.event_log_append(time.monotonic() - batch.first, len(batch.lines))
                # A snapshot needs an event to stand at (refusals alone do not move the seq).
                rotate = self._rotate_bytes is not None and self._size > self._rotate_bytes
                if rotate and self.last_seq > 0:
                    await self._rotate()
        finally:
            # Whatever happened, the batch's recorders must stop waiting (its error, if any,
            # is what they raise); then the next batch gets a leader.
            if batch is not None:
                batch.done = True
            self._in_flight = None
            self._flushing = False
            self._flushed.set()

    async def _linger(self) -> None:
        """Let concurrent recorders join the batch while it keeps growing."""
        deadline = time.monotonic() + self._max_delay
        size = len(self._open_batch.lines)
        while size < self._max_batch:
            await anyio.lowlevel.checkpoint()
            grown = len(self._open_batch.lines)
            if grown == size or time.monotonic() >= deadline:
                return
            size = grown

    def _track(self, batch: _Batch) -> None:
        """Feed the batch's events to the log's own machine copy (for snapshots)."""
        if self._replayer is None or not batch.events:
            return
        try:
            self._replayer.feed(self.path, batch.events)
        except errors.ReplayDivergence as e:
            raise errors.EventLogError(
                f"the event log's machine refuses an event the agent accepted ({e}); open the "
                "log with the agent's machine_spec"
            ) from e

    def _append(self, data: bytes, last_seq: int) -> None:
        fd = self._fd
        if fd is None or self._mark_fd is None:
            raise errors.EventLogError(f"event log {self.path} is closed")
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fdatasync(fd)
        self._size += len(data)
        self._check_still_named(fd)
        if last_seq:
            # After the log's fsync (the mark never runs ahead of the log it guards), before
            # any recorder of the batch is acknowledged.
            seqmark.update(self._mark_fd, last_seq)

    def _check_still_named(self, fd: int) -> None:
        """Raise unless :attr:`path` still names the open file (see the module doc)."""
        opened = os.fstat(fd)
        try:
            named = self.path.stat()
        except OSError as e:
            raise errors.EventLogError(
                f"event log {self.path} no longer names the file being written "
                f"({e.strerror or e}: removed, or its directory was); the last "
                "records are not acknowledged; restore the log's directory and restart"
            ) from e
        if (named.st_dev, named.st_ino) != (opened.st_dev, opened.st_ino):
            raise errors.EventLogError(
                f"event log {self.path} no longer names the file being written (another "
                "file was put in its place); the last records are not acknowledged; find out "
                "what replaced it and restart the agent"
            )

    # --- rotation ------------------------------------------------------------------------

    async def _rotate(self) -> None:
        assert self._replayer is not None
        if time.monotonic() < self._rotate_not_before:
            return
        base = snapshot.build(self.last_seq, self._replayer.views().values(), self._replayer.causes)
        try:
            await anyio.to_thread.run_sync(self._rotate_files, base)
        except _RotationPostponed as e:
            # Nothing was switched: the segment stays the log; a later batch tries again.
            self._rotate_not_before = time.monotonic() + ROTATE_RETRY
            _log.warning(
                "event log rotation postponed", path=str(self.path), error=str(e.__cause__)
            )
            return
        except Exception as e:  # noqa: BLE001 (any failure: the log is readable, this writer stops)
            # The batch itself is durable; a failed rotation leaves a readable log (module
            # doc), but this writer's file handle may no longer be the log's: stop here.
            self._failed = e
            _log.exception("event log rotation failed", path=str(self.path))
            return
        self.rotations += 1

    def _rotate_files(self, base: snapshot.Snapshot) -> None:
        try:
            written = write_snapshot_step(self.path, base)
        except OSError as e:
            if e.errno in _NOT_NOW:
                raise _RotationPostponed from e
            raise
        header = switch_segment_step(self.path, base.seq, written.name)
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        self._fd = _open_for_append(self.path)
        self._size = len(header)
        remove_stale_step(self.path, keep=written.name)


def lost_seqs(path: Path, contents: reader.LogContents, high_water: int) -> str:
    """What is known when the log's last line is below its seq mark (one sentence)."""
    last = contents.last_seq
    gone = (
        f"seq {high_water} was"
        if high_water == last + 1
        else f"seqs {last + 1} to {high_water} were"
    )
    torn = f"{contents.torn_tail.describe().split(':')[0]}; " if contents.torn_tail else ""
    return (
        f"{torn}the log ends at seq {last} but its seq mark {seqmark.path_of(path)} says "
        f"{gone} logged: gone from the log (its tail was cut or lost) and may "
        "have been acknowledged; new events are numbered after them, never reusing one"
    )


def _open_for_append(path: Path) -> int:
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    except OSError as e:
        raise errors.EventLogError(
            f"while opening event log {path} for appending: {_describe(e)}"
        ) from e


def _describe(error: OSError) -> str:
    """An OSError as an operator reads it, with what to check for the common causes."""
    text = error.strerror or str(error)
    if error.errno in (errno.EPERM, errno.EACCES, errno.EROFS):
        return (
            f"{text}; check that the log and its directory are writable by the agent "
            "(not on a read-only mount, not immutable: lsattr)"
        )
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{text}; free space on the log's filesystem"
    return text


# --- one writer per log ----------------------------------------------------------------------


class LogLock:
    """An exclusive lock on an event log, held until :meth:`close` (see the module doc)."""

    def __init__(self, log: Path, path: Path, fd: int) -> None:
        self.log = log
        """The event log the lock guards."""
        self.path = path
        """The lock file (``<log>.lock``)."""
        self._fd: int | None = fd

    def close(self) -> None:
        """Release the lock (idempotent); the lock file stays."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def lock(log: Path) -> LogLock:
    """Lock ``log`` for this process, or raise :class:`EventLogLocked` naming the holder.

    Never waits: a second agent on the same log must fail at once, not queue behind the
    first. Creates the log's directory when absent, as opening the log does. Any other
    failure (read-only, immutable) is an :class:`EventLogError`.
    """
    lock_path = log.with_name(log.name + ".lock")
    try:
        log.parent.mkdir(parents=True, exist_ok=True)  # as opening the log would
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise errors.EventLogError(
            f"while locking event log {log} (lock file {lock_path}): {_describe(e)}"
        ) from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise errors.EventLogLocked(log, lock_path, holder) from None
    except OSError as e:
        os.close(fd)
        raise errors.EventLogError(
            f"while locking event log {log} (lock file {lock_path}): {_describe(e)}"
        ) from e
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as e:
        os.close(fd)
        raise errors.EventLogError(
            f"while writing this agent's pid into {lock_path}: {_describe(e)}"
        ) from e
    return LogLock(log, lock_path, fd)


def _read_holder(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


#: Errors of a rotation's first step that say "not now" (no descriptor, no memory).
_NOT_NOW: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})
ROTATE_RETRY: Final = 1.0
"""Seconds before a postponed rotation is tried again (by the first batch after them)."""


class _RotationPostponed(errors.EventLogError):
    """The snapshot could not be written for want of a descriptor or memory: nothing changed."""


# --- the rotation steps (separate so tests can stop between any two) -----------------------


def write_snapshot_step(log: Path, base: snapshot.Snapshot) -> Path:
    """Rotation step 1: the snapshot, atomically."""
    return snapshot.write(log, base)


def switch_segment_step(log: Path, base_seq: int, snapshot_name: str) -> bytes:
    """Rotation step 2: replace the segment with one continuing the snapshot (atomic)."""
    header = (format.Header(format.VERSION, base_seq, snapshot_name).to_json() + "\n").encode()
    _atomic.write_atomically(log, header, default_mode=0o600)
    return header


def remove_stale_step(log: Path, *, keep: str | None) -> None:
    """Rotation step 3: remove snapshots and temp files not in use."""
    _remove_stale(log, keep=keep)


def _remove_stale(log: Path, *, keep: str | None) -> None:
    """Remove snapshots other than ``keep`` and temp files (rotation, and on open)."""
    for stale in log.parent.glob(f"{log.name}.snapshot-*.json"):
        if stale.name != keep:
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
    for temp in log.parent.glob(f".{log.name}*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()


def _tracker(contents: reader.LogContents, spec: machine.MachineSpec | None) -> replayer.Replayer:
    """The writer's machine copy, brought up to the log's last event."""
    tracker = replayer.Replayer(spec)
    if contents.snapshot is not None:
        tracker.load(contents.snapshot)
    tracker.feed(contents.path, contents.records)
    return tracker


def _prepare(path: Path) -> reader.LogContents:
    """Create, repair (torn tail) and clean up the log at ``path``; what it holds."""
    if not path.exists() or path.stat().st_size == 0:
        return _create(path)
    _check_directory_writable(path)
    contents = reader.read_log(path)
    if contents.valid_bytes == 0:
        # The header itself was torn: nothing was ever logged.
        fresh = _create(path)
        return reader.LogContents(
            path, fresh.header, None, [], contents.torn_tail, fresh.valid_bytes
        )
    if contents.torn_tail is not None:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, contents.valid_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)
    _remove_stale(path, keep=contents.header.snapshot)
    return contents


def _check_directory_writable(path: Path) -> None:
    """Fail now, not at the first rotation hours later, when the log's directory is read-only."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    Path(name).unlink()


def _create(path: Path) -> reader.LogContents:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = format.Header(format.VERSION)
    data = (header.to_json() + "\n").encode()
    _atomic.write_atomically(path, data, default_mode=0o600)
    _remove_stale(path, keep=None)
    return reader.LogContents(path, header, None, [], None, len(data))
