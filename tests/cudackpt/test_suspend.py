"""suspend_processes / resume_processes: all or nothing, on an in-memory cuda-checkpoint.

The fake keeps the driver's state machine and fails on demand; the same logic runs against
the real stand-in inside a container in test_exec_route.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from substrate_gpu.cudackpt import api, suspend

pytestmark = pytest.mark.anyio

MOVES = {
    "lock": ("running", "locked"),
    "checkpoint": ("locked", "checkpointed"),
    "restore": ("checkpointed", "locked"),
    "unlock": ("locked", "running"),
}


@dataclass
class FakeTool:
    """The driver's four states per pid, with failures injected per (action, pid)."""

    states: dict[int, str]
    fail: set[tuple[str, int]] = field(default_factory=set)
    calls: list[tuple[str, int]] = field(default_factory=list)

    def _error(self, cls: type[api.CudaCheckpointError], action: str, pid: int, text: str):
        return cls(text, pid=pid, action=action, argv=(), returncode=1, stderr=text)

    async def _act(self, action: str, pid: int) -> None:
        self.calls.append((action, pid))
        if (action, pid) in self.fail:
            if action == "lock":
                raise self._error(api.LockTimeoutError, action, pid, '"the operation timed out"')
            raise self._error(api.CudaCheckpointError, action, pid, '"out of memory"')
        before, after = MOVES[action]
        if self.states[pid] != before:
            raise self._error(api.IllegalStateError, action, pid, "illegal state")
        self.states[pid] = after

    async def get_state(self, pid: int) -> api.CudaProcessState:
        self.calls.append(("get-state", pid))
        return self.states[pid]  # type: ignore[return-value]

    async def lock(self, pid: int, timeout_ms: int) -> None:
        await self._act("lock", pid)

    async def checkpoint(self, pid: int) -> None:
        await self._act("checkpoint", pid)

    async def restore(self, pid: int, device_map: str = "") -> None:
        if device_map:
            self.calls.append(("device-map", pid))
        await self._act("restore", pid)

    async def unlock(self, pid: int) -> None:
        await self._act("unlock", pid)


def running(*pids: int) -> dict[int, str]:
    return dict.fromkeys(pids, "running")


async def test_suspend_locks_all_then_checkpoints_all() -> None:
    """Every process is locked before any is checkpointed; all end checkpointed."""
    tool = FakeTool(running(1, 7))
    outcome = await suspend.suspend_processes(tool, [1, 7])
    assert outcome.suspended
    assert tool.calls == [("lock", 1), ("lock", 7), ("checkpoint", 1), ("checkpoint", 7)]
    assert tool.states == {1: "checkpointed", 7: "checkpointed"}


async def test_lock_timeout_on_the_second_process_is_refused_and_undone() -> None:
    """A lock timeout refuses the suspend; the first process is unlocked, nothing half-done."""
    tool = FakeTool(running(1, 7), fail={("lock", 7)})
    outcome = await suspend.suspend_processes(tool, [1, 7])
    assert outcome.status == "refused"
    assert outcome.reason.startswith("lock timeout: pid 7")
    assert tool.states == {1: "running", 7: "running"}
    assert not outcome.stranded


async def test_checkpoint_failure_on_the_second_process_rolls_every_process_back() -> None:
    """A failed checkpoint restores+unlocks the checkpointed one and unlocks the locked one."""
    tool = FakeTool(running(1, 7), fail={("checkpoint", 7)})
    outcome = await suspend.suspend_processes(tool, [1, 7])
    assert outcome.status == "refused"
    assert outcome.reason.startswith("checkpoint failed: pid 7")
    assert tool.states == {1: "running", 7: "running"}
    rollback = [s for s in outcome.steps if s.action in ("restore", "unlock")]
    assert [(s.pid, s.action) for s in rollback] == [(7, "unlock"), (1, "restore"), (1, "unlock")]


async def test_a_rollback_that_cannot_restore_reports_the_stranded_process() -> None:
    """If a rollback restore fails, the outcome is 'failed' and names the stranded pid."""
    tool = FakeTool(running(1, 7), fail={("checkpoint", 7), ("restore", 1)})
    outcome = await suspend.suspend_processes(tool, [1, 7])
    assert outcome.status == "failed"
    assert outcome.stranded == (1,)
    assert tool.states == {1: "checkpointed", 7: "running"}


async def test_suspending_no_process_is_trivially_suspended() -> None:
    """No CUDA process: nothing to do, suspended."""
    outcome = await suspend.suspend_processes(FakeTool({}), [])
    assert outcome.suspended
    assert outcome.steps == ()


async def test_duplicate_pids_are_handled_once() -> None:
    """A pid listed twice is locked and checkpointed once."""
    tool = FakeTool(running(1))
    outcome = await suspend.suspend_processes(tool, [1, 1])
    assert outcome.pids == (1,)
    assert tool.calls == [("lock", 1), ("checkpoint", 1)]


async def test_resume_restores_and_unlocks_every_process() -> None:
    """Resume brings checkpointed and locked processes back to running."""
    tool = FakeTool({1: "checkpointed", 7: "locked", 9: "running"})
    outcome = await suspend.resume_processes(tool, [1, 7, 9])
    assert outcome.ok
    assert outcome.resumed == (1, 7, 9)
    assert tool.states == {1: "running", 7: "running", 9: "running"}


async def test_resume_keeps_going_past_a_failed_restore() -> None:
    """A failed restore leaves that process checkpointed; the others are still resumed."""
    tool = FakeTool({1: "checkpointed", 7: "checkpointed"}, fail={("restore", 1)})
    outcome = await suspend.resume_processes(tool, [1, 7])
    assert outcome.failed == (1,)
    assert outcome.resumed == (7,)
    assert outcome.reason.startswith("resume failed: pid 1")
    assert tool.states == {1: "checkpointed", 7: "running"}


async def test_resume_of_a_process_in_failed_state_is_reported() -> None:
    """A process the driver reports 'failed' cannot be resumed and is named."""
    outcome = await suspend.resume_processes(FakeTool({3: "failed"}), [3])
    assert outcome.failed == (3,)


@dataclass
class StaysLocked(FakeTool):
    """Unlock of ``stuck`` succeeds and changes nothing (beta9 #1918)."""

    stuck: int = 0

    async def unlock(self, pid: int) -> None:
        if pid == self.stuck:
            self.calls.append(("unlock", pid))
            return
        await self._act("unlock", pid)


async def test_a_process_left_locked_by_a_successful_unlock_fails_the_resume() -> None:
    """Every call succeeded, but pid 7 reads 'locked': it is failed, named with its state."""
    tool = StaysLocked({1: "checkpointed", 7: "checkpointed"}, stuck=7)
    outcome = await suspend.resume_processes(tool, [1, 7])
    assert (outcome.resumed, outcome.failed) == ((1,), (7,))
    assert outcome.reason.startswith("resume failed: pid 7: reads 'locked'")
    assert tool.calls[-1] == ("get-state", 7)


async def test_a_process_already_running_is_not_queried_twice() -> None:
    """A process read as 'running' needs nothing and no second query."""
    tool = FakeTool(running(4))
    outcome = await suspend.resume_processes(tool, [4])
    assert outcome.ok and tool.calls == [("get-state", 4)]


@dataclass
class KilledMidLock(FakeTool):
    """The exec of pid 7's lock outlives our timeout: the lock happened, the answer never came."""

    async def lock(self, pid: int, timeout_ms: int) -> None:
        await self._act("lock", pid)
        if pid == 7:
            raise api.CudaCheckpointError(
                "no answer",
                pid=pid,
                action="lock",
                argv=(),
                returncode=None,
                stderr="",
                timed_out=True,
            )


async def test_a_call_killed_by_our_timeout_is_rolled_back_from_its_reported_state() -> None:
    """A lock killed mid-call counts as touched: its real state (locked) is undone."""
    tool = KilledMidLock(running(1, 7))
    outcome = await suspend.suspend_processes(tool, [1, 7])
    assert outcome.status == "refused"
    assert outcome.reason.startswith("tool timeout: pid 7")
    assert tool.states == {1: "running", 7: "running"}


async def test_a_resume_after_a_remapped_restore_passes_the_device_map() -> None:
    """Every restore of the resume carries the map; no other call does."""
    tool = FakeTool({1: "checkpointed", 7: "checkpointed"})
    outcome = await suspend.resume_processes(tool, [1, 7], device_map="GPU-a=GPU-b")
    assert outcome.ok
    assert [c for c in tool.calls if c[0] in {"device-map", "restore"}] == [
        ("device-map", 1),
        ("restore", 1),
        ("device-map", 7),
        ("restore", 7),
    ]


async def test_a_suspend_rollback_never_passes_a_device_map() -> None:
    """A rollback restores processes onto the GPUs they never left."""
    tool = FakeTool(running(1, 7), fail={("checkpoint", 7)})
    outcome = await suspend.suspend_processes(tool, [1, 7])
    assert outcome.status == "refused"
    assert ("restore", 1) in tool.calls and not any(c[0] == "device-map" for c in tool.calls)
