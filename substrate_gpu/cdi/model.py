"""The CDI spec as immutable values.

Only what the CDI specification defines (v0.1.0 – v1.1.0). Everything is frozen and held in
tuples, so "copy slices before merging so the parsed spec is never mutated" holds by
construction: merging builds new values, a parsed :class:`Spec` can be shared between
actors and cached per worker without defensive copies.

Field names follow Python style; the JSON names are given in each docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The device whose edits we apply. nvidia-ctk also emits per-index ("0"), per-UUID
#: ("GPU-…") and MIG devices that repeat the same nodes; a worker gets all its GPUs.
ALL_DEVICES = "all"

#: ``permissions`` asking for a device cgroup rule that grants no access (the reference's
#: ``NoPermissions``, v1.1.1): the node exists in the container, opening it is refused.
NO_PERMISSIONS = "none"


@dataclass(frozen=True)
class DeviceNode:
    """One entry of ``containerEdits.deviceNodes``."""

    path: str
    """``path``: where the node appears in the container (absolute)."""
    host_path: str | None = None
    """``hostPath``: the node on the host when it differs from ``path``."""
    type: str | None = None
    """``type``: ``c``, ``b``, ``u`` or ``p``; ``None`` when the spec leaves it to the runtime."""
    major: int | None = None
    """``major``: ``None`` when omitted (nvidia-ctk usually omits it; the runtime stats it)."""
    minor: int | None = None
    """``minor``: ``None`` when omitted (a spec with ``major: 195`` and no minor means minor 0)."""
    file_mode: int | None = None
    """``fileMode``: permission bits of the node inside the container."""
    permissions: str | None = None
    """``permissions``: cgroup access, a subset of ``rwm``, or ``"none"`` (a rule granting
    nothing); ``None`` when omitted or ``""`` (the default, ``rwm``)."""
    uid: int | None = None
    """``uid``: owner inside the container."""
    gid: int | None = None
    """``gid``: group inside the container."""

    @property
    def source(self) -> str:
        """The host path of the node (``hostPath``, falling back to ``path``)."""
        return self.host_path or self.path


@dataclass(frozen=True)
class Mount:
    """One entry of ``containerEdits.mounts``."""

    host_path: str
    """``hostPath``: the file or directory on the host."""
    container_path: str
    """``containerPath``: the mount destination in the container."""
    type: str | None = None
    """``type``: mount type; ``None`` means a bind mount."""
    options: tuple[str, ...] = ()
    """``options``: mount options, in the order given (e.g. ``ro,nosuid,nodev,bind``)."""


@dataclass(frozen=True)
class Hook:
    """One entry of ``containerEdits.hooks``."""

    hook_name: str
    """``hookName``: the OCI hook point (``createContainer``, ``prestart``, …)."""
    path: str
    """``path``: the executable (absolute)."""
    args: tuple[str, ...] = ()
    """``args``: full argv including ``argv[0]``."""
    env: tuple[str, ...] = ()
    """``env``: ``KEY=VALUE`` entries."""
    timeout: int | None = None
    """``timeout``: seconds, when set."""


@dataclass(frozen=True)
class IntelRdt:
    """``containerEdits.intelRdt`` (CDI ≥ 0.7.0): Intel RDT settings for the container.

    Parsed so that nothing in a spec is silently dropped; GPU injection does not apply it.
    """

    clos_id: str | None = None
    """``closID``: the RDT class of service (a file name)."""
    l3_cache_schema: str | None = None
    """``l3CacheSchema``."""
    mem_bw_schema: str | None = None
    """``memBwSchema``."""
    schemata: tuple[str, ...] | None = None
    """``schemata`` (CDI ≥ 1.1.0); ``None`` when absent (an empty list still counts as set)."""
    enable_monitoring: bool = False
    """``enableMonitoring`` (CDI ≥ 1.1.0)."""
    enable_cmt: bool = False
    """``enableCMT`` (CDI 0.7.0 – 1.0.x; removed in 1.1.0)."""
    enable_mbm: bool = False
    """``enableMBM`` (CDI 0.7.0 – 1.0.x; removed in 1.1.0)."""


@dataclass(frozen=True)
class NetDevice:
    """One entry of ``containerEdits.netDevices`` (CDI ≥ 1.1.0); not applied by GPU injection."""

    host_interface_name: str
    """``hostInterfaceName``: the network interface on the host."""
    name: str
    """``name``: the interface name inside the container."""


@dataclass(frozen=True)
class ContainerEdits:
    """``containerEdits``: what a spec or a device adds to a container."""

    env: tuple[str, ...] = ()
    """``env``: ``KEY=VALUE`` entries, in order."""
    device_nodes: tuple[DeviceNode, ...] = ()
    """``deviceNodes``."""
    mounts: tuple[Mount, ...] = ()
    """``mounts``."""
    hooks: tuple[Hook, ...] = ()
    """``hooks``."""
    additional_gids: tuple[int, ...] = ()
    """``additionalGids`` (CDI ≥ 0.7.0)."""
    intel_rdt: IntelRdt | None = None
    """``intelRdt`` (CDI ≥ 0.7.0); carried, not applied by GPU injection."""
    net_devices: tuple[NetDevice, ...] = ()
    """``netDevices`` (CDI ≥ 1.1.0); carried, not applied by GPU injection."""

    def merged_with(self, other: ContainerEdits) -> ContainerEdits:
        """A new value holding ``self``'s edits followed by ``other``'s; neither is changed."""
        return ContainerEdits(
            env=self.env + other.env,
            device_nodes=self.device_nodes + other.device_nodes,
            mounts=self.mounts + other.mounts,
            hooks=self.hooks + other.hooks,
            additional_gids=self.additional_gids
            + tuple(g for g in other.additional_gids if g not in self.additional_gids),
            # As in the reference library: a later intelRdt replaces an earlier one.
            intel_rdt=other.intel_rdt if other.intel_rdt is not None else self.intel_rdt,
            net_devices=self.net_devices + other.net_devices,
        )

    @property
    def is_empty(self) -> bool:
        """True when the edits change nothing."""
        return not (
            self.env
            or self.device_nodes
            or self.mounts
            or self.hooks
            or self.additional_gids
            or self.intel_rdt is not None
            or self.net_devices
        )


@dataclass(frozen=True)
class Device:
    """One entry of ``devices``."""

    name: str
    """``name``: unique within the spec (``all``, ``0``, ``GPU-…``)."""
    container_edits: ContainerEdits
    """``containerEdits`` of this device."""
    annotations: tuple[tuple[str, str], ...] = ()
    """``annotations``, as sorted pairs (hashable)."""


@dataclass(frozen=True)
class Spec:
    """A whole CDI spec file."""

    cdi_version: str
    """``cdiVersion``."""
    kind: str
    """``kind``: ``vendor/class``, e.g. ``nvidia.com/gpu``."""
    devices: tuple[Device, ...]
    """``devices``, in file order."""
    container_edits: ContainerEdits = field(default_factory=ContainerEdits)
    """Spec-level ``containerEdits``: applied whenever any device of the spec is requested."""
    annotations: tuple[tuple[str, str], ...] = ()
    """``annotations``, as sorted pairs."""
    source: str = "<string>"
    """Where the spec was read from, for error messages."""
    ignored_fields: tuple[str, ...] = ()
    """Field paths present in the input but unknown to this parser: only ever in a spec whose
    ``cdiVersion`` is newer than any the parser knows (see :attr:`warning`)."""

    @property
    def warning(self) -> str | None:
        """What a caller should warn about: a newer ``cdiVersion`` read with its unknown
        fields ignored (``None`` for a spec of a version the parser knows)."""
        if not self.ignored_fields:
            return None
        return (
            f"{self.source}: cdiVersion {self.cdi_version} is newer than this parser knows;"
            f" ignored its unknown fields: {', '.join(self.ignored_fields)}"
        )

    def device(self, name: str) -> Device | None:
        """The device called ``name``, or ``None``."""
        return next((d for d in self.devices if d.name == name), None)
