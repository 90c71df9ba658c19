"""Sandbox registrations (issue 23): ``actor_registered`` v3's ``containers`` and ``identity``,
``suspend_requested`` v2's ``image_path``, on the record, the view, snapshots and recovery."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from lifecycle.doubles import FakeRuntime
from lifecycle.factories import bring_to_running
from substrate_gpu.eventlog import EventLog, read_log, recover, replay, snapshot
from substrate_gpu.lifecycle import Agent, errors, events
from substrate_gpu.service import protocol, query

MakeAgent = Callable[..., Agent]
IDENTITY = {"atespace": "team-a", "actor_name": "worker-1", "actor_uid": "u-1"}


def _registered(**fields: object) -> events.ActorRegistered:
    return events.ActorRegistered(actor_id="s", gpu=False, bundle="/b/s", **fields)  # type: ignore[arg-type]


def test_a_sandbox_registration_keeps_its_containers_in_order_and_its_identity() -> None:
    """containers (``_pause`` implied) and identity survive the JSON form (v3's fields)."""
    event = _registered(containers=("app", "sidecar"), identity=IDENTITY)
    data = json.loads(event.to_json())
    assert (data["v"], data["containers"], data["identity"]) == (4, ["app", "sidecar"], IDENTITY)
    back = events.from_json(event.to_json())
    assert back == event
    assert hash(back) == hash(event)
    assert isinstance(back, events.ActorRegistered) and back.is_sandbox


@pytest.mark.parametrize(
    ("containers", "field"),
    [
        pytest.param(("app", "_pause"), "containers[1]", id="pause-is-implied"),
        pytest.param(("app", "app"), "containers[1]", id="named-twice"),
        pytest.param(("a/b",), "containers[0]", id="a-path"),
        pytest.param(("",), "containers[0]", id="empty"),
        pytest.param(("x" * 64,), "containers[0]", id="64-characters"),
        pytest.param(("ok", "-dash"), "containers[1]", id="leading-dash"),
    ],
)
def test_a_bad_container_name_is_refused_naming_its_index(
    containers: tuple[str, ...], field: str
) -> None:
    """Each rule of a container name is checked; the error names ``containers[i]``."""
    with pytest.raises(errors.EventFieldError) as caught:
        _registered(containers=containers)
    assert caught.value.field == field
    assert repr(containers[int(field[-2])]) in str(caught.value)


def test_the_longest_container_name_is_accepted() -> None:
    """63 characters is the bound (a DNS label, as Kubernetes container names are)."""
    assert _registered(containers=("x" * 63,)).containers == ("x" * 63,)


@pytest.mark.parametrize("name", ["containers", "identity"])
def test_an_older_version_carrying_a_v3_field_is_refused(name: str) -> None:
    """A v2 line with containers or identity is no line an older agent wrote: refused."""
    value: object = ["app"] if name == "containers" else IDENTITY
    line = json.dumps(
        {"type": "actor_registered", "v": 2, "actor_id": "s", "gpu": False, "bundle": "/b"}
        | {name: value}
    )
    with pytest.raises(errors.EventSchemaError, match=rf"{name} needs v 3.*\$\.{name}"):
        events.from_json(line)


def test_the_door_accepts_containers_and_names_a_bad_one_by_its_path() -> None:
    """The JSON-lines door takes the v3 fields; a bad name is a schema error at its index."""
    good = {"type": "actor_registered", "v": 3, "actor_id": "s", "gpu": True, "bundle": "/b"}
    parsed = protocol.parse_request(
        json.dumps(good | {"containers": ["app", "gpu"], "identity": IDENTITY}).encode()
    )
    assert isinstance(parsed, events.ActorRegistered)
    assert (parsed.containers, parsed.identity) == (("app", "gpu"), IDENTITY)
    refused = protocol.parse_request(json.dumps(good | {"containers": ["app", "app"]}).encode())
    assert isinstance(refused, protocol.RequestError)
    assert (refused.kind, refused.field) == ("schema", "$.containers[1]")
    assert "named twice" in refused.message


def test_the_door_refuses_a_non_string_identity_value() -> None:
    """identity is a mapping of strings: a number in it is a schema error at its key."""
    line = {"type": "actor_registered", "v": 3, "actor_id": "s", "gpu": False, "bundle": "/b"}
    refused = protocol.parse_request(json.dumps(line | {"identity": {"uid": 7}}).encode())
    assert isinstance(refused, protocol.RequestError)
    assert refused.field == "$.identity[...]"  # msgspec names the mapping, not the key


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        pytest.param({"v": 1, "image_path": "/ck"}, "image_path needs v 2", id="v1"),
        pytest.param({"v": 2, "image_path": "ck/1"}, "absolute", id="relative"),
    ],
)
def test_a_suspend_image_path_is_v2_and_absolute(line: dict[str, object], problem: str) -> None:
    """suspend_requested v2 names its image directory; v1 cannot, a relative path is refused."""
    with pytest.raises(errors.EventSchemaError, match=rf"{problem}.*\$\.image_path"):
        events.from_json(json.dumps({"type": "suspend_requested", "actor_id": "a"} | line))


def test_a_v1_suspend_line_reads_as_before() -> None:
    """No image_path: the checkpoint goes where it always went."""
    event = events.from_json('{"type":"suspend_requested","v":1,"actor_id":"a","seq":3,"at":1}')
    assert isinstance(event, events.SuspendRequested)
    assert (event.v, event.image_path) == (1, None)


@pytest.mark.anyio
async def test_the_record_view_and_query_carry_containers_and_identity(
    make_agent: MakeAgent,
) -> None:
    """What the registration said is on the actor's view and in the query's answer."""
    async with make_agent() as agent:
        await agent.submit(_registered(containers=("app", "sidecar"), identity=IDENTITY))
        view = agent.actor("s")
    assert view is not None
    assert (view.containers, view.identity) == (("app", "sidecar"), IDENTITY)
    answer = json.loads(msgspec.json.encode(query.status(view)))
    assert (answer["containers"], answer["identity"]) == (["app", "sidecar"], IDENTITY)
    single = json.loads(
        msgspec.json.encode(query.status(msgspec.structs.replace(view, containers=(), identity={})))
    )
    assert "containers" not in single and "identity" not in single


def test_a_snapshot_keeps_containers_and_identity_and_reads_an_older_one(tmp_path: Path) -> None:
    """Views round-trip through a snapshot; an older snapshot (no such keys) reads as empty."""
    from substrate_gpu.lifecycle.actors import ActorView

    view = ActorView(
        "s", "registered", False, "/b/s", None, 0, False, None,
        containers=("app", "sidecar"), identity=IDENTITY, checkpoint_target="/ck/x",
    )  # fmt: skip
    log = tmp_path / "events.jsonl"
    path = snapshot.write(log, snapshot.build(7, [view], {}))
    assert snapshot.read(path, seq=7).actors == (view,)
    old = json.loads(path.read_text())
    for name in ("containers", "identity", "checkpoint_target"):
        del old["actors"][0][name]
    path.write_text(json.dumps(old))
    (read,) = snapshot.read(path, seq=7).actors
    assert (read.containers, read.identity, read.checkpoint_target) == ((), {}, "")


@pytest.mark.anyio
async def test_a_suspend_with_an_image_path_checkpoints_there(
    make_agent: MakeAgent, runtime: FakeRuntime, tmp_path: Path
) -> None:
    """The checkpoint is written into the directory asked for, and becomes the actor's."""
    image = tmp_path / "asked" / "ckpt"
    async with make_agent() as agent:
        await bring_to_running(agent, gpu=False)
        await agent.submit(events.SuspendRequested(actor_id="a", image_path=str(image)))
        await agent.wait_for_state("a", "suspended", timeout=5)
        assert agent.actor("a").checkpoint == str(image)  # type: ignore[union-attr]
    assert (image / "checkpoint.img").is_file()


@pytest.mark.anyio
async def test_a_suspend_into_a_directory_holding_a_checkpoint_is_refused_untouched(
    make_agent: MakeAgent, runtime: FakeRuntime, tmp_path: Path
) -> None:
    """An image already there is never overwritten: checkpoint_failed, the actor runs on."""
    image = tmp_path / "asked"
    image.mkdir()
    (image / "checkpoint.img").write_text("earlier")
    async with make_agent() as agent:
        await bring_to_running(agent, gpu=False)
        await agent.submit(events.SuspendRequested(actor_id="a", image_path=str(image)))
        await agent.settle()
        actor = agent.actor("a")
    assert actor is not None and actor.state == "running"
    assert "already holds a checkpoint" in (actor.reason or "")
    assert runtime.ops("checkpoint") == []
    assert (image / "checkpoint.img").read_text() == "earlier"


@pytest.mark.anyio
async def test_recovery_mid_checkpoint_finds_the_image_where_the_suspend_asked(
    runtime: FakeRuntime, tmp_path: Path
) -> None:
    """An agent killed mid-checkpoint: the image is looked for in ``image_path``."""
    from lifecycle.doubles import FakeInjector, FakeProbe

    log_path, image = tmp_path / "events.jsonl", tmp_path / "asked"
    injector = FakeInjector()
    async with (
        await EventLog.open(log_path) as log,
        Agent(
            runtime=runtime,
            probe=FakeProbe(runtime),
            injector=injector,
            checkpoint_root=tmp_path / "checkpoints",
            recorder=log,
        ) as agent,
    ):
        await bring_to_running(agent, gpu=False)
        runtime.hang.add("checkpoint")
        await agent.submit(events.SuspendRequested(actor_id="a", image_path=str(image)))
        await agent.wait_for_state("a", "checkpointing", timeout=5)
    runtime.hang.clear()
    assert replay(log_path).actors["a"].checkpoint_target == str(image)
    runtime.containers.pop("a")  # the sandbox went down with its image written
    image.mkdir(exist_ok=True)  # the agent made it (0700) before runsc ran
    (image / "checkpoint.img").write_text("image")
    recovery = await recover(log_path, runtime=runtime, checkpoint_root=tmp_path / "checkpoints")
    (outcome,) = recovery.reconcile_events
    assert isinstance(outcome, events.CheckpointWritten)
    assert outcome.image_path == str(image)
    assert recovery.actors["a"].checkpoint == str(image)
    assert read_log(log_path).events[-1].type == "suspend_requested"


# --- actor_registered v4: GPUs per container (issue 31 §10) --------------------------------

PER_CONTAINER = {"app": ("nvidia.com/gpu=0",), "train": ("nvidia.com/gpu=1", "nvidia.com/gpu=0")}


def test_container_gpus_survive_the_json_form_the_record_and_a_snapshot(tmp_path: Path) -> None:
    """v4 carries each container's names; the record keeps them comma-joined, and a
    snapshot keeps the record's (an older snapshot, without them, reads as none)."""
    from substrate_gpu.lifecycle.actors import Actor

    event = _registered(
        containers=("app", "train", "side"),
        gpu_names=("nvidia.com/gpu=0", "nvidia.com/gpu=1"),
        container_gpus=PER_CONTAINER,
    )
    data = json.loads(event.to_json())
    assert (data["v"], data["container_gpus"]) == (
        4,
        {"app": ["nvidia.com/gpu=0"], "train": ["nvidia.com/gpu=1", "nvidia.com/gpu=0"]},
    )
    back = events.from_json(event.to_json())
    assert back == event and hash(back) == hash(event)
    assert isinstance(back, events.ActorRegistered) and back.per_container
    actor = Actor("s", "registered")
    actor.remember_registration(back)
    view = actor.snapshot()
    assert view.container_gpus == {
        "app": "nvidia.com/gpu=0",
        "train": "nvidia.com/gpu=1,nvidia.com/gpu=0",
    }
    path = snapshot.write(tmp_path / "events.jsonl", snapshot.build(3, [view], {}))
    assert snapshot.read(path, seq=3).actors == (view,)
    old = json.loads(path.read_text())
    del old["actors"][0]["container_gpus"]
    path.write_text(json.dumps(old))
    (read,) = snapshot.read(path, seq=3).actors
    assert read.container_gpus == {}


@pytest.mark.parametrize(
    ("fields", "problem", "path"),
    [
        pytest.param(
            {"container_gpus": {"other": ("nvidia.com/gpu=0",)}},
            "'other' is not one of the app containers",
            "container_gpus.other",
            id="not-a-container",
        ),
        pytest.param(
            {"container_gpus": {"app": ()}},
            "'app' lists no GPU",
            "container_gpus.app",
            id="empty-list",
        ),
        pytest.param(
            {"container_gpus": {"app": ("nvidia.com/gpu=0", "nvidia.com/gpu=0")}},
            "'app' names a GPU twice",
            "container_gpus.app",
            id="repeated",
        ),
        pytest.param(
            {"container_gpus": {"app": ("gpu0",)}, "gpu_names": ("gpu0",)},
            "gpu_names must be fully qualified",
            "gpu_names[0]",
            id="unqualified",
        ),
        pytest.param(
            {"container_gpus": {"app": ("nvidia.com/gpu=1",)}},
            "are not gpu_names (nvidia.com/gpu=0)",
            "gpu_names",
            id="not-the-union",
        ),
        pytest.param(
            {"container_gpus": {"app": ("nvidia.com/gpu=0",)}, "v": 3},
            "container_gpus needs v 4 (this line is v 3)",
            "container_gpus",
            id="older-version",
        ),
    ],
)
def test_a_bad_container_gpus_is_refused_naming_the_field(
    fields: dict[str, object], problem: str, path: str
) -> None:
    """Keys are app containers, lists non-empty without repeats, the union is gpu_names."""
    base: dict[str, object] = {
        "containers": ("app", "side"),
        "gpu_names": ("nvidia.com/gpu=0",),
    }
    with pytest.raises(errors.EventFieldError, match=re.escape(problem)) as caught:
        _registered(**(base | fields))
    assert caught.value.field == path


def test_a_v3_line_keeps_its_meaning_every_app_container_the_actors_gpus() -> None:
    """An older line reads with no container_gpus: the seed PR's rule."""
    line = {"type": "actor_registered", "v": 3, "actor_id": "s", "gpu": True, "bundle": "/b"}
    event = events.from_json(json.dumps(line | {"containers": ["app", "side"]}))
    assert isinstance(event, events.ActorRegistered)
    assert (event.v, event.container_gpus, event.per_container) == (3, {}, False)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        pytest.param({"runsc": "runsc"}, "is not an absolute path", id="relative"),
        pytest.param({"runsc": "/s/runsc", "containers": ()}, "needs containers", id="no-sandbox"),
        pytest.param({"runsc": "/s/runsc", "v": 3}, "runsc needs v 4", id="older-version"),
    ],
)
def test_a_sandboxs_own_runsc_is_an_absolute_path_of_a_v4_sandbox(
    fields: dict[str, object], problem: str
) -> None:
    """runsc (issue 31 §5) names the binary a sandbox runs under."""
    with pytest.raises(errors.EventFieldError, match=re.escape(problem)) as caught:
        _registered(**({"containers": ("app",)} | fields))
    assert caught.value.field == "runsc"


def test_a_sandboxs_own_runsc_reaches_the_record_and_the_runtime(tmp_path: Path) -> None:
    """The record keeps it; the sandbox's runtime is the driver running that binary under
    the actor's own root; a runtime that cannot switch binaries fails the effect, naming it."""
    from substrate_gpu.lifecycle import sandbox
    from substrate_gpu.lifecycle.actors import Actor
    from substrate_gpu.runsc import driver

    actor = Actor("s", "registered")
    actor.remember_registration(_registered(containers=("app",), runsc="/static/b/runsc"))
    view = actor.snapshot()
    assert view.runsc == "/static/b/runsc"
    agents = driver.RunscDriver(driver.RunscConfig(root=tmp_path, runsc="/usr/bin/runsc"))
    runtime = sandbox.of(agents, view).runtime
    assert isinstance(runtime, driver.RunscDriver)
    assert (runtime.config.runsc, runtime.config.root) == ("/static/b/runsc", tmp_path / "s")
    with pytest.raises(sandbox.SandboxError, match="cannot run the sandbox's own"):
        sandbox.of(FakeRuntime(), view)
