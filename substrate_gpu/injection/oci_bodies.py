"""The OCI runtime config (a bundle's ``config.json``) as typed dicts, field by field.

The fields of the OCI runtime specification (config.md, config-linux.md) that injection
reads or writes, in the spec's JSON spelling; ``total=False`` with ``Required`` where the
spec requires a field. These describe what a field *should* hold: a config we read comes
from an untrusted image and the runtime that unpacked it, so every reader in
:mod:`substrate_gpu.injection.oci` still checks a value's type before using it (and raises
:class:`~substrate_gpu.exceptions.InjectionError` naming the field when it must write there).
Fields not listed here are kept as they are: injection never drops what it does not know.
"""

# No `from __future__ import annotations` here: Python 3.11's TypedDict reads Required[...]
# only from evaluated annotations (with strings, __required_keys__ comes out empty).

from typing import Required, TypedDict


class LinuxDevice(TypedDict, total=False):
    """``linux.devices[]``: a device node the runtime creates in the container."""

    path: Required[str]
    type: Required[str]
    """``c``, ``b``, ``u`` or ``p``."""
    major: int
    minor: int
    fileMode: int
    uid: int
    gid: int


class LinuxDeviceCgroup(TypedDict, total=False):
    """``linux.resources.devices[]``: a device cgroup rule (without one, a node gives EPERM)."""

    allow: Required[bool]
    type: str
    major: int
    minor: int
    access: str
    """A combination of ``r``, ``w`` and ``m``."""


class LinuxResources(TypedDict, total=False):
    """``linux.resources``: only the device rules are ours to edit."""

    devices: list[LinuxDeviceCgroup]


class LinuxNamespace(TypedDict, total=False):
    """``linux.namespaces[]``."""

    type: Required[str]
    path: str


class Linux(TypedDict, total=False):
    """``linux``: the Linux-specific part of the config."""

    devices: list[LinuxDevice]
    resources: LinuxResources
    namespaces: list[LinuxNamespace]
    cgroupsPath: str
    maskedPaths: list[str]
    readonlyPaths: list[str]


class Mount(TypedDict, total=False):
    """``mounts[]``."""

    destination: Required[str]
    source: str
    type: str
    options: list[str]


class Hook(TypedDict, total=False):
    """One entry of a hook point's list."""

    path: Required[str]
    args: list[str]
    """``args[0]`` is the program name, as in execve."""
    env: list[str]
    timeout: int
    """Seconds."""


class Hooks(TypedDict, total=False):
    """``hooks``: each OCI hook point's list (CDI's hooks use ``createContainer``)."""

    prestart: list[Hook]
    createRuntime: list[Hook]
    createContainer: list[Hook]
    startContainer: list[Hook]
    poststart: list[Hook]
    poststop: list[Hook]


class User(TypedDict, total=False):
    """``process.user``."""

    uid: Required[int]
    gid: Required[int]
    umask: int
    additionalGids: list[int]


class Rlimit(TypedDict):
    """``process.rlimits[]``."""

    type: str
    hard: int
    soft: int


class Process(TypedDict, total=False):
    """``process``: what runs in the container."""

    terminal: bool
    user: User
    args: list[str]
    env: list[str]
    """``KEY=VALUE`` entries; for a repeated key the runtime keeps the last."""
    cwd: Required[str]
    capabilities: dict[str, list[str]]
    """Capability names by set: ``bounding``, ``effective``, ``inheritable``, ``permitted``,
    ``ambient``."""
    rlimits: list[Rlimit]
    noNewPrivileges: bool


class Root(TypedDict, total=False):
    """``root``: the container's root filesystem, relative to the bundle unless absolute."""

    path: Required[str]
    readonly: bool


class Config(TypedDict, total=False):
    """A bundle's ``config.json``."""

    ociVersion: Required[str]
    process: Process
    root: Root
    hostname: str
    mounts: list[Mount]
    hooks: Hooks
    annotations: dict[str, str]
    """Where the CRI marks the sandbox (pause) container, which never gets a GPU."""
    linux: Linux
