"""SIGTERM stops a running demo exactly as Ctrl-C does: nothing of it is left but its log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from substrate_gpu import eventlog
from substrate_gpu.testing import demo

pytestmark = pytest.mark.runc


def _left_behind(root: Path) -> list[str]:
    """Mounts under ``root``, and processes whose command line names it (sandboxes, gofers,
    the actors' workloads)."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    found = [f"mount {m}" for m in mounts if m.startswith(str(root))]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(root) in cmdline and pid != str(os.getpid()):
            found.append(f"process {pid}: {cmdline[:120]}")
    return found


def _signal_mid_run(tmpdir: Path, sig: signal.Signals) -> subprocess.CompletedProcess[str]:
    """Run the demo with ``TMPDIR=tmpdir``; send ``sig`` once its CPU actor runs."""
    demo_run = subprocess.Popen(
        [sys.executable, "-m", "substrate_gpu", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmpdir)},
    )
    try:
        assert demo_run.stdout is not None
        seen = []
        for line in demo_run.stdout:
            seen.append(line)
            if "cpu-sandbox" in line and "-> running" in line:
                break
        else:
            pytest.fail(f"the demo ended before its CPU actor ran: {''.join(seen)}")
        workdirs = [p for p in tmpdir.iterdir() if p.is_dir()]
        assert len(workdirs) == 1, workdirs
        if demo.find_built_runsc() is not None:
            assert (workdirs[0] / "gvisor-root" / "null-netns").exists()  # what must go
        demo_run.send_signal(sig)
        out, err = demo_run.communicate(timeout=60)
    finally:
        if demo_run.poll() is None:
            demo_run.kill()
            demo_run.wait()
    return subprocess.CompletedProcess(demo_run.args, demo_run.returncode, "".join(seen) + out, err)


@pytest.mark.parametrize(
    ("sig", "code"),
    [
        pytest.param(signal.SIGINT, 130, id="ctrl-c"),
        pytest.param(signal.SIGTERM, 128 + signal.SIGTERM, id="sigterm"),
    ],
)
def test_a_signal_mid_run_cleans_up_and_keeps_the_log(
    tmp_path: Path, runc_path: str, sig: signal.Signals, code: int
) -> None:
    """Signalled once its sandboxes run (the CPU actor in real gVisor when built here): the
    sandboxes and the gVisor netns mount are gone, the temporary directory removed, and the
    kept event log holds the run so far (replayable), named on stdout.

    The whole demo takes about a second; on a loaded machine this test may read the line it
    waits for only after the demo has finished (it then exits 0: nothing was interrupted),
    so a run that ends before the signal lands is tried again, at most three times."""
    for attempt in range(3):
        tmpdir = tmp_path / f"attempt-{attempt}"
        tmpdir.mkdir()
        done = _signal_mid_run(tmpdir, sig)
        if done.returncode != 0 or "final states:" not in done.stdout:
            break
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert _left_behind(tmpdir) == []
    (kept,) = tmpdir.iterdir()  # the workdir is gone; its log is kept beside it
    assert kept.name.endswith(".events.jsonl")
    assert f"stopped early; event log (kept): {kept}" in done.stdout
    replayed = eventlog.replay(kept)
    assert "cpu-sandbox" in replayed.actors
