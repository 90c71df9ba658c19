"""DRA claim names through the allocator: a claim's ``k8s.gpu.nvidia.com/claim=<uid>-gpu-N`` is
one more name of the worker's GPU N, its spec may appear after the worker started, and a claim
device that is no GPU is refused with why."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from support import gpu_specs

from lifecycle.doubles import FakeInjector
from substrate_gpu import cdi
from substrate_gpu.lifecycle import Agent, events
from substrate_gpu.lifecycle.allocation import (
    GpuAllocator,
    GpuRequest,
    Granted,
    Refused,
    Wait,
    WorkerGpus,
    decide,
)

MakeAgent = Callable[..., Agent]
DERIVED = gpu_specs.DATA / "derived"
CLAIM_SPEC = DERIVED / "DERIVED__dra-claim__kwx4957-T4__gpu-0.yaml"
FRESH_NODE_CLAIM_SPEC = DERIVED / "DERIVED__dra-claim__kwx4957-T4__gpu-0__no-nvidia-nodes.yaml"
CLAIM_GPU = "k8s.gpu.nvidia.com/claim=dab5ab50-d59a-42a6-af16-cfd4628c0f7a-gpu-0"


def _worker_spec(tmp_path: Path) -> Path:
    """The T4 spec rewritten for two GPUs, as nvidia-ctk would write it for the worker."""
    path = tmp_path / "nvidia.json"
    path.write_text(json.dumps(gpu_specs.with_gpus(gpu_specs.load_raw(), 2)))
    return path


def _discover(worker_spec: Path, claim_dir: Path) -> Callable[[], object]:
    """What the agent's discovery does: the worker's spec plus the CDI dir, read now."""

    async def discover() -> WorkerGpus:
        specs = cdi.load_spec_set([claim_dir], extra=[worker_spec])
        return WorkerGpus.of(cdi.list_gpus(specs), cdi.refused_devices(specs))

    return discover


def _worker_with(tmp_path: Path, claim: Path) -> WorkerGpus:
    specs = cdi.SpecSet([cdi.load_spec(_worker_spec(tmp_path)), cdi.load_spec(claim)])
    return WorkerGpus.of(cdi.list_gpus(specs), cdi.refused_devices(specs))


def test_a_claim_name_is_granted_as_its_gpus_index_name(tmp_path: Path) -> None:
    worker = _worker_with(tmp_path, CLAIM_SPEC)
    assert decide(GpuRequest(names=(CLAIM_GPU,)), worker, set()) == Granted(("nvidia.com/gpu=0",))


def test_a_gpu_held_by_index_makes_its_claim_name_wait(tmp_path: Path) -> None:
    """The claim and the index name are the same GPU: never given twice, asked for once."""
    worker = _worker_with(tmp_path, CLAIM_SPEC)
    got = decide(GpuRequest(names=(CLAIM_GPU,)), worker, {"nvidia.com/gpu=0"})
    assert got == Wait("GPU(s) nvidia.com/gpu=0 held by other actors")
    both = decide(GpuRequest(names=("nvidia.com/gpu=0", CLAIM_GPU)), worker, set())
    assert both == Granted(("nvidia.com/gpu=0",))  # one GPU, counted once


def test_a_claim_device_without_nvidia_nodes_is_refused_with_its_name(tmp_path: Path) -> None:
    """DRA driver #1380 (fresh node): refused, naming the device and why."""
    got = decide(GpuRequest(names=(CLAIM_GPU,)), _worker_with(tmp_path, FRESH_NODE_CLAIM_SPEC), ())
    assert isinstance(got, Refused)
    assert got.reason.startswith(
        f"{CLAIM_GPU!r} is not a GPU this worker can give: its edits carry no /dev/nvidia*"
    )


@pytest.mark.anyio
async def test_a_claim_spec_written_after_discovery_is_read_before_refusing(
    tmp_path: Path,
) -> None:
    claim_dir = tmp_path / "run-cdi"
    claim_dir.mkdir()
    allocator = await GpuAllocator.discovered(_discover(_worker_spec(tmp_path), claim_dir))  # type: ignore[arg-type]
    assert CLAIM_GPU not in allocator.worker.aliases
    shutil.copy(CLAIM_SPEC, claim_dir / "k8s.gpu.nvidia.com-claim_dab5ab50.yaml")
    await allocator.ensure_known([CLAIM_GPU])
    assert allocator.decide(GpuRequest(names=(CLAIM_GPU,))) == Granted(("nvidia.com/gpu=0",))


@pytest.mark.anyio
async def test_an_actor_asking_for_a_claim_runs_on_that_gpu(
    make_agent: MakeAgent, injector: FakeInjector, tmp_path: Path
) -> None:
    claim_dir = tmp_path / "run-cdi"
    claim_dir.mkdir()
    allocator = await GpuAllocator.discovered(_discover(_worker_spec(tmp_path), claim_dir))  # type: ignore[arg-type]
    shutil.copy(CLAIM_SPEC, claim_dir / "k8s.gpu.nvidia.com-claim_dab5ab50.yaml")
    async with make_agent(allocator=allocator) as agent:
        await agent.submit(
            events.ActorRegistered(actor_id="a", gpu=True, bundle="/b/a", gpu_names=(CLAIM_GPU,))
        )
        await agent.submit(events.BundlePrepared(actor_id="a", bundle="/b/a"))
        await agent.submit(events.RunRequested(actor_id="a"))
        await agent.wait_for_state("a", "running", timeout=5)
    assert injector.granted == [("nvidia.com/gpu=0",)]
