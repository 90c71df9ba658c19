"""CDI specification versions: which exist, and which one a spec's content requires.

A port of ``specs-go/version.go`` from cncf-tags/container-device-interface (the reference
library, main branch, spec version 1.1.0). The reference parser refuses a spec whose
``cdiVersion`` is unknown, or lower than the minimum its content needs (``hostPath`` on a
device node needs 0.5.0, ``additionalGids`` 0.7.0, …); nvidia-ctk always writes exactly that
minimum. We apply the same rules so a spec we accept is one the reference accepts too.

Each rule here names the first field that triggered it, so an error can say *why* a version
is needed, not only that it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from substrate_gpu.cdi import model

#: Every released CDI spec version, oldest first (``validSpecVersions`` upstream).
KNOWN_VERSIONS: tuple[str, ...] = (
    "0.1.0",
    "0.2.0",
    "0.3.0",
    "0.4.0",
    "0.5.0",
    "0.6.0",
    "0.7.0",
    "0.8.0",
    "1.0.0",
    "1.1.0",
)

#: The version a spec needs when it uses no versioned feature (``vEarliest`` upstream).
EARLIEST = "0.3.0"

#: The newest version this parser knows (``CurrentVersion`` upstream).
LATEST = KNOWN_VERSIONS[-1]

Version = tuple[int, int, int]
"""A version as comparable integers, e.g. ``(0, 7, 0)``."""


def normalize(text: str) -> str | None:
    """``text`` without the optional leading ``v`` when it is a known version, else ``None``.

    The reference accepts ``v0.5.0`` as well as ``0.5.0`` (``newVersion`` trims one ``v``).
    """
    bare = text.removeprefix("v")
    return bare if bare in KNOWN_VERSIONS else None


def newer_than_known(text: str) -> Version | None:
    """``text`` (``[v]MAJOR.MINOR.PATCH``) as a version when it is newer than :data:`LATEST`,
    else ``None``: a spec a newer toolkit wrote, which may hold fields this parser predates."""
    parts = text.removeprefix("v").split(".")
    if len(parts) != 3 or not all(part.isascii() and part.isdigit() for part in parts):
        return None
    version = (int(parts[0]), int(parts[1]), int(parts[2]))
    return version if version > as_tuple(LATEST) else None


def as_tuple(version: str) -> Version:
    """A known version (as returned by :func:`normalize`) as comparable integers."""
    major, minor, patch = (int(part) for part in version.split("."))
    return (major, minor, patch)


@dataclass(frozen=True)
class Requirement:
    """The minimum version a spec's content needs, and why."""

    version: str
    """The minimum version, e.g. ``0.7.0``."""
    field: str
    """The first field path that needs it; empty when nothing versioned is used."""
    feature: str
    """What that field is, in words (``additionalGids``, ``device annotations``)."""


def _all_edits(spec: model.Spec) -> Iterator[tuple[str, model.ContainerEdits]]:
    """Every ``containerEdits`` with its field path: the devices', then the spec's."""
    for index, device in enumerate(spec.devices):
        yield f"devices[{index}].containerEdits", device.container_edits
    yield "containerEdits", spec.container_edits


def _requires_v110(spec: model.Spec) -> tuple[str, str] | None:
    for path, edits in _all_edits(spec):
        rdt = edits.intel_rdt
        if rdt is not None and rdt.schemata is not None:
            return f"{path}.intelRdt.schemata", "intelRdt.schemata"
        if rdt is not None and rdt.enable_monitoring:
            return f"{path}.intelRdt.enableMonitoring", "intelRdt.enableMonitoring"
        if edits.net_devices:
            return f"{path}.netDevices", "netDevices"
    return None


def _requires_v070(spec: model.Spec) -> tuple[str, str] | None:
    for path, edits in _all_edits(spec):
        if edits.intel_rdt is not None:
            return f"{path}.intelRdt", "intelRdt"
        if edits.additional_gids:
            return f"{path}.additionalGids", "additionalGids"
    return None


def _requires_v060(spec: model.Spec) -> tuple[str, str] | None:
    if spec.annotations:
        return "annotations", "spec annotations"
    for index, device in enumerate(spec.devices):
        if device.annotations:
            return f"devices[{index}].annotations", "device annotations"
    _, slash, class_ = spec.kind.partition("/")
    if slash and "." in class_:
        return "kind", "a dot in the class of the kind"
    return None


def _requires_v050(spec: model.Spec) -> tuple[str, str] | None:
    for index, device in enumerate(spec.devices):
        if device.name[:1].isdigit():
            return f"devices[{index}].name", "a device name starting with a digit"
    for path, edits in _all_edits(spec):
        for node_index, node in enumerate(edits.device_nodes):
            if node.host_path:
                return f"{path}.deviceNodes[{node_index}].hostPath", "deviceNodes hostPath"
    return None


def _requires_v040(spec: model.Spec) -> tuple[str, str] | None:
    for path, edits in _all_edits(spec):
        for mount_index, mount in enumerate(edits.mounts):
            if mount.type:
                return f"{path}.mounts[{mount_index}].type", "a mount type"
    return None


# Newest first: the first rule that fires gives the minimum. 0.8.0 and 1.0.0 added no
# fields (they changed the Go API only), so they have no rule, exactly as upstream.
_RULES: tuple[tuple[str, Callable[[model.Spec], tuple[str, str] | None]], ...] = (
    ("1.1.0", _requires_v110),
    ("0.7.0", _requires_v070),
    ("0.6.0", _requires_v060),
    ("0.5.0", _requires_v050),
    ("0.4.0", _requires_v040),
)


def minimum_required(spec: model.Spec) -> Requirement:
    """The lowest ``cdiVersion`` allowing everything ``spec`` uses (``MinimumRequiredVersion``)."""
    for version, rule in _RULES:
        hit = rule(spec)
        if hit is not None:
            return Requirement(version=version, field=hit[0], feature=hit[1])
    return Requirement(version=EARLIEST, field="", feature="")
