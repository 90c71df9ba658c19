"""The standalone agent process: requests in (Unix socket, stdin), the Agent, the log, metrics.

Design decisions:

- **One request line, one response line, in order, per connection.** Each connection (and
  stdin) is served by its own task, so clients are concurrent and one slow client never
  holds up another; within a connection lines are handled one after another, so a client
  can pipeline requests and match responses by position.
- **Nothing malformed reaches the log.** A line is parsed and checked
  (:func:`protocol.parse_request`) before ``Agent.submit``; the machine refuses invalid
  events before the recorder is called. Only accepted events are recorded.
- **The acknowledgement follows durability.** ``submit`` returns after the event log has
  fsynced the event (the recorder is awaited before the effect starts), so an ``ok`` line
  means the event survives a crash.
- **Shutdown drains.** SIGTERM/SIGINT stop reading (the listener closes, the socket file is
  removed, pending reads are cancelled) but a line already read is still handled and
  answered (shielded); then running effects get ``drain_timeout`` seconds to finish, the
  Agent closes (effects still running are cancelled: their actors stay in flight, for
  recovery to reconcile), and the event log is closed last.
- **Every line gets an answer; no line ends the process.** Decoding a line is wrapped in a
  per-line boundary (:meth:`AgentService.handle_line`): whatever the decoder raises becomes
  a ``malformed`` answer for that line.
- **A failed event log stops acknowledgements, not the process.** Once the log fails (a
  write error, a full disk, the log's file no longer at its path), every later line is
  answered ``unavailable`` with the cause, ``substrate_gpu_event_log_usable`` drops to 0 and
  the failure is logged once: memory and log may disagree, so nothing more is accepted until
  an operator fixes the log and restarts the agent. Staying up keeps the reason visible to
  clients and to Prometheus (an exit would let a supervisor restart it onto an empty log).
- **Bounded clients** (socket): at most ``max_clients`` connections are served, one more is
  answered ``busy`` and closed; a connection silent for ``idle_timeout`` seconds, or holding
  a partial line (or an unread answer) for ``line_timeout`` seconds, is closed. A line is
  buffered up to :data:`protocol.MAX_LINE_BYTES` and no further. ``accept`` failing for
  lack of file descriptors or memory is backed off from, never fatal.
- **Big answers share one budget** (:class:`AnswerBudget`): an answer over
  :data:`SMALL_ANSWER` bytes (an ``actors`` query on a busy worker: ~1.4 MB for 20,000
  actors) is sent only while it holds its size from one budget of ``max_clients`` x
  :data:`SMALL_ANSWER` shared by every connection, so clients that ask and never read hold
  that much in all, not a whole answer each. A client waiting for room is not read from and
  its answer not built until the room is there (a built answer waiting would be the memory
  the budget bounds).
- **Health on the metrics port.** ``/healthz`` and ``/readyz`` (:mod:`.health`) are served
  from the moment the log is locked, before recovery: a probe sees ``recovery: running``,
  not a refused connection. SIGTERM turns readiness off before the drain begins.
- **The worker's GPUs are learnt before serving** (:func:`wiring.gpu_discovery`, after the
  log is recovered): the allocator is built from the CDI spec and rebuilt from the resumed
  actors, so no GPU actor is served before the table is the log's (docs/gpu-injection.md).
- **One agent per log and per socket.** The log is locked (:func:`eventlog.lock`) before
  recovery reads it; an existing socket file is replaced only when nothing answers on it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import signal
import socket
import stat
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Final

import anyio
import anyio.to_thread
from anyio.abc import ByteStream, SocketListener, TaskGroup, TaskStatus

from substrate_gpu import eventlog, exceptions
from substrate_gpu._log import get_logger
from substrate_gpu.lifecycle import Agent, allocation, errors, events, hooks, machine
from substrate_gpu.lifecycle.effects import GpuInjector
from substrate_gpu.observability.http import MetricsServer
from substrate_gpu.observability.metrics import AgentMetrics
from substrate_gpu.observability.registry import AgentRegistry
from substrate_gpu.probes.api import CudaContextProbe
from substrate_gpu.runsc import driver
from substrate_gpu.runsc.api import SandboxRuntime
from substrate_gpu.service import _socketfile, actor_log, protocol, query, recovery, wiring
from substrate_gpu.service import config as config_
from substrate_gpu.service import health as health_
from substrate_gpu.service.config import AgentConfig

if TYPE_CHECKING:
    from substrate_gpu.service import capacity_report

log = get_logger(__name__)


class AgentService:
    """Turns request lines into submitted events and response lines (transport-free)."""

    def __init__(self, agent: Agent, metrics: AgentMetrics | None = None) -> None:
        self.agent = agent
        self.metrics = metrics
        """Where refusals, connections and a failed log are counted (None: nowhere)."""
        self.log_failure: str | None = None
        """Why the event log failed (set once; every later line is answered unavailable)."""
        self._answering: set[anyio.CancelScope] = set()
        self._grace_deadline: float | None = None

    async def answer(self, event: events.Event, line_number: int = 0) -> bytes:
        """Offer ``event``; the response line (an ack, the machine's refusal, unavailable)."""
        accepted = await self.offer(event)
        if isinstance(accepted, protocol.RequestError):
            return self.reject(accepted, line_number)
        return protocol.ack(wiring.SeqTap.seq_of_last_submit(), accepted)

    async def offer(self, event: events.Event) -> hooks.Transition | protocol.RequestError:
        """Offer ``event`` to the agent: the transition it caused, or why it was not
        accepted (the machine's refusal, or unavailable once the log failed), as a value,
        never raised. Both doors (JSON lines, the worker API) offer through here; the caller
        counts a refusal (:meth:`reject`)."""
        if self.log_failure is not None:
            return unavailable(self.log_failure)
        try:
            return await self.agent.submit(event)
        except errors.InvalidEvent as e:
            return protocol.classify_refusal(e, self.agent.spec)
        except (eventlog.EventLogError, errors.AgentClosedError) as e:
            self._log_failed(e)
            return unavailable(self.log_failure or str(e))

    async def offer_all(
        self, group: Sequence[events.Event]
    ) -> list[hooks.Transition] | protocol.RequestError:
        """:meth:`offer` of several events in order, durable together (one fsync): their
        transitions, or why one was not accepted (those before it stay accepted)."""
        if self.log_failure is not None:
            return unavailable(self.log_failure)
        try:
            return await self.agent.submit_all(group)
        except errors.InvalidEvent as e:
            return protocol.classify_refusal(e, self.agent.spec)
        except (eventlog.EventLogError, errors.AgentClosedError) as e:
            self._log_failed(e)
            return unavailable(self.log_failure or str(e))

    async def durable(self) -> protocol.RequestError | None:
        """Wait until every accepted event is durable (a door does before it answers for
        one); why not, once the log failed."""
        if self.log_failure is not None:
            return unavailable(self.log_failure)
        try:
            await self.agent.durable()
        except (eventlog.EventLogError, errors.AgentClosedError) as e:
            self._log_failed(e)
            return unavailable(self.log_failure or str(e))
        return None

    async def handle_line(self, line: bytes, line_number: int) -> bytes | None:
        """The response to one request line; None for a blank line (ignored). Never raises
        for anything in the line."""
        if not line.strip():
            return None
        if len(line) > protocol.MAX_LINE_BYTES:
            return self.reject(too_long(), line_number)
        if query.is_query(line):
            return query.answer(self.agent, line, line_number)
        try:
            parsed = protocol.parse_request(line)
        except Exception as e:  # noqa: BLE001 (the per-line boundary: see the module doc)
            log.warning("request decoder raised", line=line_number, error=repr(e)[:200])
            parsed = protocol.RequestError(
                "malformed", f"request could not be decoded ({type(e).__name__})"
            )
        if isinstance(parsed, protocol.RequestError):
            return self.reject(parsed, line_number)
        return await self.answer(parsed, line_number)

    def _log_failed(self, error: BaseException) -> None:
        """Stop acknowledging for good: the log (or the agent's recorder) failed."""
        cause = error.__cause__ if isinstance(error, errors.AgentClosedError) else error
        if not isinstance(cause, eventlog.EventLogError):
            # Closed for another reason (shutting down): nothing to mark.
            return
        if self.log_failure is None:
            self.log_failure = str(cause)
            log.error("event log failed: acknowledging nothing more", error=str(cause))
            if self.metrics is not None:
                self.metrics.event_log_failed()

    def reject(self, error: protocol.RequestError, line_number: int) -> bytes:
        """Count and log a refused request; its response line."""
        if self.metrics is not None:
            self.metrics.event_rejected(protocol.REJECTION_REASONS.get(error.kind, "malformed"))
        log.info("request refused", kind=error.kind, line=line_number, error=error.message)
        return protocol.refusal(error, line_number)

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """Shield the handling of a line already read from the intake's cancellation.

        Once shutdown begins (:meth:`begin_shutdown`) the shield has a deadline, so a submit
        waiting for a queue slot cannot hold the process beyond the grace period.
        """
        with anyio.CancelScope(shield=True) as scope:
            if self._grace_deadline is not None:
                scope.deadline = self._grace_deadline
            self._answering.add(scope)
            try:
                yield
            finally:
                self._answering.discard(scope)

    def begin_shutdown(self, grace: float) -> None:
        """Give lines being answered ``grace`` seconds more, then cancel them."""
        self._grace_deadline = anyio.current_time() + grace
        for scope in self._answering:
            scope.deadline = min(scope.deadline, self._grace_deadline)


def too_long() -> protocol.RequestError:
    """The error for a request line over :data:`protocol.MAX_LINE_BYTES`."""
    return protocol.RequestError(
        "too_long",
        f"request line exceeds {protocol.MAX_LINE_BYTES} bytes (the newline not counted)",
    )


def unavailable(cause: str) -> protocol.RequestError:
    """The error for any request once the event log failed."""
    return protocol.RequestError(
        "unavailable",
        f"the agent acknowledges nothing more: {cause}; the operator must fix the event log "
        "and restart the agent",
    )


# --- transports ----------------------------------------------------------------------------


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


def _claim_socket_path(path: Path) -> None:
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
    _claim_socket_path(path)
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


# --- the process -----------------------------------------------------------------------------


class KnownActorRefusals:
    """The event log as the agent's recorder, minus refusals of events for unknown actors.

    A refusal is logged so a replay reproduces it; an event for an actor the machine never
    registered changes nothing to reproduce, and logging it (one fsync each) would let any
    client grow the log and spend the disk's fsyncs at will. It is answered and counted
    (``substrate_gpu_events_rejected_total{reason="unknown_actor"}``) instead.
    """

    def __init__(self, log: eventlog.EventLog, initial_state: str) -> None:
        self.log = log
        self._initial = initial_state

    async def record(self, event: events.Event) -> None:
        """Record an accepted event (durable on return)."""
        await self.log.record(event)

    def append(self, event: events.Event) -> None:
        """Take an accepted event into the log's order (durable with the next batch)."""
        self.log.append(event)

    async def durable(self) -> None:
        """Once every event appended so far is durable."""
        await self.log.durable()

    async def record_rejected(self, event: events.Event, state: str, problem: str) -> None:
        """Record a refusal of an event for a known actor (the machine's initial state is
        where actors it does not know are: nothing rests there)."""
        if state != self._initial:
            await self.log.record_rejected(event, state, problem)


@dataclass
class Running:
    """What a started agent exposes to its caller (tests, the demo)."""

    service: AgentService
    metrics_url: str | None
    recovered: recovery.Resumed | None
    health: health_.AgentHealth
    """What ``/healthz`` and ``/readyz`` answer."""
    stop: anyio.Event = field(default_factory=anyio.Event)
    """Set to shut the agent down (as SIGTERM does)."""
    registration: capacity_report.Registration | None = None
    """The capacity report to atelet, once it is made (the worker API served)."""
    runtime: SandboxRuntime | None = None
    """The sandbox runtime the agent's effects use (the worker API signals app containers
    through it at shutdown)."""


@dataclass(frozen=True)
class Components:
    """Overrides of the production collaborators (another runtime, probe or injector)."""

    runtime: SandboxRuntime
    probe: CudaContextProbe
    injector: GpuInjector
    gpus: allocation.GpuDiscovery | None = None
    """How the worker's GPUs are learnt for the allocator; None: no allocator, every GPU
    actor gets all of the worker's GPUs (the upstream behaviour)."""


@contextlib.asynccontextmanager
async def running_agent(
    config: AgentConfig, components: Components | None = None
) -> AsyncIterator[Running]:
    """The agent serving (log open, recovered, metrics up) while inside; closed cleanly after.

    Transports are not started here (see :func:`run`), so tests can drive the service. The
    metrics server (with ``/healthz`` and ``/readyz``) starts once the log is locked, before
    recovery, so a probe can tell "recovering" from "down".
    """
    spec = machine.load_spec()
    registry = AgentRegistry()
    agents: list[Agent] = []
    metrics = wiring.agent_metrics(
        registry, spec, lambda: agents[0].state_counts() if agents else {}
    )
    if config.socket is not None:
        # Before anything is touched (the log's lock and file, the metrics port, GPU
        # discovery): an agent whose socket another agent serves must leave no trace.
        _claim_socket_path(config.socket)
    health = health_.AgentHealth(config)
    metrics.report_readiness(health.readiness)
    async with contextlib.AsyncExitStack() as stack:
        if config.event_log is not None:
            # Before recovery reads the log: a second agent must not even reconcile it.
            stack.enter_context(eventlog.lock(config.event_log))
        if components is None:
            built = wiring.build_collaborators(config, metrics)
            components = Components(
                runtime=built.runtime,
                probe=built.probe,
                injector=built.injector,
                gpus=wiring.gpu_discovery(config, built.injector),
            )
        url = None
        if config.metrics_port:
            server = await stack.enter_async_context(
                MetricsServer(
                    registry, host=config.metrics_host, port=config.metrics_port, health=health
                )
            )
            url = server.url
            watchers = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(watchers.cancel_scope.cancel)  # runs first: LIFO
            watchers.start_soon(health.heartbeat)
            watchers.start_soon(health.watch_runsc)
        event_log, recovered = await recovery.open_log(
            config.event_log,
            runtime=components.runtime,
            checkpoint_root=config.checkpoint_root,
            metrics=metrics,
        )
        if event_log is not None:
            stack.push_async_callback(event_log.aclose)
        tap = wiring.SeqTap(
            KnownActorRefusals(event_log, spec.initial) if event_log is not None else None
        )
        allocator = None
        if components.gpus is not None:
            # Before the Agent: it rebuilds the table from the resumed actors' records.
            allocator = await allocation.GpuAllocator.discovered(
                components.gpus, name=wiring.worker_name()
            )
        agent = Agent(
            runtime=components.runtime,
            probe=components.probe,
            injector=components.injector,
            checkpoint_root=config.checkpoint_root,
            machine_spec=spec,
            recorder=tap,
            metrics=wiring.LifecycleMetricsBridge(metrics),
            resume=recovered.resume if recovered is not None else None,
            gpu=wiring.gpu_settings(config, components.runtime),
            allocator=allocator,
        )
        agents.append(agent)
        await stack.enter_async_context(agent)
        resumed = None
        if recovered is not None:
            resumed = recovery.summary(recovered)
            log.info(
                "resumed %d actors at seq %d",
                resumed.actors,
                resumed.last_seq,
                path=str(config.event_log),
                actors=resumed.actors,
                last_seq=resumed.last_seq,
                reconciled=resumed.reconciled,
                rerun=resumed.rerun,
            )
        running = Running(
            service=AgentService(agent, metrics),
            metrics_url=url,
            recovered=resumed,
            health=health,
            runtime=components.runtime,
        )
        health.serving(lambda: running.service.log_failure)
        health.recovered(
            health_.recovery_detail(
                config.event_log,
                resumed.actors if resumed else 0,
                resumed.last_seq if resumed else 0,
            )
        )
        try:
            yield running
        finally:
            health.draining()
            with anyio.CancelScope(shield=True), anyio.move_on_after(config.drain_timeout):
                await agent.settle()


async def run(
    config: AgentConfig,
    *,
    components: Components | None = None,
    on_ready: Callable[[Running], None] | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT (or stdin's EOF when stdin is the only input).

    A failure (the socket cannot be bound, the event log broke) is raised as the
    :class:`SubstrateGpuError` it is, not wrapped in a task group's exception group.
    """
    try:
        return await _serve(config, components, on_ready)
    except BaseExceptionGroup as group:
        matched, _ = group.split(exceptions.SubstrateGpuError)
        if matched is None:
            raise
        first: BaseException = matched
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from group


def _actor_logs(runtime: object) -> actor_log.ActorLogs | None:
    """The app containers' output forwarding the runsc driver was built with, if any."""
    if isinstance(runtime, driver.RunscDriver):
        outputs = runtime.config.container_output
        if isinstance(outputs, actor_log.ActorLogs):
            return outputs
    return None


async def _serve(
    config: AgentConfig,
    components: Components | None,
    on_ready: Callable[[Running], None] | None,
) -> int:
    # The worker door outlives the agent's drain (running_agent's exit): a call arriving
    # then is answered UNAVAILABLE, not refused by a closed socket. Its calls run in a task
    # group entered before the agent, so the scopes nest (worker_api.WorkerService.hosted_in).
    async with (
        anyio.create_task_group() as worker_calls,
        contextlib.AsyncExitStack() as doors,
        running_agent(config, components) as running,
    ):
        worker = None
        if config.worker_socket is not None:
            # grpc is loaded only by an agent serving the worker API.
            from substrate_gpu.service import worker_api  # noqa: PLC0415

            worker = worker_api.WorkerService(
                running.service,
                runsc=config.runsc,
                dev_root=config.dev_root,
                max_actors=config.max_actors,
                image_layers_dir=config.image_layers_dir,
                runtime=running.runtime,
                runsc_static_dir=config.runsc_static_dir,
                actor_logs=_actor_logs(running.runtime),
                sandbox_network=config.sandbox_network,
            )
            await doors.enter_async_context(
                worker_api.serving(
                    worker,
                    config.worker_socket,
                    _claim_socket_path,
                    worker_calls,
                    max_clients=config.max_worker_clients,
                )
            )
        async with anyio.create_task_group() as intake:
            intake.start_soon(_watch_signals, running.stop)
            if config.socket is not None:
                await intake.start(
                    serve_socket, running.service, config.socket, ClientLimits.of(config)
                )
            if worker is not None and config.worker_socket is not None:
                intake.start_soon(
                    worker_api.watch_connections, config.worker_socket, config.max_worker_clients
                )
            if worker is not None and config.atelet_socket is not None:
                # Once the worker API serves: atelet may place an actor when it accepts.
                intake.start_soon(_report_capacity, config, config.atelet_socket, running)
            if config.stdin:
                intake.start_soon(
                    _stdin_then_maybe_stop,
                    running,
                    sys.stdin.buffer,
                    sys.stdout.buffer,
                    config.socket is None,
                )
            log.info(
                "agent serving",
                socket=str(config.socket) if config.socket else None,
                worker_socket=str(config.worker_socket) if config.worker_socket else None,
                stdin=config.stdin,
                metrics=running.metrics_url,
                event_log=str(config.event_log) if config.event_log else None,
            )
            if on_ready is not None:
                on_ready(running)
            await running.stop.wait()
            if worker is not None:
                worker.draining = True
            running.health.draining()
            if worker is not None:
                # As upstream's gracefulShutdown: in-flight calls finish (checkpoints save
                # state), then every app container gets SIGTERM, SIGKILL at the deadline.
                await worker.shutdown(config.workload_grace)
            running.service.begin_shutdown(config.drain_timeout)
            intake.cancel_scope.cancel()
        log.info("agent stopping: draining effects", timeout=config.drain_timeout)
    log.info("agent stopped")
    return 0


async def _report_capacity(config: AgentConfig, socket: Path, running: Running) -> None:
    """Tell atelet what this worker hosts (in the background; it never stops serving)."""
    from substrate_gpu.service import capacity_report  # noqa: PLC0415  (as worker_api)

    metrics = running.service.metrics
    running.registration = capacity_report.Registration(
        on_change=metrics.atelet_registration if metrics is not None else None
    )
    await capacity_report.report(
        capacity_report.ReportConfig.of(config, socket), running.registration
    )


async def _stdin_then_maybe_stop(
    running: Running, source: BinaryIO, sink: BinaryIO, stop_at_eof: bool
) -> None:
    await serve_lines(running.service, source, sink)
    if stop_at_eof:
        running.stop.set()


async def _watch_signals(stop: anyio.Event) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("signal received", signal=signal.Signals(signum).name)
            stop.set()
            return
