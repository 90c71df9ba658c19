"""``substrate-gpu agent`` under hostile clients: every line answered, the process never ends.

Each test is an attack that once killed the agent or grew it without bound (issue 12).
"""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from support import real

from substrate_gpu.eventlog import read_log
from substrate_gpu.service import protocol

from .agentproc import AgentProcess, event, free_port, register, sample, scrape

NESTED = b"[" * 2000  # 4 KB: deeper than any recursive JSON decoder goes


def exact_line(size: int, actor_id: str) -> bytes:
    """A valid registration padded with trailing JSON whitespace to exactly ``size`` bytes."""
    body = json.dumps(register(actor_id)).encode()
    assert len(body) <= size
    return body + b" " * (size - len(body))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def closed_by_peer(sock: socket.socket, within: float) -> bytes:
    """Everything the agent sends until it closes the connection (fails after ``within`` s)."""
    sock.settimeout(within)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


# --- 1. any line gets an answer --------------------------------------------------------------


def test_deeply_nested_json_on_the_socket_is_answered_and_the_connection_kept(tmp_path):
    """2,000 nested '[' (a RecursionError in a recursive decoder): an error answer, nothing more."""
    agent = AgentProcess.on_socket(tmp_path)
    try:
        with agent.client() as client:
            nested = client.request(NESTED)
            after = client.request(register("n1"))
        assert (nested["ok"], nested["kind"], nested["line"]) == (False, "malformed", 1)
        assert after["ok"]
        assert agent.process.poll() is None
        assert agent.socket.exists()
    finally:
        assert agent.terminate() == 0


def test_deeply_nested_json_on_stdin_is_answered(tmp_path):
    """The same line on stdin: an error answer, the next line served, exit 0 at EOF."""
    agent = AgentProcess.on_stdin(tmp_path)
    out = agent.communicate(NESTED + b"\n" + json.dumps(register("n1")).encode() + b"\n")
    assert agent.process.returncode == 0, agent.stderr()
    answers = [json.loads(line) for line in out.splitlines()]
    assert [(a["ok"], a.get("kind")) for a in answers] == [(False, "malformed"), (True, None)]


# --- 2. `at` is checked at the door ----------------------------------------------------------


@pytest.mark.parametrize(
    "at",
    [-1e300, 1e300, -1.0, 253402300800.0, 10**400],
    ids=["-1e300", "1e300", "-1", "year-10000", "10**400"],
)
def test_an_at_outside_the_representable_range_is_refused_and_not_logged(tmp_path, at):
    """An event time no calendar can show is a schema error; the log stays replayable."""
    agent = AgentProcess.on_socket(tmp_path)
    try:
        with agent.client() as client:
            raw = json.dumps(register("t1")).encode()[:-1] + b', "at": ' + repr(at).encode() + b"}"
            refused = client.request(raw)
    finally:
        assert agent.terminate() == 0
    assert (refused["ok"], refused["kind"]) == (False, "schema")
    assert "$.at" in refused["error"]
    assert read_log(agent.log).events == []


# --- 3. one exact line limit on both inputs --------------------------------------------------

LIMIT = protocol.MAX_LINE_BYTES


@pytest.mark.parametrize("newline", [True, False], ids=["newline", "eof"])
@pytest.mark.parametrize(
    ("size", "accepted"), [(LIMIT, True), (LIMIT + 1, False)], ids=["limit", "limit+1"]
)
def test_the_line_limit_is_exact_on_the_socket(tmp_path, size, accepted, newline):
    """65,536 bytes before the newline (or the client's EOF) are served; 65,537 are too long."""
    agent = AgentProcess.on_socket(tmp_path)
    try:
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(20)
        sock.connect(str(agent.socket))
        with sock:
            sock.sendall(exact_line(size, "big") + (b"\n" if newline else b""))
            if not newline:
                sock.shutdown(socket.SHUT_WR)
            answer = json.loads(sock.makefile("rb").readline())
    finally:
        assert agent.terminate() == 0
    if accepted:
        assert answer["ok"], answer
    else:
        assert (answer["ok"], answer["kind"]) == (False, "too_long")
        assert str(LIMIT) in answer["error"]


@pytest.mark.parametrize("newline", [True, False], ids=["newline", "eof"])
@pytest.mark.parametrize(
    ("size", "accepted"), [(LIMIT, True), (LIMIT + 1, False)], ids=["limit", "limit+1"]
)
def test_the_line_limit_is_exact_on_stdin(tmp_path, size, accepted, newline):
    """The same limit on stdin; a too-long line is skipped whole and the next one served."""
    agent = AgentProcess.on_stdin(tmp_path)
    data = json.dumps(register("first")).encode() + b"\n" + exact_line(size, "big")
    out = agent.communicate(data + (b"\n" if newline else b""))
    assert agent.process.returncode == 0, agent.stderr()
    answers = [json.loads(line) for line in out.splitlines()]
    assert answers[0]["ok"]
    if accepted:
        assert answers[1]["ok"], answers[1]
    else:
        assert (answers[1]["ok"], answers[1]["kind"], answers[1]["line"]) == (False, "too_long", 2)
    assert len(answers) == 2


# --- 4. descriptors, client count, idle and slow clients -------------------------------------


def test_running_out_of_file_descriptors_backs_off_and_keeps_serving(tmp_path):
    """accept() failing with EMFILE is waited out, not fatal: once clients leave, new ones are served."""
    agent = AgentProcess.on_socket(tmp_path, "--max-clients", "1000")
    try:
        resource.prlimit(agent.process.pid, resource.RLIMIT_NOFILE, (64, 64))
        flood = []
        for _ in range(120):  # more than the agent can hold: the backlog keeps the rest
            s = socket.socket(socket.AF_UNIX)
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError, ConnectionRefusedError):
                s.connect(str(agent.socket))
            flood.append(s)
        time.sleep(1.0)
        assert agent.process.poll() is None, agent.stderr()
        for s in flood:
            s.close()
        time.sleep(0.5)
        with agent.client() as client:
            assert client.request(register("after-emfile"))["ok"]
        assert "EMFILE" in agent.stderr() or "Too many open files" in agent.stderr()
    finally:
        assert agent.terminate() == 0


def test_clients_beyond_max_clients_are_told_and_disconnected(tmp_path):
    """With --max-clients 3 a fourth client gets a 'busy' answer; a freed slot serves again."""
    agent = AgentProcess.on_socket(tmp_path, "--max-clients", "3")
    try:
        held = [agent.client() for _ in range(3)]
        for n, client in enumerate(held):  # each is being served
            assert client.request(register(f"h{n}"))["ok"]
        extra = socket.socket(socket.AF_UNIX)
        extra.connect(str(agent.socket))
        with extra:
            answer = json.loads(closed_by_peer(extra, within=10))
        assert (answer["ok"], answer["kind"]) == (False, "busy")
        assert "3" in answer["error"]
        held.pop().close()
        time.sleep(0.2)
        with agent.client() as client:
            assert client.request(register("freed"))["ok"]
        for client in held:
            client.close()
    finally:
        assert agent.terminate() == 0


def test_an_idle_connection_is_closed_after_the_idle_timeout(tmp_path):
    """A client that sends nothing is hung up on after --idle-timeout; an active one is not."""
    agent = AgentProcess.on_socket(tmp_path, "--idle-timeout", "1")
    try:
        idle = socket.socket(socket.AF_UNIX)
        idle.connect(str(agent.socket))
        with idle, agent.client() as active:
            idle.settimeout(0.3)
            with pytest.raises(TimeoutError):  # not before the timeout
                idle.recv(1)
            for n in range(8):  # 2.4 s of talking, never 1 s silent
                assert active.request(register(f"a{n}"))["ok"]
                time.sleep(0.3)
            assert closed_by_peer(idle, within=1) == b""
    finally:
        assert agent.terminate() == 0


def test_a_line_left_incomplete_is_answered_and_closed_after_the_line_timeout(tmp_path):
    """A partial line not finished within --line-timeout: a 'timeout' answer, then hang-up."""
    agent = AgentProcess.on_socket(tmp_path, "--line-timeout", "0.5", "--idle-timeout", "60")
    try:
        slow = socket.socket(socket.AF_UNIX)
        slow.connect(str(agent.socket))
        with slow:
            slow.sendall(b'{"type": "actor_reg')
            answer = json.loads(closed_by_peer(slow, within=10))
        assert (answer["ok"], answer["kind"]) == (False, "timeout")
    finally:
        assert agent.terminate() == 0


def test_slow_writers_cannot_grow_memory_without_bound(tmp_path):
    """300 clients each holding a 60 KB partial line: refused beyond the cap, RSS stays bounded."""
    agent = AgentProcess.on_socket(tmp_path, "--max-clients", "32", "--line-timeout", "30")
    writers: list[socket.socket] = []
    try:
        with agent.client() as client:
            assert client.request(register("warm"))["ok"]
        before = rss_kib(agent.process.pid)
        partial = b'{"type":"actor_registered","v":1,"bundle":"' + b"x" * 60_000
        for _ in range(300):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(5)
            s.connect(str(agent.socket))
            with contextlib.suppress(OSError):
                s.sendall(partial)
            writers.append(s)
        time.sleep(1.0)
        grown = rss_kib(agent.process.pid) - before
        assert agent.process.poll() is None
        # Unbounded (--max-clients 1000) this grows by ~19 MiB; capped at 32, by ~2 MiB.
        assert grown < 8 * 1024, f"RSS grew {grown} KiB under 300 slow writers"
    finally:
        for s in writers:
            s.close()
        assert agent.terminate() == 0


# --- 5. the log removed under the agent ------------------------------------------------------


def test_a_removed_log_directory_stops_acks_with_a_clear_error(tmp_path):
    """The log's directory deleted: the next event is not acknowledged; answers say why."""
    port = free_port()
    state = tmp_path / "state"
    agent = AgentProcess(
        tmp_path,
        "--socket",
        str(tmp_path / "agent.sock"),
        "--event-log",
        str(state / "events.jsonl"),
        "--checkpoint-root",
        str(tmp_path / "ck"),
        "--runsc",
        str(tmp_path / "none"),
        "--metrics-port",
        str(port),
    )
    agent.wait_for_socket()
    try:
        with agent.client() as client:
            assert client.request(register("before"))["ok"]
            for path in sorted(state.iterdir()):
                path.unlink()
            state.rmdir()
            lost = client.request(register("after"))
            again = client.request(register("later"))
        assert (lost["ok"], lost["kind"]) == (False, "unavailable")
        assert "events.jsonl" in lost["error"] and "no longer" in lost["error"]
        assert (again["ok"], again["kind"]) == (False, "unavailable")
        text = scrape(port)
        assert sample(text, "substrate_gpu_event_log_usable") == 0.0
        assert sample(text, "substrate_gpu_events_rejected_total", reason="log_unavailable") == 2
        assert agent.process.poll() is None
    finally:
        agent.terminate()
    assert "event log failed" in agent.stderr()


# --- 6. one agent per log ---------------------------------------------------------------------


def test_a_second_agent_on_the_same_log_exits_naming_the_holder(tmp_path):
    """The log is locked for the first agent's lifetime; the second exits 1 with its pid."""
    first = AgentProcess.on_socket(tmp_path)
    try:
        with first.client() as client:
            assert client.request(register("one"))["ok"]
        second = AgentProcess(
            tmp_path,
            "--socket",
            str(tmp_path / "second.sock"),
            "--event-log",
            str(first.log),
            "--metrics-port",
            "0",
        )
        assert second.wait() == 1
        assert f"pid {first.process.pid}" in second.stderr()
        assert "Traceback" not in second.stderr()
        with first.client() as client:
            assert client.request(register("two"))["seq"] == 2
    finally:
        assert first.terminate() == 0
    assert [e.seq for e in read_log(first.log).events] == [1, 2]


# --- 7. a live socket is never replaced --------------------------------------------------------


def test_a_second_agent_never_takes_over_a_live_socket(tmp_path):
    """A socket something answers on is not replaced: the second agent exits 1, the first serves."""
    first = AgentProcess.on_socket(tmp_path)
    try:
        other = tmp_path / "other"
        other.mkdir()
        second = AgentProcess(
            other,
            "--socket",
            str(first.socket),
            "--event-log",
            str(other / "events.jsonl"),
            "--metrics-port",
            "0",
        )
        assert second.wait() == 1
        assert "another process is serving" in second.stderr()
        # Checked before anything is touched: no log, no seq mark, no lock file (only the
        # test's own capture of the agent's stderr is there).
        left = [p.name for p in other.iterdir() if p != second.stderr_path]
        assert left == [], second.stderr()
        with first.client() as client:
            assert client.request(register("still-mine"))["ok"]
    finally:
        assert first.terminate() == 0


def test_a_stale_socket_is_replaced(tmp_path):
    """A socket file nothing listens on (a crashed agent's) is replaced."""
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(tmp_path / "agent.sock"))
    stale.close()
    agent = AgentProcess.on_socket(tmp_path)
    try:
        with agent.client() as client:
            assert client.request(register("fresh"))["ok"]
    finally:
        assert agent.terminate() == 0


# --- 8. refusals for unknown actors cost nothing durable ---------------------------------------


def test_events_for_unknown_actors_are_counted_not_logged(tmp_path):
    """A flood of events for actors never registered: refused, counted, absent from the log."""
    port = free_port()
    agent = AgentProcess.on_socket(tmp_path, "--metrics-port", str(port))
    try:
        with agent.client() as client:
            answers = client.requests(event("run_requested", f"ghost{n}") for n in range(100))
        assert {(a["ok"], a["kind"]) for a in answers} == {(False, "unknown_actor")}
        text = scrape(port)
        assert sample(text, "substrate_gpu_events_rejected_total", reason="unknown_actor") == 100
    finally:
        assert agent.terminate() == 0
    contents = read_log(agent.log)
    assert (contents.events, contents.rejections) == ([], [])


# --- 10. a log the agent cannot write ----------------------------------------------------------


@pytest.fixture
def immutable():
    """``chattr +i`` a path for the test (root, a filesystem that supports it), undone after."""
    made: list[Path] = []
    if shutil.which("chattr") is None:
        real.missing("chattr")

    def make(path: Path) -> None:
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
        if done.returncode != 0:
            real.missing("chattr +i", f"fails here: {done.stderr.decode().strip()}")
        made.append(path)

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=False)


@pytest.mark.parametrize("target", ["log", "directory"])
def test_a_restart_on_an_unwritable_log_is_a_clear_error(tmp_path, immutable, target):
    """An immutable log (or log directory): exit 1 with a message naming the path, no traceback."""
    state = tmp_path / "state"
    state.mkdir()
    first = AgentProcess(
        tmp_path,
        "--stdin",
        "--event-log",
        str(state / "events.jsonl"),
        "--metrics-port",
        "0",
        stdin=True,
    )
    first.communicate(json.dumps(register("x")).encode() + b"\n")
    assert first.process.returncode == 0
    immutable(state / "events.jsonl" if target == "log" else state)
    second = AgentProcess(
        tmp_path,
        "--socket",
        str(tmp_path / "agent.sock"),
        "--event-log",
        str(state / "events.jsonl"),
        "--metrics-port",
        "0",
    )
    assert second.wait() == 1
    stderr = second.stderr()
    assert "Traceback" not in stderr
    assert "substrate-gpu: error:" in stderr and "events.jsonl" in stderr


# --- 8. clients that ask for big answers and never read them -----------------------------------


def test_clients_that_never_read_big_answers_cannot_grow_memory_without_bound(tmp_path):
    """20,000 actors, 200 clients pipelining {"query":"actors"} (~1.4 MB each) and never reading:
    the answers over 64 KiB share one budget of --max-clients x 64 KiB, so RSS grows by about
    that, not by one whole answer per client (280 MB)."""
    actors = 20_000
    lines = ['{"format":"substrate-gpu-eventlog","v":1,"base_seq":0,"snapshot":null}']
    lines += [
        json.dumps({**register(f"actor-{i:07d}"), "seq": i + 1, "at": 1796053910.0 + i})
        for i in range(actors)
    ]
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    agent = AgentProcess.on_socket(tmp_path, "--max-clients", "200", "--line-timeout", "60")
    readers: list[socket.socket] = []
    try:
        with agent.client() as client:
            answer = client.request({"query": "actors"})
        assert len(answer["actors"]) == actors
        before = rss_kib(agent.process.pid)
        for _ in range(200):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(5)
            s.connect(str(agent.socket))
            s.sendall(b'{"query":"actors"}\n' * 4)
            readers.append(s)
        time.sleep(1.0)
        grown = rss_kib(agent.process.pid) - before
        assert agent.process.poll() is None
        # Unbounded this grows by ~280 MiB (one 1.4 MB answer held per client); the shared
        # budget is 200 x 64 KiB = 12.5 MiB (answers in the kernel's buffers are not RSS).
        assert grown < 40 * 1024, f"RSS grew {grown} KiB under 200 clients not reading"
        # Those holding the budget are answered in full once they read.
        with readers[0].makefile("rb") as first:
            assert len(json.loads(first.readline())["actors"]) == actors
    finally:
        for s in readers:
            s.close()
        assert agent.terminate() == 0
