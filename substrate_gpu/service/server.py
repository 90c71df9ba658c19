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
- **A broken event log stops the agent** (exit 1): memory and log would disagree.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import anyio
import anyio.to_thread
import structlog
from anyio.abc import ByteStream, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

from substrate_gpu import exceptions
from substrate_gpu.lifecycle import Agent, errors, events, machine
from substrate_gpu.lifecycle.effects import GpuInjector
from substrate_gpu.observability import AgentMetrics, AgentRegistry, MetricsServer
from substrate_gpu.probes.api import CudaContextProbe
from substrate_gpu.runsc.api import SandboxRuntime
from substrate_gpu.service import protocol, query, recovery, wiring
from substrate_gpu.service.config import AgentConfig

log = structlog.get_logger(__name__)


class AgentService:
    """Turns request lines into submitted events and response lines (transport-free)."""

    def __init__(self, agent: Agent, metrics: AgentMetrics | None = None) -> None:
        self.agent = agent
        self._metrics = metrics
        self._answering: set[anyio.CancelScope] = set()
        self._grace_deadline: float | None = None

    async def submit(self, event: events.Event) -> bytes:
        """Submit ``event``; the response line (an ack, or the machine's refusal)."""
        try:
            transition = await self.agent.submit(event)
        except errors.InvalidEvent as e:
            return self.reject(protocol.classify_refusal(e, self.agent.spec), 0)
        return protocol.ack(wiring.SeqTap.seq_of_last_submit(), transition)

    async def handle_line(self, line: bytes, line_number: int) -> bytes | None:
        """The response to one request line; None for a blank line (ignored)."""
        if not line.strip():
            return None
        if len(line) > protocol.MAX_LINE_BYTES:
            return self.reject(too_long(), line_number)
        if query.is_query(line):
            return query.answer(self.agent, line, line_number)
        parsed = protocol.parse_request(line)
        if isinstance(parsed, protocol.RequestError):
            return self.reject(parsed, line_number)
        try:
            transition = await self.agent.submit(parsed)
        except errors.InvalidEvent as e:
            return self.reject(protocol.classify_refusal(e, self.agent.spec), line_number)
        return protocol.ack(wiring.SeqTap.seq_of_last_submit(), transition)

    def reject(self, error: protocol.RequestError, line_number: int) -> bytes:
        """Count and log a refused request; its response line."""
        if self._metrics is not None:
            self._metrics.event_rejected(protocol.REJECTION_REASONS.get(error.kind, "malformed"))
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
        "too_long", f"request line exceeds {protocol.MAX_LINE_BYTES} bytes"
    )


# --- transports ----------------------------------------------------------------------------


async def serve_stream(service: AgentService, stream: ByteStream) -> None:
    """Serve one connection until the client closes it (or the intake is cancelled)."""
    reader = BufferedByteReceiveStream(stream)
    number = 0
    async with stream:
        while True:
            try:
                line = await reader.receive_until(b"\n", protocol.MAX_LINE_BYTES)
            except anyio.DelimiterNotFound:
                # The rest of the line cannot be framed reliably: answer, then hang up.
                number += 1
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await stream.send(service.reject(too_long(), number))
                return
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
                return
            number += 1
            # A line read is a line answered, even while shutting down (within the grace).
            with service.answering():
                response = await service.handle_line(line, number)
                if response is not None:
                    try:
                        await stream.send(response)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        return


def _bind_private_socket(path: Path) -> None:
    """Remove a stale socket at ``path`` (never another kind of file)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise exceptions.ConfigError(
            f"while creating the agent socket {path}: a non-socket file is in the way; "
            "remove it or choose another --socket"
        )
    path.unlink()


async def serve_socket(
    service: AgentService,
    path: Path,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Accept connections on the Unix socket ``path`` (mode 0600) until cancelled."""
    _bind_private_socket(path)
    # umask while binding: the socket is never reachable by others, not even briefly.
    old = os.umask(0o177)
    try:
        listener = await anyio.create_unix_listener(path)
    except OSError as e:
        raise exceptions.ConfigError(
            f"while creating the agent socket {path}: {e.strerror or e}; "
            "check the directory exists and is writable, or choose another --socket"
        ) from e
    finally:
        os.umask(old)
    path.chmod(0o600)
    try:
        async with listener:
            task_status.started()
            await listener.serve(lambda stream: serve_stream(service, stream))
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


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


@dataclass
class Running:
    """What a started agent exposes to its caller (tests, the demo)."""

    service: AgentService
    metrics_url: str | None
    recovered: recovery.Resumed | None
    stop: anyio.Event = field(default_factory=anyio.Event)
    """Set to shut the agent down (as SIGTERM does)."""


@dataclass(frozen=True)
class Components:
    """Overrides of the production collaborators (another runtime, probe or injector)."""

    runtime: SandboxRuntime
    probe: CudaContextProbe
    injector: GpuInjector


@contextlib.asynccontextmanager
async def running_agent(
    config: AgentConfig, components: Components | None = None
) -> AsyncIterator[Running]:
    """The agent serving (log open, recovered, metrics up) while inside; closed cleanly after.

    Transports are not started here (see :func:`run`), so tests can drive the service.
    """
    spec = machine.load_spec()
    registry = AgentRegistry()
    agents: list[Agent] = []
    metrics = wiring.agent_metrics(
        registry, spec, lambda: agents[0].state_counts() if agents else {}
    )
    if components is None:
        built = wiring.build_collaborators(config, metrics)
        components = Components(runtime=built.runtime, probe=built.probe, injector=built.injector)
    async with contextlib.AsyncExitStack() as stack:
        event_log, recovered = await recovery.open_log(
            config.event_log,
            runtime=components.runtime,
            checkpoint_root=config.checkpoint_root,
            metrics=metrics,
        )
        if event_log is not None:
            stack.push_async_callback(event_log.aclose)
        tap = wiring.SeqTap(event_log)
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
        url = None
        if config.metrics_port:
            server = await stack.enter_async_context(
                MetricsServer(registry, host=config.metrics_host, port=config.metrics_port)
            )
            url = server.url
        running = Running(service=AgentService(agent, metrics), metrics_url=url, recovered=resumed)
        try:
            yield running
        finally:
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


async def _serve(
    config: AgentConfig,
    components: Components | None,
    on_ready: Callable[[Running], None] | None,
) -> int:
    async with running_agent(config, components) as running:
        async with anyio.create_task_group() as intake:
            intake.start_soon(_watch_signals, running.stop)
            if config.socket is not None:
                await intake.start(serve_socket, running.service, config.socket)
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
                stdin=config.stdin,
                metrics=running.metrics_url,
                event_log=str(config.event_log) if config.event_log else None,
            )
            if on_ready is not None:
                on_ready(running)
            await running.stop.wait()
            running.service.begin_shutdown(config.drain_timeout)
            intake.cancel_scope.cancel()
        log.info("agent stopping: draining effects", timeout=config.drain_timeout)
    log.info("agent stopped")
    return 0


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
