"""Durable-dir volumes: bound into the app containers, archived into snapshots, restored.

A durable-dir volume is a directory atelet makes for the actor under
``actor_dirs.durable_dir_volume_mounts_dir/<volume>``, whose contents outlive the sandbox:
upstream's worker (``cmd/ateworker-gvisor/durable.go`` at ``533900d``) keeps them in the
snapshot as one tar per volume, ``durable-dir-<volume>.tar`` in the checkpoint directory:

- **Bound** into each app container that lists it (``Container.durable_dir_volume_mounts``):
  a read-write ``bind`` of the volume's directory at ``mount_path``, the mount atelet's own
  OCI spec builder writes; :func:`with_mounts` adds it to a config that lacks it (atelet's
  bundles already carry it: then nothing changes).
- **Archived** (:func:`archive`) while the sandbox cannot write (paused, or checkpointed):
  the volume's tree with a root entry for the directory's own metadata, never following a
  link, gVisor's internal files (``.gvisor.*``) and sockets left out.
- **Restored** (:func:`extract`) into the volume directories before the sandbox boots. A
  volume with no tar in the snapshot (added to the template since) stays empty. The tar is
  the actor's data: a member that would land outside the volume (absolute, ``..``, through a
  link it planted) refuses the whole restore, device nodes and FIFOs are refused, set-id
  bits are dropped; ``.gvisor.*`` files are removed afterwards, as upstream does.

The volume directory itself always comes from atelet, never from a snapshot: runsc binds it
by path, so a symlink in its place would expose what it points at to the sandbox; one is
refused. Everything here blocks (file I/O): the worker API runs it in a thread.
"""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from substrate_gpu import _bundle, exceptions

TAR_PREFIX: Final = "durable-dir-"
TAR_SUFFIX: Final = ".tar"
GVISOR_PREFIX: Final = ".gvisor."
"""gVisor's internal files in a directory it serves, never archived nor restored."""
MOUNT_OPTIONS: Final = ("bind", "rw")
"""The options of atelet's bind of a durable-dir volume (its ``volumeMounts``)."""


class DurableDirError(exceptions.SubstrateGpuError):
    """A durable-dir volume cannot be used as asked: the request or a file is at fault."""


@dataclass(frozen=True)
class DurableMount:
    """One ``DurableDirVolumeMount`` of one app container."""

    container: str
    """The app container that mounts the volume."""
    volume: str
    """The volume's name: its directory under ``durable_dir_volume_mounts_dir``."""
    mount_path: str
    """Where the container sees it (absolute, clean)."""


def tar_name(volume: str) -> str:
    """The snapshot file of ``volume``'s archive; a :class:`DurableDirError` for a name that
    is not one directory entry (upstream's ``durableTarFile`` rule)."""
    if volume in {"", ".", ".."} or "/" in volume or "\0" in volume:
        raise DurableDirError(f"invalid durable-dir volume name {volume!r}")
    return f"{TAR_PREFIX}{volume}{TAR_SUFFIX}"


def check_mounts(
    containers: Iterable[tuple[str, Iterable[tuple[str, str]]]],
) -> tuple[DurableMount, ...]:
    """Every container's ``(volume_name, mount_path)`` pairs, checked; ``containers`` is
    ``(name, mounts)`` in ``spec.containers`` order. A bad one names its request field."""
    found: list[DurableMount] = []
    for i, (container, pairs) in enumerate(containers):
        destinations: set[str] = set()
        for j, (volume, mount_path) in enumerate(pairs):
            where = f"spec.containers[{i}].durable_dir_volume_mounts[{j}]"
            try:
                tar_name(volume)
            except DurableDirError as e:
                raise DurableDirError(f"{where}.volume_name: {e}") from e
            if not _clean_absolute(mount_path) or mount_path == "/":
                raise DurableDirError(
                    f"{where}.mount_path {mount_path!r} is not an absolute, clean path below /"
                )
            if mount_path in destinations:
                raise DurableDirError(f"{where}.mount_path {mount_path!r} is mounted twice")
            destinations.add(mount_path)
            found.append(DurableMount(container, volume, mount_path))
    return tuple(found)


def volume_names(mounts: Iterable[DurableMount]) -> tuple[str, ...]:
    """The volumes ``mounts`` name, sorted, once each (upstream's ``durableVolumeNames``)."""
    return tuple(sorted({m.volume for m in mounts}))


def with_mounts(
    config: Mapping[str, object], mounts: Sequence[DurableMount], volumes_dir: Path
) -> dict[str, object] | None:
    """``config`` with a bind of each of ``mounts`` (one container's), as atelet writes it;
    None when it already has them all. A mount already at a destination is replaced unless
    it is that volume's bind (the request names what the container sees there)."""
    existing = config.get("mounts", [])
    if not isinstance(existing, list):
        raise DurableDirError("config.json: mounts is not a list")
    result = list(existing)
    changed = False
    for mount in mounts:
        wanted: dict[str, object] = {
            "destination": mount.mount_path,
            "type": "bind",
            "source": str(volumes_dir / mount.volume),
            "options": list(MOUNT_OPTIONS),
        }
        at = [
            k
            for k, m in enumerate(result)
            if isinstance(m, dict) and m.get("destination") == mount.mount_path
        ]
        if any(_same_bind(result[k], wanted) for k in at):
            continue
        result = [m for k, m in enumerate(result) if k not in at]
        result.append(wanted)
        changed = True
    if not changed:
        return None
    return {**config, "mounts": result}


def _same_bind(mount: object, wanted: Mapping[str, object]) -> bool:
    return (
        isinstance(mount, dict)
        and mount.get("source") == wanted["source"]
        and mount.get("type", "bind") == "bind"
        and "ro" not in (mount.get("options") or [])
    )


def apply_mounts(bundle_dir: Path, mounts: Sequence[DurableMount], volumes_dir: Path) -> None:
    """Each volume's directory made (0700, as upstream) when absent, and each app
    container's config.json given its binds (:func:`with_mounts`, rewritten atomically in
    the directory it was read from). Blocks."""
    for volume in volume_names(mounts):
        volume_dir(volumes_dir, volume, create=True)
    by_container: dict[str, list[DurableMount]] = {}
    for mount in mounts:
        by_container.setdefault(mount.container, []).append(mount)
    for container, own in by_container.items():
        try:
            with _bundle.open_container(bundle_dir, container) as bundle:
                config, mode = bundle.read_config()
                try:
                    updated = with_mounts(config, own, volumes_dir)
                except DurableDirError as e:
                    raise DurableDirError(f"{bundle.config_path}: {e}") from e
                if updated is not None:
                    bundle.write_config(updated, mode)
        except _bundle.BundleFileError as e:
            raise DurableDirError(f"actor_dirs.oci_bundle_dir: {e}") from e


def volume_dir(volumes_dir: Path, volume: str, *, create: bool) -> Path:
    """``volumes_dir/volume``, a real directory (made 0700 when absent and ``create``); a
    :class:`DurableDirError` when it is anything else (a symlink is never followed)."""
    tar_name(volume)
    path = volumes_dir / volume
    try:
        info = path.lstat()
    except FileNotFoundError:
        if not create:
            raise DurableDirError(f"durable-dir volume {volume!r}: {path} does not exist") from None
        try:
            path.mkdir(mode=0o700, parents=True)
        except OSError as e:
            raise DurableDirError(
                f"durable-dir volume {volume!r}: {path} cannot be made: {e.strerror or e}"
            ) from e
        return path
    except OSError as e:
        raise DurableDirError(f"durable-dir volume {volume!r}: {path}: {e.strerror or e}") from e
    if not stat.S_ISDIR(info.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a directory"
        raise DurableDirError(
            f"durable-dir volume {volume!r}: {path} is {kind}; atelet makes each volume a directory"
        )
    return path


def archive(volumes_dir: Path, checkpoint_dir: Path, volumes: Sequence[str]) -> list[str]:
    """Each of ``volumes`` archived into ``checkpoint_dir/durable-dir-<volume>.tar`` (mode
    0600, written whole then renamed into place); the file names, in ``volumes`` order.
    The sandbox must not be writing (paused or checkpointed). Blocks."""
    files = []
    for volume in volumes:
        name = tar_name(volume)
        source = volume_dir(volumes_dir, volume, create=False)
        target = checkpoint_dir / name
        partial = checkpoint_dir / f".{name}.partial"
        partial.unlink(missing_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with (
                os.fdopen(fd, "wb") as raw,
                tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
            ):
                tar.add(source, arcname=".", recursive=True, filter=_archived)
                tar.close()
                raw.flush()
                os.fsync(raw.fileno())
            partial.replace(target)
        except OSError as e:
            partial.unlink(missing_ok=True)
            raise DurableDirError(
                f"while archiving durable-dir volume {volume!r} into {target}: {e.strerror or e}"
            ) from e
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        files.append(name)
    return files


def _archived(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """What goes into the archive: not gVisor's own files (sockets never reach here:
    tarfile cannot represent them and skips them)."""
    if Path(member.name).name.startswith(GVISOR_PREFIX):
        return None
    return member


def extract(snapshot_dir: Path, volumes_dir: Path, volumes: Sequence[str]) -> list[str]:
    """Each of ``volumes`` whose tar ``snapshot_dir`` holds, extracted into its directory
    (made 0700 when absent); the tars used. A tar that breaks a rule (module doc) is a
    :class:`DurableDirError` naming it. Blocks."""
    used = []
    for volume in volumes:
        name = tar_name(volume)
        source = snapshot_dir / name
        if not source.is_file():
            continue
        target = volume_dir(volumes_dir, volume, create=True)
        try:
            with tarfile.open(source, mode="r:") as tar:
                # Every member passes _restored first: confined to the volume, no devices.
                tar.extractall(target, numeric_owner=True, filter=_restored)  # noqa: S202
        except (tarfile.TarError, OSError, DurableDirError) as e:
            raise DurableDirError(
                f"while restoring durable-dir volume {volume!r} from {source}: {e}"
            ) from e
        _remove_gvisor_files(target)
        used.append(name)
    return used


def _restored(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's ``tar`` filter for where a member may land, then our rules: no device
    node nor FIFO, no set-id bit; the rest of the mode and the owner kept (the volume is
    the actor's, exactly as it left it)."""
    if member.ischr() or member.isblk() or member.isfifo():
        raise DurableDirError(f"{member.name!r} is a device node or FIFO")
    if member.islnk():
        # A hard link is made to a host file: its target must be inside the volume
        # (a symlink's is the sandbox's business: it resolves inside the sandbox).
        real = os.path.realpath(Path(dest, member.linkname))
        if os.path.commonpath([real, os.path.realpath(dest)]) != os.path.realpath(dest):
            raise DurableDirError(f"{member.name!r} is a hard link to outside the volume")
    safe = tarfile.tar_filter(member, dest)
    mode = safe.mode if member.issym() else member.mode & ~(stat.S_ISUID | stat.S_ISGID)
    return safe.replace(mode=mode, deep=False)


def _remove_gvisor_files(directory: Path) -> None:
    for parent, _dirs, files in os.walk(directory, followlinks=False):
        for name in files:
            if name.startswith(GVISOR_PREFIX):
                (Path(parent) / name).unlink(missing_ok=True)


def _clean_absolute(path: str) -> bool:
    return path.startswith("/") and not path.startswith("//") and os.path.normpath(path) == path
