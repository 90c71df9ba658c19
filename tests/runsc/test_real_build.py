"""The runsc that scripts/build-runsc.sh builds: the pinned version, and the commands and flags
substrate-gpu relies on, read from the real binary's own help (never assumed)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
from support import real_runsc as real_runsc_
from support.real import missing

from substrate_gpu.runsc import driver


def _help(runsc: Path, *topic: str) -> str:
    out = subprocess.run(
        [str(runsc), "help", *topic], capture_output=True, text=True, check=False, timeout=30
    )
    return out.stdout + out.stderr


def test_the_built_runsc_runs_and_names_its_version(real_runsc: Path) -> None:
    """The binary runs and says what it is."""
    out = subprocess.run(
        [str(real_runsc), "--version"], capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.splitlines()[0] == f"runsc version {real_runsc_.pinned_version()}"


def test_a_second_build_reuses_the_cached_binary_after_checking_its_sha256(
    real_runsc: Path,
) -> None:
    """build-runsc.sh on a warm cache prints the cached path (sha256 verified) in seconds."""
    if real_runsc != real_runsc_.cached_binary():
        missing("runsc from the build cache", "is overridden by SUBSTRATE_GPU_RUNSC")
    out = subprocess.run(
        [str(real_runsc_.BUILD_SCRIPT)], capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.strip() == str(real_runsc)
    recorded = (real_runsc.parent / "runsc.sha256").read_text().split()[0]
    assert recorded == hashlib.sha256(real_runsc.read_bytes()).hexdigest()


def test_checkpoint_has_leave_running(real_runsc: Path) -> None:
    """``runsc help checkpoint`` lists ``-leave-running`` (a failed checkpoint need not kill)."""
    assert driver.has_flag(_help(real_runsc, "checkpoint"), "leave-running")


def test_checkpoint_has_cuda_checkpoint_path(real_runsc: Path) -> None:
    """``runsc help checkpoint`` lists ``-cuda-checkpoint-path`` (runsc drives cuda-checkpoint)."""
    assert driver.has_flag(_help(real_runsc, "checkpoint"), "cuda-checkpoint-path")


def test_nvproxy_list_supported_drivers_exists(real_runsc: Path) -> None:
    """``runsc help nvproxy`` lists the ``list-supported-drivers`` subcommand."""
    assert driver.has_command(_help(real_runsc, "nvproxy"), "list-supported-drivers")


@pytest.mark.anyio
async def test_driver_detects_every_feature_of_the_real_binary(real_runsc: Path) -> None:
    """Feature detection through RunscDriver finds all of them on the real runsc."""
    runtime = driver.RunscDriver(
        driver.RunscConfig(root=Path("/nonexistent"), runsc=str(real_runsc))
    )
    features = await runtime.features()
    assert features.version.startswith("runsc version ")
    assert features.leave_running
    assert features.cuda_checkpoint_path
    assert features.nvproxy_driver_version
    assert features.list_supported_drivers
