"""A soak of ``substrate-gpu agent``: hostile and honest clients, SIGKILL and restart cycles.

Used by ``tests/service/test_soak.py`` (bounded, in the suite) and
``tests/bench/soak_agent.py`` (longer, on demand). Many client threads talk to the agent's
socket at once: most send honest lives (register, prepare, sometimes delete) mixed with lines
the agent must refuse (an event invalid in the actor's state, one for an unknown actor, bad
JSON, 2,000 nested brackets, an ``at`` of -1e300), the rest attack (a line over the limit, a
partial line left hanging, a silent connection, a disconnect mid-line, binary garbage).
Meanwhile the agent is SIGKILLed at random moments and restarted on its log.

What it checks:

- **no ack lost or doubled**: every acknowledged event is in the final log exactly once,
  with the seq, actor and type its ack named; the log's seqs run 1..N without a gap;
- **restart = replay**: after each restart (and at the end) the agent's actors per state
  (its ``/metrics``) equal a replay of its log;
- **bounded memory**: the agent's peak RSS, against its RSS after the first start;
- **client input never ends the agent**: before each SIGKILL the agent is still running,
  and at the end SIGTERM stops it with exit 0.
"""

from __future__ import annotations

import collections
import contextlib
import json
import random
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from substrate_gpu.eventlog import read_log, replay

from .agentproc import AgentProcess, free_port

#: Limits the soak runs the agent with: short, so the attacks finish within the soak.
IDLE_TIMEOUT = 2.0
LINE_TIMEOUT = 1.0
MAX_CLIENTS = 64


@dataclass
class Report:
    """What one soak did and found."""

    clients: int
    duration: float
    lines_sent: int = 0
    events_sent: int = 0
    restarts: int = 0
    acked: int = 0
    lost: int = 0
    duplicated: int = 0
    gaps: int = 0
    start_rss_kib: int = 0
    peak_rss_kib: int = 0
    exits_on_input: int = 0
    replay_mismatches: list[str] = field(default_factory=list)
    wrong_answers: list[str] = field(default_factory=list)
    final_exit: int | None = None

    def lines(self) -> list[str]:
        """The report, one figure per line (each beside what it is judged against)."""
        per_client = self.events_sent / max(self.clients, 1)
        sent = f"{self.events_sent} events in {self.lines_sent} lines, {self.duration:.0f} s"
        acks = f"acknowledged: {self.acked}; lost: {self.lost} (must be 0)"
        doubles = f"duplicated: {self.duplicated} (must be 0); seq gaps: {self.gaps} (must be 0)"
        rss = f"{self.peak_rss_kib / 1024:.1f} MiB against {self.start_rss_kib / 1024:.1f} MiB"
        exits = f"agent exits on client input: {self.exits_on_input} (must be 0)"
        return [
            f"clients x events sent: {self.clients} x {per_client:.0f} ({sent})",
            f"SIGKILL/restart cycles: {self.restarts}",
            f"{acks}; {doubles}",
            f"peak RSS: {rss} after the first start",
            f"restarts whose states differed from replay: {len(self.replay_mismatches)} (must be 0)",
            f"{exits}; wrong answers: {len(self.wrong_answers)} (must be 0)",
            f"final exit on SIGTERM: {self.final_exit} (must be 0)",
        ]

    @property
    def ok(self) -> bool:
        """Every assertion of the soak holds."""
        return (
            self.lost == 0
            and self.duplicated == 0
            and self.gaps == 0
            and not self.replay_mismatches
            and not self.wrong_answers
            and self.exits_on_input == 0
            and self.final_exit == 0
        )


class _Shared:
    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.up = threading.Event()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acks: list[tuple[int, str, str]] = []
        self.lines_sent = 0
        self.events_sent = 0
        self.wrong: list[str] = []

    def count(self, lines: int, events: int) -> None:
        with self.lock:
            self.lines_sent += lines
            self.events_sent += events

    def wrong_answer(self, what: str) -> None:
        with self.lock:
            if len(self.wrong) < 50:
                self.wrong.append(what)


def _event(kind: str, actor: str, **fields: object) -> bytes:
    return json.dumps({"type": kind, "v": 1, "actor_id": actor, **fields}).encode()


def _connect(shared: _Shared) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(10)
    try:
        sock.connect(str(shared.socket_path))
    except OSError:
        sock.close()
        raise
    return sock


def _honest_session(shared: _Shared, rng: random.Random, client: int, serial: list[int]) -> None:
    """Batches of pipelined lines on one connection; every answer checked against its line."""
    with _connect(shared) as sock:
        reader = sock.makefile("rb")
        for _ in range(rng.randint(1, 8)):
            if shared.stop.is_set() or not shared.up.is_set():
                return
            serial[0] += 1
            actor = f"w{client}-{serial[0]}"
            # (line, expected kind: None for an ack)
            batch: list[tuple[bytes, str | None]] = [
                (_event("actor_registered", actor, gpu=False, bundle="/b"), None),
                (_event("suspend_requested", actor), "invalid_in_state"),
                (_event("bundle_prepared", actor, bundle="/b"), None),
            ]
            extras: list[tuple[bytes, str | None]] = [
                (_event("run_requested", f"ghost-{client}-{serial[0]}"), "unknown_actor"),
                (b"{not json", "malformed"),
                (b"[" * 2000, "malformed"),
                (
                    _event("actor_registered", f"t{actor}", gpu=False, bundle="/b", at=-1e300),
                    "schema",
                ),
                (_event("sandbox_created", actor), "not_external"),
            ]
            batch += rng.sample(extras, rng.randint(0, len(extras)))
            if rng.random() < 0.5:
                batch.append((_event("delete_requested", actor), None))
            sock.sendall(b"".join(line + b"\n" for line, _ in batch))
            shared.count(len(batch), sum(1 for _, kind in batch if kind is None))
            for line, expected in batch:
                raw = reader.readline()
                if not raw:
                    return  # the agent went away (SIGKILL): the rest is unknown
                answer = json.loads(raw)
                got = None if answer["ok"] else answer["kind"]
                if answer["ok"]:
                    with shared.lock:
                        shared.acks.append((answer["seq"], answer["actor_id"], answer["event"]))
                if got != expected:
                    shared.wrong_answer(f"{line[:60]!r}: expected {expected}, got {answer}")


def _hostile_session(shared: _Shared, rng: random.Random) -> None:
    """One attack on a connection of its own."""
    attack = rng.choice(["too_long", "partial", "silent", "slow", "garbage", "blank"])
    with _connect(shared) as sock:
        shared.count(1, 0)
        if attack == "too_long":
            with contextlib.suppress(OSError):
                sock.sendall(b'{"type":"' + b"x" * 70_000 + b'"}\n')
            _expect_error_then_close(shared, sock, "too_long")
        elif attack == "partial":
            sock.sendall(b'{"type":"actor_registered","v":1,"actor_id":"half')
        elif attack == "silent":
            shared.stop.wait(rng.uniform(0, 0.5))
        elif attack == "slow":
            sock.sendall(b'{"type":')
            _expect_error_then_close(shared, sock, "timeout")
        elif attack == "garbage":
            sock.sendall(rng.randbytes(200).replace(b"\n", b" ") + b"\n")
            _expect_error_then_close(shared, sock, "malformed", then_close=False)
        else:
            sock.sendall(b"\n\n   \n")


def _expect_error_then_close(
    shared: _Shared, sock: socket.socket, kind: str, *, then_close: bool = True
) -> None:
    reader = sock.makefile("rb")
    raw = reader.readline()
    if not raw:
        return  # killed meanwhile
    answer = json.loads(raw)
    if answer.get("kind") != kind:
        shared.wrong_answer(f"attack expecting {kind}: {answer}")
    if then_close and reader.read(1) != b"":
        shared.wrong_answer(f"attack {kind}: the connection stayed open")


def _client(shared: _Shared, client: int, seed: int) -> None:
    rng = random.Random(seed * 1000 + client)
    serial = [0]
    hostile = client % 4 == 3
    while not shared.stop.is_set():
        shared.up.wait(0.5)
        if not shared.up.is_set():
            continue
        try:
            if hostile or rng.random() < 0.1:
                _hostile_session(shared, rng)
            else:
                _honest_session(shared, rng, client, serial)
        except (OSError, ValueError):
            # The agent was killed under us (reset, refused, a torn answer): retry later.
            time.sleep(0.05)


def _rss_kib(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _states_from_metrics(port: int) -> dict[str, int]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, int] = {}
    for line in text.splitlines():
        # substrate_gpu_actors{in_flight="false",state="running"} 3.0 (labels in any order)
        if line.startswith("substrate_gpu_actors{"):
            labels, _, value = line.partition("} ")
            state = re.search(r'\bstate="([^"]*)"', labels)
            if state is None:
                raise AssertionError(f"substrate_gpu_actors sample without a state: {line!r}")
            if float(value):
                out[state[1]] = out.get(state[1], 0) + int(float(value))
    return out


def _states_from_replay(log: Path) -> dict[str, int]:
    return dict(collections.Counter(view.state for view in replay(log).actors.values()))


def _compare_with_replay(agent_port: int, log: Path, deadline: float = 15.0) -> str | None:
    """None once the agent's states equal a replay of its log (effects may still settle)."""
    until = time.monotonic() + deadline
    last = ""
    while time.monotonic() < until:
        before = _states_from_metrics(agent_port)
        replayed = _states_from_replay(log)
        after = _states_from_metrics(agent_port)
        if before == after == replayed:
            return None
        last = f"agent {after} != replay {replayed}"
        time.sleep(0.2)
    return last


class _Agent:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.process: AgentProcess | None = None
        self.port = 0

    def start(self) -> AgentProcess:
        self.port = free_port()
        self.process = AgentProcess.on_socket(
            self.tmp,
            "--metrics-port",
            str(self.port),
            "--idle-timeout",
            str(IDLE_TIMEOUT),
            "--line-timeout",
            str(LINE_TIMEOUT),
            "--max-clients",
            str(MAX_CLIENTS),
            "--drain-timeout",
            "5",
        )
        return self.process


def run_soak(
    tmp: Path, *, duration: float, clients: int, seed: int = 1, kill_every: tuple[float, float]
) -> Report:
    """Soak an agent for ``duration`` seconds with ``clients`` client threads (module doc)."""
    report = Report(clients=clients, duration=duration)
    rng = random.Random(seed)
    agent = _Agent(tmp)
    process = agent.start()
    report.start_rss_kib = report.peak_rss_kib = _rss_kib(process.process.pid)
    shared = _Shared(process.socket)
    threads = [
        threading.Thread(target=_client, args=(shared, n, seed), daemon=True)
        for n in range(clients)
    ]
    shared.up.set()
    for t in threads:
        t.start()
    deadline = time.monotonic() + duration
    try:
        while True:
            pause = rng.uniform(*kill_every)
            until = min(time.monotonic() + pause, deadline)
            while time.monotonic() < until:
                report.peak_rss_kib = max(report.peak_rss_kib, _rss_kib(process.process.pid))
                time.sleep(0.1)
            if process.process.poll() is not None:
                report.exits_on_input += 1
                report.wrong_answers.append(f"agent exited by itself: {process.stderr()[-2000:]}")
                process = agent.start()
            if time.monotonic() >= deadline:
                break
            shared.up.clear()
            process.kill()
            report.restarts += 1
            process = agent.start()
            mismatch = _compare_with_replay(agent.port, process.log)
            if mismatch is not None:
                report.replay_mismatches.append(f"after restart {report.restarts}: {mismatch}")
            shared.up.set()
    finally:
        shared.stop.set()
        shared.up.set()
        for t in threads:
            t.join(30)
    mismatch = _compare_with_replay(agent.port, process.log)
    if mismatch is not None:
        report.replay_mismatches.append(f"at the end: {mismatch}")
    report.final_exit = process.terminate()
    _audit(report, shared, process.log)
    return report


def _audit(report: Report, shared: _Shared, log: Path) -> None:
    """Every ack in the log exactly once, seqs without gaps."""
    contents = read_log(log)
    seqs = [e.seq for e in contents.events]
    logged = {e.seq: (e.actor_id, e.type) for e in contents.events}
    base = contents.header.base_seq
    report.acked = len(shared.acks)
    report.lines_sent = shared.lines_sent
    report.events_sent = shared.events_sent
    report.wrong_answers += shared.wrong
    seen_pairs = collections.Counter((e.actor_id, e.type) for e in contents.events)
    for seq, actor, kind in shared.acks:
        if seq <= base:
            continue  # compacted into the snapshot
        if logged.get(seq) != (actor, kind):
            report.lost += 1
        elif seen_pairs[(actor, kind)] > 1:
            report.duplicated += 1
    report.duplicated += len(seqs) - len(set(seqs))
    expected = list(range(base + 1, base + 1 + len(seqs)))
    report.gaps = sum(1 for a, b in zip(sorted(seqs), expected, strict=True) if a != b)
