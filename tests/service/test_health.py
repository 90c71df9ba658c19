"""AgentHealth: what each liveness and readiness check says, on a clock the test moves."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from substrate_gpu.service.config import AgentConfig
from substrate_gpu.service.health import AgentHealth, recovery_detail


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def health_of(tmp_path: Path, clock: Clock, **config: object) -> AgentHealth:
    settings: dict[str, object] = {
        "event_log": tmp_path / "events.jsonl",
        "runsc": str(tmp_path / "no-runsc-here"),
        "liveness_timeout": 5.0,
    }
    settings.update(config)
    return AgentHealth(AgentConfig(**settings), clock=clock)  # type: ignore[arg-type]


def checks(report) -> dict[str, tuple[bool, str]]:
    return {c.name: (c.ok, c.detail) for c in report.checks}


def test_liveness_passes_while_starting_however_long_the_loop_is_held(tmp_path):
    """Before recovery finishes a silent loop is not a liveness failure (replay is synchronous)."""
    clock = Clock()
    health = health_of(tmp_path, clock)
    clock.now += 600
    report = health.liveness()
    assert report.ok
    assert checks(report)["loop"] == (True, "starting (recovery may hold the loop)")


def test_liveness_fails_once_the_heartbeat_is_older_than_the_timeout(tmp_path):
    """After start, a heartbeat older than --liveness-timeout fails ``loop``, saying so."""
    clock = Clock()
    health = health_of(tmp_path, clock)
    health.recovered("finished")
    clock.now += 5.0
    assert health.liveness().ok
    clock.now += 0.5
    report = health.liveness()
    assert report.failed == ("loop",)
    assert "no heartbeat for 5.5 s (--liveness-timeout 5)" in report.checks[0].detail


@pytest.mark.anyio
async def test_the_heartbeat_task_keeps_liveness_passing(tmp_path):
    """With the heartbeat running on the loop (real clock), liveness holds past the timeout."""
    health = AgentHealth(AgentConfig(event_log=tmp_path / "e.jsonl", liveness_timeout=0.2))
    health.recovered("finished")
    async with anyio.create_task_group() as tg:
        tg.start_soon(health.heartbeat)
        await anyio.sleep(0.5)
        assert health.liveness().ok
        tg.cancel_scope.cancel()


def test_readiness_fails_on_recovery_and_runsc_until_both_are_done(tmp_path):
    """At start: ``recovery: running`` and ``runsc: not checked yet``; the log is locked."""
    report = health_of(tmp_path, Clock()).readiness()
    assert report.failed == ("recovery", "runsc")
    assert checks(report)["recovery"] == (False, "running")
    assert checks(report)["runsc"] == (False, "not checked yet")
    assert checks(report)["event_log"][0] is True


@pytest.mark.anyio
async def test_runsc_that_answers_makes_the_agent_ready(tmp_path, real_runsc):
    """Real runsc answering ``--version``: every check passes, runsc's names its version."""
    health = health_of(tmp_path, Clock(), runsc=str(real_runsc))
    health.recovered(recovery_detail(tmp_path / "events.jsonl", 0, 0))
    health.serving(lambda: None)
    assert await health.check_runsc()
    report = health.readiness()
    assert report.ok, report.body()
    _ok, detail = checks(report)["runsc"]
    assert detail.startswith("runsc version ")
    assert checks(report)["event_log"] == (True, f"{tmp_path / 'events.jsonl'} open and locked")
    assert checks(report)["recovery"] == (True, "finished: the event log was empty")


@pytest.mark.anyio
async def test_a_missing_runsc_fails_readiness_naming_the_binary(tmp_path):
    """runsc that cannot be started: only ``runsc`` fails, and it names the path."""
    health = health_of(tmp_path, Clock())
    health.recovered("finished")
    assert not await health.check_runsc()
    report = health.readiness()
    assert report.failed == ("runsc",)
    assert "no-runsc-here" in checks(report)["runsc"][1]


@pytest.mark.anyio
async def test_a_runsc_that_prints_nothing_is_not_answering(tmp_path):
    """Exit 0 with no output (not runsc): the check fails and says so."""
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\nexit 0\n")
    silent.chmod(0o755)
    health = health_of(tmp_path, Clock(), runsc=str(silent))
    assert not await health.check_runsc()
    assert "printed nothing" in checks(health.readiness())["runsc"][1]


@pytest.mark.anyio
async def test_a_runsc_answer_goes_stale_when_the_watcher_stops(tmp_path, real_runsc):
    """A good answer older than the max age fails the check: the watcher is stuck."""
    clock = Clock()
    health = AgentHealth(
        AgentConfig(event_log=None, runsc=str(real_runsc)), clock=clock, runsc_max_age=70
    )
    assert await health.check_runsc()
    clock.now += 71
    ok, detail = checks(health.readiness())["runsc"]
    assert not ok
    assert detail == "last checked 71 s ago: the check is stuck"


def test_a_failed_event_log_fails_readiness_with_its_cause(tmp_path):
    """Once the service's log failed, ``event_log`` fails quoting the cause."""
    health = health_of(tmp_path, Clock())
    failure: list[str] = []
    health.recovered("finished")
    health.serving(lambda: failure[0] if failure else None)
    assert checks(health.readiness())["event_log"][0]
    failure.append("No space left on device")
    assert checks(health.readiness())["event_log"] == (
        False,
        "failed: No space left on device",
    )


def test_draining_fails_readiness(tmp_path):
    """After SIGTERM the agent is no longer ready (``serving``), while it drains."""
    health = health_of(tmp_path, Clock())
    assert checks(health.readiness())["serving"] == (True, "accepting requests")
    health.draining()
    assert checks(health.readiness())["serving"] == (False, "shutting down: draining")


def test_without_an_event_log_the_check_passes_and_says_nothing_is_durable(tmp_path):
    """No --event-log is allowed (tests, stdin use): the check passes and warns."""
    health = health_of(tmp_path, Clock(), event_log=None)
    assert checks(health.readiness())["event_log"] == (
        True,
        "none configured (--event-log): nothing is durable",
    )
    assert recovery_detail(None, 0, 0) == "nothing to recover (no event log)"
    assert recovery_detail(tmp_path, 3, 41) == "finished: 3 actors resumed at seq 41"
