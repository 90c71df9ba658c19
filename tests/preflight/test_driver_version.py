"""Reading the host's NVIDIA driver version: /proc/driver/nvidia/version and libcuda.so.<v>.

The /proc texts are real ones, as printed by the kernel modules and quoted in public
documents and bug reports (proprietary and open modules, x86_64 and aarch64, old two-part
versions).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from substrate_gpu import preflight


@pytest.mark.parametrize(
    ("text", "version"),
    [
        pytest.param(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:35 UTC 2025\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
            "580.65.06",
            id="proprietary",
        ),
        pytest.param(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  555.58.02  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Tue Jun 25 01:26:03 UTC 2024\n"
            "GCC version:  gcc version 14.2.1 20240801 (Red Hat 14.2.1-1) (GCC) \n",
            "555.58.02",
            id="open-module",
        ),
        pytest.param(
            "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.65.06  Release Build\n",
            "580.65.06",
            id="open-module-aarch64",
        ),
        pytest.param(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build  (VirtualGPU)\n",
            "560.35.03",
            id="vgpu",
        ),
        pytest.param(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  515.76  Mon Sep 12 19:21:56 UTC 2022\n",
            "515.76",
            id="two-part-version",
        ),
        pytest.param("GCC version:  gcc version 12.2.0\n", None, id="no-nvrm-line"),
        pytest.param("", None, id="empty"),
    ],
)
def test_parse_proc_version(text, version) -> None:
    """The version is the token after 'Kernel Module [for <arch>]'."""
    assert preflight.parse_proc_version(text) == version


@pytest.mark.parametrize(
    ("names", "version"),
    [
        pytest.param(
            ["libcuda.so", "libcuda.so.1", "libcuda.so.580.65.06"], "580.65.06", id="driver-root"
        ),
        # libcuda.so.1 is the SONAME link, not a version.
        pytest.param(["libcuda.so", "libcuda.so.1"], None, id="links-only"),
        pytest.param(["libnvidia-ml.so.580.65.06"], None, id="no-libcuda"),
    ],
)
def test_version_from_libcuda_names(names, version) -> None:
    """The driver root's libcuda.so.<version> suffix is the user-space driver version."""
    assert preflight.version_from_libcuda_names(names) == version


def test_two_libcuda_versions_are_an_error() -> None:
    """Two installed libcuda versions are refused, naming both."""
    with pytest.raises(preflight.PreflightError, match=r"550\.90\.07, 580\.65\.06"):
        preflight.version_from_libcuda_names(["libcuda.so.580.65.06", "libcuda.so.550.90.07"])


@pytest.mark.parametrize(
    ("proc", "lib", "expected"),
    [
        pytest.param("580.65.06", "580.65.06", "580.65.06", id="agree"),
        pytest.param("580.65.06", None, "580.65.06", id="proc-only"),
        pytest.param(None, "570.133.20", "570.133.20", id="driver-root-only"),
        pytest.param("580.65.06", "570.133.20", "driver-mismatch", id="disagree"),
        pytest.param(None, None, "driver-unreadable", id="none"),
    ],
)
def test_decide_driver_version(proc, lib, expected) -> None:
    """The kernel module's version wins; disagreement or absence is a refusal."""
    decided = preflight.decide_driver_version(proc, lib)
    got = decided.code if isinstance(decided, preflight.Refusal) else decided
    assert got == expected


def test_host_facts_reads_files_and_counts_gpus(tmp_path: Path) -> None:
    """host_facts reads both sources and counts /dev/nvidiaN nodes of any index."""
    root = tmp_path / "driver"
    (root / "lib64").mkdir(parents=True)
    (root / "lib64" / "libcuda.so.580.65.06").touch()
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 2025\n")
    dev_root = tmp_path / "host"
    (dev_root / "dev").mkdir(parents=True)
    for name in ("nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (dev_root / "dev" / name).touch()
    facts = preflight.host_facts(driver_root=root, proc_version=proc, dev_root=dev_root)
    assert facts == preflight.HostGpuFacts(driver_version="580.65.06", gpu_count=2)


def test_host_facts_without_any_driver_is_a_refusal(tmp_path: Path) -> None:
    """No version file and no libcuda: a 'driver-unreadable' refusal naming the driver root."""
    facts = preflight.host_facts(
        driver_root=tmp_path / "none", proc_version=tmp_path / "absent", dev_root=tmp_path
    )
    assert isinstance(facts, preflight.Refusal)
    assert facts.code == "driver-unreadable"
    assert "ATE_NVIDIA_DRIVER_ROOT" in facts.reason
