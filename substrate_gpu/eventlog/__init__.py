"""The event log: durable, replayable, recoverable history of every actor.

Where things live: :mod:`.format` is the line format and its versioning; :mod:`.writer`
the group-committing, rotating :class:`EventLog` (the agent's ``EventRecorder``);
:mod:`.reader` reading a log, torn tail and corruption included; :mod:`.snapshot` the
compaction snapshots; :mod:`.replayer` rebuilding states through the machine without effects;
:mod:`.recovery` resuming an agent and reconciling interrupted effects with the runtime.
docs/event-log.md is the user-facing account.

Reading and replaying are imported here; the writer (anyio, structlog) and recovery (runsc,
the agent) resolve on first use (PEP 562), so ``substrate-gpu replay`` loads neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from substrate_gpu import _lazy
from substrate_gpu.eventlog.errors import (
    CorruptLogError,
    EventLogError,
    EventLogLocked,
    ReplayDivergence,
)
from substrate_gpu.eventlog.format import Header, Rejection
from substrate_gpu.eventlog.reader import LogContents, TornTail, read_log
from substrate_gpu.eventlog.replayer import ReplayResult, replay
from substrate_gpu.eventlog.snapshot import Snapshot

if TYPE_CHECKING:
    from substrate_gpu.eventlog.recovery import (
        Decision,
        Reconciliation,
        Recovery,
        decide,
        image_is_whole,
        recover,
    )
    from substrate_gpu.eventlog.writer import EventLog, LogLock, lock
    from substrate_gpu.lifecycle.agent import ResumePoint

#: The names resolved on first use, and the module that defines each.
_LAZY = {
    **dict.fromkeys(
        ["Decision", "Reconciliation", "Recovery", "decide", "image_is_whole", "recover"],
        "substrate_gpu.eventlog.recovery",
    ),
    **dict.fromkeys(["EventLog", "LogLock", "lock"], "substrate_gpu.eventlog.writer"),
    "ResumePoint": "substrate_gpu.lifecycle.agent",
}

__all__ = [
    "CorruptLogError",
    "Decision",
    "EventLog",
    "EventLogError",
    "EventLogLocked",
    "Header",
    "LogContents",
    "LogLock",
    "Reconciliation",
    "Recovery",
    "Rejection",
    "ReplayDivergence",
    "ReplayResult",
    "ResumePoint",
    "Snapshot",
    "TornTail",
    "decide",
    "image_is_whole",
    "lock",
    "read_log",
    "recover",
    "replay",
]


#: Resolves a name of :data:`_LAZY` on first use, then keeps it.
__getattr__ = _lazy.module_getattr(__name__, _LAZY, globals())
