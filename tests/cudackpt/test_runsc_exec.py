"""RunscDriver.exec through the stand-in runsc (runc exec): status and output returned,
runsc's own failures typed."""

from __future__ import annotations

import anyio
import pytest
from support import runc_bundle

from substrate_gpu.runsc import api

pytestmark = [pytest.mark.anyio, pytest.mark.runc]


@pytest.fixture
async def sleeper(runtime, tmp_path, runc_path) -> str:
    """A running CPU container."""
    bundle = runc_bundle.make_busybox_bundle(
        tmp_path / "cpu", ["/bin/sleep", "1000"], runc=runc_path
    )
    await runtime.create("cpu-1", bundle, nvproxy=False)
    await runtime.start("cpu-1")
    return "cpu-1"


async def test_exec_returns_the_commands_status_and_output(runtime, sleeper) -> None:
    """A failing command is not an error: its status, stdout and stderr come back."""
    result = await runtime.exec(sleeper, ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")


async def test_exec_in_a_stopped_container_is_typed(runtime, sleeper) -> None:
    """runsc refusing to exec in a stopped container raises ContainerStoppedError."""
    await runtime.kill(sleeper, "KILL")
    with anyio.fail_after(5):
        while (await runtime.state(sleeper)).status != "stopped":
            await anyio.sleep(0.02)
    with pytest.raises(api.ContainerStoppedError, match="in state stopped"):
        await runtime.exec(sleeper, ["/bin/true"])


async def test_exec_timeout_kills_and_raises(runtime, sleeper) -> None:
    """An exec that outlives its timeout raises a timed-out RunscError."""
    with pytest.raises(api.RunscError) as info:
        await runtime.exec(sleeper, ["/bin/sleep", "30"], 0.5)
    assert info.value.timed_out
