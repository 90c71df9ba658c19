"""The worker API's stats: cgroup v1 and v2 trees read alike, and a sample says "not
measured" (UNSPECIFIED, zeros, the identity echoed) while the sandbox has no cgroup."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import anyio
import grpc
import pytest
from support import real

from substrate_gpu.lifecycle import actors, hooks
from substrate_gpu.service import cgroup_stats, worker_api, worker_calls
from substrate_gpu.service.ateworker import ateworker_pb2 as pb

CGROUP = "/substrate-gpu/u.1"


def _v2(root: Path, *, inactive: int = 4096, peak: bool = True) -> Path:
    (root / "cgroup.controllers").parent.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    leaf = root / CGROUP.lstrip("/")
    leaf.mkdir(parents=True)
    (leaf / "memory.current").write_text("10000\n")
    if peak:
        (leaf / "memory.peak").write_text("12000\n")
    (leaf / "memory.stat").write_text(f"anon 5000\ninactive_file {inactive}\nactive_file 10\n")
    (leaf / "cpu.stat").write_text("usage_usec 777\nuser_usec 700\nsystem_usec 77\n")
    return root


def _v1(root: Path) -> Path:
    memory = root / "memory" / CGROUP.lstrip("/")
    memory.mkdir(parents=True)
    (memory / "memory.usage_in_bytes").write_text("20000\n")
    (memory / "memory.max_usage_in_bytes").write_text("30000\n")
    (memory / "memory.stat").write_text("inactive_file 1\ntotal_inactive_file 5000\n")
    cpu = root / "cpuacct" / CGROUP.lstrip("/")
    cpu.mkdir(parents=True)
    (cpu / "cpuacct.usage").write_text("9000999\n")
    return root


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        pytest.param(_v2, cgroup_stats.CgroupSample(10000, 12000, 5904, 777), id="v2"),
        pytest.param(_v1, cgroup_stats.CgroupSample(20000, 30000, 15000, 9000), id="v1"),
        pytest.param(
            lambda r: _v2(r, inactive=99999),
            cgroup_stats.CgroupSample(10000, 12000, 0, 777),
            id="inactive-above-current-floors-at-0",
        ),
        pytest.param(
            lambda r: _v2(r, peak=False),
            cgroup_stats.CgroupSample(10000, 0, 5904, 777),
            id="no-memory.peak-reads-0",
        ),
    ],
)
def test_a_cgroup_is_read_the_same_on_either_layout(tmp_path, build, expected):
    """current, peak, working set (current less the hierarchical inactive_file), CPU in µs."""
    assert cgroup_stats.read(CGROUP, build(tmp_path)) == expected


def test_a_cgroup_not_there_is_nothing_to_measure(tmp_path):
    assert cgroup_stats.read(CGROUP, tmp_path) is None
    assert cgroup_stats.read(CGROUP, _v2(tmp_path / "other-leaf-only")) is not None
    assert cgroup_stats.read("/substrate-gpu/v.1", tmp_path / "other-leaf-only") is None


class _Agent:
    """The agent's table as the worker API reads it; :meth:`put` changes it as a transition
    does (the worker's index of live activations follows transitions)."""

    def __init__(self, views: list[actors.ActorView]) -> None:
        self.views = views
        self.observers: list[Callable[[hooks.Transition], None]] = []

    def add_observer(self, observer: Callable[[hooks.Transition], None]) -> None:
        self.observers.append(observer)

    def remove_observer(self, observer: Callable[[hooks.Transition], None]) -> None:
        self.observers.remove(observer)

    def put(self, view: actors.ActorView) -> None:
        """Insert or replace ``view``, telling observers as the pipeline would."""
        before = self.actor(view.actor_id)
        self.views = [v for v in self.views if v.actor_id != view.actor_id] + [view]
        trigger = "actor_registered" if before is None else view.state
        t = hooks.Transition(
            actor_id=view.actor_id,
            source=before.state if before is not None else "new",
            dest=view.state,
            trigger=trigger,
            event_type=trigger,
            at=0.0,
        )
        for observer in self.observers:
            observer(t)

    def actors(self) -> tuple[actors.ActorView, ...]:
        return tuple(self.views)

    def actor(self, actor_id: str) -> actors.ActorView | None:
        return next((v for v in self.views if v.actor_id == actor_id), None)

    def state_of(self, actor_id: str) -> str | None:
        view = self.actor(actor_id)
        return view.state if view is not None else None

    def __len__(self) -> int:
        return len(self.views)


class _Door:
    def __init__(self, views: list[actors.ActorView]) -> None:
        self.agent = _Agent(views)


IDENTITY = {
    "atespace": "team-a",
    "actor_name": "counter",
    "actor_uid": "u",
    "actor_template_atespace": "team-a",
    "actor_template_name": "tpl",
    "epoch_unix_nano": "123",
}


def _view(tmp_path: Path, state: str) -> actors.ActorView:
    bundle = tmp_path / "bundles"
    (bundle / "_pause").mkdir(parents=True)
    (bundle / "_pause" / "config.json").write_text(f'{{"linux": {{"cgroupsPath": "{CGROUP}"}}}}')
    return actors.ActorView(
        actor_id="u.1",
        state=state,
        gpu=False,
        bundle=str(bundle),
        checkpoint=None,
        live_contexts=0,
        sandbox=True,
        reason=None,
        containers=("app",),
        identity=IDENTITY,
    )


def _service(tmp_path: Path, view: actors.ActorView, root: Path) -> worker_api.WorkerService:
    return worker_api.WorkerService(
        _Door([view]),  # type: ignore[arg-type]
        runsc="runsc",
        cgroup_root=root,
    )


def test_a_sandbox_without_its_cgroup_yet_is_not_measured(tmp_path):
    """Booting (no cgroup yet), as upstream answers it: GetWorkloadStats FAILED_PRECONDITION
    ("no sandbox cgroup to measure yet"); GetActiveWorkloadStats a pending sample,
    UNSPECIFIED and zeros, the identity and epoch echoed, the cgroup path read back from
    _pause's bundle (as after an agent restart)."""
    service = _service(tmp_path, _view(tmp_path, "creating"), tmp_path / "empty")
    with pytest.raises(worker_calls.CallError) as refused:
        anyio.run(service.GetWorkloadStats, pb.GetWorkloadStatsRequest(actor_uid="u"))
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.message.startswith("no sandbox cgroup to measure yet")
    reply = anyio.run(service.GetActiveWorkloadStats, pb.GetActiveWorkloadStatsRequest())
    [sample] = reply.samples
    assert (sample.source, sample.sandbox_class) == (
        pb.STATS_SOURCE_UNSPECIFIED,
        pb.SANDBOX_CLASS_GVISOR,
    )
    assert (sample.memory_current_bytes, sample.memory_peak_bytes) == (0, 0)
    assert (sample.memory_working_set_bytes, sample.cpu_usage_usec) == (0, 0)
    assert (sample.actor_uid, sample.actor_template_name, sample.epoch_unix_nano) == (
        "u",
        "tpl",
        123,
    )


def test_a_running_sandbox_is_measured_from_its_cgroup(tmp_path):
    service = _service(tmp_path, _view(tmp_path, "running"), _v2(tmp_path / "cg"))
    reply = anyio.run(service.GetActiveWorkloadStats, pb.GetActiveWorkloadStatsRequest())
    [sample] = reply.samples
    assert sample.source == pb.STATS_SOURCE_CGROUP
    assert (sample.memory_current_bytes, sample.memory_working_set_bytes) == (10000, 5904)
    assert (sample.memory_peak_bytes, sample.cpu_usage_usec) == (12000, 777)


def test_a_deleted_activation_is_not_executing(tmp_path):
    service = _service(tmp_path, _view(tmp_path, "deleted"), _v2(tmp_path / "cg"))
    with pytest.raises(worker_calls.CallError) as raised:
        anyio.run(service.GetWorkloadStats, pb.GetWorkloadStatsRequest(actor_uid="u"))
    assert raised.value.code.name == "NOT_FOUND"
    assert (
        anyio.run(service.GetActiveWorkloadStats, pb.GetActiveWorkloadStatsRequest()).samples == []
    )


def test_an_actor_of_the_uid_named_otherwise_is_still_found(tmp_path):
    """An actor the JSON door registered with the UID's identity but another id counts as
    an activation of it (ordered before the numbered ones), never an error."""
    view = _view(tmp_path, "running")
    other = actors.ActorView(
        **{**{f: getattr(view, f) for f in view.__struct_fields__}, "actor_id": "by-hand"}
    )
    service = worker_api.WorkerService(
        _Door([other]),  # type: ignore[arg-type]
        runsc="runsc",
        cgroup_root=_v2(tmp_path / "cg"),
    )
    reply = anyio.run(service.GetWorkloadStats, pb.GetWorkloadStatsRequest(actor_uid="u"))
    assert reply.sample.actor_uid == "u"


@pytest.mark.parametrize("state", ["registered", "bundle_prepared"])
def test_an_activation_not_yet_created_is_not_measured_from_a_cgroup_there(tmp_path, state):
    """Before its sandbox is created, the cgroup at the activation's path is not its own (a
    previous activation's, one of the same name): the sample says "not measured"."""
    service = _service(tmp_path, _view(tmp_path, state), _v2(tmp_path / "cg"))
    reply = anyio.run(service.GetActiveWorkloadStats, pb.GetActiveWorkloadStatsRequest())
    [sample] = reply.samples
    assert sample.source == pb.STATS_SOURCE_UNSPECIFIED
    assert (sample.memory_current_bytes, sample.cpu_usage_usec) == (0, 0)
    assert sample.actor_uid == "u"


def _with(view: actors.ActorView, **fields: object) -> actors.ActorView:
    return actors.ActorView(**{**{f: getattr(view, f) for f in view.__struct_fields__}, **fields})


def test_an_activation_registered_elsewhere_is_found(tmp_path):
    """The worker's index of live activations follows the agent's transitions, whichever
    door caused them (here: the JSON door registers one after the index was built)."""
    first = _with(_view(tmp_path, "deleted"))
    door = _Door([first])
    service = worker_api.WorkerService(door, runsc="runsc", cgroup_root=_v2(tmp_path / "cg"))  # type: ignore[arg-type]
    with pytest.raises(worker_calls.CallError):
        anyio.run(service.GetWorkloadStats, pb.GetWorkloadStatsRequest(actor_uid="u"))
    door.agent.put(_with(first, actor_id="u.2", state="running"))
    reply = anyio.run(service.GetWorkloadStats, pb.GetWorkloadStatsRequest(actor_uid="u"))
    assert reply.sample.source == pb.STATS_SOURCE_CGROUP


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_stats_reader_holds_its_files_only_while_the_activation_lives(tmp_path):
    """Sampled, a live activation's four cgroup files stay open (the next sample is four
    preads); once it is deleted, the next stats call closes them."""
    view = _view(tmp_path, "running")
    door = _Door([view])
    service = worker_api.WorkerService(door, runsc="runsc", cgroup_root=_v2(tmp_path / "cg"))  # type: ignore[arg-type]
    before = _open_fds()
    for _ in range(3):
        anyio.run(service.GetActiveWorkloadStats, pb.GetActiveWorkloadStatsRequest())
    assert _open_fds() == before + 4
    door.agent.put(_with(view, state="deleted"))
    assert (
        anyio.run(service.GetActiveWorkloadStats, pb.GetActiveWorkloadStatsRequest()).samples == []
    )
    assert _open_fds() == before


def _real_cgroup(name: str) -> list[Path]:
    """A real cgroup named ``name`` in this host's layout (v2, or v1's memory and cpuacct)."""
    root = cgroup_stats.CGROUP_ROOT
    if (root / "cgroup.controllers").exists():
        made = [root / name]
    else:
        made = [root / "memory" / name, root / "cpuacct" / name]
    try:
        for path in made:
            path.mkdir()
    except OSError as e:
        real.missing("a cgroup of our own", f"cannot be made here: {e}")
    return made


@pytest.mark.usefixtures("require_root")
def test_a_reader_of_a_removed_cgroup_answers_none_and_reads_it_again_once_remade():
    """On cgroupfs a removed cgroup's open files read ENODEV: the reader answers None (not
    the last figures) and opens the path afresh when the cgroup is made again."""
    name = f"substrate-gpu-test-reader-{os.getpid()}"
    reader = cgroup_stats.CgroupReader(cgroup_stats.files_of(f"/{name}"))
    made = _real_cgroup(name)
    try:
        assert reader.read() == cgroup_stats.read(f"/{name}")
        assert reader.read() is not None
        for path in made:
            path.rmdir()
        assert reader.read() is None
        made = _real_cgroup(name)
        assert reader.read() is not None
    finally:
        reader.close()
        for path in made:
            if path.exists():
                path.rmdir()
