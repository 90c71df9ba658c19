"""Which suspend route the probe chooses for a live CUDA context (the effect's facts; the
machine follows ``live_context_found.route``). In-process doubles; the scenarios with real
runc and the stand-ins are in tests/gpu_suspend."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lifecycle.doubles import FakeProbe, FakeRuntime, RecordingMetrics
from lifecycle.factories import bring_to_running
from substrate_gpu.lifecycle import Agent, events
from substrate_gpu.lifecycle.gpu import GpuSettings
from substrate_gpu.runsc import api as runsc

pytestmark = pytest.mark.anyio

MakeAgent = Callable[..., Agent]


@dataclasses.dataclass
class CudaRunsc(FakeRuntime):
    """A runtime whose runsc has ``checkpoint --cuda-checkpoint-path``."""

    async def features(self) -> runsc.RunscFeatures:
        return dataclasses.replace(await super().features(), cuda_checkpoint_path=True)


class ToolInSandbox:
    """``cuda-checkpoint`` present in every sandbox (never asked to act here)."""

    def __init__(self, container_id: str) -> None:
        self.container_id = container_id

    async def available(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the route choice must not call {name}")


class Unlisted:
    """A runsc that cannot list its supported drivers (preflight does not check)."""

    async def features(self) -> runsc.RunscFeatures:
        return await FakeRuntime().features()

    async def list_supported_drivers(self) -> tuple[str, ...]:
        raise AssertionError("not asked: the features say it cannot list")


def settings(tmp_path: Path, driver: str, **kwargs: Any) -> GpuSettings:
    """Settings on a node whose kernel module is ``driver``."""
    proc = tmp_path / "proc-version"
    proc.write_text(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Thu Jan 1\n")
    return GpuSettings(
        drivers=Unlisted(), driver_root=tmp_path / "none", proc_version=proc, **kwargs
    )


async def suspend_with_context(agent: Agent, runtime: FakeRuntime) -> None:
    await bring_to_running(agent)
    runtime.open_context("a")
    await agent.submit(events.SuspendRequested(actor_id="a"))
    await agent.settle()


@pytest.fixture
def cuda_runtime() -> CudaRunsc:
    return CudaRunsc()


async def test_without_gpu_settings_runsc_flag_alone_is_no_route(
    make_agent: MakeAgent, cuda_runtime: CudaRunsc, metrics: RecordingMetrics
) -> None:
    """runsc could do it, but no host cuda-checkpoint is configured: refused, not attempted."""
    async with make_agent(runtime=cuda_runtime, probe=FakeProbe(cuda_runtime)) as agent:
        await suspend_with_context(agent, cuda_runtime)
        assert agent.state_of("a") == "running"
    assert cuda_runtime.ops("checkpoint") == []
    assert metrics.named("checkpoint_refused") == [(events.REFUSED_LIVE_CONTEXT_PROBED,)]


FEATURES = runsc.RunscFeatures(
    version="runsc version test",
    leave_running=True,
    cuda_checkpoint_path=True,
    nvproxy_driver_version=True,
    list_supported_drivers=True,
)
OLD_RUNSC = dataclasses.replace(FEATURES, cuda_checkpoint_path=False)
HOST_TOOL = {"cuda_checkpoint_path": Path("/usr/local/nvidia/bin/cuda-checkpoint")}
IN_SANDBOX = {"sandbox_tool": ToolInSandbox}
BOTH = {**HOST_TOOL, **IN_SANDBOX}


@pytest.mark.parametrize(
    ("features", "tools", "driver", "policy", "route"),
    [
        pytest.param(FEATURES, HOST_TOOL, "580.65.06", "auto", "runsc-cuda-checkpoint", id="runsc"),
        pytest.param(FEATURES, BOTH, "580.65.06", "auto", "runsc-cuda-checkpoint", id="runsc-preferred"),
        pytest.param(OLD_RUNSC, BOTH, "580.65.06", "auto", "exec-cuda-checkpoint", id="exec"),
        # The runsc flag is useless without a host tool to hand it.
        pytest.param(FEATURES, IN_SANDBOX, "580.65.06", "auto", "exec-cuda-checkpoint", id="no-host-tool"),
        # runsc's route needs driver 550 (--toggle); the exec route 570 (--action, --timeout).
        pytest.param(FEATURES, HOST_TOOL, "545.29.06", "auto", "refuse", id="runsc-driver-too-old"),
        pytest.param(FEATURES, BOTH, "560.35.03", "auto", "runsc-cuda-checkpoint", id="560-runsc-only"),
        pytest.param(OLD_RUNSC, IN_SANDBOX, "560.35.03", "auto", "refuse", id="exec-driver-too-old"),
        pytest.param(OLD_RUNSC, {}, "580.65.06", "auto", "refuse", id="neither"),
        pytest.param(FEATURES, BOTH, "580.65.06", "refuse", "refuse", id="pool-refuses"),
    ],
)  # fmt: skip
async def test_the_route_follows_runsc_the_tools_the_driver_and_the_pool(
    tmp_path: Path,
    features: runsc.RunscFeatures,
    tools: dict[str, Any],
    driver: str,
    policy: str,
    route: str,
) -> None:
    """runsc's route when its flag, a host tool and the driver allow; else the exec route
    when the tool runs in the sandbox and the driver allows; else refuse (with why)."""
    gpu = settings(tmp_path, driver, **tools)
    chosen = await gpu.route(features, "a", policy)
    assert chosen.name == route
    if route == "refuse" and policy == "auto" and tools:
        assert "needs NVIDIA driver" in chosen.reason


@pytest.mark.parametrize(
    ("features", "words"),
    [
        pytest.param(
            FEATURES,
            "runsc's checkpoint --cuda-checkpoint-path cannot be used here and cuda-checkpoint "
            "is not available inside the sandbox (no host cuda-checkpoint is configured",
            id="runsc-has-the-flag",
        ),
        pytest.param(
            OLD_RUNSC,
            "runsc has no checkpoint --cuda-checkpoint-path and cuda-checkpoint is not "
            "available inside the sandbox",
            id="runsc-lacks-the-flag",
        ),
    ],
)
async def test_a_refusal_says_what_is_missing_without_naming_a_runsc_version(
    tmp_path: Path, features: runsc.RunscFeatures, words: str
) -> None:
    """No route: the reason says truly what is missing (a runsc with the flag is not said to
    lack it) and names no runsc build: the version is said once, where the agent starts."""
    chosen = await settings(tmp_path, "580.65.06").route(features, "a", "auto")
    assert chosen.refuses
    assert words in chosen.reason
    assert features.version not in chosen.reason
