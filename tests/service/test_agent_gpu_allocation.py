"""``substrate-gpu agent`` hands out its worker's GPUs: the allocator in the running process.

The agent runs as a real process on a simulated 4-GPU node (real 195:N char nodes), with the
nvidia-ctk stand-in generating the worker's CDI spec at start and the runsc stand-in over real
runc running the actors. Which GPUs an actor got is read where it matters: the ``/dev/nvidiaN``
nodes and cgroup rules in its bundle's config.json.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from support import runc_bundle

from substrate_gpu.eventlog import read_log
from substrate_gpu.testing import bundles
from substrate_gpu.testing import node as node_

from .agentproc import AgentProcess, Client, event

pytestmark = pytest.mark.runc

GPU_NODE = re.compile(r"/dev/nvidia([0-9]+)")


@pytest.fixture(scope="module")
def four_gpus(require_root: None, tmp_path_factory: pytest.TempPathFactory) -> node_.SimulatedNode:
    return node_.build_node(tmp_path_factory.mktemp("node") / "root", gpus=(0, 1, 2, 3))


@pytest.fixture
def start_agent(four_gpus: node_.SimulatedNode, runc_path: str, tmp_path: Path):
    """Start (and at the end stop) agents on the node, all on ``tmp_path``'s log."""
    runsc = node_.install_runsc_standin(tmp_path / "bin")
    started: list[AgentProcess] = []

    def start() -> AgentProcess:
        agent = AgentProcess.on_socket(
            tmp_path,
            "--runsc",
            str(runsc),
            "--driver-root",
            str(four_gpus.driver_root),
            "--toolkit-dir",
            str(four_gpus.toolkit_dir),
            "--cdi-output-dir",
            str(tmp_path / "cdi"),
            "--dev-root",
            str(four_gpus.root),
            "--no-driver-preflight",
            env={
                "RUNSC_STANDIN_RUNC": runc_path,
                "NVIDIA_CTK_STANDIN_SYSTEM_ROOT": str(four_gpus.root),
            },
        )
        started.append(agent)
        return agent

    yield start
    try:
        for agent in started:
            agent.terminate()
    finally:
        runc_bundle.delete_all(tmp_path / "runsc-root", runc=runc_path)


def run_gpu_actor(client: Client, tmp_path: Path, actor_id: str, gpus: int) -> Path:
    """Register (v2: allocated), prepare and run an actor asking for ``gpus`` GPUs."""
    bundle = bundles.make_bundle(
        tmp_path / "bundles" / actor_id, ["sh", "-c", "while true; do sleep 1; done"]
    )
    for request in (
        event("actor_registered", actor_id, v=2, gpu=True, gpus=gpus, bundle=str(bundle)),
        event("bundle_prepared", actor_id, bundle=str(bundle)),
        event("run_requested", actor_id),
    ):
        answer = client.request(request)
        assert answer["ok"], answer
    return bundle


def wait_for_state(
    client: Client, actor_id: str, state: str, timeout: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        actor: dict[str, Any] = client.request({"query": "actor", "actor_id": actor_id})["actor"]
        if actor["state"] == state:
            return actor
        assert time.monotonic() < deadline, f"{actor_id} never reached {state}: {actor}"
        time.sleep(0.05)


def gpus_in(bundle: Path) -> list[int]:
    """The GPU indices whose nodes the bundle's config gives the container, checked against
    its cgroup rules (195:N allowed for exactly those GPUs)."""
    linux = json.loads((bundle / "config.json").read_text())["linux"]
    nodes = [int(m.group(1)) for d in linux["devices"] if (m := GPU_NODE.fullmatch(d["path"]))]
    allowed = [
        r["minor"]
        for r in linux["resources"]["devices"]
        if r.get("allow") and r.get("major") == node_.NVIDIA_MAJOR
        and r.get("minor") != node_.NVIDIACTL_MINOR
    ]  # fmt: skip
    assert sorted(allowed) == sorted(nodes)
    return sorted(nodes)


def test_an_actor_waits_for_gpus_until_a_delete_frees_them(start_agent, tmp_path):
    """3 of 4 GPUs held: an actor asking for 2 waits in awaiting_gpus, then runs on the freed ones."""
    agent = start_agent()
    with agent.client() as client:
        run_gpu_actor(client, tmp_path, "big", gpus=3)
        wait_for_state(client, "big", "running")
        late = run_gpu_actor(client, tmp_path, "late", gpus=2)
        waiting = wait_for_state(client, "late", "awaiting_gpus")
        assert waiting["reason"] == "2 GPU(s) requested, 1 of 4 free"
        assert client.request(event("delete_requested", "big"))["ok"]
        wait_for_state(client, "late", "running")
    assert gpus_in(late) == [0, 1]
    types = [(e.actor_id, e.type) for e in read_log(agent.log).events]
    # The GPUs were granted only after big's sandbox was gone.
    assert types.index(("big", "deleted")) < types.index(("late", "gpus_allocated"))


def test_actors_get_different_gpus_and_keep_them_across_a_restart(start_agent, tmp_path):
    """Two actors asking one GPU each get GPUs 0 and 1; the restarted agent rebuilds that
    from its log, so the next actor gets GPU 2 (not 0) and one more waits for GPU 3's."""
    first = start_agent()
    with first.client() as client:
        a = run_gpu_actor(client, tmp_path, "a", gpus=1)
        b = run_gpu_actor(client, tmp_path, "b", gpus=1)
        wait_for_state(client, "a", "running")
        wait_for_state(client, "b", "running")
    assert (gpus_in(a), gpus_in(b)) == ([0], [1])
    assert first.terminate() == 0

    second = start_agent()
    with second.client() as client:
        wait_for_state(client, "b", "running")
        c = run_gpu_actor(client, tmp_path, "c", gpus=1)
        wait_for_state(client, "c", "running")
        run_gpu_actor(client, tmp_path, "d", gpus=2)
        assert wait_for_state(client, "d", "awaiting_gpus")["reason"] == (
            "2 GPU(s) requested, 1 of 4 free"
        )
    assert gpus_in(c) == [2]


def test_a_v1_registration_cannot_take_gpus_another_actor_holds(start_agent, tmp_path):
    """A client speaking actor_registered v1 (all GPUs, before allocation existed) goes through
    the allocator: with 2 of 4 GPUs held it waits, and never gets a bundle with them (issue 22)."""
    agent = start_agent()
    with agent.client() as client:
        first = run_gpu_actor(client, tmp_path, "first", gpus=2)
        wait_for_state(client, "first", "running")
        for request in (
            event("actor_registered", "old", v=1, gpu=True, bundle="/b/old"),
            event("bundle_prepared", "old", bundle="/b/old"),
            event("run_requested", "old"),
        ):
            assert client.request(request)["ok"]
        waiting = wait_for_state(client, "old", "awaiting_gpus")
    assert waiting["reason"] == "4 GPU(s) requested, 2 of 4 free"
    assert gpus_in(first) == [0, 1]
    registered = next(e for e in read_log(agent.log).events if e.actor_id == "old")
    assert registered.v == 3  # logged as the allocator's: a replay allocates it too


@pytest.mark.parametrize("v", [1, 2])
def test_a_worker_without_gpus_refuses_gpu_actors_naming_the_missing_spec(tmp_path, v):
    """A CPU-only worker (no /dev/nvidiaN): no nvidia-ctk run, GPU actors fail with the reason,
    whichever version of actor_registered the client speaks."""
    (tmp_path / "cpu-node" / "dev").mkdir(parents=True)
    agent = AgentProcess.on_socket(
        tmp_path,
        "--dev-root",
        str(tmp_path / "cpu-node"),
        "--cdi-output-dir",
        str(tmp_path / "cdi"),
    )
    try:
        with agent.client() as client:
            for request in (
                event("actor_registered", "a", v=v, gpu=True, bundle="/b"),
                event("bundle_prepared", "a", bundle="/b"),
                event("run_requested", "a"),
            ):
                assert client.request(request)["ok"]
            failed = wait_for_state(client, "a", "failed")
    finally:
        assert agent.terminate() == 0
    states = [e.type for e in read_log(agent.log).events if e.actor_id == "a"]
    assert states[-1] == "gpus_refused" and "gpu_injected" not in states
    assert failed["reason"].endswith(
        f"this worker has no known GPU: no CDI spec: {tmp_path}/cpu-node/dev holds no "
        f"nvidia[0-9]* device node (a worker without GPUs), so nvidia-ctk did not generate "
        f"{tmp_path}/cdi/nvidia.json"
    )
    assert not (tmp_path / "cdi").exists()
