"""Knowing that host files are unchanged without stat-ing each of them (inotify).

Every later actor on a worker needs the same answers about the same host files: the
SONAMEs of ~36 driver libraries and the numbers of ~6 device nodes. Re-checking them with a
``stat`` each costs ~3 µs a file here, more than a third of what the whole injection may
cost. A :class:`HostWatch` gives the same guarantee with one ``poll(2)``: the caller *arms*
it for a set of paths, then reads the files; later, :meth:`HostWatch.unchanged` says
whether anything that could change what those reads returned has happened since. The
caller re-reads everything when it says no (or was never armed).

What is watched for each path (added before the caller reads the files, so any change
after the reads raises an event):

- the file's own inode: ``IN_MODIFY`` (write, truncate, fallocate), ``IN_ATTRIB`` (chmod,
  chown, utimes, link count), ``IN_DELETE_SELF``, ``IN_MOVE_SELF`` — whichever name or hard
  link the change came through;
- every directory from ``/`` down to the file, itself: ``IN_DELETE_SELF``,
  ``IN_MOVE_SELF``. That is enough for the names on the path: a name can only come to
  resolve to another inode by a rename or unlink, and those report on the inode that loses
  the name (a directory moved; a file's link count, ``IN_ATTRIB``); a directory can only be
  replaced once empty, when no watched file is below it. Names coming and going next to the
  path (new bundles next to a test tree, say) raise nothing;
- the mount table: ``poll`` on ``/proc/self/mountinfo`` reports any mount or unmount in our
  mount namespace (a mount over a directory of the path raises no inotify event).

Any event counts as a change, a lost one (``IN_Q_OVERFLOW``) and a removed watch
(``IN_IGNORED``, ``IN_UNMOUNT``) included.

A set of paths is *refused* (:meth:`HostWatch.arm` returns ``None``; the caller stats
every time, as without the watch) when inotify is unavailable (old kernel, seccomp, the
per-user limit of 128 instances reached), a path holds a symlink (its target would need
watching too), or a file system on it is not a local one (NFS, FUSE, 9p… change behind the
kernel's back, where inotify sees nothing).

Known blind spot: a write through a shared writable ``mmap`` raises no inotify event.
Driver installers and package managers replace library files (a new inode: an event);
nothing writes a loaded driver library in place through a mapping.

One instance per process (:func:`shared`): the 128 inotify instances are per user, shared
with every other process of the node's root. In a forked child every watch starts afresh
(reading the parent's queue would steal the parent's events).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import os
import select
import stat
import struct
import threading
import weakref
from collections.abc import Sequence

_IN_MODIFY = 0x00000002
_IN_ATTRIB = 0x00000004
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
IN_IGNORED = 0x00008000
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000
_IN_MASK_ADD = 0x20000000
_DIRECTORY_ONLY = _IN_ONLYDIR | _IN_DONT_FOLLOW

#: What may change a file's ``stat`` or content, through any of its names.
FILE_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_DELETE_SELF | _IN_MOVE_SELF
#: What may change which inode the path through a directory resolves to.
DIRECTORY_MASK = _IN_DELETE_SELF | _IN_MOVE_SELF

_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)

#: Generations of every instance of the process come from one counter, so a token of one
#: instance (or of the parent, in a forked child) never matches another's.
_generations = itertools.count(1)

#: Watches held before the instance is renewed (stale ones pile up as test trees come and go).
MAX_WATCHES = 8192

#: ``statfs`` ``f_type`` of file systems whose every change passes through this kernel.
LOCAL_FILE_SYSTEMS = frozenset(
    {
        0xEF53,  # ext2/3/4
        0x58465342,  # xfs
        0x9123683E,  # btrfs
        0x01021994,  # tmpfs (and devtmpfs)
        0x858458F6,  # ramfs
        0x794C7630,  # overlayfs (its lower layers are immutable by contract)
        0xF2F52010,  # f2fs
        0x2FC12FC1,  # zfs
        0x73717368,  # squashfs (read-only)
    }
)


def removed_watches(events: bytes) -> list[int]:
    """The watch descriptors an inotify event buffer reports as removed (``IN_IGNORED``)."""
    removed = []
    offset = 0
    while offset + _EVENT.size <= len(events):
        wd, mask, _cookie, length = _EVENT.unpack_from(events, offset)
        offset += _EVENT.size + length
        if mask & IN_IGNORED:
            removed.append(wd)
    return removed


class _Libc:
    """``inotify_init1``/``inotify_add_watch``/``statfs`` through ctypes, bound once."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.init1 = libc.inotify_init1
        self.init1.argtypes = (ctypes.c_int,)
        self.add_watch = libc.inotify_add_watch
        self.add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        self.statfs = libc.statfs
        self.statfs.argtypes = (ctypes.c_char_p, ctypes.c_void_p)

    def file_system_type(self, path: bytes) -> int | None:
        buffer = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit
        if self.statfs(path, buffer) != 0:
            return None
        return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF  # f_type comes first


def _plain_name(name: str) -> bool:
    """Whether a path's last component is a plain name (not empty, ``.`` or ``..``)."""
    return name not in ("", ".", "..")


def _local(libc: _Libc, path: str) -> bool:
    """Whether ``path`` lies on a file system whose every change passes through this kernel."""
    return libc.file_system_type(os.fsencode(path)) in LOCAL_FILE_SYSTEMS


class HostWatch:
    """Change detection for sets of host files; see the module docstring. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._libc: _Libc | None = None
        self._available = True
        self._fd = -1
        self._mounts_fd = -1
        self._poll = select.poll()
        self._generation = next(_generations)
        self._watched: set[int] = set()
        _instances.add(self)

    # -- the hot path ----------------------------------------------------------------------

    def unchanged(self, token: int) -> bool:
        """Whether nothing watched may have changed since :meth:`arm` returned ``token``."""
        with self._lock:
            if self._fd >= 0 and (ready := self._poll.poll(0)):
                self._drain(ready)
            return token == self._generation

    # -- arming ----------------------------------------------------------------------------

    def arm(self, paths: Sequence[str]) -> int | None:
        """Watch ``paths`` (absolute, normalised); the caller reads the files *after* this.

        Returns a token for :meth:`unchanged`, or ``None`` when the paths cannot be watched
        soundly (the caller then re-reads them every time).
        """
        with self._lock:
            if not self._ensure_open():
                return None
            if ready := self._poll.poll(0):
                self._drain(ready)
            token = self._generation
            libc = self._libc
            assert libc is not None  # set by _ensure_open
            parents = {path.rpartition("/")[0] or "/" for path in paths}
            directories: set[str] = set()
            for parent in parents:
                if not parent.startswith("/") or os.path.normpath(parent) != parent:
                    return None
                ancestor = parent
                while ancestor not in directories:
                    directories.add(ancestor)
                    ancestor = ancestor.rpartition("/")[0] or "/"
            if any(not _plain_name(path.rpartition("/")[2]) for path in paths):
                return None
            # Top-down, then the files: a change anywhere after its watch exists is seen.
            for directory in sorted(directories, key=len):
                if not self._watch(directory, DIRECTORY_MASK | _DIRECTORY_ONLY):
                    return None
            for path in paths:
                if not self._watch(path, FILE_MASK | _IN_DONT_FOLLOW):
                    return None
            # Now that every name is watched: refuse symlinks and remote file systems (a
            # file on its directory's device is on its file system: one statfs a directory).
            devices: dict[str, int] = {}
            try:
                for directory in sorted(directories, key=len):
                    st = os.lstat(directory)
                    if stat.S_ISLNK(st.st_mode) or not _local(libc, directory):
                        return None
                    devices[directory] = st.st_dev
                for path in paths:
                    st = os.lstat(path)
                    if stat.S_ISLNK(st.st_mode):
                        return None
                    parent = path.rpartition("/")[0] or "/"
                    if st.st_dev != devices[parent] and not _local(libc, path):
                        return None
            except OSError:
                return None
            if len(self._watched) > MAX_WATCHES:
                self._close()
                return None
            return token

    def _ensure_open(self) -> bool:
        if self._fd >= 0:
            return True
        if not self._available:
            return False
        try:
            self._libc = self._libc or _Libc()
        except (OSError, AttributeError):
            self._available = False  # no libc with inotify: stop trying
            return False
        fd = self._libc.init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            # No inotify at all (ENOSYS, seccomp): stop trying. Out of instances: try later.
            if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
                self._available = False
            return False
        try:
            mounts = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(fd)
            self._available = False  # no /proc: mounts would change unseen
            return False
        self._fd, self._mounts_fd = fd, mounts
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self._poll.register(mounts, select.POLLPRI)
        self._generation = next(_generations)  # tokens of an earlier instance are void
        return True

    def _watch(self, path: str, mask: int) -> bool:
        assert self._libc is not None
        wd = self._libc.add_watch(self._fd, os.fsencode(path), mask | _IN_MASK_ADD)
        if wd < 0:
            return False
        self._watched.add(wd)
        return True

    def _drain(self, ready: list[tuple[int, int]]) -> None:
        """Read every pending event and take the mount-table change ``ready`` (a poll's
        result) reports: any of them bumps the generation. Called with the lock held."""
        for fd, _events in ready:
            if fd == self._mounts_fd:
                continue  # POLLPRI: the mount table changed (reported once per change)
            while True:
                try:
                    events = os.read(fd, 65536)
                except BlockingIOError:
                    break
                self._watched.difference_update(removed_watches(events))
        self._generation = next(_generations)

    def _close(self) -> None:
        for fd in (self._fd, self._mounts_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._mounts_fd = -1
        self._poll = select.poll()
        self._watched.clear()
        self._generation = next(_generations)

    def close(self) -> None:
        """Drop every watch; a later :meth:`arm` starts afresh (earlier tokens are void)."""
        with self._lock:
            self._close()

    def __del__(self) -> None:
        # The inotify instance counts against the user's 128 until its descriptor closes.
        for fd in (self._fd, self._mounts_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


_shared: HostWatch | None = None
_shared_lock = threading.Lock()


def shared() -> HostWatch:
    """This process's :class:`HostWatch` (created on first use)."""
    global _shared  # noqa: PLW0603  (one per process, on purpose)
    watch = _shared
    if watch is None:
        with _shared_lock:
            watch = _shared = _shared or HostWatch()
    return watch


#: Every live instance, so a forked child can disown them all.
_instances: weakref.WeakSet[HostWatch] = weakref.WeakSet()


def _forget_in_child() -> None:
    # The child shares the parent's inotify file descriptions: reading one would steal the
    # parent's events. Its copies are closed (the parent's stay open) and every watch of the
    # child starts afresh, tokens void.
    global _shared  # noqa: PLW0603
    _shared = None
    for watch in list(_instances):
        watch._lock = threading.Lock()  # another thread may have held it at fork
        watch._close()


os.register_at_fork(after_in_child=_forget_in_child)
