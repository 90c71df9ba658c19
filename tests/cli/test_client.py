"""``substrate-gpu client``: events and queries to a running agent, answers printed."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from service.agentproc import REPO, AgentProcess
from service.workerclient import connect

from substrate_gpu import cli
from substrate_gpu.service import protocol


def _client(agent: AgentProcess, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "substrate_gpu", "client", "--socket", str(agent.socket), *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )


@pytest.fixture
def agent(tmp_path: Path):  # type: ignore[no-untyped-def]
    running = AgentProcess.on_socket(tmp_path)
    yield running
    running.terminate()


def test_send_builds_the_event_and_prints_the_acknowledgement(agent: AgentProcess) -> None:
    """``send TYPE ACTOR key=value``: v filled in, values as JSON when they parse, ack printed."""
    done = _client(agent, "send", "actor_registered", "a1", "gpu=true", "bundle=/b/a1")
    assert done.returncode == 0, done.stderr
    ack = json.loads(done.stdout)
    assert ack["ok"] is True and ack["state"] == "registered" and ack["seq"] == 1


def test_a_refused_event_exits_non_zero_with_the_agents_words(agent: AgentProcess) -> None:
    """The agent's refusal is printed, and the exit code says it failed."""
    done = _client(agent, "send", "run_requested", "ghost")
    assert done.returncode == cli.EXIT_FAILED
    assert json.loads(done.stdout)["kind"] == "unknown_actor"
    assert "refused" in done.stderr and "register it first" in done.stderr


def test_actor_and_actors_print_the_query_answers(agent: AgentProcess) -> None:
    """``actor A`` and ``actors [--state S]`` ask the agent and print its answers."""
    assert (
        _client(agent, "send", "actor_registered", "a1", "gpu=false", "bundle=/b").returncode == 0
    )
    one = _client(agent, "actor", "a1")
    assert json.loads(one.stdout)["actor"]["state"] == "registered"
    none_running = _client(agent, "actors", "--state", "running")
    assert json.loads(none_running.stdout) == {"ok": True, "actors": []}
    assert _client(agent, "actor", "nobody").returncode == cli.EXIT_FAILED


def test_lines_from_stdin_are_sent_in_order_and_each_answered(agent: AgentProcess) -> None:
    """``-`` reads JSON lines from stdin (events or queries): one answer line per line."""
    lines = [
        {"type": "actor_registered", "v": 1, "actor_id": "a1", "gpu": False, "bundle": "/b"},
        {"query": "actors"},
    ]
    done = _client(agent, "-", stdin="".join(json.dumps(line) + "\n" for line in lines))
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert answers[0]["ok"] is True and answers[1]["actors"][0]["actor_id"] == "a1"


def test_an_unknown_event_type_is_refused_before_connecting(tmp_path: Path) -> None:
    """``send`` with a type that does not exist: exit 2 naming the closest client types."""
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        sys.stderr, saved = stderr, sys.stderr
        try:
            cli.main(["client", "--socket", str(tmp_path / "s"), "send", "run_requestd", "a1"])
        finally:
            sys.stderr = saved
    assert exited.value.code == cli.EXIT_USAGE
    assert "did you mean 'run_requested'" in stderr.getvalue()


def test_no_agent_on_the_socket_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A socket nobody serves: exit 1, "is the agent running with --socket …?"."""
    code = cli.main(["client", "--socket", str(tmp_path / "none.sock"), "actors"])
    assert code == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "none.sock" in err and "is the agent running" in err


def test_send_without_an_actor_names_only_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """FIELD=VALUE is optional: a missing ACTOR_ID is the only required argument named."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["client", "--socket", str(tmp_path / "s"), "send", "run_requested"])
    assert exited.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "required: ACTOR_ID\n" in err
    assert "[FIELD=VALUE ...]" in err


def test_send_help_lists_the_event_types_a_client_may_send(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``client send --help`` names every external event type."""
    with pytest.raises(SystemExit):
        cli.main(["client", "--socket", "s", "send", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for name in protocol.EXTERNAL_TYPES:
        assert name in out


def test_the_help_lists_exactly_the_protocols_external_types():
    """`client send --help` names the types the protocol accepts from a client (a copy,
    kept so the parser loads no lifecycle: held equal here)."""
    from substrate_gpu.cli import _client
    from substrate_gpu.service import protocol

    assert _client.EXTERNAL_TYPES == protocol.EXTERNAL_TYPES


def test_the_worker_api_socket_is_named_with_how_to_talk_to_it(tmp_path: Path) -> None:
    """``client --socket`` given the gRPC worker socket (a real agent's): exit 1 with one line
    saying it is the worker API (HTTP/2) and naming grpcurl and the Python stubs; no
    UnicodeDecodeError traceback."""
    worker_socket = tmp_path / "worker" / "worker.sock"
    running = AgentProcess.on_socket(
        tmp_path, "--worker-socket", str(worker_socket), "--atelet-socket", ""
    )
    try:
        connect(worker_socket)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "substrate_gpu",
                "client",
                "--socket",
                str(worker_socket),
                "actors",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
            check=False,
        )
    finally:
        running.terminate()
    assert done.returncode == cli.EXIT_FAILED, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert str(worker_socket) in line and "worker API" in line and "HTTP/2" in line
    assert f"grpcurl -plaintext -unix {worker_socket} list" in line
    assert "substrate_gpu.service.ateworker" in line and "--socket" in line


def test_an_answer_that_is_not_a_json_line_is_named_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Some other server on the socket answers binary: exit 1, what it sent, which socket to use."""
    path = tmp_path / "other.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)

    def answer_garbage() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"\xfe\xff not json\n")

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    try:
        code = cli.main(["client", "--socket", str(path), "actors"])
    finally:
        thread.join(timeout=10)
        server.close()
    assert code == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "not a JSON line" in err and "agent --socket" in err and str(path) in err
