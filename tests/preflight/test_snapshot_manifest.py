"""The snapshot manifest's origin facts: runsc version, the host CPU's feature flags, the GPUs;
and the refusal to restore onto a CPU lacking a feature the image's host had (agent-substrate
#1657)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from substrate_gpu import preflight

CPU_MANIFEST = preflight.CheckpointManifest(
    driver_version="",
    gpu_count=0,
    cuda_state_included=False,
    runsc_version="runsc version VERSION_MISSING",
    cpu_flags=("avx2", "fpu", "sse4_2"),
)

# /proc/driver/nvidia/gpus/0000:00:04.0/information as a T4 node's driver writes it.
T4_INFORMATION = """\
Model: \t\t Tesla T4
IRQ:   \t\t 36
GPU UUID: \t GPU-6d7e1b2c-3f4a-5b6c-7d8e-9f0a1b2c3d4e
Video BIOS: \t 90.04.96.00.9f
Bus Type: \t PCIe
DMA Size: \t 47 bits
DMA Mask: \t 0x7fffffffffff
Bus Location: \t 0000:00:04.0
Device Minor: \t 1
GPU Firmware: \t 580.65.06
GPU Excluded:\t No
"""


def test_a_cpu_manifest_round_trips_without_a_driver() -> None:
    """A CPU actor's manifest (no driver, no GPUs) survives JSON and keeps its CPU flags."""
    assert preflight.CheckpointManifest.from_json(CPU_MANIFEST.to_json()) == CPU_MANIFEST


def test_a_schema_1_manifest_still_reads_with_its_cpu_unknown() -> None:
    """Manifests written before schema 2 read back, with cpu_flags None (unchecked)."""
    old = {"schema": 1, "driver_version": "580.65.06", "gpu_count": 1, "cuda_state_included": False}
    manifest = preflight.CheckpointManifest.from_json(json.dumps(old))
    assert (manifest.schema, manifest.cpu_flags, manifest.runsc_version) == (1, None, "")


def test_a_gpu_manifest_still_needs_its_driver_version() -> None:
    """An empty driver_version is refused when the manifest holds GPUs."""
    bad = {**json.loads(CPU_MANIFEST.to_json()), "gpu_count": 1}
    with pytest.raises(preflight.PreflightError, match="driver_version"):
        preflight.CheckpointManifest.from_json(json.dumps(bad))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("cpu_flags", "avx2 fpu", id="flags-not-a-list"),
        pytest.param("cpu_flags", ["avx2", ""], id="empty-flag"),
        pytest.param("gpus", [{"model": "T4"}], id="gpu-without-uuid"),
        pytest.param("runsc_version", None, id="runsc-version-null"),
    ],
)
def test_bad_origin_fields_are_named(field: str, value: object) -> None:
    """A corrupt origin field is a PreflightError naming it."""
    bad = {**json.loads(CPU_MANIFEST.to_json()), field: value}
    with pytest.raises(preflight.PreflightError, match=field):
        preflight.CheckpointManifest.from_json(json.dumps(bad))


def test_this_hosts_cpu_flags_are_read_from_proc_cpuinfo() -> None:
    """read_cpu_flags gives the real host's flags, sorted, including ones every x86-64 has."""
    flags = preflight.read_cpu_flags()
    assert flags == tuple(sorted(set(flags)))
    assert {"fpu", "sse2"} <= set(flags) or "fp" in flags  # x86-64, or arm64's Features


def test_arm64_features_line_is_read() -> None:
    """arm64 names its flags ``Features``."""
    text = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes\nCPU implementer\t: 0x41\n"
    assert preflight.parse_cpu_flags(text) == ("aes", "asimd", "evtstrm", "fp")


def test_gpu_information_gives_model_uuid_and_minor() -> None:
    """The driver's per-GPU information file yields model, UUID and device minor."""
    assert preflight.parse_gpu_information(T4_INFORMATION) == (
        1,
        preflight.GpuIdentity(model="Tesla T4", uuid="GPU-6d7e1b2c-3f4a-5b6c-7d8e-9f0a1b2c3d4e"),
    )


def test_gpus_are_listed_in_device_minor_order(tmp_path: Path) -> None:
    """read_gpu_identities orders GPUs by minor, whatever the bus order."""
    for bus, minor, uuid in (("0000:00:04.0", 1, "GPU-b"), ("0000:00:05.0", 0, "GPU-a")):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(
            T4_INFORMATION.replace("Device Minor: \t 1", f"Device Minor: \t {minor}").replace(
                "GPU-6d7e1b2c-3f4a-5b6c-7d8e-9f0a1b2c3d4e", uuid
            )
        )
    assert [g.uuid for g in preflight.read_gpu_identities(tmp_path)] == ["GPU-a", "GPU-b"]


def test_no_driver_means_no_gpus(tmp_path: Path) -> None:
    """Without /proc/driver/nvidia/gpus the host has no GPU identities (not an error)."""
    assert preflight.read_gpu_identities(tmp_path / "absent") == ()


def test_restore_onto_a_cpu_lacking_flags_is_refused_naming_them() -> None:
    """Every flag the image's host had and this one lacks is named in the refusal."""
    refusal = preflight.check_cpu_features(CPU_MANIFEST, ("fpu",))
    assert refusal is not None
    assert refusal.code == "restore-cpu-features"
    assert "avx2, sse4_2" in refusal.reason


def test_restore_onto_a_superset_cpu_is_allowed() -> None:
    """A CPU with every flag of the image's host, and more, restores."""
    assert preflight.check_cpu_features(CPU_MANIFEST, ("avx2", "avx512f", "fpu", "sse4_2")) is None


def test_an_image_of_unknown_cpu_is_not_checked() -> None:
    """A schema-1 manifest (cpu_flags None) is not held against the host."""
    old = preflight.CheckpointManifest("580.65.06", 1, cuda_state_included=False, schema=1)
    assert preflight.check_cpu_features(old, ()) is None


SCHEMA_3 = dataclasses.replace(CPU_MANIFEST, architecture="amd64", runsc_sha256="ab" * 32)
HOST = {"architecture": "amd64", "cpu_flags": ("avx2", "fpu", "sse4_2"), "runsc_sha256": "ab" * 32}


def test_a_schema_3_manifest_round_trips_with_architecture_and_runsc_hash() -> None:
    """Architecture and the runsc binary's hash survive JSON."""
    assert preflight.CheckpointManifest.from_json(SCHEMA_3.to_json()) == SCHEMA_3


def test_a_schema_2_manifest_still_reads_and_keeps_the_subset_cpu_check() -> None:
    """Migration: a schema-2 image (no architecture, no hash) reads back and restores on a
    CPU with more features, as before (only a missing feature refuses it)."""
    raw = json.loads(CPU_MANIFEST.to_json())
    for name in ("architecture", "runsc_sha256"):
        del raw[name]
    old = preflight.CheckpointManifest.from_json(json.dumps({**raw, "schema": 2}))
    assert (old.schema, old.architecture, old.runsc_sha256) == (2, "", "")
    wider = {**HOST, "cpu_flags": ("avx2", "avx512f", "fpu", "sse4_2"), "runsc_sha256": "cd"}
    assert preflight.check_sandbox_compat(old, **wider) is None
    narrower = {**HOST, "cpu_flags": ("fpu",)}
    refusal = preflight.check_sandbox_compat(old, **narrower)
    assert refusal is not None and refusal.code == "restore-cpu-features"


@pytest.mark.parametrize(
    ("host", "named"),
    [
        # Each attribute the image records must equal the host's (MatchesCompat).
        pytest.param({"architecture": "arm64"}, "architecture amd64", id="architecture"),
        pytest.param({"runsc_sha256": "cd" * 32}, "runsc_sha256 abab", id="runsc-build"),
        pytest.param({"cpu_flags": ("fpu", "sse4_2")}, "lacks: avx2", id="fewer-cpu-features"),
        # Exact, not a subset: a newer CPU is another sandbox too (level with the annotation).
        pytest.param(
            {"cpu_flags": ("avx2", "avx512f", "fpu", "sse4_2")},
            "beyond the image: avx512f",
            id="more-cpu-features",
        ),
    ],
)  # fmt: skip
def test_a_schema_3_image_restores_only_on_an_exactly_matching_sandbox(
    host: dict[str, object], named: str
) -> None:
    """Architecture, CPU features and runsc hash are matched exactly; the refusal names the
    attribute that differs."""
    assert preflight.check_sandbox_compat(SCHEMA_3, **HOST) is None  # type: ignore[arg-type]
    refusal = preflight.check_sandbox_compat(SCHEMA_3, **{**HOST, **host})  # type: ignore[arg-type]
    assert refusal is not None and refusal.code == "restore-other-sandbox"
    assert named in refusal.reason


def test_an_attribute_the_image_lacks_is_no_constraint() -> None:
    """As in MatchesCompat, only the image's own attributes constrain the host."""
    unhashed = dataclasses.replace(SCHEMA_3, runsc_sha256="")
    assert preflight.check_sandbox_compat(unhashed, **{**HOST, "runsc_sha256": ""}) is None  # type: ignore[arg-type]


def test_this_hosts_architecture_has_gos_name() -> None:
    """x86_64 is amd64, aarch64 is arm64: the values agent-substrate's workers report."""
    assert preflight.host_architecture() in {"amd64", "arm64"}
