"""Several CDI specs as one namespace of fully qualified device names; named-device edits.

The reference library's cache, in miniature: every spec file of the CDI directories
(``/etc/cdi``, then ``/var/run/cdi``: a later directory has the higher priority) contributes
its devices under ``<kind>=<name>``. Resolution follows the reference:

* a device name defined by two specs of the **same** priority is a conflict: requesting it
  is an error naming both files (other names stay usable); a higher-priority spec simply
  wins over a lower one;
* a spec file that does not parse is left out and its error kept (:attr:`SpecSet.errors`),
  so one broken vendor file does not take every GPU down; an unknown-name error mentions it;
* the edits of a request are, for each requested device in order, the spec-level
  ``containerEdits`` of its spec (once per spec) followed by the device's own edits
  (``InjectDevices`` upstream). Requesting ``<kind>=all`` is today's "all GPUs" path.

On top of the reference, MIG devices are refused (:mod:`substrate_gpu.cdi.gpus` says how
they are recognised and why). :func:`edits_for_devices` is pure; :func:`load_spec_set` is
the thin effectful loader.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from substrate_gpu import exceptions
from substrate_gpu.cdi import gpus, model, names, parse

#: The file extensions the reference library reads from a CDI directory.
SPEC_EXTENSIONS: Final = (".json", ".yaml")


@dataclass(frozen=True)
class _Definition:
    spec: model.Spec
    device: model.Device
    priority: int


class SpecSet:
    """Specs indexed by qualified device name. Immutable once built; share it freely."""

    def __init__(
        self,
        specs: Iterable[model.Spec],
        *,
        priorities: Iterable[int] | None = None,
        errors: Iterable[exceptions.CdiSpecError] = (),
    ) -> None:
        """``priorities`` gives each spec's priority (default: all equal)."""
        self.specs: tuple[model.Spec, ...] = tuple(specs)
        prios = tuple(priorities) if priorities is not None else (0,) * len(self.specs)
        if len(prios) != len(self.specs):
            raise ValueError("SpecSet: one priority per spec")
        self.errors: tuple[exceptions.CdiSpecError, ...] = tuple(errors)
        """Spec files that did not parse (left out of the set)."""
        definitions: dict[names.QualifiedName, list[_Definition]] = {}
        for spec, priority in zip(self.specs, prios, strict=True):
            for device in spec.devices:
                key = names.qualified_name(spec.kind, device.name)
                definitions.setdefault(key, []).append(_Definition(spec, device, priority))
        self._devices: dict[names.QualifiedName, _Definition] = {}
        self._conflicts: dict[names.QualifiedName, tuple[str, ...]] = {}
        for key, found in definitions.items():
            top = max(d.priority for d in found)
            winners = [d for d in found if d.priority == top]
            if len(winners) > 1:
                self._conflicts[key] = tuple(d.spec.source for d in winners)
            else:
                self._devices[key] = winners[0]

    def devices(
        self, *, kind: str | None = None
    ) -> Iterator[tuple[names.QualifiedName, model.Device]]:
        """Every resolvable device (of ``kind``, when given), in spec then file order."""
        for key, definition in self._devices.items():
            if kind is None or key.kind == kind:
                yield key, definition.device

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds the set defines, sorted."""
        return tuple(sorted({spec.kind for spec in self.specs}))

    def conflict(self, name: names.QualifiedName) -> tuple[str, ...] | None:
        """The spec files that all define ``name`` at the same priority, or ``None``."""
        return self._conflicts.get(name)

    def lookup(self, name: names.QualifiedName) -> tuple[model.Spec, model.Device] | None:
        """The spec and device ``name`` resolves to; ``None`` if unknown or conflicting."""
        definition = self._devices.get(name)
        return None if definition is None else (definition.spec, definition.device)


def _unknown_error(spec_set: SpecSet, unknown: Sequence[names.QualifiedName]) -> str:
    parts = [f"unknown CDI device{'s' if len(unknown) > 1 else ''} {', '.join(map(str, unknown))}"]
    for kind in sorted({u.kind for u in unknown}):
        offered = [key.name for key, _ in spec_set.devices(kind=kind)]
        if offered:
            parts.append(f"{kind} offers: {', '.join(offered)}")
        else:
            known = ", ".join(spec_set.kinds) or "none"
            parts.append(f"no spec defines kind {kind} (kinds: {known})")
    if spec_set.errors:
        parts.append(
            "spec files left out for errors: " + "; ".join(str(e) for e in spec_set.errors)
        )
    return "; ".join(parts)


def _adds_nothing(merged: model.ContainerEdits, edits: model.ContainerEdits) -> bool:
    """Whether ``edits`` are already all in ``merged``: one GPU asked for by two of its names
    (its index and its UUID, whose entries carry the same edits), or one that ``all`` beside
    it already holds. Such a device counts once, as the reference library's result has each
    node once (a later node replaces one at the same path there)."""
    nodes = {node.path for node in merged.device_nodes}
    destinations = {mount.container_path for mount in merged.mounts}
    return (
        all(node.path in nodes for node in edits.device_nodes)
        and all(mount.container_path in destinations for mount in edits.mounts)
        and all(hook in merged.hooks for hook in edits.hooks)
        and all(entry in merged.env for entry in edits.env)
        and all(gid in merged.additional_gids for gid in edits.additional_gids)
        and edits.intel_rdt is None
        and not edits.net_devices
    )


def edits_for_devices(spec_set: SpecSet, requested: Sequence[str]) -> model.ContainerEdits:
    """The edits that give a container exactly the ``requested`` devices; pure.

    ``requested`` are fully qualified names (``nvidia.com/gpu=0``,
    ``nvidia.com/gpu=GPU-<uuid>``, a DRA claim's names, or ``nvidia.com/gpu=all``);
    a name given twice counts once, and so does a GPU given by two of its names (or beside
    ``all``): a device whose edits are all in already adds nothing. Raises
    :class:`~substrate_gpu.exceptions.DeviceRequestError` for a malformed, unknown or
    conflicting name (every unknown name is listed, with what the spec set offers) or for a
    device of an NVIDIA kind whose own edits carry no ``/dev/nvidia*`` node, and
    :class:`~substrate_gpu.exceptions.MigDeviceRefused` for a MIG device.
    """
    if not requested:
        raise exceptions.DeviceRequestError(
            "while resolving CDI devices: no device was requested (ask for a GPU by name,"
            " e.g. nvidia.com/gpu=0, or for nvidia.com/gpu=all)"
        )
    wanted = list(dict.fromkeys(names.parse_qualified_name(text) for text in requested))
    unknown: list[names.QualifiedName] = []
    chosen: list[tuple[model.Spec, model.Device]] = []
    for name in wanted:
        sources = spec_set.conflict(name)
        if sources is not None:
            raise exceptions.DeviceRequestError(
                f"while resolving CDI device {name}: it is defined by several specs of the same"
                f" priority ({', '.join(sources)}); remove or rename the duplicate definition"
            )
        found = spec_set.lookup(name)
        if found is None:
            unknown.append(name)
            continue
        reason = gpus.mig_reason(found[1])
        if reason is not None:
            raise exceptions.MigDeviceRefused(
                f"while resolving CDI device {name}: refused because {reason}; nvproxy"
                " (gVisor's GPU proxy) has no MIG support — request a full GPU, or disable"
                " MIG on this GPU (nvidia-smi -i <gpu> -mig 0)"
            )
        reason = gpus.no_nvidia_node_reason(found[1]) if gpus.is_nvidia_kind(name.kind) else None
        if reason is not None:
            raise exceptions.DeviceRequestError(
                f"while resolving CDI device {name}: refused because {reason}"
            )
        chosen.append(found)
    if unknown:
        raise exceptions.DeviceRequestError(
            f"while resolving CDI devices: {_unknown_error(spec_set, unknown)}"
        )
    merged = model.ContainerEdits()
    applied: list[model.Spec] = []
    # ``all`` first: a GPU named beside it (before or after) then adds nothing.
    for spec, device in sorted(chosen, key=lambda found: found[1].name != model.ALL_DEVICES):
        if not any(spec is seen for seen in applied):
            applied.append(spec)
            merged = merged.merged_with(spec.container_edits)
        if not _adds_nothing(merged, device.container_edits):
            merged = merged.merged_with(device.container_edits)
    reason = gpus.edits_mig_reason(merged)
    if reason is not None:
        raise exceptions.MigDeviceRefused(
            f"while resolving CDI devices {', '.join(map(str, wanted))}: refused because"
            f" {reason}; nvproxy (gVisor's GPU proxy) has no MIG support — disable MIG on this"
            " node's GPUs or request full GPUs by name"
        )
    if not merged.device_nodes:
        raise exceptions.DeviceRequestError(
            f"while resolving CDI devices {', '.join(map(str, wanted))}: their edits hold no"
            " device node, so no GPU would reach the container"
        )
    return merged


def edits_for_all(spec: model.Spec, *, refuse_mig: bool = True) -> model.ContainerEdits:
    """The edits that give a container every GPU: spec-level edits plus device ``all`` only.

    nvidia-ctk also writes per-index (``0``), per-UUID (``GPU-…``) and MIG devices repeating
    the same nodes; merging them would duplicate devices. Neither ``spec`` nor its parts are
    changed (they are frozen; the result is a new value). With ``refuse_mig`` (the default)
    edits holding MIG capability nodes raise
    :class:`~substrate_gpu.exceptions.MigDeviceRefused` (``all`` on a node with MIG enabled).
    """
    for index, device in enumerate(spec.devices):
        if device.name == model.ALL_DEVICES:
            merged = spec.container_edits.merged_with(device.container_edits)
            if not merged.device_nodes:
                raise exceptions.CdiSpecError(
                    spec.source,
                    f"devices[{index}].containerEdits.deviceNodes",
                    f"neither the spec-level containerEdits nor device {model.ALL_DEVICES!r}"
                    " has a device node, so no GPU would reach the container",
                )
            reason = gpus.edits_mig_reason(merged) if refuse_mig else None
            if reason is not None:
                raise exceptions.MigDeviceRefused(
                    f"while resolving CDI device {spec.kind}={model.ALL_DEVICES} of"
                    f" {spec.source}: refused because {reason}; nvproxy (gVisor's GPU proxy)"
                    " has no MIG support — disable MIG on this node's GPUs"
                    " (nvidia-smi -mig 0) or request full GPUs by name"
                )
            return merged
    names = ", ".join(repr(device.name) for device in spec.devices)
    raise exceptions.CdiSpecError(
        spec.source,
        "devices",
        f"no device named {model.ALL_DEVICES!r} (devices: {names}); regenerate the spec with"
        " `nvidia-ctk cdi generate`, which always writes it",
    )


class SpecDirReader:
    """Reads CDI directories into a :class:`SpecSet`, re-parsing only files that changed.

    A file is re-parsed when its (device, inode, size, mtime) changed, so an unchanged spec
    stays the very same object between reads (callers can key caches on identity).
    """

    def __init__(self, directories: Sequence[os.PathLike[str] | str]) -> None:
        self.directories = tuple(Path(d) for d in directories)
        self._parsed: dict[Path, tuple[tuple[int, int, int, int], model.Spec]] = {}

    def read(self, *, extra: Sequence[model.Spec] = ()) -> SpecSet:
        """Every ``*.json``/``*.yaml`` spec of the directories (a later one = higher priority).

        ``extra`` specs (the worker's generated spec) rank above every directory; a file
        whose path is an extra spec's source is not read twice. A missing directory holds
        no spec; a file that does not parse is recorded in :attr:`SpecSet.errors`.
        """
        specs: list[model.Spec] = []
        priorities: list[int] = []
        errors: list[exceptions.CdiSpecError] = []
        taken = {os.path.realpath(s.source) for s in extra}
        seen: set[Path] = set()
        for priority, directory in enumerate(self.directories):
            try:
                entries = sorted(directory.iterdir())
            except FileNotFoundError:
                continue
            except OSError as e:
                errors.append(
                    exceptions.CdiSpecError(str(directory), "", f"cannot list: {e.strerror or e}")
                )
                continue
            for path in entries:
                if path.suffix not in SPEC_EXTENSIONS or os.path.realpath(path) in taken:
                    continue
                try:
                    spec = self._load(path)
                except exceptions.CdiSpecError as e:
                    errors.append(e)
                    continue
                if spec is not None:
                    seen.add(path)
                    specs.append(spec)
                    priorities.append(priority)
        for stale in set(self._parsed) - seen:
            del self._parsed[stale]
        specs.extend(extra)
        priorities.extend([len(self.directories)] * len(extra))
        return SpecSet(specs, priorities=priorities, errors=errors)

    def _load(self, path: Path) -> model.Spec | None:
        try:
            st = path.stat()
        except OSError as e:
            raise exceptions.CdiSpecError(
                str(path), "", f"cannot stat the spec file: {e.strerror or e}"
            ) from e
        if not stat.S_ISREG(st.st_mode):
            return None
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._parsed.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        spec = parse.load_spec(path)
        self._parsed[path] = (key, spec)
        return spec


def load_spec_set(
    directories: Sequence[os.PathLike[str] | str],
    *,
    extra: Sequence[model.Spec | os.PathLike[str] | str] = (),
) -> SpecSet:
    """Read the specs of ``directories`` once (see :meth:`SpecDirReader.read`); an ``extra``
    entry is a parsed spec or the path of one (read with :func:`.parse.load_spec`)."""
    specs = [s if isinstance(s, model.Spec) else parse.load_spec(s) for s in extra]
    return SpecDirReader(directories).read(extra=specs)
