"""``substrate-gpu agent`` as a process: socket and stdin, concurrency, SIGTERM, restart."""

from __future__ import annotations

import json
import signal
import stat
import threading

from substrate_gpu.eventlog import replay

from .agentproc import AgentProcess, event, logged_events, register


# Events that need no runtime: a registered actor can be deleted without a sandbox.
def life(actor_id: str) -> list[dict]:
    return [
        register(actor_id),
        event("bundle_prepared", actor_id, bundle="/nonexistent"),
        event("delete_requested", actor_id),
    ]


def test_socket_is_private_and_acks_accepted_events(tmp_path):
    """The socket is mode 0600; each accepted event gets ok, seq and the new state."""
    agent = AgentProcess.on_socket(tmp_path)
    try:
        assert stat.S_IMODE(agent.socket.stat().st_mode) == 0o600
        with agent.client() as client:
            acks = client.requests(life("a1")[:2])
        assert [(a["ok"], a["state"], a["from"]) for a in acks] == [
            (True, "registered", "new"),
            (True, "bundle_prepared", "registered"),
        ]
        assert acks[1]["seq"] > acks[0]["seq"] > 0
    finally:
        assert agent.terminate() == 0


def test_a_missing_socket_directory_is_created_private(tmp_path):
    """--socket in a directory that does not exist yet: it is made (0700) and served."""
    socket_path = tmp_path / "run" / "substrate-gpu" / "agent.sock"
    agent = AgentProcess(tmp_path, "--socket", str(socket_path), "--metrics-port", "0")
    agent.socket = socket_path
    try:
        agent.wait_for_socket()
        assert stat.S_IMODE(socket_path.parent.stat().st_mode) == 0o700
        with agent.client() as client:
            assert client.requests([register("a1")])[0]["ok"] is True
    finally:
        assert agent.terminate() == 0


def test_malformed_input_never_crashes_and_never_reaches_the_log(tmp_path):
    """Every kind of bad line gets an error naming its line; the log holds only accepted events."""
    bad_lines = [
        b"{not json",
        b"\xff\xfe\xfd",
        b"[1,2,3]",
        b'{"type":"launch","v":1,"actor_id":"x"}',
        b'{"type":"run_requested","v":99,"actor_id":"x"}',
        b'{"type":"actor_registered","v":1,"actor_id":"x"}',
        b'{"type":"run_requested","v":1,"actor_id":"x","seq":5}',
        b'{"type":"sandbox_created","v":1,"actor_id":"x"}',
        b'{"type":"run_requested","v":1,"actor_id":"ghost"}',
    ]
    agent = AgentProcess.on_socket(tmp_path)
    try:
        with agent.client() as client:
            first = client.request(register("good"))
            errors = [client.request(line) for line in bad_lines]
            refused = client.request(event("sandbox_exited", "good"))  # invalid in registered
            last = client.request(event("bundle_prepared", "good", bundle="/b"))
        assert first["ok"] and last["ok"]
        assert [e["ok"] for e in errors] == [False] * len(bad_lines)
        assert [e["line"] for e in errors] == list(range(2, 2 + len(bad_lines)))
        assert [e["kind"] for e in errors] == [
            "malformed",
            "malformed",
            "malformed",
            "schema",
            "schema",
            "schema",
            "schema",
            "not_external",
            "unknown_actor",
        ]
        assert refused["ok"] is False and refused["kind"] == "invalid_in_state"
        assert "registered" in refused["error"]
        assert agent.process.poll() is None
        huge = b'{"type":"run_requested","v":1,"actor_id":"' + b"x" * 70_000 + b'"}'
        with agent.client() as client:
            too_long = client.request(huge)
        assert too_long["kind"] == "too_long"
        with agent.client() as client:
            assert client.request(event("delete_requested", "good"))["ok"]
    finally:
        assert agent.terminate() == 0
    logged = logged_events(agent.log)
    assert [(e["type"], e["actor_id"]) for e in logged if e["actor_id"] != "good"] == []
    assert [e["type"] for e in logged] == [
        "actor_registered",
        "bundle_prepared",
        "delete_requested",
        "deleted",
    ]


def test_concurrent_clients_each_get_their_answers_in_order(tmp_path):
    """20 clients pipelining at once: every line answered in order; seqs unique."""
    agent = AgentProcess.on_socket(tmp_path)
    results: dict[int, list[dict]] = {}

    def one(n: int) -> None:
        with agent.client() as client:
            results[n] = client.requests(life(f"c{n}"))

    try:
        threads = [threading.Thread(target=one, args=(n,)) for n in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        assert agent.terminate() == 0
    assert sorted(results) == list(range(20))
    seqs = []
    for n, acks in results.items():
        assert [(a["ok"], a["actor_id"], a["event"]) for a in acks] == [
            (True, f"c{n}", "actor_registered"),
            (True, f"c{n}", "bundle_prepared"),
            (True, f"c{n}", "delete_requested"),
        ]
        seqs += [a["seq"] for a in acks]
    assert len(set(seqs)) == 60
    logged = {e["seq"]: e for e in logged_events(agent.log)}
    for acks in results.values():
        for ack in acks:  # each ack's seq is the logged line of exactly that event
            assert (logged[ack["seq"]]["type"], logged[ack["seq"]]["actor_id"]) == (
                ack["event"],
                ack["actor_id"],
            )
    assert sorted(logged) == list(range(1, len(logged) + 1))


def test_stdin_alone_answers_on_stdout_and_exits_at_eof(tmp_path):
    """--stdin: one response line per request line; EOF drains and exits 0."""
    agent = AgentProcess(
        tmp_path,
        "--stdin",
        "--metrics-port",
        "0",
        "--event-log",
        str(tmp_path / "events.jsonl"),
        "--checkpoint-root",
        str(tmp_path / "ck"),
        "--runsc",
        str(tmp_path / "none"),
        stdin=True,
    )
    lines = [json.dumps(b).encode() for b in life("s1")] + [b"", b"oops"]
    out = agent.communicate(b"\n".join(lines) + b"\n")
    assert agent.process.returncode == 0, agent.stderr()
    responses = [json.loads(line) for line in out.splitlines()]
    assert [r["ok"] for r in responses] == [True, True, True, False]
    assert responses[-1]["line"] == 5  # the blank line is counted, not answered
    assert replay(tmp_path / "events.jsonl").actors["s1"].state == "deleted"


def test_sigterm_drains_removes_the_socket_and_closes_the_log(tmp_path):
    """SIGTERM: exit 0, socket gone, every acknowledged event in a readable log."""
    agent = AgentProcess.on_socket(tmp_path)
    with agent.client() as client:
        acks = client.requests(life("t1"))
    assert agent.terminate(signal.SIGTERM) == 0, agent.stderr()
    assert not agent.socket.exists()
    logged = {e["seq"] for e in logged_events(agent.log)}
    assert {a["seq"] for a in acks} <= logged
    assert replay(agent.log).actors["t1"].state == "deleted"


def test_sigint_stops_cleanly_too(tmp_path):
    """SIGINT is a clean shutdown as well."""
    agent = AgentProcess.on_socket(tmp_path)
    assert agent.terminate(signal.SIGINT) == 0, agent.stderr()


def test_restart_on_an_existing_log_resumes_every_actor(tmp_path):
    """A second agent on the same log knows the actors and continues the sequence."""
    first = AgentProcess.on_socket(tmp_path)
    with first.client() as client:
        acks = client.requests([*life("r1")[:2], register("r2")])
    assert first.terminate() == 0
    last_seq = max(a["seq"] for a in acks)

    second = AgentProcess.on_socket(tmp_path)
    try:
        with second.client() as client:
            again = client.request(register("r1"))
            deleted = client.request(event("delete_requested", "r1"))
            prepared = client.request(event("bundle_prepared", "r2", bundle="/b"))
    finally:
        assert second.terminate() == 0
    assert again["ok"] is False and again["kind"] == "invalid_in_state"
    assert deleted["ok"] and deleted["from"] == "bundle_prepared"
    assert prepared["ok"] and prepared["from"] == "registered"
    assert deleted["seq"] > last_seq
    states = {a: v.state for a, v in replay(tmp_path / "events.jsonl").actors.items()}
    assert states == {"r1": "deleted", "r2": "bundle_prepared"}


def test_no_input_is_a_usage_error(tmp_path):
    """Without --socket, --stdin or --demo the agent refuses to start (exit 2, a usage error)."""
    agent = AgentProcess(tmp_path)
    assert agent.wait() == 2
    assert "--socket" in agent.stderr()


def test_a_file_in_the_sockets_way_is_an_error_not_clobbered(tmp_path):
    """--socket naming a regular file: exit 1 with the path in the message; the file survives."""
    (tmp_path / "agent.sock").write_text("precious")
    agent = AgentProcess(tmp_path, "--socket", str(tmp_path / "agent.sock"), "--metrics-port", "0")
    assert agent.wait() == 1
    assert "non-socket file" in agent.stderr()
    assert (tmp_path / "agent.sock").read_text() == "precious"


def test_a_corrupt_event_log_refuses_to_start(tmp_path):
    """A log whose middle line is garbage: exit 1 naming the line, nothing overwritten."""
    log = tmp_path / "events.jsonl"
    first = AgentProcess.on_socket(tmp_path)
    with first.client() as client:
        client.requests(life("x1"))
    assert first.terminate() == 0
    lines = log.read_bytes().splitlines(keepends=True)
    lines[1] = b"garbage\n"
    log.write_bytes(b"".join(lines))
    second = AgentProcess(
        tmp_path,
        "--socket",
        str(tmp_path / "agent.sock"),
        "--event-log",
        str(log),
        "--metrics-port",
        "0",
    )
    assert second.wait() == 1
    assert "events.jsonl:2" in second.stderr()
    assert log.read_bytes() == b"".join(lines)
