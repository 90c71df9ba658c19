"""The worker API's stats: cgroup v1 and v2 trees read alike, and a sample says "not
measured" (UNSPECIFIED, zeros, the identity echoed) while the sandbox has no cgroup."""

from __future__ import annotations

from pathlib import Path

import anyio
import grpc
import pytest

from substrate_gpu.lifecycle import actors
from substrate_gpu.service import cgroup_stats, worker_api
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
    def __init__(self, views: list[actors.ActorView]) -> None:
        self.views = views

    def actors(self) -> tuple[actors.ActorView, ...]:
        return tuple(self.views)


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
    with pytest.raises(worker_api.CallError) as refused:
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
    with pytest.raises(worker_api.CallError) as raised:
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
