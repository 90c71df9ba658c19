"""Building the agent's collaborators from an :class:`AgentConfig`.

The production pieces, exactly as the integration tests wire them: the runsc driver
(:class:`RunscDriver`), the fd-scanning CUDA probe, the worker's GPU injector generating its
CDI spec with nvidia-ctk once, how the worker's GPUs are learnt for the allocator
(:func:`gpu_discovery`), and :class:`AgentMetrics` in a registry of its own.

Two small adapters live here because they are the agent's business, not the lifecycle's:

- :class:`SeqTap` sits in front of the event log and remembers, per task, the ``seq`` of
  the event the task's ``submit`` just recorded, so an acknowledgement can say where the
  event sits in the log. (``Agent.submit`` returns the transition, not the stamped event.)
  It forwards refusals (``record_rejected``) too, so the log still records them.
- :class:`LifecycleMetricsBridge` translates the lifecycle's vocabulary (effect names such
  as ``create``, outcome event types such as ``sandbox_created``, refusal codes such as
  ``live_context_probed``) into :class:`AgentMetrics`' bounded label sets
  (``runsc_create``, ``ok``, ``live_cuda_context``), so nothing lands in ``"other"``.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from prometheus_client import CollectorRegistry

from substrate_gpu import cdi, exceptions
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.injection import devices, toolkit
from substrate_gpu.injection.injector import WorkerGpuInjector
from substrate_gpu.lifecycle import (
    allocation,
    errors,
    events,
    gpu,
    hooks,
    machine,
    pipeline,
    registry,
)
from substrate_gpu.observability.metrics import AgentMetrics
from substrate_gpu.probes.fd_scan import FdScanProbe
from substrate_gpu.runsc import driver
from substrate_gpu.service import actor_log
from substrate_gpu.service.config import AgentConfig

#: Lifecycle effect name -> AgentMetrics effect label (the effect registry's).
EFFECT_LABELS: Final[Mapping[str, str]] = registry.METRIC_LABELS

#: (effect, outcome event type) -> AgentMetrics outcome label (the effect registry's; an
#: outcome the registry does not list for the effect is ``error``).
OUTCOME_LABELS: Final[Mapping[tuple[str, str], str]] = registry.ENDINGS

#: Refusals the agent decided itself (a live context seen by the machine or the probe).
AGENT_REFUSALS: Final[Mapping[str, str]] = {
    events.REFUSED_LIVE_CONTEXT_OBSERVED: "live_cuda_context",
    events.REFUSED_LIVE_CONTEXT_PROBED: "live_cuda_context",
    events.REFUSED_SUSPEND_POLICY: "suspend_policy",
    events.REFUSED_CUDA_LOCK_TIMEOUT: "cuda_lock_timeout",
    events.REFUSED_CUDA_SUSPEND: "cuda_suspend_refused",
}

#: Refusals runsc itself made after the agent attempted the checkpoint.
RUNTIME_REFUSALS: Final[Mapping[str, str]] = {
    events.REFUSED_LIVE_NVPROXY_CLIENTS: "live_nvproxy_clients",
    events.REFUSED_NOT_RESTORABLE: "object_not_restorable",
}

_recorded_seq: contextvars.ContextVar[int] = contextvars.ContextVar("recorded_seq", default=0)


class LogRecorder(
    hooks.EventRecorder, pipeline.GroupCommitRecorder, pipeline.RejectionRecorder, Protocol
):
    """What :class:`SeqTap` forwards to: the event log (group commit, refusals)."""


class SeqTap:
    """An :class:`EventRecorder` (group-committing) that notes each recorded ``seq`` for
    the recording task."""

    def __init__(self, inner: LogRecorder | None) -> None:
        self._inner = inner
        self.last_seq = 0
        """The last seq recorded by any task."""

    async def record(self, event: events.Event) -> None:
        """Note the seq (synchronously), then hand the event to the real recorder."""
        self.append(event)
        await self.durable()

    def append(self, event: events.Event) -> None:
        """Note the seq, and take the event into the real recorder's order (synchronous)."""
        _recorded_seq.set(event.seq)
        self.last_seq = max(self.last_seq, event.seq)
        if self._inner is not None:
            self._inner.append(event)

    async def durable(self) -> None:
        """Once every event appended so far is durable."""
        if self._inner is not None:
            await self._inner.durable()

    async def record_rejected(self, event: events.Event, state: str, problem: str) -> None:
        """Forward a refusal to the real recorder when it logs refusals (the event log)."""
        if self._inner is not None:
            await self._inner.record_rejected(event, state, problem)

    @staticmethod
    def seq_of_last_submit() -> int:
        """The seq recorded by the calling task's most recent ``Agent.submit``."""
        return _recorded_seq.get()


class LifecycleMetricsBridge:
    """:class:`LifecycleMetrics` on top of :class:`AgentMetrics` (see the module doc)."""

    def __init__(self, metrics: AgentMetrics) -> None:
        self.metrics = metrics

    def transition(self, source: str, dest: str, trigger: str) -> None:
        self.metrics.transition(source, dest, trigger)

    def checkpoint_refused(self, reason: str) -> None:
        if reason in RUNTIME_REFUSALS:
            self.metrics.checkpoint_failed(RUNTIME_REFUSALS[reason])
        else:
            self.metrics.checkpoint_refused(AGENT_REFUSALS.get(reason, reason))

    def effect_finished(self, effect: str, outcome: str, seconds: float) -> None:
        label = OUTCOME_LABELS.get((effect, outcome), "error")
        self.metrics.effect_finished(EFFECT_LABELS.get(effect, effect), label, seconds)
        if outcome == "checkpoint_failed":
            self.metrics.checkpoint_failed("runtime_error")

    def devices_injected(self, count: int) -> None:
        self.metrics.devices_injected(count)

    def queue_depth(self, depth: int) -> None:
        self.metrics.queue_depth(depth)

    def gpus_allocated(self, worker: str, allocated: int, free: int) -> None:
        self.metrics.gpus_allocated(worker, allocated, free)

    def gpu_record_mismatch(self, worker: str) -> None:
        self.metrics.gpu_record_mismatch(worker)


def agent_metrics(
    registry: CollectorRegistry,
    spec: machine.MachineSpec,
    actor_states: Callable[[], Mapping[str, int]],
) -> AgentMetrics:
    """AgentMetrics labelled with ``spec``'s states, triggers and transitions (all at 0)."""
    triples = {
        (source, t.dest_from(source), t.trigger) for t in spec.transitions for source in t.sources
    }
    return AgentMetrics(
        registry,
        actor_states=actor_states,
        states=spec.state_names,
        in_flight_states=spec.in_flight_states,
        triggers={t.trigger for t in spec.transitions},
        transitions=sorted(triples),
    )


@dataclass(frozen=True)
class Collaborators:
    """What an Agent is built from."""

    runtime: driver.RunscDriver
    probe: FdScanProbe
    injector: WorkerGpuInjector


def gpu_settings(config: AgentConfig, runtime: object) -> gpu.GpuSettings | None:
    """Driver preflight and the GPU-aware suspend routes this node offers (docs/gpu-suspend.md).

    Only the runsc driver can answer ``nvproxy list-supported-drivers`` and ``exec``; with the
    demo's in-process runtime model (no root or runc) there are no GPU settings: no preflight,
    and a live context is refused.
    """
    if not isinstance(runtime, driver.RunscDriver):
        return None
    return gpu.GpuSettings(
        drivers=runtime,
        driver_root=config.driver_root,
        dev_root=config.dev_root,
        driver_preflight=config.driver_preflight,
        cuda_checkpoint_path=config.cuda_checkpoint,
        # nvidia-smi -L and cuda-checkpoint --get-state in started/restored GPU sandboxes.
        sandbox_exec=runtime,
        sandbox_tool=(
            gpu.exec_tool(runtime, config.sandbox_cuda_checkpoint)
            if config.sandbox_cuda_checkpoint
            else None
        ),
    )


def build_injector(config: AgentConfig, metrics: AgentMetrics | None = None) -> WorkerGpuInjector:
    """The worker's GPU injector: nvidia-ctk generation and injection options from ``config``."""
    env = {**os.environ, toolkit.ENV_DRIVER_ROOT: str(config.driver_root), **dict(config.extra_env)}
    generation = toolkit.ToolkitConfig.from_env(
        env, output_dir=config.cdi_output_dir, toolkit_dir=config.toolkit_dir
    )
    return WorkerGpuInjector(
        generator=toolkit.CdiSpecGenerator(generation, metrics=metrics),
        metrics=metrics,
        options=bundle_.InjectionOptions(
            driver_root=str(config.driver_root),
            dev_root=config.dev_root,
            toolkit_dir=config.toolkit_dir,
        ),
    )


def network_flags(sandbox_network: str | None) -> tuple[str, ...]:
    """The runsc global flag ``--sandbox-network`` stands for (docs/worker-api.md)."""
    if sandbox_network == "pod":
        return ("--network=host",)
    if sandbox_network == "none":
        return ("--network=none",)
    return ()


def build_collaborators(config: AgentConfig, metrics: AgentMetrics | None = None) -> Collaborators:
    """The production runsc driver, fd probe and GPU injector for ``config``."""
    runtime = driver.RunscDriver(
        driver.RunscConfig(
            root=config.runsc_root,
            runsc=config.runsc,
            global_flags=config.runsc_flags + network_flags(config.sandbox_network),
            # The worker API runs sandboxes as upstream's worker does (docs/worker-api.md),
            # each app container's output forwarded as JSON lines on stdout (stderr when
            # stdout carries the stdin door's answers).
            upstream_worker_flags=config.worker_socket is not None,
            container_output=actor_log.ActorLogs(fd=2 if config.stdin else 1)
            if config.worker_socket is not None
            else None,
        )
    )
    return Collaborators(
        runtime=runtime, probe=FdScanProbe(), injector=build_injector(config, metrics)
    )


def worker_name() -> str:
    """The worker's name for the GPU metrics: the host name (a worker pod's name)."""
    return os.uname().nodename


def gpu_discovery(config: AgentConfig, injector: WorkerGpuInjector) -> allocation.GpuDiscovery:
    """How the agent learns its worker's GPUs: from the CDI spec set it injects from.

    A worker without a GPU node (``/dev/nvidia[0-9]*`` under ``dev_root``) is a CPU-only
    worker: nvidia-ctk is not run and there is no spec, so GPU actors are refused with that
    reason. Otherwise the spec is generated (once; a failure is retried at the next GPU
    actor's allocation) and its whole GPUs are the worker's, in index order.
    """
    spec_path = config.cdi_output_dir / toolkit.SPEC_FILE_NAME

    async def discover() -> allocation.WorkerGpus:
        if not devices.has_gpu(config.dev_root):
            raise errors.AllocationError(
                f"no CDI spec: {config.dev_root / 'dev'} holds no nvidia[0-9]* device node "
                f"(a worker without GPUs), so nvidia-ctk did not generate {spec_path}"
            )
        try:
            spec_set = await injector.spec_set()
        except exceptions.SubstrateGpuError as e:
            raise errors.AllocationError(f"no CDI spec at {spec_path}: {e}") from e
        gpus = cdi.list_gpus(spec_set)
        if not gpus:
            raise errors.AllocationError(
                f"the CDI spec {spec_path} defines no whole GPU of kind {cdi.NVIDIA_GPU_KIND} "
                "(GPUs in MIG mode are not allocatable)"
            )
        return allocation.WorkerGpus.of(gpus, cdi.refused_devices(spec_set))

    return discover
