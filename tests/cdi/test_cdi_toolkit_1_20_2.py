"""What toolkit 1.20.1 and 1.20.2 add to a spec, read from NVIDIA's own golden outputs at
v1.20.2 and from the real T4 spec brought to 1.20.2's shape (PROVENANCE.md says how)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from substrate_gpu import cdi

GOLDEN = "nvidia-toolkit-tests/v1.20.2__generate_test__default.yaml"
T4_1202 = "derived/DERIVED__kwx4957-T4__ctk-1.20.2-shape.yaml"
T4_UUID = "GPU-8f1f4d06-07fd-27a7-52d5-e58aa060d256"
VOID = "/var/run/nvidia-container-devices/void"


@pytest.fixture
def golden(sample_text: Callable[[str], str]) -> cdi.Spec:
    return cdi.parse_spec(sample_text(GOLDEN))


@pytest.fixture
def t4(sample_text: Callable[[str], str]) -> cdi.Spec:
    return cdi.parse_spec(sample_text(T4_1202))


def test_memory_limits_hook_is_a_createruntime_hook_of_every_gpu_device(golden: cdi.Spec) -> None:
    """1.20.1: each GPU device (index, and `all`) carries apply-cuda-memory-limits at
    createRuntime with --driver-root and its GPU's --gpu-id; the spec level has none."""
    for device in golden.devices:
        (hook,) = device.container_edits.hooks
        assert hook.hook_name == "createRuntime"
        assert hook.args == (
            "nvidia-cdi-hook",
            "apply-cuda-memory-limits",
            "--driver-root",
            "/R",
            "--gpu-id",
            "GPU-00000000-0000-0000-0000-000000000000",
        )
    assert "apply-cuda-memory-limits" not in {h.args[1] for h in golden.container_edits.hooks}


def test_the_void_mount_device_is_a_read_only_bind_of_dev_null(golden: cdi.Spec) -> None:
    """1.20.2: a spec-level /dev/null bind at the legacy runtime's volume-mount device list,
    after every other mount, beside the NVIDIA_VISIBLE_DEVICES=void it already wrote."""
    last = golden.container_edits.mounts[-1]
    assert (last.host_path, last.container_path, last.type) == ("/dev/null", VOID, None)
    assert last.options == ("ro", "nosuid", "nodev", "bind")
    assert "NVIDIA_VISIBLE_DEVICES=void" in golden.container_edits.env


@pytest.mark.parametrize(
    "case", ["default", "disableHooks1", "disableHooks2", "disableHooksAll", "enableChmodHook"]
)
def test_every_v1_20_2_golden_case_holds_the_void_mount(
    case: str, sample_text: Callable[[str], str]
) -> None:
    """The void mount is not a hook: --disable-hook all leaves it in."""
    spec = cdi.parse_spec(sample_text(f"nvidia-toolkit-tests/v1.20.2__generate_test__{case}.yaml"))
    assert VOID in {m.container_path for m in spec.container_edits.mounts}


def test_v1_20_2_differs_from_v1_20_0_only_by_the_memory_hook_and_the_void_mount(
    golden: cdi.Spec, sample_text: Callable[[str], str]
) -> None:
    """Everything else of the default golden spec is as 1.20.0 wrote it."""
    old = cdi.parse_spec(sample_text("nvidia-toolkit-tests/v1.20.0__generate_test__default.yaml"))
    assert golden.container_edits.mounts[:-1] == old.container_edits.mounts
    assert golden.container_edits.hooks == old.container_edits.hooks
    assert golden.container_edits.env == old.container_edits.env
    for new_device, old_device in zip(golden.devices, old.devices, strict=True):
        assert new_device.container_edits.device_nodes == old_device.container_edits.device_nodes
        assert old_device.container_edits.hooks == ()


def test_r615_ucode_firmware_is_mounted_beside_the_gsp_firmware(t4: cdi.Spec) -> None:
    """1.20.1: nvidia/<version>/ucodes*.bin next to gsp*.bin, as ordinary read-only mounts."""
    firmware = [
        m.container_path
        for m in t4.container_edits.mounts
        if m.container_path.startswith("/lib/firmware/nvidia/615.71.09/")
    ]
    assert firmware == [
        "/lib/firmware/nvidia/615.71.09/gsp_ga10x.bin",
        "/lib/firmware/nvidia/615.71.09/gsp_tu10x.bin",
        "/lib/firmware/nvidia/615.71.09/ucodes_tu10x.bin",
    ]


def test_the_t4_spec_of_1_20_2_shape_names_its_gpu_in_the_memory_hook(t4: cdi.Spec) -> None:
    """On the real node the hook's driver root is / and its --gpu-id the T4's UUID."""
    for device in t4.devices:
        hook = device.container_edits.hooks[-1]
        assert hook.hook_name == "createRuntime"
        assert hook.args[1:] == (
            "apply-cuda-memory-limits",
            "--driver-root",
            "/",
            "--gpu-id",
            T4_UUID,
        )
    assert t4.cdi_version == cdi.minimum_required(t4).version == "0.7.0"
