"""The agent's liveness and readiness: what ``/healthz`` and ``/readyz`` answer.

:class:`AgentHealth` is the :class:`~substrate_gpu.observability.health.HealthSource` of a
running agent. The event loop keeps it up to date; the metrics server's threads read it.

Design decisions:

- **Liveness is a heartbeat.** A task on the event loop stamps the time every
  :data:`HEARTBEAT_INTERVAL` (or a quarter of the timeout, if shorter); ``/healthz`` fails
  once the stamp is older than ``liveness_timeout`` (``--liveness-timeout``). The probe is
  answered from the server's thread, so it sees a loop that is blocked (a synchronous call
  that hangs, a CPU-bound callback) while the process itself is up. **Start-up is excused**:
  replaying a long event log is synchronous and may hold the loop for seconds, and a
  liveness failure there would restart the agent into the same replay, forever. Until
  recovery finishes, ``/healthz`` passes (``starting``) and ``/readyz`` fails (``recovery``).
- **Readiness is four checks**, each named in the answer and in
  ``substrate_gpu_agent_ready{check}``: ``event_log`` (locked and open, and not failed
  since: once it fails the agent answers every request ``unavailable``), ``recovery``
  (finished), ``runsc`` (answered ``runsc --version`` recently), ``serving`` (no SIGTERM yet:
  a draining agent leaves the Service's endpoints before it stops).
- **runsc is never run per probe.** A task runs ``runsc --version`` once at start, then
  every :data:`RUNSC_INTERVAL` seconds (:data:`RUNSC_RETRY` after a failure), each bounded
  by :data:`RUNSC_TIMEOUT`; the probe reads the cached result. A result older than
  :data:`RUNSC_MAX_AGE` fails the check too (the watcher itself is stuck), so a kubelet
  probing every second costs one fork every 30 s, not one per probe.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio

from substrate_gpu import _process, exceptions
from substrate_gpu._log import get_logger
from substrate_gpu.observability import health
from substrate_gpu.runsc import argv
from substrate_gpu.service.config import AgentConfig

log = get_logger(__name__)

HEARTBEAT_INTERVAL: Final = 1.0
"""Seconds between two heartbeats of the event loop."""

RUNSC_INTERVAL: Final = 30.0
"""Seconds between two ``runsc --version`` checks while runsc answers."""

RUNSC_RETRY: Final = 5.0
"""Seconds before the next check after runsc did not answer."""

RUNSC_TIMEOUT: Final = 10.0
"""Seconds ``runsc --version`` may take."""

RUNSC_MAX_AGE: Final = 2 * RUNSC_INTERVAL + RUNSC_TIMEOUT
"""A runsc result older than this fails the check: the watcher no longer runs."""


@dataclass(frozen=True)
class _RunscAnswer:
    ok: bool
    detail: str
    at: float


class AgentHealth:
    """Liveness and readiness of one agent (see the module doc).

    The agent calls :meth:`recovered`, :meth:`serving`, :meth:`draining` as it moves through
    its life, and runs :meth:`heartbeat` and :meth:`watch_runsc` as tasks while the metrics
    server is up. ``clock`` is :func:`time.monotonic` unless a test says otherwise.
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        runsc_interval: float = RUNSC_INTERVAL,
        runsc_retry: float = RUNSC_RETRY,
        runsc_max_age: float = RUNSC_MAX_AGE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._event_log = config.event_log
        self._runsc_argv = argv.version(argv.Invocation(config.runsc, config.runsc_root))
        self._liveness_timeout = config.liveness_timeout
        self._runsc_interval = runsc_interval
        self._runsc_retry = runsc_retry
        self._runsc_max_age = runsc_max_age
        self._clock = clock
        self._beat = clock()
        self._recovery: str | None = None
        self._log_failure: Callable[[], str | None] = lambda: None
        self._draining = False
        self._runsc: _RunscAnswer | None = None

    # -- what the agent tells it ------------------------------------------------------------

    def recovered(self, detail: str) -> None:
        """Recovery finished (or there was nothing to recover): ``detail`` says what."""
        self._beat = self._clock()
        self._recovery = detail

    def serving(self, log_failure: Callable[[], str | None]) -> None:
        """The agent serves; ``log_failure`` says why its event log failed (None: it has not)."""
        self._log_failure = log_failure

    def draining(self) -> None:
        """Shutdown began: the agent takes no new work."""
        self._draining = True

    # -- the tasks ----------------------------------------------------------------------------

    async def heartbeat(self) -> None:
        """Stamp the time while the event loop runs (until cancelled)."""
        interval = min(HEARTBEAT_INTERVAL, self._liveness_timeout / 4)
        while True:
            self._beat = self._clock()
            await anyio.sleep(interval)

    async def watch_runsc(self) -> None:
        """Check that runsc answers, now and then periodically (until cancelled)."""
        while True:
            ok = await self.check_runsc()
            await anyio.sleep(self._runsc_interval if ok else self._runsc_retry)

    async def check_runsc(self) -> bool:
        """Run ``runsc --version`` once and remember the outcome; whether runsc answered."""
        try:
            result = await _process.run_command(
                self._runsc_argv, timeout=RUNSC_TIMEOUT, what="checking that runsc answers"
            )
        except exceptions.ExternalCommandError as e:
            answer = _RunscAnswer(False, str(e), self._clock())
        else:
            first = next((ln.strip() for ln in result.stdout.splitlines() if ln.strip()), "")
            answer = (
                _RunscAnswer(True, first, self._clock())
                if first
                else _RunscAnswer(
                    False, f"'{self._runsc_argv[0]} --version' printed nothing", self._clock()
                )
            )
        if self._runsc is not None and self._runsc.ok != answer.ok:
            log.warning("runsc check changed", ok=answer.ok, detail=answer.detail[:300])
        elif self._runsc is None and not answer.ok:
            log.warning("runsc does not answer", detail=answer.detail[:300])
        self._runsc = answer
        return answer.ok

    # -- the probes (called from the metrics server's threads) --------------------------------

    def liveness(self) -> health.Report:
        """``/healthz``: the loop's heartbeat is fresh (always, while starting)."""
        name = health.Liveness.LOOP
        if self._recovery is None:
            check = health.Check(name, True, "starting (recovery may hold the loop)")
        else:
            age = self._clock() - self._beat
            check = (
                health.Check(name, True, f"heartbeat {age:.1f} s ago")
                if age <= self._liveness_timeout
                else health.Check(
                    name,
                    False,
                    f"no heartbeat for {age:.1f} s (--liveness-timeout "
                    f"{self._liveness_timeout:g}): the event loop is blocked",
                )
            )
        return health.Report("live", (check,))

    def readiness(self) -> health.Report:
        """``/readyz``: event log, recovery, runsc, serving."""
        return health.Report(
            "ready",
            (self._event_log_check(), self._recovery_check(), self._runsc_check(), self._serving()),
        )

    def _event_log_check(self) -> health.Check:
        name = health.Readiness.EVENT_LOG
        if self._event_log is None:
            return health.Check(name, True, "none configured (--event-log): nothing is durable")
        if self._recovery is None:
            return health.Check(name, True, f"{self._event_log} locked; opening")
        failure = self._log_failure()
        if failure is not None:
            return health.Check(name, False, f"failed: {failure}")
        return health.Check(name, True, f"{self._event_log} open and locked")

    def _recovery_check(self) -> health.Check:
        name = health.Readiness.RECOVERY
        if self._recovery is None:
            return health.Check(name, False, "running")
        return health.Check(name, True, self._recovery)

    def _runsc_check(self) -> health.Check:
        name = health.Readiness.RUNSC
        answer = self._runsc
        if answer is None:
            return health.Check(name, False, "not checked yet")
        age = self._clock() - answer.at
        if age > self._runsc_max_age:
            return health.Check(name, False, f"last checked {age:.0f} s ago: the check is stuck")
        if not answer.ok:
            return health.Check(name, False, answer.detail)
        return health.Check(name, True, f"{answer.detail} ({age:.0f} s ago)")

    def _serving(self) -> health.Check:
        name = health.Readiness.SERVING
        if self._draining:
            return health.Check(name, False, "shutting down: draining")
        return health.Check(name, True, "accepting requests")


def recovery_detail(event_log: Path | None, actors: int, last_seq: int) -> str:
    """What the ``recovery`` check says once the agent resumed ``actors`` at ``last_seq``."""
    if event_log is None:
        return "nothing to recover (no event log)"
    if last_seq == 0:
        return "finished: the event log was empty"
    return f"finished: {actors} actors resumed at seq {last_seq}"
