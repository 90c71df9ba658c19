"""The exec route end to end: cuda-checkpoint (the stand-in) runs inside a real runc
container through ``runsc exec``, on container pids, before and after ``runsc checkpoint``.

The container runs two CUDA "processes" (pid 1 and a child, see conftest.GPU_WORKER) that
hold /dev/nvidia0 and drop it when their CUDA state is checkpointed — so the stand-in
runsc's live-client check sees exactly what gVisor would.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import anyio
import pytest

from cudackpt.sandbox import TOOL_IN_CONTAINER
from substrate_gpu.cudackpt import api, suspend, tool
from substrate_gpu.runsc import api as runsc_api

#: Unique per run: runc names the cgroup after the container id, and concurrent runs
#: reusing an id would see each other's processes.
RUN = uuid.uuid4().hex[:8]

pytestmark = [pytest.mark.anyio, pytest.mark.runc]


async def start(runtime, bundle: Path, state: Path, cid: str) -> tuple[int, int]:
    """Create and start the container; return the container pids of its two GPU workers."""
    await runtime.create(cid, bundle, nvproxy=True)
    await runtime.start(cid)
    with anyio.fail_after(5):
        while not (state / "child.pid").exists() or not (state / "child.pid").read_text().strip():
            await anyio.sleep(0.02)
    return 1, int((state / "child.pid").read_text())


def cuda_tool(runtime, cid: str) -> tool.ExecCudaCheckpoint:
    return tool.ExecCudaCheckpoint(runtime, cid, tool_path=TOOL_IN_CONTAINER)


async def test_suspend_checkpoint_and_resume_through_exec(
    runtime, make_gpu_bundle, tmp_path
) -> None:
    """lock+checkpoint via exec → runsc checkpoint succeeds (no live client) → resume."""
    bundle, state = make_gpu_bundle()
    pids = await start(runtime, bundle, state, f"gpu-1-{RUN}")
    ckpt = cuda_tool(runtime, f"gpu-1-{RUN}")
    assert await ckpt.available()
    assert await ckpt.gpu_processes() == tuple(sorted(pids))

    # Without the suspend gVisor refuses (and --leave-running keeps the sandbox).
    with pytest.raises(runsc_api.LiveNvproxyClientsError):
        await runtime.checkpoint(f"gpu-1-{RUN}", tmp_path / "img-0", leave_running=True)

    outcome = await suspend.suspend_processes(ckpt, pids, lock_timeout_ms=2000)
    assert outcome.suspended, outcome.reason
    assert [await ckpt.get_state(p) for p in pids] == ["checkpointed", "checkpointed"]
    await runtime.checkpoint(f"gpu-1-{RUN}", tmp_path / "img-1", leave_running=True)

    resumed = await suspend.resume_processes(ckpt, pids)
    assert resumed.ok, resumed.reason
    assert [await ckpt.get_state(p) for p in pids] == ["running", "running"]
    assert await ckpt.gpu_processes() == tuple(sorted(pids))  # the GPU is held again


async def test_rollback_when_the_second_process_fails(runtime, make_gpu_bundle) -> None:
    """The child's checkpoint fails: pid 1 is restored and unlocked, the child unlocked."""
    # The child's pid is not known before start: fail every pid but 1.
    knobs = {"CUDA_CHECKPOINT_STANDIN_CHECKPOINT_FAIL_PIDS": ",".join(str(p) for p in range(2, 64))}
    bundle, state = make_gpu_bundle("failing", knobs)
    pids = await start(runtime, bundle, state, f"gpu-2-{RUN}")
    ckpt = cuda_tool(runtime, f"gpu-2-{RUN}")
    outcome = await suspend.suspend_processes(ckpt, pids, lock_timeout_ms=2000)
    assert outcome.status == "refused"
    assert outcome.reason.startswith(f"unsupported: pid {pids[1]}")
    assert [await ckpt.get_state(p) for p in pids] == ["running", "running"]
    assert await ckpt.gpu_processes() == tuple(sorted(pids))


async def test_lock_timeout_refuses_and_leaves_every_process_running(
    runtime, make_gpu_bundle
) -> None:
    """pid 1's lock times out: the suspend is refused, nothing was changed."""
    bundle, state = make_gpu_bundle("stuck", {"CUDA_CHECKPOINT_STANDIN_LOCK_TIMEOUT_PIDS": "1"})
    pids = await start(runtime, bundle, state, f"gpu-3-{RUN}")
    ckpt = cuda_tool(runtime, f"gpu-3-{RUN}")
    with pytest.raises(api.LockTimeoutError, match="timed out"):
        await ckpt.lock(1, 200)
    outcome = await suspend.suspend_processes(ckpt, pids, lock_timeout_ms=200)
    assert outcome.status == "refused"
    assert outcome.reason.startswith("lock timeout: pid 1")
    assert [await ckpt.get_state(p) for p in pids] == ["running", "running"]


async def test_a_sandbox_without_the_tool_is_reported_unavailable(runtime, make_gpu_bundle) -> None:
    """available() is False and calls raise ToolUnavailableError when the tool is absent."""
    bundle, state = make_gpu_bundle()
    await start(runtime, bundle, state, f"gpu-4-{RUN}")
    missing = tool.ExecCudaCheckpoint(runtime, f"gpu-4-{RUN}", tool_path="cuda-checkpoint")
    assert not await missing.available()
    with pytest.raises(api.ToolUnavailableError):
        await missing.get_state(1)


async def test_exec_into_an_unknown_container_is_the_runtimes_error(runtime) -> None:
    """runsc's own failure (no such container) is a typed runsc error, not a tool error."""
    with pytest.raises(runsc_api.ContainerNotFoundError, match="while running"):
        await cuda_tool(runtime, "nobody").get_state(1)
