"""The JSON-lines transports: the Unix socket and stdin, one request line in, one response
line out (:mod:`.protocol`), answered by an :class:`~.door.AgentService`.

Design decisions:

- **One request line, one response line, in order, per connection.** Each connection (and
  stdin) is served by its own task, so clients are concurrent and one slow client never
  holds up another; within a connection lines are handled one after another, so a client
  can pipeline requests and match responses by position.
- **Bounded clients** (socket): at most ``max_clients`` connections are served, one more is
  answered ``busy`` and closed; a connection silent for ``idle_timeout`` seconds, or holding
  a partial line (or an unread answer) for ``line_timeout`` seconds, is closed. A line is
  buffered up to :data:`protocol.MAX_LINE_BYTES` and no further. ``accept`` failing for
  lack of file descriptors or memory is backed off from, never fatal.
- **Big answers share one budget** (:class:`AnswerBudget`): an answer over
  :data:`SMALL_ANSWER` bytes (an ``actors`` query on a busy worker: tens of kilobytes per
  thousand actors) is sent only while it holds its size from one budget of ``max_clients``
  x :data:`SMALL_ANSWER` shared by every connection, so clients that ask and never read
  hold that much in all, not a whole answer each. A client waiting for room is not read
  from and its answer not built until the room is there (a built answer waiting would be
  the memory the budget bounds).
- **One agent per socket.** An existing socket file is replaced only when nothing answers
  on it.
- **Shutdown stops reading**: the listener closes, the socket file is removed, pending reads
  are cancelled, but a line already read is still answered.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import socket
import stat
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Final

import anyio
import anyio.to_thread
from anyio.abc import ByteStream, SocketListener, TaskGroup, TaskStatus

from substrate_gpu import exceptions
from substrate_gpu._log import get_logger
from substrate_gpu.service import _socketfile, protocol, query
from substrate_gpu.service import config as config_
from substrate_gpu.service.config import AgentConfig
from substrate_gpu.service.door import AgentService, too_long

if TYPE_CHECKING:
    pass

log = get_logger(__name__)


@dataclass(frozen=True)
class ClientLimits:
    """How the socket bounds its clients (``--max-clients``, ``--idle-timeout``, ...)."""

    max_clients: int = config_.DEFAULT_MAX_CLIENTS
    """Connections served at once; one more is answered ``busy`` and closed."""
    idle_timeout: float = config_.DEFAULT_IDLE_TIMEOUT
    """Seconds a connection may stay silent between lines."""
    line_timeout: float = config_.DEFAULT_LINE_TIMEOUT
    """Seconds to finish a line once its first byte arrived, and to take an answer."""

    @classmethod
    def of(cls, config: AgentConfig) -> ClientLimits:
        """The limits ``config`` sets."""
        return cls(config.max_clients, config.idle_timeout, config.line_timeout)


SMALL_ANSWER: Final = 64 * 1024
"""Answers up to this many bytes are sent at once; larger ones draw on the :class:`AnswerBudget`."""


class AnswerBudget:
    """The bytes of answers over :data:`SMALL_ANSWER` that all socket clients hold at once.

    An answer takes its size while it is sent and gives it back once sent (or its client
    is gone). One that does not fit is dropped and waits, holding nothing, until an answer
    of its size fits, then is built again. An answer larger than the whole budget is sent
    alone, so it never waits for ever. Answers of one kind (``like_last``: actor lists) are
    about the same size, so such a query waits for room for the last one before it is built
    at all: 200 clients asking for a list are not 200 lists built to be dropped.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        """Bytes held by answers being sent."""
        self._expected = 0
        self._room = anyio.Event()

    def _fits(self, size: int) -> bool:
        # 0: a size not known yet (build it to learn it); an answer alone always fits.
        return size == 0 or self.used == 0 or self.used + size <= self.capacity

    @contextlib.asynccontextmanager
    async def held(
        self, build: Callable[[], bytes], *, like_last: bool = False
    ) -> AsyncIterator[bytes]:
        """The answer ``build`` makes, holding its size from the budget while inside."""
        expected = self._expected if like_last else 0
        while True:
            while not self._fits(expected):
                await self._room.wait()
            answer = build()
            size = len(answer)
            if size <= SMALL_ANSWER:
                yield answer
                return
            if like_last:
                self._expected = size
            if self._fits(size):
                break
            expected = size
            del answer  # waiting must hold nothing: built again once there is room
        self.used += size
        try:
            yield answer
        finally:
            self.used -= size
            self._room.set()
            self._room = anyio.Event()


class _Hangup(Exception):
    """The connection ends here; ``answer`` (if any) is sent first, ``reason`` counted."""

    def __init__(self, reason: str | None, answer: protocol.RequestError | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.answer = answer


class _LineReader:
    """Splits a byte stream into lines, never buffering more than one line's worth.

    A line is the bytes before ``\\n``, or before the end of the stream (the client's EOF),
    at most :data:`protocol.MAX_LINE_BYTES` of them. The idle clock runs while no byte of a
    line has arrived; the line clock starts at a line's first byte, so a client trickling a
    byte at a time still has to finish within ``line_timeout``.
    """

    def __init__(self, stream: ByteStream, limits: ClientLimits) -> None:
        self._stream = stream
        self._limits = limits
        self._buffer = bytearray()
        self._searched = 0
        self._line_deadline: float | None = None
        self._eof = False

    async def next_line(self) -> bytes | None:
        """The next line (without its newline); None at the end of the stream."""
        limit = protocol.MAX_LINE_BYTES
        while True:
            index = self._buffer.find(b"\n", self._searched)
            if index >= 0:
                if index > limit:
                    raise _Hangup("too_long", too_long())
                line = bytes(self._buffer[:index])
                del self._buffer[: index + 1]
                self._searched = 0
                self._line_deadline = self._deadline_if_partial()
                return line
            self._searched = len(self._buffer)
            if len(self._buffer) > limit:
                raise _Hangup("too_long", too_long())
            if self._eof:
                if not self._buffer:
                    return None
                line = bytes(self._buffer)
                self._buffer.clear()
                return line
            await self._receive()

    def _deadline_if_partial(self) -> float | None:
        return anyio.current_time() + self._limits.line_timeout if self._buffer else None

    async def _receive(self) -> None:
        partial = self._line_deadline is not None
        deadline = (
            self._line_deadline
            if self._line_deadline is not None
            else anyio.current_time() + self._limits.idle_timeout
        )
        chunk = b""
        with anyio.move_on_after(max(deadline - anyio.current_time(), 0)):
            try:
                chunk = await self._stream.receive(65536)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._eof = True
                return
        if not chunk:
            if partial:
                raise _Hangup(
                    "line_timeout",
                    protocol.RequestError(
                        "timeout",
                        f"request line not finished within {self._limits.line_timeout:g} s; "
                        "closing the connection",
                    ),
                )
            raise _Hangup("idle_timeout")
        if not self._buffer:
            self._line_deadline = anyio.current_time() + self._limits.line_timeout
        self._buffer += chunk


async def serve_stream(
    service: AgentService,
    stream: ByteStream,
    limits: ClientLimits | None = None,
    budget: AnswerBudget | None = None,
) -> None:
    """Serve one connection until the client closes it, a limit ends it, or the intake stops;
    its big answers draw on ``budget`` (shared by the socket's connections; None: its own)."""
    limits = limits or ClientLimits()
    budget = budget or AnswerBudget(SMALL_ANSWER)
    reader = _LineReader(stream, limits)
    number = 0
    async with stream:
        try:
            while True:
                line = await reader.next_line()
                if line is None:
                    return
                number += 1
                # A line read is a line answered, even while shutting down (within the grace).
                with service.answering():
                    if query.is_query(line):
                        # Only a query's answer grows with the worker (events answer a line).
                        async with budget.held(
                            functools.partial(query.answer, service.agent, line, number),
                            like_last=query.may_list_actors(line),
                        ) as answer:
                            await _send(stream, answer, limits)
                        continue
                    response = await service.handle_line(line, number)
                    if response is not None:
                        await _send(stream, response, limits)
        except _Hangup as hangup:
            if hangup.answer is not None:
                number += 1
                with contextlib.suppress(_Hangup):
                    await _send(stream, service.reject(hangup.answer, number), limits)
            if hangup.reason is not None and service.metrics is not None:
                service.metrics.connection_closed(hangup.reason)
            log.info("client disconnected", reason=hangup.reason, line=number)


async def _send(stream: ByteStream, data: bytes, limits: ClientLimits) -> None:
    """Send ``data``, or hang up on a client that does not read its answers in time."""
    try:
        with anyio.fail_after(limits.line_timeout):
            await stream.send(data)
    except TimeoutError:
        raise _Hangup("send_timeout") from None
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        raise _Hangup(None) from None


def claim_socket_path(path: Path) -> None:
    """Remove a stale socket at ``path``; refuse a live one and any other kind of file."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise exceptions.ConfigError(
            f"while creating the agent socket {path}: a non-socket file is in the way; "
            "remove it or choose another --socket"
        )
    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            # Nothing listens: left behind by an agent that died. Safe to replace.
            path.unlink(missing_ok=True)
            return
        except OSError as e:
            raise exceptions.ConfigError(
                f"while checking the existing socket {path}: {e.strerror or e}; "
                "remove it if no agent uses it, or choose another --socket"
            ) from e
    raise exceptions.ConfigError(
        f"while creating the agent socket {path}: another process is serving on it (is "
        "another agent running?); stop it or choose another --socket"
    )


#: accept() errors that say "not now" (descriptors or memory exhausted), not "broken".
_RETRYABLE_ACCEPT: Final = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EPROTO}
)
_ACCEPT_BACKOFF: Final = (0.01, 1.0)


async def serve_socket(
    service: AgentService,
    path: Path,
    limits: ClientLimits | None = None,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Accept connections on the Unix socket ``path`` (mode 0600) until cancelled."""
    limits = limits or ClientLimits()
    _socketfile.make_private_dir(
        path, "agent socket", "check its parent is writable, or choose another --socket"
    )
    claim_socket_path(path)
    try:
        with _socketfile.private_umask():
            listener = await anyio.create_unix_listener(path)
    except OSError as e:
        raise exceptions.ConfigError(
            f"while creating the agent socket {path}: {e.strerror or e}; "
            "check the directory exists and is writable, or choose another --socket"
        ) from e
    path.chmod(0o600)
    ours = path.stat()
    try:
        async with listener, anyio.create_task_group() as clients:
            task_status.started()
            await _accept_forever(service, listener, clients, limits)
    finally:
        _socketfile.unlink_if_ours(path, ours)


async def _accept_forever(
    service: AgentService, listener: SocketListener, clients: TaskGroup, limits: ClientLimits
) -> None:
    backoff, ceiling = _ACCEPT_BACKOFF
    active = 0

    budget = AnswerBudget(limits.max_clients * SMALL_ANSWER)

    async def serve(stream: ByteStream) -> None:
        nonlocal active
        try:
            await serve_stream(service, stream, limits, budget)
        finally:
            active -= 1
            if service.metrics is not None:
                service.metrics.connections(active)

    while True:
        try:
            stream = await listener.accept()
        except anyio.BrokenResourceError as e:
            cause = e.__cause__
            if not (isinstance(cause, OSError) and cause.errno in _RETRYABLE_ACCEPT):
                raise
            # Out of descriptors: the pending client stays in the backlog; retry later.
            log.warning(
                "accept failed; backing off",
                error=f"{errno.errorcode.get(cause.errno or 0, '?')}: {cause.strerror}",
                retry_in=backoff,
            )
            if service.metrics is not None:
                service.metrics.accept_error()
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, ceiling)
            continue
        backoff = _ACCEPT_BACKOFF[0]
        if active >= limits.max_clients:
            await _turn_away(service, stream, limits)
            continue
        active += 1
        if service.metrics is not None:
            service.metrics.connections(active)
        clients.start_soon(serve, stream)


async def _turn_away(service: AgentService, stream: ByteStream, limits: ClientLimits) -> None:
    """Tell a client over ``max_clients`` why, and close (a fresh socket never blocks a send)."""
    busy = protocol.RequestError(
        "busy",
        f"the agent serves at most {limits.max_clients} clients at once (--max-clients); "
        "retry later",
    )
    async with stream:
        with anyio.move_on_after(0.1), contextlib.suppress(anyio.BrokenResourceError):
            await stream.send(protocol.refusal(busy, 0))
    if service.metrics is not None:
        service.metrics.connection_closed("max_clients")
    log.info("client turned away", reason="max_clients", max_clients=limits.max_clients)


async def serve_lines(service: AgentService, source: BinaryIO, sink: BinaryIO) -> None:
    """Serve requests from a blocking binary file (stdin) until EOF; responses to ``sink``."""
    number = 0
    while True:
        line = await anyio.to_thread.run_sync(
            source.readline, protocol.MAX_LINE_BYTES + 1, abandon_on_cancel=True
        )
        if not line:
            return
        number += 1
        if len(line) > protocol.MAX_LINE_BYTES and not line.endswith(b"\n"):
            # Too long: skip the rest of it, answer once.
            while line and not line.endswith(b"\n"):
                line = await anyio.to_thread.run_sync(
                    source.readline, protocol.MAX_LINE_BYTES, abandon_on_cancel=True
                )
            response: bytes | None = service.reject(too_long(), number)
        else:
            with service.answering():
                response = await service.handle_line(line.rstrip(b"\n"), number)
        if response is not None:
            with service.answering():
                await anyio.to_thread.run_sync(_write_flush, sink, response)


def _write_flush(sink: BinaryIO, data: bytes) -> None:
    sink.write(data)
    sink.flush()
