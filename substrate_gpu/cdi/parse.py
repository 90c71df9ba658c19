"""Read a CDI spec (JSON or YAML) into :mod:`substrate_gpu.cdi.model` values, validating it.

This module owns the boundary between untrusted text and typed values. Every problem, from
a missing comma to a relative mount path, becomes one
:class:`~substrate_gpu.exceptions.CdiSpecError` naming the file, the field path
(``devices[3].containerEdits.mounts[2].hostPath``) and what is wrong. Nothing else escapes:
not ``json`` or ``yaml`` errors, not ``RecursionError`` from a pathologically nested
document, not ``ValueError`` from a 5000-digit integer.

Design decisions (see docs/cdi-parsing.md for the long form):

* **Formats.** A document whose first non-blank character is ``{`` is tried as JSON first
  (the fast path; ``nvidia-ctk --format=json`` output). Anything else, or JSON that fails, is
  read with PyYAML's safe loader (the C one when available): every YAML style nvidia-ctk has
  written, with or without the ``---`` header, 2- or 4-space indents. JSON that fails but is
  valid YAML flow style (a trailing comma) is accepted as YAML; when both fail on a ``{``
  document the JSON error is reported, since it carries the precise line and column.
* **Duplicate keys are rejected**, in JSON and YAML alike. Which duplicate wins differs between
  parsers (Go keeps the last, some keep the first), so a spec with one is ambiguous; the
  reference parser (``sigs.k8s.io/yaml.UnmarshalStrict``) rejects them too.
* **YAML aliases, merge keys and non-string keys are rejected.** nvidia-ctk never writes them,
  and aliases allow "billion laughs" documents whose walk is exponential.
* **Unknown fields are refused** for every ``cdiVersion`` this parser knows, naming the
  field and the known one it is closest to, as the reference parser refuses them (it
  decodes strictly): a typo (``deviceNode`` for ``deviceNodes``) would otherwise silently
  drop device nodes, and the actor would get a GPU without ``nvidiactl``. Only a spec of a
  ``cdiVersion`` *newer* than any known is read with its unknown fields ignored, their paths
  in :attr:`~substrate_gpu.cdi.model.Spec.ignored_fields` and a
  :attr:`~substrate_gpu.cdi.model.Spec.warning` for the caller to log: a newer toolkit must
  not take a node's GPUs down. ``strict=True`` refuses that too (the reference knows no
  newer version). Field names match exactly (Go's JSON decoder would also match ``Path``
  for ``path``; we treat that as unknown).
* **Bounded input.** A spec file over :data:`MAX_SPEC_BYTES` (16 MiB; a generated spec is
  ~30 KiB) is refused before it is read whole, and a string field holding a NUL byte is
  refused (no path, name or env entry can hold one; it would cut the string short in the
  runtime's C code).
* **Types are exact.** An integer field takes an integer (not ``true``, not ``195.0``, not
  ``"195"``), a string field a string. ``null`` means "absent", as in Go.
* **Validation** follows the reference ``producer`` validator (names, env, device node types
  and permissions, hook points, version rules in :mod:`substrate_gpu.cdi.versions`) and adds
  what the OCI runtime would otherwise reject later, at a worse moment: absolute paths, and
  non-negative device numbers (a negative major would become a cgroup *wildcard* rule).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from typing import Final, NoReturn

from substrate_gpu import _defaults, exceptions
from substrate_gpu.cdi import bodies, model, versions

__all__ = ["MAX_SPEC_BYTES", "load_spec", "parse_spec"]

#: The largest spec file read (``--max-spec-bytes`` in the CLI): a generated spec is ~30 KiB,
#: and parsing a string takes several times its size in memory.
MAX_SPEC_BYTES: Final = _defaults.MAX_SPEC_BYTES

_INT64_MAX: Final = 2**63 - 1
_UINT32_MAX: Final = 2**32 - 1

# Name rules of the reference library (api/producer/identifiers.go), ASCII only.
VENDOR_OR_CLASS: Final = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?")
DEVICE_NAME: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")

#: OCI hook points a CDI hook may name (``validHookNames`` upstream).
HOOK_NAMES: Final = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)
#: Device node types: block, char, unbuffered char, FIFO.
DEVICE_TYPES: Final = frozenset({"b", "c", "u", "p"})

# The fields each object may have, from the wire format's one definition.
_SPEC_FIELDS: Final = bodies.fields_of(bodies.SpecBody)
_DEVICE_FIELDS: Final = bodies.fields_of(bodies.DeviceBody)
_EDITS_FIELDS: Final = bodies.fields_of(bodies.ContainerEditsBody)
_NODE_FIELDS: Final = bodies.fields_of(bodies.DeviceNodeBody)
_MOUNT_FIELDS: Final = bodies.fields_of(bodies.MountBody)
_HOOK_FIELDS: Final = bodies.fields_of(bodies.HookBody)
_RDT_FIELDS: Final = bodies.fields_of(bodies.IntelRdtBody)
_NET_DEVICE_FIELDS: Final = bodies.fields_of(bodies.NetDeviceBody)

_V110: Final = versions.as_tuple("1.1.0")

_DEVICE_NUMBERS: Final = frozenset({"a device major", "a device minor"})


# --------------------------------------------------------------------------- decoding


class _DecodeError(Exception):
    """A syntax-level problem, before any field path exists."""


def _no_duplicate_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DecodeError(f"duplicate key {key!r} in a JSON object")
            seen.add(key)
    return result


def _json_error(error: json.JSONDecodeError) -> str:
    return f"not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}"


def _decode(text: str) -> object:
    """The document's raw value; raises :class:`_DecodeError` with a positioned message."""
    stripped = text.lstrip()
    if not stripped:
        raise _DecodeError("the file is empty")
    json_problem: str | None = None
    if stripped.startswith("{"):
        try:
            return json.loads(text, object_pairs_hook=_no_duplicate_pairs)
        except json.JSONDecodeError as e:
            json_problem = _json_error(e)
        except _DecodeError as e:
            json_problem = str(e)
        except (ValueError, RecursionError) as e:
            json_problem = f"not valid JSON: {e}"
    # Imported here: a JSON spec (what the agent has nvidia-ctk generate) never loads PyYAML,
    # whose import would slow every `cdi show` or `inject` (tests/bench/bench_cli.py).
    import yaml  # noqa: PLC0415

    from substrate_gpu.cdi import _yaml_spec  # noqa: PLC0415

    try:
        return yaml.load(text, Loader=_yaml_spec.SpecLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as e:
        raise _DecodeError(json_problem or _yaml_spec.describe_error(e)) from e
    except (ValueError, RecursionError, OverflowError) as e:
        # int() on a huge scalar, or a document nested thousands deep.
        raise _DecodeError(json_problem or f"not valid YAML: {e}") from e


# --------------------------------------------------------------------------- validation


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _unknown_field(key: str, known: frozenset[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(sorted(known))}"
    return f"unknown field ({hint}); a spec of a known cdiVersion may hold only known fields"


class _Reader:
    """One pass over a decoded document, building model values and checking every field."""

    def __init__(self, source: str, *, tolerant: bool, version: versions.Version) -> None:
        self.source = source
        self.tolerant = tolerant
        """Record unknown fields instead of refusing them (a newer cdiVersion only)."""
        self.version = version
        self.ignored: list[str] = []

    def fail(self, path: str, problem: str) -> NoReturn:
        raise exceptions.CdiSpecError(self.source, path, problem)

    # ---- shapes

    def mapping(self, value: object, path: str, known: frozenset[str]) -> dict[str, object]:
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {_describe(value)}")
        for key in value:
            if not isinstance(key, str):  # pragma: no cover - both decoders refuse these
                self.fail(path, f"expected string keys, got {_describe(key)}")
            if key not in known:
                field = _join(path, key)
                if not self.tolerant:
                    self.fail(field, _unknown_field(key, known))
                self.ignored.append(field)
        return value

    def items(self, value: object, path: str) -> list[object]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(path, f"expected a list, got {_describe(value)}")
        return value

    def string(self, value: object, path: str) -> str:
        if value is None:
            self.fail(path, "missing")
        if not isinstance(value, str):
            self.fail(path, f"expected a string, got {_describe(value)}")
        if "\0" in value:
            self.fail(path, f"contains a NUL byte (at character {value.index(chr(0))})")
        return value

    def optional_string(self, value: object, path: str) -> str | None:
        # Go's zero value: "" and null mean the same as an absent field.
        return None if value is None else (self.string(value, path) or None)

    def strings(self, value: object, path: str) -> tuple[str, ...]:
        return tuple(
            self.string(item, f"{path}[{index}]")
            for index, item in enumerate(self.items(value, path))
        )

    def integer(self, value: object, path: str, *, maximum: int, what: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected an integer, got {_describe(value)}")
        if value < 0 and what in _DEVICE_NUMBERS:
            # The reference refuses these too (v1.1.2): -1 would be a cgroup wildcard.
            self.fail(
                path,
                f"{value} is a negative device number, out of range for {what} (0 to"
                f" {maximum}; -1 would make the cgroup rule a wildcard matching every device)",
            )
        if not 0 <= value <= maximum:
            self.fail(path, f"{value} is out of range for {what} (0 to {maximum})")
        return value

    def boolean(self, value: object, path: str) -> bool:
        if value is None:
            return False
        if not isinstance(value, bool):
            self.fail(path, f"expected a boolean, got {_describe(value)}")
        return value

    def permissions(self, value: object, path: str) -> str | None:
        # As the reference (v1.1.1+): "" is the default rwm (Go's zero value, like absent),
        # "none" asks for a cgroup rule granting nothing; else a combination of r, w and m.
        text = self.optional_string(value, path)
        if text is not None and text != model.NO_PERMISSIONS and not set(text) <= set("rwm"):
            self.fail(
                path,
                f"{text!r} is not a combination of r, w and m, nor {model.NO_PERMISSIONS!r}"
                " (no access)",
            )
        return text

    def absolute(self, value: str, path: str) -> str:
        if not value.startswith("/"):
            self.fail(path, f"{value!r} is not an absolute path")
        return value

    def env(self, value: object, path: str) -> tuple[str, ...]:
        entries = self.strings(value, path)
        for index, entry in enumerate(entries):
            if entry.find("=") <= 0:
                self.fail(f"{path}[{index}]", f"{entry!r} is not KEY=VALUE with a non-empty KEY")
        return entries

    def annotations(self, value: object, path: str) -> tuple[tuple[str, str], ...]:
        if value is None:
            return ()
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {_describe(value)}")
        pairs: list[tuple[str, str]] = []
        for key, item in value.items():
            if not isinstance(key, str) or not key:  # pragma: no branch - keys are str here
                self.fail(path, "annotation keys must be non-empty strings")
            pairs.append((key, self.string(item, f"{path}.{key}")))
        return tuple(sorted(pairs))

    # ---- CDI objects

    def device_node(self, value: object, path: str) -> model.DeviceNode:
        raw = self.mapping(value, path, _NODE_FIELDS)
        node_path = self.absolute(self.string(raw.get("path"), f"{path}.path"), f"{path}.path")
        host_path = self.optional_string(raw.get("hostPath"), f"{path}.hostPath")
        if host_path is not None:
            self.absolute(host_path, f"{path}.hostPath")
        node_type = self.optional_string(raw.get("type"), f"{path}.type")
        if node_type is not None and node_type not in DEVICE_TYPES:
            self.fail(f"{path}.type", f"{node_type!r} is not one of b, c, u, p")
        permissions = self.permissions(raw.get("permissions"), f"{path}.permissions")
        return model.DeviceNode(
            path=node_path,
            host_path=host_path,
            type=node_type,
            major=self.integer(
                raw.get("major"), f"{path}.major", maximum=_INT64_MAX, what="a device major"
            ),
            minor=self.integer(
                raw.get("minor"), f"{path}.minor", maximum=_INT64_MAX, what="a device minor"
            ),
            file_mode=self.integer(
                raw.get("fileMode"), f"{path}.fileMode", maximum=_UINT32_MAX, what="a file mode"
            ),
            permissions=permissions,
            uid=self.integer(raw.get("uid"), f"{path}.uid", maximum=_UINT32_MAX, what="a uid"),
            gid=self.integer(raw.get("gid"), f"{path}.gid", maximum=_UINT32_MAX, what="a gid"),
        )

    def mount(self, value: object, path: str) -> model.Mount:
        raw = self.mapping(value, path, _MOUNT_FIELDS)
        host_path = self.string(raw.get("hostPath"), f"{path}.hostPath")
        mount_type = self.optional_string(raw.get("type"), f"{path}.type")
        if not host_path:
            self.fail(f"{path}.hostPath", "must not be empty")
        if mount_type in (None, "bind", "rbind"):
            # A bind source is a host path; other types (tmpfs, proc) name a pseudo source.
            self.absolute(host_path, f"{path}.hostPath")
        container_path = self.string(raw.get("containerPath"), f"{path}.containerPath")
        return model.Mount(
            host_path=host_path,
            container_path=self.absolute(container_path, f"{path}.containerPath"),
            type=mount_type,
            options=self.strings(raw.get("options"), f"{path}.options"),
        )

    def hook(self, value: object, path: str) -> model.Hook:
        raw = self.mapping(value, path, _HOOK_FIELDS)
        hook_name = self.string(raw.get("hookName"), f"{path}.hookName")
        if hook_name not in HOOK_NAMES:
            self.fail(
                f"{path}.hookName",
                f"{hook_name!r} is not an OCI hook point ({', '.join(sorted(HOOK_NAMES))})",
            )
        hook_path = self.absolute(self.string(raw.get("path"), f"{path}.path"), f"{path}.path")
        return model.Hook(
            hook_name=hook_name,
            path=hook_path,
            args=self.strings(raw.get("args"), f"{path}.args"),
            env=self.env(raw.get("env"), f"{path}.env"),
            timeout=self.integer(
                raw.get("timeout"), f"{path}.timeout", maximum=_UINT32_MAX, what="a timeout"
            ),
        )

    def intel_rdt(self, value: object, path: str) -> model.IntelRdt:
        raw = self.mapping(value, path, _RDT_FIELDS)
        # Presence checks of ValidateVersionContents: these fields came and went with 1.1.0.
        for removed in ("enableCMT", "enableMBM"):
            if removed in raw and self.version >= _V110:
                self.fail(f"{path}.{removed}", "is not valid for CDI spec version 1.1.0 and later")
        for added in ("schemata", "enableMonitoring"):
            if added in raw and self.version < _V110:
                self.fail(f"{path}.{added}", "requires CDI spec version at least 1.1.0")
        clos_id = self.optional_string(raw.get("closID"), f"{path}.closID")
        # A file name, except "/": the root CLOS (the reference accepts it since runtime-spec 1.3).
        if clos_id is not None and (
            len(clos_id) >= 4096
            or clos_id in (".", "..")
            or ("/" in clos_id and clos_id != "/")
            or "\n" in clos_id
        ):
            self.fail(f"{path}.closID", f"{clos_id!r} is not a valid file name")
        schemata_raw = raw.get("schemata")
        return model.IntelRdt(
            clos_id=clos_id,
            l3_cache_schema=self.optional_string(raw.get("l3CacheSchema"), f"{path}.l3CacheSchema"),
            mem_bw_schema=self.optional_string(raw.get("memBwSchema"), f"{path}.memBwSchema"),
            schemata=None
            if schemata_raw is None
            else self.strings(schemata_raw, f"{path}.schemata"),
            enable_monitoring=self.boolean(raw.get("enableMonitoring"), f"{path}.enableMonitoring"),
            enable_cmt=self.boolean(raw.get("enableCMT"), f"{path}.enableCMT"),
            enable_mbm=self.boolean(raw.get("enableMBM"), f"{path}.enableMBM"),
        )

    def net_device(self, value: object, path: str) -> model.NetDevice:
        raw = self.mapping(value, path, _NET_DEVICE_FIELDS)
        host_name = self.string(raw.get("hostInterfaceName"), f"{path}.hostInterfaceName")
        name = self.string(raw.get("name"), f"{path}.name")
        for field, text in (("hostInterfaceName", host_name), ("name", name)):
            if not text:
                self.fail(f"{path}.{field}", "must not be empty")
        return model.NetDevice(host_interface_name=host_name, name=name)

    def net_devices(
        self, items: list[tuple[str, object]], path: str
    ) -> tuple[model.NetDevice, ...]:
        # The reference's ValidateNetDevices: host interfaces and names are unique per edits.
        devices = tuple(self.net_device(item, at) for at, item in items)
        hosts: dict[str, int] = {}
        names: dict[str, int] = {}
        for index, device in enumerate(devices):
            for seen, key, field in (
                (hosts, device.host_interface_name, "hostInterfaceName"),
                (names, device.name, "name"),
            ):
                if key in seen:
                    self.fail(
                        f"{path}[{index}].{field}",
                        f"duplicate {field} {key!r} (also {path}[{seen[key]}])",
                    )
                seen[key] = index
        return devices

    def edits(self, value: object, path: str) -> model.ContainerEdits:
        if value is None:
            return model.ContainerEdits()
        raw = self.mapping(value, path, _EDITS_FIELDS)
        if "netDevices" in raw and self.version < _V110:
            self.fail(f"{path}.netDevices", "requires CDI spec version at least 1.1.0")
        gids = tuple(
            self.integer(item, f"{path}.additionalGids[{index}]", maximum=_UINT32_MAX, what="a gid")
            for index, item in enumerate(
                self.items(raw.get("additionalGids"), f"{path}.additionalGids")
            )
        )
        for index, gid in enumerate(gids):
            if gid is None:
                self.fail(f"{path}.additionalGids[{index}]", "expected an integer, got null")
        rdt = raw.get("intelRdt")

        def each(key: str) -> list[tuple[str, object]]:
            field = f"{path}.{key}"
            return [
                (f"{field}[{i}]", item) for i, item in enumerate(self.items(raw.get(key), field))
            ]

        return model.ContainerEdits(
            env=self.env(raw.get("env"), f"{path}.env"),
            device_nodes=tuple(self.device_node(item, at) for at, item in each("deviceNodes")),
            mounts=tuple(self.mount(item, at) for at, item in each("mounts")),
            hooks=tuple(self.hook(item, at) for at, item in each("hooks")),
            additional_gids=tuple(gid for gid in gids if gid is not None),
            intel_rdt=None if rdt is None else self.intel_rdt(rdt, f"{path}.intelRdt"),
            net_devices=self.net_devices(each("netDevices"), f"{path}.netDevices"),
        )

    def device(self, value: object, path: str) -> model.Device:
        raw = self.mapping(value, path, _DEVICE_FIELDS)
        name = self.string(raw.get("name"), f"{path}.name")
        if not DEVICE_NAME.fullmatch(name):
            self.fail(
                f"{path}.name",
                f"{name!r} is not a device name (letters, digits, '_', '-', '.', ':';"
                " starting and ending with a letter or digit)",
            )
        edits = self.edits(raw.get("containerEdits"), f"{path}.containerEdits")
        if edits.is_empty:
            # The reference validator's assertNonEmptyEdits: a device must change something.
            self.fail(f"{path}.containerEdits", f"device {name!r} has no container edits")
        return model.Device(
            name=name,
            container_edits=edits,
            annotations=self.annotations(raw.get("annotations"), f"{path}.annotations"),
        )


def _check_kind(reader: _Reader, kind: str) -> None:
    vendor, slash, class_ = kind.partition("/")
    if not slash or not vendor or not class_:
        reader.fail("kind", f"{kind!r} is not of the form vendor/class (e.g. nvidia.com/gpu)")
    for part, what in ((vendor, "vendor"), (class_, "class")):
        if not VENDOR_OR_CLASS.fullmatch(part):
            reader.fail(
                "kind",
                f"invalid {what} {part!r} in {kind!r} (letters, digits, '_', '-', '.';"
                " starting with a letter, ending with a letter or digit)",
            )


def _spec_from(document: object, source: str, *, strict: bool) -> model.Spec:
    if document is None:
        raise exceptions.CdiSpecError(source, "", "the document is empty")
    if not isinstance(document, dict):
        raise exceptions.CdiSpecError(
            source,
            "",
            f"the top level must be a mapping (a CDI spec object), got {_describe(document)}",
        )
    # cdiVersion first: the presence rules of the walk below depend on it.
    bootstrap = _Reader(source, tolerant=False, version=(0, 0, 0))
    version_text = bootstrap.string(document.get("cdiVersion"), "cdiVersion")
    version = versions.normalize(version_text)
    newer = None if version is not None or strict else versions.newer_than_known(version_text)
    if newer is not None:
        # Newer than any we know: read as the newest known, unknown fields ignored (warned).
        version = version_text.removeprefix("v")
        reader = _Reader(source, tolerant=True, version=versions.as_tuple(versions.LATEST))
    elif version is None:
        bootstrap.fail(
            "cdiVersion",
            f"unknown CDI version {version_text!r} (known: {', '.join(versions.KNOWN_VERSIONS)})",
        )
    else:
        reader = _Reader(source, tolerant=False, version=versions.as_tuple(version))
    raw = reader.mapping(document, "", _SPEC_FIELDS)

    kind = reader.string(raw.get("kind"), "kind")
    _check_kind(reader, kind)
    annotations = reader.annotations(raw.get("annotations"), "annotations")
    container_edits = reader.edits(raw.get("containerEdits"), "containerEdits")

    raw_devices = reader.items(raw.get("devices"), "devices")
    if not raw_devices:
        reader.fail("devices", "the spec has no devices")
    devices: list[model.Device] = []
    index_of: dict[str, int] = {}
    for index, item in enumerate(raw_devices):
        device = reader.device(item, f"devices[{index}]")
        if device.name in index_of:
            reader.fail(
                f"devices[{index}].name",
                f"duplicate device {device.name!r} (also devices[{index_of[device.name]}])",
            )
        index_of[device.name] = index
        devices.append(device)

    spec = model.Spec(
        cdi_version=version,
        kind=kind,
        devices=tuple(devices),
        container_edits=container_edits,
        annotations=annotations,
        source=source,
        ignored_fields=tuple(reader.ignored),
    )
    needed = versions.minimum_required(spec)
    if versions.as_tuple(needed.version) > reader.version:
        if not needed.field:
            # 0.1.0 and 0.2.0 are known upstream but below its vEarliest: always refused there.
            reader.fail(
                "cdiVersion",
                f"{version_text} is older than {versions.EARLIEST}, the earliest version the"
                " CDI reference library accepts",
            )
        reader.fail(
            "cdiVersion",
            f"{version_text} is too old for this spec: {needed.field} ({needed.feature})"
            f" needs at least {needed.version}",
        )
    return spec


# --------------------------------------------------------------------------- public API


def parse_spec(
    data: str | bytes,
    *,
    source: str = "<string>",
    strict: bool = False,
    max_bytes: int = MAX_SPEC_BYTES,
) -> model.Spec:
    """Parse and validate a CDI spec given as JSON or YAML text.

    ``source`` names the input in errors. Unknown fields are errors, except in a spec whose
    ``cdiVersion`` is newer than any known: their paths are then returned in
    :attr:`~substrate_gpu.cdi.model.Spec.ignored_fields` — unless ``strict``, which refuses
    them and the newer version, as the reference parser does. Input over ``max_bytes``
    (UTF-8) is refused. Raises :class:`~substrate_gpu.exceptions.CdiSpecError` for every
    problem.
    """
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise exceptions.CdiSpecError(source, "", _too_large(max_bytes))
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise exceptions.CdiSpecError(
                source, "", f"not UTF-8 text (byte {e.start}: {e.reason})"
            ) from e
    else:
        text = data
    try:
        document = _decode(text)
    except _DecodeError as e:
        raise exceptions.CdiSpecError(source, "", str(e)) from e.__cause__
    return _spec_from(document, source, strict=strict)


def _too_large(limit: int) -> str:
    return (
        f"the spec is larger than the limit of {limit} bytes ({limit / 2**20:g} MiB; a"
        " generated spec is ~30 KiB); raise it with --max-spec-bytes if this one is genuine"
    )


def load_spec(
    path: str | os.PathLike[str], *, strict: bool = False, max_bytes: int = MAX_SPEC_BYTES
) -> model.Spec:
    """Read the file at ``path`` and :func:`parse_spec` it, naming the file in every error.

    A file over ``max_bytes`` is refused without being read whole."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as file:  # noqa: PTH123 - path may be any PathLike
            data = file.read(max_bytes + 1)
    except OSError as e:
        raise exceptions.CdiSpecError(
            source, "", f"cannot read the spec file: {e.strerror or e}"
        ) from e
    if len(data) > max_bytes:
        raise exceptions.CdiSpecError(source, "", _too_large(max_bytes))
    return parse_spec(data, source=source, strict=strict, max_bytes=max_bytes)
