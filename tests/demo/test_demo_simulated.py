"""The demo without runc (or without root): the in-process runtime, said out loud."""

from __future__ import annotations

import io

import pytest

from substrate_gpu.eventlog import replay
from substrate_gpu.probes.api import GpuClient
from substrate_gpu.testing import demo
from substrate_gpu.testing.sandboxes import SimulatedSandboxes


@pytest.fixture
def no_runc(monkeypatch):
    monkeypatch.setattr(demo, "choose_runtime", lambda: (None, "in-process simulated runsc (test)"))


def test_the_fallback_is_named_and_still_refuses_then_accepts(tmp_path, no_runc):
    """The same lives run on SimulatedSandboxes: refusal, acceptance, replayable log."""
    out = io.StringIO()
    result = demo.main(tmp_path, out)
    assert result.runtime == "simulated"
    assert "runtime: in-process simulated runsc (test)" in out.getvalue()
    (refusal,) = result.refusals
    assert refusal.actor_id == "gpu-trainer"
    assert set(result.final_states.values()) == {"deleted"}
    assert {a: v.state for a, v in replay(result.event_log).actors.items()} == dict(
        result.final_states
    )


async def _checkpoint(sandboxes, actor_id, image, leave_running=True):
    await sandboxes.checkpoint(actor_id, image, leave_running=leave_running)


@pytest.mark.anyio
async def test_simulated_sandbox_refuses_to_save_a_live_gpu_handle(tmp_path):
    """SimulatedSandboxes fails like gVisor while the workload holds the GPU, and not after."""
    from substrate_gpu.runsc import api as runsc

    bundle = demo.actor_bundle(tmp_path / "a1", holds_gpu=True)
    sandboxes = SimulatedSandboxes()
    await sandboxes.create("a1", bundle, nvproxy=True)
    await sandboxes.start("a1")
    pid = (await sandboxes.state("a1")).pid
    assert await sandboxes.live_clients((pid,)) == (
        GpuClient(pid=pid, fd=3, target="/dev/nvidia0"),
    )
    with pytest.raises(runsc.LiveNvproxyClientsError, match="live nvproxy clients"):
        await _checkpoint(sandboxes, "a1", tmp_path / "img1")
    assert (await sandboxes.state("a1")).status == "running"  # --leave-running
    (bundle / "rootfs" / "tmp" / "release").touch()
    assert await sandboxes.live_clients((pid,)) == ()
    await _checkpoint(sandboxes, "a1", tmp_path / "img2", leave_running=False)
    assert (await sandboxes.state("a1")).status == "stopped"
    await sandboxes.delete("a1", force=True)
    with pytest.raises(runsc.ContainerNotFoundError):
        await sandboxes.state("a1")
