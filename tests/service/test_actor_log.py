"""Each app container's output as upstream's JSON lines (:mod:`substrate_gpu.service.actor_log`):
the record a line becomes, and the pipe that forwards it while keeping runsc's own messages
for the error classification."""

from __future__ import annotations

import json
import os
import resource
import threading

import anyio
import pytest
from support import real

from substrate_gpu import _process, exceptions
from substrate_gpu.service import actor_log

IDENTITY = {
    "atespace": "team-a",
    "actor_name": "counter",
    "actor_uid": "u-1",
    "actor_template_atespace": "team-a",
    "actor_template_name": "tmpl",
}
LABELS = actor_log.labels_of(IDENTITY, "app")
NOW = "2026-12-02T00:00:00.000000000Z"


def test_the_labels_are_upstreams_identity_keys():
    assert LABELS == {
        "ate.atespace": "team-a",
        "ate.actor.name": "counter",
        "ate.actor.uid": "u-1",
        "ate.template.atespace": "team-a",
        "ate.template.name": "tmpl",
        "ate.actor.container.name": "app",
    }
    assert "ate.actor.container.name" not in actor_log.labels_of(IDENTITY, "")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            b"hello world",
            {"time": NOW, "message": "hello world", "labels": LABELS},
            id="plain text: the message",
        ),
        pytest.param(
            b"[1, 2]",
            {"time": NOW, "message": "[1, 2]", "labels": LABELS},
            id="JSON that is no object: the message",
        ),
        pytest.param(
            b'{"a": 1} trailing',
            {"time": NOW, "message": '{"a": 1} trailing', "labels": LABELS},
            id="trailing garbage: the message",
        ),
        pytest.param(
            b'{"msg": "x", "time": "t0", "level": "info"}',
            {"msg": "x", "time": "t0", "level": "info", "labels": LABELS},
            id="an object keeps its fields and time",
        ),
        pytest.param(
            b'{"msg": "x", "ate.actor.uid": "forged", "ate.other": 1}',
            {"msg": "x", "time": NOW, "labels": LABELS},
            id="ate.* fields are substrate's: dropped",
        ),
        pytest.param(
            b'{"labels": {"team": 7, "ate.actor.name": "forged", "n": null}}',
            {"time": NOW, "labels": {"team": "7", "n": "", **LABELS}},
            id="the workload's labels kept, stringified, ours on top",
        ),
        pytest.param(
            b'{"logging.googleapis.com/labels": {"x": "1"}, "labels": {"x": "2"}}',
            {"time": NOW, "labels": {"x": "2", **LABELS}},
            id="the other spelling folded in, ours first",
        ),
    ],
)
def test_a_line_becomes_upstreams_record(line, expected):
    assert actor_log.envelope(line, LABELS, NOW) == expected


class Collected:
    def __init__(self) -> None:
        self.lines: list[dict[str, object]] = []
        self.done = threading.Event()

    def __call__(self, data: bytes) -> None:
        assert data.endswith(b"\n")
        self.lines.append(json.loads(data))


def _wait(predicate, timeout: float = 10) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_command_writes_to_the_pipe_and_its_messages_come_back_as_stderr():
    """What the command wrote is its result's stderr, and each line is forwarded too; the
    pipe outlives the command (a background child keeps writing to it: the container)."""
    collected = Collected()
    pipe = actor_log.ContainerPipe(LABELS, collected)
    script = "echo created; echo oops >&2; (sleep 0.3; echo later) & exit 3"
    result = anyio.run(
        lambda: _process.run_command(
            ["sh", "-c", script], timeout=10, what="testing", check=False, output=pipe
        )
    )
    pipe.close()
    assert (result.returncode, result.stderr, result.stdout) == (3, "created\noops\n", "")
    _wait(lambda: len(collected.lines) == 3)
    assert [line["message"] for line in collected.lines] == ["created", "oops", "later"]
    assert all(line["labels"] == LABELS for line in collected.lines)


def test_a_failing_command_keeps_its_message_for_the_classification():
    pipe = actor_log.ContainerPipe(LABELS, Collected())
    with pytest.raises(exceptions.ExternalCommandError, match="cannot start container"):
        anyio.run(
            lambda: _process.run_command(
                ["sh", "-c", "echo 'cannot start container \"app\" in state running' >&2; exit 1"],
                timeout=10,
                what="starting",
                output=pipe,
            )
        )


def test_a_last_line_without_newline_is_forwarded_at_the_end():
    collected = Collected()
    pipe = actor_log.ContainerPipe(LABELS, collected)
    os.write(pipe.fileno(), b"one\ntwo")
    pipe.close()  # nothing else holds the write end: the pipe ends
    _wait(lambda: len(collected.lines) == 2)
    assert [line["message"] for line in collected.lines] == ["one", "two"]


def test_actor_logs_pipe_only_the_actors_the_worker_api_knows():
    """create opens a pipe, start reuses it, release closes it; another actor gets none."""
    logs = actor_log.ActorLogs(fd=os.open(os.devnull, os.O_WRONLY))
    assert logs.open("u-1.1", "app", fresh=True) is None
    logs.identify = lambda sandbox: IDENTITY if sandbox == "u-1.1" else None
    pipe = logs.open("u-1.1", "app", fresh=True)
    assert pipe is not None
    assert logs.open("u-1.1", "app", fresh=False) is pipe
    logs.release("u-1.1", "app")
    assert logs.open("u-1.1", "app", fresh=False) is None
    assert logs.open("other.1", "app", fresh=True) is None


def test_every_pipe_is_forwarded_by_one_thread():
    """A thread per pipe cost a worker of 1,000 actors 1,000 threads waking every second:
    all pipes share one forwarding thread, which wakes only for data."""
    threads = threading.active_count()
    collected = Collected()
    pipes = [actor_log.ContainerPipe({**LABELS, "n": str(i)}, collected) for i in range(50)]
    assert threading.active_count() <= threads + 1
    for i, pipe in enumerate(pipes):
        os.write(pipe.fileno(), f"line {i}\n".encode())
        pipe.close()
    _wait(lambda: len(collected.lines) == 50)
    assert sorted(int(line["labels"]["n"]) for line in collected.lines) == list(range(50))


def test_a_pipe_numbered_past_selects_limit_is_forwarded():
    """Descriptors past FD_SETSIZE (1024: a worker with 1,000 actors has them) are forwarded
    too (select() refused them, and that pipe's output was never read)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        # Root (CI) may raise the hard limit too; anyone may raise the soft one up to it.
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), max(hard, 1200)))
    except (ValueError, OSError) as e:
        real.missing(f"a descriptor limit of 1,200 (hard limit {hard})", f"cannot be set: {e}")
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        collected = Collected()
        pipe = actor_log.ContainerPipe(LABELS, collected)
        assert pipe.fileno() > 1024
        os.write(pipe.fileno(), b"far\n")
        pipe.close()
        _wait(lambda: len(collected.lines) == 1)
        assert collected.lines[0]["message"] == "far"
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
