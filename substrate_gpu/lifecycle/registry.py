"""The effect registry: every fact about an effect, in one typed entry per effect.

An in-flight state of ``machines/actor.yaml`` names the effect it starts; everything the
rest of the code needs to know about that effect lives here, once:

- ``outcomes``: the event types it can produce, each with the kind of ending it is (the
  metric ``outcome`` label); the machine loader checks the effect's state accepts them all;
- ``failure``: the outcome for an effect that could not finish (a collaborator's bug in
  the pipeline, or an unreadable runtime in recovery);
- ``success``: the outcome recovery reports when the runtime proves the effect completed;
- ``timeout``: the default bound the pipeline runs it under;
- ``metric_label`` and ``histogram``: how :class:`~substrate_gpu.observability.metrics.AgentMetrics`
  records its duration;
- ``recovery``: what a restarted agent does with an actor left mid-effect
  (:mod:`substrate_gpu.eventlog.recovery` interprets it).

The tables other modules used to copy by hand (effects' outcomes and timeouts, recovery's
failure outcomes, the metrics bridge's label maps) are computed from :data:`REGISTRY`.
``load_spec`` refuses a machine whose effects differ from the registry's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, Literal

from substrate_gpu.lifecycle import events
from substrate_gpu.lifecycle.actors import ActorView
from substrate_gpu.lifecycle.names import Effect

#: What ``runsc state`` said about an actor's container (``unknown``: it could not be read).
RuntimeStatus = Literal["creating", "created", "running", "paused", "stopped", "missing", "unknown"]


class Ending(StrEnum):
    """How an outcome ends its effect (the metrics' ``outcome`` label)."""

    OK = "ok"
    REFUSED = "refused"
    ERROR = "error"
    TIMEOUT = "timeout"


class Histogram(StrEnum):
    """Which duration histogram suits the effect's time scale."""

    INJECTION = "injection"
    """Milliseconds: file edits and /proc reads."""
    RUNTIME = "runtime"
    """Seconds to minutes: runsc and cuda-checkpoint."""


class RecoveryAction(StrEnum):
    """What recovery does with an actor found mid-effect, given what the runtime said."""

    RERUN = "rerun"
    """Run the effect again (idempotent, or provably had no effect)."""
    SUCCEEDED = "succeeded"
    """The runtime shows the effect completed: accept its ``success`` outcome."""
    FAILED = "failed"
    """Accept the effect's ``failure`` outcome."""
    SANDBOX_RUNS = "sandbox_runs"
    """A checkpoint that did not finish while the sandbox still runs: failed, survived."""
    IMAGE_IF_WHOLE = "image_if_whole"
    """The sandbox is gone: the checkpoint image is the state if whole, else failed."""
    INTERRUPTED = "interrupted"
    """Nothing to ask that would tell: ``effect_timed_out`` (failed, recoverable by retry)."""
    FOLLOWED = "followed"
    """The effect completed and so did the one its outcome starts (``RecoveryRule.then``):
    its outcome is one the pipeline does not wait for (``EffectSpec.rederived``), so the next
    effect may have run before it was durable. Both ``success`` outcomes are accepted, in
    order, and the next effect is not run again."""


@dataclass(frozen=True)
class RecoveryRule:
    """How :func:`substrate_gpu.eventlog.recovery.decide` reconciles one effect."""

    asks_runtime: bool
    """Ask ``runsc state`` first (False: ``otherwise`` applies, nothing is asked)."""
    otherwise: RecoveryAction
    """The action for a status not in ``by_status`` (an unreadable state is always FAILED)."""
    by_status: Mapping[RuntimeStatus, RecoveryAction] = field(default_factory=dict)
    """Actions for particular runtime statuses."""
    deletes_leftover: bool = False
    """On a FAILED or IMAGE_IF_WHOLE decision, ``runsc delete --force`` an existing container
    first (what the effect itself does when it fails)."""
    why: str = ""
    """Why the rule is safe (the report line's reason for a rerun)."""
    then: Effect | None = None
    """For FOLLOWED: the effect this one's success outcome starts."""

    def action(self, status: RuntimeStatus) -> RecoveryAction:
        """The action for ``status``."""
        if status == "unknown":
            return RecoveryAction.FAILED
        return self.by_status.get(status, self.otherwise)


_ALIVE: Final[tuple[RuntimeStatus, ...]] = ("running", "paused")


def _alive(action: RecoveryAction) -> dict[RuntimeStatus, RecoveryAction]:
    return dict.fromkeys(_ALIVE, action)


@dataclass(frozen=True)
class EffectSpec:
    """Everything known about one effect (see the module doc)."""

    name: Effect
    outcomes: Mapping[str, Ending]
    """Every outcome event type it can produce (``effect_timed_out`` included)."""
    failure: Callable[[ActorView, str], events.Event]
    """The failure outcome, given the actor and a message."""
    timeout: float
    """Default timeout, seconds."""
    metric_label: str
    """The ``effect`` label of its duration in AgentMetrics."""
    histogram: Histogram
    recovery: RecoveryRule
    success: Callable[[ActorView], events.Event] | None = None
    """The outcome of a completed effect, when recovery can establish one."""
    rederived: frozenset[str] = frozenset()
    """Outcomes the pipeline does not wait to be durable before going on: lost in a crash,
    recovery derives each again from what the runtime shows (``check_registry`` holds the
    rule to it; docs/event-log.md, "When an event is durable")."""


def _restored(view: ActorView) -> events.Event:
    # The checkpoint's CUDA pids say the image holds exec-route CUDA state to resume.
    route = events.ROUTE_EXEC if view.checkpoint_cuda_pids else ""
    return events.Restored(
        actor_id=view.actor_id, image_path=view.checkpoint or "", cuda_route=route
    )


_TIMED_OUT: Final = {events.EffectTimedOut.type: Ending.TIMEOUT}

#: The registry: one entry per effect of ``machines/actor.yaml``.
REGISTRY: Final[Mapping[str, EffectSpec]] = {
    spec.name: spec
    for spec in (
        EffectSpec(
            name=Effect.ALLOCATE,
            outcomes={
                events.GpusAllocated.type: Ending.OK,
                events.GpusUnavailable.type: Ending.REFUSED,
                events.GpusRefused.type: Ending.REFUSED,
                **_TIMED_OUT,
            },
            failure=lambda a, m: events.GpusRefused(actor_id=a.actor_id, message=m),
            # A pure decision over the allocation table: microseconds.
            timeout=10.0,
            metric_label="allocate_gpu",
            histogram=Histogram.INJECTION,
            recovery=RecoveryRule(
                asks_runtime=False,
                otherwise=RecoveryAction.RERUN,
                why="the decision is pure: nothing outside the log happened",
            ),
        ),
        EffectSpec(
            name=Effect.INJECT,
            outcomes={
                events.GpuInjected.type: Ending.OK,
                events.InjectionFailed.type: Ending.ERROR,
                **_TIMED_OUT,
            },
            failure=lambda a, m: events.InjectionFailed(actor_id=a.actor_id, message=m),
            # Injection is local file work.
            timeout=60.0,
            metric_label="inject_gpu",
            histogram=Histogram.INJECTION,
            recovery=RecoveryRule(
                asks_runtime=False, otherwise=RecoveryAction.RERUN, why="injection is idempotent"
            ),
        ),
        EffectSpec(
            name=Effect.CREATE,
            outcomes={
                events.SandboxCreated.type: Ending.OK,
                events.EffectFailed.type: Ending.ERROR,
                events.PreflightRefused.type: Ending.REFUSED,
                **_TIMED_OUT,
            },
            failure=lambda a, m: events.EffectFailed(
                actor_id=a.actor_id, effect=Effect.CREATE, message=m
            ),
            timeout=60.0,
            metric_label="runsc_create",
            histogram=Histogram.RUNTIME,
            recovery=RecoveryRule(
                asks_runtime=True,
                otherwise=RecoveryAction.FAILED,
                # Running: start ran too, before sandbox_created was durable (rederived).
                by_status={"created": RecoveryAction.SUCCEEDED, **_alive(RecoveryAction.FOLLOWED)},
                deletes_leftover=True,
                then=Effect.START,
            ),
            success=lambda a: events.SandboxCreated(actor_id=a.actor_id),
            # Start acts on it at once; its own outcome's fsync makes both durable.
            rederived=frozenset({events.SandboxCreated.type}),
        ),
        EffectSpec(
            name=Effect.START,
            outcomes={
                events.SandboxStarted.type: Ending.OK,
                events.EffectFailed.type: Ending.ERROR,
                **_TIMED_OUT,
            },
            failure=lambda a, m: events.EffectFailed(
                actor_id=a.actor_id, effect=Effect.START, message=m
            ),
            timeout=30.0,
            metric_label="runsc_start",
            histogram=Histogram.RUNTIME,
            recovery=RecoveryRule(
                asks_runtime=True,
                otherwise=RecoveryAction.FAILED,
                by_status={**_alive(RecoveryAction.SUCCEEDED), "created": RecoveryAction.RERUN},
                # A part-started sandbox (_pause and app running, side created) is no
                # actor's state and may hold GPUs: deleted before the actor fails.
                deletes_leftover=True,
                why="the container is created, not started",
            ),
            success=lambda a: events.SandboxStarted(actor_id=a.actor_id),
        ),
        EffectSpec(
            name=Effect.VERIFY,
            outcomes={
                events.GpusVerified.type: Ending.OK,
                events.GpuVerificationFailed.type: Ending.ERROR,
                **_TIMED_OUT,
            },
            failure=lambda a, m: events.GpuVerificationFailed(actor_id=a.actor_id, message=m),
            # nvidia-smi -L and one cuda-checkpoint --get-state per CUDA process, via exec.
            timeout=120.0,
            metric_label="verify_gpus",
            histogram=Histogram.RUNTIME,
            recovery=RecoveryRule(
                asks_runtime=True,
                otherwise=RecoveryAction.FAILED,
                by_status=_alive(RecoveryAction.RERUN),
                deletes_leftover=True,
                why="verifying only reads the sandbox (nvidia-smi -L, cuda-checkpoint --get-state)",
            ),
        ),
        EffectSpec(
            name=Effect.PROBE,
            outcomes={
                events.NoLiveContext.type: Ending.OK,
                events.LiveContextFound.type: Ending.OK,
                events.CheckpointRefused.type: Ending.REFUSED,
                events.CheckpointFailed.type: Ending.ERROR,
                **_TIMED_OUT,
            },
            # Unknown whether the sandbox survived: assume not, so the actor is recoverable
            # from its last good checkpoint rather than believed running.
            failure=lambda a, m: events.CheckpointFailed(
                actor_id=a.actor_id, message=m, sandbox_survived=False
            ),
            timeout=60.0,
            metric_label="probe_cuda_context",
            histogram=Histogram.INJECTION,
            recovery=RecoveryRule(
                asks_runtime=False,
                otherwise=RecoveryAction.RERUN,
                why="probing for CUDA contexts only reads /proc",
            ),
        ),
        EffectSpec(
            name=Effect.CUDA_SUSPEND,
            outcomes={
                events.CudaSuspended.type: Ending.OK,
                events.CudaSuspendRefused.type: Ending.REFUSED,
                events.CudaSuspendFailed.type: Ending.ERROR,
                **_TIMED_OUT,
            },
            # Resume every process that may have been touched.
            failure=lambda a, m: events.CudaSuspendFailed(
                actor_id=a.actor_id, message=m, pids=a.cuda_pids
            ),
            timeout=600.0,
            metric_label="cuda_suspend",
            histogram=Histogram.RUNTIME,
            # Which processes were locked or checkpointed is not in the log: the actor fails
            # recoverably, and a retry replaces the sandbox.
            recovery=RecoveryRule(asks_runtime=False, otherwise=RecoveryAction.INTERRUPTED),
        ),
        EffectSpec(
            name=Effect.CHECKPOINT,
            outcomes={
                events.CheckpointWritten.type: Ending.OK,
                events.CheckpointRefused.type: Ending.REFUSED,
                events.CheckpointFailed.type: Ending.ERROR,
                **_TIMED_OUT,
            },
            failure=lambda a, m: events.CheckpointFailed(
                actor_id=a.actor_id, message=m, sandbox_survived=False
            ),
            # runsc checkpoint moves the whole sandbox memory.
            timeout=600.0,
            metric_label="runsc_checkpoint",
            histogram=Histogram.RUNTIME,
            recovery=RecoveryRule(
                asks_runtime=True,
                otherwise=RecoveryAction.IMAGE_IF_WHOLE,
                by_status=_alive(RecoveryAction.SANDBOX_RUNS),
                deletes_leftover=True,
            ),
            # The effect deleted the sandbox after writing the image: gone, image whole.
            rederived=frozenset({events.CheckpointWritten.type}),
        ),
        EffectSpec(
            name=Effect.CUDA_RESUME,
            outcomes={
                events.CudaResumed.type: Ending.OK,
                events.CudaResumeFailed.type: Ending.ERROR,
                **_TIMED_OUT,
            },
            failure=lambda a, m: events.CudaResumeFailed(
                actor_id=a.actor_id, message=m, sandbox_survived=False
            ),
            timeout=600.0,
            metric_label="cuda_resume",
            histogram=Histogram.RUNTIME,
            recovery=RecoveryRule(
                asks_runtime=True,
                otherwise=RecoveryAction.FAILED,
                by_status=_alive(RecoveryAction.RERUN),
                deletes_leftover=True,
                why="resuming CUDA processes is idempotent (each one's state is asked)",
            ),
        ),
        EffectSpec(
            name=Effect.RESTORE,
            outcomes={
                events.Restored.type: Ending.OK,
                events.RestoreFailed.type: Ending.ERROR,
                events.RestoreRefused.type: Ending.REFUSED,
                # Failed, and what it made may still run (not deleted): failed, GPUs kept.
                events.EffectFailed.type: Ending.ERROR,
                **_TIMED_OUT,
            },
            failure=lambda a, m: events.RestoreFailed(actor_id=a.actor_id, message=m),
            timeout=600.0,
            metric_label="runsc_restore",
            histogram=Histogram.RUNTIME,
            recovery=RecoveryRule(
                asks_runtime=True,
                otherwise=RecoveryAction.FAILED,
                by_status=_alive(RecoveryAction.SUCCEEDED),
                deletes_leftover=True,
            ),
            success=_restored,
        ),
        EffectSpec(
            name=Effect.DELETE,
            outcomes={
                events.Deleted.type: Ending.OK,
                events.EffectFailed.type: Ending.ERROR,
                **_TIMED_OUT,
            },
            failure=lambda a, m: events.EffectFailed(
                actor_id=a.actor_id, effect=Effect.DELETE, message=m
            ),
            timeout=60.0,
            metric_label="runsc_delete",
            histogram=Histogram.RUNTIME,
            recovery=RecoveryRule(
                asks_runtime=True,
                otherwise=RecoveryAction.RERUN,
                by_status={"missing": RecoveryAction.SUCCEEDED},
                why="deleting is idempotent",
            ),
            success=lambda a: events.Deleted(actor_id=a.actor_id),
        ),
    )
}


def check_registry() -> list[str]:
    """Internal consistency of :data:`REGISTRY` (problems, empty when none).

    The failure and success outcomes must be among the effect's outcomes, and every
    outcome must name an event produced by an effect, so each lands on a transition the
    loader has checked.
    """
    problems: list[str] = []
    sample = ActorView(
        actor_id="x", state="x", gpu=False, bundle="", checkpoint=None, live_contexts=0,
        sandbox=False, reason=None,
    )  # fmt: skip
    for name, spec in REGISTRY.items():
        if name != spec.name:
            problems.append(f"entry {name!r} describes effect {spec.name!r}")
        failure = spec.failure(sample, "m").type
        if failure not in spec.outcomes:
            problems.append(f"effect {name}: its failure outcome {failure!r} is not an outcome")
        if spec.success is not None and spec.success(sample).type not in spec.outcomes:
            problems.append(f"effect {name}: its success outcome is not one of its outcomes")
        for outcome in spec.outcomes:
            cls = events.REGISTRY.get(outcome)
            if cls is None or cls.external:
                problems.append(f"effect {name}: {outcome!r} is not an outcome event type")
        problems.extend(_rederivation_problems(spec, sample))
    return problems


def _rederivation_problems(spec: EffectSpec, sample: ActorView) -> list[str]:
    """A ``rederived`` outcome must be one recovery derives again from the runtime: the
    effect's ``success`` (some status SUCCEEDED), or ``checkpoint_written`` (IMAGE_IF_WHOLE);
    a FOLLOWED rule needs ``then``, an effect with a success outcome."""
    rule = spec.recovery
    actions = {rule.otherwise, *rule.by_status.values()}
    derived: set[str] = set()
    if spec.success is not None and actions & {RecoveryAction.SUCCEEDED, RecoveryAction.FOLLOWED}:
        derived.add(spec.success(sample).type)
    if RecoveryAction.IMAGE_IF_WHOLE in actions:
        derived.add(events.CheckpointWritten.type)
    problems = [
        f"effect {spec.name}: {outcome!r} is rederived but recovery never derives it"
        for outcome in sorted(spec.rederived - derived)
    ]
    if RecoveryAction.FOLLOWED in actions:
        following = REGISTRY.get(rule.then) if rule.then is not None else None
        if following is None or following.success is None or not rule.asks_runtime:
            problems.append(
                f"effect {spec.name}: FOLLOWED needs then= an effect with a success outcome"
            )
    return problems


def outcomes(effect: str) -> tuple[str, ...]:
    """The outcome event types ``effect`` can produce."""
    return tuple(REGISTRY[effect].outcomes)


#: Outcomes the pipeline does not wait to be durable before going on (``rederived``).
REDERIVED: Final = frozenset(o for s in REGISTRY.values() for o in s.rederived)
#: Effect -> default timeout, seconds.
DEFAULT_TIMEOUTS: Final[Mapping[str, float]] = {e: s.timeout for e, s in REGISTRY.items()}
#: Effect -> the AgentMetrics ``effect`` label of its duration.
METRIC_LABELS: Final[Mapping[str, str]] = {e: s.metric_label for e, s in REGISTRY.items()}
#: (effect, outcome event type) -> the AgentMetrics ``outcome`` label.
ENDINGS: Final[Mapping[tuple[str, str], str]] = {
    (e, o): ending for e, s in REGISTRY.items() for o, ending in s.outcomes.items()
}
#: AgentMetrics effect labels timed in millisecond buckets, and in second buckets.
INJECTION_LABELS: Final = frozenset(
    s.metric_label for s in REGISTRY.values() if s.histogram is Histogram.INJECTION
)
RUNTIME_LABELS: Final = frozenset(
    s.metric_label for s in REGISTRY.values() if s.histogram is Histogram.RUNTIME
)


def failure_outcome(effect: str, actor: ActorView, message: str) -> events.Event:
    """The failure outcome of ``effect`` (registry's ``failure``); a newer machine's unknown
    effect gets ``effect_timed_out``, the one outcome every in-flight state accepts."""
    spec = REGISTRY.get(effect)
    if spec is None:
        return events.EffectTimedOut(actor_id=actor.actor_id, effect=effect, seconds=0.0)
    return spec.failure(actor, message)
