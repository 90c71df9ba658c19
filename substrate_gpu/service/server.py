"""The standalone agent process: the Agent, its log, metrics and health, and its doors
(the JSON lines of :mod:`.lines`, answered by :mod:`.door`; the worker API of
:mod:`.worker_api`), started and stopped together.

Design decisions:

- **Shutdown drains.** SIGTERM/SIGINT stop reading (the listener closes, the socket file is
  removed, pending reads are cancelled) but a line already read is still handled and
  answered (shielded); then running effects get ``drain_timeout`` seconds to finish, the
  Agent closes (effects still running are cancelled: their actors stay in flight, for
  recovery to reconcile), and the event log is closed last.
- **Health on the metrics port.** ``/healthz`` and ``/readyz`` (:mod:`.health`) are served
  from the moment the log is locked, before recovery: a probe sees ``recovery: running``,
  not a refused connection. SIGTERM turns readiness off before the drain begins.
- **The worker's GPUs are learnt before serving** (:func:`wiring.gpu_discovery`, after the
  log is recovered): the allocator is built from the CDI spec and rebuilt from the resumed
  actors, so no GPU actor is served before the table is the log's (docs/gpu-injection.md).
- **One agent per log.** The log is locked (:func:`eventlog.lock`) before recovery reads it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import anyio
import anyio.to_thread

from substrate_gpu import eventlog, exceptions
from substrate_gpu._log import get_logger
from substrate_gpu.lifecycle import Agent, allocation, events, machine
from substrate_gpu.lifecycle.effects import GpuInjector
from substrate_gpu.observability.http import MetricsServer
from substrate_gpu.observability.registry import AgentRegistry
from substrate_gpu.probes.api import CudaContextProbe
from substrate_gpu.runsc import driver
from substrate_gpu.runsc.api import SandboxRuntime
from substrate_gpu.service import actor_log, recovery, wiring
from substrate_gpu.service import health as health_
from substrate_gpu.service.config import AgentConfig
from substrate_gpu.service.door import AgentService
from substrate_gpu.service.lines import ClientLimits, claim_socket_path, serve_lines, serve_socket

if TYPE_CHECKING:
    from substrate_gpu.service import capacity_report

log = get_logger(__name__)


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
        claim_socket_path(config.socket)
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
            from substrate_gpu.service import worker_api, worker_grpc  # noqa: PLC0415

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
                worker_grpc.serving(
                    worker,
                    config.worker_socket,
                    claim_socket_path,
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
                    worker_grpc.watch_connections, config.worker_socket, config.max_worker_clients
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
