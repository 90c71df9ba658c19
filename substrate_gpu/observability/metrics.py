"""The node agent's Prometheus metrics: one object, one injected registry.

Design decisions:

- **Injected registry.** :class:`AgentMetrics` registers its collectors in the
  :class:`~prometheus_client.CollectorRegistry` it is given; nothing is registered at import
  and the process-global ``REGISTRY`` is never touched, so two agents (or two tests) in one
  process never collide.
- **Bounded label values.** Every label value is checked against a known, finite set and
  mapped to ``"other"`` when unknown, so a typo or an unexpected runtime string can never
  create an unbounded number of series. An actor id is never a label value: methods accept
  an optional ``actor_id`` that becomes an *exemplar* (visible only in OpenMetrics output),
  a pointer from an interesting sample to one actor.
- **Actors by state are read at scrape time.** The lifecycle keeps per-state counts
  incrementally; :class:`AgentMetrics` asks for them (a ``Mapping[str, int]``) when scraped,
  through a custom collector, so a scrape costs O(states) whatever the number of actors.
- **Buckets that suit each effect.** GPU injection is file work measured in milliseconds;
  runsc operations (create, restore, checkpoint) take seconds. They are two histograms,
  ``substrate_gpu_injection_duration_seconds`` and
  ``substrate_gpu_runtime_operation_duration_seconds``; :meth:`AgentMetrics.effect_finished`
  routes by effect name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from substrate_gpu import _version
from substrate_gpu.lifecycle import events, machine, names, registry
from substrate_gpu.observability import health

__all__ = [
    "ACTOR_STATES",
    "ATELET_REGISTRATION_STATES",
    "CHECKPOINT_FAILURE_REASONS",
    "CHECKPOINT_REFUSAL_REASONS",
    "CONNECTION_CLOSE_REASONS",
    "EVENT_REJECTION_REASONS",
    "INJECTION_EFFECTS",
    "INJECTION_HOOKS",
    "OTHER",
    "OUTCOMES",
    "RUNTIME_EFFECTS",
    "TRIGGERS",
    "AgentMetrics",
]

OTHER: Final = "other"
"""The label value every unknown input is mapped to."""

ACTOR_STATES: Final[frozenset[str]] = frozenset(names.State)
"""Default lifecycle states: the machine's (``names.State``, checked against
``machines/actor.yaml`` when it loads); the agent passes its spec's own list via ``states=``.

The transitional ("in flight") states are the machine's states with an effect
(``MachineSpec.in_flight_states``); ``substrate_gpu_actors`` carries that fact as its
``in_flight`` label, so ``metrics/rules/substrate-gpu.yml`` selects ``in_flight="true"`` and
names no state: a state added to the machine needs no edit there.
"""

TRIGGERS: Final[frozenset[str]] = frozenset(events.REGISTRY)
"""Default trigger names: the event types (``load_spec`` checks each is one of the machine's
triggers, and each trigger an event type); the agent passes its spec's own."""

OUTCOMES: Final[frozenset[str]] = frozenset(registry.Ending) | {"cancelled"}
"""How an effect (or a toolkit run) ended: the effect registry's endings, and cancelled."""

INJECTION_EFFECTS: Final[frozenset[str]] = registry.INJECTION_LABELS | {
    "prepare_bundle",
    "stage_soname_links",
}
"""Effects timed in ``substrate_gpu_injection_duration_seconds`` (millisecond buckets): the
registry's millisecond-scale effects, plus bundle preparation and SONAME staging."""

RUNTIME_EFFECTS: Final[frozenset[str]] = registry.RUNTIME_LABELS | {
    "runsc_state",
    "runsc_kill",
    "cuda_checkpoint",
}
"""Effects timed in ``substrate_gpu_runtime_operation_duration_seconds`` (second buckets):
the registry's runtime effects, plus runsc state/kill and single cuda-checkpoint calls.

An effect name in neither set is recorded here as ``effect="other"``: the wide buckets
cover both scales, coarsely.
"""

CHECKPOINT_REFUSAL_REASONS: Final[frozenset[str]] = frozenset(
    {
        "live_cuda_context",
        "probe_failed",
        "cuda_checkpoint_unavailable",
        "not_running",
        # GPU-aware suspend (docs/gpu-suspend.md): the pool's policy, a CUDA lock timeout, a
        # suspend the exec'd cuda-checkpoint refused, and the driver preflight's codes.
        "suspend_policy",
        "cuda_lock_timeout",
        "cuda_suspend_refused",
        "driver-unreadable",
        "driver-mismatch",
        "driver-unsupported",
        "driver-too-old",
        "restore-other-driver",
        "restore-fewer-gpus",
        "restore-cpu-features",
        "restore-other-sandbox",
        "restore-gpu-remap",
        "restore-gpu-memory",
    }
)
"""Why the agent refused to checkpoint an actor (before calling runsc)."""

CHECKPOINT_FAILURE_REASONS: Final[frozenset[str]] = frozenset(
    {
        "live_nvproxy_clients",
        "object_not_restorable",
        "container_stopped",
        "timeout",
        "runtime_error",
    }
)
"""Why runsc itself failed a checkpoint the agent attempted (brief §5's messages)."""

INJECTION_HOOKS: Final[frozenset[str]] = frozenset(
    {
        "update-ldcache",
        "disable-device-node-modification",
        "update-application-profile",
        "chmod",
        "create-symlinks",
        "enable-cuda-compat",
        "cudacompat",
    }
)
"""OCI hook subcommands nvidia-ctk is known to emit (brief §3.6)."""

EVENT_REJECTION_REASONS: Final[frozenset[str]] = frozenset(
    {
        "invalid_in_state",
        "unknown_actor",
        "malformed",
        "schema",
        "duplicate",
        "queue_full",
        "log_unavailable",
    }
)
"""Why the agent refused an incoming event."""

CONNECTION_CLOSE_REASONS: Final[frozenset[str]] = frozenset(
    {"max_clients", "idle_timeout", "line_timeout", "send_timeout", "too_long"}
)
"""Why the agent hung up on a client (docs/agent.md, "Limits")."""

ATELET_REGISTRATION_STATES: Final[tuple[str, ...]] = ("off", "reporting", "registered", "stopped")
"""Where the capacity report to atelet stands (docs/worker-api.md, "Registering with atelet"):
not sent, sent and being retried, accepted, given up on a misconfiguration."""

# Buckets. Injection edits a config.json and stats a few device nodes: 0.5 ms .. 2.5 s.
_INJECTION_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
# runsc create/restore of a GPU sandbox takes seconds; a checkpoint of a large one, minutes.
_RUNTIME_BUCKETS: Final = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
# nvidia-ctk cdi generate: typically 0.2-3 s; the timeout bounds it.
_TOOLKIT_BUCKETS: Final = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# An event-log append waits for its group's fsync: 0.1 ms on tmpfs .. 1 s on a sick disk.
_APPEND_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)
_BATCH_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_PRECREATED_OUTCOMES: Final = ("ok", "error", "timeout")
_DEVICE_BUCKETS: Final = (0, 1, 2, 3, 4, 6, 8, 12, 16)

# OpenMetrics caps an exemplar's labels at 128 UTF-8 characters, names included.
_EXEMPLAR_MAX_CHARS: Final = 128
_EXEMPLAR_KEY: Final = "actor_id"


def _bounded(value: str, allowed: frozenset[str]) -> str:
    """``value`` when it is in ``allowed``, else ``"other"``: label cardinality stays bounded."""
    return value if value in allowed else OTHER


def _exemplar(actor_id: str | None) -> dict[str, str] | None:
    """An exemplar pointing at one actor, or None when there is none (or it is too long).

    A too-long id is dropped rather than truncated: a truncated id would point at nothing.
    """
    if not actor_id:
        return None
    if len(_EXEMPLAR_KEY) + len(actor_id.encode()) > _EXEMPLAR_MAX_CHARS:
        return None
    return {_EXEMPLAR_KEY: actor_id}


class _ActorStateCollector(Collector):
    """``substrate_gpu_actors{state, in_flight}``, read from the lifecycle's counts at scrape
    time.

    Every known state is always exported (0 when empty) so alert expressions see a stable set
    of series; counts for unknown states are summed under ``state="other"``. ``in_flight``
    is ``"true"`` for the states that run an effect, ``"false"`` otherwise (``other``
    included): a function of ``state``, so it adds no series.
    """

    _NAME: Final = "substrate_gpu_actors"
    _HELP: Final = "Actors known to the agent, by lifecycle state."

    _LABELS: Final = ("state", "in_flight")

    def __init__(
        self,
        counts: Callable[[], Mapping[str, int]],
        states: frozenset[str],
        in_flight: frozenset[str],
    ) -> None:
        self._counts = counts
        self._states = tuple(sorted(states))
        self._known = states
        self._flag = {state: "true" if state in in_flight else "false" for state in states}

    def describe(self) -> Iterable[Metric]:
        # Describing without samples keeps registration from calling the lifecycle.
        return [GaugeMetricFamily(self._NAME, self._HELP, labels=self._LABELS)]

    def collect(self) -> Iterable[Metric]:
        totals = dict.fromkeys(self._states, 0)
        other = 0
        # The scrape runs in the HTTP server's thread while the lifecycle updates its counts
        # on the event loop: dict() of a dict is one C-level copy under the GIL, so the loop
        # below never sees the mapping change size under it.
        for state, count in dict(self._counts()).items():
            if state in self._known:
                totals[state] += count
            else:
                other += count
        family = GaugeMetricFamily(self._NAME, self._HELP, labels=self._LABELS)
        for state, count in totals.items():
            family.add_metric([state, self._flag[state]], count)
        if other:
            family.add_metric([OTHER, "false"], other)
        return [family]


class _ReadinessCollector(Collector):
    """``substrate_gpu_agent_ready{check}``: each ``/readyz`` check, 1 passing, 0 failing.

    Read from the health source at scrape time; every check is exported, so
    ``min(substrate_gpu_agent_ready) == 0`` is "not ready" whatever the cause.
    """

    _NAME: Final = "substrate_gpu_agent_ready"
    _HELP: Final = "1 while the readiness check passes (GET /readyz), 0 while it fails."

    def __init__(self, readiness: Callable[[], health.Report]) -> None:
        self._readiness = readiness

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(self._NAME, self._HELP, labels=["check"])]

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(self._NAME, self._HELP, labels=["check"])
        known = frozenset(health.Readiness)
        for check in self._readiness().checks:
            family.add_metric([check.name if check.name in known else OTHER], float(check.ok))
        return [family]


class AgentMetrics:
    """Every metric the node agent exports, registered in one injected registry.

    - ``actor_states`` returns the number of actors per lifecycle state (kept incrementally
      by the lifecycle). It is called once per scrape, from the metrics server's thread: it
      must be cheap and return a plain ``dict`` (or ``Counter``) or a snapshot.
    - ``queue_depth`` returns the number of events waiting in the pipeline; when given, it is
      read at scrape time and :meth:`queue_depth` calls are ignored.
    - ``states`` and ``triggers`` replace the default label sets (pass the machine's own);
      ``in_flight_states``, the states that run an effect, are labelled
      ``substrate_gpu_actors{in_flight="true"}`` (default: the default machine's, from
      ``machines/actor.yaml``; the agent passes its own spec's).
    - ``transitions`` lists the machine's ``(source, dest, trigger)`` triples so their
      counters exist at 0 from the start (alerts use ``increase()``, which misses a series'
      first increment).
    - ``version`` overrides the installed package version in ``substrate_gpu_build_info``.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        actor_states: Callable[[], Mapping[str, int]] | None = None,
        queue_depth: Callable[[], int] | None = None,
        states: Iterable[str] | None = None,
        in_flight_states: Iterable[str] | None = None,
        triggers: Iterable[str] | None = None,
        transitions: Iterable[tuple[str, str, str]] | None = None,
        version: str | None = None,
    ) -> None:
        self.registry = registry
        self._states = frozenset(states) if states is not None else ACTOR_STATES
        self._triggers = frozenset(triggers) if triggers is not None else TRIGGERS
        if actor_states is not None:
            if in_flight_states is None:
                in_flight_states = machine.load_spec().in_flight_states
            registry.register(
                _ActorStateCollector(actor_states, self._states, frozenset(in_flight_states))
            )

        self._build_info = Gauge(
            "substrate_gpu_build_info",
            "Always 1; the version label names the running substrate-gpu.",
            ["version"],
            registry=registry,
        )
        self._build_info.labels(version or _package_version()).set(1)

        self._transitions = Counter(
            "substrate_gpu_actor_transitions",
            "Lifecycle transitions, by source state, destination state and trigger.",
            ["from", "to", "trigger"],
            registry=registry,
        )
        self._checkpoint_refusals = Counter(
            "substrate_gpu_checkpoint_refusals",
            "Checkpoints the agent refused to attempt (e.g. a live CUDA context), by reason.",
            ["reason"],
            registry=registry,
        )
        self._checkpoint_failures = Counter(
            "substrate_gpu_checkpoint_failures",
            "Checkpoints runsc attempted and failed, by classified reason.",
            ["reason"],
            registry=registry,
        )
        self._injection_duration = Histogram(
            "substrate_gpu_injection_duration_seconds",
            "Duration of GPU-injection effects (bundle edits, SONAME links, probes).",
            ["effect", "outcome"],
            buckets=_INJECTION_BUCKETS,
            registry=registry,
        )
        self._runtime_duration = Histogram(
            "substrate_gpu_runtime_operation_duration_seconds",
            "Duration of container-runtime effects (runsc create/start/checkpoint/restore).",
            ["effect", "outcome"],
            buckets=_RUNTIME_BUCKETS,
            registry=registry,
        )
        self._devices = Histogram(
            "substrate_gpu_injected_devices",
            "GPU device nodes injected into one actor container.",
            buckets=_DEVICE_BUCKETS,
            registry=registry,
        )
        self._toolkit = Histogram(
            "substrate_gpu_toolkit_generation_duration_seconds",
            "Duration of nvidia-ctk cdi generate runs, by outcome.",
            ["outcome"],
            buckets=_TOOLKIT_BUCKETS,
            registry=registry,
        )
        self._append = Histogram(
            "substrate_gpu_event_log_append_duration_seconds",
            "Time from an event-log append to its fsync completing.",
            buckets=_APPEND_BUCKETS,
            registry=registry,
        )
        self._batch = Histogram(
            "substrate_gpu_event_log_fsync_batch_size",
            "Events made durable by one event-log fsync (group commit).",
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self._hooks_skipped = Counter(
            "substrate_gpu_injection_hooks_skipped",
            "CDI hooks dropped by the allowlist, by hook subcommand.",
            ["hook"],
            registry=registry,
        )
        self._events_rejected = Counter(
            "substrate_gpu_events_rejected",
            "Incoming events the agent refused, by reason.",
            ["reason"],
            registry=registry,
        )
        self._connections = Gauge(
            "substrate_gpu_connections",
            "Clients connected to the agent's socket now.",
            registry=registry,
        )
        self._connections_closed = Counter(
            "substrate_gpu_connections_closed",
            "Client connections the agent hung up on, by reason (limits and timeouts).",
            ["reason"],
            registry=registry,
        )
        self._accept_errors = Counter(
            "substrate_gpu_accept_errors",
            "accept() failures the agent backed off from (out of file descriptors, memory).",
            registry=registry,
        )
        self._event_log_usable = Gauge(
            "substrate_gpu_event_log_usable",
            "1 while the event log accepts appends; 0 once it failed (nothing is acknowledged).",
            registry=registry,
        )
        self._event_log_usable.set(1)
        self._queue_depth = Gauge(
            "substrate_gpu_event_queue_depth",
            "Events waiting in the agent's pipeline.",
            registry=registry,
        )
        self._gpus_allocated = Gauge(
            "substrate_gpu_gpus_allocated",
            "The worker's GPUs held by actors (the GPU allocator's table).",
            ["worker"],
            registry=registry,
        )
        self._gpus_free = Gauge(
            "substrate_gpu_gpus_free",
            "The worker's GPUs no actor holds.",
            ["worker"],
            registry=registry,
        )
        self._gpu_record_mismatches = Counter(
            "substrate_gpu_gpu_record_mismatches",
            "Actors found at recovery whose live sandbox has other GPUs injected than the "
            "event log says they hold (the injected ones are held).",
            ["worker"],
            registry=registry,
        )
        self._atelet_registration = Gauge(
            "substrate_gpu_atelet_registration",
            "1 for the state the worker's capacity report to atelet is in, 0 for the others.",
            ["state"],
            registry=registry,
        )
        self.atelet_registration("off")
        self._queue_depth_source = queue_depth
        if queue_depth is not None:
            self._queue_depth.set_function(lambda: float(queue_depth()))

        # Pre-create the series alerts take increase() of: a counter series born at 1 reads
        # as no increase at all, so the first failure would go unnoticed.
        for outcome in _PRECREATED_OUTCOMES:
            self._toolkit.labels(outcome)
            for effect in INJECTION_EFFECTS:
                self._injection_duration.labels(effect, outcome)
            for effect in RUNTIME_EFFECTS:
                self._runtime_duration.labels(effect, outcome)
        for reason in CHECKPOINT_REFUSAL_REASONS:
            self._checkpoint_refusals.labels(reason)
        for reason in CHECKPOINT_FAILURE_REASONS:
            self._checkpoint_failures.labels(reason)
        for reason in EVENT_REJECTION_REASONS:
            self._events_rejected.labels(reason)
        for reason in CONNECTION_CLOSE_REASONS:
            self._connections_closed.labels(reason)
        self._transition_children: dict[tuple[str, str, str], Counter] = {}
        for source, dest, trigger in transitions or ():
            self._transition_child(source, dest, trigger)

    def transition(
        self, source: str, dest: str, trigger: str, *, actor_id: str | None = None
    ) -> None:
        """Count one lifecycle transition ``source -> dest`` caused by ``trigger``."""
        self._transition_child(source, dest, trigger).inc(exemplar=_exemplar(actor_id))

    def _transition_child(self, source: str, dest: str, trigger: str) -> Counter:
        key = (source, dest, trigger)
        child = self._transition_children.get(key)
        if child is None:
            labels = (
                _bounded(source, self._states),
                _bounded(dest, self._states),
                _bounded(trigger, self._triggers),
            )
            child = self._transitions.labels(*labels)
            # The cache skips the label checks on the hot path; it holds only known
            # triples, so garbage input cannot grow it without bound.
            if OTHER not in labels:
                self._transition_children[key] = child
        return child

    def checkpoint_refused(self, reason: str, *, actor_id: str | None = None) -> None:
        """Count a checkpoint the agent refused to attempt (``live_cuda_context``, …)."""
        self._checkpoint_refusals.labels(_bounded(reason, CHECKPOINT_REFUSAL_REASONS)).inc(
            exemplar=_exemplar(actor_id)
        )

    def checkpoint_failed(self, reason: str, *, actor_id: str | None = None) -> None:
        """Count a checkpoint runsc attempted and failed (``live_nvproxy_clients``, …)."""
        self._checkpoint_failures.labels(_bounded(reason, CHECKPOINT_FAILURE_REASONS)).inc(
            exemplar=_exemplar(actor_id)
        )

    def effect_finished(
        self, effect: str, outcome: str, seconds: float, *, actor_id: str | None = None
    ) -> None:
        """Record one effect's duration, in the histogram whose buckets suit the effect."""
        outcome = _bounded(outcome, OUTCOMES)
        if effect in INJECTION_EFFECTS:
            histogram = self._injection_duration
        else:
            histogram = self._runtime_duration
            effect = _bounded(effect, RUNTIME_EFFECTS)
        histogram.labels(effect, outcome).observe(seconds, exemplar=_exemplar(actor_id))

    def devices_injected(self, count: int, *, actor_id: str | None = None) -> None:
        """Record how many GPU device nodes one actor container received."""
        self._devices.observe(count, exemplar=_exemplar(actor_id))

    def gpus_allocated(self, worker: str, allocated: int, free: int) -> None:
        """Set the worker's GPUs held by actors and free (no actor ids: bounded labels)."""
        self._gpus_allocated.labels(worker).set(allocated)
        self._gpus_free.labels(worker).set(free)

    def gpu_record_mismatch(self, worker: str) -> None:
        """One actor whose live sandbox's GPUs differ from its logged allocation."""
        self._gpu_record_mismatches.labels(worker).inc()

    def queue_depth(self, depth: int) -> None:
        """Set the pipeline's queue depth (ignored when a ``queue_depth`` source was given)."""
        if self._queue_depth_source is None:
            self._queue_depth.set(depth)

    def toolkit_generation(self, outcome: str, seconds: float) -> None:
        """Record one ``nvidia-ctk cdi generate`` run (``ok``, ``error``, ``timeout``)."""
        self._toolkit.labels(_bounded(outcome, OUTCOMES)).observe(seconds)

    def event_log_append(self, seconds: float, batch_size: int) -> None:
        """Record one durable event-log write: its latency and the fsync group's size."""
        self._append.observe(seconds)
        self._batch.observe(batch_size)

    def injection_hook_skipped(self, hook: str) -> None:
        """Count a CDI hook dropped by the allowlist, by its subcommand name."""
        self._hooks_skipped.labels(_bounded(hook, INJECTION_HOOKS)).inc()

    def event_rejected(self, reason: str, *, actor_id: str | None = None) -> None:
        """Count an incoming event the agent refused (``invalid_in_state``, ``malformed``, …)."""
        self._events_rejected.labels(_bounded(reason, EVENT_REJECTION_REASONS)).inc(
            exemplar=_exemplar(actor_id)
        )

    def connections(self, count: int) -> None:
        """Set how many clients are connected to the socket."""
        self._connections.set(count)

    def connection_closed(self, reason: str) -> None:
        """Count a client the agent hung up on (``max_clients``, ``idle_timeout``, …)."""
        self._connections_closed.labels(_bounded(reason, CONNECTION_CLOSE_REASONS)).inc()

    def accept_error(self) -> None:
        """Count an ``accept()`` failure the agent backed off from (EMFILE, ENOMEM, …)."""
        self._accept_errors.inc()

    def event_log_failed(self) -> None:
        """Mark the event log unusable: the agent acknowledges nothing more."""
        self._event_log_usable.set(0)

    def atelet_registration(self, state: str) -> None:
        """Say where the capacity report to atelet stands (one of
        :data:`ATELET_REGISTRATION_STATES`; another value is ``other``)."""
        current = _bounded(state, frozenset(ATELET_REGISTRATION_STATES))
        for name in ATELET_REGISTRATION_STATES:
            self._atelet_registration.labels(name).set(1 if name == current else 0)
        if current == OTHER:
            self._atelet_registration.labels(OTHER).set(1)

    def report_readiness(self, readiness: Callable[[], health.Report]) -> None:
        """Export ``substrate_gpu_agent_ready{check}`` from ``readiness`` (called per scrape,
        from the metrics server's thread: it must not block). Once per registry."""
        self.registry.register(_ReadinessCollector(readiness))


def _package_version() -> str:
    return _version.VERSION
