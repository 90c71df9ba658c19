"""Driver preflight on the real ``runsc nvproxy list-supported-drivers`` output (captured
from the pinned build in tests/data/runsc/list-supported-drivers.txt), with gVisor's tiers:
*supported* (listed), *unsupported* (a known ABI, not listed: runsc refuses it without
``--nvproxy-allow-unsupported-driver``) and *unknown* (no ABI at all)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import real_runsc as real_runsc_
from support.real import missing

from substrate_gpu import preflight
from substrate_gpu.runsc import driver

CAPTURED = Path(__file__).resolve().parents[1] / "data" / "runsc" / "list-supported-drivers.txt"
LISTED = driver.parse_driver_list(CAPTURED.read_text())


def test_the_captured_list_is_one_version_a_line() -> None:
    """25 supported drivers, from the 535 to the 620 branch, every line a version."""
    assert len(LISTED) == 25
    assert (LISTED[0], LISTED[-1]) == ("535.129.03", "620.06.00")
    assert all(v.count(".") == 2 for v in LISTED)


def test_a_supported_tier_driver_passes_preflight() -> None:
    """580.65.06 (the T4 nodes' driver) is listed: no refusal."""
    assert preflight.check_driver_supported("580.65.06", LISTED, architecture="amd64") is None


@pytest.mark.parametrize(
    ("version", "hint"),
    [
        # gVisor knows 580.95.05's ABI (version.go) but does not list it: the unsupported tier.
        pytest.param("580.95.05", "580.65.06", id="unsupported-tier-names-its-branch"),
        pytest.param("999.1.2", "none of the 999 branch", id="unknown"),
        # Upstream supports 615.71.09 (the real T4 spec's driver) since after our pin; the
        # pin is the newest go-branch version the module proxy serves (scripts/runsc.version).
        # Its 615 drivers are arm64 builds: an x86 node is offered none of them.
        pytest.param("615.71.09", "none of the 615 branch", id="newer-upstream-615"),
    ],
)
def test_unlisted_drivers_are_refused_before_any_sandbox(version: str, hint: str) -> None:
    """Both tiers runsc would refuse are refused first, naming what is supported."""
    refusal = preflight.check_driver_supported(version, LISTED, architecture="amd64")
    assert refusal is not None and refusal.code == "driver-unsupported"
    assert hint in refusal.reason


@pytest.mark.anyio
async def test_the_real_runsc_lists_exactly_the_captured_drivers(real_runsc: Path) -> None:
    """The test data is what the pinned runsc prints (re-capture it when the pin moves)."""
    runtime = driver.RunscDriver(
        driver.RunscConfig(root=Path("/nonexistent"), runsc=str(real_runsc))
    )
    assert await runtime.list_supported_drivers() == LISTED
    assert await preflight.supported_drivers(runtime) == LISTED


def _pinned_abi_architectures(version_go: str) -> dict[str, str]:
    """The single-architecture entries of version.go's ``addDriverABI`` calls."""
    call = re.compile(
        r"addDriverABI\(\s*(\d+),\s*(\d+),\s*(\d+),\s*(\"[0-9a-f]+\"|ChecksumNoDriver),"
        r"\s*(\"[0-9a-f]+\"|ChecksumNoDriver)"
    )
    found = {}
    for major, minor, patch, x86_64, arm64 in call.findall(version_go):
        version = f"{int(major)}.{int(minor):02d}.{int(patch):02d}"
        if "ChecksumNoDriver" in (x86_64, arm64):
            found[version] = "arm64" if x86_64 == "ChecksumNoDriver" else "amd64"
    return found


def test_the_architecture_table_is_the_pinned_gvisors() -> None:
    """preflight.DRIVER_ARCHITECTURE is exactly the pin's one-architecture ABI entries
    (read from the pinned source in the Go module cache, where build-runsc.sh put it), and
    each is a listed driver."""
    source = real_runsc_.pinned_source()
    if source is None:
        missing("the pinned gVisor source", "is not in the Go module cache (run build-runsc.sh)")
    version_go = (source / "pkg/sentry/devices/nvproxy/version.go").read_text()
    assert _pinned_abi_architectures(version_go) == preflight.DRIVER_ARCHITECTURE
    assert set(preflight.DRIVER_ARCHITECTURE) <= set(LISTED)
    assert {v for v, arch in preflight.DRIVER_ARCHITECTURE.items() if arch == "arm64"} == {
        "615.15.00",
        "615.62.00",
        "620.06.00",
    }


@pytest.mark.anyio
async def test_the_real_runsc_is_detected_without_gvisor_14525_and_with_a_legacy_nvproxy(
    real_runsc: Path,
) -> None:
    """The pinned build carries the remap-gated device-file creation (no google/gvisor#14525)
    and describes --nvproxy as LEGACY: both read from the binary and its flags."""
    runtime = driver.RunscDriver(
        driver.RunscConfig(root=Path("/nonexistent"), runsc=str(real_runsc))
    )
    features = await runtime.features()
    assert features.restore_creates_gpu_device_files is False
    assert features.nvproxy_flag_legacy is True
