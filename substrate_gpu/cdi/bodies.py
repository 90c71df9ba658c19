"""The CDI spec's wire format (JSON or YAML) as typed dicts, field by field.

One place for the field names of every CDI object, in the spec's spelling: the parser
(:mod:`substrate_gpu.cdi.parse`) derives the fields it knows from these (:func:`fields_of`),
so a field added here is known there, and the tests check these against the CDI project's
JSON schema and every real spec in the test data. ``total=False`` with ``Required`` where
the schema requires a field. The parser turns a document into the frozen values of
:mod:`substrate_gpu.cdi.model`; nothing downstream handles these dicts.
"""

# No `from __future__ import annotations` here: Python 3.11's TypedDict reads Required[...]
# only from evaluated annotations (with strings, __required_keys__ comes out empty).

from typing import Required, TypedDict, is_typeddict


class DeviceNodeBody(TypedDict, total=False):
    """``containerEdits.deviceNodes[]``."""

    path: Required[str]
    hostPath: str
    type: str
    """``c``, ``b``, ``u`` or ``p``; absent leaves it to the runtime."""
    major: int
    """Usually absent in nvidia-ctk output: the runtime stats the host node."""
    minor: int
    fileMode: int
    """In the reference library's Go type (not in its JSON schema)."""
    permissions: str
    uid: int
    gid: int


class MountBody(TypedDict, total=False):
    """``containerEdits.mounts[]``."""

    hostPath: Required[str]
    containerPath: Required[str]
    options: list[str]
    type: str


class HookBody(TypedDict, total=False):
    """``containerEdits.hooks[]``."""

    hookName: Required[str]
    path: Required[str]
    args: list[str]
    env: list[str]
    timeout: int


class IntelRdtBody(TypedDict, total=False):
    """``containerEdits.intelRdt`` (0.7.0; ``schemata``/``enableMonitoring`` from 1.1.0,
    ``enableCMT``/``enableMBM`` before it)."""

    closID: str
    l3CacheSchema: str
    memBwSchema: str
    schemata: list[str]
    enableMonitoring: bool
    enableCMT: bool
    enableMBM: bool


class NetDeviceBody(TypedDict):
    """``containerEdits.netDevices[]`` (1.1.0)."""

    hostInterfaceName: str
    name: str


class ContainerEditsBody(TypedDict, total=False):
    """``containerEdits``, at the spec level or a device's."""

    env: list[str]
    deviceNodes: list[DeviceNodeBody]
    hooks: list[HookBody]
    mounts: list[MountBody]
    intelRdt: IntelRdtBody
    additionalGids: list[int]
    netDevices: list[NetDeviceBody]


class DeviceBody(TypedDict, total=False):
    """``devices[]``."""

    name: Required[str]
    annotations: dict[str, str]
    containerEdits: Required[ContainerEditsBody]


class SpecBody(TypedDict, total=False):
    """A whole CDI spec file."""

    cdiVersion: Required[str]
    kind: Required[str]
    """``vendor/class``, e.g. ``nvidia.com/gpu``."""
    annotations: dict[str, str]
    devices: Required[list[DeviceBody]]
    containerEdits: ContainerEditsBody


def fields_of(body: type) -> frozenset[str]:
    """Every field a typed dict declares, required or not."""
    if not is_typeddict(body):
        raise TypeError(f"{body!r} is not a TypedDict")
    return frozenset(body.__required_keys__ | body.__optional_keys__)  # type: ignore[attr-defined]
