"""``substrate-gpu demo``: the README's main command, end to end on real runc."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time

import pytest
from support.umask import umask

from substrate_gpu.eventlog import replay
from substrate_gpu.testing import demo

pytestmark = pytest.mark.runc


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory, runc_path: str):
    """One demo run (real runc), its output and how long it took."""
    out = io.StringIO()
    started = time.monotonic()
    with umask(0o022):  # the usual one: runsc alone would write its images world-readable
        result = demo.main(tmp_path_factory.mktemp("demo"), out)
    return result, out.getvalue(), time.monotonic() - started


def test_it_runs_on_real_runc_and_says_so(ran):
    """As root with runc, the GPU actors run on the runsc stand-in over real runc, and it is
    printed."""
    result, output, _ = ran
    assert result.runtime in {"runc", "gvisor"}
    assert "runsc driver -> runsc stand-in -> real runc" in output


def test_with_real_runsc_the_cpu_actor_runs_in_gvisor_and_says_so(ran, real_runsc):
    """With the runsc build-runsc.sh made, cpu-sandbox lives in real gVisor, including a real
    checkpoint image (pages on disk) and restore, and the output says so; GPU actors are
    labelled as on the stand-in."""
    result, output, _ = ran
    assert result.runtime == "gvisor"
    assert "CPU actor: REAL gVisor" in output
    assert "GPU actors: runsc driver -> runsc stand-in" in output
    assert "cpu-sandbox: real gVisor checkpoint in" in output
    assert "pages.img" in output
    cpu = [(t.source, t.dest) for t in result.transitions if t.actor_id == "cpu-sandbox"]
    assert ("checkpointing", "suspended") in cpu
    assert ("restoring", "running") in cpu


def test_suspend_is_refused_while_the_context_is_live(ran):
    """gpu-trainer's first suspend is refused by the probe; the actor keeps running."""
    result, output, _ = ran
    (refusal,) = result.refusals
    assert refusal.actor_id == "gpu-trainer"
    assert "live_context_probed" in (refusal.reason or "") or "live" in (refusal.reason or "")
    assert "checkpoint_refused" in output


def test_suspend_is_accepted_after_the_context_closes(ran):
    """After the workload closes /dev/nvidia0, the same actor is checkpointed and suspended."""
    result, _, _ = ran
    trainer = [t for t in result.transitions if t.actor_id == "gpu-trainer"]
    refused_at = next(i for i, t in enumerate(trainer) if t.trigger == "checkpoint_refused")
    after = [(t.source, t.dest) for t in trainer[refused_at:]]
    assert ("checkpointing", "suspended") in after
    # A GPU actor is verified (nvidia-smi -L in its sandbox) before it runs again.
    assert ("restoring", "verifying") in after and ("verifying", "running") in after


def test_every_actor_lives_its_whole_life(ran):
    """GPU actors are injected, the CPU actor is not; all end deleted."""
    result, _, _ = ran
    assert dict(result.final_states) == {
        "gpu-trainer": "deleted",
        "gpu-notebook": "deleted",
        "cpu-sandbox": "deleted",
    }
    injected = {t.actor_id for t in result.transitions if t.trigger == "gpu_injected"}
    assert injected == {"gpu-trainer", "gpu-notebook"}


def test_its_checkpoints_are_private(ran):
    """Every checkpoint directory the demo made is 0700 and every image file 0600 (real
    gVisor's for the CPU actor when runsc is built, the stand-in's for the GPU actors)."""
    result, _, _ = ran
    root = result.workdir / "checkpoints"
    directories = [root, *(p for p in root.rglob("*") if p.is_dir())]
    files = [p for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "checkpoint.img" for p in files)
    assert {p.stat().st_mode & 0o777 for p in directories} == {0o700}
    assert {p.stat().st_mode & 0o777 for p in files} == {0o600}


def test_replaying_the_log_gives_the_same_final_states(ran):
    """The event log left behind replays to exactly the live final states."""
    result, output, _ = ran
    assert result.event_log.is_file()
    states = {a: v.state for a, v in replay(result.event_log).actors.items()}
    assert states == dict(result.final_states) == dict(result.replayed_states)
    assert f" replay {result.event_log}" in output  # the command: see test_demo_output
    assert "same final states" in output


def test_it_finishes_well_under_a_minute(ran):
    """The whole demo stays fast enough to be the README's first command."""
    _, _, seconds = ran
    assert seconds < 40


def test_the_cli_runs_it_and_keeps_the_workdir(tmp_path, runc_path):
    """``substrate-gpu demo --workdir DIR`` exits 0 and leaves the log and node in DIR."""
    completed = subprocess.run(
        [sys.executable, "-m", "substrate_gpu", "demo", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert (tmp_path / "events.jsonl").is_file()
    assert (tmp_path / "node" / "dev" / "nvidia0").exists()
    assert "same final states" in completed.stdout


def test_a_second_run_in_the_same_workdir_is_refused_in_one_line(tmp_path, runc_path):
    """``demo --workdir DIR`` again on a used DIR: exit 1 with one line naming DIR (its log
    already holds the demo's actors), no traceback, the first run's files untouched."""
    argv = [sys.executable, "-m", "substrate_gpu", "demo", "--workdir", str(tmp_path)]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert first.returncode == 0, first.stderr
    log = (tmp_path / "events.jsonl").read_bytes()
    again = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "Traceback" not in again.stderr
    (line,) = again.stderr.strip().splitlines()
    assert str(tmp_path) in line and "not empty" in line and "--workdir" in line
    assert (tmp_path / "events.jsonl").read_bytes() == log


@pytest.mark.parametrize(
    ("make", "words"),
    [
        pytest.param(lambda p: p, "it exists and is not a directory", id="a-file"),
        pytest.param(lambda p: p / "sub", "not a directory", id="below-a-file"),
    ],
)
def test_a_workdir_that_cannot_be_a_directory_is_refused_in_one_line(tmp_path, make, words):
    """``demo --workdir FILE`` (or a path below a file): exit 1 with one line naming the path
    and what is wrong, no traceback, the file untouched."""
    existing = tmp_path / "notes.txt"
    existing.write_text("mine\n")
    workdir = make(existing)
    done = subprocess.run(
        [sys.executable, "-m", "substrate_gpu", "demo", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert str(workdir) in line and words in line and "--workdir" in line
    assert existing.read_text() == "mine\n"


def test_it_names_one_runsc_version(ran):
    """The header's runsc is the only one named: no refusal reason brings in the stand-in's."""
    _, output, _ = ran
    assert len(set(re.findall(r"runsc version (\S+)", output))) <= 1, output
