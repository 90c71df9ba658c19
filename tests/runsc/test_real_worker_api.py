"""The worker API on real gVisor: a gRPC client built from our stubs drives ``substrate-gpu
agent --worker-socket`` through a ``_pause`` + app CPU sandbox's whole life (issue 23).

Run, stats from the sandbox's cgroup, Checkpoint (FULL: the files, the workload torn down),
Restore from a kept snapshot (the app's count goes on; ``restore_dir`` byte for byte as it
was), Terminate twice; the size applied to the sandbox's cgroup; a refused checkpoint that
keeps the actor running; a failing Run or Restore that leaves nothing behind; an agent
SIGKILLed and restarted on its log that still serves the UID it ran; a sandbox on the worker
pod's network (what ``pool render`` gives a GPU worker) serving, checkpointed and restored.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from service.agentproc import AgentProcess, event, logged_events
from service.workerclient import (
    DURABLE_COUNTER,
    Actor,
    DurableActor,
    connect,
    status_of,
    wait_until,
)
from support import real_runsc as runsc_

from substrate_gpu.service.ateworker import ateworker_pb2 as pb
from substrate_gpu.testing import bundles

OK = grpc.StatusCode.OK
CGROUP = Path("/sys/fs/cgroup")


@pytest.fixture
def root(real_runsc: Path, tmp_path: Path) -> Iterator[Path]:
    """The agent's runsc root; every actor's own root under it is emptied at teardown."""
    root = tmp_path / "runsc-root"
    yield root
    if root.exists():
        for actor_root in root.iterdir():
            if actor_root.is_dir():
                runsc_.delete_all(real_runsc, actor_root)


@pytest.fixture
def agent(real_runsc: Path, tmp_path: Path, root: Path) -> Iterator[AgentProcess]:
    flags = [f"--runsc-flag={f}" for f in runsc_.GLOBAL_FLAGS]
    process = AgentProcess.on_socket(
        tmp_path,
        "--runsc",
        str(real_runsc),
        *flags,
        "--worker-socket",
        str(tmp_path / "worker.sock"),
    )
    try:
        yield process
    finally:
        assert process.terminate() == 0, process.stderr()[-3000:]


@pytest.fixture
def worker(agent: AgentProcess, tmp_path: Path):
    return connect(tmp_path / "worker.sock")


def _count(runsc: Path, actor_root: Path) -> int:
    """The app container's counter (an empty read is the shell's ``>`` mid-write)."""
    for _ in range(50):
        out = runsc_.run(runsc, actor_root, "exec", "app", "/bin/cat", "/tmp/count", check=False)
        if out.stdout.strip():
            return int(out.stdout)
        time.sleep(0.02)
    return 0


def _counted_to(runsc: Path, actor_root: Path, at_least: int) -> int:
    deadline = time.monotonic() + 20
    while (count := _count(runsc, actor_root)) < at_least:
        assert time.monotonic() < deadline, f"the app counted only to {count}"
        time.sleep(0.05)
    return count


def _digests(directory: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``directory``: its sha256 and mtime (a rewrite shows in either)."""
    return {
        str(p.relative_to(directory)): (
            hashlib.sha256(p.read_bytes()).hexdigest(),
            p.stat().st_mtime_ns,
        )
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _stats(worker, uid: str):
    return worker.GetWorkloadStats(pb.GetWorkloadStatsRequest(actor_uid=uid), timeout=10).sample


def test_a_sandboxs_whole_life_through_the_worker_api(
    worker, agent: AgentProcess, real_runsc: Path, root: Path, tmp_path: Path
) -> None:
    """Run → running (measured from its cgroup, listed by the JSON door) → Checkpoint (the
    files, nothing left running) → Restore from a preserved snapshot (the count goes on, the
    snapshot untouched) → Terminate, twice. Every step is the machine's events in the log."""
    actor = Actor(tmp_path / "actor", runsc=str(real_runsc)).prepare()
    first = root / f"{actor.uid}.1"
    assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
    assert sorted(runsc_.list_ids(real_runsc, first)) == ["_pause", "app"]
    before = _counted_to(real_runsc, first, 5)

    sample = _stats(worker, actor.uid)
    assert (sample.actor_uid, sample.actor_name, sample.actor_template_name) == (
        actor.uid,
        "counter",
        "counter-template",
    )
    assert (sample.sandbox_class, sample.source) == (
        pb.SANDBOX_CLASS_GVISOR,
        pb.STATS_SOURCE_CGROUP,
    )
    assert sample.memory_current_bytes > 1_000_000  # the sentry and gofers are in it
    assert 0 < sample.memory_working_set_bytes <= sample.memory_current_bytes
    assert sample.memory_peak_bytes >= sample.memory_current_bytes
    assert sample.cpu_usage_usec > 0
    assert 0 < sample.epoch_unix_nano <= sample.observed_at_unix_nano
    active = worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest(), timeout=10)
    assert [s.actor_uid for s in active.samples] == [actor.uid]
    with agent.client() as client:
        listed = client.request({"query": "actor", "actor_id": f"{actor.uid}.1"})["actor"]
    assert (listed["state"], listed["identity"]["atespace"]) == ("running", "team-a")

    code, message = status_of(worker.RunWorkload, actor.run())
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "already executes" in message

    reply = worker.CheckpointWorkload(actor.checkpoint_request(), timeout=120)
    written = sorted(p.name for p in actor.checkpoint.iterdir() if p.is_file())
    assert list(reply.snapshot_files) == written and "checkpoint.img" in written
    assert list(reply.data_snapshot_files) == []
    assert runsc_.list_ids(real_runsc, first) == []
    assert status_of(worker.GetWorkloadStats, pb.GetWorkloadStatsRequest(actor_uid=actor.uid))[
        0
    ] == (grpc.StatusCode.NOT_FOUND)

    # atelet ships the snapshot away and, for the restore, downloads it and new bundles.
    shutil.copytree(actor.checkpoint, actor.restore)
    shutil.rmtree(actor.bundles)
    actor.prepare()
    kept = _digests(actor.restore)
    restore = actor.restore_request(preserve_restore_dir=True)
    assert status_of(worker.RestoreWorkload, restore) == (OK, "")
    second = root / f"{actor.uid}.2"
    assert sorted(runsc_.list_ids(real_runsc, second)) == ["_pause", "app"]
    assert _count(real_runsc, second) >= before  # its memory came back: not a fresh start
    assert _stats(worker, actor.uid).source == pb.STATS_SOURCE_CGROUP

    assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
    assert runsc_.list_ids(real_runsc, second) == []
    assert _digests(actor.restore) == kept
    assert worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest()).samples == []

    types = [
        (e["actor_id"], e["type"])
        for e in logged_events(agent.log)
        if e["actor_id"].startswith(actor.uid)
    ]
    one, two = f"{actor.uid}.1", f"{actor.uid}.2"
    for expected in [
        (one, "actor_registered"),
        (one, "run_requested"),
        (one, "sandbox_started"),
        (one, "suspend_requested"),
        (one, "checkpoint_written"),
        (one, "delete_requested"),
        (one, "deleted"),
        (two, "actor_registered"),
        (two, "restore_requested"),
        (two, "restored"),
        (two, "delete_requested"),
        (two, "deleted"),
    ]:
        assert expected in types, expected
    assert types.index((one, "deleted")) < types.index((two, "actor_registered"))


def _volume_count(actor: DurableActor, at_least: int) -> int:
    """The count the app keeps in its durable-dir volume, once it reaches ``at_least``."""
    deadline = time.monotonic() + 30
    while (count := actor.count()) < at_least:
        assert time.monotonic() < deadline, f"the app counted only to {count} in its volume"
        time.sleep(0.05)
    return count


def _tar_count(tar_path: Path) -> int:
    with tarfile.open(tar_path) as tar:
        member = tar.extractfile("./count")
        assert member is not None
        return int(member.read())


def _atelet_restores(actor: DurableActor) -> None:
    """What atelet does between a snapshot and its restore: the snapshot downloaded into
    restore_dir, the volume's directory fresh and empty, new bundles."""
    if actor.restore.exists():
        shutil.rmtree(actor.restore)
    actor.checkpoint.rename(actor.restore)
    shutil.rmtree(actor.durable / "data")
    (actor.durable / "data").mkdir()
    shutil.rmtree(actor.bundles)
    actor.prepare()


def test_a_durable_dir_volume_through_data_and_full_snapshots(
    worker, agent: AgentProcess, real_runsc: Path, root: Path, tmp_path: Path
) -> None:
    """An app in gVisor counting in its durable-dir volume: Checkpoint DATA (pause, the tar,
    resume: the sandbox ran on until the teardown), Restore DATA (a cold boot that counts on
    from the restored volume), Checkpoint FULL (runsc's image and the tar), Restore FULL."""
    uid = f"durable-{uuid.uuid4().hex[:12]}"  # its own cgroup (another run may use "durable")
    actor = DurableActor(tmp_path / "durable", runsc=str(real_runsc), uid=uid)
    actor.app_args = list(DURABLE_COUNTER)
    (actor.durable / "data").mkdir(parents=True)
    actor.prepare()
    assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
    _volume_count(actor, 5)

    reply = worker.CheckpointWorkload(
        actor.checkpoint_request(scope=pb.SNAPSHOT_SCOPE_DATA), timeout=120
    )
    tar = "durable-dir-data.tar"
    assert (list(reply.snapshot_files), list(reply.data_snapshot_files)) == ([tar], [tar])
    saved = _tar_count(actor.checkpoint / tar)
    assert saved >= 5
    assert runsc_.list_ids(real_runsc, root / f"{uid}.1") == []  # torn down after it

    _atelet_restores(actor)
    request = actor.restore_request(scope=pb.SNAPSHOT_SCOPE_DATA)
    assert status_of(worker.RestoreWorkload, request) == (OK, "")
    assert sorted(runsc_.list_ids(real_runsc, root / f"{uid}.2")) == ["_pause", "app"]
    counted = _volume_count(actor, saved + 3)
    assert counted < saved + 200  # from the restored value, not from 0

    reply = worker.CheckpointWorkload(actor.checkpoint_request(), timeout=120)
    assert list(reply.data_snapshot_files) == [tar]
    assert {"checkpoint.img", tar} <= set(reply.snapshot_files)
    saved = _tar_count(actor.checkpoint / tar)
    assert saved >= counted

    _atelet_restores(actor)
    assert status_of(worker.RestoreWorkload, actor.restore_request()) == (OK, "")
    assert sorted(runsc_.list_ids(real_runsc, root / f"{uid}.3")) == ["_pause", "app"]
    assert _volume_count(actor, saved + 2) >= saved + 2
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
    assert runsc_.list_ids(real_runsc, root / f"{uid}.3") == []
    types = [e["type"] for e in logged_events(agent.log) if e["actor_id"] == f"{uid}.2"]
    assert "run_requested" in types and "restore_requested" not in types  # DATA: a cold boot


def test_each_app_containers_output_is_json_lines_on_the_agents_stdout(
    real_runsc: Path, root: Path, tmp_path: Path
) -> None:
    """In gVisor too, an app container's stdout and stderr reach the agent's stdout as JSON
    records labelled with the actor's identity and the container (upstream's log pipe)."""
    flags = [f"--runsc-flag={f}" for f in runsc_.GLOBAL_FLAGS]
    stdout = tmp_path / "agent.stdout"
    process = AgentProcess.on_socket(
        tmp_path,
        "--runsc",
        str(real_runsc),
        *flags,
        "--worker-socket",
        str(tmp_path / "worker.sock"),
        stdout_file=stdout,
    )
    try:
        worker = connect(tmp_path / "worker.sock")
        uid = f"logs-{uuid.uuid4().hex[:8]}"
        args = ["sh", "-c", "echo hello from gvisor; echo oops >&2; sleep 100000"]
        actor = Actor(tmp_path / "logs", runsc=str(real_runsc), uid=uid, app_args=args).prepare()
        assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
        deadline = time.monotonic() + 20
        wanted = {"hello from gvisor", "oops"}
        while True:
            records = [json.loads(line) for line in stdout.read_text().splitlines() if line]
            seen = {r.get("message") for r in records if r["labels"].get("ate.actor.uid") == uid}
            if wanted <= seen:
                break
            assert time.monotonic() < deadline, records
            time.sleep(0.1)
        [record] = [r for r in records if r.get("message") == "hello from gvisor"]
        assert record["labels"]["ate.actor.container.name"] == "app"
        assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
    finally:
        assert process.terminate() == 0, process.stderr()[-3000:]


def test_a_pod_network_sandbox_serves_on_the_worker_pods_namespace(
    real_runsc: Path, root: Path, tmp_path: Path
) -> None:
    """``--sandbox-network pod``: the sandbox is on the agent's network namespace (runsc
    ``--network=host``, no network namespace in the bundles), so an app's HTTP server in
    gVisor answers the agent's own 127.0.0.1, and Run waits for its wakeup probe there."""
    flags = [f"--runsc-flag={f}" for f in runsc_.GLOBAL_FLAGS if not f.startswith("--network")]
    process = AgentProcess.on_socket(
        tmp_path,
        "--runsc",
        str(real_runsc),
        *flags,
        "--sandbox-network",
        "pod",
        "--worker-socket",
        str(tmp_path / "worker.sock"),
    )
    port = 18000 + uuid.uuid4().int % 2000
    try:
        worker = connect(tmp_path / "worker.sock")
        args = ["busybox", "httpd", "-f", "-p", f"127.0.0.1:{port}", "-h", "/bin"]
        actor = Actor(
            tmp_path / "net",
            runsc=str(real_runsc),
            uid=f"net-{uuid.uuid4().hex[:8]}",
            app_args=args,
        ).prepare()
        # The wakeup probe: Run answers once the server answers 200 (upstream's WaitAll).
        probe = pb.WakeupProbe(
            http_get=pb.HTTPGetAction(path="/busybox", port=port), timeout_seconds=20
        )
        spec = pb.WorkloadSpec(containers=[pb.Container(name="app", wakeup_probe=probe)])
        assert status_of(worker.RunWorkload, actor.run(spec=spec)) == (OK, "")
        for name in ("_pause", "app"):
            config = json.loads((actor.bundles / name / "config.json").read_text())
            assert "network" not in {n["type"] for n in config["linux"]["namespaces"]}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/busybox", timeout=2) as answer:
            assert answer.status == 200  # at once: the probe already saw it
        assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")

        # A probe nobody answers: the call fails after its timeout and leaves nothing.
        silent = pb.WakeupProbe(
            http_get=pb.HTTPGetAction(path="/", port=port + 1), timeout_seconds=1
        )
        spec = pb.WorkloadSpec(containers=[pb.Container(name="app", wakeup_probe=silent)])
        actor.prepare()
        code, message = status_of(worker.RunWorkload, actor.run(spec=spec))
        assert code == grpc.StatusCode.INTERNAL
        assert "wakeup probe for 'app'" in message and "never returned 200 within 1s" in message
        assert worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest()).samples == []
    finally:
        assert process.terminate() == 0, process.stderr()[-3000:]


def test_a_pod_network_sandbox_checkpoints_and_restores_its_listener(
    real_runsc: Path, root: Path, tmp_path: Path
) -> None:
    """What ``pool render`` gives a GPU worker (``--sandbox-network pod``): a sandbox on the
    pod's network is checkpointed and restored like any other (runsc saves a host-network
    listener and re-creates it at restore), and Restore waits for its wakeup probe again."""
    flags = [f"--runsc-flag={f}" for f in runsc_.GLOBAL_FLAGS if not f.startswith("--network")]
    process = AgentProcess.on_socket(
        tmp_path,
        "--runsc",
        str(real_runsc),
        *flags,
        "--sandbox-network",
        "pod",
        "--worker-socket",
        str(tmp_path / "worker.sock"),
    )
    port = 20000 + uuid.uuid4().int % 2000
    try:
        worker = connect(tmp_path / "worker.sock")
        args = ["busybox", "httpd", "-f", "-p", f"127.0.0.1:{port}", "-h", "/bin"]
        actor = Actor(
            tmp_path / "net",
            runsc=str(real_runsc),
            uid=f"netcr-{uuid.uuid4().hex[:8]}",
            app_args=args,
        ).prepare()
        probe = pb.WakeupProbe(
            http_get=pb.HTTPGetAction(path="/busybox", port=port), timeout_seconds=20
        )
        spec = pb.WorkloadSpec(containers=[pb.Container(name="app", wakeup_probe=probe)])
        assert status_of(worker.RunWorkload, actor.run(spec=spec)) == (OK, "")
        reply = worker.CheckpointWorkload(actor.checkpoint_request(spec=spec), timeout=120)
        assert "checkpoint.img" in reply.snapshot_files
        with pytest.raises(OSError):  # torn down: nothing listens
            urllib.request.urlopen(f"http://127.0.0.1:{port}/busybox", timeout=2)
        shutil.copytree(actor.checkpoint, actor.restore)
        shutil.rmtree(actor.bundles)
        actor.prepare()
        restore = actor.restore_request(spec=spec, preserve_restore_dir=True)
        assert status_of(worker.RestoreWorkload, restore) == (OK, "")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/busybox", timeout=2) as answer:
            assert answer.status == 200
        assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
    finally:
        assert process.terminate() == 0, process.stderr()[-3000:]


def test_the_size_is_applied_to_the_sandboxs_cgroup(
    worker, real_runsc: Path, root: Path, tmp_path: Path
) -> None:
    """cpu_milli and memory_bytes become the sandbox cgroup's CPU quota and memory limit."""
    actor = Actor(tmp_path / "sized", runsc=str(real_runsc), uid="sized").prepare()
    request = actor.run(cpu_milli=500, memory_bytes=256 * 1024 * 1024)
    assert status_of(worker.RunWorkload, request) == (OK, "")
    cgroup = "substrate-gpu/sized.1"
    if (CGROUP / "cgroup.controllers").exists():
        assert (CGROUP / cgroup / "memory.max").read_text().strip() == str(256 * 1024 * 1024)
        assert (CGROUP / cgroup / "cpu.max").read_text().split() == ["50000", "100000"]
    else:
        limit = (CGROUP / "memory" / cgroup / "memory.limit_in_bytes").read_text()
        assert int(limit) == 256 * 1024 * 1024
        assert (CGROUP / "cpu" / cgroup / "cpu.cfs_quota_us").read_text().strip() == "50000"
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
    assert not (CGROUP / "memory" / cgroup).exists() and not (CGROUP / cgroup).exists()


def test_a_refused_checkpoint_keeps_the_actor_running(
    worker, agent: AgentProcess, real_runsc: Path, root: Path, tmp_path: Path
) -> None:
    """A live CUDA context the actor has no route to suspend: FAILED_PRECONDITION with the
    machine's reason, and the sandbox goes on running (upstream's worker loses it here)."""
    actor = Actor(tmp_path / "refused", runsc=str(real_runsc), uid="refused").prepare()
    assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
    with agent.client() as client:  # the node agent saw a context open (the other door)
        assert client.request(event("cuda_context_opened", "refused.1", pid=7))["ok"]
    code, message = status_of(worker.CheckpointWorkload, actor.checkpoint_request())
    assert code == grpc.StatusCode.FAILED_PRECONDITION, message
    assert "refused" in message and "CUDA context" in message
    actor_root = root / "refused.1"
    counted = _count(real_runsc, actor_root)
    assert _counted_to(real_runsc, actor_root, counted + 2) > counted  # still counting
    assert _stats(worker, "refused").source == pb.STATS_SOURCE_CGROUP
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")


def test_a_failing_run_leaves_nothing_and_a_new_one_works(
    worker, real_runsc: Path, root: Path, tmp_path: Path
) -> None:
    """An app that cannot start: INTERNAL with the runtime's reason, the activation deleted
    (no container left, stats NOT_FOUND); the next Run of the UID is a new activation."""
    broken = Actor(
        tmp_path / "broken", runsc=str(real_runsc), uid="flaky", app_args=["/no/such/binary"]
    ).prepare()
    code, message = status_of(worker.RunWorkload, broken.run())
    assert code == grpc.StatusCode.INTERNAL, message
    assert "run of actor 'flaky.1' failed" in message
    assert runsc_.list_ids(real_runsc, root / "flaky.1") == []
    code, _ = status_of(worker.GetWorkloadStats, pb.GetWorkloadStatsRequest(actor_uid="flaky"))
    assert code == grpc.StatusCode.NOT_FOUND
    good = Actor(tmp_path / "good", runsc=str(real_runsc), uid="flaky").prepare()
    assert status_of(worker.RunWorkload, good.run()) == (OK, "")
    assert sorted(runsc_.list_ids(real_runsc, root / "flaky.2")) == ["_pause", "app"]
    assert status_of(worker.TerminateWorkload, good.terminate()) == (OK, "")


def test_a_failing_restore_leaves_nothing_and_the_snapshot_as_it_was(
    worker, real_runsc: Path, root: Path, tmp_path: Path
) -> None:
    """A checkpoint.img runsc cannot read: an error with the reason, nothing left running,
    restore_dir untouched."""
    actor = Actor(tmp_path / "bad-image", runsc=str(real_runsc), uid="bad-image").prepare()
    actor.restore.mkdir()
    (actor.restore / "checkpoint.img").write_bytes(b"not an image")
    kept = _digests(actor.restore)
    code, message = status_of(
        worker.RestoreWorkload, actor.restore_request(preserve_restore_dir=True)
    )
    assert code in {grpc.StatusCode.INTERNAL, grpc.StatusCode.FAILED_PRECONDITION}, message
    assert "restore of actor 'bad-image.1'" in message
    assert runsc_.list_ids(real_runsc, root / "bad-image.1") == []
    assert _digests(actor.restore) == kept
    assert worker.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest()).samples == []


def test_a_restarted_agent_still_knows_its_uids(
    real_runsc: Path, root: Path, tmp_path: Path
) -> None:
    """SIGKILL the agent while a sandbox runs: restarted on its log, the worker API still
    finds the UID's activation (identity from the log, cgroup from _pause's bundle), measures
    it, numbers the next activation after it, and terminates it."""
    flags = [f"--runsc-flag={f}" for f in runsc_.GLOBAL_FLAGS]
    args = ("--runsc", str(real_runsc), *flags, "--worker-socket", str(tmp_path / "worker.sock"))
    actor = Actor(tmp_path / "kept", runsc=str(real_runsc), uid="kept").prepare()
    first = AgentProcess.on_socket(tmp_path, *args)
    try:
        worker = connect(tmp_path / "worker.sock")
        assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
        first.process.send_signal(9)
        first.wait()
    finally:
        first.kill()
    second = AgentProcess.on_socket(tmp_path, *args)
    try:
        worker = connect(tmp_path / "worker.sock")
        sample = _stats(worker, "kept")
        assert (sample.actor_name, sample.source) == ("counter", pb.STATS_SOURCE_CGROUP)
        assert sample.memory_current_bytes > 0
        code, message = status_of(worker.RunWorkload, actor.run())
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "'kept.1'" in message
        assert status_of(worker.TerminateWorkload, actor.terminate()) == (OK, "")
        assert runsc_.list_ids(real_runsc, root / "kept.1") == []
        again = Actor(tmp_path / "again", runsc=str(real_runsc), uid="kept").prepare()
        assert status_of(worker.RunWorkload, again.run()) == (OK, "")
        assert sorted(runsc_.list_ids(real_runsc, root / "kept.2")) == ["_pause", "app"]
        assert status_of(worker.TerminateWorkload, again.terminate()) == (OK, "")
    finally:
        assert second.terminate() == 0, second.stderr()[-3000:]


def test_sigterm_stops_the_apps_in_gvisor_and_records_it(
    worker, agent: AgentProcess, real_runsc: Path, root: Path, tmp_path: Path
) -> None:
    """SIGTERM to the agent: a polite app (a TERM trap) and a stubborn one (it ignores
    TERM) in one gVisor sandbox; the first exits on SIGTERM, the second is killed at
    the --workload-grace deadline (10 s default), the agent exits, both apps are stopped in
    runsc, _pause is left for recovery or Terminate, and the log says sandbox_exited.
    Also: every create/restore/start ran with upstream's flags on this runsc (accepted)."""
    # Each app says when its trap is set: a SIGTERM before that would end the stubborn one at
    # once (Run answers when the container started, not when its shell ran its first line).
    polite = "trap 'exit 0' TERM; echo > /tmp/trapped; while true; do sleep 0.1; done"
    stubborn = "trap '' TERM; echo > /tmp/trapped; while true; do sleep 0.1; done"
    actor = Actor(tmp_path / "stop", runsc=str(real_runsc), uid="stop", apps=("polite", "stub"))
    actor.prepare()
    bundles.make_bundle(actor.bundles / "polite", ["sh", "-c", polite])
    bundles.make_bundle(actor.bundles / "stub", ["sh", "-c", stubborn])
    assert status_of(worker.RunWorkload, actor.run()) == (OK, "")
    actor_root = root / "stop.1"
    for name in ("polite", "stub"):
        trapped = ("exec", name, "/bin/cat", "/tmp/trapped")
        wait_until(
            lambda t=trapped: runsc_.run(real_runsc, actor_root, *t, check=False).returncode == 0,
            every=0.02,
        )
    started = time.monotonic()
    assert agent.terminate() == 0, agent.stderr()[-3000:]
    assert 9 <= time.monotonic() - started < 40
    states = {
        name: json.loads(runsc_.run(real_runsc, actor_root, "state", name).stdout)["status"]
        for name in ("polite", "stub", "_pause")
    }
    assert states == {"polite": "stopped", "stub": "stopped", "_pause": "running"}
    stderr = agent.stderr()
    assert stderr.count("grace period expired; killing container") == 1  # the stubborn one
    assert [e["actor_id"] for e in logged_events(agent.log) if e["type"] == "sandbox_exited"] == [
        "stop.1"
    ]
