"""Schema 4: the actor's own GPUs and their used memory in the manifest; pairing them with a
restore's GPUs, the device map, the remap and memory refusals (issue 26 items 1 and 3)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from substrate_gpu import preflight
from substrate_gpu.lifecycle import events

A, B, C = (f"GPU-{c * 8}-0000-0000-0000-000000000000" for c in "abc")

GPU_MANIFEST = preflight.CheckpointManifest(
    driver_version="580.65.06",
    gpu_count=2,
    cuda_state_included=True,
    route=preflight.ROUTE_EXEC,
    runsc_version="runsc version release-20260901.0",
    cpu_flags=("fpu",),
    architecture="amd64",
    runsc_sha256="ab" * 32,
    actor_gpus=(
        preflight.CheckpointGpu(A, memory_used_mib=6144),
        preflight.CheckpointGpu(B, memory_used_mib=None),
    ),
)


def test_routes_are_the_lifecycles() -> None:
    """preflight spells the lifecycle's route names (it sits below it): the same strings."""
    assert (preflight.ROUTE_RUNSC, preflight.ROUTE_EXEC) == (events.ROUTE_RUNSC, events.ROUTE_EXEC)


def test_a_schema_4_manifest_round_trips_with_the_actors_gpus() -> None:
    assert GPU_MANIFEST.schema == 4
    assert preflight.CheckpointManifest.from_json(GPU_MANIFEST.to_json()) == GPU_MANIFEST


@pytest.mark.parametrize("schema", [2, 3])
def test_schema_2_and_3_manifests_read_with_the_actors_gpus_unknown(schema: int) -> None:
    """Migration: an older image (no actor_gpus) reads back with none, so its restore is
    neither remapped nor memory-checked, as before."""
    raw = json.loads(GPU_MANIFEST.to_json())
    del raw["actor_gpus"]
    if schema == 2:
        del raw["architecture"], raw["runsc_sha256"]
    old = preflight.CheckpointManifest.from_json(json.dumps({**raw, "schema": schema}))
    assert (old.schema, old.actor_gpus) == (schema, ())
    assert preflight.gpu_pairs(old, (C, A)) == ()
    assert preflight.check_gpu_memory(old, (), ()) is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("GPU-a", "'actor_gpus' must be a list"),
        ([{"memory_used_mib": 1}], r"'actor_gpus\[0\].uuid'"),
        ([{"uuid": A, "memory_used_mib": -1}], r"'actor_gpus\[0\].memory_used_mib'"),
        ([{"uuid": A, "memory_used_mib": True}], r"'actor_gpus\[0\].memory_used_mib'"),
    ],
)
def test_bad_actor_gpus_are_named(value: object, problem: str) -> None:
    raw = {**json.loads(GPU_MANIFEST.to_json()), "actor_gpus": value}
    with pytest.raises(preflight.PreflightError, match=problem):
        preflight.CheckpointManifest.from_json(json.dumps(raw))


def test_the_same_gpus_need_no_device_map() -> None:
    pairs = preflight.gpu_pairs(GPU_MANIFEST, (A, B))
    assert pairs == ((A, A), (B, B))
    assert preflight.device_map(pairs) == ""


def test_other_gpus_are_paired_in_order_and_every_one_is_mapped() -> None:
    """The map names every checkpointed GPU (cuda-checkpoint requires it), one kept too."""
    pairs = preflight.gpu_pairs(GPU_MANIFEST, (C, B))
    assert preflight.device_map(pairs) == f"{A}={C},{B}={B}"


def test_fewer_restore_gpus_than_checkpointed_pair_nothing() -> None:
    """(restore-fewer-gpus refuses that case first; nothing half-paired.)"""
    assert preflight.gpu_pairs(GPU_MANIFEST, (C,)) == ()


@pytest.mark.parametrize(
    ("route", "driver", "runsc_fixed", "refused"),
    [
        pytest.param(preflight.ROUTE_EXEC, "580.65.06", True, None, id="exec-580-gvisor-14525"),
        pytest.param(
            preflight.ROUTE_EXEC, "570.133.20", True, "driver 580 or newer", id="exec-570"
        ),
        # The pinned runsc: cuda-checkpoint closed every GPU file, so no remap metadata, and
        # this build creates device files for other GPUs only from that metadata.
        pytest.param(
            preflight.ROUTE_EXEC,
            "580.65.06",
            False,
            "carries only the remap-metadata-gated createRemappedNvproxyDeviceFiles",
            id="exec-580-pinned-runsc",
        ),
        pytest.param(
            preflight.ROUTE_EXEC,
            "580.65.06",
            None,
            "whether it has the fix cannot be told",
            id="exec-580-runsc-unknown",
        ),
        pytest.param(preflight.ROUTE_RUNSC, "580.65.06", True, "without a device map", id="runsc"),
        pytest.param("", "550.90.07", False, None, id="no-cuda-state"),
        # The bound itself, both sides: 580 is the first driver with --device-map.
        pytest.param(preflight.ROUTE_EXEC, "579.99.99", True, "driver 580 or newer", id="exec-579"),
        pytest.param(preflight.ROUTE_EXEC, "580.0", True, None, id="exec-580.0"),
    ],
)
def test_a_remapped_restore_is_refused_where_the_route_cannot_map(
    route, driver, runsc_fixed, refused
) -> None:
    """Each route's remap needs: runsc's route cannot map at all, the exec route needs
    driver 580 and a runsc with google/gvisor#14525 (detected in the binary)."""
    refusal = preflight.check_remap(
        f"{A}={C}", route=route, driver_version=driver, runsc_creates_device_files=runsc_fixed
    )
    if refused is None:
        assert refusal is None
    else:
        assert refusal is not None and refusal.code == "restore-gpu-remap"
        assert refused in refusal.reason and f"{A}={C}" in refusal.reason


def test_the_runsc_refusal_says_what_is_missing_and_what_to_do() -> None:
    """The reason names the PR, the missing device files and the two ways out."""
    refusal = preflight.check_remap(
        f"{A}={C}",
        route=preflight.ROUTE_EXEC,
        driver_version="580.65.06",
        runsc_creates_device_files=False,
    )
    assert refusal is not None
    for words in ("google/gvisor#14525", "no device remap metadata", "/dev/nvidiaN"):
        assert words in refusal.reason
    assert "Restore onto the same GPUs, or upgrade runsc" in refusal.reason


def test_no_remap_is_never_refused() -> None:
    for fixed in (True, False, None):
        assert (
            preflight.check_remap(
                "",
                route=preflight.ROUTE_EXEC,
                driver_version="535.1",
                runsc_creates_device_files=fixed,
            )
            is None
        )


def test_too_little_free_memory_is_refused_naming_the_gpu() -> None:
    pairs = preflight.gpu_pairs(GPU_MANIFEST, (C, B))
    memory = (preflight.GpuMemory(C, 100, 6000), preflight.GpuMemory(B, 0, 0))
    refusal = preflight.check_gpu_memory(GPU_MANIFEST, pairs, memory)
    assert refusal is not None and refusal.code == "restore-gpu-memory"
    assert f"{C} (needs 6144 MiB, 6000 MiB free)" in refusal.reason
    assert B not in refusal.reason  # its use was not recorded: nothing to compare


def test_enough_free_memory_passes() -> None:
    pairs = preflight.gpu_pairs(GPU_MANIFEST, (C, B))
    memory = (preflight.GpuMemory(C, 0, 6144),)
    assert preflight.check_gpu_memory(GPU_MANIFEST, pairs, memory) is None


def test_a_target_gpu_whose_memory_cannot_be_read_is_refused() -> None:
    pairs = preflight.gpu_pairs(GPU_MANIFEST, (C, B))
    refusal = preflight.check_gpu_memory(GPU_MANIFEST, pairs, (preflight.GpuMemory(C, 1, None),))
    assert refusal is not None and "could not be read" in refusal.reason


def test_nvidia_smi_memory_query_is_parsed() -> None:
    # nvidia-smi --query-gpu=uuid,memory.used,memory.free --format=csv,noheader,nounits
    text = f"{A}, 6144, 137000\n{B}, [N/A], [N/A]\n"
    assert preflight.parse_gpu_memory(text) == (
        preflight.GpuMemory(A, 6144, 137000),
        preflight.GpuMemory(B, None, None),
    )


def test_a_memory_line_of_another_shape_is_refused_by_line() -> None:
    with pytest.raises(preflight.PreflightError, match="line 2 is not 'uuid, used, free'"):
        preflight.parse_gpu_memory(f"{A}, 1, 2\nNVIDIA-SMI has failed\n")


def test_nvidia_smi_list_gives_gpu_and_mig_uuids_in_order() -> None:
    listing = (
        f"GPU 0: NVIDIA H200 (UUID: {B})\n"
        f"GPU 1: NVIDIA A100-SXM4-40GB (UUID: {A})\n"
        "  MIG 1g.5gb     Device  0: (UUID: MIG-11111111-2222-3333-4444-555555555555)\n"
    )
    assert preflight.parse_gpu_list(listing) == (
        B,
        A,
        "MIG-11111111-2222-3333-4444-555555555555",
    )


@pytest.mark.anyio
async def test_gpu_memory_is_read_through_nvidia_smi(tmp_path) -> None:
    """The reader runs the query it documents and parses the answer."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\n[ "$*" = "{" ".join(preflight.GPU_MEMORY_QUERY)}" ] || exit 6\n'
                   f'echo "{A}, 10, 20"\n')  # fmt: skip
    smi.chmod(0o755)
    assert await preflight.read_gpu_memory(str(smi)) == (preflight.GpuMemory(A, 10, 20),)


@pytest.mark.anyio
async def test_an_nvidia_smi_that_fails_is_a_preflight_error(tmp_path) -> None:
    with pytest.raises(preflight.PreflightError, match="reading GPU memory"):
        await preflight.read_gpu_memory(str(tmp_path / "absent-nvidia-smi"))


def test_a_manifest_without_actor_gpus_replaced_keeps_the_schema() -> None:
    cpu = dataclasses.replace(GPU_MANIFEST, actor_gpus=())
    assert preflight.CheckpointManifest.from_json(cpu.to_json()).actor_gpus == ()
