"""Each app container's output as JSON lines on the worker's stdout, as upstream's worker.

Upstream's gVisor worker (``internal/actorlog`` at ``533900d``, ``StartJSONLogPipe``) gives
every app container a pipe of its own as ``runsc create``'s (or ``restore``'s) stdout and
stderr; the sandbox keeps it as the container's stdio, and each line read from it is written
to the worker's stdout as one JSON object carrying the actor's identity:

- a line that is a JSON object keeps its fields (``time`` added when absent), minus every
  top-level ``ate.*`` key (substrate's namespace: nothing the workload writes may read as
  platform attribution); its ``labels`` group (and the other spelling,
  ``logging.googleapis.com/labels``, folded into it) keeps the workload's keys that are not
  ``ate.*``, stringified, and gets ours on top;
- any other line is ``{"time", "message": <the line>, "labels": {…}}``;
- ours: ``ate.atespace``, ``ate.actor.name``, ``ate.actor.uid``, ``ate.template.atespace``,
  ``ate.template.name``, ``ate.actor.container.name``.

The group is spelled ``labels`` (upstream writes ``logging.googleapis.com/labels`` only on GCE,
which this agent does not detect). ``_pause``'s output is not piped (upstream hands it the
worker's stdout as it is).

**runsc's own stderr stays ours.** runsc writes its errors (the ones the lifecycle classifies:
``cannot checkpoint … in state stopped``, …) to that same pipe, so the reader keeps a copy of
what it reads while the command runs, and the command's result carries it as ``stderr``
(:meth:`ContainerPipe.drain` reads what is still in the pipe when the command exits): the
error classification sees exactly what it saw with a plain file.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import threading
import time
from collections.abc import Callable, Mapping
from typing import Final

from substrate_gpu._log import get_logger

log = get_logger(__name__)

RESERVED: Final = "ate."
"""Substrate's namespace: dropped from what the workload writes."""
LABELS_KEY: Final = "labels"
GCE_LABELS_KEY: Final = "logging.googleapis.com/labels"
CONTAINER_LABEL: Final = "ate.actor.container.name"
#: The request identity fields, and the label each becomes (upstream's ``ateattr`` keys).
IDENTITY_LABELS: Final = (
    ("atespace", "ate.atespace"),
    ("actor_name", "ate.actor.name"),
    ("actor_uid", "ate.actor.uid"),
    ("actor_template_atespace", "ate.template.atespace"),
    ("actor_template_name", "ate.template.name"),
)
#: A line longer than this is emitted in pieces (a workload cannot make us buffer without end).
MAX_LINE: Final = 1 << 20
#: What one command's captured output may hold (runsc's messages are a few lines).
MAX_CAPTURE: Final = 1 << 20


def labels_of(identity: Mapping[str, str], container: str) -> dict[str, str]:
    """The label group of ``container``'s lines (upstream's ``ateattr.ActorLogLabels``)."""
    labels = {label: identity.get(field, "") for field, label in IDENTITY_LABELS}
    if container:
        labels[CONTAINER_LABEL] = container
    return labels


def envelope(line: bytes, labels: Mapping[str, str], now: str) -> dict[str, object]:
    """The JSON object one output ``line`` (no newline) becomes (module doc)."""
    text = line.decode("utf-8", errors="replace")
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        return {"time": now, "message": text, LABELS_KEY: dict(labels)}
    record.setdefault("time", now)
    for key in [k for k in record if k.startswith(RESERVED)]:
        del record[key]
    group = _sanitized(record.pop(LABELS_KEY, None))
    for key, value in _sanitized(record.pop(GCE_LABELS_KEY, None)).items():
        group.setdefault(key, value)
    group.update(labels)
    record[LABELS_KEY] = group
    return record


def _sanitized(group: object) -> dict[str, str]:
    if not isinstance(group, dict):
        return {}
    return {str(k): _label_value(v) for k, v in group.items() if not str(k).startswith(RESERVED)}


def _label_value(value: object) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, separators=(",", ":"))


class PipeForwarder:
    """One daemon thread forwarding every open container pipe (epoll, no timeout).

    A thread per pipe, each waking every second to look for its end, cost a worker
    hosting 1,000 actors 1,000 threads and 1,000 wakeups a second, each taking the GIL
    from the event loop (what the worker API's calls wait for grew with the live actors:
    docs/worker-api.md, Performance). Here one thread sleeps in ``epoll_wait`` until a pipe
    has data or has ended; its work is O(pipes ready), never O(pipes open).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pipes: dict[int, ContainerPipe] = {}
        self._epoll: select.epoll | None = None

    def add(self, pipe: ContainerPipe, fd: int) -> None:
        """Forward ``pipe`` (its read end ``fd``) until it ends; the thread starts with the
        first pipe."""
        with self._lock:
            if self._epoll is None:
                self._epoll = select.epoll()
                threading.Thread(
                    target=self._forward,
                    args=(self._epoll,),
                    name="substrate-gpu logs",
                    daemon=True,
                ).start()
            self._pipes[fd] = pipe
            self._epoll.register(fd, select.EPOLLIN)

    def _forward(self, epoll: select.epoll) -> None:
        while True:
            try:
                ready = epoll.poll()
            except InterruptedError:
                continue
            for fd, _ in ready:
                with self._lock:
                    pipe = self._pipes.get(fd)
                if pipe is None or pipe.forward():
                    continue
                with self._lock:
                    # Unregistered before its descriptor is closed (and may be reused).
                    epoll.unregister(fd)
                    del self._pipes[fd]
                pipe.finish()


#: The forwarding thread every container pipe of this process shares.
_FORWARDER: Final = PipeForwarder()


class ContainerPipe:
    """One app container's output pipe: forwarded line by line, captured per command."""

    def __init__(
        self,
        labels: Mapping[str, str],
        emit: Callable[[bytes], None],
        forwarder: PipeForwarder = _FORWARDER,
    ) -> None:
        self._labels = dict(labels)
        self._emit = emit
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        self._lock = threading.Lock()
        self._partial = b""
        self._captured = bytearray()
        forwarder.add(self, self._read)

    def fileno(self) -> int:
        """The write end: the command's stdout and stderr (the container's, after it)."""
        return self._write

    def drain(self) -> bytes:
        """What was read since the last drain, the pipe's current contents included."""
        with self._lock:
            self._read_available()
            captured, self._captured = bytes(self._captured), bytearray()
        return captured

    def close(self) -> None:
        """Close our write end (idempotent): the sandbox holds its own copy, and the pipe
        ends when that goes too."""
        with self._lock:
            write, self._write = self._write, -1
        if write >= 0:
            with contextlib.suppress(OSError):
                os.close(write)

    def forward(self) -> bool:
        """Forward what the pipe holds now (the forwarder's thread); False at its end."""
        with self._lock:
            return self._read_available()

    def finish(self) -> None:
        """At the pipe's end: forward a last line without newline, close the read end."""
        with self._lock:
            if self._partial:
                self._line(self._partial)
                self._partial = b""
            read, self._read = self._read, -1
        if read >= 0:
            os.close(read)

    def _read_available(self) -> bool:
        """Read what the pipe holds now (the lock held); False at end of file."""
        while True:
            if self._read < 0:
                return False
            try:
                chunk = os.read(self._read, 65536)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                return False
            if len(self._captured) < MAX_CAPTURE:
                self._captured += chunk[: MAX_CAPTURE - len(self._captured)]
            data = self._partial + chunk
            *lines, self._partial = data.split(b"\n")
            for line in lines:
                self._line(line)
            while len(self._partial) > MAX_LINE:
                self._line(self._partial[:MAX_LINE])
                self._partial = self._partial[MAX_LINE:]

    def _line(self, line: bytes) -> None:
        if not line:
            return
        ns = time.time_ns()
        now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns % 10**9:09d}Z"
        record = envelope(line, self._labels, now)
        self._emit(json.dumps(record, separators=(",", ":")).encode() + b"\n")


class ActorLogs:
    """The worker's app containers' pipes (``RunscConfig.container_output``): one opened for
    each app container ``runsc create`` or ``restore`` makes in a sandbox the worker API
    knows; lines written whole to ``fd`` (the worker's stdout)."""

    def __init__(self, fd: int = 1) -> None:
        self._fd = fd
        self._write_lock = threading.Lock()
        self._open: dict[tuple[str, str], ContainerPipe] = {}
        self.identify: Callable[[str], Mapping[str, str] | None] = lambda _sandbox: None
        """The identity of a sandbox (an activation id), None when the worker API does not
        know it; set by the worker API."""

    def open(self, sandbox: str, container_id: str, *, fresh: bool) -> ContainerPipe | None:
        """The pipe of ``container_id`` of ``sandbox``: a new one (``fresh``: ``create``,
        ``restore``; one still open for it is closed), or the one ``create`` opened
        (``start``, which hands gVisor a subcontainer's stdio); None: not an app container
        of an actor the worker API knows (the command then writes where it did)."""
        key = (sandbox, container_id)
        if not fresh:
            return self._open.get(key)
        if (old := self._open.pop(key, None)) is not None:
            old.close()
        identity = self.identify(sandbox)
        if identity is None:
            return None
        pipe = ContainerPipe(labels_of(identity, container_id), self._emit)
        self._open[key] = pipe
        return pipe

    def release(self, sandbox: str, container_id: str) -> None:
        """Close our end of the container's pipe, once its last command ran."""
        if (pipe := self._open.pop((sandbox, container_id), None)) is not None:
            pipe.close()

    def _emit(self, data: bytes) -> None:
        with self._write_lock:
            view = memoryview(data)
            while view:
                try:
                    written = os.write(self._fd, view)
                except OSError as e:
                    log.warning("actor output dropped", error=str(e))
                    return
                view = view[written:]
