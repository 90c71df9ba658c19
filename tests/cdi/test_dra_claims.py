"""DRA claim specs (NVIDIA's DRA driver): claim devices are names of the node's GPUs, and a
claim device that carries no ``/dev/nvidia*`` node, or a MIG instance, is refused by name.

The claim specs are tests/data/cdi/derived/DERIVED__dra-claim__* (built from the real T4
spec the way the driver's ``CreateClaimSpecFile`` builds them; PROVENANCE.md)."""

from __future__ import annotations

import json

import pytest
from support import gpu_specs

from substrate_gpu import cdi
from substrate_gpu.exceptions import DeviceRequestError, MigDeviceRefused

DERIVED = gpu_specs.DATA / "derived"
CLAIM_SPEC = DERIVED / "DERIVED__dra-claim__kwx4957-T4__gpu-0.yaml"
FRESH_NODE_CLAIM_SPEC = DERIVED / "DERIVED__dra-claim__kwx4957-T4__gpu-0__no-nvidia-nodes.yaml"
UID = "dab5ab50-d59a-42a6-af16-cfd4628c0f7a"
CLAIM_GPU = f"k8s.gpu.nvidia.com/claim={UID}-gpu-0"


def claim(devices: dict[str, dict]) -> cdi.Spec:
    """A claim spec with the given devices' containerEdits."""
    raw = {
        "cdiVersion": "0.5.0",
        "kind": cdi.DRA_CLAIM_KIND,
        "devices": [{"name": n, "containerEdits": e} for n, e in devices.items()],
    }
    return cdi.parse_spec(json.dumps(raw), source="claim.json")


def test_a_claim_device_is_one_more_name_of_the_workers_gpu() -> None:
    """The claim's gpu-0 holds /dev/nvidia0: the T4's GPU 0, still named by its index."""
    specs = cdi.SpecSet([cdi.load_spec(gpu_specs.T4_SPEC), cdi.load_spec(CLAIM_SPEC)])
    (gpu,) = cdi.list_gpus(specs)
    assert gpu.name == "nvidia.com/gpu=0"
    assert CLAIM_GPU in gpu.names
    assert cdi.refused_devices(specs) == {}


def test_a_claim_spec_alone_lists_its_gpu_by_the_claim_name() -> None:
    """Without the worker's own spec, the claim device is the GPU's only (canonical) name."""
    (gpu,) = cdi.list_gpus(cdi.SpecSet([cdi.load_spec(CLAIM_SPEC)]))
    assert (gpu.name, gpu.node, gpu.index) == (CLAIM_GPU, "/dev/nvidia0", None)


def test_the_claim_device_resolves_to_its_gpu_and_the_common_edits() -> None:
    """Injecting the claim name gives /dev/nvidia0 and the spec-level control nodes."""
    edits = cdi.edits_for_devices(cdi.SpecSet([cdi.load_spec(CLAIM_SPEC)]), [CLAIM_GPU])
    paths = [n.path for n in edits.device_nodes]
    assert "/dev/nvidia0" in paths and "/dev/nvidiactl" in paths


def test_a_fresh_node_claim_without_nvidia_nodes_is_refused_by_name() -> None:
    """DRA driver #1380: the device keeps its /dev/dri nodes but has no /dev/nvidia* one."""
    specs = cdi.SpecSet([cdi.load_spec(FRESH_NODE_CLAIM_SPEC)])
    with pytest.raises(DeviceRequestError, match=rf"device {CLAIM_GPU}: refused because its"):
        cdi.edits_for_devices(specs, [CLAIM_GPU])
    assert cdi.list_gpus(specs) == ()
    (reason,) = cdi.refused_devices(specs).values()
    assert reason.startswith("its edits carry no /dev/nvidia* device node")


def test_a_vfio_passthrough_claim_device_is_refused() -> None:
    """The driver's vfio-bound GPU gets an env-only device: no GPU reaches a gVisor sandbox."""
    specs = cdi.SpecSet(
        [claim({f"{UID}-gpu-vfio-0": {"env": ["NVIDIA_DRA_GPU_VFIO_PASSTHROUGH=0000:00:04.0"]}})]
    )
    with pytest.raises(DeviceRequestError, match="gpu-vfio-0: refused because its edits carry"):
        cdi.edits_for_devices(specs, [f"k8s.gpu.nvidia.com/claim={UID}-gpu-vfio-0"])


def test_a_claims_mig_device_is_refused_by_its_name() -> None:
    """``<uid>-gpu-N-mig-<profile>-<start>-<size>`` is MIG even when only its parent's
    node is listed (the capability nodes are added separately by the driver)."""
    name = f"{UID}-gpu-0-mig-9-4-4"
    specs = cdi.SpecSet([claim({name: {"deviceNodes": [{"path": "/dev/nvidia0"}]}})])
    with pytest.raises(MigDeviceRefused, match="is a MIG device name"):
        cdi.edits_for_devices(specs, [f"k8s.gpu.nvidia.com/claim={name}"])
    assert cdi.refused_devices(specs) == {
        f"k8s.gpu.nvidia.com/claim={name}": f"its name {name!r} is a MIG device name"
    }


def test_other_vendors_devices_need_no_nvidia_node() -> None:
    """The /dev/nvidia* rule is for NVIDIA kinds only."""
    raw = {
        "cdiVersion": "0.5.0",
        "kind": "example.com/nic",
        "devices": [{"name": "x", "containerEdits": {"deviceNodes": [{"path": "/dev/x"}]}}],
    }
    specs = cdi.SpecSet([cdi.parse_spec(json.dumps(raw), source="nic.json")])
    assert [n.path for n in cdi.edits_for_devices(specs, ["example.com/nic=x"]).device_nodes] == [
        "/dev/x"
    ]
