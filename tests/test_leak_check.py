"""The end-of-run check (``support/leaks.py``) fails a run whose tests leave a process, a
container or a mount behind, names each, and cleans it up; a clean run passes.

Each case runs a small suite of its own in a child pytest with the plugin (``-p
support.leaks``) and a rootdir of its own, planting the leak there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from support import leaks

TESTS = Path(__file__).resolve().parent

#: A runc container started detached with its test's bundle, left running.
_RUNC_CONTAINER = """
def test_a_container(tmp_path):
    from support import runc_bundle
    bundle = runc_bundle.make_busybox_bundle(tmp_path / "bundle", ["sleep", "{tag}3"])
    subprocess.run(
        ["{runc}", "--root", str(tmp_path / "runc-root"), "run", "--detach",
         "--bundle", str(bundle), "planted"],
        check=True, env={{"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
"""


def _suite(
    tmp_path: Path, body: str, settle: float = 1, workers: int = 0
) -> subprocess.CompletedProcess[str]:
    """``body`` as a test module run by a child pytest with the leak check (``settle``: the
    seconds a leftover has to go by itself; ``workers``: xdist's, none by default)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_planted.py").write_text(
        "import os, subprocess, sys\n" + textwrap.dedent(body)
    )
    env = {**os.environ, "PYTHONPATH": str(TESTS), "SUBSTRATE_GPU_LEAK_SETTLE": str(settle)}
    env.pop(leaks.MARKER, None)
    # On CI (``CI``/``BUILD_NUMBER`` set) pytest's short summary repeats each message in full:
    # the child prints as it does on a developer's machine, each leak once.
    env.pop("CI", None)
    env.pop("BUILD_NUMBER", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "support.leaks",
            "-p",
            "no:cacheprovider",
            *(("-n", str(workers)) if workers else ("-p", "no:xdist")),
            "-q",
            "--basetemp",
            str(tmp_path / "basetemp"),
            str(tmp_path / "test_planted.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _running(tag: str) -> list[int]:
    """The processes whose command line holds ``tag`` (the child pytest aside)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if tag in cmdline and "pytest" not in cmdline:
                found.append(int(entry.name))
    return found


def _kill(tag: str) -> None:
    """SIGKILL what a failed case left of its planted processes (by pid)."""
    for pid in _running(tag):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _mounted_under(directory: Path) -> list[str]:
    return [point for _, _, point, _ in leaks._mounts() if point.startswith(f"{directory}/")]


def test_a_clean_run_passes(tmp_path):
    """Processes waited for (and one that exits by itself before the end) are no leak."""
    result = _suite(
        tmp_path,
        """
        def test_waits():
            subprocess.run(["sleep", "0.1"], check=True)

        def test_exits_by_itself():
            subprocess.Popen(["sleep", "1"])
        """,
        settle=5,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_process_and_a_mount_left_behind_fail_the_run(tmp_path, require_root):
    """A child not waited for, a daemon reparented away (found by the run's environment
    marker) and a tmpfs mount: the run fails naming each; afterwards none is left."""
    tag = f"7{uuid.uuid4().int % 10**6:06d}"
    result = _suite(
        tmp_path,
        f"""
        def test_a_child():
            subprocess.Popen(["sleep", "{tag}1"])

        def test_a_daemon():
            subprocess.run(["sh", "-c", "sleep {tag}2 >/dev/null 2>&1 &"], check=True)

        def test_a_mount(tmp_path):
            (tmp_path / "m").mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "planted", str(tmp_path / "m")], check=True)
        """,
    )
    output = result.stdout + result.stderr
    try:
        assert result.returncode == 1, output
        assert "1 error" in output, output
        assert "left 3 thing(s) behind" in output, output
        assert f"sleep {tag}1': a descendant of this pytest process" in output
        assert f"sleep {tag}2': its environ names '{leaks.MARKER}=" in output
        assert "mount: tmpfs mount on test_a_mount0/m" in output
        assert _running(tag) == []
        assert _mounted_under(tmp_path) == []
    finally:
        for point in _mounted_under(tmp_path):
            subprocess.run(["umount", "-l", point], check=False)
        _kill(tag)


@pytest.mark.runc
def test_a_runc_container_left_running_fails_the_run(tmp_path, runc_path):
    """A container (its init reparented away, its environment not ours) is found by its
    state and by its root, the bundle's rootfs under the run's directory; then killed."""
    tag = f"8{uuid.uuid4().int % 10**6:06d}"
    result = _suite(tmp_path, _RUNC_CONTAINER.format(tag=tag, runc=runc_path))
    output = result.stdout + result.stderr
    try:
        assert result.returncode == 1, output
        assert "container: runc container 'planted' (test_a_container0/runc-root/planted/" in (
            output
        )
        assert f"sleep {tag}3': its root is test_a_container0/bundle/rootfs" in output
        assert _running(tag) == []
    finally:
        subprocess.run(
            [
                runc_path,
                "--root",
                str(tmp_path / "basetemp" / "test_a_container0" / "runc-root"),
                "delete",
                "--force",
                "planted",
            ],
            capture_output=True,
            check=False,
        )


@pytest.mark.runc
def test_a_runsc_sandbox_left_running_fails_the_run(tmp_path, real_runsc):
    """A real gVisor sandbox: its sandbox and gofer processes (their ``--root=``) and its
    ``--network=none`` netns mount."""
    result = _suite(
        tmp_path,
        f"""
        def test_a_sandbox(tmp_path):
            from support import real_runsc
            from substrate_gpu.testing import bundles
            bundles.make_bundle(tmp_path / "b", ["sleep", "100000"])
            runsc = ["{real_runsc}", "--root", str(tmp_path / "root"), *real_runsc.GLOBAL_FLAGS]
            # No pipes: the sandbox inherits runsc's stdio and would hold them open.
            quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
            subprocess.run([*runsc, "create", "--bundle", str(tmp_path / "b"), "c"], **quiet)
            subprocess.run([*runsc, "start", "c"], **quiet)
        """,
    )
    output = result.stdout + result.stderr
    root = tmp_path / "basetemp" / "test_a_sandbox0" / "root"
    try:
        assert result.returncode == 1, output
        assert "container: runsc container 'c' (test_a_sandbox0/root/c_sandbox:c.state" in output
        processes = [line for line in output.splitlines() if line.startswith("  process: ")]
        assert {line.split("'")[1].split()[0] for line in processes} == {
            "runsc-sandbox",
            "runsc-gofer",
        }, output
        assert "nsfs mount on test_a_sandbox0/root/null-netns" in output
        assert _running(str(root)) == []
        assert _mounted_under(tmp_path) == []
    finally:
        from support import real_runsc as real_runsc_

        real_runsc_.delete_all(real_runsc, root)


def test_another_workers_directory_is_not_this_ones(tmp_path):
    """xdist's ``popen-gw10`` starts with ``popen-gw1``: a process marked with the one is
    not the other's (by path, not by string)."""
    mine, other = tmp_path / "popen-gw1", tmp_path / "popen-gw10"
    child = subprocess.Popen(["sleep", "60"], env={**os.environ, leaks.MARKER: str(other)})
    try:
        no_parent = -1  # judged by the marker alone, not as this process's descendant
        assert [leak for leak in leaks.find(mine, me=no_parent) if child.pid in leak.pids] == []
        [found] = [leak for leak in leaks.find(other, me=no_parent) if child.pid in leak.pids]
        assert f"its environ names '{leaks.MARKER}={other}'" in found.description
    finally:
        child.kill()
        child.wait()


def test_each_xdist_worker_checks_its_own(tmp_path):
    """Under ``-n 2`` each worker finds what its own tests left (two tests, one per worker,
    each leaving a child): both reported, each once, by the worker that ran it."""
    tag = f"9{uuid.uuid4().int % 10**6:06d}"
    result = _suite(
        tmp_path,
        f"""
        import time

        def test_one():
            subprocess.Popen(["sleep", "{tag}1"])
            time.sleep(2)  # so the other worker takes the other test

        def test_two():
            subprocess.Popen(["sleep", "{tag}2"])
            time.sleep(2)
        """,
        workers=2,
    )
    output = result.stdout + result.stderr
    try:
        assert result.returncode == 1, output
        for n in (1, 2):
            assert output.count(f"'sleep {tag}{n}': a descendant of this pytest process") == 1
        assert "popen-gw0 (killed" in output and "popen-gw1 (killed" in output, output
        assert _running(tag) == []
    finally:
        _kill(tag)
