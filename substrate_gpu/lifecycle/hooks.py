"""What the lifecycle tells the outside world: transitions, recorded events, metrics.

Three seams, each a small Protocol so the event log (next layer) and the Prometheus
metrics (``substrate_gpu.observability.metrics``) plug in without the lifecycle importing
them:

- :class:`EventRecorder`: awaited with every accepted event **before** its effect starts
  ("events are logged before they are acted on"; a recorder that group-commits, the event
  log, takes a group of events and waits once, and leaves the outcomes recovery derives
  again to the next wait: :mod:`substrate_gpu.lifecycle.pipeline`).
- :class:`TransitionObserver`: told of every transition, synchronously, in the order the
  machine applied them, once the event is in the recorder's order (with group commit,
  possibly before it is durable: a door waits for ``Agent.durable()`` before answering).
- :class:`LifecycleMetrics`: counters and gauges; label values are bounded (state names,
  triggers, effect names, outcome event types, refusal codes), never an actor id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from substrate_gpu.lifecycle import events


@dataclass(frozen=True, slots=True)
class Transition:
    """One accepted event's effect on one actor (reflexive when ``source == dest``)."""

    actor_id: str
    """The actor."""
    source: str
    """The state before."""
    dest: str
    """The state after."""
    trigger: str
    """The machine trigger that fired."""
    event_type: str
    """The event's type (the trigger name, kept separate for log consumers)."""
    at: float
    """When the causing event was created (seconds since the epoch; deterministic on replay)."""
    reason: str | None = None
    """Why, for failures, stops and refusals."""


class TransitionObserver(Protocol):
    """Told of every transition, in order. Must not block: it runs inside the pipeline."""

    def on_transition(self, t: Transition) -> None:
        """Called once per accepted event, once it is recorded (or, with a group-commit
        recorder, appended: module doc)."""
        ...


class EventRecorder(Protocol):
    """Makes accepted events durable before they are acted on (the event log)."""

    async def record(self, event: events.Event) -> None:
        """Persist ``event`` (already stamped with its ``seq``).

        Called in acceptance order; an implementation must take the event into its order
        synchronously, before its first ``await`` (group commit may then flush many events
        at once), so the log order is the order the machine applied them. Raising stops
        the agent: memory and log would disagree from then on.
        """
        ...


class LifecycleMetrics(Protocol):
    """The metrics the lifecycle reports (implemented with prometheus-client elsewhere)."""

    def transition(self, source: str, dest: str, trigger: str) -> None:
        """One transition happened."""
        ...

    def checkpoint_refused(self, reason: str) -> None:
        """A checkpoint was refused; ``reason`` is a bounded code."""
        ...

    def effect_finished(self, effect: str, outcome: str, seconds: float) -> None:
        """An effect finished with ``outcome`` (its outcome event type) after ``seconds``."""
        ...

    def devices_injected(self, count: int) -> None:
        """``count`` GPU device nodes were injected into one actor's bundle."""
        ...

    def queue_depth(self, depth: int) -> None:
        """Effects waiting for a worker right now."""
        ...
