"""The worker API on a GPU worker (a simulated 4-GPU node, the nvidia-ctk and runsc stand-ins
over real runc): which GPUs a sandbox gets, and a checkpoint refused for a live CUDA context.

An actor gets every GPU of the worker unless its app containers' configs request CDI
devices (``cdi.k8s.io/*`` annotations): then exactly those, through the allocator; ``_pause``
never gets one. A GPU actor holding a live CUDA context with no suspend route is answered
FAILED_PRECONDITION with the machine's reason, and keeps running.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from support import runc_bundle

from substrate_gpu.testing import node as node_

from .agentproc import AgentProcess, event
from .test_agent_gpu_allocation import GPU_NODE, gpus_in
from .workerclient import Actor, connect, status_of

pytestmark = pytest.mark.runc


@pytest.fixture(scope="module")
def four_gpus(require_root: None, tmp_path_factory: pytest.TempPathFactory) -> node_.SimulatedNode:
    return node_.build_node(tmp_path_factory.mktemp("node") / "root", gpus=(0, 1, 2, 3))


@pytest.fixture
def agent(four_gpus: node_.SimulatedNode, runc_path: str, tmp_path: Path):
    runsc = node_.install_runsc_standin(tmp_path / "bin")
    process = AgentProcess.on_socket(
        tmp_path,
        "--runsc",
        str(runsc),
        "--worker-socket",
        str(tmp_path / "worker.sock"),
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
    try:
        yield process
    finally:
        process.terminate()
        for actor_root in (tmp_path / "runsc-root").glob("*"):
            runc_bundle.delete_all(actor_root, runc=runc_path)


@pytest.fixture
def worker(agent, tmp_path):
    return connect(tmp_path / "worker.sock")


def _no_gpu_in(bundle: Path) -> bool:
    linux = json.loads((bundle / "config.json").read_text()).get("linux", {})
    return not any(GPU_NODE.fullmatch(d["path"]) for d in linux.get("devices", []))


def test_without_cdi_requests_a_sandbox_gets_every_gpu_of_the_worker(worker, agent, tmp_path):
    """No annotation: all four GPUs, injected into every app container, never ``_pause``."""
    actor = Actor(tmp_path / "all", runsc=agent.runsc, uid="all", apps=("app", "side")).prepare()
    assert status_of(worker.RunWorkload, actor.run()) == (grpc.StatusCode.OK, "")
    assert gpus_in(actor.bundles / "app") == gpus_in(actor.bundles / "side") == [0, 1, 2, 3]
    assert _no_gpu_in(actor.bundles / "_pause")


def test_cdi_requests_get_exactly_those_gpus_through_the_allocator(worker, agent, tmp_path):
    """``cdi.k8s.io/<key>: nvidia.com/gpu=1,nvidia.com/gpu=3``: GPUs 1 and 3 (logged as the
    actor's ``gpu_names``); a second actor asking for GPU 3 waits for it: refused."""
    request = {"cdi.k8s.io/app": "nvidia.com/gpu=1, nvidia.com/gpu=3"}
    actor = Actor(tmp_path / "named", runsc=agent.runsc, uid="named", annotations=request).prepare()
    assert status_of(worker.RunWorkload, actor.run()) == (grpc.StatusCode.OK, "")
    assert gpus_in(actor.bundles / "app") == [1, 3]
    assert _no_gpu_in(actor.bundles / "_pause")
    with agent.client() as client:
        shown = client.request({"query": "actor", "actor_id": "named.1"})["actor"]
    assert shown["state"] == "running"
    logged = [json.loads(line) for line in agent.log.read_text().splitlines()]
    [registered] = [e for e in logged if e.get("type") == "actor_registered"]
    assert registered["gpu_names"] == ["nvidia.com/gpu=1", "nvidia.com/gpu=3"]

    other = Actor(
        tmp_path / "other",
        runsc=agent.runsc,
        uid="other",
        annotations={"cdi.k8s.io/x": "nvidia.com/gpu=3"},
    ).prepare()
    code, message = status_of(worker.RunWorkload, other.run())
    assert code == grpc.StatusCode.FAILED_PRECONDITION, message
    assert "'awaiting_gpus'" in message
    # The refused activation was deleted: its GPUs wait for nobody.
    with agent.client() as client:
        assert client.request({"query": "actor", "actor_id": "other.1"})["actor"]["state"] == (
            "deleted"
        )


def _uuid_name(cdi_dir: Path, index: int) -> str:
    """GPU ``index``'s UUID name in the worker's generated spec."""
    spec = json.loads((cdi_dir / "nvidia.json").read_text())
    [name] = [
        d["name"]
        for d in spec["devices"]
        if d["name"].startswith("GPU-")
        and any(n["path"] == f"/dev/nvidia{index}" for n in d["containerEdits"]["deviceNodes"])
    ]
    return f"nvidia.com/gpu={name}"


@pytest.mark.parametrize(
    ("request_", "gpus"),
    [
        pytest.param("nvidia.com/gpu=all", [0, 1, 2, 3], id="all"),
        pytest.param("nvidia.com/gpu=2,nvidia.com/gpu=all", [0, 1, 2, 3], id="an-index-and-all"),
        pytest.param("nvidia.com/gpu=2,{uuid2}", [2], id="one-gpu-by-index-and-uuid"),
        pytest.param("nvidia.com/gpu=2,nvidia.com/gpu=2", [2], id="one-name-twice"),
    ],
)
def test_all_by_name_is_every_gpu_and_a_gpu_named_twice_counts_once(
    worker, tmp_path, request_, gpus
):
    """docs/gpu-injection.md: ``nvidia.com/gpu=all`` is "all of the worker's GPUs" by name
    (whatever is named beside it), and one GPU named twice (its index and its UUID) is that
    GPU once, as the CDI reference library and nvidia-container-toolkit resolve them."""
    annotation = request_.format(uuid2=_uuid_name(tmp_path / "cdi", 2))
    actor = Actor(
        tmp_path / "names", uid="names", annotations={"cdi.k8s.io/app": annotation}
    ).prepare()
    request = actor.run(runsc_path=str(tmp_path / "bin" / "runsc"))  # the agent's --runsc
    assert status_of(worker.RunWorkload, request) == (grpc.StatusCode.OK, "")
    assert gpus_in(actor.bundles / "app") == gpus
    config = json.loads((actor.bundles / "app" / "config.json").read_text())
    paths = [d["path"] for d in config["linux"]["devices"]]
    assert len(paths) == len(set(paths))  # each node once
    assert _no_gpu_in(actor.bundles / "_pause")


def test_a_container_naming_its_gpus_gets_those_and_its_sibling_naming_none_gets_none(
    worker, agent, tmp_path
):
    """GPUs per container (issue 31 §10): ``app`` annotates GPU 2, ``side`` nothing: app
    holds GPU 2 alone, side no NVIDIA device or mount; logged per container."""
    runsc = str(tmp_path / "bin" / "runsc")  # the agent's --runsc
    actor = Actor(tmp_path / "per", uid="per", apps=("app", "side"), runsc=runsc).prepare()
    config_path = actor.bundles / "app" / "config.json"
    config = json.loads(config_path.read_text())
    config.setdefault("annotations", {})["cdi.k8s.io/app"] = "nvidia.com/gpu=2"
    config_path.write_text(json.dumps(config))
    assert status_of(worker.RunWorkload, actor.run()) == (grpc.StatusCode.OK, "")
    assert gpus_in(actor.bundles / "app") == [2]
    side = json.loads((actor.bundles / "side" / "config.json").read_text())
    assert not [d for d in side.get("linux", {}).get("devices", []) if "nvidia" in d["path"]]
    assert not [m for m in side.get("mounts", []) if "nvidia" in json.dumps(m)]
    logged = [json.loads(line) for line in agent.log.read_text().splitlines()]
    [registered] = [e for e in logged if e.get("type") == "actor_registered"]
    assert registered["container_gpus"] == {"app": ["nvidia.com/gpu=2"]}
    assert registered["gpu_names"] == ["nvidia.com/gpu=2"]


def test_a_live_cuda_context_with_no_suspend_route_is_refused_and_keeps_running(
    worker, agent, tmp_path
):
    """The node agent saw a CUDA context open; the worker has no cuda-checkpoint route:
    FAILED_PRECONDITION with the refusal's reason, and the actor stays running with its
    sandbox (upstream's worker loses the sandbox here)."""
    actor = Actor(tmp_path / "cuda", runsc=agent.runsc, uid="cuda").prepare()
    assert status_of(worker.RunWorkload, actor.run()) == (grpc.StatusCode.OK, "")
    with agent.client() as client:
        assert client.request(event("cuda_context_opened", "cuda.1", pid=42))["ok"]
    code, message = status_of(worker.CheckpointWorkload, actor.checkpoint_request())
    assert code == grpc.StatusCode.FAILED_PRECONDITION, message
    assert "checkpoint of actor 'cuda.1' refused" in message and "CUDA context" in message
    with agent.client() as client:
        shown = client.request({"query": "actor", "actor_id": "cuda.1"})["actor"]
    assert shown["state"] == "running"
    assert not any(p.is_file() for p in actor.checkpoint.glob("*"))
    assert status_of(worker.TerminateWorkload, actor.terminate()) == (grpc.StatusCode.OK, "")
