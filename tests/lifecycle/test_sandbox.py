"""Multi-container sandboxes through the Agent (issue 23): each effect acts on ``_pause`` and
the app containers in the order docs/runsc.md gives, under the actor's own runsc root; a
failure part-way leaves no container and names the one that failed."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from lifecycle.doubles import FakeInjector, FakeRuntime, _Container
from substrate_gpu.eventlog import EventLog, recover
from substrate_gpu.lifecycle import Agent, events, sandbox

pytestmark = pytest.mark.anyio

MakeAgent = Callable[..., Agent]
APPS = ("app", "side")


def _bundles(tmp_path: Path, annotated: bool = False) -> Path:
    """A sandbox bundle directory: ``_pause/`` and one directory per app, each a config."""
    top = tmp_path / "bundles" / "s"
    for name in ("_pause", *APPS):
        (top / name).mkdir(parents=True)
        config: dict[str, object] = {"ociVersion": "1.0.2", "process": {"args": ["sleep"]}}
        if annotated:
            config["annotations"] = sandbox.cri_annotations(name)
        (top / name / "config.json").write_text(json.dumps(config))
    return top


def _register(bundle: Path, *, gpu: bool) -> list[events.Event]:
    return [
        events.ActorRegistered(actor_id="s", gpu=gpu, bundle=str(bundle), containers=APPS),
        events.BundlePrepared(actor_id="s", bundle=str(bundle)),
        events.RunRequested(actor_id="s"),
    ]


def _sandbox_calls(runtime: FakeRuntime) -> list[tuple[str, ...]]:
    """Each call on the actor's own root, as (op, [--nvproxy,] container)."""
    return [
        (str(c[0]), *(str(a) for a in c[3:] if a == "--nvproxy"), str(c[-1]))
        for c in runtime.calls
        if c[2:3] == ("--root=s",) and c[0] not in {"state", "features"}
    ]


async def _run(agent: Agent, bundle: Path, *, gpu: bool) -> None:
    for event in _register(bundle, gpu=gpu):
        await agent.submit(event)
    await agent.wait_for_state("s", "running", timeout=5)


async def test_a_gpu_sandbox_boots_with_nvproxy_on_pause_and_injects_every_app(
    make_agent: MakeAgent, runtime: FakeRuntime, injector: FakeInjector, tmp_path: Path
) -> None:
    """create _pause --nvproxy, start it, create each app; start each app; GPUs go into
    every app container's bundle, never into _pause's."""
    bundle = _bundles(tmp_path)
    async with make_agent() as agent:
        await _run(agent, bundle, gpu=True)
    assert _sandbox_calls(runtime) == [
        ("create", "--nvproxy", "_pause"),
        ("start", "_pause"),
        ("create", "--nvproxy", "app"),
        ("create", "--nvproxy", "side"),
        ("start", "app"),
        ("start", "side"),
    ]
    assert injector.calls == [bundle / "app", bundle / "side"]
    assert set(runtime.roots["s"].containers) == {"_pause", *APPS}
    assert runtime.containers == {}  # nothing under the worker's own root


async def test_a_cpu_sandbox_checkpoints_its_pause_and_restores_every_container(
    make_agent: MakeAgent, runtime: FakeRuntime, injector: FakeInjector, tmp_path: Path
) -> None:
    """suspend: checkpoint of _pause, then apps deleted before _pause; restore: create +
    restore of _pause, then of each app, from the same image; delete: apps, then _pause."""
    bundle = _bundles(tmp_path)
    async with make_agent() as agent:
        await _run(agent, bundle, gpu=False)
        runtime.calls.clear()
        await agent.submit(events.SuspendRequested(actor_id="s"))
        await agent.wait_for_state("s", "suspended", timeout=5)
        suspended = _sandbox_calls(runtime)
        assert runtime.removed_roots == ["s"]  # the teardown leaves no root behind
        runtime.calls.clear()
        await agent.submit(events.RestoreRequested(actor_id="s"))
        await agent.wait_for_state("s", "running", timeout=5)
        restored = _sandbox_calls(runtime)
        runtime.calls.clear()
        await agent.submit(events.DeleteRequested(actor_id="s"))
        await agent.wait_for_state("s", "deleted", timeout=5)
    assert suspended[0] == ("checkpoint", "_pause")
    # Apps first, _pause last; an app already gone is not deleted again after _pause
    # (only one an exited sandbox refused: test_deleting_an_exited_sandbox_retries...).
    assert [c[-1] for c in suspended[1:]] == ["side", "app", "_pause"]
    assert restored == [
        ("create", "_pause"),
        ("restore", "_pause"),
        ("create", "app"),
        ("restore", "app"),
        ("create", "side"),
        ("restore", "side"),
    ]
    assert _sandbox_calls(runtime) == [("delete", "side"), ("delete", "app"), ("delete", "_pause")]
    assert runtime.removed_roots == ["s", "s"]  # after the teardown, and after the delete
    assert runtime.roots["s"].containers == {}
    assert injector.calls == []  # a CPU sandbox: nothing injected


async def test_a_gpu_sandbox_restores_with_nvproxy_on_every_restore_and_reinjects(
    make_agent: MakeAgent, runtime: FakeRuntime, injector: FakeInjector, tmp_path: Path
) -> None:
    """Every create and restore of a GPU sandbox's restore carries --nvproxy; the app
    bundles get their GPUs again first (re-unpacked bundles), _pause's never."""
    bundle = _bundles(tmp_path)
    async with make_agent() as agent:
        await _run(agent, bundle, gpu=True)
        await agent.submit(events.SuspendRequested(actor_id="s"))
        await agent.wait_for_state("s", "suspended", timeout=5)
        runtime.calls.clear()
        injector.calls.clear()
        await agent.submit(events.RestoreRequested(actor_id="s"))
        await agent.wait_for_state("s", "running", timeout=5)
    # The creates inside the restore too: an app created without --nvproxy joins a sandbox
    # whose sentry then cannot serve its GPU.
    assert _sandbox_calls(runtime) == [
        (verb, "--nvproxy", name) for name in ("_pause", *APPS) for verb in ("create", "restore")
    ]
    assert injector.calls == [bundle / "app", bundle / "side"]


@pytest.mark.parametrize(
    ("failing", "effect", "state"),
    [
        pytest.param(("create", "side"), "create", "failed", id="second-app-create"),
        pytest.param(("start", "_pause"), "create", "failed", id="pause-start"),
        pytest.param(("start", "side"), "create", "failed", id="second-app-start"),
        pytest.param(("restore", "app"), "restore", "suspended", id="first-app-restore"),
    ],
)
async def test_a_failure_part_way_leaves_no_container_and_names_it(
    make_agent: MakeAgent,
    runtime: FakeRuntime,
    tmp_path: Path,
    failing: tuple[str, str],
    effect: str,
    state: str,
) -> None:
    """What was made is deleted (apps first, _pause last); the actor lands on the effect's
    failure transition with the container's name in its reason."""
    bundle = _bundles(tmp_path)
    async with make_agent() as agent:
        if effect == "restore":
            await _run(agent, bundle, gpu=False)
            await agent.submit(events.SuspendRequested(actor_id="s"))
            await agent.wait_for_state("s", "suspended", timeout=5)
        runtime.fail_on[failing] = "boom"
        runtime.calls.clear()
        if effect == "create":
            for event in _register(bundle, gpu=False):
                await agent.submit(event)
        else:
            await agent.submit(events.RestoreRequested(actor_id="s"))
        await agent.settle()
        actor = agent.actor("s")
    assert actor is not None
    verb = {"create": "creating", "start": "starting", "restore": "restoring"}[failing[0]]
    assert f"while {verb} container {failing[1]} of sandbox s" in (actor.reason or "")
    assert actor.state == state
    assert runtime.roots["s"].containers == {}
    assert not runtime.roots["s"].has_root()  # the clean-up removed it
    # Cleaned up apps first, _pause after them (then apps once more: an exited sandbox).
    deletes = [c[-1] for c in _sandbox_calls(runtime) if c[0] == "delete"]
    first_pass = deletes[: deletes.index("_pause") + 1]
    assert first_pass[-1] == "_pause" and set(first_pass[:-1]) <= set(APPS)


async def test_deleting_an_exited_sandbox_retries_its_apps_after_pause(
    make_agent: MakeAgent, runtime: FakeRuntime, tmp_path: Path
) -> None:
    """runsc refuses an app's delete once the sandbox exited ("connection refused") and
    deleting _pause clears it: the app is deleted again after _pause; one that still
    fails then is the outcome, naming it (here the fake never lets it go)."""
    bundle = _bundles(tmp_path)
    async with make_agent() as agent:
        await _run(agent, bundle, gpu=False)
        runtime.fail_on["delete", "app"] = "connecting to control server: connection refused"
        await agent.submit(events.DeleteRequested(actor_id="s"))
        await agent.settle()
        actor = agent.actor("s")
    # The fake keeps failing the app: the second attempt's failure is the outcome's reason.
    assert actor is not None and actor.state == "failed"
    assert "while deleting container app of sandbox s" in (actor.reason or "")
    deletes = [c[-1] for c in _sandbox_calls(runtime) if c[0] == "delete"]
    assert deletes == ["side", "app", "_pause", "app"]
    # The app's record is still in the root: kept, for the next delete to try again.
    assert runtime.removed_roots == [] and runtime.roots["s"].has_root()


async def test_a_leftover_sandbox_the_actor_does_not_know_of_is_replaced(
    make_agent: MakeAgent, runtime: FakeRuntime, tmp_path: Path
) -> None:
    """A runsc create of a killed agent finished after recovery (the actor believes no
    container exists): the next create finds _pause taken, deletes the leftover, goes on."""
    bundle = _bundles(tmp_path)
    stray = runtime.for_actor("s")
    stray.containers = {
        n: _Container("created", 9, "/b", False)  # type: ignore[arg-type]
        for n in ("_pause", "app")
    }
    async with make_agent() as agent:
        await _run(agent, bundle, gpu=False)
    calls = _sandbox_calls(runtime)
    assert calls[:4] == [
        ("create", "_pause"),
        ("delete", "side"),
        ("delete", "app"),
        ("delete", "_pause"),
    ]
    assert set(stray.containers) == {"_pause", *APPS}
    assert {c.status for c in stray.containers.values()} == {"running"}


async def test_a_single_container_actor_is_untouched_by_sandboxes(
    make_agent: MakeAgent, runtime: FakeRuntime, tmp_path: Path
) -> None:
    """containers=(): the actor id is the container id, on the worker's own root."""
    async with make_agent() as agent:
        await agent.submit(events.ActorRegistered(actor_id="a", gpu=True, bundle="/b/a"))
        await agent.submit(events.BundlePrepared(actor_id="a", bundle="/b/a"))
        await agent.submit(events.RunRequested(actor_id="a"))
        await agent.wait_for_state("a", "running", timeout=5)
    assert runtime.roots == {}
    assert runtime.ops("create") == [("runsc", "--nvproxy", "create", "a")]


class _NoRoots:
    """A runtime without per-actor roots (it delegates everything else)."""

    def __init__(self, inner: FakeRuntime) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        if name == "for_actor":
            raise AttributeError(name)
        return getattr(self._inner, name)


async def test_a_runtime_without_per_actor_roots_fails_a_sandbox_clearly(
    make_agent: MakeAgent, runtime: FakeRuntime, tmp_path: Path
) -> None:
    """No per-actor root: the create fails, saying what the sandbox needs; nothing is run."""
    async with make_agent(runtime=_NoRoots(runtime)) as agent:
        for event in _register(_bundles(tmp_path), gpu=False):
            await agent.submit(event)
        await agent.settle()
        actor = agent.actor("s")
    assert actor is not None and actor.state == "failed"
    assert "has no per-actor runsc root" in (actor.reason or "")
    assert runtime.ops("create") == []


# --- CRI annotations -----------------------------------------------------------------------


def test_annotations_are_written_once_and_a_bundle_that_has_them_is_left_byte_for_byte(
    tmp_path: Path,
) -> None:
    """The roles runsc reads; a second pass (or atelet's own annotations) rewrites nothing."""
    bundle = _bundles(tmp_path)
    assert sandbox.ensure_annotations(bundle, "_pause")
    assert sandbox.ensure_annotations(bundle, "app")
    pause = json.loads((bundle / "_pause" / "config.json").read_text())
    app = json.loads((bundle / "app" / "config.json").read_text())
    assert pause["annotations"] == {"io.kubernetes.cri.container-type": "sandbox"}
    assert app["annotations"] == {
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-id": "_pause",
    }
    before = (bundle / "app" / "config.json").read_bytes()
    assert not sandbox.ensure_annotations(bundle, "app")
    assert (bundle / "app" / "config.json").read_bytes() == before


def test_annotations_keep_the_bundles_other_annotations_and_its_mode(tmp_path: Path) -> None:
    """A wrong role is corrected; other annotations and the file's mode stay."""
    (tmp_path / "app").mkdir()
    config = tmp_path / "app" / "config.json"
    other = {"x": "1", "io.kubernetes.cri.container-type": "sandbox"}
    config.write_text(json.dumps({"annotations": other}))
    config.chmod(0o640)
    assert sandbox.ensure_annotations(tmp_path, "app")
    assert json.loads(config.read_text())["annotations"] == {
        "x": "1",
        **sandbox.cri_annotations("app"),
    }
    assert config.stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        pytest.param(None, "No such file", id="missing"),
        pytest.param("[1]", "not a JSON object", id="not-an-object"),
        pytest.param('{"annotations": 3}', "'annotations' is not an object", id="bad-annotations"),
        pytest.param("{", "is not valid JSON", id="not-json"),
    ],
)
def test_an_unusable_config_is_refused_naming_the_container(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    """SandboxError says which container's bundle and why."""
    (tmp_path / "side").mkdir()
    if content is not None:
        (tmp_path / "side" / "config.json").write_text(content)
    with pytest.raises(sandbox.SandboxError, match=problem) as caught:
        sandbox.ensure_annotations(tmp_path, "side")
    assert caught.value.container == "side"
    assert "container side's bundle" in str(caught.value)
    assert f"{tmp_path}/side/config.json" in str(caught.value)


def test_a_fifo_config_is_refused_at_once_naming_it(tmp_path: Path) -> None:
    """A FIFO in place of config.json (nobody writing it): refused without blocking."""
    (tmp_path / "_pause").mkdir()
    os.mkfifo(tmp_path / "_pause" / "config.json")
    with pytest.raises(sandbox.SandboxError, match=r"it is not a regular file \(a FIFO\)"):
        sandbox.ensure_annotations(tmp_path, "_pause")


def test_a_symlinked_container_directory_is_refused_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    """``_pause`` a link to a bundle elsewhere: refused, and nothing written there."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text('{"ociVersion": "1.0.2"}')
    before = (elsewhere / "config.json").read_bytes()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "_pause").symlink_to(elsewhere)
    with pytest.raises(sandbox.SandboxError, match="'_pause' on its path is a symbolic link"):
        sandbox.ensure_annotations(tmp_path / "b", "_pause")
    assert (elsewhere / "config.json").read_bytes() == before


async def test_a_sandbox_whose_container_directory_is_a_link_fails_before_runsc(
    make_agent: MakeAgent, runtime: FakeRuntime, tmp_path: Path
) -> None:
    """The create effect refuses the link (naming it) and runs no runsc command; the
    bundle it points at is not rewritten."""
    bundle = _bundles(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (bundle / "side").rename(elsewhere)
    (bundle / "side").symlink_to(elsewhere)
    before = (elsewhere / "config.json").read_bytes()
    async with make_agent() as agent:
        for event in _register(bundle, gpu=False):
            await agent.submit(event)
        await agent.settle()
        actor = agent.actor("s")
    assert actor is not None and actor.state == "failed"
    assert "'side' on its path is a symbolic link" in (actor.reason or "")
    assert runtime.ops("create") == []
    assert (elsewhere / "config.json").read_bytes() == before


# --- what recovery reads -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("effect", "found", "status"),
    [
        pytest.param("create", ("missing", "missing", "missing"), "missing", id="nothing-made"),
        pytest.param("create", ("running", "created", "created"), "created", id="whole-create"),
        pytest.param("create", ("running", "created", "missing"), "creating", id="half-created"),
        pytest.param("create", ("created", "missing", "missing"), "creating", id="pause-only"),
        pytest.param("create", ("running", "missing", "missing"), "creating", id="apps-missing"),
        pytest.param("restore", ("running", "stopped", "stopped"), "creating", id="apps-stopped"),
        pytest.param("create", ("created", "created", "created"), "creating", id="none-started"),
        pytest.param("start", ("running", "running", "running"), "running", id="whole-start"),
        pytest.param("start", ("running", "running", "created"), "creating", id="half-started"),
        pytest.param("restore", ("running", "running", "created"), "creating", id="half-restored"),
        pytest.param("delete", ("missing", "stopped", "missing"), "creating", id="half-deleted"),
        pytest.param("delete", ("stopped", "stopped", "stopped"), "stopped", id="all-stopped"),
        pytest.param("checkpoint", ("running", "missing", "missing"), "running", id="pause-runs"),
        pytest.param("checkpoint", ("stopped", "running", "running"), "stopped", id="pause-gone"),
        pytest.param("create", ("running", "unknown", "created"), "unknown", id="unreadable"),
    ],
)
def test_a_sandboxs_statuses_sum_up_as_its_effects_rule_reads_one(
    effect: str, found: tuple[str, ...], status: str
) -> None:
    """Whole steps read as their container's status; a part-made sandbox as "creating"."""
    statuses = dict(zip(("_pause", *APPS), found, strict=True))
    assert sandbox.summarize(effect, statuses) == status  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("world", "outcome", "left"),
    [
        pytest.param({"_pause": "running", "app": "created"}, "effect_failed", set(), id="half"),
        pytest.param(
            {"_pause": "running", "app": "created", "side": "created"},
            "sandbox_created",
            {"_pause", "app", "side"},
            id="whole",
        ),
    ],
)
async def test_recovery_of_a_half_created_sandbox_deletes_every_container(
    runtime: FakeRuntime,
    injector: FakeInjector,
    tmp_path: Path,
    world: dict[str, str],
    outcome: str,
    left: set[str],
) -> None:
    """An agent killed mid-create: every container is asked; a half-made sandbox is deleted
    (apps first) and failed, a whole one carries on."""
    from lifecycle.doubles import FakeProbe

    log_path = tmp_path / "events.jsonl"
    runtime.hang.add("create")
    async with (
        await EventLog.open(log_path) as log,
        Agent(
            runtime=runtime,
            probe=FakeProbe(runtime),
            injector=injector,
            checkpoint_root=tmp_path / "ck",
            recorder=log,
        ) as agent,
    ):
        for event in _register(_bundles(tmp_path), gpu=False):
            await agent.submit(event)
        await agent.wait_for_state("s", "creating", timeout=5)
    runtime.hang.clear()
    rooted = runtime.for_actor("s")
    rooted.containers = {
        name: _Container(status, 7, f"/b/{name}", False)  # type: ignore[arg-type]
        for name, status in world.items()
    }
    runtime.calls.clear()
    recovery = await recover(log_path, runtime=runtime, checkpoint_root=tmp_path / "ck")
    assert [e.type for e in recovery.reconcile_events] == [outcome]
    assert set(rooted.containers) == left
    if not left:
        deletes = [c[-1] for c in _sandbox_calls(runtime) if c[0] == "delete"]
        assert deletes[:3] == ["side", "app", "_pause"]
    assert "sandbox: _pause running, app created" in recovery.report[0].runtime


async def test_a_teardown_that_failed_is_finished_by_the_delete(
    make_agent: MakeAgent, runtime: FakeRuntime, tmp_path: Path
) -> None:
    """After a good checkpoint the teardown's delete of _pause failed and runsc says it
    runs: the suspend did not happen (the actor runs on, as recovery reads a live sandbox
    mid-checkpoint; issue 30), and the delete effect deletes what is left and removes the
    root."""
    bundle = _bundles(tmp_path)
    async with make_agent() as agent:
        await _run(agent, bundle, gpu=False)
        runtime.fail_on["delete", "_pause"] = "stuck"
        await agent.submit(events.SuspendRequested(actor_id="s"))
        await agent.wait_for_state("s", "running", timeout=5)
        view = agent.actor("s")
        assert view is not None and "could not be deleted" in (view.reason or "")
        assert set(runtime.roots["s"].containers) == {"_pause"} and runtime.removed_roots == []
        del runtime.fail_on["delete", "_pause"]
        await agent.submit(events.DeleteRequested(actor_id="s"))
        await agent.wait_for_state("s", "deleted", timeout=5)
    assert runtime.roots["s"].containers == {}
    assert runtime.removed_roots == ["s"]


async def test_recovery_of_a_delete_interrupted_after_its_containers_removes_the_root(
    runtime: FakeRuntime, injector: FakeInjector, tmp_path: Path
) -> None:
    """An agent killed mid-delete once runsc had deleted every container: recovery records
    ``deleted`` and does the delete's last step, the root removed."""
    from lifecycle.doubles import FakeProbe

    log_path = tmp_path / "events.jsonl"
    async with (
        await EventLog.open(log_path) as log,
        Agent(
            runtime=runtime,
            probe=FakeProbe(runtime),
            injector=injector,
            checkpoint_root=tmp_path / "ck",
            recorder=log,
        ) as agent,
    ):
        await _run(agent, _bundles(tmp_path), gpu=False)
        runtime.hang.add("delete")
        await agent.submit(events.DeleteRequested(actor_id="s"))
        await agent.wait_for_state("s", "deleting", timeout=5)
    runtime.hang.clear()
    rooted = runtime.for_actor("s")
    rooted.containers = {}  # runsc finished the deletes after the agent died
    assert rooted.has_root()
    recovery = await recover(log_path, runtime=runtime, checkpoint_root=tmp_path / "ck")
    assert [e.type for e in recovery.reconcile_events] == ["deleted"]
    assert runtime.removed_roots == ["s"] and not rooted.has_root()
