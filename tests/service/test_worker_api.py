"""``substrate-gpu agent --worker-socket``: the worker API's calls and status codes, driven by a
gRPC client built from our stubs against the real agent process (runsc: the stand-in).

The whole life on real runsc is tests/runsc/test_real_worker_api.py; these pin the contract
that needs no sandbox to run (every refusal), and the ones a stand-in can stage (a runsc that
hangs: stats answer at once, SIGTERM drains Run and Restore with UNAVAILABLE; a second Run refused, a refused
checkpoint that is no failure, a checkpoint that tears the workload down: caught here too,
not only on real runsc). A test that runs a sandbox terminates it: sandboxes outlive the agent.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import grpc
import pytest

from substrate_gpu.service.ateworker import ateworker_pb2 as pb
from substrate_gpu.testing import node as node_

from .agentproc import AgentProcess
from .workerclient import Actor, connect, status_of

pytestmark = pytest.mark.runc

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    return node_.install_runsc_standin(tmp_path / "bin")


def _agent(tmp_path: Path, runsc: Path, *extra: str, **kwargs: object) -> AgentProcess:
    return AgentProcess.on_socket(
        tmp_path,
        "--worker-socket",
        str(tmp_path / "worker" / "worker.sock"),
        "--runsc",
        str(runsc),
        *extra,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture
def agent(tmp_path, standin, runc_path):
    process = _agent(tmp_path, standin, env={"RUNSC_STANDIN_RUNC": runc_path})
    try:
        yield process
    finally:
        process.terminate()


@pytest.fixture
def worker(agent, tmp_path):
    return connect(tmp_path / "worker" / "worker.sock")


@pytest.fixture
def actor(tmp_path, standin):
    return Actor(tmp_path / "actor", runsc=str(standin)).prepare()


def test_the_worker_socket_is_private(agent, tmp_path):
    """The socket is mode 0600 in a 0700 directory made for it, like the JSON socket."""
    sock = tmp_path / "worker" / "worker.sock"
    connect(sock)
    assert sock.stat().st_mode & 0o777 == 0o600
    assert sock.parent.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    ("change", "code", "names"),
    [
        pytest.param({"actor_uid": ""}, INVALID, "actor_uid is required", id="no-uid"),
        pytest.param({"actor_uid": "a/b"}, INVALID, "actor_uid 'a/b'", id="bad-uid"),
        pytest.param(
            {"actor_dirs": {"oci_bundle_dir": "/nonexistent/bundles"}},
            INVALID,
            "actor_dirs.oci_bundle_dir '/nonexistent/bundles' is not a directory",
            id="no-bundle-dir",
        ),
        pytest.param(
            {"actor_dirs": {"oci_bundle_dir": "bundles"}},
            INVALID,
            'actor_dirs.oci_bundle_dir: Invalid value: "bundles": must be an absolute, clean path',
            id="relative-bundle-dir",
        ),
        pytest.param(
            {"actor_dirs": {"root_dir": "/actors/a/../b"}},
            INVALID,
            'actor_dirs.root_dir: Invalid value: "/actors/a/../b": must be an absolute, clean',
            id="unclean-root-dir",
        ),
        pytest.param(
            {"actor_dirs": {"volumes_dir": ""}},
            INVALID,
            "actor_dirs.volumes_dir: Required value",
            id="no-volumes-dir",
        ),
        pytest.param(
            {"actor_dirs": {"durable_dir_volume_mounts_dir": "", "restore_dir": "r"}},
            INVALID,
            '[actor_dirs.restore_dir: Invalid value: "r": must be an absolute, clean path, '
            "actor_dirs.durable_dir_volume_mounts_dir: Required value]",
            id="two-dirs-at-once",
        ),
        pytest.param(
            {"actor_dirs": None}, INVALID, "actor_dirs: Required value", id="no-actor-dirs"
        ),
        pytest.param({"runsc_path": ""}, INVALID, "runsc_path: Required value", id="no-runsc"),
        pytest.param(
            {"spec": pb.WorkloadSpec(containers=[pb.Container(name="missing")])},
            INVALID,
            "missing/config.json: No such file or directory",
            id="no-bundle-for-a-container",
        ),
        pytest.param(
            {"spec": pb.WorkloadSpec(containers=[pb.Container(name="_pause")])},
            INVALID,
            "spec.containers[0].name is '_pause'",
            id="pause-listed",
        ),
        pytest.param(
            {"spec": pb.WorkloadSpec(containers=[pb.Container(name="app")] * 2)},
            INVALID,
            "spec.containers[1].name 'app' is listed twice",
            id="twice",
        ),
        pytest.param(
            {"runsc_path": "relative/runsc"}, INVALID, "runsc_path 'relative/runsc'", id="runsc"
        ),
        pytest.param(
            {"runsc_path": "/bin/sh"},
            INVALID,
            "runsc_path '/bin/sh' must be inside /var/lib/ate/static-files",
            id="outside-the-static-files",
        ),
    ],
)
def test_run_refuses_a_bad_request_naming_the_field(worker, actor, change, code, names):
    """A request the worker cannot use is refused with the field (or file) at fault named,
    and nothing is registered for it; every ActorDirs field is required, as upstream's
    ``resources.ValidateActorDirs`` has it, and so is runsc_path."""
    if "actor_dirs" in change:
        dirs = change["actor_dirs"]
        change = {**change, "actor_dirs": None if dirs is None else actor.dirs(**dirs)}
    request = actor.run(**change)
    if change.get("actor_dirs", ...) is None:
        request.ClearField("actor_dirs")
    got, message = status_of(worker.RunWorkload, request)
    assert (got, names in message) == (code, True), message
    assert worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest()).samples == []


def test_a_bad_cdi_annotation_is_refused_naming_the_file(worker, tmp_path, standin):
    """A ``cdi.k8s.io/*`` annotation that is not a list of qualified device names."""
    actor = Actor(
        tmp_path / "cdi", runsc=str(standin), annotations={"cdi.k8s.io/gpu": "gpu0"}
    ).prepare()
    code, message = status_of(worker.RunWorkload, actor.run())
    assert code == INVALID
    assert "app/config.json: annotation 'cdi.k8s.io/gpu'" in message and "gpu0" in message


def test_the_same_runsc_binary_elsewhere_is_honoured(worker, actor, standin, tmp_path):
    """A runsc_path with our binary's bytes (atelet stages runsc content-addressed) passes
    the check: the call goes on to the machine, and the sandbox runs (then terminated: a
    sandbox outlives the agent, so one left running here outlives the test)."""
    copy = tmp_path / "static-files" / "runsc-abc"
    copy.parent.mkdir()
    copy.write_bytes(standin.read_bytes())
    try:
        assert status_of(worker.RunWorkload, actor.run(runsc_path=str(copy))) == (
            grpc.StatusCode.OK,
            "",
        )
    finally:
        assert status_of(worker.TerminateWorkload, actor.terminate()) == (grpc.StatusCode.OK, "")


def test_an_unspecified_scope_is_invalid(worker, actor):
    code, message = status_of(
        worker.CheckpointWorkload, actor.checkpoint_request(scope=pb.SNAPSHOT_SCOPE_UNSPECIFIED)
    )
    assert (code, "scope 0" in message) == (INVALID, True), message


def test_calls_on_an_actor_not_here_are_not_found(worker, actor):
    """Checkpoint and stats of a UID this worker does not execute: NOT_FOUND."""
    code, message = status_of(worker.CheckpointWorkload, actor.checkpoint_request())
    assert (code, actor.uid in message) == (NOT_FOUND, True)
    code, _ = status_of(worker.GetWorkloadStats, pb.GetWorkloadStatsRequest(actor_uid=actor.uid))
    assert code == NOT_FOUND


def test_stats_need_a_uid(worker):
    code, message = status_of(worker.GetWorkloadStats, pb.GetWorkloadStatsRequest())
    assert (code, message) == (INVALID, "actor_uid is required")


def test_terminate_of_an_actor_not_here_is_ok(worker, actor):
    """Terminate is idempotent: nothing to delete is success."""
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (grpc.StatusCode.OK, "")


@pytest.mark.parametrize(
    "request_of",
    [
        pytest.param(Actor.checkpoint_request, id="checkpoint"),
        pytest.param(Actor.restore_request, id="restore"),
        pytest.param(Actor.terminate, id="terminate"),
    ],
)
def test_every_lifecycle_call_requires_every_actor_dir_and_runsc_path(worker, actor, request_of):
    """Checkpoint, Restore and Terminate check ActorDirs and runsc_path first, as Run does
    (upstream validates them before its lock, on Terminate too)."""
    request = request_of(actor, actor_dirs=actor.dirs(system_info_volume_roots_dir=""))
    assert status_of(getattr(worker, type(request).__name__.removesuffix("Request")), request) == (
        INVALID,
        "actor_dirs.system_info_volume_roots_dir: Required value",
    )
    request = request_of(actor, runsc_path="")
    assert status_of(getattr(worker, type(request).__name__.removesuffix("Request")), request) == (
        INVALID,
        "runsc_path: Required value",
    )


def test_a_spec_with_no_app_container_runs_pause_alone(worker, agent, tmp_path, standin):
    """No app container: the sandbox is ``_pause`` alone (upstream boots it and answers OK);
    it is measured, terminated, and nothing is left."""
    actor = Actor(tmp_path / "alone", runsc=str(standin), uid="alone", apps=()).prepare()
    assert status_of(worker.RunWorkload, actor.run()) == (grpc.StatusCode.OK, "")
    with agent.client() as client:
        answer = client.request({"query": "actor", "actor_id": "alone.1"})
    assert (answer["actor"]["state"], answer["actor"]["gpu"]) == ("running", False)
    assert "containers" not in answer["actor"]  # one container, on _pause's bundle
    [sample] = worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest()).samples
    assert sample.actor_uid == "alone"
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (grpc.StatusCode.OK, "")
    assert worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest()).samples == []


def test_restore_needs_a_checkpoint_in_restore_dir(worker, actor):
    actor.restore.mkdir()
    code, message = status_of(worker.RestoreWorkload, actor.restore_request())
    assert code == INVALID
    assert f"actor_dirs.restore_dir {str(actor.restore)!r} holds no checkpoint.img" in message


@pytest.fixture
def hanging_agent(tmp_path, standin, runc_path):
    """An agent whose runsc ``create`` hangs until its pid (in ``hang-pids``) is killed."""
    pids = tmp_path / "hang-pids"
    env = {
        "RUNSC_STANDIN_RUNC": runc_path,
        "RUNSC_STANDIN_HANG": "create",
        "RUNSC_STANDIN_HANG_PIDS": str(pids),
    }
    process = _agent(tmp_path, standin, "--drain-timeout", "5", env=env)
    try:
        yield process, pids
    finally:
        from .test_agent_health import kill_hung

        kill_hung(pids)
        process.terminate()


def test_stats_answer_at_once_while_a_run_is_in_progress(hanging_agent, tmp_path, standin):
    """A Run waiting on a hung ``runsc create`` holds the UID's lifecycle lock; the stats
    reads answer at once, as upstream's: GetWorkloadStats FAILED_PRECONDITION (no sandbox
    cgroup to measure yet), GetActiveWorkloadStats a pending sample, the identity echoed and
    nothing measured."""
    from .test_agent_health import wait_for_file

    # A UID of its own: on cgroup v1 runc leaves a deleted container's cgroup directory, and
    # an earlier test's activation of the same id would be read as this one's figures.
    uid = f"booting-{uuid.uuid4().hex[:12]}"
    actor = Actor(tmp_path / "booting", runsc=str(standin), uid=uid).prepare()
    process, pids = hanging_agent
    worker = connect(tmp_path / "worker" / "worker.sock")
    running = worker.RunWorkload.future(actor.run(), timeout=120)
    wait_for_file(pids)
    code, message = status_of(
        worker.GetWorkloadStats, pb.GetWorkloadStatsRequest(actor_uid=actor.uid), timeout=2
    )
    assert (code, message.startswith("no sandbox cgroup to measure yet")) == (
        PRECONDITION,
        True,
    ), message
    active = worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest(), timeout=2)
    [sample] = active.samples
    assert (sample.actor_uid, sample.atespace, sample.actor_template_name) == (
        actor.uid,
        "team-a",
        "counter-template",
    )
    assert sample.sandbox_class == pb.SANDBOX_CLASS_GVISOR
    assert sample.source == pb.STATS_SOURCE_UNSPECIFIED
    assert (sample.memory_current_bytes, sample.cpu_usage_usec) == (0, 0)
    assert not running.done()
    # The JSON door sees the same actor: one machine, one table.
    with process.client() as client:
        answer = client.request({"query": "actors"})
    [listed] = [a for a in answer["actors"] if a["actor_id"].startswith(actor.uid)]
    assert listed["actor_id"] == f"{actor.uid}.1"
    assert listed["state"] == "creating"
    assert listed["containers"] == ["app"]
    assert listed["identity"]["actor_name"] == "counter"


def test_sigterm_drains_startups_with_unavailable(hanging_agent, actor, tmp_path, standin):
    """After SIGTERM, while the agent waits for effects to finish, a Run or Restore is
    answered UNAVAILABLE (the control plane goes to another worker); a Checkpoint or
    Terminate is still served, as upstream's worker serves them, and so are stats."""
    from .test_agent_health import wait_for_file

    process, pids = hanging_agent
    worker = connect(tmp_path / "worker" / "worker.sock")
    running = worker.RunWorkload.future(actor.run(), timeout=120)
    try:
        wait_for_file(pids)
    except AssertionError:
        raise AssertionError(f"{running.exception()} {process.stderr()}") from None
    queued = worker.RunWorkload.future(actor.run(), timeout=120)  # waits for the UID's lock
    time.sleep(1)  # for it to reach the lock (nothing shows it) before the signal
    process.process.send_signal(signal.SIGTERM)
    other = Actor(tmp_path / "other", runsc=str(standin), uid="other-uid").prepare()
    code = grpc.StatusCode.OK
    message = ""
    for _ in range(100):  # the signal lands a moment later
        code, message = status_of(worker.RunWorkload, other.run(), timeout=5)
        if code == grpc.StatusCode.UNAVAILABLE:
            break
    assert code == grpc.StatusCode.UNAVAILABLE, message
    assert "worker draining" in message
    assert status_of(worker.RestoreWorkload, other.restore_request(), timeout=5)[0] == (
        grpc.StatusCode.UNAVAILABLE
    )
    # Served, not drained: an unknown UID's Terminate is OK, its Checkpoint NOT_FOUND.
    assert status_of(worker.TerminateWorkload, other.terminate(), timeout=5)[0] == (
        grpc.StatusCode.OK
    )
    assert status_of(worker.CheckpointWorkload, other.checkpoint_request(), timeout=5)[0] == (
        grpc.StatusCode.NOT_FOUND
    )
    code, _ = status_of(
        worker.GetWorkloadStats, pb.GetWorkloadStatsRequest(actor_uid=actor.uid), timeout=5
    )
    assert code in {grpc.StatusCode.OK, PRECONDITION}  # answered (measured or not), not drained
    # The call that waited for the lock through SIGTERM is drained too, once it has the
    # lock (the first Run ends when the drain gives up on its hung create).
    assert queued.exception(timeout=90).code() == grpc.StatusCode.UNAVAILABLE
    assert "worker draining" in queued.exception().details()


def test_terminate_deletes_app_containers_first_and_pause_last(tmp_path, standin, runc_path):
    """The runsc commands a Run and a Terminate issue (the stand-in's argv log): the sandbox
    is made _pause first and deleted _pause last; a second Terminate issues nothing."""
    import json

    argv_log = tmp_path / "argv.jsonl"
    env = {"RUNSC_STANDIN_RUNC": runc_path, "RUNSC_STANDIN_ARGV_LOG": str(argv_log)}
    process = _agent(tmp_path, standin, env=env)
    try:
        worker = connect(tmp_path / "worker" / "worker.sock")
        actor = Actor(
            tmp_path / "order", runsc=str(standin), uid="order", apps=("app", "side")
        ).prepare()
        assert status_of(worker.RunWorkload, actor.run()) == (grpc.StatusCode.OK, "")

        def commands(verb: str) -> list[str]:
            lines = [json.loads(line) for line in argv_log.read_text().splitlines()]
            return [argv[-1] for argv in lines if verb in argv]

        assert commands("create") == ["_pause", "app", "side"]
        assert status_of(worker.TerminateWorkload, actor.terminate()) == (grpc.StatusCode.OK, "")
        deletes = commands("delete")
        assert deletes[-1] == "_pause" and set(deletes[:-1]) >= {"app", "side"}
        assert "_pause" not in deletes[:-1]
        before = len(argv_log.read_text().splitlines())
        assert status_of(worker.TerminateWorkload, actor.terminate()) == (grpc.StatusCode.OK, "")
        assert len(argv_log.read_text().splitlines()) == before
    finally:
        process.terminate()


def test_terminate_deletes_every_live_activation_of_the_uid(worker, agent, standin, tmp_path):
    """Two live activations of one UID (a running sandbox, and an actor the JSON door
    registered with the UID's identity): Terminate deletes both, not only the newest."""
    actor = Actor(tmp_path / "twice", runsc=str(standin), uid="twice").prepare()
    assert status_of(worker.RunWorkload, actor.run()) == (grpc.StatusCode.OK, "")
    by_hand = {
        "type": "actor_registered",
        "v": 3,
        "actor_id": "twice-by-hand",
        "gpu": False,
        "bundle": str(tmp_path / "by-hand"),
        "identity": {k: v for k, v in actor.identity().items() if k != "runsc_path"},
    }
    with agent.client() as client:
        assert client.request(by_hand)["ok"] is True, by_hand
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (grpc.StatusCode.OK, "")
    with agent.client() as client:
        listed = client.request({"query": "actors"})["actors"]
    states = {a["actor_id"]: a["state"] for a in listed if a["actor_id"].startswith("twice")}
    assert states == {"twice.1": "deleted", "twice-by-hand": "deleted"}


def _containers(runc_path: str, actor_root: Path) -> list[str]:
    """The containers the stand-in's runc holds under an actor's root, sorted."""
    import subprocess

    if not actor_root.exists():
        return []
    listed = subprocess.run(
        [runc_path, "--root", str(actor_root), "list", "-q"],
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(listed.stdout.split())


def _running(worker, uid: str) -> bool:
    return status_of(worker.GetWorkloadStats, pb.GetWorkloadStatsRequest(actor_uid=uid))[0] == (
        grpc.StatusCode.OK
    )


def test_a_second_run_of_a_running_uid_is_refused(worker, agent, standin, runc_path, tmp_path):
    """FAILED_PRECONDITION naming the running activation; the first goes on, untouched (its
    containers, its state), and no second activation is registered."""
    actor = Actor(tmp_path / "second", runsc=str(standin), uid="second").prepare()
    actor_root = tmp_path / "runsc-root" / "second.1"
    try:
        assert status_of(worker.RunWorkload, actor.run()) == (grpc.StatusCode.OK, "")
        code, message = status_of(worker.RunWorkload, actor.run())
        assert code == PRECONDITION, message
        assert "already executes 'second' (actor 'second.1', 'running')" in message
        assert _containers(runc_path, actor_root) == ["_pause", "app"]
        with agent.client() as client:
            listed = client.request({"query": "actors"})["actors"]
        assert [
            (a["actor_id"], a["state"]) for a in listed if a["actor_id"].startswith("second")
        ] == [("second.1", "running")]
    finally:
        assert status_of(worker.TerminateWorkload, actor.terminate()) == (grpc.StatusCode.OK, "")


def test_a_refused_checkpoint_is_not_a_failure(worker, agent, standin, runc_path, tmp_path):
    """A live CUDA context the actor has no route to suspend: FAILED_PRECONDITION with the
    machine's reason (not INTERNAL), and the workload is neither torn down nor marked
    failed: it runs on, and a later Terminate deletes it."""
    actor = Actor(tmp_path / "refused", runsc=str(standin), uid="standin-refused").prepare()
    actor_root = tmp_path / "runsc-root" / "standin-refused.1"
    try:
        assert status_of(worker.RunWorkload, actor.run()) == (grpc.StatusCode.OK, "")
        with agent.client() as client:  # the node agent saw a context open (the other door)
            opened = {
                "type": "cuda_context_opened",
                "v": 1,
                "actor_id": "standin-refused.1",
                "pid": 7,
            }
            assert client.request(opened)["ok"]
        code, message = status_of(worker.CheckpointWorkload, actor.checkpoint_request())
        assert code == PRECONDITION, message
        assert (
            "checkpoint of actor 'standin-refused.1' refused" in message
            and "CUDA context" in message
        )
        assert _containers(runc_path, actor_root) == ["_pause", "app"]
        assert _running(worker, "standin-refused")
        with agent.client() as client:
            state = client.request({"query": "actor", "actor_id": "standin-refused.1"})["actor"][
                "state"
            ]
        assert state == "running"
    finally:
        assert status_of(worker.TerminateWorkload, actor.terminate()) == (grpc.StatusCode.OK, "")
    assert _containers(runc_path, actor_root) == []


def test_a_checkpoint_tears_the_workload_down(worker, agent, standin, runc_path, tmp_path):
    """FULL checkpoint: the files written are answered, then the sandbox is deleted (no
    container left, the UID no longer executing here, the activation deleted)."""
    actor = Actor(tmp_path / "ckpt", runsc=str(standin), uid="ckpt").prepare()
    actor_root = tmp_path / "runsc-root" / "ckpt.1"
    try:
        assert status_of(worker.RunWorkload, actor.run()) == (grpc.StatusCode.OK, "")
        assert _containers(runc_path, actor_root) == ["_pause", "app"]
        reply = worker.CheckpointWorkload(actor.checkpoint_request(), timeout=120)
        written = sorted(p.name for p in actor.checkpoint.iterdir() if p.is_file())
        assert list(reply.snapshot_files) == written and "checkpoint.img" in written
        assert _containers(runc_path, actor_root) == []
        assert not _running(worker, "ckpt")
        with agent.client() as client:
            state = client.request({"query": "actor", "actor_id": "ckpt.1"})["actor"]["state"]
        assert state == "deleted"
    finally:
        assert status_of(worker.TerminateWorkload, actor.terminate()) == (grpc.StatusCode.OK, "")
