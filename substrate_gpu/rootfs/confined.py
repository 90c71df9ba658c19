"""Writes into an untrusted actor rootfs that can never land outside it.

The actor image is untrusted: it may ship ``/usr/lib/x86_64-linux-gnu -> /etc``, chains of
``..`` or symlink loops meant to redirect our writes onto the host. So paths inside the rootfs
are never checked as strings. They are resolved one component at a time against directory
file descriptors, with the semantics of ``openat2(RESOLVE_IN_ROOT)``:

- every symlink met on the way is read (never followed by the kernel) and resolution continues
  from the rootfs root (absolute target) or from the current directory (relative target);
- ``..`` moves to the directory we actually came from, and never above the root;
- more than :data:`MAX_SYMLINKS` symlinks is a loop (``ELOOP``), reported, never a hang.

These are the semantics runc uses (via filepath-securejoin) to place mount destinations, so a
link we stage lands in the very directory the bind mount lands in, whatever the image holds.

The kernel's ``openat2(RESOLVE_IN_ROOT)`` is tried first as a fast path when the directory
already exists; any failure falls back to the userspace walk, which is authoritative (it
creates missing directories, and explains refusals). ``..`` is handled with the stack of
directory descriptors we opened, never with the kernel's ``..``, so even a directory renamed
under us cannot lift the walk above the root (the rootfs has no running writer at staging
time: the runtime has not started the container yet).

Missing directories are created (``0o755``) only for components of the path itself: a
*dangling* symlink is refused rather than materialised, like filepath-securejoin's
``MkdirAll`` (runc would fail to create the mount there anyway).

The final component of a link path is never resolved: it is inspected with ``lstat`` and an
existing symlink is replaced atomically (``rename`` over it), never followed.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import errno
import os
import stat
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from substrate_gpu.exceptions import RootfsEscapeError

#: Symlinks followed while resolving one path before giving up with ELOOP (Linux's limit).
MAX_SYMLINKS = 40

_DIR_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


class ConfinedPathError(RootfsEscapeError):
    """A path inside the rootfs cannot be resolved safely.

    A symlink loop, a non-directory component, a dangling symlink, or a name that is not a
    plain file name. Nothing was written. ``root`` and ``path`` name the rootfs and the path
    inside it, ``problem`` what is wrong.
    """

    def __init__(self, root: Path, path: str, problem: str) -> None:
        self.root = root
        self.path = path
        self.problem = problem
        super().__init__(
            f"while resolving {path!r} inside rootfs {root}: {problem}; "
            "the image holds hostile or broken symlinks, nothing was written there"
        )


class LinkOutcome(enum.Enum):
    """What :func:`ensure_symlink_in_root` did."""

    CREATED = "created"
    """The link did not exist and was created."""
    EXISTS = "exists"
    """A symlink with the same target was already there: nothing to do."""
    REPLACED = "replaced"
    """A symlink with another target was there; it was replaced atomically (like ldconfig)."""
    OCCUPIED = "occupied"
    """A file or directory (not a symlink) holds the name; it was left alone."""


# ---------------------------------------------------------------------------------------------
# Pure path handling


def split_components(path: str) -> list[str]:
    """The components of ``path``, without empty and ``.`` components (``..`` is kept)."""
    return [part for part in path.split("/") if part not in ("", ".")]


#: Longest directory entry name Linux file systems accept, in bytes.
NAME_MAX = 255


def is_plain_name(name: str) -> bool:
    """Whether ``name`` is one directory entry name.

    Not empty, ``.`` or ``..``; no ``/`` or NUL; at most :data:`NAME_MAX` bytes.
    """
    return (
        name not in ("", ".", "..")
        and "/" not in name
        and "\0" not in name
        and len(os.fsencode(name)) <= NAME_MAX
    )


def split_link_path(path: str) -> tuple[str, str]:
    """Split a link path into (parent path, final name); the final name must be plain.

    Raises ``ValueError`` when the path has no plain final component (``/``, ``a/..``).
    """
    if "\0" in path:
        raise ValueError(f"path {path!r} contains a NUL byte")
    parent, _, name = path.rpartition("/")
    if not is_plain_name(name):
        raise ValueError(f"path {path!r} does not end in a plain file name")
    return "/".join(split_components(parent)), name


# ---------------------------------------------------------------------------------------------
# The kernel fast path: openat2(RESOLVE_IN_ROOT)

_SYS_OPENAT2 = 437  # same number on every architecture that has it (x86_64, aarch64, ...)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10


class _OpenHow(ctypes.Structure):
    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


class _Kernel:
    """Lazily bound ``syscall(2)``; disabled for good after ENOSYS (old kernel, seccomp)."""

    def __init__(self) -> None:
        self.enabled = True
        self._syscall: Callable[..., int] | None = None

    def openat2_in_root(self, root_fd: int, path: str) -> int | None:
        """Open directory ``path`` under ``root_fd`` in-root, or ``None`` when that fails."""
        if not self.enabled:
            return None
        if self._syscall is None:
            try:
                syscall = ctypes.CDLL(None, use_errno=True).syscall
            except (OSError, AttributeError):
                self.enabled = False
                return None
            syscall.restype = ctypes.c_long
            self._syscall = syscall
        how = _OpenHow(_DIR_FLAGS & ~os.O_NOFOLLOW, 0, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
        fd = self._syscall(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(root_fd),
            ctypes.c_char_p(os.fsencode(path or ".")),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
            self.enabled = False
        return None


_kernel = _Kernel()


# ---------------------------------------------------------------------------------------------
# The userspace walk


def _lookup_kind(name: str, dir_fd: int) -> int | None:
    """``st_mode`` of ``name`` in ``dir_fd`` without following it, ``None`` when absent."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None


def _walk_in_root(root: Path, root_fd: int, path: str, *, create: bool) -> int:
    """Resolve ``path`` like RESOLVE_IN_ROOT, one component at a time; return an O_PATH fd."""
    # Each queued component carries whether it came out of a symlink's target: a missing
    # component of a link target is a dangling symlink, which we refuse to materialise.
    queue: deque[tuple[str, bool]] = deque((part, False) for part in split_components(path))
    stack = [os.dup(root_fd)]
    links = 0
    try:
        while queue:
            name, from_link = queue.popleft()
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=stack[-1])
            except OSError as e:
                if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    raise
            else:
                stack.append(fd)
                continue
            mode = _lookup_kind(name, stack[-1])
            if mode is None:
                if not create:
                    raise ConfinedPathError(root, path, f"{name!r} does not exist")
                if from_link:
                    raise ConfinedPathError(
                        root, path, f"a symlink on the way points at missing {name!r}"
                    )
                with contextlib.suppress(FileExistsError):  # a racing creator is fine
                    os.mkdir(name, 0o755, dir_fd=stack[-1])
                queue.appendleft((name, from_link))
                continue
            if not stat.S_ISLNK(mode):
                raise ConfinedPathError(root, path, f"{name!r} is not a directory")
            links += 1
            if links > MAX_SYMLINKS:
                raise ConfinedPathError(
                    root, path, f"too many levels of symbolic links (more than {MAX_SYMLINKS})"
                )
            target = os.readlink(name, dir_fd=stack[-1])
            if target.startswith("/"):
                while len(stack) > 1:
                    os.close(stack.pop())
            queue.extendleft((part, True) for part in reversed(split_components(target)))
        result = stack.pop()
    finally:
        for fd in stack:
            os.close(fd)
    return result


def _open_dir(root: Path, root_fd: int, path: str, *, create: bool) -> int:
    fd = _kernel.openat2_in_root(root_fd, path)
    if fd is not None:
        return fd
    return _walk_in_root(root, root_fd, path, create=create)


def open_dir_at(root: Path, root_fd: int, path: str, *, create: bool = False) -> int:
    """:func:`open_dir_in_root` for a caller holding ``root``'s descriptor; the caller closes
    the returned O_PATH descriptor."""
    return _open_dir(root, root_fd, path, create=create)


def open_child_dir(
    parent_fd: int, name: str, *, create: bool = False, parent_is_new: bool = False
) -> tuple[int, bool] | None:
    """Open the real directory ``name`` of the directory ``parent_fd`` (O_PATH), creating it
    with mode 0o755 when ``create`` and absent; ``None`` when it is anything else.

    Returns the descriptor and whether this call created the directory. ``parent_is_new``:
    the caller created the parent itself just now (it is empty), so ``mkdir`` is tried
    first. ``name`` is one plain component, never followed when it is a symlink, so the
    result is what resolving ``<parent>/<name>`` in-root gives for a real directory; for a
    symlink (or a non-directory) the caller resolves the whole path with :func:`open_dir_at`.
    """
    if not is_plain_name(name):
        return None
    created = False
    if create and parent_is_new:
        try:
            os.mkdir(name, 0o755, dir_fd=parent_fd)
        except FileExistsError:
            pass  # not so new after all: open what is there, as below
        else:
            created = True
    for _attempt in range(2):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent_fd), created
        except FileNotFoundError:
            if not create:
                return None
            # ENOENT with O_NOFOLLOW: no entry at all (a symlink gives ENOTDIR or ELOOP).
            try:
                os.mkdir(name, 0o755, dir_fd=parent_fd)
            except FileExistsError:
                pass  # a racing creator is fine
            else:
                created = True
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                return None  # a symlink or not a directory: the careful path decides
            raise
    return None


@contextlib.contextmanager
def open_dir_in_root(root: Path, path: str, *, create: bool = False) -> Iterator[int]:
    """Open directory ``path`` inside ``root`` (RESOLVE_IN_ROOT semantics) as an O_PATH fd.

    With ``create``, missing directories of ``path`` itself are created with mode 0o755.
    Raises :class:`ConfinedPathError` for loops, non-directories and dangling symlinks, and
    ``OSError`` for anything else (``root`` missing, permission denied, read-only rootfs).
    The descriptor is closed when the context exits.
    """
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = _open_dir(root, root_fd, path, create=create)
    finally:
        os.close(root_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def ensure_symlink_at(dir_fd: int, name: str, target: str) -> LinkOutcome:
    """Make ``name`` in directory ``dir_fd`` a symlink to ``target``, never following ``name``.

    Same target already there: :attr:`LinkOutcome.EXISTS`. Another symlink: replaced
    atomically (symlink under a temporary name, then ``rename`` over it). A file or
    directory: left alone, :attr:`LinkOutcome.OCCUPIED`.
    """
    if not is_plain_name(name):
        raise ValueError(f"link name {name!r} is not a plain file name")
    # Fast path for a fresh rootfs (every later actor): create it. symlink() never follows an
    # existing name; EEXIST sends us to the careful path below.
    try:
        os.symlink(target, name, dir_fd=dir_fd)
    except FileExistsError:
        pass
    else:
        return LinkOutcome.CREATED
    for _attempt in range(3):  # a racing writer may create or remove the name between steps
        mode = _lookup_kind(name, dir_fd)
        if mode is None:
            try:
                os.symlink(target, name, dir_fd=dir_fd)
            except FileExistsError:
                continue
            return LinkOutcome.CREATED
        if not stat.S_ISLNK(mode):
            return LinkOutcome.OCCUPIED
        try:
            current = os.readlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            continue
        if current == target:
            return LinkOutcome.EXISTS
        # os.urandom is what secrets.token_hex reads; importing secrets (hmac, OpenSSL) would
        # slow every `substrate-gpu inject` (tests/bench/bench_cli.py).
        temp = f".substrate-gpu-{os.urandom(8).hex()}.tmp"  # short: name may be NAME_MAX
        os.symlink(target, temp, dir_fd=dir_fd)
        try:
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
        return LinkOutcome.REPLACED
    raise OSError(errno.EAGAIN, f"link name {name!r} kept changing while being staged")


def ensure_symlink_in_root(root: Path, link_path: str, target: str) -> LinkOutcome:
    """Create symlink ``link_path -> target`` inside ``root``, confined to it.

    The parent of ``link_path`` is resolved (and created) in-root; its final component is
    never followed. ``target`` is written verbatim (it is only ever read by the container).
    Raises :class:`ConfinedPathError` when the parent cannot be resolved safely or
    ``link_path`` has no plain final name.
    """
    try:
        parent, name = split_link_path(link_path)
    except ValueError as e:
        raise ConfinedPathError(root, link_path, str(e)) from e
    with open_dir_in_root(root, parent, create=True) as fd:
        # O_PATH descriptors are valid dir_fd arguments to symlinkat/renameat/readlinkat.
        return ensure_symlink_at(fd, name, target)
