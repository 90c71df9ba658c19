"""Unknown fields: recorded and ignored by default (node mode), refused with strict=True."""

from __future__ import annotations

import json

import pytest

from substrate_gpu import cdi
from substrate_gpu.exceptions import CdiSpecError

KNOWN = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [
        {
            "name": "all",
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidia0"}],
                "mounts": [{"hostPath": "/a", "containerPath": "/a"}],
                "hooks": [{"hookName": "createContainer", "path": "/bin/h"}],
            },
        }
    ],
}

PLACES = [
    pytest.param((), "futureField", id="top-level"),
    pytest.param(("devices", 0), "devices[0].futureField", id="device"),
    pytest.param(
        ("devices", 0, "containerEdits"), "devices[0].containerEdits.futureField", id="edits"
    ),
    pytest.param(
        ("devices", 0, "containerEdits", "deviceNodes", 0),
        "devices[0].containerEdits.deviceNodes[0].futureField",
        id="device-node",
    ),
    pytest.param(
        ("devices", 0, "containerEdits", "mounts", 0),
        "devices[0].containerEdits.mounts[0].futureField",
        id="mount",
    ),
    pytest.param(
        ("devices", 0, "containerEdits", "hooks", 0),
        "devices[0].containerEdits.hooks[0].futureField",
        id="hook",
    ),
]


def with_unknown(where: tuple[str | int, ...], value: object = "x") -> str:
    """KNOWN as JSON with ``futureField: value`` added to the object at ``where``."""
    spec = json.loads(json.dumps(KNOWN))
    node = spec
    for key in where:
        node = node[key]
    node["futureField"] = value
    return json.dumps(spec)


@pytest.mark.parametrize(("where", "path"), PLACES)
def test_node_mode_records_unknown_fields(where: tuple[str | int, ...], path: str) -> None:
    """By default the spec parses and the unknown field's path is in ignored_fields."""
    spec = cdi.parse_spec(with_unknown(where))
    assert spec.ignored_fields == (path,)
    assert spec.devices[0].name == "all"


@pytest.mark.parametrize(("where", "path"), PLACES)
def test_strict_mode_refuses_unknown_fields(where: tuple[str | int, ...], path: str) -> None:
    """strict=True refuses the same spec, naming the unknown field."""
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(with_unknown(where), strict=True)
    assert caught.value.field == path
    assert caught.value.problem.startswith("unknown field")


def test_unknown_field_values_are_not_inspected() -> None:
    """Whatever an unknown field holds (nested garbage) is not validated, only recorded."""
    spec = cdi.parse_spec(with_unknown((), {"deep": [None, 1.5, {"x": [True]}]}))
    assert spec.ignored_fields == ("futureField",)


def test_field_names_match_exactly() -> None:
    """`Path` is not `path` (Go's decoder would fold case; we do not): unknown, then missing."""
    spec = json.loads(json.dumps(KNOWN))
    node = spec["devices"][0]["containerEdits"]["deviceNodes"][0]
    node["Path"] = node.pop("path")
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(json.dumps(spec))
    assert caught.value.field == "devices[0].containerEdits.deviceNodes[0].path"
    assert caught.value.problem == "missing"


def test_every_unknown_field_is_recorded() -> None:
    """Several unknown fields are all reported, an object's own before those of its children."""
    spec = json.loads(with_unknown(("devices", 0, "containerEdits", "mounts", 0)))
    spec["zzz"] = 1
    parsed = cdi.parse_spec(json.dumps(spec))
    assert parsed.ignored_fields == ("zzz", "devices[0].containerEdits.mounts[0].futureField")


def test_unknown_fields_do_not_change_the_result() -> None:
    """The parsed spec, ignored_fields aside, is the one without the unknown field."""
    plain = cdi.parse_spec(json.dumps(KNOWN))
    noisy = cdi.parse_spec(with_unknown(("devices", 0, "containerEdits")))
    assert noisy.devices == plain.devices
