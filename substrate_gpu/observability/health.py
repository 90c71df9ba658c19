"""What the agent's health probes report, and how a report reads over HTTP.

``GET /healthz`` (liveness) and ``GET /readyz`` (readiness) on the metrics server answer from
a :class:`HealthSource`: each probe is a :class:`Report`, a tuple of named :class:`Check`
results. A report is 200 when every check passes and 503 otherwise; its body is plain text,
one line per check, under a first line that names the failing checks, so ``curl`` and
``kubectl describe`` (which quotes the body of a failed probe) both say what is wrong.

The check names are fixed (:class:`Liveness`, :class:`Readiness`): they are label values of
``substrate_gpu_agent_ready{check}`` too, and a fixed set keeps that series count bounded.
What each check means, and what computes it, is the agent's business
(:mod:`substrate_gpu.service.health`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

__all__ = ["Check", "HealthSource", "Liveness", "Readiness", "Report"]


class Liveness(StrEnum):
    """What ``/healthz`` checks."""

    LOOP = "loop"
    """The agent's event loop ran recently (its heartbeat is fresh)."""


class Readiness(StrEnum):
    """What ``/readyz`` checks."""

    EVENT_LOG = "event_log"
    """The event log is locked and open, and has not failed."""
    RECOVERY = "recovery"
    """Recovery from the event log has finished (the agent accepts requests)."""
    RUNSC = "runsc"
    """runsc answered ``--version`` recently."""
    SERVING = "serving"
    """The agent is not shutting down."""


@dataclass(frozen=True)
class Check:
    """One named check's result."""

    name: str
    """A :class:`Liveness` or :class:`Readiness` name."""
    ok: bool
    """Whether the check passes."""
    detail: str
    """What was seen, for a person: ``open and locked``, ``no heartbeat for 12.0 s``."""


@dataclass(frozen=True)
class Report:
    """A probe's answer: every check's result, in a fixed order."""

    probe: str
    """``live`` or ``ready``: the word the body's first line uses."""
    checks: tuple[Check, ...]
    """The checks, each passing or not."""

    @property
    def ok(self) -> bool:
        """Whether every check passes."""
        return all(check.ok for check in self.checks)

    @property
    def failed(self) -> tuple[str, ...]:
        """The names of the checks that fail."""
        return tuple(check.name for check in self.checks if not check.ok)

    @property
    def status(self) -> int:
        """The HTTP status: 200 when every check passes, 503 otherwise."""
        return 200 if self.ok else 503

    def body(self) -> bytes:
        """``ready`` or ``not ready: runsc``, then ``ok|failed <check>: <detail>`` lines."""
        head = self.probe if self.ok else f"not {self.probe}: {', '.join(self.failed)}"
        lines = [head] + [f"{'ok' if c.ok else 'failed'} {c.name}: {c.detail}" for c in self.checks]
        return ("\n".join(lines) + "\n").encode()


class HealthSource(Protocol):
    """What the metrics server asks on ``/healthz`` and ``/readyz``.

    Called from the server's threads, never on the event loop: an implementation reads
    state the loop keeps up to date and must not block.
    """

    def liveness(self) -> Report:
        """The ``/healthz`` report."""
        ...

    def readiness(self) -> Report:
        """The ``/readyz`` report."""
        ...
