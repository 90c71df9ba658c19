"""Unknown fields: refused for every cdiVersion the parser knows (naming the field and the
known one it resembles); in a spec of a newer cdiVersion recorded, ignored and warned about,
unless strict=True."""

from __future__ import annotations

import json

import pytest

from substrate_gpu import cdi
from substrate_gpu.cdi import versions
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


NEWER = "1.2.0"  # newer than versions.LATEST


def with_unknown(
    where: tuple[str | int, ...], value: object = "x", *, version: str = "0.5.0"
) -> str:
    """KNOWN as JSON with ``futureField: value`` added to the object at ``where``."""
    spec = json.loads(json.dumps(KNOWN))
    spec["cdiVersion"] = version
    node = spec
    for key in where:
        node = node[key]
    node["futureField"] = value
    return json.dumps(spec)


@pytest.mark.parametrize("version", [pytest.param(v, id=v) for v in versions.KNOWN_VERSIONS[4:]])
@pytest.mark.parametrize(("where", "path"), PLACES)
def test_unknown_fields_are_refused_for_a_known_version(
    where: tuple[str | int, ...], path: str, version: str
) -> None:
    """Every known cdiVersion refuses an unknown field, naming it."""
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(with_unknown(where, version=version))
    assert caught.value.field == path
    assert caught.value.problem.startswith("unknown field")


def test_a_typo_for_a_known_field_is_refused_with_the_known_one() -> None:
    """Spec-level ``deviceNode`` (for ``deviceNodes``) is refused, suggesting the field: it
    used to be ignored and the actor got /dev/nvidia0 without nvidiactl and nvidia-uvm."""
    spec = json.loads(json.dumps(KNOWN))
    spec["containerEdits"] = {"deviceNode": [{"path": "/dev/nvidiactl"}]}
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(json.dumps(spec), source="nvidia.json")
    assert caught.value.field == "containerEdits.deviceNode"
    assert "did you mean 'deviceNodes'?" in caught.value.problem
    assert "nvidia.json" in str(caught.value)


@pytest.mark.parametrize(("where", "path"), PLACES)
def test_a_newer_version_records_unknown_fields(where: tuple[str | int, ...], path: str) -> None:
    """A spec of a cdiVersion newer than any known parses; the field's path is recorded and
    the spec carries a warning naming the version and the field."""
    spec = cdi.parse_spec(with_unknown(where, version=NEWER), source="new.json")
    assert spec.ignored_fields == (path,)
    assert spec.devices[0].name == "all"
    assert spec.cdi_version == NEWER
    assert spec.warning is not None
    assert "new.json" in spec.warning
    assert NEWER in spec.warning
    assert path in spec.warning


def test_a_known_version_has_no_warning() -> None:
    """Nothing to warn about in a spec of a known version."""
    assert cdi.parse_spec(json.dumps(KNOWN)).warning is None


@pytest.mark.parametrize(("where", "path"), PLACES)
def test_strict_mode_refuses_a_newer_version(where: tuple[str | int, ...], path: str) -> None:
    """strict=True refuses the newer version itself, as the reference does."""
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(with_unknown(where, version=NEWER), strict=True)
    assert caught.value.field == "cdiVersion"


@pytest.mark.parametrize("version", ["0.9.0", "1.0.1", "1.1", "1.2.0-rc1", "x.y.z"])
def test_a_version_that_is_not_newer_stays_unknown(version: str) -> None:
    """Only a plain MAJOR.MINOR.PATCH above the newest known counts as newer."""
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(with_unknown((), version=version))
    assert caught.value.field == "cdiVersion"
    assert caught.value.problem.startswith("unknown CDI version")


def test_unknown_field_values_are_not_inspected() -> None:
    """Whatever an unknown field holds (nested garbage) is not validated, only recorded."""
    spec = cdi.parse_spec(with_unknown((), {"deep": [None, 1.5, {"x": [True]}]}, version=NEWER))
    assert spec.ignored_fields == ("futureField",)


def test_field_names_match_exactly() -> None:
    """`Path` is not `path` (Go's decoder would fold case; we do not): an unknown field."""
    spec = json.loads(json.dumps(KNOWN))
    node = spec["devices"][0]["containerEdits"]["deviceNodes"][0]
    node["Path"] = node.pop("path")
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(json.dumps(spec))
    assert caught.value.field == "devices[0].containerEdits.deviceNodes[0].Path"
    assert "did you mean 'path'?" in caught.value.problem


def test_every_unknown_field_is_recorded() -> None:
    """Several unknown fields are all reported, an object's own before those of its children."""
    spec = json.loads(with_unknown(("devices", 0, "containerEdits", "mounts", 0), version=NEWER))
    spec["zzz"] = 1
    parsed = cdi.parse_spec(json.dumps(spec))
    assert parsed.ignored_fields == ("zzz", "devices[0].containerEdits.mounts[0].futureField")


def test_unknown_fields_do_not_change_the_result() -> None:
    """The parsed spec, ignored_fields aside, is the one without the unknown field."""
    plain = cdi.parse_spec(json.dumps({**KNOWN, "cdiVersion": NEWER}))
    noisy = cdi.parse_spec(with_unknown(("devices", 0, "containerEdits"), version=NEWER))
    assert noisy.devices == plain.devices
