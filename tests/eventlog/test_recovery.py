"""Recovery: actors resume where the log left them; interrupted effects are reconciled by
asking the runtime, never blindly re-run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from lifecycle.doubles import FakeInjector, FakeProbe, FakeRuntime, _Container
from lifecycle.factories import bring_to_running

from eventlog import logs
from substrate_gpu import eventlog
from substrate_gpu.eventlog import EventLog, read_log, recover, replay
from substrate_gpu.eventlog.recovery import INTERRUPTED
from substrate_gpu.eventlog.replayer import Replayer
from substrate_gpu.lifecycle import Agent, events, machine, registry
from substrate_gpu.lifecycle.actors import ActorView

pytestmark = pytest.mark.anyio

#: The runtime call each in-flight state's effect blocks in, to crash the agent there.
HANG = {
    "creating": "create",
    "starting": "start",
    "checkpointing": "checkpoint",
    "restoring": "restore",
    "deleting": "delete",
}


def _agent(
    runtime: FakeRuntime, injector: FakeInjector, tmp: Path, log: EventLog, **kw: object
) -> Agent:
    return Agent(
        runtime=runtime,
        probe=FakeProbe(runtime),
        injector=injector,
        checkpoint_root=tmp / "checkpoints",
        recorder=log,
        **kw,  # type: ignore[arg-type]
    )


async def _crash_in(
    state: str, path: Path, tmp: Path, runtime: FakeRuntime, injector: FakeInjector
) -> None:
    """Run actor 'a' (GPU) until its effect for ``state`` is in flight, then stop the agent
    there (its effect cancelled mid-way, as a crash would leave it)."""
    async with await EventLog.open(path) as log, _agent(runtime, injector, tmp, log) as agent:
        if state == "injecting":
            injector.hang = True
            await agent.submit(events.ActorRegistered(actor_id="a", gpu=True, bundle="/b/a"))
            await agent.submit(events.BundlePrepared(actor_id="a", bundle="/b/a"))
            await agent.submit(events.RunRequested(actor_id="a"))
        elif state in {"creating", "starting"}:
            runtime.hang.add(HANG[state])
            await agent.submit(events.ActorRegistered(actor_id="a", gpu=True, bundle="/b/a"))
            await agent.submit(events.BundlePrepared(actor_id="a", bundle="/b/a"))
            await agent.submit(events.RunRequested(actor_id="a"))
        else:
            await bring_to_running(agent, "a")
            if state == "restoring":
                await agent.submit(events.SuspendRequested(actor_id="a"))
                await agent.wait_for_state("a", "suspended", timeout=5)
            runtime.hang.add(HANG[state])
            trigger = {
                "checkpointing": events.SuspendRequested,
                "restoring": events.RestoreRequested,
                "deleting": events.DeleteRequested,
            }[state]
            await agent.submit(trigger(actor_id="a"))
        await agent.wait_for_state("a", state, timeout=5)
        await anyio.sleep(0.01)  # the effect reaches its runtime call
    runtime.hang.clear()
    injector.hang = False


def _world(runtime: FakeRuntime, status: str | None) -> None:
    """Set what the runtime holds for actor 'a' after the crash."""
    if status is None:
        runtime.containers.pop("a", None)
    else:
        runtime.containers["a"] = _Container(
            status, 4242 if status == "running" else 0, "/b/a", True
        )  # type: ignore[arg-type]


CASES = [
    # state, runtime status, whole image, outcome (None: rerun), state after the outcome, final, runtime calls after recovery
    pytest.param(
        "injecting",
        None,
        False,
        None,
        "injecting",
        "running",
        ["create", "start"],
        id="injecting-reruns-idempotent-inject",
    ),
    pytest.param(
        "creating",
        "created",
        False,
        "sandbox_created",
        "starting",
        "running",
        ["start"],
        id="creating+created-continues-with-start",
    ),
    pytest.param(
        "creating",
        None,
        False,
        "effect_failed",
        "failed",
        "failed",
        [],
        id="creating+missing-fails",
    ),
    pytest.param(
        "creating",
        "stopped",
        False,
        "effect_failed",
        "failed",
        "failed",
        ["delete"],
        id="creating+stopped-deletes-and-fails",
    ),
    pytest.param(
        "starting",
        "running",
        False,
        "sandbox_started",
        "verifying",  # a GPU actor's sandbox is checked before it runs
        "running",
        [],
        id="starting+running-started",
    ),
    pytest.param(
        "starting",
        "created",
        False,
        None,
        "starting",
        "running",
        ["start"],
        id="starting+created-reruns-start",
    ),
    pytest.param(
        "starting",
        None,
        False,
        "effect_failed",
        "failed",
        "failed",
        [],
        id="starting+missing-fails",
    ),
    pytest.param(
        "checkpointing",
        "running",
        True,
        "checkpoint_failed",
        "running",
        "running",
        [],
        id="checkpointing+running-survives-even-with-image",
    ),
    pytest.param(
        "checkpointing",
        "stopped",
        True,
        "checkpoint_written",
        "suspended",
        "suspended",
        ["delete"],
        id="checkpointing+gone+whole-image-written",
    ),
    pytest.param(
        "checkpointing",
        None,
        False,
        "checkpoint_failed",
        "stopped",
        "stopped",
        [],
        id="checkpointing+gone+no-image-stopped",
    ),
    pytest.param(
        "restoring",
        "running",
        False,
        "restored",
        "verifying",
        "running",
        [],
        id="restoring+running-restored",
    ),
    pytest.param(
        "restoring",
        None,
        False,
        "restore_failed",
        "suspended",
        "suspended",
        [],
        id="restoring+missing-stays-suspended",
    ),
    pytest.param(
        "restoring",
        "created",
        False,
        "restore_failed",
        "suspended",
        "suspended",
        ["delete"],
        id="restoring+created-deletes-and-fails",
    ),
    pytest.param(
        "deleting",
        "running",
        False,
        None,
        "deleting",
        "deleted",
        ["delete"],
        id="deleting+exists-reruns-delete",
    ),
    pytest.param(
        "deleting", None, False, "deleted", "deleted", "deleted", [], id="deleting+missing-deleted"
    ),
]


@pytest.mark.parametrize(("state", "status", "whole", "outcome", "after", "final", "calls"), CASES)
async def test_an_interrupted_effect_is_reconciled_with_the_runtime(
    state: str,
    status: str | None,
    whole: bool,
    outcome: str | None,
    after: str,
    final: str,
    calls: list[str],
    log_path: Path,
    tmp_path: Path,
    runtime: FakeRuntime,
    injector: FakeInjector,
) -> None:
    """The rule table of docs/event-log.md: each crash point lands where the runtime says,
    the outcome is logged, and only the effects the rule names run afterwards."""
    await _crash_in(state, log_path, tmp_path, runtime, injector)
    assert replay(log_path).actors["a"].state == state
    _world(runtime, status)
    if whole:
        cause = replay(log_path).causes["a"]
        image = tmp_path / "checkpoints" / "a" / str(cause.seq)
        image.mkdir(parents=True, exist_ok=True)
        (image / "checkpoint.img").write_text("image")
    runtime.calls.clear()
    injected_before = len(injector.calls)

    recovery = await recover(log_path, runtime=runtime, checkpoint_root=tmp_path / "checkpoints")

    assert [r.decision.outcome.type if r.decision.outcome else None for r in recovery.report] == [
        outcome
    ]
    assert recovery.actors["a"].state == after
    assert recovery.rerun == (() if outcome else ("a",))
    async with (
        await EventLog.open(log_path) as log,
        _agent(runtime, injector, tmp_path, log, resume=recovery.resume) as agent,
    ):
        await agent.settle()
        assert agent.state_of("a") == final
    assert [c[0] for c in runtime.calls if c[0] not in {"state", "features"}] == calls
    if state == "injecting":
        assert len(injector.calls) == injected_before + 1
    logged = read_log(log_path).events
    if outcome is not None:
        reconciled = next(e for e in logged if e.seq == recovery.last_seq + 1)
        assert reconciled.type == outcome
        if "failed" in outcome:
            assert INTERRUPTED in reconciled.describe()
    # The log now says where every actor is: a second recovery has nothing to reconcile.
    assert replay(log_path).actors["a"].state == final
    again = await recover(log_path, runtime=runtime, checkpoint_root=tmp_path / "checkpoints")
    assert again.report == ()


async def test_a_sandbox_running_in_creating_is_reconciled_as_created_and_started(
    log_path: Path, tmp_path: Path, runtime: FakeRuntime, injector: FakeInjector
) -> None:
    """``start`` runs without waiting for ``sandbox_created`` to be durable (rederived), so a
    crash can leave the log in ``creating`` with the sandbox running: both outcomes are
    logged, ``start`` is not run again, and the GPU actor goes on to be verified."""
    await _crash_in("creating", log_path, tmp_path, runtime, injector)
    _world(runtime, "running")
    runtime.calls.clear()
    recovery = await recover(log_path, runtime=runtime, checkpoint_root=tmp_path / "checkpoints")
    (line,) = recovery.report
    assert [o.type for o in line.decision.outcomes] == ["sandbox_created", "sandbox_started"]
    assert "sandbox_created, sandbox_started" in line.describe()
    assert recovery.actors["a"].state == "verifying"
    async with (
        await EventLog.open(log_path) as log,
        _agent(runtime, injector, tmp_path, log, resume=recovery.resume) as agent,
    ):
        await agent.settle()
        assert agent.state_of("a") == "running"
    assert [c[0] for c in runtime.calls if c[0] not in {"state", "features"}] == []
    logged = [e.type for e in read_log(log_path).events if e.seq > recovery.last_seq]
    assert logged[:2] == ["sandbox_created", "sandbox_started"]
    again = await recover(log_path, runtime=runtime, checkpoint_root=tmp_path / "checkpoints")
    assert again.report == ()


async def test_an_empty_image_left_by_a_failed_checkpoint_is_not_taken(
    log_path: Path, tmp_path: Path, runtime: FakeRuntime, injector: FakeInjector
) -> None:
    """Sandbox gone mid-checkpoint, an empty checkpoint.img (what a failed runsc checkpoint
    leaves, docs/runsc.md): checkpoint_failed, the last good checkpoint kept."""
    await _crash_in("checkpointing", log_path, tmp_path, runtime, injector)
    _world(runtime, "stopped")
    image = tmp_path / "checkpoints" / "a" / str(replay(log_path).causes["a"].seq)
    image.mkdir(parents=True, exist_ok=True)
    (image / "checkpoint.img").touch()
    recovery = await recover(log_path, runtime=runtime, checkpoint_root=tmp_path / "checkpoints")
    (line,) = recovery.report
    assert line.decision.outcome is not None
    assert line.decision.outcome.type == "checkpoint_failed"
    assert recovery.actors["a"].state == "stopped"


def _link_to_an_image(image: Path) -> None:
    (image.parent / "elsewhere.img").write_bytes(b"image")
    (image / "checkpoint.img").symlink_to(image.parent / "elsewhere.img")


@pytest.mark.parametrize(
    ("make", "whole"),
    [
        pytest.param(lambda d: (d / "checkpoint.img").write_bytes(b"image"), True, id="written"),
        pytest.param(lambda d: (d / "checkpoint.img").touch(), False, id="empty"),
        pytest.param(lambda d: None, False, id="missing"),
        pytest.param(lambda d: (d / "checkpoint.img").mkdir(), False, id="a-directory"),
        pytest.param(_link_to_an_image, False, id="a-symlink"),
    ],
)
def test_an_image_is_whole_only_as_a_non_empty_regular_file(
    tmp_path: Path, make: Callable[[Path], object], whole: bool
) -> None:
    """image_is_whole: runsc writes checkpoint.img itself, as a regular file; anything else
    in its place (nothing, an empty file, a directory, a link) is no image."""
    image = tmp_path / "ck" / "a" / "3"
    image.mkdir(parents=True)
    make(image)
    assert eventlog.image_is_whole(image) is whole


async def test_an_unreadable_runtime_state_is_the_effects_failure(
    log_path: Path, tmp_path: Path, runtime: FakeRuntime, injector: FakeInjector
) -> None:
    """When runsc state itself fails, nothing is assumed: the effect failed, recoverably."""
    await _crash_in("starting", log_path, tmp_path, runtime, injector)
    runtime.fail["state"] = "runsc: permission denied"
    recovery = await recover(log_path, runtime=runtime, checkpoint_root=tmp_path)
    (line,) = recovery.report
    assert line.runtime.startswith("unreadable")
    assert recovery.actors["a"].state == "failed"
    assert "could not be read" in (recovery.actors["a"].reason or "")


async def test_actors_at_rest_resume_untouched_and_seq_continues(
    log_path: Path, tmp_path: Path, runtime: FakeRuntime, injector: FakeInjector
) -> None:
    """No in-flight actor: nothing is reconciled, the runtime is only asked whether the GPU
    actor's sandbox runs (what it holds, issue 30), never changed; the CPU actor is not
    asked; new events follow the last seq."""
    async with (
        await EventLog.open(log_path) as log,
        _agent(runtime, injector, tmp_path, log) as agent,
    ):
        await bring_to_running(agent, "a")
        await bring_to_running(agent, "b", gpu=False)
    runtime.calls.clear()
    recovery = await recover(log_path, runtime=runtime, checkpoint_root=tmp_path)
    assert recovery.report == ()
    assert [c[0] for c in runtime.calls] == ["state"] and runtime.calls[0][-1] == "a"
    assert [found.actor_id for found in recovery.live] == ["a"]
    assert {a: v.state for a, v in recovery.actors.items()} == {"a": "running", "b": "running"}
    async with (
        await EventLog.open(log_path) as log,
        _agent(runtime, injector, tmp_path, log, resume=recovery.resume) as agent,
    ):
        await agent.submit(events.SuspendRequested(actor_id="b"))
        await agent.wait_for_state("b", "suspended", timeout=5)
    seqs = [e.seq for e in read_log(log_path).events]
    assert seqs == list(range(1, len(seqs) + 1))
    assert replay(log_path).actors["b"].state == "suspended"


@pytest.mark.parametrize(
    ("effect", "status", "expected"),
    [
        ("create", "creating", "effect_failed"),
        ("start", "stopped", "effect_failed"),
        ("start", "paused", "sandbox_started"),
        ("checkpoint", "paused", "checkpoint_failed"),
        ("restore", "paused", "restored"),
        ("restore", "stopped", "restore_failed"),
    ],
)
def test_decide_covers_the_other_runtime_statuses(effect: str, status: str, expected: str) -> None:
    """The pure rule function, for statuses the crash tests do not reach."""
    view = ActorView("a", "x", True, "/b", "/ck/1", 0, True, None)
    decision = eventlog.decide(view, effect, status)  # type: ignore[arg-type]
    assert decision.outcome is not None and decision.outcome.type == expected


@pytest.mark.parametrize(
    ("status", "action", "outcome"),
    [
        pytest.param("running", "rerun", None, id="alive-rerun-resume"),
        pytest.param("missing", "outcome", "cuda_resume_failed", id="gone-resume-failed"),
    ],
)
def test_interrupted_cuda_resume_is_rerun_only_while_the_sandbox_lives(status, action, outcome):
    """cuda_resume is idempotent: rerun it while the sandbox runs; else the resume failed."""
    view = ActorView("a", "cuda_resuming", True, "/b", "/ck/1", 0, True, None, cuda_pids="7")
    decision = eventlog.decide(view, "cuda_resume", status)
    assert decision.action == action
    assert (decision.outcome.type if decision.outcome else None) == outcome


def _exec_route_checkpoint_failed_lines() -> list[str]:
    """A GPU actor left in cuda_resuming: its exec-route checkpoint failed, sandbox alive."""
    life: list[events.Event] = [
        events.ActorRegistered(actor_id="a", gpu=True, bundle="/b/a"),
        events.BundlePrepared(actor_id="a", bundle="/b/a"),
        events.RunRequested(actor_id="a"),
        events.GpusAllocated(actor_id="a", names=()),
        events.GpuInjected(actor_id="a", devices=1),
        events.SandboxCreated(actor_id="a"),
        events.SandboxStarted(actor_id="a"),
        events.GpusVerified(actor_id="a"),
        events.CudaContextOpened(actor_id="a", pid=7),
        events.SuspendRequested(actor_id="a"),
        events.LiveContextFound(actor_id="a", route=events.ROUTE_EXEC),
        events.CudaSuspended(actor_id="a", pids="7"),
        events.CheckpointFailed(actor_id="a", message="disk full", sandbox_survived=True),
    ]
    return [e.stamped(seq).to_json() for seq, e in enumerate(life, start=1)]


async def test_a_crash_mid_cuda_resume_with_an_unreadable_runtime_recovers(
    tmp_path: Path, runtime: FakeRuntime
) -> None:
    """cuda_resume interrupted and `runsc state` failing: its own failure outcome, accepted."""
    log_path = logs.write_lines(
        tmp_path / "events.jsonl", logs.header(), *_exec_route_checkpoint_failed_lines()
    )
    assert replay(log_path).actors["a"].state == "cuda_resuming"
    runtime.fail["state"] = "runsc: permission denied"
    recovery = await recover(log_path, runtime=runtime, checkpoint_root=tmp_path)
    (outcome,) = recovery.reconcile_events
    assert outcome.type == "cuda_resume_failed"
    assert recovery.actors["a"].state == "stopped"


STATUSES = ("creating", "created", "running", "paused", "stopped", "missing", "unknown")


def _view(state: str, survived_flags: bool) -> ActorView:
    return ActorView(
        "a", state, True, "/b", "/ck/1", 0, True, None,
        exited=survived_flags, suspend_route=events.ROUTE_EXEC if survived_flags else "",
        cuda_pids="7",
    )  # fmt: skip


_Case = tuple[str, str, bool, eventlog.Decision]


def _decisions() -> tuple[list[_Case], list[_Case]]:
    """Every in-flight state x runtime status x flags, split by what recovery decides for
    it: an outcome (checked against the machine) or a rerun (checked against the rule)."""
    spec = machine.load_spec()
    outcomes: list[_Case] = []
    reruns: list[_Case] = []
    for state in sorted(spec.effects):
        for status in STATUSES:
            for survived_flags in (False, True):
                effect = spec.effects[state]
                decision = eventlog.decide(
                    _view(state, survived_flags),
                    effect,
                    status,  # type: ignore[arg-type]
                    image=Path("/ck/2"),
                    image_whole=True,
                )
                case = (state, status, survived_flags, decision)
                (reruns if decision.outcome is None else outcomes).append(case)
    return outcomes, reruns


OUTCOME_DECISIONS, RERUN_DECISIONS = _decisions()


def _case_id(case: _Case) -> str:
    state, status, survived_flags, _ = case
    return f"{state}-{status}{'-survived' if survived_flags else ''}"


@pytest.mark.parametrize(
    ("state", "status", "survived_flags", "decision"),
    OUTCOME_DECISIONS,
    ids=[_case_id(c) for c in OUTCOME_DECISIONS],
)
def test_every_recovery_outcome_is_accepted_by_the_machine(
    state: str, status: str, survived_flags: bool, decision: eventlog.Decision
) -> None:
    """Whatever the runtime says, the outcome recovery decides lands on a transition out of
    the in-flight state (the replayer raises InvalidEvent on one the machine refuses)."""
    spec = machine.load_spec()
    assert decision.outcome is not None
    predicted = Replayer(spec)
    predicted.load_views([_view(state, survived_flags)], 100)
    source, dest, _ = predicted.apply(decision.outcome)
    assert source == state
    if decision.then is not None:
        # The effect the outcome started ran too: its outcome lands out of that state.
        assert dest in spec.effects
        source, dest, _ = predicted.apply(decision.then)
    assert predicted.views()["a"].state == dest


@pytest.mark.parametrize(
    ("state", "status", "survived_flags", "decision"),
    RERUN_DECISIONS,
    ids=[_case_id(c) for c in RERUN_DECISIONS],
)
def test_every_recovery_rerun_is_one_the_effects_rule_names(
    state: str, status: str, survived_flags: bool, decision: eventlog.Decision
) -> None:
    """A rerun is decided only where the effect's rule says RERUN for that runtime status
    (never for an unreadable state), deletes nothing, and says why it is safe."""
    effect = machine.load_spec().effects[state]
    rule = registry.REGISTRY[effect].recovery
    assert status != "unknown"
    assert rule.action(status) is registry.RecoveryAction.RERUN  # type: ignore[arg-type]
    assert (decision.action, decision.delete_leftover) == ("rerun", False)
    assert decision.why
