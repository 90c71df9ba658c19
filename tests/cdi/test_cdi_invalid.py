"""Invalid specs are refused with one CdiSpecError naming the file, the field and the problem."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from substrate_gpu import cdi
from substrate_gpu.exceptions import CdiSpecError

DATA = Path(__file__).resolve().parent.parent / "data" / "cdi"


def base() -> dict[str, object]:
    """A small valid spec every case below breaks in exactly one place."""
    return {
        "cdiVersion": "0.7.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {
                "name": "all",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/nvidia0", "major": 195, "permissions": "rwm"}],
                },
            }
        ],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": "/dev/nvidiactl"}],
            "mounts": [
                {
                    "hostPath": "/usr/lib64/libcuda.so.1",
                    "containerPath": "/usr/lib64/libcuda.so.1",
                    "options": ["ro", "nosuid", "nodev", "bind"],
                }
            ],
            "hooks": [
                {
                    "hookName": "createContainer",
                    "path": "/usr/bin/nvidia-cdi-hook",
                    "args": ["nvidia-cdi-hook", "create-symlinks"],
                }
            ],
        },
    }


_DELETE = object()


def mutated(path: str, value: object) -> str:
    """``base()`` as JSON with the dotted ``path`` (``a.b[0].c``) set to ``value`` (or deleted)."""
    spec: object = base()
    keys: list[str | int] = []
    for part in path.split("."):
        name, _, rest = part.partition("[")
        keys.append(name)
        keys.extend(int(index) for index in rest.rstrip("]").split("][") if index)
    target = copy.deepcopy(spec)
    node = target
    for key in keys[:-1]:
        node = node[key]  # type: ignore[index]
    if value is _DELETE:
        del node[keys[-1]]  # type: ignore[attr-defined]
    else:
        node[keys[-1]] = value  # type: ignore[index]
    return json.dumps(target)


def test_the_base_spec_is_valid() -> None:
    """The starting point of every case is itself accepted."""
    assert cdi.parse_spec(json.dumps(base())).devices[0].name == "all"


DEV0 = "devices[0].containerEdits"
CASES = [
    # --- header
    pytest.param("cdiVersion", _DELETE, "cdiVersion", "missing", id="version-missing"),
    pytest.param(
        "cdiVersion", 0.7, "cdiVersion", "expected a string, got a float", id="version-float"
    ),
    pytest.param(
        "cdiVersion", "0.9.0", "cdiVersion", "unknown CDI version '0.9.0'", id="version-unknown"
    ),
    pytest.param("kind", _DELETE, "kind", "missing", id="kind-missing"),
    pytest.param(
        "kind", "nvidia.com", "kind", "is not of the form vendor/class", id="kind-no-slash"
    ),
    pytest.param("kind", "/gpu", "kind", "is not of the form vendor/class", id="kind-empty-vendor"),
    pytest.param(
        "kind", "nvidia.com/", "kind", "is not of the form vendor/class", id="kind-empty-class"
    ),
    pytest.param(
        "kind",
        "1nvidia.com/gpu",
        "kind",
        "invalid vendor '1nvidia.com'",
        id="vendor-starts-with-digit",
    ),
    pytest.param("kind", "nvidia.com-/gpu", "kind", "invalid vendor", id="vendor-ends-with-dash"),
    pytest.param(
        "kind", "nvidia.com/gpu/x", "kind", "invalid class 'gpu/x'", id="class-with-slash"
    ),
    pytest.param("kind", "nvidia.com/gpü", "kind", "invalid class", id="class-not-ascii"),
    pytest.param(
        "annotations", ["a"], "annotations", "expected a mapping, got a list", id="annotations-list"
    ),
    pytest.param(
        "annotations",
        {"a": 1},
        "annotations.a",
        "expected a string, got an integer",
        id="annotation-int",
    ),
    # --- devices
    pytest.param("devices", _DELETE, "devices", "the spec has no devices", id="devices-missing"),
    pytest.param("devices", [], "devices", "the spec has no devices", id="devices-empty"),
    pytest.param(
        "devices",
        {"name": "all"},
        "devices",
        "expected a list, got a mapping",
        id="devices-mapping",
    ),
    pytest.param(
        "devices[0]", "all", "devices[0]", "expected a mapping, got a string", id="device-string"
    ),
    pytest.param(
        "devices[0].name", _DELETE, "devices[0].name", "missing", id="device-name-missing"
    ),
    pytest.param(
        "devices[0].name",
        0,
        "devices[0].name",
        "expected a string, got an integer",
        id="device-name-int",
    ),
    pytest.param(
        "devices[0].name", "", "devices[0].name", "is not a device name", id="device-name-empty"
    ),
    pytest.param(
        "devices[0].name",
        "gpu/0",
        "devices[0].name",
        "'gpu/0' is not a device name",
        id="device-name-slash",
    ),
    pytest.param(
        "devices[0].name",
        "gpu-",
        "devices[0].name",
        "is not a device name",
        id="device-name-ends-dash",
    ),
    pytest.param(
        "devices[0].containerEdits",
        _DELETE,
        DEV0,
        "device 'all' has no container edits",
        id="device-no-edits",
    ),
    pytest.param(
        "devices[0].containerEdits", {}, DEV0, "has no container edits", id="device-empty-edits"
    ),
    pytest.param(
        "devices[0].containerEdits",
        [],
        DEV0,
        "expected a mapping, got a list",
        id="device-edits-list",
    ),
    # --- env
    pytest.param(
        "containerEdits.env",
        "A=B",
        "containerEdits.env",
        "expected a list, got a string",
        id="env-string",
    ),
    pytest.param(
        "containerEdits.env[0]", 1, "containerEdits.env[0]", "expected a string", id="env-int"
    ),
    pytest.param(
        "containerEdits.env[0]",
        "NOEQUALS",
        "containerEdits.env[0]",
        "is not KEY=VALUE",
        id="env-no-equals",
    ),
    pytest.param(
        "containerEdits.env[0]",
        "=value",
        "containerEdits.env[0]",
        "non-empty KEY",
        id="env-empty-key",
    ),
    # --- device nodes
    pytest.param(
        f"{DEV0}.deviceNodes[0].path",
        _DELETE,
        f"{DEV0}.deviceNodes[0].path",
        "missing",
        id="node-path-missing",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].path",
        "dev/nvidia0",
        f"{DEV0}.deviceNodes[0].path",
        "not an absolute path",
        id="node-path-relative",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].hostPath",
        "nvidia0",
        f"{DEV0}.deviceNodes[0].hostPath",
        "not an absolute path",
        id="node-hostpath-relative",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].type",
        "x",
        f"{DEV0}.deviceNodes[0].type",
        "'x' is not one of b, c, u, p",
        id="node-type-unknown",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].type",
        "char",
        f"{DEV0}.deviceNodes[0].type",
        "is not one of",
        id="node-type-word",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].major",
        "195",
        f"{DEV0}.deviceNodes[0].major",
        "expected an integer, got a string",
        id="major-string",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].major",
        195.0,
        f"{DEV0}.deviceNodes[0].major",
        "expected an integer, got a float",
        id="major-float",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].major",
        True,
        f"{DEV0}.deviceNodes[0].major",
        "expected an integer, got a boolean",
        id="major-bool",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].major",
        -1,
        f"{DEV0}.deviceNodes[0].major",
        "-1 is a negative device number, out of range",
        id="major-negative-wildcard",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].minor",
        2**63,
        f"{DEV0}.deviceNodes[0].minor",
        "out of range",
        id="minor-over-int64",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].fileMode",
        "0666",
        f"{DEV0}.deviceNodes[0].fileMode",
        "expected an integer",
        id="filemode-string",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].fileMode",
        2**32,
        f"{DEV0}.deviceNodes[0].fileMode",
        "out of range for a file mode",
        id="filemode-over-uint32",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].uid",
        -5,
        f"{DEV0}.deviceNodes[0].uid",
        "out of range for a uid",
        id="uid-negative",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].gid",
        [1],
        f"{DEV0}.deviceNodes[0].gid",
        "expected an integer, got a list",
        id="gid-list",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].permissions",
        "nothing",
        f"{DEV0}.deviceNodes[0].permissions",
        "combination of r, w and m, nor 'none'",
        id="permissions-word",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].permissions",
        "rwx",
        f"{DEV0}.deviceNodes[0].permissions",
        "'rwx' is not",
        id="permissions-x",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes[0].permissions",
        7,
        f"{DEV0}.deviceNodes[0].permissions",
        "expected a string",
        id="permissions-int",
    ),
    pytest.param(
        f"{DEV0}.deviceNodes",
        {"path": "/dev/x"},
        f"{DEV0}.deviceNodes",
        "expected a list, got a mapping",
        id="nodes-mapping",
    ),
    # --- mounts
    pytest.param(
        "containerEdits.mounts[0].hostPath",
        _DELETE,
        "containerEdits.mounts[0].hostPath",
        "missing",
        id="mount-hostpath-missing",
    ),
    pytest.param(
        "containerEdits.mounts[0].hostPath",
        "",
        "containerEdits.mounts[0].hostPath",
        "must not be empty",
        id="mount-hostpath-empty",
    ),
    pytest.param(
        "containerEdits.mounts[0].hostPath",
        "lib/x.so",
        "containerEdits.mounts[0].hostPath",
        "not an absolute path",
        id="mount-bind-source-relative",
    ),
    pytest.param(
        "containerEdits.mounts[0].containerPath",
        _DELETE,
        "containerEdits.mounts[0].containerPath",
        "missing",
        id="mount-containerpath-missing",
    ),
    pytest.param(
        "containerEdits.mounts[0].containerPath",
        "usr/lib",
        "containerEdits.mounts[0].containerPath",
        "not an absolute path",
        id="mount-destination-relative",
    ),
    pytest.param(
        "containerEdits.mounts[0].options",
        "ro,bind",
        "containerEdits.mounts[0].options",
        "expected a list, got a string",
        id="mount-options-string",
    ),
    pytest.param(
        "containerEdits.mounts[0].options[1]",
        None,
        "containerEdits.mounts[0].options[1]",
        "missing",
        id="mount-option-null",
    ),
    pytest.param(
        "containerEdits.mounts[0].type",
        1,
        "containerEdits.mounts[0].type",
        "expected a string",
        id="mount-type-int",
    ),
    # --- hooks
    pytest.param(
        "containerEdits.hooks[0].hookName",
        "preStart",
        "containerEdits.hooks[0].hookName",
        "'preStart' is not an OCI hook point",
        id="hook-name-case",
    ),
    pytest.param(
        "containerEdits.hooks[0].hookName",
        _DELETE,
        "containerEdits.hooks[0].hookName",
        "missing",
        id="hook-name-missing",
    ),
    pytest.param(
        "containerEdits.hooks[0].path",
        _DELETE,
        "containerEdits.hooks[0].path",
        "missing",
        id="hook-path-missing",
    ),
    pytest.param(
        "containerEdits.hooks[0].path",
        "nvidia-cdi-hook",
        "containerEdits.hooks[0].path",
        "not an absolute path",
        id="hook-path-relative",
    ),
    pytest.param(
        "containerEdits.hooks[0].args",
        "nvidia-cdi-hook",
        "containerEdits.hooks[0].args",
        "expected a list",
        id="hook-args-string",
    ),
    pytest.param(
        "containerEdits.hooks[0].args[1]",
        {"a": 1},
        "containerEdits.hooks[0].args[1]",
        "expected a string, got a mapping",
        id="hook-arg-mapping",
    ),
    pytest.param(
        "containerEdits.hooks[0].env",
        ["DEBUG"],
        "containerEdits.hooks[0].env[0]",
        "is not KEY=VALUE",
        id="hook-env-no-equals",
    ),
    pytest.param(
        "containerEdits.hooks[0].timeout",
        "5s",
        "containerEdits.hooks[0].timeout",
        "expected an integer",
        id="hook-timeout-string",
    ),
    pytest.param(
        "containerEdits.hooks[0].timeout",
        -1,
        "containerEdits.hooks[0].timeout",
        "out of range",
        id="hook-timeout-negative",
    ),
    # --- additionalGids, intelRdt, netDevices
    pytest.param(
        "containerEdits.additionalGids",
        [39, "video"],
        "containerEdits.additionalGids[1]",
        "expected an integer, got a string",
        id="gids-string",
    ),
    pytest.param(
        "containerEdits.additionalGids",
        [None],
        "containerEdits.additionalGids[0]",
        "got null",
        id="gids-null",
    ),
    pytest.param(
        "containerEdits.intelRdt",
        {"closID": "a/b"},
        "containerEdits.intelRdt.closID",
        "is not a valid file name",
        id="rdt-closid-slash",
    ),
    pytest.param(
        "containerEdits.intelRdt",
        {"closID": ".."},
        "containerEdits.intelRdt.closID",
        "is not a valid file name",
        id="rdt-closid-dotdot",
    ),
    pytest.param(
        "containerEdits.intelRdt",
        {"enableCMT": "yes"},
        "containerEdits.intelRdt.enableCMT",
        "expected a boolean",
        id="rdt-cmt-string",
    ),
    pytest.param(
        "containerEdits.intelRdt",
        "on",
        "containerEdits.intelRdt",
        "expected a mapping",
        id="rdt-string",
    ),
    pytest.param(
        "containerEdits.containerEdits",
        {},
        "containerEdits.containerEdits",
        "unknown field",
        id="nested-edits-is-an-unknown-field",
    ),
]


@pytest.mark.parametrize(("path", "value", "field", "problem"), CASES)
def test_invalid_field_is_named(path: str, value: object, field: str, problem: str) -> None:
    """The error names the exact field path and says what is wrong with it."""
    text = mutated(path, value)
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(text, source="spec.json")
    assert caught.value.source == "spec.json"
    assert caught.value.field == field
    assert problem in caught.value.problem
    assert str(caught.value).startswith(f"invalid CDI spec spec.json: {field}: ")


def test_duplicate_device_names_are_refused() -> None:
    """Two devices with one name are ambiguous; the second is named, with the first's index."""
    spec = base()
    devices = spec["devices"]
    assert isinstance(devices, list)
    devices.append(copy.deepcopy(devices[0]))
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(json.dumps(spec))
    assert caught.value.field == "devices[1].name"
    assert "duplicate device 'all' (also devices[0])" in caught.value.problem


# --------------------------------------------------------------------------- syntax


def test_readme_example_with_missing_commas_is_refused_with_its_position() -> None:
    """The CDI README's annotations example (not valid JSON) fails at line 9, column 9."""
    path = DATA / "cdi-repo/README-example__vendor-annotations.json"
    with pytest.raises(CdiSpecError) as caught:
        cdi.load_spec(path)
    assert caught.value.source == str(path)
    assert caught.value.field == ""
    assert caught.value.problem == "not valid JSON: Expecting ',' delimiter at line 9, column 9"


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        pytest.param("schema_testdata_bad_empty.json", "the file is empty", id="empty"),
        pytest.param("schema_testdata_bad_explicit-empty.json", "missing", id="explicit-empty"),
    ],
)
def test_cdi_repo_bad_examples_are_refused(name: str, problem: str) -> None:
    """The CDI schema's `bad` test data is refused by us too."""
    with pytest.raises(CdiSpecError) as caught:
        cdi.load_spec(DATA / "cdi-repo/schema-HEAD" / name)
    assert caught.value.problem == problem


MINIMAL_YAML = (
    "cdiVersion: 0.3.0\nkind: a.com/b\ndevices:\n- name: all\n  containerEdits:\n    env: [A=1]\n"
)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param("", "the file is empty", id="empty"),
        pytest.param(" \n\t\n", "the file is empty", id="blank"),
        pytest.param("---\n", "the document is empty", id="yaml-empty-document"),
        pytest.param("# only a comment\n", "the document is empty", id="yaml-only-comment"),
        pytest.param(
            "[1, 2]",
            "the top level must be a mapping (a CDI spec object), got a list",
            id="json-list",
        ),
        pytest.param('"spec"', "got a string", id="json-string"),
        pytest.param("- a\n- b\n", "got a list", id="yaml-list"),
        pytest.param("42\n", "got an integer", id="yaml-scalar"),
        pytest.param(
            '{"cdiVersion": "0.3.0", "cdiVersion": "0.5.0"}',
            "duplicate key 'cdiVersion' in a JSON object",
            id="json-duplicate-key",
        ),
        pytest.param(
            MINIMAL_YAML + "kind: c.com/d\n",
            "found duplicate key 'kind' at line 7, column 1",
            id="yaml-duplicate-key",
        ),
        pytest.param(
            "a: &x [1]\nb: *x\n",
            "YAML aliases are not allowed in a CDI spec (a node anchored here is reused)"
            " at line 1, column 4",
            id="yaml-alias",
        ),
        pytest.param("base: &b {x: 1}\nc:\n  <<: *b\n", "not valid YAML", id="yaml-merge-key"),
        pytest.param("1: a\n", "found a non-string key (int)", id="yaml-int-key"),
        pytest.param("? [a]\n: b\n", "not valid YAML", id="yaml-list-key"),
        pytest.param("cdiVersion: 0.3.0\n  kind: x\n", "not valid YAML", id="yaml-bad-indent"),
        pytest.param("a: 1\n---\nb: 2\n", "not valid YAML", id="yaml-two-documents"),
        pytest.param(
            '{"cdiVersion": ["0.3.0"}',
            "not valid JSON: Expecting ',' delimiter at line 1, column 24",
            id="json-bracket-mismatch",
        ),
        pytest.param(
            '{"a": ' + "[" * 100_000,
            "not valid JSON: maximum recursion depth",
            id="json-deep-nesting",
        ),
        pytest.param("a: " + "[" * 100_000, "not valid YAML", id="yaml-deep-nesting"),
        pytest.param("a: " + "9" * 5000 + "\n", "not valid YAML", id="yaml-huge-int"),
        pytest.param('{"a": ' + "9" * 5000 + "}", "not valid JSON", id="json-huge-int"),
        pytest.param("a: b\x00\n", "not valid YAML", id="yaml-nul-byte"),
    ],
)
def test_unreadable_documents_are_refused(text: str, problem: str) -> None:
    """Syntax problems (and hostile shapes) come back as one positioned CdiSpecError."""
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(text, source="x")
    assert caught.value.field == ""
    assert problem in caught.value.problem


def test_flow_style_yaml_starting_with_a_brace_is_still_yaml() -> None:
    """A `{`-document that is not JSON but is valid YAML is read as YAML."""
    spec = cdi.parse_spec(
        "{cdiVersion: 0.3.0, kind: a.com/b, devices: [{name: all, containerEdits: {env: [A=1]}}]}"
    )
    assert spec.devices[0].container_edits.env == ("A=1",)


def test_json_that_is_valid_yaml_is_accepted_as_yaml() -> None:
    """A trailing comma breaks JSON but not YAML flow style: the YAML reading wins."""
    spec = cdi.parse_spec(
        '{"cdiVersion": "0.3.0", "kind": "a.com/b",'
        ' "devices": [{"name": "all", "containerEdits": {"env": ["A=1"],},},],}'
    )
    assert spec.kind == "a.com/b"


def test_yaml_1_1_coercions_are_type_errors_not_surprises() -> None:
    """An unquoted `0.3` (a float in YAML) or `on` (a boolean) fails the type check by name."""
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(MINIMAL_YAML.replace("0.3.0", "0.3"))
    assert (caught.value.field, caught.value.problem) == (
        "cdiVersion",
        "expected a string, got a float",
    )
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(MINIMAL_YAML.replace("name: all", "name: on"))
    assert (caught.value.field, caught.value.problem) == (
        "devices[0].name",
        "expected a string, got a boolean",
    )


def test_bytes_that_are_not_utf8_are_refused() -> None:
    """Undecodable bytes are named by offset."""
    with pytest.raises(CdiSpecError, match=r"not UTF-8 text \(byte 1: invalid start byte\)"):
        cdi.parse_spec(b"{\xff}")


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    """load_spec maps OSError (here: no such file) to CdiSpecError naming the file."""
    missing = tmp_path / "nvidia.json"
    with pytest.raises(CdiSpecError) as caught:
        cdi.load_spec(missing)
    assert caught.value.source == str(missing)
    assert caught.value.problem == "cannot read the spec file: No such file or directory"
    assert isinstance(caught.value.__cause__, FileNotFoundError)


def test_null_means_absent_as_in_go() -> None:
    """`null` for an optional field is the same as leaving it out; for a required one, missing."""
    spec = cdi.parse_spec(mutated("containerEdits.mounts[0].options", None))
    assert spec.container_edits.mounts[0].options == ()
    with pytest.raises(CdiSpecError, match="kind: missing"):
        cdi.parse_spec(mutated("kind", None))


@pytest.mark.parametrize(
    "field",
    [
        pytest.param("containerEdits.mounts[0].containerPath", id="mount-destination"),
        pytest.param("containerEdits.mounts[0].hostPath", id="mount-source"),
        pytest.param("containerEdits.deviceNodes[0].path", id="node-path"),
        pytest.param("containerEdits.hooks[0].path", id="hook-path"),
        pytest.param("devices[0].name", id="not-only-paths"),
    ],
)
def test_a_nul_byte_in_a_path_is_refused(field: str) -> None:
    """A NUL inside a path would cut it short in the runtime's C code: refused, field named."""
    text = mutated(field, "/usr/lib\x00/../../etc/shadow")
    with pytest.raises(CdiSpecError) as caught:
        cdi.parse_spec(text, source="spec.json")
    assert caught.value.field == field
    assert "NUL byte" in caught.value.problem


def test_a_spec_over_the_size_limit_is_refused(tmp_path) -> None:
    """A file over max_bytes is refused, with the limit and the flag that raises it, without
    reading it whole; one at the limit is read."""
    text = mutated("containerEdits.env", ["PAD=" + "x" * 4000])
    spec_file = tmp_path / "big.json"
    spec_file.write_text(text)
    size = len(text.encode())
    assert cdi.load_spec(spec_file, max_bytes=size).devices
    with pytest.raises(CdiSpecError) as caught:
        cdi.load_spec(spec_file, max_bytes=size - 1)
    assert caught.value.source == str(spec_file)
    assert f"limit of {size - 1} bytes" in caught.value.problem
    assert "--max-spec-bytes" in caught.value.problem
    with pytest.raises(CdiSpecError, match="larger than the limit"):
        cdi.parse_spec(text, max_bytes=size - 1)


def test_the_default_size_limit_is_16_mib(tmp_path) -> None:
    """The default cap: 16 MiB (a 300 MB string once took ~1 GB to parse)."""
    assert cdi.MAX_SPEC_BYTES == 16 * 2**20
    spec_file = tmp_path / "huge.json"
    with spec_file.open("w") as f:
        f.write('{"cdiVersion": "0.5.0", "kind": "a.b/c", "x": "')
        f.write("x" * (16 * 2**20))
        f.write('"}')
    with pytest.raises(CdiSpecError, match="larger than the limit of 16777216 bytes"):
        cdi.load_spec(spec_file)
