"""Whole lives of one actor, written as an event log and replayed through the machine.

Each test states what the actor must remember (or forget) at the end of a life the
machine allows; replay runs the same interpreter the live agent does, without effects.
"""

from __future__ import annotations

from pathlib import Path

from eventlog import logs

from substrate_gpu.eventlog import replay
from substrate_gpu.lifecycle import actors, events
from substrate_gpu.testing import lives

A = "a"


def _gpu_running() -> list[events.Event]:
    return lives.to_running(A, gpu=True)


def _exec_route_suspend(pids: str = "7") -> list[events.Event]:
    """running -> suspended through the exec route, CUDA processes ``pids`` checkpointed."""
    return [
        events.CudaContextOpened(actor_id=A, pid=7),
        events.SuspendRequested(actor_id=A),
        events.LiveContextFound(actor_id=A, route=events.ROUTE_EXEC),
        events.CudaSuspended(actor_id=A, pids=pids),
        events.CheckpointWritten(actor_id=A, image_path="/ck/a/1"),
    ]


def _restore_exec_image() -> list[events.Event]:
    return [
        events.RestoreRequested(actor_id=A),
        events.GpusAllocated(actor_id=A, names=()),
        events.Restored(actor_id=A, image_path="/ck/a/1", cuda_route=events.ROUTE_EXEC),
    ]


def _replayed(tmp_path: Path, life: list[events.Event]) -> actors.ActorView:
    lines = [e.stamped(seq).to_json() for seq, e in enumerate(life, start=1)]
    log = logs.write_lines(tmp_path / "events.jsonl", logs.header(), *lines)
    return replay(log).actors[A]


def test_a_new_sandbox_after_a_failure_starts_with_no_live_context(tmp_path: Path) -> None:
    """failed -> retry -> ... -> running: the dead sandbox's contexts are not inherited."""
    life = [
        *_gpu_running(),
        events.CudaContextOpened(actor_id=A, pid=7),
        events.SuspendRequested(actor_id=A),
        events.EffectTimedOut(actor_id=A, effect="probe", seconds=60.0),
        events.RetryRequested(actor_id=A),
        events.GpusAllocated(actor_id=A, names=()),
        events.GpuInjected(actor_id=A, devices=1),
        events.SandboxCreated(actor_id=A),
        events.SandboxStarted(actor_id=A),
        events.GpusVerified(actor_id=A),
    ]
    view = _replayed(tmp_path, life)
    assert (view.state, view.live_contexts) == ("running", 0)


def test_a_new_sandbox_after_a_failed_resume_has_no_checkpointed_pids(tmp_path: Path) -> None:
    """A retry after a failed CUDA resume does not resume the old sandbox's pids later."""
    life = [
        *_gpu_running(),
        events.CudaContextOpened(actor_id=A, pid=7),
        events.SuspendRequested(actor_id=A),
        events.LiveContextFound(actor_id=A, route=events.ROUTE_EXEC),
        events.CudaSuspendFailed(actor_id=A, message="stranded", pids="7"),
        events.CudaResumeFailed(actor_id=A, message="pid 7 gone", sandbox_survived=True),
        events.RetryRequested(actor_id=A),
        events.GpusAllocated(actor_id=A, names=()),
        events.GpuInjected(actor_id=A, devices=1),
        events.SandboxCreated(actor_id=A),
    ]
    view = _replayed(tmp_path, life)
    assert (view.state, view.cuda_pids, view.live_contexts) == ("starting", "", 0)


def test_restoring_an_exec_route_checkpoint_resumes_its_cuda_pids(tmp_path: Path) -> None:
    """The first restore of an exec-route image reaches cuda_resuming with its pids."""
    life = [*_gpu_running(), *_exec_route_suspend("7,9"), *_restore_exec_image()]
    view = _replayed(tmp_path, life)
    assert (view.state, view.cuda_pids) == ("cuda_resuming", "7,9")


def test_restoring_the_same_exec_route_checkpoint_twice_resumes_its_pids_again(
    tmp_path: Path,
) -> None:
    """The pids belong with the checkpoint: a second restore of it resumes them too."""
    life = [
        *_gpu_running(),
        *_exec_route_suspend("7,9"),
        *_restore_exec_image(),
        events.CudaResumed(actor_id=A, pids="7,9"),
        events.GpusVerified(actor_id=A),
        events.SandboxExited(actor_id=A, status=137),
        *_restore_exec_image(),
    ]
    view = _replayed(tmp_path, life)
    assert (view.state, view.cuda_pids) == ("cuda_resuming", "7,9")


def test_a_context_opened_twice_by_the_same_pid_counts_once(tmp_path: Path) -> None:
    """Delivered twice, the same pid's cuda_context_opened is one context (idempotent)."""
    life = [
        *_gpu_running(),
        events.CudaContextOpened(actor_id=A, pid=7),
        events.CudaContextOpened(actor_id=A, pid=7),
    ]
    assert _replayed(tmp_path, life).live_contexts == 1


def test_closing_a_pids_context_once_leaves_no_live_context(tmp_path: Path) -> None:
    """After a duplicated open, one close of that pid means no context is live."""
    life = [
        *_gpu_running(),
        events.CudaContextOpened(actor_id=A, pid=7),
        events.CudaContextOpened(actor_id=A, pid=7),
        events.CudaContextClosed(actor_id=A, pid=7),
    ]
    assert _replayed(tmp_path, life).live_contexts == 0


def test_contexts_of_different_pids_count_separately(tmp_path: Path) -> None:
    """Two pids, two contexts; closing one leaves the other."""
    life = [
        *_gpu_running(),
        events.CudaContextOpened(actor_id=A, pid=7),
        events.CudaContextOpened(actor_id=A, pid=9),
        events.CudaContextClosed(actor_id=A, pid=7),
    ]
    assert _replayed(tmp_path, life).live_contexts == 1


def test_a_gpu_actor_of_a_log_before_verification_replays_straight_to_running(
    tmp_path: Path,
) -> None:
    """v1 sandbox_started/restored/cuda_resumed (an agent without ``verifying``) replay as
    they ran; v2 ones wait in ``verifying`` for the check."""
    old = [e for e in _gpu_running() if e.type != "gpus_verified"]
    old[-1] = events.SandboxStarted(actor_id=A, v=1)
    (tmp_path / "v1").mkdir()
    assert _replayed(tmp_path / "v1", old).state == "running"
    new = [*old[:-1], events.SandboxStarted(actor_id=A)]
    (tmp_path / "v2").mkdir()
    assert _replayed(tmp_path / "v2", new).state == "verifying"
