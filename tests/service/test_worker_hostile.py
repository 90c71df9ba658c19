"""``substrate-gpu agent --worker-socket`` under hostile clients (issue 30, items 4 and 7): the
worker socket's connections are bounded, running out of descriptors ends nothing, and what a
request carries is bounded and refused as INVALID_ARGUMENT, never logged whole.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import time
from pathlib import Path

import grpc
import pytest

from substrate_gpu.service import _socketfile
from substrate_gpu.service.ateworker import ateworker_pb2 as pb

from .agentproc import AgentProcess, free_port, probe
from .workerclient import connect

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
        assert _socketfile.connections(sock) == 64
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
