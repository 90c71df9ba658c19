"""The runsc route: ``runsc checkpoint --cuda-checkpoint-path P`` (the stand-in runsc runs
``P --toggle --pid <pid>`` for each process holding a GPU, as real runsc drives the tool).

Here the stand-in cuda-checkpoint runs on the host, on host pids, and its signals make the
workers drop (and retake) /dev/nvidia0 — what a checkpointed CUDA process does.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from cudackpt.sandbox import CUDA_CHECKPOINT, standin_env
from substrate_gpu.probes import fd_scan
from substrate_gpu.runsc import api

pytestmark = [pytest.mark.anyio, pytest.mark.runc]


@pytest.fixture
def host_tool(ckpt_state: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in tool's knobs in our environment (the stand-in runsc inherits it)."""
    env = standin_env(
        ckpt_state,
        CUDA_CHECKPOINT_STANDIN_RELEASE_SIGNAL="USR1",
        CUDA_CHECKPOINT_STANDIN_REACQUIRE_SIGNAL="USR2",
    )
    for key, value in env.items():
        if key.startswith("CUDA_CHECKPOINT_STANDIN_"):
            monkeypatch.setenv(key, value)
    return ckpt_state


async def gpu_holders(runtime, cid: str) -> tuple[int, ...]:
    """Host pids of the container's processes holding /dev/nvidia0 (waits for both)."""
    pid = (await runtime.state(cid)).pid
    with anyio.fail_after(5):
        while True:
            found = tuple(sorted({c.pid for c in await fd_scan.FdScanProbe().live_clients((pid,))}))
            if len(found) == 2:
                return found
            await anyio.sleep(0.02)


def host_state(state_dir: Path, pid: int) -> str:
    return json.loads((state_dir / f"{pid}.json").read_text())["state"]


async def test_gpu_aware_checkpoint_with_leave_running(
    runtime, make_gpu_bundle, host_tool, tmp_path
) -> None:
    """Every GPU process is toggled, the image is written, and the processes run on."""
    bundle, _ = make_gpu_bundle()
    await runtime.create("r1", bundle, nvproxy=True)
    await runtime.start("r1")
    holders = await gpu_holders(runtime, "r1")

    image = tmp_path / "img"
    await runtime.checkpoint("r1", image, leave_running=True, cuda_checkpoint_path=CUDA_CHECKPOINT)
    record = json.loads((image / "checkpoint.img").read_text())
    assert tuple(record["cuda_pids"]) == holders
    assert (await runtime.state("r1")).status == "running"
    assert [host_state(host_tool, p) for p in holders] == ["running", "running"]
    assert await gpu_holders(runtime, "r1") == holders  # GPU held again


async def test_gpu_aware_checkpoint_without_leave_running_stops_the_sandbox(
    runtime, make_gpu_bundle, host_tool, tmp_path
) -> None:
    """Without --leave-running the sandbox is saved with its CUDA state and stops."""
    bundle, _ = make_gpu_bundle()
    await runtime.create("r2", bundle, nvproxy=True)
    await runtime.start("r2")
    holders = await gpu_holders(runtime, "r2")
    await runtime.checkpoint(
        "r2", tmp_path / "img", leave_running=False, cuda_checkpoint_path=CUDA_CHECKPOINT
    )
    assert (await runtime.state("r2")).status == "stopped"
    assert json.loads((tmp_path / "img" / "checkpoint.img").read_text())["cuda_pids"] == list(
        holders
    )


@pytest.mark.parametrize(
    ("leave_running", "status"),
    [
        pytest.param(True, "running", id="leave-running-survives"),
        pytest.param(False, "stopped", id="without-leave-running-dies"),
    ],
)
async def test_a_failing_tool_fails_the_checkpoint_like_runsc(
    runtime, make_gpu_bundle, host_tool, tmp_path, monkeypatch, leave_running, status
) -> None:
    """The second toggle fails: the first is toggled back, the checkpoint fails (exit 128)."""
    bundle, _ = make_gpu_bundle()
    await runtime.create("r3", bundle, nvproxy=True)
    await runtime.start("r3")
    first, second = await gpu_holders(runtime, "r3")
    monkeypatch.setenv("CUDA_CHECKPOINT_STANDIN_CHECKPOINT_FAIL_PIDS", str(second))
    with pytest.raises(api.RunscError, match=f"cuda-checkpoint --toggle --pid {second} failed"):
        await runtime.checkpoint(
            "r3",
            tmp_path / "img",
            leave_running=leave_running,
            cuda_checkpoint_path=CUDA_CHECKPOINT,
        )
    assert (await runtime.state("r3")).status == status
    if leave_running:
        assert host_state(host_tool, first) == "running"
