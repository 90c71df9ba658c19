"""Multi-container sandbox actors on real gVisor (issue 23): ``_pause`` plus two app
containers, under the actor's own runsc root, through the agent's socket and in process.

A CPU sandbox runs, checkpoints (the whole sandbox, from ``_pause``), restores (a counter in
an app container's memory goes on from its count) and is deleted; the agent SIGKILLed after
each step recovers it; half-created, half-restored and half-deleted sandboxes are reconciled
container by container; a failure part-way leaves nothing; a GPU sandbox fails typed at
nvproxy start-up (no NVIDIA driver here) with nothing left behind.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lifecycle.doubles import FakeInjector, FakeProbe
from service.agentproc import AgentProcess, event
from support import real_runsc as runsc_
from support import runc_bundle

from substrate_gpu.eventlog import EventLog, recover, replay
from substrate_gpu.lifecycle import Agent, events, sandbox
from substrate_gpu.runsc import api, driver

COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done"
APPS = ("app", "side")
RESTING = {"running", "suspended", "stopped", "failed", "deleted"}


def _sandbox_bundles(directory: Path) -> Path:
    """``_pause`` (sleeps), ``app`` (counts in memory and /tmp/count), ``side`` (sleeps)."""
    args = {"_pause": ["/bin/sleep", "100000"], "app": ["/bin/sh", "-c", COUNTER]}
    for name in ("_pause", *APPS):
        runc_bundle.make_busybox_bundle(directory / name, args.get(name, ["/bin/sleep", "1e6"]))
    return directory


@pytest.fixture
def root(real_runsc: Path, tmp_path: Path) -> Iterator[Path]:
    """The agent's runsc root; every actor's own root under it is emptied at teardown."""
    root = tmp_path / "runsc-root"
    yield root
    if root.exists():
        for actor_root in root.iterdir():
            if actor_root.is_dir():
                runsc_.delete_all(real_runsc, actor_root)
    runsc_.delete_all(real_runsc, root)


def _agent(tmp: Path, runsc: Path) -> AgentProcess:
    flags = [f"--runsc-flag={f}" for f in runsc_.GLOBAL_FLAGS]
    return AgentProcess.on_socket(tmp, "--runsc", str(runsc), *flags)


def _state(log: Path, actor_id: str) -> str | None:
    actor = replay(log).actors.get(actor_id)
    return actor.state if actor else None


def _wait_logged(log: Path, actor_id: str, states: set[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while (state := _state(log, actor_id)) not in states:
        assert time.monotonic() < deadline, f"{actor_id} stuck in {state}, wanted {states}"
        time.sleep(0.05)
    assert state is not None
    return state


def _count(runsc: Path, actor_root: Path) -> int:
    """The app container's counter (an empty read is the shell's ``>`` mid-write)."""
    for _ in range(50):
        out = runsc_.run(runsc, actor_root, "exec", "app", "/bin/cat", "/tmp/count", check=False)
        if out.stdout.strip():
            return int(out.stdout)
        time.sleep(0.02)
    return 0


def _register(actor_id: str, bundle: Path, *, gpu: bool = False) -> list[dict[str, object]]:
    return [
        event(
            "actor_registered",
            actor_id,
            v=3,
            gpu=gpu,
            bundle=str(bundle),
            containers=list(APPS),
            identity={"atespace": "t", "actor_name": actor_id},
        ),
        event("bundle_prepared", actor_id, bundle=str(bundle)),
        event("run_requested", actor_id),
    ]


def _no_sandbox_process_left(root: Path) -> None:
    leftovers = subprocess.run(
        ["pgrep", "-f", f"runsc-sandbox.*{root}"], capture_output=True, check=False
    )
    assert leftovers.stdout == b""


def test_a_sandbox_actors_whole_life_over_the_socket(
    real_runsc: Path, tmp_path: Path, root: Path
) -> None:
    """register → running (three containers under its own root) → suspended (the image is
    the whole sandbox's; nothing left) → running, the app's counter going on → deleted."""
    bundle = _sandbox_bundles(tmp_path / "s1")
    actor_root = root / "s1"
    agent = _agent(tmp_path, real_runsc)
    try:
        with agent.client() as client:
            assert all(a["ok"] for a in client.requests(_register("s1", bundle)))
            _wait_logged(agent.log, "s1", {"running"})
            assert sorted(runsc_.list_ids(real_runsc, actor_root)) == ["_pause", "app", "side"]
            assert runsc_.list_ids(real_runsc, root) == []  # nothing on the shared root
            shown = client.request({"query": "actor", "actor_id": "s1"})["actor"]
            assert (shown["containers"], shown["identity"]["actor_name"]) == (list(APPS), "s1")
            deadline = time.monotonic() + 20
            while (before := _count(real_runsc, actor_root)) < 10:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert client.request(event("suspend_requested", "s1", v=2))["ok"]
            _wait_logged(agent.log, "s1", {"suspended"})
            assert runsc_.list_ids(real_runsc, actor_root) == []
            image = Path(str(replay(agent.log).actors["s1"].checkpoint))
            assert (image / "checkpoint.img").stat().st_size > 0
            assert client.request(event("restore_requested", "s1"))["ok"]
            _wait_logged(agent.log, "s1", {"running"})
            assert sorted(runsc_.list_ids(real_runsc, actor_root)) == ["_pause", "app", "side"]
            assert _count(real_runsc, actor_root) >= before  # memory came back, not a restart
            assert client.request(event("delete_requested", "s1"))["ok"]
            _wait_logged(agent.log, "s1", {"deleted"})
    finally:
        assert agent.terminate() == 0
    assert runsc_.list_ids(real_runsc, actor_root) == []
    _no_sandbox_process_left(root)


def _wait_for_orphaned_commands(runsc: Path, actor_root: Path, timeout: float = 60) -> None:
    """Until no runsc command the killed agent started under ``actor_root`` still runs (each
    runs in its own session and outlives the agent; sandboxes and gofers rename themselves
    ``runsc-sandbox``/``runsc-gofer``, so only commands match)."""
    deadline = time.monotonic() + timeout
    pattern = f"^{runsc} --root {actor_root} "
    while subprocess.run(["pgrep", "-f", pattern], capture_output=True, check=False).stdout:
        assert time.monotonic() < deadline, "a runsc command of the killed agent hangs"
        time.sleep(0.05)


def _restart_and_rest(tmp: Path, runsc: Path, actor_id: str) -> tuple[AgentProcess, str]:
    agent = _agent(tmp, runsc)
    return agent, _wait_logged(agent.log, actor_id, RESTING)


@pytest.mark.parametrize(
    "delay",
    [
        pytest.param(0.0, id="before-runsc-runs"),
        pytest.param(0.15, id="between-runsc-commands"),
    ],
)
def test_the_agent_sigkilled_after_each_step_recovers_the_sandbox(
    real_runsc: Path, tmp_path: Path, root: Path, delay: float
) -> None:
    """SIGKILL ``delay`` seconds after each request is logged (its effect not started, or
    part-way through its runsc commands); once the runsc command it was running has ended,
    the restarted agent reconciles every container to a resting state that matches runsc,
    and the next step goes on from there; at the end nothing is left. (An agent restarted
    while that command still runs can decide before it lands: docs/runsc.md.)"""
    bundle = _sandbox_bundles(tmp_path / "k1")
    actor_root = root / "k1"
    steps: list[tuple[str, list[dict[str, object]], set[str]]] = [
        ("run", _register("k1", bundle), {"running"}),
        ("suspend", [event("suspend_requested", "k1")], {"suspended"}),
        ("restore", [event("restore_requested", "k1")], {"running"}),
        ("delete", [event("delete_requested", "k1")], {"deleted"}),
    ]
    seen: list[tuple[str, str]] = []
    for name, requests, wanted in steps:
        agent = _agent(tmp_path, real_runsc)
        try:
            with agent.client() as client:
                assert all(a["ok"] for a in client.requests(requests)), name
            time.sleep(delay)
            agent.process.send_signal(signal.SIGKILL)
            agent.wait()
        finally:
            agent.kill()
        _wait_for_orphaned_commands(real_runsc, actor_root)
        agent, rested = _restart_and_rest(tmp_path, real_runsc, "k1")
        try:
            listed = sorted(runsc_.list_ids(real_runsc, actor_root))
            if rested == "running":
                assert listed == ["_pause", "app", "side"], (name, rested)
            if rested in {"suspended", "failed", "deleted"}:
                assert listed == [], (name, rested, listed)
            with agent.client() as client:
                # A failed step is retried (from the last checkpoint, else the bundle), and
                # the step is asked again until the actor is where the step leads.
                while rested not in wanted:
                    retry = "retry_requested" if rested == "failed" else None
                    again = event(retry, "k1") if retry else requests[-1]
                    assert client.request(again)["ok"], (name, rested)
                    rested = _wait_logged(agent.log, "k1", RESTING - {rested} | wanted)
        finally:
            assert agent.terminate() == 0
        seen.append((name, rested))
    assert seen == [(name, next(iter(wanted))) for name, _, wanted in steps]
    assert runsc_.list_ids(real_runsc, actor_root) == []
    _no_sandbox_process_left(root)


# --- in process: exact half-made sandboxes, reconciled --------------------------------------


def _driver(real_runsc: Path, root: Path) -> driver.RunscDriver:
    return driver.RunscDriver(
        driver.RunscConfig(root=root, runsc=str(real_runsc), global_flags=runsc_.GLOBAL_FLAGS)
    )


def _agent_on(runtime: driver.RunscDriver, tmp: Path, log: EventLog, **kw: object) -> Agent:
    injector = FakeInjector()
    return Agent(
        runtime=runtime,
        probe=FakeProbe(None),  # type: ignore[arg-type]  # CPU actors are never probed
        injector=injector,
        checkpoint_root=tmp / "checkpoints",
        recorder=log,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("half", "outcome", "final"),
    [
        pytest.param("created", "effect_failed", "failed", id="half-created"),
        pytest.param("restored", "restore_failed", "suspended", id="half-restored"),
        pytest.param("deleted", None, "deleted", id="half-deleted"),
    ],
)
async def test_a_half_made_sandbox_is_reconciled_container_by_container(
    real_runsc: Path, tmp_path: Path, root: Path, half: str, outcome: str | None, final: str
) -> None:
    """The log leaves the actor mid-effect; runsc holds part of the sandbox (made here by
    hand, as a SIGKILL between two runsc commands leaves it). Recovery asks every container:
    a half-made sandbox is deleted (apps first) and failed; a half-deleted one's delete is
    run again. Nothing is left under the actor's root."""
    bundle = _sandbox_bundles(tmp_path / "h1")
    runtime = _driver(real_runsc, root)
    box = sandbox.Sandbox("h1", runtime.for_actor("h1"), bundle, APPS)
    log_path = tmp_path / "events.jsonl"
    entering = {"created": "creating", "restored": "restoring", "deleted": "deleting"}[half]
    registration = [events.from_dict(line) for line in _register("h1", bundle)]
    async with await EventLog.open(log_path) as log, _agent_on(runtime, tmp_path, log) as agent:
        if half != "created":  # half-created: the registration alone is logged (below)
            for registered in registration:
                await agent.submit(registered)
            await agent.wait_for_state("h1", "running", timeout=60)
        if half == "restored":
            await agent.submit(events.SuspendRequested(actor_id="h1"))
            await agent.wait_for_state("h1", "suspended", timeout=60)
    # The agent is gone: log the event that entered the effect's state (as a killed agent
    # had), and bring the sandbox to where a kill between two runsc commands leaves it.
    trigger: list[events.Event]
    if half == "created":
        trigger = registration
        await box.runtime.create("_pause", bundle / "_pause", nvproxy=False)
        await box.runtime.start("_pause")
        await box.runtime.create("app", bundle / "app", nvproxy=False)
    elif half == "restored":
        image = Path(str(replay(log_path).actors["h1"].checkpoint))
        trigger = [events.RestoreRequested(actor_id="h1")]
        for name in sandbox.PAUSE, *APPS:
            sandbox.ensure_annotations(bundle, name)
        await box.runtime.create("_pause", bundle / "_pause", nvproxy=False)
        await box.runtime.restore("_pause", bundle / "_pause", image, nvproxy=False)
        await box.runtime.create("app", bundle / "app", nvproxy=False)
    else:
        trigger = [events.DeleteRequested(actor_id="h1")]
        await box.runtime.delete("side", force=True)
    last = replay(log_path).last_seq
    with log_path.open("a") as f:
        for i, logged in enumerate(trigger, start=last + 1):
            f.write(logged.stamped(i).to_json() + "\n")
    assert replay(log_path).actors["h1"].state == entering

    recovery = await recover(log_path, runtime=runtime, checkpoint_root=tmp_path / "checkpoints")
    assert [e.type for e in recovery.reconcile_events] == ([outcome] if outcome else [])
    assert recovery.rerun == (() if outcome else ("h1",))
    async with (
        await EventLog.open(log_path) as log,
        _agent_on(runtime, tmp_path, log, resume=recovery.resume) as agent,
    ):
        await agent.settle()
        assert agent.state_of("h1") == final
        if final != "deleted":
            await agent.submit(events.DeleteRequested(actor_id="h1"))
            await agent.wait_for_state("h1", "deleted", timeout=60)
    assert runsc_.list_ids(real_runsc, root / "h1") == []


@pytest.mark.anyio
async def test_a_failure_part_way_on_runsc_leaves_no_container(
    real_runsc: Path, tmp_path: Path, root: Path
) -> None:
    """The second app container cannot be created (its bundle has no config.json): _pause
    and the first app are deleted, the actor fails naming ``side``."""
    bundle = _sandbox_bundles(tmp_path / "p1")
    (bundle / "side" / "config.json").unlink()
    runtime = _driver(real_runsc, root)
    async with await EventLog.open(tmp_path / "events.jsonl") as log:
        async with _agent_on(runtime, tmp_path, log) as agent:
            for line in _register("p1", bundle):
                await agent.submit(events.from_dict(line))
            await agent.settle()
            actor = agent.actor("p1")
    assert actor is not None and actor.state == "failed"
    assert "while annotating container side's bundle" in (actor.reason or "")
    assert runsc_.list_ids(real_runsc, root / "p1") == []


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("breakage", "step"),
    [
        pytest.param("process", "creating", id="create-refused"),
        pytest.param("rootfs", "starting", id="start-refused"),
    ],
)
async def test_runsc_refusing_the_second_app_deletes_pause_and_the_first_app(
    real_runsc: Path, tmp_path: Path, root: Path, breakage: str, step: str
) -> None:
    """runsc refuses the second app container (a spec without a process fails its create; a
    missing rootfs passes create and fails start: runsc makes a sub-container lazily): what
    was made goes, the reason names ``side``."""
    bundle = _sandbox_bundles(tmp_path / "p2")
    config = json.loads((bundle / "side" / "config.json").read_text())
    if breakage == "process":
        del config["process"]
    else:
        config["root"]["path"] = str(tmp_path / "no-such-rootfs")
    (bundle / "side" / "config.json").write_text(json.dumps(config))
    runtime = _driver(real_runsc, root)
    async with await EventLog.open(tmp_path / "events.jsonl") as log:
        async with _agent_on(runtime, tmp_path, log) as agent:
            for line in _register("p2", bundle):
                await agent.submit(events.from_dict(line))
            await agent.settle()
            actor = agent.actor("p2")
    assert actor is not None and actor.state == "failed"
    assert f"while {step} container side of sandbox p2" in (actor.reason or "")
    assert runsc_.list_ids(real_runsc, root / "p2") == []
    _no_sandbox_process_left(root)


@pytest.mark.anyio
async def test_a_gpu_sandbox_boots_pause_with_nvproxy_and_fails_typed_here(
    real_runsc: Path, tmp_path: Path, root: Path
) -> None:
    """``create --nvproxy _pause`` is where a GPU sandbox boots: on this driver-less host
    runsc fails there (nvproxy cannot open /dev/nvidiactl), the actor fails naming
    ``_pause``, and no container is left."""
    bundle = _sandbox_bundles(tmp_path / "g1")
    runtime = _driver(real_runsc, root)
    async with await EventLog.open(tmp_path / "events.jsonl") as log:
        async with _agent_on(runtime, tmp_path, log) as agent:
            for line in _register("g1", bundle, gpu=True):
                await agent.submit(events.from_dict(line))
            await agent.settle()
            actor = agent.actor("g1")
    assert actor is not None and actor.state == "failed"
    reason = actor.reason or ""
    assert "while creating container _pause of sandbox g1" in reason
    assert "failed to get Nvidia driver version" in reason  # nvproxy was asked for at boot
    assert runsc_.list_ids(real_runsc, root / "g1") == []
    # The same step, typed: runsc's error, its argv with --nvproxy before create _pause.
    box = sandbox.Sandbox("g1", runtime.for_actor("g1"), bundle, APPS)
    with pytest.raises(sandbox.SandboxError) as caught:
        await sandbox.create(box, nvproxy=True)
    cause = caught.value.__cause__
    assert isinstance(cause, api.NvproxyUnavailableError)
    assert caught.value.container == "_pause"
    assert cause.argv.index("--nvproxy") < cause.argv.index("create") < cause.argv.index("_pause")
    assert runsc_.list_ids(real_runsc, root / "g1") == []
