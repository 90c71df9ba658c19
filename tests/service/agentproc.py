"""Running ``substrate-gpu agent`` as a real process and talking to it over its socket."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def event(kind: str, actor_id: str, **fields: Any) -> dict[str, Any]:
    """A request: an event's JSON form without seq."""
    return {"type": kind, "v": 1, "actor_id": actor_id, **fields}


def register(actor_id: str, *, gpu: bool = False, bundle: str = "/nonexistent") -> dict[str, Any]:
    return event("actor_registered", actor_id, gpu=gpu, bundle=bundle)


class AgentProcess:
    """``python -m substrate_gpu agent …`` with its stderr in a file."""

    def __init__(
        self,
        tmp: Path,
        *args: str,
        stdin: bool = False,
        env: dict[str, str] | None = None,
        log_level: str | None = "INFO",
        umask: int = -1,
        stdout_file: Path | None = None,
    ) -> None:
        """``log_level`` None: the agent's own default (no ``--log-level``); ``umask``: the
        agent's (-1: this process's); ``stdout_file``: where its stdout goes (not stdin's
        answers: those are piped)."""
        self.tmp = tmp
        self.args = args
        self.socket = tmp / "agent.sock"
        self.log = tmp / "events.jsonl"
        self.stderr_path = tmp / f"agent-{time.monotonic_ns()}.stderr"
        self._stderr = self.stderr_path.open("w")
        level = ["--log-level", log_level] if log_level is not None else []
        argv = [sys.executable, "-m", "substrate_gpu", *level, "agent", *args]
        stdout: Any = subprocess.PIPE if stdin else subprocess.DEVNULL
        if stdout_file is not None and not stdin:
            stdout = stdout_file.open("wb")
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=stdout,
            stderr=self._stderr,
            cwd=REPO,
            env={**os.environ, **(env or {})},
            umask=umask,
        )
        if stdout_file is not None and not stdin:
            stdout.close()  # the agent holds its own copy

    @property
    def runsc(self) -> str:
        """The agent's ``--runsc`` (the last one given wins, as the parser reads it)."""
        given = [v for flag, v in zip(self.args, self.args[1:], strict=False) if flag == "--runsc"]
        return given[-1] if given else "runsc"

    @classmethod
    def on_socket(cls, tmp: Path, *extra: str, wait: bool = True, **kwargs: Any) -> AgentProcess:
        """An agent serving ``tmp/agent.sock`` with its log at ``tmp/events.jsonl``
        (``extra`` flags come last: they override these); ``wait``: until it serves."""
        agent = cls(
            tmp,
            "--socket",
            str(tmp / "agent.sock"),
            "--event-log",
            str(tmp / "events.jsonl"),
            "--checkpoint-root",
            str(tmp / "checkpoints"),
            "--runsc-root",
            str(tmp / "runsc-root"),
            "--runsc",
            str(tmp / "no-runsc-here"),
            "--metrics-port",
            "0",
            *extra,
            **kwargs,
        )
        if wait:
            agent.wait_for_socket()
        return agent

    @classmethod
    def on_stdin(cls, tmp: Path, *extra: str) -> AgentProcess:
        """An agent reading stdin only (answers on stdout), its log at ``tmp/events.jsonl``."""
        return cls(
            tmp,
            "--stdin",
            "--event-log",
            str(tmp / "events.jsonl"),
            "--checkpoint-root",
            str(tmp / "checkpoints"),
            "--runsc",
            str(tmp / "no-runsc-here"),
            "--metrics-port",
            "0",
            *extra,
            stdin=True,
        )

    def stderr(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self.stderr_path.read_text()

    def communicate(self, data: bytes, timeout: float = 30) -> bytes:
        """Feed stdin, wait for exit; stdout."""
        try:
            out, _ = self.process.communicate(data, timeout=timeout)
        finally:
            self._stderr.close()
        return out

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self._stderr.close()

    def wait_for_socket(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                message = f"agent exited {self.process.returncode}: {self.stderr()}"
                self._stderr.close()
                raise AssertionError(message)
            if self.socket.exists():
                try:
                    with socket.socket(socket.AF_UNIX) as s:
                        s.connect(str(self.socket))
                    return
                except OSError:
                    pass
            time.sleep(0.05)
        message = f"agent socket never appeared: {self.stderr()}"
        self.kill()
        raise AssertionError(message)

    def client(self) -> Client:
        return Client(self.socket)

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self._stderr.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._stderr.close()


class Client:
    """A blocking JSON-lines client of the agent's socket."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(20)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rwb")

    def send_raw(self, line: bytes) -> None:
        self.file.write(line)
        self.file.flush()

    def receive(self) -> dict[str, Any]:
        line = self.file.readline()
        assert line, "agent closed the connection"
        body: dict[str, Any] = json.loads(line)
        return body

    def request(self, body: dict[str, Any] | bytes) -> dict[str, Any]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_raw(raw + b"\n")
        return self.receive()

    def requests(self, bodies: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Pipelined: all lines first, then all responses."""
        bodies = list(bodies)
        self.send_raw(b"".join(json.dumps(b).encode() + b"\n" for b in bodies))
        return [self.receive() for _ in bodies]

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> str:
    """The agent's /metrics text."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text: str = response.read().decode()
    return text


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in an exposition (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    prefix = f"{name}{{{want}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


def logged_events(path: Path) -> list[dict[str, Any]]:
    """The event lines of a log (header and other record kinds skipped)."""
    out = []
    for line in path.read_text().splitlines():
        body = json.loads(line)
        if "seq" in body and "actor_id" in body:
            out.append(body)
    return out


def probe(port: int, path: str) -> tuple[int, str]:
    """GET ``/healthz`` or ``/readyz``: (status, body), a 503 included."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read().decode()


def wait_for_probe(
    port: int, path: str, until: Callable[[int, str], bool], timeout: float = 20
) -> tuple[int, str]:
    """Probe until ``until(status, body)`` holds (a refused connection counts as not yet)."""
    deadline = time.monotonic() + timeout
    last: tuple[int, str] | None = None
    while time.monotonic() < deadline:
        with contextlib.suppress(urllib.error.URLError, ConnectionError):
            last = probe(port, path)
            if until(*last):
                return last
        time.sleep(0.05)
    raise AssertionError(f"{path} never satisfied the condition; last answer: {last}")


_PTRACE_SEIZE, _PTRACE_INTERRUPT, _PTRACE_DETACH = 0x4206, 0x4207, 17
_WALL = 0x40000000
#: Syscalls an idle event loop waits in, with the GIL released (epoll_wait/_pwait/_pwait2).
_LOOP_WAITS = {"x86_64": {"232", "281", "441"}, "aarch64": {"22", "441"}}


@contextlib.contextmanager
def main_thread_stopped(pid: int) -> Iterator[None]:
    """Stop the main thread of child ``pid`` only (ptrace), while it waits in epoll.

    The agent's event loop runs there; its other threads (the metrics server's) keep
    running, so a probe sees exactly a blocked loop. The thread is stopped inside its
    epoll wait, where it does not hold the GIL (else the other threads would stall too):
    a stop that lands elsewhere is undone and retried.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]

    def ptrace(request: int) -> None:
        if libc.ptrace(request, pid, None, None) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"ptrace({request:#x}, {pid}): {os.strerror(code)}")

    waits = _LOOP_WAITS[platform.machine()]
    for _ in range(200):
        ptrace(_PTRACE_SEIZE)
        ptrace(_PTRACE_INTERRUPT)
        os.waitpid(pid, _WALL)
        syscall = Path(f"/proc/{pid}/syscall").read_text().split()[0]
        if syscall in waits:
            break
        ptrace(_PTRACE_DETACH)
        time.sleep(0.01)
    else:
        raise AssertionError(f"the main thread of {pid} never stopped in its epoll wait")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            ptrace(_PTRACE_DETACH)
