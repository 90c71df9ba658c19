"""edits_for_all: spec-level edits plus the device named `all`, and nothing else."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable

import pytest

from substrate_gpu import cdi
from substrate_gpu.exceptions import CdiSpecError

T4_YAML = "real-world/kwx4957-study__ctk-1.20.0__drv-615.71.09__rocky9-T4.yaml"


def spec_with(devices: list[dict[str, object]], **spec_edits: object) -> cdi.Spec:
    """A spec of ``devices`` (each a name and its containerEdits) and spec-level edits."""
    raw: dict[str, object] = {
        "cdiVersion": "0.7.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
    }
    if spec_edits:
        raw["containerEdits"] = spec_edits
    return cdi.parse_spec(json.dumps(raw), source="t.json")


def test_t4_spec_merges_spec_level_and_all_only(sample_text: Callable[[str], str]) -> None:
    """Real T4 spec: 3 control nodes + the 3 nodes of `all`, each once; spec hooks, then `all`'s."""
    spec = cdi.parse_spec(sample_text(T4_YAML))
    edits = cdi.edits_for_all(spec)
    assert [n.path for n in edits.device_nodes] == [
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidiactl",
        "/dev/nvidia0",
        "/dev/dri/card0",
        "/dev/dri/renderD128",
    ]
    assert len(edits.mounts) == 50
    assert len(edits.hooks) == 7
    assert edits.hooks[-1].args[1] == "create-symlinks"
    assert edits.env == spec.container_edits.env
    assert edits.additional_gids == (39,)


def test_per_index_and_uuid_devices_are_excluded() -> None:
    """Nodes only `0` or `GPU-…` carry never reach the merged edits."""
    spec = spec_with(
        [
            {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/only-index"}]}},
            {"name": "GPU-1234", "containerEdits": {"env": ["ONLY_UUID=1"]}},
            {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
            {
                "name": "gpu0",
                "containerEdits": {"mounts": [{"hostPath": "/m", "containerPath": "/m"}]},
            },
        ],
        env=["SPEC=1"],
    )
    edits = cdi.edits_for_all(spec)
    assert [n.path for n in edits.device_nodes] == ["/dev/nvidia0"]
    assert edits.env == ("SPEC=1",)
    assert edits.mounts == ()


def test_spec_level_edits_come_first() -> None:
    """Order is spec-level, then `all` (env order matters: a later entry wins in OCI)."""
    spec = spec_with(
        [
            {
                "name": "all",
                "containerEdits": {"env": ["A=device"], "deviceNodes": [{"path": "/dev/b"}]},
            }
        ],
        env=["A=spec"],
        deviceNodes=[{"path": "/dev/a"}],
    )
    edits = cdi.edits_for_all(spec)
    assert edits.env == ("A=spec", "A=device")
    assert [n.path for n in edits.device_nodes] == ["/dev/a", "/dev/b"]


def test_the_parsed_spec_is_not_mutated(sample_text: Callable[[str], str]) -> None:
    """Merging builds new values: the spec compares equal to an untouched copy afterwards."""
    spec = cdi.parse_spec(sample_text(T4_YAML))
    before = copy.deepcopy(spec)
    first = cdi.edits_for_all(spec)
    second = cdi.edits_for_all(spec)
    assert spec == before
    assert first == second
    assert first is not spec.container_edits


@pytest.mark.parametrize(
    "attack",
    [
        pytest.param(lambda s: setattr(s, "devices", ()), id="spec-field"),
        pytest.param(lambda s: setattr(s.container_edits, "env", ()), id="edits-field"),
        pytest.param(lambda s: setattr(s.devices[0], "name", "x"), id="device-field"),
    ],
)
def test_parsed_values_are_frozen(attack: Callable[[cdi.Spec], None]) -> None:
    """Every parsed value is a frozen dataclass holding tuples: callers cannot mutate it."""
    spec = spec_with([{"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/a"}]}}])
    with pytest.raises(dataclasses.FrozenInstanceError):
        attack(spec)
    assert isinstance(spec.devices, tuple)
    assert isinstance(spec.devices[0].container_edits.device_nodes, tuple)


def test_a_spec_without_all_is_an_error_listing_the_devices() -> None:
    """No `all` device: CdiSpecError on `devices`, naming the devices that exist."""
    spec = spec_with(
        [
            {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
            {"name": "GPU-1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
        ]
    )
    with pytest.raises(CdiSpecError) as caught:
        cdi.edits_for_all(spec)
    assert (caught.value.source, caught.value.field) == ("t.json", "devices")
    assert "no device named 'all' (devices: '0', 'GPU-1')" in caught.value.problem


def test_the_imex_spec_has_no_all_device(sample_text: Callable[[str], str]) -> None:
    """Real data: the IMEX-channel spec (per-channel devices only) is refused for `all`."""
    spec = cdi.parse_spec(sample_text("nvidia-toolkit-tests/v1.20.0__lib-imex_test__0.yaml"))
    with pytest.raises(CdiSpecError, match=r"devices: '0', '1', '2047'"):
        cdi.edits_for_all(spec)


def test_edits_without_device_nodes_are_an_error() -> None:
    """`all` and the spec level resolving no device node would inject no GPU: an error."""
    spec = spec_with(
        [
            {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
            {"name": "all", "containerEdits": {"env": ["A=1"]}},
        ],
        mounts=[{"hostPath": "/lib/x.so", "containerPath": "/lib/x.so"}],
    )
    with pytest.raises(CdiSpecError) as caught:
        cdi.edits_for_all(spec)
    assert caught.value.field == "devices[1].containerEdits.deviceNodes"
    assert "no GPU would reach the container" in caught.value.problem


def test_device_nodes_at_spec_level_only_are_enough() -> None:
    """Nodes may come from the spec level alone (the `all` device adds only env here)."""
    spec = spec_with(
        [{"name": "all", "containerEdits": {"env": ["A=1"]}}], deviceNodes=[{"path": "/dev/a"}]
    )
    assert [n.path for n in cdi.edits_for_all(spec).device_nodes] == ["/dev/a"]
