"""Resolving CDI device nodes against the host, and detecting a worker's GPUs.

nvidia-ctk usually leaves ``major``/``minor`` unset: CDI delegates them to the OCI
runtime, which stats the node on the host. We fill them in ourselves before handing the
bundle to runsc, because an OCI device with major 0 becomes a 0,0 char device in the
actor and NVML then reports that it cannot talk to the driver.

Rules (the CDI reference library's ``fillMissingInfo``, checked against podman's copy of it):

* every node is stat-ed on the host, and the host gives ``fileMode`` when the spec gives
  none — **even for a complete node** (the reference does so since v1.0: a runtime that
  turns device nodes into bind mounts needs the mode);
* a node is **complete** when the spec gives its ``type`` and a non-zero ``major`` (or type
  ``p``): apart from the mode it is taken as written, and a host without the node is not an
  error (a vendor may describe a node fully);
* any other node must exist on the host (a missing node is an error): the host gives the
  type (a type the spec gives must match) — nvidia-ctk ≥ 1.19 writes ``major: 195`` and no
  type, so this is the common case;
* a spec's non-zero ``major`` keeps the spec's numbers (a real spec writes ``/dev/nvidia0``
  as ``major: 195`` with ``minor`` omitted, meaning 0); otherwise the host's numbers are used.
  A FIFO (``p``) has no numbers.

``dev_root`` is a host-root prefix (like nvidia-ctk's ``--dev-root``): the same code
resolves ``/dev/nvidia0`` against ``/`` on a node, against ``/host`` in a containerised
agent, or against a test tree.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from substrate_gpu import exceptions

if TYPE_CHECKING:
    from collections.abc import Iterable

    from substrate_gpu.cdi import model

#: GPU device nodes (any index: a worker on a shared node may hold nvidia2 and nvidia3 only).
_GPU_NODE = re.compile(r"^nvidia[0-9]+$")

#: cgroup access granted when the spec gives none (the CDI reference default).
DEFAULT_PERMISSIONS = "rwm"
#: A spec's ``permissions: none`` (``cdi.model.NO_PERMISSIONS``): the rule grants nothing.
NO_ACCESS = "none"


@dataclass(frozen=True)
class ResolvedDevice:
    """A device node with every number the OCI runtime needs."""

    path: str
    """Where the node appears in the container."""
    host_path: str
    """The node on the host, as named by the spec (before the dev-root prefix)."""
    type: str
    """``c``, ``b``, ``u`` or ``p``; only ``b`` and ``c`` get a cgroup rule."""
    major: int
    """Major number (0 for ``p``)."""
    minor: int
    """Minor number (0 for ``p``)."""
    permissions: str
    """cgroup access, a subset of ``rwm``; empty for a spec's ``"none"`` (no access)."""
    file_mode: int | None = None
    """Permission bits inside the container (from the spec, else the host node)."""
    uid: int | None = None
    """Owner inside the container, when the spec sets one (else the process's uid)."""
    gid: int | None = None
    """Group inside the container, when the spec sets one (else the process's gid)."""


def host_path_under(dev_root: Path, path: str) -> Path:
    """``path`` (absolute on the host) seen under ``dev_root``."""
    return dev_root / path.lstrip("/")


def _type_of(mode: int) -> str | None:
    if stat.S_ISCHR(mode):
        return "c"
    if stat.S_ISBLK(mode):
        return "b"
    if stat.S_ISFIFO(mode):
        return "p"
    return None


def cgroup_access(permissions: str | None) -> str:
    """The device cgroup rule's access for a node's ``permissions``: ``rwm`` when omitted,
    empty (no access) for ``"none"``, else as given (the reference's mapping)."""
    if permissions is None:
        return DEFAULT_PERMISSIONS
    return "" if permissions == NO_ACCESS else permissions


def _complete(node: model.DeviceNode) -> bool:
    """True when the spec says everything the runtime needs (no host stat upstream)."""
    return node.type is not None and (bool(node.major) or node.type == "p")


def resolve_device(node: model.DeviceNode, *, dev_root: Path) -> ResolvedDevice:
    """Fill in type/major/minor/fileMode for one node (see the module docstring)."""
    permissions = cgroup_access(node.permissions)
    # String paths and os.stat: this runs for every node of every actor (pathlib's joins
    # cost more than the stat itself here).
    on_host = os.path.join(dev_root, node.source.lstrip("/"))  # noqa: PTH118
    try:
        st = os.stat(on_host)  # noqa: PTH116
    except OSError as e:
        if _complete(node):
            return _as_written(node, permissions, node.file_mode)
        raise exceptions.DeviceResolutionError(
            f"while resolving device node {node.path}: cannot stat {on_host} on the host "
            f"({e.strerror or e}); the CDI spec names a device this worker does not have — "
            "regenerate the spec on this worker (nvidia-ctk cdi generate)"
        ) from e
    file_mode = node.file_mode if node.file_mode is not None else stat.S_IMODE(st.st_mode)
    if _complete(node):
        return _as_written(node, permissions, file_mode)
    kind = _type_of(st.st_mode)
    if kind is None:
        raise exceptions.DeviceResolutionError(
            f"while resolving device node {node.path}: {on_host} is not a device node "
            f"(mode {stat.filemode(st.st_mode)}); refusing to pass it as a device"
        )
    if node.type is not None and node.type != kind and not (node.type == "u" and kind == "c"):
        raise exceptions.DeviceResolutionError(
            f"while resolving device node {node.path}: the spec says type {node.type!r} "
            f"but {on_host} is type {kind!r}"
        )
    if kind == "p":
        major, minor = 0, 0
    elif node.major:
        major, minor = node.major, node.minor or 0
    else:
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    return ResolvedDevice(
        path=node.path,
        host_path=node.source,
        type=node.type or kind,
        major=major,
        minor=minor,
        permissions=permissions,
        file_mode=file_mode,
        uid=node.uid,
        gid=node.gid,
    )


def _as_written(node: model.DeviceNode, permissions: str, file_mode: int | None) -> ResolvedDevice:
    """A complete node: the spec's type and numbers, as written."""
    return ResolvedDevice(
        path=node.path,
        host_path=node.source,
        type=node.type or "c",
        major=node.major or 0,
        minor=node.minor or 0,
        permissions=permissions,
        file_mode=file_mode,
        uid=node.uid,
        gid=node.gid,
    )


def host_fingerprint(
    nodes: Iterable[model.DeviceNode], *, dev_root: Path = Path("/")
) -> tuple[object, ...]:
    """What :func:`resolve_device` reads from the host for each node: the mode, type and
    numbers of its host node (``None`` for one that cannot be stat-ed)."""
    seen: list[object] = []
    for node in nodes:
        try:
            st = os.stat(os.path.join(dev_root, node.source.lstrip("/")))  # noqa: PTH116, PTH118
        except OSError:
            seen.append(None)
        else:
            seen.append((st.st_mode, st.st_rdev))
    return tuple(seen)


def resolve_device_numbers(
    nodes: Iterable[model.DeviceNode], *, dev_root: Path = Path("/")
) -> tuple[ResolvedDevice, ...]:
    """Resolve every node, deduplicated by container path (first wins), in spec order.

    Raises :class:`~substrate_gpu.exceptions.DeviceResolutionError` on the first node that
    cannot be resolved; nothing has been written anywhere at that point.
    """
    seen: set[str] = set()
    resolved: list[ResolvedDevice] = []
    for node in nodes:
        if node.path in seen:
            continue
        seen.add(node.path)
        resolved.append(resolve_device(node, dev_root=dev_root))
    return tuple(resolved)


def detect_gpus(dev_root: Path = Path("/")) -> tuple[str, ...]:
    """The worker's GPU nodes (``/dev/nvidia[0-9]*``, any index), as container paths, sorted."""
    dev = dev_root / "dev"
    try:
        names = [p.name for p in dev.iterdir()]
    except OSError:
        return ()
    found = sorted((n for n in names if _GPU_NODE.match(n)), key=lambda n: int(n[6:]))
    return tuple(f"/dev/{n}" for n in found)


def has_gpu(dev_root: Path = Path("/")) -> bool:
    """True when the worker holds any NVIDIA GPU node (decides ``--nvproxy``)."""
    return bool(detect_gpus(dev_root))
