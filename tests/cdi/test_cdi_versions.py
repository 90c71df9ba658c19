"""cdiVersion must be a known version and at least what the spec's content needs (as upstream)."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from substrate_gpu import cdi
from substrate_gpu.cdi import versions
from substrate_gpu.exceptions import CdiSpecError


def spec_text(version: str, *, device: Mapping[str, object] | None = None, **top: object) -> str:
    """A minimal spec at ``version``; ``device`` entries and ``top`` fields are merged in."""
    edits: dict[str, object] = {"deviceNodes": [{"path": "/dev/card0"}]}
    dev: dict[str, object] = {"name": "all", "containerEdits": edits}
    for key, value in (device or {}).items():
        if key in ("name", "annotations"):
            dev[key] = value
        else:
            edits[key] = value
    spec: dict[str, object] = {"cdiVersion": version, "kind": "vendor.com/device", "devices": [dev]}
    spec.update(top)
    return json.dumps(spec)


def test_known_versions_match_upstream() -> None:
    """The list is upstream's validSpecVersions (specs-go/version.go, spec 1.1.0)."""
    assert versions.KNOWN_VERSIONS == (
        "0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
    )  # fmt: skip
    assert (versions.EARLIEST, versions.LATEST) == ("0.3.0", "1.1.0")


@pytest.mark.parametrize("version", [pytest.param(v, id=v) for v in versions.KNOWN_VERSIONS[2:]])
def test_every_supported_version_accepts_a_plain_spec(version: str) -> None:
    """A spec using no versioned feature is valid at every version from 0.3.0 on."""
    assert cdi.parse_spec(spec_text(version)).cdi_version == version


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_versions_below_the_earliest_are_refused(version: str) -> None:
    """0.1.0/0.2.0 are known upstream but below vEarliest (0.3.0), so it always refuses them."""
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(spec_text(version))
    assert caught.value.field == "cdiVersion"
    assert caught.value.problem == (
        f"{version} is older than 0.3.0, the earliest version the CDI reference library accepts"
    )


def test_a_leading_v_is_accepted_and_dropped() -> None:
    """Upstream's newVersion trims one leading `v`: `v0.5.0` is 0.5.0."""
    assert cdi.parse_spec(spec_text("v0.5.0")).cdi_version == "0.5.0"


@pytest.mark.parametrize(
    ("version", "strict"),
    [
        pytest.param("0.9.0", False, id="between-releases"),
        # A newer version is read (its unknown fields ignored, see test_cdi_unknown_fields)
        # except in strict mode, which refuses it as the reference does.
        pytest.param("1.2.0", True, id="future-strict"),
        pytest.param("0.5", False, id="two-parts"),
        pytest.param("vv0.5.0", False, id="two-vs"),
        pytest.param(" 0.5.0", False, id="space"),
        pytest.param("", False, id="empty"),
    ],
)
def test_unknown_versions_are_refused(version: str, strict: bool) -> None:
    """Only released versions are accepted; the error lists them."""
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(spec_text(version), strict=strict)
    assert caught.value.field == "cdiVersion"
    assert caught.value.problem.startswith(f"unknown CDI version {version!r} (known: 0.1.0, ")


MOUNT = {"hostPath": "/a", "containerPath": "/a"}
RULES = [
    # (what, spec_text kwargs, minimum, field the error names)
    pytest.param(
        {"device": {"mounts": [{**MOUNT, "type": "bind"}]}},
        "0.4.0",
        "devices[0].containerEdits.mounts[0].type",
        id="mount-type",
    ),
    pytest.param(
        {"device": {"deviceNodes": [{"path": "/dev/x", "hostPath": "/h/x"}]}},
        "0.5.0",
        "devices[0].containerEdits.deviceNodes[0].hostPath",
        id="node-hostPath",
    ),
    pytest.param(
        {"device": {"name": "0"}}, "0.5.0", "devices[0].name", id="name-starts-with-digit"
    ),
    pytest.param({"annotations": {"a": "b"}}, "0.6.0", "annotations", id="spec-annotations"),
    pytest.param(
        {"device": {"annotations": {"a": "b"}}},
        "0.6.0",
        "devices[0].annotations",
        id="device-annotations",
    ),
    pytest.param({"kind": "vendor.com/dev.ice"}, "0.6.0", "kind", id="dot-in-class"),
    pytest.param(
        {"device": {"additionalGids": [39]}},
        "0.7.0",
        "devices[0].containerEdits.additionalGids",
        id="device-additionalGids",
    ),
    pytest.param(
        {"containerEdits": {"additionalGids": [39]}},
        "0.7.0",
        "containerEdits.additionalGids",
        id="spec-additionalGids",
    ),
    pytest.param(
        {"device": {"intelRdt": {"closID": "c"}}},
        "0.7.0",
        "devices[0].containerEdits.intelRdt",
        id="intelRdt",
    ),
    pytest.param(
        {"device": {"netDevices": [{"hostInterfaceName": "eth1", "name": "net1"}]}},
        "1.1.0",
        "devices[0].containerEdits.netDevices",
        id="netDevices",
    ),
    pytest.param(
        {"containerEdits": {"intelRdt": {"schemata": ["L3:0=f"]}}},
        "1.1.0",
        "containerEdits.intelRdt.schemata",
        id="intelRdt-schemata",
    ),
    pytest.param(
        {"device": {"intelRdt": {"enableMonitoring": True}}},
        "1.1.0",
        "devices[0].containerEdits.intelRdt.enableMonitoring",
        id="intelRdt-enableMonitoring",
    ),
]


@pytest.mark.parametrize(("parts", "minimum", "field"), RULES)
def test_minimum_required_version(parts: dict[str, object], minimum: str, field: str) -> None:
    """Each upstream rule: the minimum is computed, accepted at the minimum, refused below it."""
    spec = cdi.parse_spec(spec_text(minimum, **parts))  # type: ignore[arg-type]
    required = cdi.minimum_required(spec)
    assert (required.version, required.field) == (minimum, field)
    below = versions.KNOWN_VERSIONS[versions.KNOWN_VERSIONS.index(minimum) - 1]
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(spec_text(below, **parts))  # type: ignore[arg-type]
    assert caught.value.field in ("cdiVersion", field)
    if caught.value.field == "cdiVersion":
        assert caught.value.problem.startswith(f"{below} is too old for this spec: {field} (")
        assert caught.value.problem.endswith(f"needs at least {minimum}")
    else:  # presence rules of ValidateVersionContents name the field itself
        assert caught.value.problem == "requires CDI spec version at least 1.1.0"


def test_a_plain_spec_needs_the_earliest_version() -> None:
    """Nothing versioned: the minimum is 0.3.0 and no field is named."""
    required = cdi.minimum_required(cdi.parse_spec(spec_text("0.3.0")))
    assert (required.version, required.field) == ("0.3.0", "")


def test_the_highest_rule_wins() -> None:
    """With 0.5.0 and 0.7.0 features present the minimum is 0.7.0."""
    text = spec_text("0.7.0", device={"name": "0", "additionalGids": [1]})
    assert cdi.minimum_required(cdi.parse_spec(text)).version == "0.7.0"


@pytest.mark.parametrize("field", ["enableCMT", "enableMBM"])
def test_removed_intel_rdt_fields_are_refused_from_1_1_0(field: str) -> None:
    """enableCMT/enableMBM exist in 0.7.0–1.0.x only (upstream validateVersionedIntelRdt)."""
    rdt = {"intelRdt": {field: True}}
    assert cdi.parse_spec(spec_text("1.0.0", device=rdt)).devices[0].container_edits.intel_rdt
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(spec_text("1.1.0", device=rdt))
    assert caught.value.field == f"devices[0].containerEdits.intelRdt.{field}"
    assert "not valid for CDI spec version 1.1.0" in caught.value.problem


def test_an_empty_net_devices_list_still_needs_1_1_0() -> None:
    """Upstream checks the key's presence in the raw content, not only a non-empty list."""
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(spec_text("1.0.0", containerEdits={"netDevices": []}))
    assert caught.value.field == "containerEdits.netDevices"
