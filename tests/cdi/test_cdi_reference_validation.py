"""The CDI reference library's container-edits validation table, ported case by case.

Source: cncf-tags/container-device-interface, pkg/cdi/container-edits_test.go
(``TestValidateContainerEdits``) and the netDevices / intelRdt rules of specs-go 1.1.0. Each
case puts one ``containerEdits`` at the spec level of an otherwise valid spec; ``None`` as
the expected field means the reference accepts it, so must we.

:data:`V112_CASES` are the rows the library's v1.1.2 tag (2026-11-12, module
``tags.cncf.io/container-device-interface@v1.1.2``, ``h1:H4rcA/836s+J7JjTbwOj2khB4YP95HHaZrRThT+QAVg=``)
has beyond the v1.1.0 table: ``permissions: "none"`` (``NoPermissions``, since v1.1.1),
negative device numbers and ``null`` entries refused; ``""`` is the default ``rwm``
(``TestApplyContainerEdits``' "explicitly empty" / "omitted permissions" rows, applied in
tests/injection/test_reference_edits.py).
"""

from __future__ import annotations

import json

import pytest

from substrate_gpu import cdi
from substrate_gpu.exceptions import CdiSpecError


def spec_with_edits(edits: dict[str, object], version: str) -> str:
    return json.dumps(
        {
            "cdiVersion": version,
            "kind": "vendor.com/device",
            "devices": [{"name": "d", "containerEdits": {"deviceNodes": [{"path": "/dev/d"}]}}],
            "containerEdits": edits,
        }
    )


V110 = "1.1.0"
V070 = "0.7.0"  # intelRdt enableCMT/enableMBM exist only before 1.1.0

CASES = [
    pytest.param({}, V110, None, id="valid-empty-edits"),
    pytest.param({"env": ["BAR=BARVALUE1"]}, V110, None, id="valid-env"),
    pytest.param({"env": [""]}, V110, "containerEdits.env[0]", id="invalid-env-empty"),
    pytest.param({"env": ["=BAR"]}, V110, "containerEdits.env[0]", id="invalid-env-no-name"),
    pytest.param({"env": ["BAR"]}, V110, "containerEdits.env[0]", id="invalid-env-no-assignment"),
    pytest.param({"deviceNodes": [{"path": "/dev/null"}]}, V110, None, id="valid-device-path-only"),
    pytest.param(
        {"deviceNodes": [{"path": "/dev/null", "hostPath": "/dev/null"}]},
        V110,
        None,
        id="valid-device-host-path",
    ),
    pytest.param(
        {"deviceNodes": [{"path": "/dev/null", "type": "c"}]}, V110, None, id="valid-device-type"
    ),
    pytest.param(
        {"deviceNodes": [{"path": "/dev/null", "type": "c", "permissions": "rwm"}]},
        V110,
        None,
        id="valid-device-permissions",
    ),
    pytest.param(
        {"deviceNodes": [{"path": ""}]},
        V110,
        "containerEdits.deviceNodes[0].path",
        id="invalid-device-empty-path",
    ),
    pytest.param(
        {"deviceNodes": [{"path": "/dev/null", "type": "f"}]},
        V110,
        "containerEdits.deviceNodes[0].type",
        id="invalid-device-type",
    ),
    pytest.param(
        {"deviceNodes": [{"path": "/dev/null", "permissions": "to land"}]},
        V110,
        "containerEdits.deviceNodes[0].permissions",
        id="invalid-device-permissions",
    ),
    pytest.param(
        {"mounts": [{"hostPath": "/dev/sda2", "containerPath": "/mnt/data"}]},
        V110,
        None,
        id="valid-mount",
    ),
    pytest.param(
        {"mounts": [{"hostPath": "", "containerPath": "/mnt/data"}]},
        V110,
        "containerEdits.mounts[0].hostPath",
        id="invalid-mount-empty-host-path",
    ),
    pytest.param(
        {"mounts": [{"hostPath": "/dev/sda2", "containerPath": ""}]},
        V110,
        "containerEdits.mounts[0].containerPath",
        id="invalid-mount-empty-container-path",
    ),
    pytest.param(
        {
            "hooks": [
                {
                    "hookName": "prestart",
                    "path": "/usr/local/bin/prestart-vendor-hook",
                    "args": ["--verbose"],
                    "env": ["HOOK_ENV=PRESTART"],
                }
            ]
        },
        V110,
        None,
        id="valid-hook",
    ),
    pytest.param(
        {"hooks": [{"hookName": "prestart", "path": ""}]},
        V110,
        "containerEdits.hooks[0].path",
        id="invalid-hook-empty-path",
    ),
    pytest.param(
        {"hooks": [{"hookName": "misCreateContainer", "path": "/usr/local/bin/hook"}]},
        V110,
        "containerEdits.hooks[0].hookName",
        id="invalid-hook-name",
    ),
    pytest.param(
        {"hooks": [{"hookName": "prestart", "path": "/usr/local/bin/hook", "env": ["=NO_NAME"]}]},
        V110,
        "containerEdits.hooks[0].env[0]",
        id="invalid-hook-env",
    ),
    pytest.param(
        {
            "intelRdt": {
                "closID": "foo.bar",
                "l3CacheSchema": "L3:0=ff",
                "memBwSchema": "MB:0=50",
                "enableCMT": True,
                "enableMBM": True,
            }
        },
        V070,
        None,
        id="valid-rdt-0.7",
    ),
    pytest.param(
        {"intelRdt": {"closID": "foo", "schemata": ["L3:0=ff"], "enableMonitoring": True}},
        V110,
        None,
        id="valid-rdt-1.1",
    ),
    # "/" names the root CLOS: valid although it is not a file name.
    pytest.param({"intelRdt": {"closID": "/"}}, V110, None, id="valid-rdt-root-clos"),
    pytest.param(
        {"intelRdt": {"closID": "foo/bar"}},
        V110,
        "containerEdits.intelRdt.closID",
        id="invalid-rdt-slash",
    ),
    pytest.param(
        {"intelRdt": {"closID": "."}}, V110, "containerEdits.intelRdt.closID", id="invalid-rdt-dot"
    ),
    pytest.param(
        {"intelRdt": {"closID": ".."}},
        V110,
        "containerEdits.intelRdt.closID",
        id="invalid-rdt-dotdot",
    ),
    pytest.param(
        {"intelRdt": {"closID": "foo\nbar"}},
        V110,
        "containerEdits.intelRdt.closID",
        id="invalid-rdt-newline",
    ),
    pytest.param(
        {"intelRdt": {"closID": "x" * 4096}},
        V110,
        "containerEdits.intelRdt.closID",
        id="invalid-rdt-too-long",
    ),
    pytest.param({"additionalGids": [5, 7]}, V110, None, id="valid-additional-gids"),
    # GID 0 is valid in a spec; it is skipped when applied (see the injection tests).
    pytest.param({"additionalGids": [0]}, V110, None, id="valid-additional-gid-zero"),
    pytest.param(
        {
            "netDevices": [
                {"hostInterfaceName": "eth0", "name": "net0"},
                {"hostInterfaceName": "eth1", "name": "net1"},
            ]
        },
        V110,
        None,
        id="valid-net-devices",
    ),
    pytest.param(
        {"netDevices": [{"hostInterfaceName": "", "name": "net0"}]},
        V110,
        "containerEdits.netDevices[0].hostInterfaceName",
        id="invalid-net-device-empty-host-interface",
    ),
    pytest.param(
        {"netDevices": [{"hostInterfaceName": "eth0", "name": ""}]},
        V110,
        "containerEdits.netDevices[0].name",
        id="invalid-net-device-empty-name",
    ),
    pytest.param(
        {
            "netDevices": [
                {"hostInterfaceName": "eth0", "name": "net0"},
                {"hostInterfaceName": "eth0", "name": "net1"},
            ]
        },
        V110,
        "containerEdits.netDevices[1].hostInterfaceName",
        id="invalid-net-devices-same-host-interface",
    ),
    pytest.param(
        {
            "netDevices": [
                {"hostInterfaceName": "eth0", "name": "net0"},
                {"hostInterfaceName": "eth1", "name": "net0"},
            ]
        },
        V110,
        "containerEdits.netDevices[1].name",
        id="invalid-net-devices-same-name",
    ),
]


V112_CASES = [
    pytest.param(
        {"deviceNodes": [{"path": "/dev/vendorctl", "type": "b", "permissions": "none"}]},
        V110,
        None,
        id="valid-device-no-permissions",
    ),
    pytest.param(
        {"deviceNodes": [{"path": "/dev/nil", "type": "c", "permissions": ""}]},
        V110,
        None,
        id="valid-device-empty-permissions",
    ),
    pytest.param(
        {"deviceNodes": [{"path": "/dev/foo", "type": "c", "major": -1, "minor": 3}]},
        V110,
        "containerEdits.deviceNodes[0].major",
        id="invalid-device-negative-major",
    ),
    pytest.param(
        {"deviceNodes": [{"path": "/dev/foo", "type": "c", "major": 1, "minor": -1}]},
        V110,
        "containerEdits.deviceNodes[0].minor",
        id="invalid-device-negative-minor",
    ),
    pytest.param(
        {"deviceNodes": [None]}, V110, "containerEdits.deviceNodes[0]", id="invalid-device-nil"
    ),
    pytest.param(
        {"netDevices": [None]}, V110, "containerEdits.netDevices[0]", id="invalid-net-device-nil"
    ),
    pytest.param({"hooks": [None]}, V110, "containerEdits.hooks[0]", id="invalid-hook-nil"),
    pytest.param({"mounts": [None]}, V110, "containerEdits.mounts[0]", id="invalid-mount-nil"),
]


@pytest.mark.parametrize(("edits", "version", "field"), CASES + V112_CASES)
def test_reference_validation_case(
    edits: dict[str, object], version: str, field: str | None
) -> None:
    """We accept what the reference accepts and refuse, at the same field, what it refuses."""
    text = spec_with_edits(edits, version)
    if field is None:
        assert cdi.parse_spec(text).cdi_version == version
        return
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(text)
    assert caught.value.field == field


def test_duplicate_net_device_error_names_the_other_entry() -> None:
    """The duplicate's error points back at the first entry using the same interface."""
    edits = {
        "netDevices": [
            {"hostInterfaceName": "eth0", "name": "a"},
            {"hostInterfaceName": "eth0", "name": "b"},
        ]
    }
    with pytest.raises(
        CdiSpecError,
        match=r"duplicate hostInterfaceName 'eth0' \(also containerEdits.netDevices\[0\]\)",
    ):
        cdi.parse_spec(spec_with_edits(edits, V110))


@pytest.mark.parametrize(
    ("permissions", "expected"),
    [
        pytest.param("none", "none", id="none-kept"),
        pytest.param("", None, id="empty-is-the-default"),
        pytest.param("rw", "rw", id="subset"),
    ],
)
def test_permissions_read_as_the_reference(permissions: str, expected: str | None) -> None:
    """``"none"`` survives parsing; ``""`` reads as omitted (the default ``rwm``)."""
    edits = {"deviceNodes": [{"path": "/dev/x", "type": "c", "permissions": permissions}]}
    spec = cdi.parse_spec(spec_with_edits(edits, V110))
    assert spec.container_edits.device_nodes[0].permissions == expected


@pytest.mark.parametrize("permissions", ["nonE", "rnone", "none ", "all"])
def test_only_the_exact_word_none_means_no_access(permissions: str) -> None:
    """Anything else outside ``rwm`` is refused, naming both accepted forms."""
    edits = {"deviceNodes": [{"path": "/dev/x", "permissions": permissions}]}
    with pytest.raises(CdiSpecError, match="combination of r, w and m, nor 'none'"):
        cdi.parse_spec(spec_with_edits(edits, V110))


def test_a_negative_device_number_names_the_wildcard_it_would_make() -> None:
    """The refusal says why a negative number is dangerous, not only that it is small."""
    edits = {"deviceNodes": [{"path": "/dev/x", "type": "c", "major": -1}]}
    with pytest.raises(CdiSpecError, match="negative device number.*wildcard"):
        cdi.parse_spec(spec_with_edits(edits, V110))
