"""Driver decisions: nvproxy's supported list, cuda-checkpoint's minimum, restore checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from substrate_gpu import preflight
from substrate_gpu.runsc import driver

RUNSC = Path(__file__).resolve().parents[1] / "standins" / "runsc"
SUPPORTED = ("535.183.01", "550.90.07", "570.133.20")


@pytest.mark.parametrize(
    ("version", "supported", "refused"),
    [
        pytest.param("550.90.07", SUPPORTED, False, id="listed"),
        pytest.param("550.90.12", SUPPORTED, True, id="same-branch-other-patch"),
        pytest.param("580.65.06", SUPPORTED, True, id="unlisted-branch"),
        # A runsc that cannot list drivers cannot be asked: runsc create stays the judge.
        pytest.param("580.65.06", None, False, id="runsc-cannot-list"),
    ],
)
def test_check_driver_supported(version, supported, refused) -> None:
    """Only a driver nvproxy lists exactly is accepted."""
    refusal = preflight.check_driver_supported(version, supported, architecture="amd64")
    assert (refusal is not None) == refused
    if refusal:
        assert refusal.code == "driver-unsupported"
        assert version in refusal.reason


def test_unsupported_refusal_lists_the_same_branch() -> None:
    """The refusal names the supported drivers of the host's branch."""
    refusal = preflight.check_driver_supported("550.90.12", SUPPORTED, architecture="amd64")
    assert refusal is not None
    assert "550.90.07" in refusal.reason
    assert "before creating any sandbox" in refusal.reason


ARM64_ONLY = ("580.65.06", "615.15.00", "615.62.00", "620.06.00")


@pytest.mark.parametrize("version", ["615.15.00", "615.62.00", "620.06.00"])
def test_an_arm64_only_driver_on_an_x86_node_is_refused(version) -> None:
    """Listed, but the pin's ABI for it has no x86_64 installer: refused with the reason."""
    refusal = preflight.check_driver_supported(version, ARM64_ONLY, architecture="amd64")
    assert refusal is not None and refusal.code == "driver-unsupported"
    assert (
        f"NVIDIA driver {version} is listed by this runsc's nvproxy only as an arm64 build"
        in refusal.reason
    )
    assert "no amd64 installer of it (ChecksumNoDriver)" in refusal.reason
    assert "this node is amd64" in refusal.reason


@pytest.mark.parametrize("version", ["615.15.00", "615.62.00", "620.06.00"])
def test_an_arm64_only_driver_on_an_arm64_node_is_accepted(version) -> None:
    """The same driver where it was qualified: no refusal."""
    assert preflight.check_driver_supported(version, ARM64_ONLY, architecture="arm64") is None


def test_an_x86_only_driver_on_an_arm64_node_is_refused() -> None:
    """The other way round: 570.133.20 (the g4dn T4s') has no arm64 installer at the pin."""
    refusal = preflight.check_driver_supported("570.133.20", SUPPORTED, architecture="arm64")
    assert refusal is not None and "only as an amd64 build" in refusal.reason
    assert preflight.check_driver_supported("570.133.20", SUPPORTED, architecture="amd64") is None


def test_the_hint_names_only_the_drivers_of_this_architecture() -> None:
    """An unlisted 615 driver on x86: the arm64-only 615 builds are not offered."""
    refusal = preflight.check_driver_supported("615.71.09", ARM64_ONLY, architecture="amd64")
    assert refusal is not None
    assert "runsc supports 1 drivers on amd64, none of the 615 branch" in refusal.reason
    refusal = preflight.check_driver_supported("615.71.09", ARM64_ONLY, architecture="arm64")
    assert refusal is not None
    assert "supported 615.x drivers on arm64: 615.15.00, 615.62.00" in refusal.reason


@pytest.mark.parametrize(
    ("version", "need_actions", "refused"),
    [
        pytest.param("535.183.01", False, True, id="535-no-tool"),
        pytest.param("550.90.07", False, False, id="550-toggle"),
        pytest.param("550.90.07", True, True, id="550-no-lock-timeout"),
        pytest.param("570.133.20", True, False, id="570-actions"),
        pytest.param("580.65.06", True, False, id="580"),
    ],
)
def test_check_cuda_checkpoint_driver(version, need_actions, refused) -> None:
    """cuda-checkpoint needs 550; lock/checkpoint actions with --timeout need 570."""
    refusal = preflight.check_cuda_checkpoint_driver(version, need_actions=need_actions)
    assert (refusal is not None) == refused


GPU_MANIFEST = preflight.CheckpointManifest(
    driver_version="580.65.06", gpu_count=2, cuda_state_included=True, route="exec-cuda-checkpoint"
)


@pytest.mark.parametrize(
    ("manifest", "host", "code"),
    [
        pytest.param(GPU_MANIFEST, preflight.HostGpuFacts("580.65.06", 2), None, id="same-node"),
        pytest.param(GPU_MANIFEST, preflight.HostGpuFacts("580.65.06", 4), None, id="more-gpus"),
        pytest.param(
            GPU_MANIFEST,
            preflight.HostGpuFacts("580.65.06", 1),
            "restore-fewer-gpus",
            id="fewer-gpus",
        ),
        pytest.param(
            GPU_MANIFEST,
            preflight.HostGpuFacts("570.133.20", 2),
            "restore-other-driver",
            id="other-driver",
        ),
        pytest.param(
            preflight.CheckpointManifest("580.65.06", 0, cuda_state_included=False),
            preflight.HostGpuFacts("570.133.20", 0),
            None,
            id="cpu-checkpoint-anywhere",
        ),
    ],
)
def test_check_restore(manifest, host, code) -> None:
    """A restore is refused onto another driver or fewer GPUs, with the reason."""
    refusal = preflight.check_restore(manifest, host)
    assert (refusal.code if refusal else None) == code


def test_restore_refusal_names_both_drivers() -> None:
    """The other-driver refusal names the recorded and the host driver."""
    refusal = preflight.check_restore(GPU_MANIFEST, preflight.HostGpuFacts("570.133.20", 2))
    assert refusal is not None
    assert "580.65.06" in refusal.reason
    assert "570.133.20" in refusal.reason


@pytest.fixture
def fake_host(tmp_path: Path):
    """A driver version file and two GPU nodes, for a given version."""

    def make(version: str) -> dict[str, Path]:
        proc = tmp_path / "version"
        proc.write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Sun Jul 27 2025\n"
        )
        (tmp_path / "dev").mkdir(exist_ok=True)
        for name in ("nvidia0", "nvidia1"):
            (tmp_path / "dev" / name).touch()
        return {"driver_root": tmp_path / "none", "proc_version": proc, "dev_root": tmp_path}

    return make


def standin_runtime(tmp_path: Path) -> driver.RunscDriver:
    return driver.RunscDriver(driver.RunscConfig(root=tmp_path / "root", runsc=str(RUNSC)))


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("version", "features", "outcome"),
    [
        pytest.param("570.133.20", None, "facts", id="supported"),
        pytest.param("580.65.06", None, "driver-unsupported", id="unsupported"),
        pytest.param("580.65.06", "leave-running", "facts", id="runsc-cannot-list"),
    ],
)
async def test_preflight_host_asks_runsc(
    tmp_path, fake_host, monkeypatch, version, features, outcome
) -> None:
    """preflight_host checks the host's driver against runsc nvproxy list-supported-drivers."""
    monkeypatch.setenv("RUNSC_STANDIN_DRIVERS", ",".join(SUPPORTED))
    if features is not None:
        monkeypatch.setenv("RUNSC_STANDIN_FEATURES", features)
    result = await preflight.preflight_host(standin_runtime(tmp_path), **fake_host(version))
    if outcome == "facts":
        assert result == preflight.HostGpuFacts(version, 2)
    else:
        assert isinstance(result, preflight.Refusal)
        assert result.code == outcome
