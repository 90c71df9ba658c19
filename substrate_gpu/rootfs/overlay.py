"""Composing a container's rootfs from the node's cached image layers, as atelet asks.

atelet (agent-substrate, at 533900d) runs with no capabilities, so it cannot mount: it unpacks
each image layer once per node into a layer directory (the tree under ``fs/``, the layer's
whiteouts and opaque directories recorded in ``whiteouts.json``) and writes, next to each
container's ``config.json``, a ``rootfs-overlay.json`` naming the layers, bottom-most first.
The worker composes the rootfs just before it creates the container: it materialises each
layer's whiteouts (0:0 character devices) and opaque markers (``trusted.overlay.opaque=y``)
once per layer (the ``finalized`` marker), mounts an overlay at ``<container>/rootfs`` with
the layers as read-only lower directories and the bundle's private ``upper/`` and ``work/``
as the writable side, creates the spec's ``extraDirs`` through the mount, repairs directory
metadata that an implicitly created parent shadows, and exposes each image volume read-only
at ``<container>/volumes/<name>``. A container without the file keeps its rootfs as it is
(a plain extracted directory). :func:`unmount_all_under` is the teardown: every mount at or
below a directory, deepest first, detached.

What atelet hands over is not trusted more than it must be:

- the container directory is reached from its bundle directory (``oci_bundle_dir``, opened
  as given) with no link followed (:func:`substrate_gpu._files.open_directory`, the walk
  every file under a bundle directory goes through), once: the spec is read and the rootfs
  composed through that one descriptor, so a link swapped in after the request was checked
  is refused, never followed, and nothing is read, made or mounted outside the bundle;
- the mount points (``rootfs``, ``upper``, ``work``, ``volumes/<name>``) are derived from the
  container's directory, never read from the file, and are reached through real directories
  only: the overlay is attached with ``move_mount`` relative to the container directory's
  descriptor, so a symlink in their place is refused, never mounted through;
- every layer must be an absolute, normalised path of a real directory (no symlink on its
  way) under the configured layers directory (``--image-layers-dir``; upstream's node base
  path ``/var/lib/ate`` by default): a spec naming ``/etc`` as a layer is refused. Upstream's
  worker trusts the file here; we do not;
- paths inside a layer (whiteouts, opaque directories, implicit directories) and inside the
  composed rootfs (extra directories) are resolved confined to it (:mod:`.confined`), so an
  image's ``/usr -> /`` cannot redirect a ``mknod`` or a ``mkdir`` onto the host.

The overlay is mounted ``volatile``, as upstream's: the upper holds one activation's
copy-ups, which atelet wipes between activations, so its syncs (at unmount too) buy nothing.
Lower directories are added one ``fsconfig(lowerdir+)`` at a time (Linux >= 6.5), so no
option-string limit caps the number of layers. Everything here blocks (mounts, file I/O):
callers on the event loop run it in a thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from substrate_gpu import _defaults, _files
from substrate_gpu._mountinfo import mounts_under as mount_points_under
from substrate_gpu._mountinfo import unmount_all_under
from substrate_gpu.exceptions import SubstrateGpuError
from substrate_gpu.rootfs import confined, mounts

__all__ = [
    "DEFAULT_LAYERS_DIR",
    "OVERLAY_SPEC",
    "ImageVolume",
    "OverlayError",
    "OverlaySpec",
    "compose_bundle",
    "compose_rootfs",
    "finalize_layer",
    "mount_points_under",
    "read_overlay_spec",
    "unmount_all_under",
]

OVERLAY_SPEC: Final = "rootfs-overlay.json"
"""The file atelet writes next to a container's config.json (upstream's ``OverlaySpecFileName``)."""
DEFAULT_LAYERS_DIR: Final = _defaults.IMAGE_LAYERS_DIR
"""Upstream's node base path (``nodepath.BasePath``): atelet's image cache lives under it."""
MAX_SPEC_BYTES: Final = 1 << 20
_FS: Final = "fs"
_WHITEOUTS: Final = "whiteouts.json"
_FINALIZED: Final = "finalized"
_OPAQUE_XATTR: Final = "trusted.overlay.opaque"


class OverlayError(SubstrateGpuError):
    """A container's rootfs could not be composed (or taken apart); the message names the
    file or directory and why. ``bad_input``: what atelet handed over is wrong (a caller
    answers INVALID_ARGUMENT), otherwise the node failed (the kernel refused a mount)."""

    def __init__(self, message: str, *, bad_input: bool = False) -> None:
        super().__init__(message)
        self.bad_input = bad_input


@dataclass(frozen=True)
class ImageVolume:
    """One read-only image volume of a container (upstream's ``ImageVolumeOverlay``)."""

    name: str
    layers: tuple[Path, ...]
    """Layer directories, bottom-most first."""


@dataclass(frozen=True)
class OverlaySpec:
    """A container's ``rootfs-overlay.json`` (version 1), checked."""

    path: str
    """Where it was read, for messages."""
    layers: tuple[Path, ...]
    """Layer directories, bottom-most first (the image manifest's order)."""
    extra_dirs: tuple[str, ...] = ()
    image_volumes: tuple[ImageVolume, ...] = ()
    image_digest: str = ""


# --- reading the spec -------------------------------------------------------------------


def _open_container(container_dir: Path) -> int:
    """An ``O_PATH`` descriptor of ``container_dir``, reached from its bundle directory (its
    parent, opened as given) through a real directory: a symlink (or anything else) in its
    place is :class:`OverlayError` (``bad_input``), never followed. The caller closes it."""
    container_dir = Path(container_dir)
    try:
        return _files.open_directory(str(container_dir.parent), (container_dir.name,))
    except _files.NotReadable as e:
        raise OverlayError(
            f"refusing {container_dir}: {e}; every directory under the bundle directory "
            f"{container_dir.parent} must be a real directory, never a link",
            bad_input=True,
        ) from e
    except FileNotFoundError as e:
        raise OverlayError(
            f"container directory {container_dir} does not exist", bad_input=True
        ) from e
    except OSError as e:
        raise OverlayError(f"cannot open {container_dir}: {e.strerror or e}") from e


def read_overlay_spec(
    container_dir: Path | str, *, layers_dir: Path = DEFAULT_LAYERS_DIR
) -> OverlaySpec | None:
    """The container's overlay spec, or ``None`` when it has none (its rootfs is a plain
    directory). Read through real directories only (``container_dir`` itself never a link),
    never blocking, bounded; a spec that is not version 1, names a layer outside
    ``layers_dir`` or is malformed is :class:`OverlayError` (``bad_input``) naming the file
    and the field."""
    fd = _open_container(Path(container_dir))
    try:
        return _read_spec_at(fd, f"{container_dir}/{OVERLAY_SPEC}", layers_dir)
    finally:
        os.close(fd)


def _read_spec_at(dir_fd: int, where: str, layers_dir: Path) -> OverlaySpec | None:
    """:func:`read_overlay_spec` of the container directory ``dir_fd``."""
    try:
        raw, _mode = _files.read_regular_at(
            dir_fd, OVERLAY_SPEC, max_bytes=MAX_SPEC_BYTES, what="a rootfs overlay spec"
        )
    except FileNotFoundError:
        return None
    except _files.NotReadable as e:
        raise OverlayError(f"refusing {where}: {e}", bad_input=True) from e
    except OSError as e:
        raise OverlayError(f"cannot read {where}: {e.strerror or e}") from e
    return parse_overlay_spec(raw, where, layers_dir=layers_dir)


def parse_overlay_spec(raw: bytes, where: str, *, layers_dir: Path) -> OverlaySpec:
    """:func:`read_overlay_spec`'s checks on the file's bytes."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise OverlayError(f"{where} is not valid JSON: {e}", bad_input=True) from e
    if not isinstance(doc, dict):
        raise OverlayError(f"{where} is not a JSON object", bad_input=True)
    version = doc.get("version")
    if version != 1 or isinstance(version, bool):
        raise OverlayError(f"{where} has version {version!r}, want 1", bad_input=True)
    layers = _layers(doc.get("layers"), f"{where}: layers", layers_dir)
    extra = doc.get("extraDirs", [])
    if not isinstance(extra, list) or not all(isinstance(d, str) for d in extra):
        raise OverlayError(f"{where}: extraDirs must be a list of paths", bad_input=True)
    for d in extra:
        if ".." in confined.split_components(d):
            raise OverlayError(f"{where}: extra dir {d!r} escapes the rootfs", bad_input=True)
    volumes = []
    raw_volumes = doc.get("imageVolumes", [])
    if not isinstance(raw_volumes, list):
        raise OverlayError(f"{where}: imageVolumes must be a list", bad_input=True)
    seen: set[str] = set()
    for i, vol in enumerate(raw_volumes):
        field = f"{where}: imageVolumes[{i}]"
        if not isinstance(vol, dict):
            raise OverlayError(f"{field} is not an object", bad_input=True)
        name = vol.get("name")
        if not isinstance(name, str) or not confined.is_plain_name(name):
            raise OverlayError(f"{field}.name {name!r} is not a plain name", bad_input=True)
        if name in seen:
            raise OverlayError(f"{field}.name {name!r} is given twice", bad_input=True)
        seen.add(name)
        vol_layers = _layers(vol.get("layers"), f"{field}.layers", layers_dir)
        if not vol_layers:
            raise OverlayError(f"{field}.layers is empty", bad_input=True)
        volumes.append(ImageVolume(name=name, layers=vol_layers))
    digest = doc.get("imageDigest", "")
    return OverlaySpec(
        path=where,
        layers=layers,
        extra_dirs=tuple(extra),
        image_volumes=tuple(volumes),
        image_digest=digest if isinstance(digest, str) else "",
    )


def _layers(value: object, field: str, layers_dir: Path) -> tuple[Path, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise OverlayError(f"{field} must be a list of layer directories", bad_input=True)
    base = os.path.normpath(layers_dir)
    out = []
    for i, layer in enumerate(value):
        if not Path(layer).is_absolute() or os.path.normpath(layer) != layer.rstrip("/"):
            raise OverlayError(
                f"{field}[{i}] {layer!r} is not an absolute, normalised path", bad_input=True
            )
        if os.path.commonpath([base, layer]) != base or layer.rstrip("/") == base:
            raise OverlayError(
                f"{field}[{i}] {layer!r} is not under the image layers directory {base} "
                "(--image-layers-dir)",
                bad_input=True,
            )
        out.append(Path(layer))
    return tuple(out)


# --- finalising a layer -----------------------------------------------------------------


def finalize_layer(layer: Path) -> None:
    """Materialise the layer's recorded whiteouts and opaque directories, once: idempotent,
    safe with concurrent callers (``EEXIST`` is success, the marker is written last)."""
    layer_fd = _open_real_dir(layer, f"layer {layer}")
    try:
        try:
            os.stat(_FINALIZED, dir_fd=layer_fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            return
        record = _read_whiteouts(layer, layer_fd)
        fs = layer / _FS
        for path in record.get("whiteouts", []):
            parent, name = _split_in_layer(path, layer)
            if name is None:
                continue
            with (
                confined.open_dir_in_root(fs, parent, create=True) as dir_fd,
                contextlib.suppress(FileExistsError),
            ):
                os.mknod(name, stat.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=dir_fd)
        for path in record.get("opaques", []):
            parent, name = _split_in_layer(path, layer)
            if name is None:
                continue
            with confined.open_dir_in_root(fs, path, create=True) as dir_fd:
                real = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
                try:
                    os.setxattr(real, _OPAQUE_XATTR, b"y")
                finally:
                    os.close(real)
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        os.close(os.open(_FINALIZED, flags, 0o600, dir_fd=layer_fd))
    except confined.ConfinedPathError as e:
        raise OverlayError(f"while finalizing layer {layer}: {e}", bad_input=True) from e
    except OSError as e:
        raise OverlayError(f"while finalizing layer {layer}: {e.strerror or e}") from e
    finally:
        os.close(layer_fd)


def _read_whiteouts(layer: Path, layer_fd: int) -> dict[str, list[str]]:
    where = f"{layer}/{_WHITEOUTS}"
    try:
        raw, _mode = _files.read_regular_at(
            layer_fd, _WHITEOUTS, max_bytes=64 << 20, what="a layer's whiteout record"
        )
    except FileNotFoundError:
        return {}
    except _files.NotReadable as e:
        raise OverlayError(f"refusing {where}: {e}", bad_input=True) from e
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise OverlayError(f"{where} is not valid JSON: {e}", bad_input=True) from e
    if not isinstance(doc, dict):
        raise OverlayError(f"{where} is not a JSON object", bad_input=True)
    out: dict[str, list[str]] = {}
    for key in ("whiteouts", "opaques", "implicitDirs"):
        value = doc.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise OverlayError(f"{where}: {key} must be a list of paths", bad_input=True)
        out[key] = value
    return out


def _split_in_layer(path: str, layer: Path) -> tuple[str, str | None]:
    """``path``'s parent and last name inside a layer (upstream's ``validateTarName``):
    empty and ``.`` are skipped (``None``), ``..`` anywhere is refused."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise OverlayError(
            f"layer {layer}: {path!r} in {_WHITEOUTS} is not a local path", bad_input=True
        )
    if not parts:
        return "", None
    return "/".join(parts[:-1]), parts[-1]


# --- composing --------------------------------------------------------------------------


def compose_rootfs(container_dir: Path, spec: OverlaySpec) -> None:
    """Mount the container's rootfs (and its image volumes) as ``spec`` says; see the module
    docstring. ``container_dir`` itself is never a link (:class:`OverlayError`). A stale
    mount at a mount point (a failed earlier activation of this bundle) is detached first.
    On a failure, whatever this call mounted is detached again."""
    dir_fd = _open_container(container_dir)
    try:
        _compose_at(container_dir, dir_fd, spec)
    finally:
        os.close(dir_fd)


def _held(fd: int, *names: str) -> Path:
    """A path to ``names`` in the directory ``fd`` that goes through the descriptor
    (``/proc/self/fd/<fd>/…``), whatever has been renamed or linked on its way since."""
    return Path(f"/proc/self/fd/{fd}", *names)


def _compose_at(container_dir: Path, dir_fd: int, spec: OverlaySpec) -> None:
    """:func:`compose_rootfs` in the container directory ``dir_fd`` (``container_dir``
    names it in messages only: every step goes through the descriptor)."""
    for layer in (*spec.layers, *(lyr for v in spec.image_volumes for lyr in v.layers)):
        finalize_layer(layer)
    try:
        try:
            for name in ("rootfs", "upper", "work"):
                _ensure_dir(dir_fd, name, container_dir)
            mounts.detach(_held(dir_fd, "rootfs"))
            _fresh_work_dir(dir_fd)
            if spec.layers:
                mounts.mount_overlay(
                    dir_fd, "rootfs", _lower_dirs(spec.layers), upper="upper", work="work"
                )
            rootfs = container_dir / "rootfs"
            rootfs_fd = _files.open_directory(dir_fd, ("rootfs",))
            try:
                for extra in spec.extra_dirs:
                    os.close(confined.open_dir_at(rootfs, rootfs_fd, extra, create=True))
                if spec.layers:
                    _repair_implicit_dirs(rootfs_fd, spec.layers)
            finally:
                os.close(rootfs_fd)
            if spec.image_volumes:
                _ensure_dir(dir_fd, "volumes", container_dir)
                volumes_fd = _files.open_directory(dir_fd, ("volumes",))
                try:
                    for vol in spec.image_volumes:
                        _ensure_dir(volumes_fd, vol.name, container_dir / "volumes")
                        mounts.detach(_held(volumes_fd, vol.name))
                        mounts.mount_image_volume(volumes_fd, vol.name, _lower_dirs(vol.layers))
                finally:
                    os.close(volumes_fd)
        except BaseException:
            # Where the descriptor is now: never through a link put in its place since.
            unmount_all_under(_held(dir_fd).readlink())
            raise
    except confined.ConfinedPathError as e:
        raise OverlayError(f"while composing {container_dir}/rootfs: {e}", bad_input=True) from e
    except _files.NotReadable as e:
        raise OverlayError(f"while composing {container_dir}/rootfs: {e}", bad_input=True) from e
    except OSError as e:
        raise OverlayError(
            f"while composing {container_dir}/rootfs from {spec.path}: {e.strerror or e}"
        ) from e


def _fresh_work_dir(dir_fd: int) -> None:
    """An earlier volatile mount of this bundle left ``work/work/incompat/volatile``, and
    overlayfs refuses to mount over it again (EINVAL) until the work directory is thrown
    away. The work directory holds only overlayfs's own scratch state, so it is emptied
    (through descriptors, never following a link); the upper, the actor's files, stays."""
    try:
        os.stat("work/work/incompat/volatile", dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return
    shutil.rmtree("work", dir_fd=dir_fd)
    os.mkdir("work", 0o700, dir_fd=dir_fd)


def _lower_dirs(layers: Sequence[Path]) -> list[str]:
    """Top-most first, each layer's ``fs/``; a layer listed twice kept once (its top-most
    occurrence), since overlayfs refuses a repeated lower directory (ELOOP)."""
    seen: set[str] = set()
    out = []
    for layer in reversed(layers):
        path = str(layer / _FS)
        if path not in seen:
            seen.add(path)
            out.append(path)
    return out


def _repair_implicit_dirs(rootfs_fd: int, layers: Sequence[Path]) -> None:
    """A directory a layer created only as a parent (recorded in its ``implicitDirs``, with
    made-up ``root:root 0755``) shadows, in the merged view, the attributes a lower layer
    declared (``/tmp``'s 1777): give the merged directory those of the top-most layer that
    declared it. The change copies up into this bundle's upper, never into a layer."""
    implicit: list[set[str]] = []
    for layer in layers:
        fd = _open_real_dir(layer, f"layer {layer}")
        try:
            record = _read_whiteouts(layer, fd)
        finally:
            os.close(fd)
        dirs = record.get("implicitDirs", [])
        implicit.append({"/".join(p for p in d.split("/") if p) for d in dirs})
    candidates = sorted(set[str]().union(*implicit), key=len)
    for path in candidates:
        if not path or ".." in path.split("/"):
            continue
        shadowed = False
        source: os.stat_result | None = None
        for layer, marks in zip(reversed(layers), reversed(implicit), strict=True):
            st = _stat_dir_in(layer / _FS, path)
            if st is None:
                if _exists_in(layer / _FS, path):
                    break  # a non-directory hides everything below it
                continue
            if path in marks:
                shadowed = True
                continue
            source = st
            break
        if not shadowed or source is None:
            continue
        names = path.split("/")
        try:
            fd = _files.open_directory(rootfs_fd, names)
        except (_files.NotReadable, FileNotFoundError):
            continue  # the merged view has something else there: nothing to repair
        try:
            real = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            try:
                os.fchown(real, source.st_uid, source.st_gid)
                os.fchmod(real, stat.S_IMODE(source.st_mode))
            finally:
                os.close(real)
        finally:
            os.close(fd)


def _stat_dir_in(root: Path, path: str) -> os.stat_result | None:
    try:
        fd = _files.open_directory(str(root), path.split("/"))
    except (_files.NotReadable, FileNotFoundError, NotADirectoryError):
        return None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def _exists_in(root: Path, path: str) -> bool:
    parent, _, name = path.rpartition("/")
    try:
        fd = _files.open_directory(str(root), parent.split("/") if parent else ())
    except (_files.NotReadable, FileNotFoundError, NotADirectoryError):
        return False
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)
    return True


def _open_real_dir(path: Path, what: str) -> int:
    try:
        return _files.open_directory(str(path), ())
    except FileNotFoundError as e:
        raise OverlayError(f"{what} does not exist", bad_input=True) from e
    except OSError as e:
        raise OverlayError(f"cannot open {what}: {e.strerror or e}", bad_input=True) from e


def _ensure_dir(dir_fd: int, name: str, parent: Path) -> None:
    """``<parent>/<name>`` as a real directory (made 0700 when absent); a symlink or any
    other file in its place is refused."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        raise OverlayError(
            f"refusing {parent}/{name}: it is {_kind(st.st_mode)}, not a directory",
            bad_input=True,
        )


def _kind(mode: int) -> str:
    return "a symbolic link" if stat.S_ISLNK(mode) else "not a directory"


def compose_bundle(
    bundle_dir: Path, containers: Sequence[str], *, layers_dir: Path = DEFAULT_LAYERS_DIR
) -> tuple[str, ...]:
    """Compose the rootfs of each container of a sandbox bundle directory that has an
    overlay spec (``<bundle_dir>/<container>``); the containers composed. On a failure
    every mount under ``bundle_dir`` is detached again, so a refused Run leaves none."""
    composed = []
    try:
        for name in containers:
            container = bundle_dir / name
            # One descriptor for the spec and the compose: no link, even one swapped in now.
            dir_fd = _open_container(container)
            try:
                spec = _read_spec_at(dir_fd, f"{container}/{OVERLAY_SPEC}", layers_dir)
                if spec is not None:
                    _compose_at(container, dir_fd, spec)
                    composed.append(name)
            finally:
                os.close(dir_fd)
    except BaseException:
        if composed:
            unmount_all_under(bundle_dir)
        raise
    return tuple(composed)
