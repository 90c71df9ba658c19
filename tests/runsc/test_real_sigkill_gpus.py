"""On real gVisor: a SIGKILL of the agent at any sandbox step never puts one GPU in two live
sandboxes, and the killed agent's runsc command never lands (issue 30 §1).

Real runsc cannot stall itself: it runs behind ``install_stalling_runsc``, which stalls the
step's command once (a few seconds, then it would exec runsc: land late) where the agent is
SIGKILLed. The agent (``gpu_agent.py``) is the production lifecycle with a GPU allocator, on
real runsc sandboxes (``_pause``, ``app``, ``side``; no ``--nvproxy``: no NVIDIA driver
here). The restarted agent recovers; a second actor asks for the same GPU by name and may
run only once no container of the first sandbox is left, and none comes back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import real_runsc as runsc_
from support import runc_bundle

from substrate_gpu.eventlog import read_log
from substrate_gpu.testing import node as node_

AGENT = Path(__file__).with_name("gpu_agent.py")
APPS = ("app", "side")
GPU0 = "nvidia.com/gpu=0"
STALL_SECONDS = 3.0


def _event(kind: str, actor_id: str, **fields: object) -> dict[str, object]:
    return {"type": kind, "v": 1, "actor_id": actor_id, **fields}


def _register(actor_id: str, bundle: Path, **fields: object) -> list[object]:
    return [
        _event(
            "actor_registered", actor_id, v=3, gpu=True, gpu_names=[GPU0], bundle=str(bundle), **fields
        ),
        _event("bundle_prepared", actor_id, bundle=str(bundle)),
    ]  # fmt: skip


class Agent:
    """One life of ``gpu_agent.py`` on ``tmp`` (its stdout read line by line)."""

    def __init__(self, tmp: Path, runsc: Path, knob: Path, steps: list[object]) -> None:
        self.stderr = (tmp / f"agent-{time.monotonic_ns()}.stderr").open("w")
        self.process = subprocess.Popen(
            [sys.executable, str(AGENT), str(tmp), str(runsc), json.dumps(steps)],
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env={
                **os.environ,
                "RUNSC_STANDIN_STALL": str(knob),
                "RUNSC_STANDIN_STALL_SECONDS": str(STALL_SECONDS),
            },
        )

    def read_until(self, wanted: str, timeout: float = 180) -> list[str]:
        lines: list[str] = []
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            assert line, f"the agent exited ({self.process.poll()}) before {wanted!r}: {lines}"
            lines.append(line.strip())
            if line.strip() == wanted:
                return lines
        raise AssertionError(f"no {wanted!r} within {timeout}s: {lines}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.stderr.close()


@pytest.fixture
def tmp(real_runsc: Path, tmp_path: Path) -> Iterator[Path]:
    """The agents' directory; every container under its runsc root is deleted at teardown."""
    yield tmp_path
    root = tmp_path / "runsc-root"
    for actor_root in root.iterdir() if root.exists() else ():
        if actor_root.is_dir():
            runsc_.delete_all(real_runsc, actor_root)
    runsc_.delete_all(real_runsc, root)


def _wait_for_stall(knob: Path, agent: Agent, timeout: float = 120) -> None:
    stalled = Path(f"{knob}.stalled")
    deadline = time.monotonic() + timeout
    while not (stalled.exists() and stalled.read_text().strip()):
        assert agent.process.poll() is None, "the agent exited before the step stalled"
        assert time.monotonic() < deadline, "the step never stalled"
        time.sleep(0.02)


RUN = [_event("run_requested", "s1"), ["wait", "s1", "running"]]
STEPS = [
    pytest.param(("create", "side"), [_event("run_requested", "s1")], "failed", id="mid-create"),
    pytest.param(("start", "side"), [_event("run_requested", "s1")], "failed", id="mid-start"),
    pytest.param(
        ("restore", "side"),
        [
            *RUN,
            _event("suspend_requested", "s1", v=2),
            ["wait", "s1", "suspended"],
            _event("restore_requested", "s1"),
        ],
        "suspended",
        id="mid-restore",
    ),
    pytest.param(
        ("checkpoint", "_pause"),
        [*RUN, _event("suspend_requested", "s1", v=2)],
        "running",
        id="mid-checkpoint",
    ),
    pytest.param(
        ("delete", "app"), [*RUN, _event("delete_requested", "s1")], "deleted", id="mid-delete"
    ),
]


@pytest.mark.parametrize(("stalled", "steps", "rests"), STEPS)
def test_a_gpu_stays_in_one_live_sandbox_whatever_step_the_agent_dies_in(
    real_runsc: Path, tmp: Path, stalled: tuple[str, str], steps: list[object], rests: str
) -> None:
    """SIGKILL with the step's runsc command stalled; the restarted agent leaves the sandbox
    whole or gone, grants its GPU to a second actor only once none of its containers is
    left (the second waits while an interrupted checkpoint left it running), and the killed
    agent's command never lands."""
    bundle = tmp / "s1"
    for name in ("_pause", *APPS):
        runc_bundle.make_busybox_bundle(bundle / name, ["/bin/sleep", "100000"])
    second = runc_bundle.make_busybox_bundle(tmp / "s2", ["/bin/sleep", "100000"])
    runsc = node_.install_stalling_runsc(real_runsc, tmp / "bin")
    knob = tmp / "stall"
    knob.write_text(" ".join(stalled) + "\n")
    first = Agent(tmp, runsc, knob, [*_register("s1", bundle, containers=list(APPS)), *steps])
    try:
        _wait_for_stall(knob, first)
    finally:
        first.kill()
    killed_at = time.monotonic()

    then: list[object] = [["wait", "s1", rests], *_register("s2", second)]
    then.append(_event("run_requested", "s2"))
    if rests == "running":
        then += [["wait", "s2", "awaiting_gpus"], _event("delete_requested", "s1")]
    then.append(["wait", "s2", "running"])
    restarted = Agent(tmp, runsc, knob, then)
    try:
        lines = restarted.read_until("done")
        actor_root = tmp / "runsc-root" / "s1"
        assert runsc_.list_ids(real_runsc, actor_root) == []
        # Past the moment the stalled command would have landed, had it outlived the agent.
        time.sleep(max(0.0, STALL_SECONDS + 1.5 - (time.monotonic() - killed_at)))
        assert runsc_.list_ids(real_runsc, actor_root) == []
        assert runsc_.list_ids(real_runsc, tmp / "runsc-root") == ["s2"]
    finally:
        restarted.kill()
    assert json.loads(lines[0]) == {"reaped": []}  # the stalled command died with the agent
    logged = [(e.actor_id, e.type) for e in read_log(tmp / "events.jsonl").events]
    granted = logged.index(("s2", "gpus_allocated"))
    if rests == "running":
        assert ("s2", "gpus_unavailable") in logged
        assert logged.index(("s1", "deleted")) < granted
