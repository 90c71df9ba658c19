"""The sockets' directory and connection count (``service._socketfile``; issue 30 items 4, 7)."""

from __future__ import annotations

import functools
import socket
import stat
from pathlib import Path

import anyio
import pytest
import structlog.testing

from substrate_gpu import exceptions
from substrate_gpu.service import _socketfile, worker_grpc


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_missing_directory_is_made_private(tmp_path):
    """Made 0700 (parents too), whatever the umask."""
    sock = tmp_path / "a" / "b" / "agent.sock"
    _socketfile.make_private_dir(sock, "agent socket", "choose another --socket")
    assert _mode(sock.parent) == 0o700


@pytest.mark.parametrize(
    ("mode", "fixed"),
    [
        pytest.param(0o777, 0o755, id="world-writable"),
        pytest.param(0o770, 0o750, id="group-writable"),
        pytest.param(0o702, 0o700, id="others-write-only"),
    ],
)
def test_a_directory_writable_by_others_loses_that_write_bit(tmp_path, mode, fixed):
    """Group and others may no longer write (they could put another socket in its place);
    what they may read and search is kept; a warning names the directory and both modes."""
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(mode)
    with structlog.testing.capture_logs() as logs:
        _socketfile.make_private_dir(directory / "worker.sock", "worker socket", "hint")
    assert _mode(directory) == fixed
    (warning,) = [e for e in logs if e["log_level"] == "warning"]
    assert (warning["directory"], warning["mode"], warning["now"]) == (
        str(directory),
        f"{mode:04o}",
        f"{fixed:04o}",
    )


def test_a_sticky_directory_is_kept_with_a_warning(tmp_path):
    """/tmp-like (1777): only a file's owner may rename or remove it there: kept, warned."""
    directory = tmp_path / "tmp"
    directory.mkdir()
    directory.chmod(0o1777)
    with structlog.testing.capture_logs() as logs:
        _socketfile.make_private_dir(directory / "agent.sock", "agent socket", "hint")
    assert _mode(directory) == 0o1777
    assert [e["mode"] for e in logs if e["log_level"] == "warning"] == ["1777"]


def test_a_directory_that_cannot_be_fixed_is_refused(tmp_path, monkeypatch):
    """chmod refused (not the owner, a read-only mount): a ConfigError naming the directory,
    its mode and what to do, before anything is bound."""
    directory = tmp_path / "theirs"
    directory.mkdir()
    directory.chmod(0o777)

    def refuse(self: Path, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(Path, "chmod", refuse)
    with pytest.raises(exceptions.ConfigError) as caught:
        _socketfile.make_private_dir(directory / "worker.sock", "worker socket", "choose another")
    message = str(caught.value)
    assert f"{directory}: it is writable by others (mode 0777)" in message
    assert "chmod go-w" in message


def test_connections_counts_what_the_server_holds_and_what_waits(tmp_path):
    """Accepted connections are held, those in the backlog wait; the listener is neither."""
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(8)
        clients = [socket.socket(socket.AF_UNIX) for _ in range(3)]
        for client in clients:
            client.connect(str(path))
        accepted = [listener.accept()[0] for _ in range(2)]
        assert _socketfile.connections(path) == _socketfile.Connections(held=2, waiting=1)
        accepted[0].close()
        assert _socketfile.connections(path) == _socketfile.Connections(held=1, waiting=1)
        assert _socketfile.connections(tmp_path / "other.sock") == _socketfile.Connections(0, 0)
        for s in [*clients, *accepted]:
            s.close()


@pytest.mark.anyio
async def test_the_worker_socket_watch_warns_once_when_full_and_once_with_room_again(tmp_path):
    """``worker_grpc.watch_connections``: one warning when the count reaches the bound, one
    line when it drops below, nothing in between."""
    path = tmp_path / "w.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(8)
        clients = [socket.socket(socket.AF_UNIX) for _ in range(2)]
        with structlog.testing.capture_logs() as logs:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(
                    functools.partial(worker_grpc.watch_connections, path, 2, interval=0.02)
                )
                for client in clients:
                    client.connect(str(path))
                accepted = [listener.accept()[0] for _ in clients]
                await anyio.sleep(0.2)
                accepted.pop().close()
                await anyio.sleep(0.2)
                tasks.cancel_scope.cancel()
        for s in [*clients, *accepted]:
            s.close()
    said = [(e["log_level"], e["event"]) for e in logs]
    assert said == [
        ("warning", "worker socket full: further connections are closed as they are accepted"),
        ("info", "worker socket has room again"),
    ]


@pytest.mark.anyio
async def test_the_worker_socket_watch_says_when_connections_wait_unaccepted(tmp_path):
    """A listener that stops accepting (gRPC core's acceptor closed after ENFILE): once a
    connection has waited ``stalled_after`` seconds, an error; once it is taken, a line."""
    path = tmp_path / "w.sock"
    with socket.socket(socket.AF_UNIX) as listener, socket.socket(socket.AF_UNIX) as client:
        listener.bind(str(path))
        listener.listen(8)
        with structlog.testing.capture_logs() as logs:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(
                    functools.partial(
                        worker_grpc.watch_connections, path, 5, interval=0.02, stalled_after=0.1
                    )
                )
                client.connect(str(path))
                await anyio.sleep(0.4)
                accepted, _ = listener.accept()
                await anyio.sleep(0.2)
                tasks.cancel_scope.cancel()
        accepted.close()
    said = [(e["log_level"], e["event"].partition(":")[0]) for e in logs]
    assert said == [
        ("error", "worker socket not accepting"),
        ("info", "worker socket accepting again"),
    ]
    assert logs[0]["waiting"] == 1
