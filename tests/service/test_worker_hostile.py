"""``substrate-gpu agent --worker-socket`` under hostile clients (issue 30, items 4 and 7): the
worker socket's connections are bounded, running out of descriptors ends nothing, and what a
request carries is bounded and refused as INVALID_ARGUMENT, never logged whole.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from substrate_gpu.service import _socketfile
from substrate_gpu.service.ateworker import ateworker_pb2 as pb
from substrate_gpu.testing import node as node_

from .agentproc import AgentProcess, free_port, probe
from .workerclient import Actor, connect, status_of

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _worker_agent(tmp_path: Path, *extra: str, **kwargs: object) -> AgentProcess:
    return AgentProcess.on_socket(
        tmp_path,
        "--worker-socket",
        str(tmp_path / "worker" / "worker.sock"),
        "--atelet-socket",
        "",
        *extra,
        **kwargs,  # type: ignore[arg-type]
    )


def _idle(path: Path, count: int) -> list[socket.socket]:
    """``count`` connections that send nothing (those the backlog cannot take are dropped)."""
    held = []
    for _ in range(count):
        s = socket.socket(socket.AF_UNIX)
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError, ConnectionRefusedError):
            s.connect(str(path))
        held.append(s)
    return held


def _wait_for_socket(path: Path) -> None:
    """Until the worker socket answers a call (its channel closed again)."""
    with grpc.insecure_channel(f"unix:{path}") as channel:
        grpc.channel_ready_future(channel).result(timeout=20)
    time.sleep(1.0)  # gRPC core frees the closed connection's slot a moment later


def _stats(path: Path) -> pb.GetActiveWorkloadStatsResponse:
    return connect(path).GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest(), timeout=10)


# --- 1. connections and descriptors ----------------------------------------------------------


def test_idle_connections_past_the_descriptor_limit_are_bounded_and_end_nothing(tmp_path):
    """Under nofile 1024, 1,100 idle worker connections: --max-worker-clients (64) are held
    and a warning says the socket is full, the agent keeps serving, /healthz stays 200
    throughout, and a call is answered once they close."""
    port = free_port()
    agent = _worker_agent(tmp_path, "--metrics-port", str(port))
    sock = tmp_path / "worker" / "worker.sock"
    try:
        _wait_for_socket(sock)
        resource.prlimit(agent.process.pid, resource.RLIMIT_NOFILE, (1024, 1024))
        flood = _idle(sock, 1100)
        # The runsc check (every 5 s while runsc is missing) opens files meanwhile.
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            assert agent.process.poll() is None, agent.stderr()
            assert probe(port, "/healthz")[0] == 200
            time.sleep(0.25)
        assert _socketfile.connections(sock).held == 64
        for s in flood:
            s.close()
        time.sleep(0.5)
        assert list(_stats(sock).samples) == []
        assert probe(port, "/healthz")[0] == 200
        assert "worker socket full" in agent.stderr()
        assert '"max_worker_clients": 64' in agent.stderr()
    finally:
        assert agent.terminate() == 0, agent.stderr()


def test_running_out_of_descriptors_is_waited_out_not_fatal(tmp_path):
    """With a bound above the descriptor limit the agent does run out (EMFILE in gRPC's
    accept and in the runsc check's output files): it stays up and serves once they close."""
    port = free_port()
    agent = _worker_agent(tmp_path, "--metrics-port", str(port), "--max-worker-clients", "5000")
    sock = tmp_path / "worker" / "worker.sock"
    try:
        _wait_for_socket(sock)
        resource.prlimit(agent.process.pid, resource.RLIMIT_NOFILE, (1024, 1024))
        flood = _idle(sock, 1100)
        deadline = time.monotonic() + 12  # two runsc checks, 5 s apart
        while time.monotonic() < deadline:
            assert agent.process.poll() is None, agent.stderr()
            time.sleep(0.5)
        for s in flood:
            s.close()
        time.sleep(1.5)  # gRPC retries its accept a second later
        assert list(_stats(sock).samples) == []
        assert probe(port, "/healthz")[0] == 200
        assert "File descriptor limit reached" in agent.stderr()  # gRPC core met EMFILE
    finally:
        assert agent.terminate() == 0, agent.stderr()


def test_a_freed_slot_serves_again(tmp_path):
    """With --max-worker-clients 2, a third connection is closed before a byte is read; once
    one of the two closes, a call is answered."""
    agent = _worker_agent(tmp_path, "--max-worker-clients", "2")
    sock = tmp_path / "worker" / "worker.sock"
    try:
        held = _idle(sock, 2)
        time.sleep(0.5)
        extra = socket.socket(socket.AF_UNIX)
        extra.connect(str(sock))
        extra.settimeout(10)
        with extra:
            assert extra.recv(100) == b""  # closed by the server
        held.pop().close()
        time.sleep(0.5)
        assert list(_stats(sock).samples) == []
        for s in held:
            s.close()
    finally:
        assert agent.terminate() == 0, agent.stderr()


@pytest.mark.parametrize("value", ["0", "-3", "2147483647"])
def test_max_worker_clients_out_of_range_is_refused(tmp_path, value):
    """--max-worker-clients must be between 1 and 2**31 - 2 (gRPC core's C int)."""
    agent = _worker_agent(tmp_path, "--max-worker-clients", value, wait=False)
    assert agent.wait() != 0
    assert "--max-worker-clients" in agent.stderr()


# --- 2. what a request carries ----------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentProcess, Path]]:
    """One agent for the request tests, on the runsc stand-in (every request here is refused
    before runsc runs; ``runsc_path`` names the stand-in where a call checks it)."""
    tmp = tmp_path_factory.mktemp("hostile")
    runsc = node_.install_runsc_standin(tmp / "bin")
    agent = _worker_agent(tmp, "--runsc", str(runsc))
    try:
        yield agent, tmp
    finally:
        assert agent.terminate() == 0, agent.stderr()


def _raw_call(path: Path, method: str, body: bytes) -> tuple[grpc.StatusCode, str]:
    """``body`` sent as the request of ``method``, as bytes (no serialiser in the way)."""
    with grpc.insecure_channel(f"unix:{path}") as channel:
        call = channel.unary_unary(f"/ateworker.Worker/{method}")
        try:
            call(body, timeout=20)
        except grpc.RpcError as e:
            return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def test_a_huge_actor_name_is_refused_naming_the_field_and_never_logged(hostile):
    """A 3.9 MB actor_name: INVALID_ARGUMENT naming actor_name and the 1024-byte bound; the
    name reaches neither the agent's log nor the event log."""
    agent, tmp = hostile
    actor = Actor(tmp / "huge").prepare()
    name = "n" * 3_900_000
    code, message = status_of(
        connect(tmp / "worker" / "worker.sock").RunWorkload, actor.run(actor_name=name)
    )
    assert code == INVALID
    assert "actor_name is 3900000 bytes: at most 1024" in message
    assert "n" * 1000 not in agent.stderr()
    assert "n" * 1000 not in (tmp / "events.jsonl").read_text()


@pytest.mark.parametrize(
    ("field", "where"),
    [
        pytest.param({"runsc_path": "/" * 5000}, "runsc_path is 5000 bytes", id="runsc-path"),
        pytest.param(
            {"actor_dirs": pb.ActorDirs(oci_bundle_dir="/" + "d" * 4096)},
            "actor_dirs.oci_bundle_dir is 4097 bytes: at most 4096",
            id="bundle-dir",
        ),
        pytest.param(
            {
                "spec": pb.WorkloadSpec(
                    containers=[pb.Container(name="a"), pb.Container(name="b" * 5000)]
                )
            },
            "spec.containers[1].name is 5000 bytes",
            id="container-name",
        ),
        pytest.param(
            {"runtime_asset_paths": {"runsc": "/" * 5000}},
            "runtime_asset_paths['runsc'] is 5000 bytes",
            id="map-value",
        ),
        pytest.param(
            {"runtime_asset_paths": {"k" * 5000: "/x"}},
            "runtime_asset_paths key is 5000 bytes",
            id="map-key",
        ),
    ],
)
def test_every_string_of_a_request_is_bounded(hostile, field, where):
    """Paths and names too: PATH_MAX (4096 bytes), named by their field path."""
    _, tmp = hostile
    actor = Actor(tmp / "strings").prepare()
    code, message = status_of(
        connect(tmp / "worker" / "worker.sock").RunWorkload, actor.run(**field)
    )
    assert (code, where in message) == (INVALID, True), message


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\x0a\x02\xff\xfe", id="field-1-not-utf8"),
        pytest.param(b"\xff\xff\xff\xff", id="not-a-message"),
        pytest.param(b"\x0a\x10abc", id="truncated"),
    ],
)
@pytest.mark.parametrize("method", ["RunWorkload", "TerminateWorkload", "GetWorkloadStats"])
def test_a_corrupt_request_is_invalid_argument(hostile, body, method):
    """A body that is no message of the method's type (a string that is not UTF-8, bytes
    that are no protobuf): INVALID_ARGUMENT naming the type, not UNKNOWN."""
    _, tmp = hostile
    code, message = _raw_call(tmp / "worker" / "worker.sock", method, body)
    assert code == INVALID, (code, message)
    assert f"not a valid ateworker.{method}Request message" in message


def test_a_deeply_nested_app_config_is_invalid_argument(hostile):
    """An app container's config.json nested 100,000 deep: INVALID_ARGUMENT naming the file,
    not INTERNAL (a RecursionError)."""
    _, tmp = hostile
    actor = Actor(tmp / "nested").prepare()
    (actor.bundles / "app" / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    request = actor.run(runsc_path=str(tmp / "bin" / "runsc"))
    code, message = status_of(connect(tmp / "worker" / "worker.sock").RunWorkload, request)
    assert code == INVALID, message
    assert "app/config.json" in message


def test_an_existing_worker_socket_directory_writable_by_others_is_fixed(tmp_path):
    """A world-writable directory for the worker socket: made 0755 before the socket is
    bound, with a warning; the socket serves."""
    directory = tmp_path / "worker"
    directory.mkdir()
    directory.chmod(0o777)
    agent = _worker_agent(tmp_path)
    try:
        assert list(_stats(directory / "worker.sock").samples) == []
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755
        assert "socket directory was writable by others" in agent.stderr()
    finally:
        assert agent.terminate() == 0, agent.stderr()
