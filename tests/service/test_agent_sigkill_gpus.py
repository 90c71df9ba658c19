"""A SIGKILL of the agent at any sandbox step never puts one GPU in two live sandboxes (issue 30).

The agent runs as a real process on a simulated 4-GPU node, a GPU sandbox (``_pause``,
``app``, ``side``) on the runsc stand-in over real runc, with one runsc command of a step
stalled (``RUNSC_STANDIN_STALL``) so the agent is SIGKILLed exactly there: mid-create,
mid-start, mid-restore, mid-checkpoint, mid-delete. The stalled command would carry on
after a few seconds ("land late") if it outlived the agent. The restarted agent reconciles
the sandbox; then a second actor asks for the same GPU by name: it is granted only if no
container of the first sandbox is left, and no container of it comes back later.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from support import runc_bundle

from substrate_gpu.eventlog import read_log, replay
from substrate_gpu.lifecycle import sandbox
from substrate_gpu.testing import bundles
from substrate_gpu.testing import node as node_

from .agentproc import AgentProcess, Client, event

pytestmark = pytest.mark.runc

APPS = ("app", "side")
GPU0 = "nvidia.com/gpu=0"
GPU_NODE = re.compile(r"/dev/nvidia([0-9]+)")
#: How long a stalled command waits before it lands (if it outlived the agent).
STALL_SECONDS = 3.0


@pytest.fixture(scope="module")
def four_gpus(require_root: None, tmp_path_factory: pytest.TempPathFactory) -> node_.SimulatedNode:
    return node_.build_node(tmp_path_factory.mktemp("node") / "root", gpus=(0, 1, 2, 3))


class World:
    """Agents started on one log and node, a stall knob, and what is left under runc."""

    def __init__(self, node: node_.SimulatedNode, runc: str, tmp: Path) -> None:
        self.node, self.runc, self.tmp = node, runc, tmp
        self.runsc = node_.install_runsc_standin(tmp / "bin")
        self.knob = tmp / "stall"
        self.started: list[AgentProcess] = []

    def start(self) -> AgentProcess:
        agent = AgentProcess.on_socket(
            self.tmp,
            "--runsc",
            str(self.runsc),
            "--driver-root",
            str(self.node.driver_root),
            "--toolkit-dir",
            str(self.node.toolkit_dir),
            "--cdi-output-dir",
            str(self.tmp / "cdi"),
            "--dev-root",
            str(self.node.root),
            "--no-driver-preflight",
            env={
                "RUNSC_STANDIN_RUNC": self.runc,
                "NVIDIA_CTK_STANDIN_SYSTEM_ROOT": str(self.node.root),
                "RUNSC_STANDIN_STALL": str(self.knob),
                "RUNSC_STANDIN_STALL_SECONDS": str(STALL_SECONDS),
            },
        )
        self.started.append(agent)
        return agent

    def containers(self, actor_id: str) -> list[str]:
        """The containers runc knows under the actor's own root."""
        listed = subprocess.run(
            [self.runc, "--root", str(self.tmp / "runsc-root" / actor_id), "list", "-q"],
            capture_output=True,
            text=True,
            check=False,
        )
        return sorted(listed.stdout.split())

    def stall(self, command: str, container: str) -> Path:
        """Stall the next ``command`` of ``container``; the file that says it stalls."""
        self.knob.write_text(f"{command} {container}\n")
        return Path(f"{self.knob}.stalled")

    def clean_up(self) -> None:
        for agent in self.started:
            agent.kill()
        root = self.tmp / "runsc-root"
        for actor_root in root.iterdir() if root.exists() else ():
            runc_bundle.delete_all(actor_root, runc=self.runc)
        runc_bundle.delete_all(root, runc=self.runc)


@pytest.fixture
def world(four_gpus: node_.SimulatedNode, runc_path: str, tmp_path: Path):
    made = World(four_gpus, runc_path, tmp_path)
    yield made
    made.clean_up()


def _sandbox_bundles(directory: Path) -> Path:
    for name in ("_pause", *APPS):
        bundles.make_bundle(
            directory / name,
            ["sh", "-c", "while true; do sleep 1; done"],
            annotations=sandbox.cri_annotations(name),
        )
    return directory


def _state(client: Client, actor_id: str) -> dict[str, Any]:
    actor: dict[str, Any] = client.request({"query": "actor", "actor_id": actor_id})["actor"]
    return actor


def _wait_for(client: Client, actor_id: str, states: set[str], timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while (state := _state(client, actor_id)["state"]) not in states:
        assert time.monotonic() < deadline, f"{actor_id} stuck in {state}, wanted {states}"
        time.sleep(0.05)
    return str(state)


def _wait_for_file(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never written: the step never stalled"
        time.sleep(0.02)


def _gpus_in(config: Path) -> list[int]:
    linux = json.loads(config.read_text())["linux"]
    return sorted(int(m.group(1)) for d in linux["devices"] if (m := GPU_NODE.fullmatch(d["path"])))


def _second_actor(client: Client, tmp: Path) -> Path:
    """``s2``, one container asking for GPU 0 by name."""
    bundle = bundles.make_bundle(tmp / "bundles" / "s2", ["sh", "-c", "sleep 100000"])
    for request in (
        event("actor_registered", "s2", v=3, gpu=True, gpu_names=[GPU0], bundle=str(bundle)),
        event("bundle_prepared", "s2", bundle=str(bundle)),
        event("run_requested", "s2"),
    ):
        answer = client.request(request)
        assert answer["ok"], answer
    return bundle


# (step, the stalled command and container, where the first sandbox rests after recovery)
STEPS = [
    pytest.param("create", ("create", "side"), "failed", id="mid-create"),
    pytest.param("start", ("start", "side"), "failed", id="mid-start"),
    pytest.param("restore", ("restore", "side"), "suspended", id="mid-restore"),
    pytest.param("checkpoint", ("checkpoint", "_pause"), "running", id="mid-checkpoint"),
    pytest.param("delete", ("delete", "app"), "deleted", id="mid-delete"),
]


@pytest.mark.parametrize(("step", "stalled", "rests"), STEPS)
def test_a_gpu_stays_in_one_live_sandbox_whatever_step_the_agent_dies_in(
    world: World, tmp_path: Path, step: str, stalled: tuple[str, str], rests: str
) -> None:
    """SIGKILL with the step's runsc command stalled; after recovery the sandbox is whole or
    gone (never part-made), a second actor asking for its GPU gets it only once no container
    of the sandbox is left, and the killed agent's command never lands."""
    bundle = _sandbox_bundles(tmp_path / "s1")
    register = event(
        "actor_registered",
        "s1",
        v=3,
        gpu=True,
        gpu_names=[GPU0],
        bundle=str(bundle),
        containers=list(APPS),
    )
    first = world.start()
    with first.client() as client:
        for request in (register, event("bundle_prepared", "s1", bundle=str(bundle))):
            assert client.request(request)["ok"]
        if step not in {"create", "start"}:
            assert client.request(event("run_requested", "s1"))["ok"]
            _wait_for(client, "s1", {"running"})
        if step == "restore":
            assert client.request(event("suspend_requested", "s1", v=2))["ok"]
            _wait_for(client, "s1", {"suspended"})
        stalls = world.stall(*stalled)
        request = {
            "create": event("run_requested", "s1"),
            "start": event("run_requested", "s1"),
            "restore": event("restore_requested", "s1"),
            "checkpoint": event("suspend_requested", "s1", v=2),
            "delete": event("delete_requested", "s1"),
        }[step]
        assert client.request(request)["ok"]
        _wait_for_file(stalls)
    first.process.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = time.monotonic()
    before = replay(first.log).actors["s1"].state

    second = world.start()
    with second.client() as client:
        assert _wait_for(client, "s1", {rests}) == rests, before
        _second_actor(client, tmp_path)
        if rests == "running":
            # The sandbox survived the interrupted checkpoint with GPU 0: s2 waits for it.
            assert _wait_for(client, "s2", {"awaiting_gpus", "running"}) == "awaiting_gpus"
            assert world.containers("s1") == ["_pause", *APPS]
            assert client.request(event("delete_requested", "s1"))["ok"]
        _wait_for(client, "s2", {"running"})
        assert world.containers("s1") == []
        # Long past the moment the stalled command would have landed, had it outlived the agent.
        time.sleep(max(0.0, STALL_SECONDS + 1.5 - (time.monotonic() - killed_at)))
        assert world.containers("s1") == []
        assert _state(client, "s1")["state"] in {rests, "deleted"}
    assert second.terminate() == 0
    assert _gpus_in(tmp_path / "bundles" / "s2" / "config.json") == [0]
    logged = [(e.actor_id, e.type) for e in read_log(second.log).events]
    assert ("s2", "gpus_allocated") in logged
    assert "killed runsc commands" not in second.stderr()  # they died with the agent


def _single_actor(client: Client, tmp: Path, actor_id: str) -> Path:
    """One container asking for one GPU (the lowest free)."""
    bundle = bundles.make_bundle(tmp / "bundles" / actor_id, ["sh", "-c", "sleep 100000"])
    for request in (
        event("actor_registered", actor_id, v=3, gpu=True, gpus=1, bundle=str(bundle)),
        event("bundle_prepared", actor_id, bundle=str(bundle)),
        event("run_requested", actor_id),
    ):
        answer = client.request(request)
        assert answer["ok"], answer
    return bundle


def test_a_forged_log_does_not_hand_out_the_gpu_a_live_sandbox_really_has(
    world: World, tmp_path: Path
) -> None:
    """a runs on GPU 0 and b on GPU 1; the log is then edited so both hold GPU 0. The
    restarted agent reads b's bundle and runsc: GPU 1 stays b's (a new actor gets GPU 2),
    and the mismatch is warned about, naming b and both allocations (issue 30 §5)."""
    first = world.start()
    with first.client() as client:
        a = _single_actor(client, tmp_path, "a")
        b = _single_actor(client, tmp_path, "b")
        _wait_for(client, "a", {"running"})
        _wait_for(client, "b", {"running"})
    assert first.terminate() == 0  # the sandboxes run on
    assert (_gpus_in(a / "config.json"), _gpus_in(b / "config.json")) == ([0], [1])
    lines = first.log.read_text().splitlines(keepends=True)
    forged = [
        line.replace('"nvidia.com/gpu=1"', f'"{GPU0}"')
        if '"gpus_allocated"' in line and '"actor_id":"b"' in line
        else line
        for line in lines
    ]
    assert forged != lines
    first.log.write_text("".join(forged))
    assert replay(first.log).actors["b"].gpu_devices == GPU0

    second = world.start()
    with second.client() as client:
        c = _single_actor(client, tmp_path, "c")
        _wait_for(client, "c", {"running"})
        _wait_for(client, "b", {"running"})
    assert second.terminate() == 0
    assert _gpus_in(c / "config.json") == [2]
    (warning,) = [
        json.loads(line) for line in second.stderr().splitlines() if "injected in a live" in line
    ]
    assert (warning["actor_id"], warning["logged"], warning["injected"]) == (
        "b",
        [GPU0],
        ["nvidia.com/gpu=1"],
    )
