"""The actor's own GPUs through checkpoint, restore and the check after start/restore (issue
26 items 1, 2, 3, 6), effect by effect on in-process doubles: a fake runtime, a node of files,
nvidia-smi as a script, the sandbox's exec and cuda-checkpoint as recording fakes. The same
paths with real runc and the stand-ins are in tests/gpu_suspend; on a GPU, tests/gpu."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lifecycle.doubles import FakeInjector, FakeProbe, FakeRuntime
from substrate_gpu import _process, preflight
from substrate_gpu.lifecycle import allocation, effects, events, gpu
from substrate_gpu.lifecycle.actors import ActorView
from substrate_gpu.runsc import api as runsc

pytestmark = pytest.mark.anyio

A, B, C = (f"GPU-{c * 8}-1111-2222-3333-444444444444" for c in "abc")
#: The worker's GPUs as the allocator knows them from the CDI spec (index and UUID names).
WORKER = allocation.WorkerGpus(
    names=("nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=2"),
    aliases={
        **{f"nvidia.com/gpu={i}": f"nvidia.com/gpu={i}" for i in range(3)},
        **{f"nvidia.com/gpu={u}": f"nvidia.com/gpu={i}" for i, u in enumerate((A, B, C))},
    },
)


class Unlisted:
    async def features(self) -> runsc.RunscFeatures:
        return await FakeRuntime().features()

    async def list_supported_drivers(self) -> tuple[str, ...]:
        raise AssertionError("not asked")


@dataclass
class SandboxExec:
    """``runsc exec``: ``nvidia-smi -L`` answers ``listing`` (or fails with ``status``)."""

    listing: str = ""
    status: int = 0
    calls: list[tuple[str, ...]] = field(default_factory=list)

    async def exec(self, container_id: str, argv: Any, timeout: float | None = None) -> Any:
        self.calls.append((container_id, *argv))
        return _process.CommandResult(
            argv=tuple(argv), returncode=self.status, stdout=self.listing, stderr="smi: boom"
        )


@dataclass
class Tool:
    """cuda-checkpoint in the sandbox: every pid in ``states``; restores recorded."""

    states: dict[int, str]
    present: bool = True
    restores: list[tuple[int, str]] = field(default_factory=list)

    async def available(self) -> bool:
        return self.present

    async def gpu_processes(self) -> tuple[int, ...]:
        return tuple(sorted(p for p, s in self.states.items() if s != "checkpointed"))

    async def get_state(self, pid: int) -> Any:
        return self.states[pid]

    async def lock(self, pid: int, timeout_ms: int) -> None:
        self.states[pid] = "locked"

    async def checkpoint(self, pid: int) -> None:
        self.states[pid] = "checkpointed"

    async def restore(self, pid: int, device_map: str = "") -> None:
        self.restores.append((pid, device_map))
        self.states[pid] = "locked"

    async def unlock(self, pid: int) -> None:
        self.states[pid] = "running"


@dataclass
class Node:
    tmp: Path
    # A runsc with google/gvisor#14525: the remap paths below are not refused for lacking it.
    runtime: FakeRuntime = field(
        default_factory=lambda: FakeRuntime(restore_creates_gpu_device_files=True)
    )
    smi: SandboxExec = field(default_factory=SandboxExec)
    tool: Tool = field(default_factory=lambda: Tool({1: "running"}))

    def memory(self, *rows: tuple[str, int, int]) -> None:
        """What the host's nvidia-smi answers to the memory query."""
        (self.tmp / "memory.csv").write_text(
            "".join(f"{u}, {used}, {free}\n" for u, used, free in rows)
        )

    def ctx(self, driver: str = "580.65.06", **settings: Any) -> effects.EffectContext:
        proc = self.tmp / "proc-version"
        proc.write_text(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Thu Jan 1\n")
        smi = self.tmp / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\ncat {self.tmp / 'memory.csv'}\n")
        smi.chmod(0o755)
        if not (self.tmp / "memory.csv").exists():
            self.memory()
        (self.tmp / "dev").mkdir(exist_ok=True)
        for i in range(3):
            (self.tmp / "dev" / f"nvidia{i}").touch()
        kwargs: dict[str, Any] = {
            "drivers": Unlisted(),
            "driver_root": self.tmp / "none",
            "proc_version": proc,
            "dev_root": self.tmp,
            "nvidia_smi": str(smi),
            "sandbox_exec": self.smi,
            "sandbox_tool": lambda cid: self.tool,
            **settings,
        }
        allocator = allocation.GpuAllocator(WORKER)
        return effects.EffectContext(
            runtime=self.runtime,
            probe=FakeProbe(self.runtime),
            injector=FakeInjector(),
            checkpoint_root=self.tmp / "ck",
            gpu=gpu.GpuSettings(**kwargs),
            allocator=allocator,
        )


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def view(state: str, devices: str = "nvidia.com/gpu=0", **fields: Any) -> ActorView:
    fields = {"gpu_devices": devices, "uses_allocator": True, **fields}
    return ActorView(
        "a", state, True, "/b/a", fields.pop("checkpoint", None), 0, True, None, **fields
    )


# --- the actor's own GPUs -------------------------------------------------------------------


def test_granted_gpus_are_resolved_to_uuids_through_the_specs_uuid_names(node: Node) -> None:
    settings = node.ctx().gpu
    assert settings is not None
    allocator = allocation.GpuAllocator(WORKER)
    assert gpu.own_gpu_uuids(settings, allocator, "nvidia.com/gpu=2,nvidia.com/gpu=0") == (C, A)
    # A UUID name is its own answer; a GPU the spec names by index only is unknown: ().
    assert gpu.own_gpu_uuids(settings, None, f"nvidia.com/gpu={B}") == (B,)
    assert gpu.own_gpu_uuids(settings, None, "nvidia.com/gpu=1") == ()


def test_an_actor_given_every_gpu_holds_the_drivers_list(node: Node, tmp_path: Path) -> None:
    gpus = tmp_path / "gpus"
    for bus, minor, uuid in (("0000:00:05.0", 1, B), ("0000:00:04.0", 0, A)):
        (gpus / bus).mkdir(parents=True)
        (gpus / bus / "information").write_text(
            f"Model: \t\t NVIDIA H200\nGPU UUID: \t {uuid}\nDevice Minor: \t {minor}\n"
        )
    settings = node.ctx(gpus_root=gpus).gpu
    assert settings is not None
    assert gpu.own_gpu_uuids(settings, None, "") == (A, B)


# --- checkpoint: the actor's GPUs and their used memory -----------------------------------


def manifest_of(node: Node) -> preflight.CheckpointManifest:
    (image,) = (node.tmp / "ck" / "a").iterdir()
    found = preflight.read_manifest(image)
    assert found is not None
    return found


async def test_a_checkpoint_records_the_actors_gpus_with_memory_read_before_runsc(
    node: Node,
) -> None:
    ctx = node.ctx()
    await node.runtime.create("a", Path("/b/a"), nvproxy=True)
    await node.runtime.start("a")
    node.memory((A, 6144, 100), (C, 1, 140000))
    outcome = await effects.checkpoint(
        ctx,
        view("checkpointing", "nvidia.com/gpu=0,nvidia.com/gpu=2"),
        events.NoLiveContext(actor_id="a", seq=5),
    )
    assert outcome.type == "checkpoint_written"
    assert manifest_of(node).actor_gpus == (
        preflight.CheckpointGpu(A, 6144),
        preflight.CheckpointGpu(C, 1),
    )


async def test_the_exec_route_measures_memory_before_the_suspend_moves_it(node: Node) -> None:
    """cuda_suspend reads the memory while the CUDA state is on the GPU; the checkpoint
    (nvidia-smi would say ~0 by then) records that reading."""
    ctx = node.ctx()
    node.memory((A, 6144, 100))
    suspended = await effects.cuda_suspend(
        ctx, view("cuda_suspending"), events.LiveContextFound(actor_id="a", route=events.ROUTE_EXEC)
    )
    assert isinstance(suspended, events.CudaSuspended)
    assert suspended.gpu_memory == f"{A}=6144"
    node.memory((A, 0, 6244))
    await node.runtime.create("a", Path("/b/a"), nvproxy=True)
    await node.runtime.start("a")
    outcome = await effects.checkpoint(
        ctx, view("checkpointing", suspend_route=events.ROUTE_EXEC), suspended.stamped(9)
    )
    assert outcome.type == "checkpoint_written"
    assert manifest_of(node).actor_gpus == (preflight.CheckpointGpu(A, 6144),)


async def test_unreadable_memory_still_checkpoints_with_it_unknown(node: Node) -> None:
    ctx = node.ctx(nvidia_smi=str(node.tmp / "no-nvidia-smi"))
    await node.runtime.create("a", Path("/b/a"), nvproxy=True)
    outcome = await effects.checkpoint(
        ctx, view("checkpointing"), events.NoLiveContext(actor_id="a", seq=5)
    )
    assert outcome.type == "checkpoint_written"
    assert manifest_of(node).actor_gpus == (preflight.CheckpointGpu(A, None),)


# --- restore: the device map, and what is refused before runsc runs --------------------------


def image(node: Node, route: str = events.ROUTE_EXEC, driver: str = "580.65.06") -> str:
    """A checkpoint of actor a on GPU A (6144 MiB used) by ``route``, under ``driver``."""
    path = node.tmp / "ck" / "a" / "1"
    path.mkdir(parents=True)
    (path / "checkpoint.img").write_text("a")
    manifest = preflight.CheckpointManifest(
        driver_version=driver, gpu_count=1, cuda_state_included=bool(route), route=route,
        actor_gpus=(preflight.CheckpointGpu(A, 6144),),
    )  # fmt: skip
    preflight.write_manifest(path, manifest)
    return str(path)


async def restore(
    node: Node, devices: str, route: str = events.ROUTE_EXEC, driver: str = "580.65.06", **kw: Any
) -> events.Event:
    """Restore the image onto ``devices`` on a node of the image's driver (only GPUs differ)."""
    ctx = node.ctx(driver, **kw)
    path = image(node, route, driver)
    actor = view("restoring", devices, checkpoint=path)
    return await effects.restore(ctx, actor, events.RestoreRequested(actor_id="a"))


async def test_a_restore_onto_other_gpus_carries_the_device_map(node: Node) -> None:
    node.memory((C, 0, 140000))
    outcome = await restore(node, "nvidia.com/gpu=2")
    assert isinstance(outcome, events.Restored)
    assert outcome.device_map == f"{A}={C}"
    assert node.runtime.ops("restore")


async def test_the_same_gpus_need_no_map(node: Node) -> None:
    node.memory((A, 0, 140000))
    outcome = await restore(node, "nvidia.com/gpu=0")
    assert isinstance(outcome, events.Restored) and outcome.device_map == ""


@pytest.mark.parametrize(
    ("driver", "route", "named"),
    [
        pytest.param("570.133.20", events.ROUTE_EXEC, "driver 580 or newer", id="exec-driver-570"),
        pytest.param("580.65.06", events.ROUTE_RUNSC, "without a device map", id="runsc-route"),
    ],
)
async def test_a_remap_the_route_cannot_do_is_refused_before_runsc(
    node: Node, driver, route, named
) -> None:
    node.memory((C, 0, 140000))
    outcome = await restore(node, "nvidia.com/gpu=2", route, driver)
    assert isinstance(outcome, events.RestoreRefused)
    assert outcome.code == "restore-gpu-remap" and named in outcome.message
    assert node.runtime.ops("restore") == []


@pytest.mark.parametrize(
    ("detected", "named"),
    [
        pytest.param(False, "remap-metadata-gated", id="pinned-runsc"),
        pytest.param(None, "cannot be told", id="undetectable"),
    ],
)
async def test_an_exec_route_remap_on_a_runsc_without_gvisor_14525_is_refused(
    node: Node, detected: bool | None, named: str
) -> None:
    """The exec route's image holds no remap metadata: without the fix, refused first."""
    node.runtime.restore_creates_gpu_device_files = detected
    node.memory((C, 0, 140000))
    outcome = await restore(node, "nvidia.com/gpu=2")
    assert isinstance(outcome, events.RestoreRefused)
    assert outcome.code == "restore-gpu-remap"
    assert "google/gvisor#14525" in outcome.message and named in outcome.message
    assert node.runtime.ops("restore") == []


async def test_the_same_gpus_restore_on_a_runsc_without_gvisor_14525(node: Node) -> None:
    """No remap, nothing missing: the pinned runsc restores onto the same GPUs."""
    node.runtime.restore_creates_gpu_device_files = False
    node.memory((A, 0, 140000))
    outcome = await restore(node, "nvidia.com/gpu=0")
    assert isinstance(outcome, events.Restored) and outcome.device_map == ""


async def test_too_little_free_memory_is_refused_before_runsc(node: Node) -> None:
    node.memory((C, 135000, 5000))
    outcome = await restore(node, "nvidia.com/gpu=2")
    assert isinstance(outcome, events.RestoreRefused) and outcome.code == "restore-gpu-memory"
    assert f"{C} (needs 6144 MiB, 5000 MiB free)" in outcome.message
    assert node.runtime.ops("restore") == []


async def test_a_failed_memory_read_fails_the_restore_before_runsc(node: Node) -> None:
    outcome = await restore(node, "nvidia.com/gpu=2", nvidia_smi=str(node.tmp / "absent"))
    assert isinstance(outcome, events.RestoreFailed) and "reading GPU memory" in outcome.message
    assert node.runtime.ops("restore") == []


async def test_the_exec_routes_resume_restores_with_the_map(node: Node) -> None:
    node.tool.states = {7: "checkpointed"}
    restored = events.Restored(
        actor_id="a", image_path="/ck/a/1", cuda_route=events.ROUTE_EXEC, device_map=f"{A}={C}"
    )
    outcome = await effects.cuda_resume(node.ctx(), view("cuda_resuming", cuda_pids="7"), restored)
    assert outcome.type == "cuda_resumed"
    assert node.tool.restores == [(7, f"{A}={C}")]


# --- verifying: the sandbox's GPUs, and restored CUDA processes ---------------------------


def listing(*uuids: str) -> str:
    return "".join(f"GPU {i}: NVIDIA H200 (UUID: {u})\n" for i, u in enumerate(uuids))


async def test_a_sandbox_seeing_exactly_its_gpus_is_verified(node: Node) -> None:
    node.smi.listing = listing(C, A)
    outcome = await gpu_verify(node, "nvidia.com/gpu=0,nvidia.com/gpu=2")
    assert outcome.type == "gpus_verified" and f"sees exactly {A}, {C}" in outcome.message
    assert node.smi.calls == [("a", "nvidia-smi", "-L")]


async def gpu_verify(node: Node, devices: str, event: events.Event | None = None, **kw: Any) -> Any:
    from substrate_gpu.lifecycle import verify

    ctx = node.ctx(**kw)
    await node.runtime.create("a", Path("/b/a"), nvproxy=True)
    await node.runtime.start("a")
    return await verify.verify(
        ctx, view("verifying", devices), event or events.SandboxStarted(actor_id="a")
    )


async def test_another_actors_gpu_visible_fails_the_actor_naming_it_and_deletes_the_sandbox(
    node: Node,
) -> None:
    node.smi.listing = listing(A, B)
    outcome = await gpu_verify(node, "nvidia.com/gpu=0")
    assert outcome.type == "gpu_verification_failed"
    assert f"other actors' {B}" in outcome.message and f"({A})" in outcome.message
    assert node.runtime.ops("delete") == [("runsc", "delete", "--force", "a")]


async def test_a_missing_gpu_fails_the_actor(node: Node) -> None:
    node.smi.listing = listing(A)
    outcome = await gpu_verify(node, "nvidia.com/gpu=0,nvidia.com/gpu=1")
    assert outcome.type == "gpu_verification_failed" and f"missing {B}" in outcome.message


async def test_a_listing_that_fails_fails_the_actor(node: Node) -> None:
    node.smi.status = 127
    outcome = await gpu_verify(node, "nvidia.com/gpu=0")
    assert outcome.type == "gpu_verification_failed" and "exited with status 127" in outcome.message


async def test_unknown_uuids_are_not_checked_and_say_so(node: Node) -> None:
    outcome = await gpu_verify(node, "nvidia.com/gpu=9")
    assert outcome.type == "gpus_verified" and "UUIDs are unknown" in outcome.message
    assert node.smi.calls == []


RUNSC_RESTORED = events.Restored(actor_id="a", image_path="/ck/a/1", cuda_route=events.ROUTE_RUNSC)


async def test_a_runsc_route_restore_left_locked_fails_naming_pid_and_state(node: Node) -> None:
    node.tool.states = {1: "running", 4: "locked"}
    node.smi.listing = listing(A)
    outcome = await gpu_verify(node, "nvidia.com/gpu=0", RUNSC_RESTORED)
    assert outcome.type == "gpu_verification_failed"
    assert "pid 4 reads 'locked'" in outcome.message
    assert node.smi.calls == []  # the first failure decides
    assert node.runtime.ops("delete")


async def test_a_runsc_route_restore_whose_processes_run_is_verified(node: Node) -> None:
    node.tool.states = {1: "running", 4: "running"}
    node.smi.listing = listing(A)
    outcome = await gpu_verify(node, "nvidia.com/gpu=0", RUNSC_RESTORED)
    assert outcome.type == "gpus_verified" and "reads 'running'" in outcome.message


async def test_without_a_tool_in_the_sandbox_the_states_are_not_read_and_it_says_so(
    node: Node,
) -> None:
    node.tool.present = False
    node.tool.states = {4: "locked"}
    node.smi.listing = listing(A)
    outcome = await gpu_verify(node, "nvidia.com/gpu=0", RUNSC_RESTORED)
    assert outcome.type == "gpus_verified" and "does not run in the sandbox" in outcome.message


async def test_after_start_no_cuda_state_is_read(node: Node) -> None:
    """Only a runsc-route restore brought CUDA state back inside runsc."""
    node.tool.states = {4: "locked"}
    node.smi.listing = listing(A)
    assert (await gpu_verify(node, "nvidia.com/gpu=0")).type == "gpus_verified"


async def test_a_cpu_actors_checkpoint_asks_no_gpu_anything(node: Node) -> None:
    marker = node.tmp / "smi-ran"
    smi = node.tmp / "marking-nvidia-smi"
    smi.write_text(f"#!/bin/sh\ntouch {marker}\n")
    smi.chmod(0o755)
    gpus = node.tmp / "gpus" / "0000:00:04.0"
    gpus.mkdir(parents=True)
    (gpus / "information").write_text(f"Model: \t H200\nGPU UUID: \t {A}\nDevice Minor: \t 0\n")
    ctx = node.ctx(nvidia_smi=str(smi), gpus_root=gpus.parent)
    await node.runtime.create("a", Path("/b/a"), nvproxy=False)
    cpu = ActorView("a", "checkpointing", False, "/b/a", None, 0, True, None)
    outcome = await effects.checkpoint(ctx, cpu, events.SuspendRequested(actor_id="a", seq=5))
    assert outcome.type == "checkpoint_written"
    assert manifest_of(node).actor_gpus == () and not marker.exists()


class RootedExec(FakeRuntime):
    """A fake runtime with per-actor roots whose ``exec`` answers ``nvidia-smi -L``."""

    def __init__(self, listings: dict[str, str], calls: list[tuple[str, ...]]) -> None:
        super().__init__()
        self.listings = listings
        self.exec_calls = calls

    def for_actor(self, actor_id: str) -> RootedExec:
        self.root = actor_id  # one actor per test: its root is this runtime's
        return self

    async def exec(self, container_id: str, argv: Any, timeout: float | None = None) -> Any:
        self.exec_calls.append((container_id, *argv))
        return _process.CommandResult(
            argv=tuple(argv), returncode=0, stdout=self.listings[container_id], stderr=""
        )


async def test_a_sandbox_actors_gpus_are_listed_in_every_app_container(node: Node) -> None:
    """A multi-container sandbox holds its GPUs in its app containers (never ``_pause``),
    under its own runsc root: each is listed, and one seeing another GPU fails the actor,
    naming the container."""
    from substrate_gpu.lifecycle import verify

    calls: list[tuple[str, ...]] = []
    node.runtime = RootedExec({"app": listing(A), "side": listing(A, B)}, calls)
    ctx = node.ctx()
    actor = view("verifying", "nvidia.com/gpu=0", containers=("app", "side"))
    outcome = await verify.verify(ctx, actor, events.SandboxStarted(actor_id="a"))
    assert calls == [("app", "nvidia-smi", "-L"), ("side", "nvidia-smi", "-L")]
    assert node.smi.calls == []  # the node's own exec cannot reach a per-actor root
    assert outcome.type == "gpu_verification_failed"
    assert "container side:" in outcome.message and f"other actors' {B}" in outcome.message


class MissingSmiExec(RootedExec):
    """Like :class:`RootedExec`, but a container without a listing has no nvidia-smi."""

    async def exec(self, container_id: str, argv: Any, timeout: float | None = None) -> Any:
        if container_id not in self.listings:
            self.exec_calls.append((container_id, *argv))
            return _process.CommandResult(
                argv=tuple(argv),
                returncode=127,
                stdout="",
                stderr=f'exec: "{argv[0]}": executable file not found in $PATH',
            )
        return await super().exec(container_id, argv, timeout)


PER_CONTAINER = {"app": "nvidia.com/gpu=0", "train": f"nvidia.com/gpu={B},nvidia.com/gpu=2"}


def per_container_view() -> ActorView:
    """A sandbox whose app and train name their GPUs (train by UUID), side none."""
    return view(
        "verifying",
        "nvidia.com/gpu=0,nvidia.com/gpu=1,nvidia.com/gpu=2",
        containers=("app", "train", "side"),
        container_gpus=PER_CONTAINER,
    )


async def test_with_gpus_per_container_each_is_checked_against_its_own_set(node: Node) -> None:
    """Each app container lists exactly its own GPUs; one given none lists none (no
    nvidia-smi in it at all reads as none: only the driver mounts bring it)."""
    from substrate_gpu.lifecycle import verify

    calls: list[tuple[str, ...]] = []
    node.runtime = MissingSmiExec({"app": listing(A), "train": listing(B, C)}, calls)
    outcome = await verify.verify(
        node.ctx(), per_container_view(), events.SandboxStarted(actor_id="a")
    )
    assert outcome.type == "gpus_verified", outcome
    assert [c[0] for c in calls] == ["app", "train", "side"]
    assert f"app {A}; train {B}, {C}; side none" in outcome.message


@pytest.mark.parametrize(
    ("listings", "problem"),
    [
        pytest.param(
            {"app": listing(A, B), "train": listing(B, C)},
            f"container app: the sandbox sees GPU(s) {A}, {B}",
            id="a-container-sees-its-siblings-gpu",
        ),
        pytest.param(
            {"app": listing(A), "train": listing(B, C), "side": listing(A)},
            f"container side: the sandbox sees GPU(s) {A}, not exactly its own (none)",
            id="a-container-given-none-sees-one",
        ),
        pytest.param(
            {"app": listing(A), "train": listing(C)},
            f"container train: the sandbox sees GPU(s) {C}",
            id="a-container-misses-one-of-its-own",
        ),
    ],
)
async def test_a_container_seeing_other_than_its_own_gpus_fails_the_actor(
    node: Node, listings: dict[str, str], problem: str
) -> None:
    """Another container's GPU is as foreign as another actor's: the actor fails, naming
    the container, and the sandbox is deleted."""
    from substrate_gpu.lifecycle import verify

    node.runtime = MissingSmiExec(listings, [])
    outcome = await verify.verify(
        node.ctx(), per_container_view(), events.SandboxStarted(actor_id="a")
    )
    assert outcome.type == "gpu_verification_failed"
    assert problem in outcome.message
