"""Opening the agent's event log, recovering from it first when it already holds events.

On start the agent reads an existing log through :func:`substrate_gpu.eventlog.recover`
(which replays it, drops and reports a torn last line, and reconciles actors that were
mid-effect by asking the runtime), then opens the same log for appending. The
:class:`~substrate_gpu.eventlog.Recovery`'s ``resume`` point goes to ``Agent(resume=...)``:
the agent starts with the logged actors, numbers new events after the log's last one, and
accepts the reconciliation outcomes (logged like any event) before serving requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from substrate_gpu import eventlog
from substrate_gpu._log import get_logger
from substrate_gpu.observability.metrics import AgentMetrics
from substrate_gpu.runsc.api import SandboxRuntime

log = get_logger(__name__)


@dataclass(frozen=True)
class Resumed:
    """What the agent resumed from its log (for the start-up log line and tests)."""

    actors: int
    """Actors adopted."""
    last_seq: int
    """The log's last sequence number; new events continue after it."""
    reconciled: int
    """Actors found mid-effect whose outcome recovery established from the runtime."""
    rerun: int
    """Actors found mid-effect whose effect is run again (idempotent or provably unrun)."""


async def open_log(
    path: Path | None,
    *,
    runtime: SandboxRuntime,
    checkpoint_root: Path,
    metrics: AgentMetrics | None,
) -> tuple[eventlog.EventLog | None, eventlog.Recovery | None]:
    """Recover ``path`` when it holds events, then open it for appending."""
    if path is None:
        return None, None
    recovered = None
    if path.exists() and path.stat().st_size > 0:
        recovered = await eventlog.recover(path, runtime=runtime, checkpoint_root=checkpoint_root)
        # A torn tail is warned about once, by EventLog.open below (which truncates it).
        if recovered.reaped:
            log.warning(
                "killed runsc commands the killed agent left running",
                pids=list(recovered.reaped),
            )
        for line in recovered.report:
            log.info("reconciled an interrupted effect", detail=line.describe())
        for found in recovered.live:
            log.info(
                "a GPU sandbox runs",
                actor_id=found.actor_id,
                containers=list(found.containers),
                injected=list(found.injected),
            )
    opened = await eventlog.EventLog.open(path, metrics=metrics)
    return opened, recovered


def summary(recovered: eventlog.Recovery) -> Resumed:
    """What ``recovered`` resumes."""
    return Resumed(
        actors=len(recovered.actors),
        last_seq=recovered.last_seq,
        reconciled=len(recovered.reconcile_events),
        rerun=len(recovered.rerun),
    )
