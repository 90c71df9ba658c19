"""CDI edits → OCI config: the pure core of GPU injection.

Everything here is a function on plain data: :func:`plan_injection` turns the merged CDI
edits plus the resolved device numbers into an :class:`InjectionPlan`, and
:func:`apply_plan` returns a *new* OCI config with the plan applied (the input is never
mutated). Reading and writing the bundle lives in :mod:`substrate_gpu.injection.bundle`.

Each rule and its reason (see docs/gpu-injection.md):

- Devices go to ``linux.devices`` (replacing an entry at the same path) **and** block and
  char devices get a matching cgroup allow rule in ``linux.resources.devices``; without the
  rule the actor sees the node and gets EPERM. A FIFO (``p``) gets no rule (the reference
  adds rules for ``b``/``c`` only), nor does a node the spec gives ``permissions: none``
  (the node without access, CDI v1.1.1+). A node without uid/gid takes the process's, when
  non-zero (so a non-root actor owns its GPU node, as with the reference).
- A bundle that already holds a GPU node (``/dev/nvidiaN``) the plan does not grant is
  refused: injecting GPU 1 next to an earlier injection's GPU 2 would hand out two GPUs.
- Mounts are copied as given (type defaults to ``bind``; in a bundle with a user namespace
  and both uid and gid mappings a bind mount gets ``idmap``, an ``rbind`` one ``ridmap``, as
  the reference v1.1.2 does); a spec mount replaces a mount the
  config already has at the same destination and is appended after the config's; then all
  mounts are sorted, stably, by the depth of their destination only (the separators in the
  cleaned path), as the CDI reference does since v1.0.0: a parent directory is mounted
  before anything below it, and mounts of the same depth keep their order (a runtime's
  baseline ``/proc``, ``/dev``, ``/sys`` stays in that order).
- ``additionalGids`` skip GID 0 (the reference does: never add the root group to an actor).
- Every ``NVIDIA_VISIBLE_DEVICES=`` entry is dropped, the image's and the spec's alike:
  with it set, runsc runs nvidia-container-cli itself and injects a second time.
- The driver library directory is prepended to ``LD_LIBRARY_PATH`` exactly once, keeping
  the image's value after it: CDI never sets it, and an image that overrides it would see
  0 CUDA devices. Exactly one ``LD_LIBRARY_PATH=`` entry remains (in OCI a later entry wins,
  so two entries would silently drop ours).
- Hooks go through the allowlist of :mod:`substrate_gpu.injection.hooks`.
"""

from __future__ import annotations

import copy
import functools
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from substrate_gpu import exceptions
from substrate_gpu.injection import hooks as hooks_
from substrate_gpu.injection import oci_bodies

if TYPE_CHECKING:
    from collections.abc import Iterable

    from substrate_gpu.cdi import model
    from substrate_gpu.injection.devices import ResolvedDevice

#: An OCI runtime config (config.json) as parsed JSON (field types: :mod:`.oci_bodies`).
OciConfig = oci_bodies.Config

_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
_LD_LIBRARY_PATH = "LD_LIBRARY_PATH"

#: Annotations that mark the pod sandbox ("pause") container, which never gets a GPU.
SANDBOX_CONTAINER_ANNOTATIONS = {
    "io.kubernetes.cri.container-type": "sandbox",  # containerd
    "io.kubernetes.cri-o.ContainerType": "sandbox",  # CRI-O
    "dev.gvisor.spec.container-type": "sandbox",  # gVisor's own marker
}


@dataclass(frozen=True)
class InjectionPlan:
    """Everything one GPU injection adds to an OCI config."""

    devices: tuple[ResolvedDevice, ...]
    """Device nodes with their numbers, deduplicated, in spec order."""
    mounts: tuple[model.Mount, ...]
    """Mounts, deduplicated by destination, in spec order."""
    env: tuple[str, ...]
    """The spec's env entries, without ``NVIDIA_VISIBLE_DEVICES``."""
    driver_library_dir: str | None
    """Container directory prepended to ``LD_LIBRARY_PATH`` (``None``: leave it alone)."""
    hooks: tuple[model.Hook, ...]
    """Allowlisted createContainer hooks, rewritten to the mounted toolkit."""
    skipped_hooks: tuple[hooks_.HookDecision, ...]
    """Hooks left out, with the reason (each is logged by name)."""
    hook_subcommands: tuple[str, ...]
    """The subcommand of each of :attr:`hooks` (reported per injection)."""
    skipped_hook_names: tuple[str, ...]
    """The name of each of :attr:`skipped_hooks` (reported per injection)."""
    additional_gids: tuple[int, ...]
    """Supplementary groups for the actor's process (never 0)."""
    libraries: tuple[tuple[Path, str], ...] = ()
    """(host file, container path) of mounted files whose name contains ``.so.``: the
    libraries whose SONAME links are staged."""
    mount_destinations: frozenset[str] = frozenset()
    """The cleaned destinations of :attr:`mounts` (a config mount there is replaced)."""
    device_paths: frozenset[str] = frozenset()
    """The container paths of :attr:`devices`."""


def env_key(entry: str) -> str:
    """The variable name of a ``KEY=VALUE`` entry."""
    return entry.partition("=")[0]


def driver_library_dir(edits: model.ContainerEdits, driver_root: str) -> str | None:
    """The container path of ``<driver-root>/lib64``, as the spec mounts it.

    nvidia-ctk may mount the driver's libraries at another path than the host's (with a
    driver root it strips the prefix), so we look at where the spec puts them: first the
    directory of the mounted ``libcuda.so.*``, then of any mount from ``<driver-root>/lib64``.
    ``None`` when the spec mounts no driver library (nothing to point the loader at).
    """
    lib64 = posixpath.join(driver_root, "lib64")
    for mount in edits.mounts:
        if posixpath.basename(mount.container_path).startswith("libcuda.so."):
            return posixpath.dirname(mount.container_path)
    for mount in edits.mounts:
        if posixpath.dirname(mount.host_path) == lib64:
            return posixpath.dirname(mount.container_path)
    return None


@functools.lru_cache(maxsize=4096)
def _host_path(path: str) -> Path:
    """One ``Path`` object per host file, shared by every plan: later stages compare the
    plans' libraries by identity first (a worker's device sets share their libraries)."""
    return Path(path)


def plan_injection(
    edits: model.ContainerEdits,
    devices: tuple[ResolvedDevice, ...],
    *,
    driver_root: str,
    hook_binary: str,
) -> InjectionPlan:
    """Decide what to inject; pure."""
    mounts: list[model.Mount] = []
    destinations: set[str] = set()
    for mount in edits.mounts:
        if mount.container_path not in destinations:
            destinations.add(mount.container_path)
            mounts.append(mount)
    kept: list[model.Hook] = []
    skipped: list[hooks_.HookDecision] = []
    for hook in edits.hooks:
        decision = hooks_.classify_hook(hook)
        if decision.verdict == "keep" and decision.subcommand is not None:
            kept.append(hooks_.rewrite_hook(hook, decision.subcommand, hook_binary))
        else:
            skipped.append(decision)
    return InjectionPlan(
        libraries=tuple(
            (_host_path(m.host_path), m.container_path)
            for m in mounts
            if ".so." in posixpath.basename(m.container_path)
        ),
        devices=devices,
        mounts=tuple(mounts),
        mount_destinations=frozenset(_clean(m.container_path) for m in mounts),
        device_paths=frozenset(d.path for d in devices),
        env=tuple(e for e in edits.env if env_key(e) != _VISIBLE_DEVICES),
        driver_library_dir=driver_library_dir(edits, driver_root),
        hooks=tuple(kept),
        skipped_hooks=tuple(skipped),
        hook_subcommands=tuple(h.args[1] for h in kept),
        skipped_hook_names=tuple(d.name for d in skipped),
        additional_gids=tuple(g for g in edits.additional_gids if g != 0),
    )


# --- reading the OCI config without trusting it -------------------------------------------


def _child(parent: dict[str, object], key: str, where: str) -> dict[str, object]:
    value = parent.setdefault(key, {})
    if not isinstance(value, dict):
        raise exceptions.InjectionError(
            f"while injecting GPUs: config.json {where}.{key} is {type(value).__name__}, "
            "expected an object"
        )
    return value


def _list(parent: dict[str, object], key: str, where: str) -> list[object]:
    value = parent.get(key)
    if value is None:
        value = []
        parent[key] = value
    if not isinstance(value, list):
        raise exceptions.InjectionError(
            f"while injecting GPUs: config.json {where}.{key} is {type(value).__name__}, "
            "expected a list"
        )
    return value


def _existing_device_paths(config: OciConfig) -> set[str]:
    linux = config.get("linux")
    devices = linux.get("devices") if isinstance(linux, dict) else None
    if not isinstance(devices, list):
        return set()
    return {str(d.get("path")) for d in devices if isinstance(d, dict)}


def already_injected(config: OciConfig, plan: InjectionPlan, *, where: str = "config.json") -> bool:
    """True when the bundle already holds every device node the plan would add.

    The node agent re-unpacks bundles before each run/restore, but that invariant lives
    elsewhere; this guard keeps a second injection from doubling anything. It refuses
    first (:func:`refuse_foreign_gpus`): a bundle holding GPUs the plan does not grant
    is not "already injected" with a subset of them, it is another actor's bundle.
    """
    refuse_foreign_gpus(config, plan, where=where)
    return bool(plan.devices) and plan.device_paths <= _existing_device_paths(config)


def nvidia_device_paths(config: OciConfig) -> list[str]:
    """The ``/dev/nvidia*`` nodes the config already holds, sorted."""
    return sorted(p for p in _existing_device_paths(config) if p.startswith("/dev/nvidia"))


def withheld(config: OciConfig, *, where: str = "config.json") -> OciConfig | None:
    """``config`` for a sandbox's app container given no GPU while others of its sandbox
    are (GPUs per container): its image's ``NVIDIA_VISIBLE_DEVICES`` dropped (a CUDA image
    sets it; with the toolkit's hook runsc would read it as a GPU request), nothing added;
    None when there is nothing to drop (left byte-for-byte as it was). Refuses a config
    that holds an NVIDIA device node already (injected before, or given by whoever wrote
    it): that container must not hold a GPU, and removing one is not ours to decide."""
    held = nvidia_device_paths(config)
    if held:
        raise exceptions.InjectionError(
            f"while withholding GPUs: {where} holds {', '.join(held)}, but its container was"
            " given no GPU (its config asks for none while other containers of the sandbox"
            " name theirs); re-create the bundle from the image"
        )
    process = config.get("process")
    if not isinstance(process, dict):
        return None
    env = process.get("env")
    if not isinstance(env, list) or not any(
        isinstance(e, str) and env_key(e) == _VISIBLE_DEVICES for e in env
    ):
        return None
    kept = [e for e in env if not (isinstance(e, str) and env_key(e) == _VISIBLE_DEVICES)]
    return cast("OciConfig", {**config, "process": {**process, "env": kept}})


def is_sandbox_container(config: OciConfig) -> bool:
    """True for the pod's pause/root container, which must never get a GPU."""
    annotations = config.get("annotations")
    if not isinstance(annotations, dict):
        return False
    return any(annotations.get(k) == v for k, v in SANDBOX_CONTAINER_ANNOTATIONS.items())


def _merge_ld_library_path(env: list[str], driver_dir: str) -> list[str]:
    existing = [e for e in env if env_key(e) == _LD_LIBRARY_PATH]
    current = existing[-1].partition("=")[2] if existing else ""
    parts = [p for p in current.split(":") if p and p != driver_dir]
    merged = ":".join([driver_dir, *parts])
    return [e for e in env if env_key(e) != _LD_LIBRARY_PATH] + [f"{_LD_LIBRARY_PATH}={merged}"]


def merge_env(image_env: Iterable[str], plan: InjectionPlan) -> list[str]:
    """The actor's env after injection (see the module docstring for the rules)."""
    spec_keys = {env_key(e) for e in plan.env}
    env = [e for e in image_env if env_key(e) != _VISIBLE_DEVICES and env_key(e) not in spec_keys]
    env.extend(plan.env)
    if plan.driver_library_dir is not None:
        env = _merge_ld_library_path(env, plan.driver_library_dir)
    return env


#: Device types that get a cgroup rule (the reference: block and char only).
CGROUP_TYPES = frozenset({"b", "c"})

#: A GPU device node (any index).
_GPU_NODE = re.compile(r"/dev/nvidia[0-9]+")


def _device_entry(device: ResolvedDevice, uid: int, gid: int) -> oci_bodies.LinuxDevice:
    entry: oci_bodies.LinuxDevice = {
        "path": device.path,
        "type": device.type,
        "major": device.major,
        "minor": device.minor,
    }
    if device.file_mode is not None:
        entry["fileMode"] = device.file_mode
    # As the reference: unset owner → the process's, when it is not root (0 is the default).
    owner = device.uid if device.uid is not None else (uid or None)
    group = device.gid if device.gid is not None else (gid or None)
    if owner is not None:
        entry["uid"] = owner
    if group is not None:
        entry["gid"] = group
    return entry


def _cgroup_rule(device: ResolvedDevice) -> oci_bodies.LinuxDeviceCgroup:
    return {
        "allow": True,
        "type": device.type,
        "major": device.major,
        "minor": device.minor,
        "access": device.permissions,
    }


def foreign_gpu_nodes(config: OciConfig, plan: InjectionPlan) -> list[str]:
    """GPU nodes the bundle already holds that ``plan`` does not grant, sorted."""
    existing = _existing_device_paths(config)
    if not existing:
        return []  # the usual fresh bundle
    granted = plan.device_paths
    return sorted(p for p in existing if _GPU_NODE.fullmatch(p) and p not in granted)


def refuse_foreign_gpus(
    config: OciConfig, plan: InjectionPlan, *, where: str = "config.json"
) -> None:
    """Raise :class:`~substrate_gpu.exceptions.InjectionError` when the bundle holds GPU
    nodes ``plan`` does not grant: it was injected before with other GPUs, and neither
    adding these nor calling it done may hand an actor GPUs it was not given. ``where``
    names the config in the message."""
    foreign = foreign_gpu_nodes(config, plan)
    if foreign:
        raise exceptions.InjectionError(
            f"while injecting GPUs: {where} already holds {', '.join(foreign)}, which this"
            f" injection does not grant ({', '.join(d.path for d in plan.devices)}); the bundle"
            " was injected before with other or more GPUs — re-create it from the image"
        )


def _mount_entry(mount: model.Mount, *, idmapped: bool) -> oci_bodies.Mount:
    options = list(mount.options)
    extra = _idmap_option(mount) if idmapped else None
    if extra is not None:
        options.append(extra)
    return {
        "destination": mount.container_path,
        "type": mount.type or "bind",
        "source": mount.host_path,
        "options": options,
    }


def _idmap_option(mount: model.Mount) -> str | None:
    """The option the reference adds to a bind mount in a user namespace (``withIDMapFor
    BindMount``): ``idmap`` for a ``bind``, ``ridmap`` for an ``rbind`` (the last of the
    two options wins), none when the spec already asks for either."""
    option = "idmap" if mount.type == "bind" else None
    for given in mount.options:
        if given in ("idmap", "ridmap"):
            return None
        if given == "bind":
            option = "idmap"
        elif given == "rbind":
            option = "ridmap"
    return option


def _has_id_mapping_namespace(linux: dict[str, object]) -> bool:
    """A user namespace with both uid and gid mappings (reference v1.1.2: runc refuses id-
    mapped mounts unless both are present; v1.1.1 and older looked at the namespace only)."""
    namespaces = linux.get("namespaces")
    user = isinstance(namespaces, list) and any(
        isinstance(ns, dict) and ns.get("type") == "user" for ns in namespaces
    )
    return user and bool(linux.get("uidMappings")) and bool(linux.get("gidMappings"))


def _hook_entry(hook: model.Hook) -> oci_bodies.Hook:
    entry: oci_bodies.Hook = {"path": hook.path, "args": list(hook.args)}
    if hook.env:
        entry["env"] = list(hook.env)
    if hook.timeout is not None:
        entry["timeout"] = hook.timeout
    return entry


def _clean(path: str) -> str:
    """``posixpath.normpath``, skipped for the usual already-clean absolute path (hot path)."""
    if path.startswith("/") and "//" not in path and "/." not in path and not path.endswith("/"):
        return path
    return posixpath.normpath(path) if path else path


def _depth(mount: object) -> int:
    """The reference's ``orderedMounts`` key: separators in the cleaned destination."""
    destination = mount.get("destination") if isinstance(mount, dict) else None
    return _clean(destination).count("/") if isinstance(destination, str) else 0


def _process_ids(process: dict[str, object]) -> tuple[int, int]:
    user = process.get("user")
    if not isinstance(user, dict):
        return 0, 0
    uid, gid = user.get("uid"), user.get("gid")
    return (
        uid if isinstance(uid, int) and not isinstance(uid, bool) else 0,
        gid if isinstance(gid, int) and not isinstance(gid, bool) else 0,
    )


def apply_plan(config: OciConfig, plan: InjectionPlan, *, in_place: bool = False) -> OciConfig:
    """A new OCI config with ``plan`` applied; ``config`` is not modified.

    ``in_place=True`` edits ``config`` itself instead of a deep copy: for a caller that owns
    a freshly parsed config (the bundle writer), the copy is pure overhead.

    Entries already present (same device path or mount destination: replaced; identical
    rule or hook: kept once) are not added twice. Raises
    :class:`~substrate_gpu.exceptions.InjectionError` when the config has the wrong shape
    where we must write, or holds GPU nodes the plan does not grant.
    """
    refuse_foreign_gpus(config, plan)
    result = config if in_place else copy.deepcopy(config)
    # Walked as untrusted JSON: every level is type-checked before it is written to.
    raw = cast("dict[str, object]", result)
    process = _child(raw, "process", "")
    uid, gid = _process_ids(process)
    linux = _child(raw, "linux", "")
    devices = _list(linux, "devices", ".linux")
    replaced = plan.device_paths
    devices[:] = [d for d in devices if not (isinstance(d, dict) and d.get("path") in replaced)]
    devices.extend(_device_entry(d, uid, gid) for d in plan.devices)

    rules = _list(_child(linux, "resources", ".linux"), "devices", ".linux.resources")
    for device in plan.devices:
        if device.type not in CGROUP_TYPES or not device.permissions:
            # No access ("none"): the reference writes an allow rule with empty access,
            # which grants nothing and which runc refuses ("device access at 4 field
            # cannot be empty"); no rule at all is the same policy, and runs.
            continue
        rule = _cgroup_rule(device)
        if rule not in rules:
            rules.append(rule)

    if plan.mounts:
        mounts = _list(raw, "mounts", "")
        ours = plan.mount_destinations
        mounts[:] = [
            m
            for m in mounts
            if not (isinstance(m, dict) and _clean(str(m.get("destination") or "")) in ours)
        ]
        idmapped = _has_id_mapping_namespace(linux)
        mounts.extend(_mount_entry(m, idmapped=idmapped) for m in plan.mounts)
        mounts.sort(key=_depth)  # stable: the same depth keeps the order above

    process["env"] = merge_env((str(e) for e in _list(process, "env", ".process")), plan)

    if plan.additional_gids:
        user = _child(process, "user", ".process")
        gids = _list(user, "additionalGids", ".process.user")
        gids.extend(g for g in plan.additional_gids if g not in gids)

    if plan.hooks:
        hook_list = _list(_child(raw, "hooks", ""), hooks_.HOOK_POINT, ".hooks")
        for hook in plan.hooks:
            entry = _hook_entry(hook)
            if entry not in hook_list:
                hook_list.append(entry)
    return result
