"""The kernel's new mount API (``fsopen``/``fsconfig``/``fsmount``/``move_mount``,
``open_tree``/``mount_setattr``); the teardown is :mod:`substrate_gpu._mountinfo`'s.

Mounts are attached relative to a directory descriptor the caller reached through real
directories, and ``move_mount`` is never asked to follow a symlink at its target, so a link
planted where a mount point should be is refused (``ENOENT``/``ELOOP``), never mounted
through. The syscalls have one number on every architecture (asm-generic, Linux 5.2+);
overlayfs's ``lowerdir+`` needs Linux 6.5. Everything here blocks.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

__all__ = [
    "detach",
    "mount_image_volume",
    "mount_overlay",
    "move",
]

_SYS_OPEN_TREE: Final = 428
_SYS_MOVE_MOUNT: Final = 429
_SYS_FSOPEN: Final = 430
_SYS_FSCONFIG: Final = 431
_SYS_FSMOUNT: Final = 432
_SYS_MOUNT_SETATTR: Final = 442
_FSOPEN_CLOEXEC: Final = 0x1
_FSMOUNT_CLOEXEC: Final = 0x1
_FSCONFIG_SET_FLAG: Final = 0
_FSCONFIG_SET_STRING: Final = 1
_FSCONFIG_CMD_CREATE: Final = 6
_MOVE_MOUNT_F_EMPTY_PATH: Final = 0x4
_OPEN_TREE_CLONE: Final = 0x1
_AT_EMPTY_PATH: Final = 0x1000
_AT_RECURSIVE: Final = 0x8000
_MOUNT_ATTR_RDONLY: Final = 0x1
_MNT_DETACH: Final = 0x2
_UMOUNT_NOFOLLOW: Final = 0x8


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _fs_log(fs_fd: int) -> str:
    """The kernel's messages on an fs context (``e overlay: ...``): what it refused and why."""
    messages = []
    for _ in range(8):
        try:
            chunk = os.read(fs_fd, 1024)
        except OSError:
            break
        if not chunk:
            break
        messages.append(chunk.decode(errors="replace").strip())
    return f" (kernel: {'; '.join(messages)})" if messages else ""


def mount_overlay(
    dir_fd: int, target: str, lowers: Sequence[str], *, upper: str | None, work: str | None
) -> None:
    fs_fd = _check(_syscall(_SYS_FSOPEN, b"overlay", _FSOPEN_CLOEXEC), "fsopen(overlay)")
    try:

        def setting(key: str, value: str | None) -> None:
            result = _syscall(
                _SYS_FSCONFIG,
                fs_fd,
                _FSCONFIG_SET_STRING if value is not None else _FSCONFIG_SET_FLAG,
                key.encode(),
                None if value is None else value.encode(),
                0,
            )
            if result < 0:
                err = ctypes.get_errno()
                shown = key if value is None else f"{key}={value}"
                raise OSError(err, f"overlay option {shown}: {os.strerror(err)}{_fs_log(fs_fd)}")

        for lower in lowers:
            setting("lowerdir+", lower)
        if upper is not None and work is not None:
            # upperdir/workdir relative to the container directory: /proc/self/fd names it
            # through the descriptor we hold, so a rename on the way cannot redirect them.
            setting("upperdir", f"/proc/self/fd/{dir_fd}/{upper}")
            setting("workdir", f"/proc/self/fd/{dir_fd}/{work}")
        setting("volatile", None)
        result = _syscall(_SYS_FSCONFIG, fs_fd, _FSCONFIG_CMD_CREATE, None, None, 0)
        if result < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"creating the overlay: {os.strerror(err)}{_fs_log(fs_fd)}")
        mnt_fd = _check(_syscall(_SYS_FSMOUNT, fs_fd, _FSMOUNT_CLOEXEC, 0), "fsmount")
    finally:
        os.close(fs_fd)
    try:
        move(mnt_fd, dir_fd, target)
    finally:
        os.close(mnt_fd)


def mount_image_volume(volumes_fd: int, name: str, lowers: Sequence[str]) -> None:
    """Attach ``lowers`` (top-most first) read-only at ``name`` of ``volumes_fd``."""
    if len(lowers) > 1:
        mount_overlay(volumes_fd, name, lowers, upper=None, work=None)  # read-only
        return
    # One layer: overlayfs refuses a single lower without an upper; bind it read-only.
    tree = _check(
        _syscall(
            _SYS_OPEN_TREE,
            -100,  # AT_FDCWD
            lowers[0].encode(),
            _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_RECURSIVE,
        ),
        f"open_tree({lowers[0]})",
    )
    try:
        attr = _MountAttr(attr_set=_MOUNT_ATTR_RDONLY)
        _check(
            _syscall(
                _SYS_MOUNT_SETATTR,
                tree,
                b"",
                _AT_EMPTY_PATH | _AT_RECURSIVE,
                ctypes.byref(attr),
                ctypes.sizeof(attr),
            ),
            "mount_setattr(read-only)",
        )
        move(tree, volumes_fd, name)
    finally:
        os.close(tree)


def move(mnt_fd: int, dir_fd: int, target: str) -> None:
    """Attach ``mnt_fd`` at ``target`` of ``dir_fd``; a symlink at ``target`` is not
    followed (no ``MOVE_MOUNT_T_SYMLINKS``)."""
    _check(
        _syscall(_SYS_MOVE_MOUNT, mnt_fd, b"", dir_fd, target.encode(), _MOVE_MOUNT_F_EMPTY_PATH),
        f"move_mount onto {target}",
    )


def detach(path: Path) -> None:
    if _libc.umount2(str(path).encode(), _MNT_DETACH | _UMOUNT_NOFOLLOW) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            raise OSError(err, f"unmounting {path}: {os.strerror(err)}")


# --- taking apart -----------------------------------------------------------------------
