"""FdScanProbe finds NVIDIA device handles held by real processes and their descendants.

Real processes hold a real char device: a (1,3) node (``/dev/null``) named ``nvidia0`` made
with mknod in a temporary directory, matched by a pattern on its path; and, in a runc
container, ``/dev/nvidia0`` itself, matched by the default pattern.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from support import runc_bundle

from substrate_gpu.probes import api, fd_scan

pytestmark = pytest.mark.anyio

# Opens the node given as argv[1] on request: reads commands from stdin, answers on stdout.
HOLDER = textwrap.dedent(
    """
    import os, subprocess, sys
    node, fd, kids = sys.argv[1], None, []
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "open":
            fd = os.open(node, os.O_RDONLY)
        elif cmd == "close":
            os.close(fd)
        elif cmd == "spawn":
            kids.append(subprocess.Popen(
                [sys.executable, "-c", sys.argv[2], node, sys.argv[2]],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            kids[-1].stdin.write("open\\n"); kids[-1].stdin.flush()
            kids[-1].stdout.readline()
            print(kids[-1].pid, flush=True)
            continue
        print(fd if cmd == "open" else "ok", flush=True)
    for kid in kids:
        kid.stdin.close(); kid.wait()
    """
)


@pytest.fixture
def node(tmp_path: Path, require_root: None) -> Path:
    """A char device (1,3) named nvidia0 in a temporary directory."""
    path = tmp_path / "dev" / "nvidia0"
    path.parent.mkdir()
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    return path


@pytest.fixture
def probe(node: Path) -> fd_scan.FdScanProbe:
    """A probe whose pattern matches the temporary node's path."""
    return fd_scan.FdScanProbe(device_pattern=re.escape(str(node.parent)) + r"/nvidia[0-9]+")


class Holder:
    """A real process that opens and closes the node on request."""

    def __init__(self, node: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(node), HOLDER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid

    def ask(self, command: str) -> str:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def stop(self) -> None:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


@pytest.fixture
def holder(node: Path) -> Iterator[Holder]:
    """A running holder process, stopped at teardown."""
    h = Holder(node)
    yield h
    h.stop()


async def test_finds_a_process_holding_the_node(
    probe: fd_scan.FdScanProbe, holder: Holder, node: Path
) -> None:
    """A process with the node open is reported with its pid, fd and path."""
    fd = int(holder.ask("open"))
    assert await probe.live_clients((holder.pid,)) == (
        api.GpuClient(pid=holder.pid, fd=fd, target=str(node)),
    )


async def test_a_handle_on_a_removed_node_still_counts(
    probe: fd_scan.FdScanProbe, holder: Holder, node: Path
) -> None:
    """A node unlinked while held (the kernel shows ``<path> (deleted)``) is still a client."""
    fd = int(holder.ask("open"))
    node.unlink()
    assert os.readlink(f"/proc/{holder.pid}/fd/{fd}") == f"{node} (deleted)"
    assert await probe.live_clients((holder.pid,)) == (
        api.GpuClient(pid=holder.pid, fd=fd, target=str(node)),
    )


async def test_nothing_after_the_fd_closes(probe: fd_scan.FdScanProbe, holder: Holder) -> None:
    """Once the process closes the node, the probe reports nothing."""
    holder.ask("open")
    holder.ask("close")
    assert await probe.live_clients((holder.pid,)) == ()


async def test_nothing_for_a_process_without_the_node(
    probe: fd_scan.FdScanProbe, holder: Holder
) -> None:
    """A process that never opened the node is not a client."""
    assert await probe.live_clients((holder.pid,)) == ()


async def test_finds_a_grandchild_holding_the_node(
    probe: fd_scan.FdScanProbe, holder: Holder
) -> None:
    """A descendant two levels down is found from the top pid alone."""
    child_pid = int(holder.ask("spawn"))  # the holder's child, itself holding the node
    clients = await probe.live_clients((holder.pid,))
    assert [c.pid for c in clients] == [child_pid]


def test_descendants_include_every_level(probe: fd_scan.FdScanProbe, holder: Holder) -> None:
    """with_descendants walks children of children."""
    child_pid = int(holder.ask("spawn"))
    assert probe.with_descendants((holder.pid,)) >= {holder.pid, child_pid}


async def test_exited_process_is_tolerated(probe: fd_scan.FdScanProbe, node: Path) -> None:
    """A pid that has exited and been reaped yields nothing, not an error."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert await probe.live_clients((proc.pid,)) == ()


async def test_zombie_is_tolerated(probe: fd_scan.FdScanProbe, node: Path) -> None:
    """An exited but unreaped process (no fd table) yields nothing."""
    proc = subprocess.Popen([sys.executable, "-c", f"open({str(node)!r})"])
    with anyio.fail_after(10):
        while Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            await anyio.sleep(0.02)
    try:
        assert await probe.live_clients((proc.pid,)) == ()
    finally:
        proc.wait()


async def test_processes_exiting_mid_scan_are_tolerated(
    probe: fd_scan.FdScanProbe, node: Path
) -> None:
    """Children that open the node and exit continuously never make a scan fail."""
    churn = subprocess.Popen(
        [
            "/bin/sh",
            "-c",
            # On TERM, reap every short-lived child before leaving: no zombies behind.
            (
                "trap 'wait; exit 0' TERM; "
                f"while true; do /bin/busybox sleep 0.005 3<{node} & /bin/busybox sleep 0.001; done"
            ),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # At least 25 scans, and on until one caught a short-lived holder (a loaded machine
        # may schedule the churn rarely): no scan may fail either way.
        seen, scans, deadline = 0, 0, time.monotonic() + 30
        while scans < 25 or (seen == 0 and time.monotonic() < deadline):
            seen += len(await probe.live_clients((churn.pid,)))
            scans += 1
        assert seen > 0  # the scans did see short-lived holders
    finally:
        churn.terminate()
        churn.wait(timeout=10)


def test_unreadable_processes_are_skipped(probe: fd_scan.FdScanProbe, holder: Holder) -> None:
    """A probe without permission on another user's process (EACCES) skips it."""
    holder.ask("open")
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child
        status = 1
        try:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            os.write(write_end, str(len(probe.scan((holder.pid,)))).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as answer:
        found = answer.read()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert found == "0"


@pytest.mark.parametrize(
    ("target", "is_client"),
    [
        pytest.param("/dev/nvidiactl", True, id="nvidiactl"),
        pytest.param("/dev/nvidia-uvm", True, id="nvidia-uvm"),
        pytest.param("/dev/nvidia-uvm-tools", True, id="nvidia-uvm-tools"),
        pytest.param("/dev/nvidia0", True, id="nvidia0"),
        pytest.param("/dev/nvidia13", True, id="nvidia13"),
        # MIG capability handles and modeset are not CUDA clients on their own.
        pytest.param("/dev/nvidia-caps/nvidia-cap1", False, id="nvidia-caps"),
        pytest.param("/dev/nvidia-modeset", False, id="modeset"),
        pytest.param("/dev/nvidia0x", False, id="suffix"),
        pytest.param("/tmp/dev/nvidia0", False, id="elsewhere"),
        pytest.param("/dev/null", False, id="null"),
        pytest.param("socket:[1234]", False, id="socket"),
    ],
)
def test_default_pattern(target: str, is_client: bool) -> None:
    """The default pattern matches exactly the device nodes of CUDA/NVML clients."""
    assert (re.fullmatch(fd_scan.DEFAULT_DEVICE_PATTERN, target) is not None) is is_client


@pytest.mark.runc
async def test_finds_the_gpu_node_inside_a_runc_container(tmp_path: Path, runc_path: str) -> None:
    """A containerised process holding /dev/nvidia0 is found with the default pattern."""
    root = tmp_path / "runc-root"
    bundle = runc_bundle.make_busybox_bundle(
        tmp_path / "bundle",
        ["/bin/sh", "-c", "exec 3</dev/nvidia0; exec /bin/sleep 1000"],
        devices=[runc_bundle.DeviceNode("/dev/nvidia0")],
        runc=runc_path,
    )
    try:
        subprocess.run(
            [runc_path, "--root", str(root), "run", "--detach", "--bundle", str(bundle), "p1"],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        state = subprocess.run(
            [runc_path, "--root", str(root), "state", "p1"],
            check=True,
            capture_output=True,
            text=True,
        )
        pid = int(re.search(r'"pid": (\d+)', state.stdout).group(1))  # type: ignore[union-attr]
        probe = fd_scan.FdScanProbe()
        with anyio.fail_after(5):
            while not (clients := await probe.live_clients((pid,))):
                await anyio.sleep(0.02)
        assert [(c.fd, c.target) for c in clients] == [(3, "/dev/nvidia0")]
    finally:
        runc_bundle.delete_all(root, runc=runc_path)
