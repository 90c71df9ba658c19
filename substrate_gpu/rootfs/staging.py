"""Staging SONAME symlinks in the actor rootfs, in place of nvidia-ctk's update-ldcache hook.

Why this exists (brief §3.7): update-ldcache runs ldconfig, which unshares a mount namespace
and mounts a private /proc; the kernel refuses that under the pod's masked /proc, and
unmasking it would cost the worker its security posture. The hook's only lasting effect
on the libraries we bind-mount is the SONAME links ``ldconfig -n`` creates next to them
(``libcuda.so.1 -> libcuda.so.580.65.06``), so we create exactly those, before the runtime
starts. ``ldconfig -n DIR`` on the same files is the reference the tests compare against.

The decisions are a pure function (:func:`plan_soname_links`) of the libraries, their
container destinations and their SONAMEs; the effects (reading SONAMEs through the
:class:`~substrate_gpu.rootfs.sonames.SonameCache`, writing links through the confined
writer) are a thin shell around it. Rules, in order:

- only files whose basename contains ``.so.`` (versioned shared objects) are considered;
- unreadable or non-ELF files are skipped with a warning; an ELF without SONAME is skipped;
- a SONAME equal to the basename needs no link;
- a SONAME that is not a plain file name (``/``, ``.``, ``..``, empty, NUL) is refused with a
  warning: an untrusted library must not steer the link elsewhere;
- when several libraries in one directory share a SONAME, the highest version wins, with
  ldconfig's own ordering (``_dl_cache_libcmp``);
- a link name that is itself a mount destination in that directory is never created (the
  mount would land on our link);
- the link ``<dirname(dest)>/<soname> -> <basename(dest)>`` is relative and confined to the
  rootfs (:mod:`substrate_gpu.rootfs.confined`); an existing link with another target is
  replaced atomically like ldconfig does; a file or directory under that name is left alone.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from substrate_gpu._log import get_logger
from substrate_gpu.exceptions import InjectionError
from substrate_gpu.rootfs import confined
from substrate_gpu.rootfs.sonames import (
    SonameAbsent,
    SonameCache,
    SonameResult,
    SonameUnreadable,
)

_log = get_logger(__name__)


class StagingLog(Protocol):
    """The slice of a structlog bound logger staging uses."""

    def debug(self, event: str, **fields: object) -> object:
        """Log at debug level."""

    def info(self, event: str, **fields: object) -> object:
        """Log at info level."""

    def warning(self, event: str, **fields: object) -> object:
        """Log at warning level."""


class SkipReason(enum.StrEnum):
    """Why no link was staged for a library."""

    NOT_VERSIONED = "not_versioned"
    """The basename has no ``.so.``: not a versioned shared object."""
    UNREADABLE = "unreadable"
    """The host file is not a readable ELF file (warning)."""
    NO_SONAME = "no_soname"
    """A well-formed ELF file without ``DT_SONAME``."""
    SONAME_IS_BASENAME = "soname_is_basename"
    """The SONAME is the file's own name: the loader finds it without a link."""
    UNSAFE_SONAME = "unsafe_soname"
    """The SONAME is not a plain file name; refused (warning)."""
    SUPERSEDED = "superseded"
    """Another library in the same directory has the same SONAME and a higher version."""
    UNSAFE_DESTINATION = "unsafe_destination"
    """The destination directory cannot be resolved safely inside the rootfs (warning)."""
    OCCUPIED = "occupied"
    """The link name is taken by a file, a directory or another mount destination (warning)."""


#: Reasons that mean something is wrong with the host or the image, logged as warnings.
WARNING_REASONS = frozenset(
    {
        SkipReason.UNREADABLE,
        SkipReason.UNSAFE_SONAME,
        SkipReason.UNSAFE_DESTINATION,
        SkipReason.OCCUPIED,
    }
)


@dataclass(frozen=True)
class StagedLink:
    """A SONAME link that is in place in the rootfs."""

    library: Path
    """The host library it names."""
    link: str
    """The link's path in the container, e.g. ``/usr/lib/x86_64-linux-gnu/libcuda.so.1``."""
    target: str
    """The link's (relative) target: the library's basename, e.g. ``libcuda.so.580.65.06``."""


@dataclass(frozen=True)
class SkippedLibrary:
    """A library for which no link was staged."""

    library: Path
    """The host library."""
    destination: str
    """Its mount destination in the container."""
    reason: SkipReason
    """Why, as a stable value for callers and metrics."""
    detail: str
    """Why, for humans (the SONAME, the parse error, the path that would not resolve)."""


@dataclass(frozen=True)
class StagingReport:
    """What :func:`stage_soname_links` did, in input order within each kind."""

    created: tuple[StagedLink, ...] = ()
    """Links that did not exist and were created."""
    replaced: tuple[StagedLink, ...] = ()
    """Links that pointed elsewhere and were replaced atomically."""
    existing: tuple[StagedLink, ...] = ()
    """Links that were already correct (a second staging finds all of them here)."""
    skipped: tuple[SkippedLibrary, ...] = ()
    """Libraries without a link, with the reason."""


# ---------------------------------------------------------------------------------------------
# The pure core


def is_versioned_library(name: str) -> bool:
    """Whether a basename names a versioned shared object (contains ``.so.``)."""
    return ".so." in name


def libcmp(left: str, right: str) -> int:
    """ldconfig's ``_dl_cache_libcmp``: compare names with digit runs compared as numbers.

    Positive when ``left`` sorts after ``right`` (is the higher version). A digit sorts
    after any other character, as in glibc.
    """
    i = j = 0
    while i < len(left):
        if left[i].isdigit():
            if j >= len(right) or not right[j].isdigit():
                return 1
            start_i, start_j = i, j
            while i < len(left) and left[i].isdigit():
                i += 1
            while j < len(right) and right[j].isdigit():
                j += 1
            difference = int(left[start_i:i]) - int(right[start_j:j])
            if difference:
                return difference
        elif j < len(right) and right[j].isdigit():
            return -1
        elif j >= len(right) or left[i] != right[j]:
            return ord(left[i]) - (ord(right[j]) if j < len(right) else 0)
        else:
            i += 1
            j += 1
    return -(ord(right[j]) if j < len(right) else 0)


@dataclass(frozen=True)
class PlannedLink:
    """A link :func:`plan_soname_links` decided to stage."""

    library: Path
    """The host library."""
    destination: str
    """Its mount destination in the container, as given."""
    directory: str
    """The container directory of the mount destination (and of the link)."""
    name: str
    """The link name: the SONAME."""
    target: str
    """The link target: the destination's basename."""

    @property
    def link(self) -> str:
        """The link's container path."""
        return f"{self.directory.rstrip('/')}/{self.name}"


def _link_name(basename: str, result: SonameResult) -> str | tuple[SkipReason, str]:
    """The link name for one library, or why there is none."""
    if not is_versioned_library(basename):
        return SkipReason.NOT_VERSIONED, f"{basename!r} has no '.so.' in its name"
    if isinstance(result, SonameUnreadable):
        return SkipReason.UNREADABLE, result.reason
    if isinstance(result, SonameAbsent):
        return SkipReason.NO_SONAME, result.reason
    if not confined.is_plain_name(result.soname):
        return SkipReason.UNSAFE_SONAME, f"SONAME {result.soname!r} is not a plain file name"
    if result.soname == basename:
        return SkipReason.SONAME_IS_BASENAME, f"SONAME {result.soname!r} is the file name"
    return result.soname


def plan_soname_links(
    libraries: Sequence[tuple[Path, str, SonameResult]],
) -> tuple[list[PlannedLink], list[SkippedLibrary]]:
    """Decide which links to stage for (host library, container destination, SONAME) triples.

    Pure: no file system access. Libraries whose basename has no ``.so.`` should not be
    passed (their SONAME is never read); they are skipped here as well if they are.
    """
    skipped: list[SkippedLibrary] = []
    candidates: list[PlannedLink] = []
    destinations: dict[str, set[str]] = {}
    for library, destination, result in libraries:
        try:
            parent, basename = confined.split_link_path(destination)
        except ValueError as e:
            skipped.append(
                SkippedLibrary(library, destination, SkipReason.UNSAFE_DESTINATION, str(e))
            )
            continue
        directory = "/" + parent
        destinations.setdefault(directory, set()).add(basename)
        name = _link_name(basename, result)
        if isinstance(name, tuple):
            skipped.append(SkippedLibrary(library, destination, *name))
        else:
            candidates.append(PlannedLink(library, destination, directory, name, basename))

    # ldconfig keeps one library per (directory, SONAME): the highest version.
    winners: dict[tuple[str, str], PlannedLink] = {}
    for candidate in candidates:
        key = (candidate.directory, candidate.name)
        best = winners.get(key)
        if best is None or libcmp(best.target, candidate.target) < 0:
            winners[key] = candidate
    planned: list[PlannedLink] = []
    for candidate in candidates:
        best = winners[(candidate.directory, candidate.name)]
        if best is not candidate:
            skipped.append(
                SkippedLibrary(
                    candidate.library,
                    candidate.destination,
                    SkipReason.SUPERSEDED,
                    f"{best.target!r} is a newer library with SONAME {candidate.name!r}",
                )
            )
        elif candidate.name in destinations[candidate.directory]:
            skipped.append(
                SkippedLibrary(
                    candidate.library,
                    candidate.destination,
                    SkipReason.OCCUPIED,
                    f"link name {candidate.name!r} is itself a mount destination",
                )
            )
        else:
            planned.append(candidate)
    return planned, skipped


@dataclass(frozen=True)
class _Batch:
    """The libraries of one staging, deduplicated, with the ones whose SONAME is read."""

    libraries: object
    """The caller's collection (the plan's tuple on the warm path)."""
    unique: tuple[tuple[Path, str], ...]
    """(host file, destination), the same mount twice being one mount."""
    versioned: tuple[bool, ...]
    """Per :attr:`unique` entry: whether its basename names a versioned library."""
    wanted: list[Path]
    """The host files whose SONAME is read (the versioned ones), in order."""


def _batch(libraries: Iterable[tuple[Path, str]]) -> _Batch:
    unique = tuple(dict.fromkeys(libraries))
    versioned = tuple(is_versioned_library(dest.rsplit("/", 1)[-1]) for _, dest in unique)
    wanted = [lib for (lib, _), v in zip(unique, versioned, strict=True) if v]
    return _Batch(libraries, unique, versioned, wanted)


#: One link directory of a plan: its container path and its links' (index, target, name).
_Group = tuple[str, tuple[tuple[int, str, str], ...]]


def _groups(planned: Sequence[PlannedLink]) -> tuple[_Group, ...]:
    """The planned links by directory, a parent directory before its children."""
    by_directory: dict[str, list[tuple[int, str, str]]] = {}
    for i, link in enumerate(planned):
        by_directory.setdefault(link.directory, []).append((i, link.target, link.name))
    return tuple((d, tuple(by_directory[d])) for d in sorted(by_directory))


@dataclass(frozen=True)
class _LinkPlan:
    """What :class:`_PlanMemo` keeps: the inputs and everything derived from them."""

    batch: _Batch
    results: list[SonameResult]
    planned: tuple[PlannedLink, ...]
    skipped: tuple[SkippedLibrary, ...]
    staged: tuple[StagedLink, ...]
    """Each planned link's :class:`StagedLink` (immutable: shared between reports)."""
    groups: tuple[_Group, ...]
    skip_events: tuple[tuple[bool, dict[str, str]], ...]
    """:func:`_skip_event` of each of :attr:`skipped`."""


class _PlanMemo:
    """The last batch and link plan, reused while the inputs are the same.

    Later actors on a worker stage the same libraries (the worker's plan holds one tuple of
    them) with the same cached SONAME results (the cache returns the very same result
    objects until a file changes), so re-planning is pure overhead on the warm path.
    Results are compared by value (equal results give the same plan: planning is a pure
    function of them); each memo is one object swapped atomically, so threads staging
    concurrently at worst plan twice.
    """

    def __init__(self) -> None:
        self._batch: _Batch | None = None
        self._last: _LinkPlan | None = None

    def batch(self, libraries: Iterable[tuple[Path, str]]) -> _Batch:
        """The batch of ``libraries``, reused while they are an equal tuple (the plans of a
        worker's device sets hold the same library objects: compared by identity first)."""
        last = self._batch
        if (
            last is not None
            and isinstance(libraries, tuple)
            and isinstance(last.libraries, tuple)
            and last.libraries == libraries
        ):
            return last
        batch = self._batch = _batch(libraries)
        return batch

    def plan(self, batch: _Batch, results: list[SonameResult]) -> _LinkPlan:
        """The link plan for ``batch``'s libraries with these SONAME results."""
        last = self._last
        # List equality compares items by identity first: the warm path's cached results
        # are the very same objects.
        if last is not None and last.batch is batch and last.results == results:
            return last
        found = iter(results)
        triples = [
            (library, destination, next(found) if v else _NOT_VERSIONED)
            for (library, destination), v in zip(batch.unique, batch.versioned, strict=True)
        ]
        planned, skipped = plan_soname_links(triples)
        plan = self._last = _LinkPlan(
            batch=batch,
            results=results,
            planned=tuple(planned),
            skipped=tuple(skipped),
            staged=tuple(StagedLink(p.library, p.link, p.target) for p in planned),
            groups=_groups(planned),
            skip_events=tuple(_skip_event(entry) for entry in skipped),
        )
        return plan


_plan_memo = _PlanMemo()


# ---------------------------------------------------------------------------------------------
# The effectful shell


#: The result for a mount that is no versioned library (one object: the plan memo compares
#: results by identity).
_NOT_VERSIONED = SonameAbsent("not a versioned library")


#: What became of one planned link: its outcome, or why its directory was refused.
_Written = confined.LinkOutcome | str

_CREATED = confined.LinkOutcome.CREATED


def _skip_event(entry: SkippedLibrary) -> tuple[bool, dict[str, str]]:
    """Whether a skipped library is a warning, and its log fields (built once per link
    plan for the plan's own skipped libraries: they recur for every actor of a worker)."""
    fields = {
        "library": str(entry.library),
        "destination": entry.destination,
        "reason": entry.reason.value,
        "detail": entry.detail,
    }
    return entry.reason in WARNING_REASONS, fields


def _open_directory(
    rootfs: Path, root_fd: int, directory: str, opened: dict[str, int], new: set[str]
) -> int:
    """An O_PATH descriptor of ``directory`` (in-root), created when missing.

    Walks from the nearest directory opened already, one ``openat`` per real directory on
    the way (``mkdir`` + ``openat`` where it is missing; ``mkdir`` first below a directory
    created just now). Any symlink, ``..`` or non-directory on the way sends the whole
    path to :func:`confined.open_dir_at`, the careful in-root resolution. Every descriptor
    opened lands in ``opened`` (the caller closes them); created directories in ``new``.
    """
    fd, path = root_fd, ""
    for name in directory.split("/"):
        if not name:
            continue
        parent, path = path, f"{path}/{name}"
        known = opened.get(path)
        if known is not None:
            fd = known
            continue
        child = confined.open_child_dir(fd, name, create=True, parent_is_new=parent in new)
        if child is None:
            fd = opened[directory] = confined.open_dir_at(rootfs, root_fd, directory, create=True)
            return fd
        fd = opened[path] = child[0]
        if child[1]:
            new.add(path)
    return fd


def _open_rootfs(rootfs: Path) -> int:
    """``rootfs`` as an O_PATH descriptor; a symlink there is refused, not followed (its
    links would land wherever it points)."""
    try:
        return os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        problem = (
            "it is a symbolic link; the rootfs must be a real directory"
            if rootfs.is_symlink()
            else str(e)
        )
        raise InjectionError(f"while staging SONAME links in rootfs {rootfs}: {problem}") from e


def _write_links(
    rootfs: Path,
    planned: Sequence[PlannedLink],
    groups: Sequence[_Group],
    given_root_fd: int | None = None,
) -> list[_Written]:
    """Create the links (``groups``: ``planned`` by directory), one directory resolution
    per directory.

    Link names are plain (checked when planned), so a fresh rootfs costs one ``symlinkat``
    per link; an existing name takes :func:`confined.ensure_symlink_at`'s careful path.
    """
    written: list[_Written | None] = [None] * len(planned)
    opened: dict[str, int] = {}
    new: set[str] = set()
    root_fd = _open_rootfs(rootfs) if given_root_fd is None else os.dup(given_root_fd)
    directory = "/"
    try:
        for directory, links in groups:  # a parent before its children
            try:
                fd = _open_directory(rootfs, root_fd, directory, opened, new)
                for i, target, name in links:
                    try:
                        os.symlink(target, name, dir_fd=fd)
                    except FileExistsError:
                        written[i] = confined.ensure_symlink_at(fd, name, target)
                    else:
                        written[i] = _CREATED
            except confined.ConfinedPathError as e:
                for i, _target, _name in links:
                    if written[i] is None:
                        written[i] = e.problem
    except OSError as e:
        raise InjectionError(
            f"while staging SONAME links in {directory} of rootfs {rootfs}: {e}; "
            "check that the rootfs is writable and has space"
        ) from e
    finally:
        for fd in opened.values():
            os.close(fd)
        os.close(root_fd)
    return [w if w is not None else "not staged" for w in written]


def stage_soname_links(
    rootfs: Path,
    libraries: Iterable[tuple[Path, str]],
    *,
    cache: SonameCache,
    log: StagingLog | None = None,
    root_fd: int | None = None,
) -> StagingReport:
    """Create the SONAME links ``ldconfig -n`` would create for mounted libraries.

    ``libraries`` are (host file, container destination) pairs, e.g.
    ``(Path("/usr/local/nvidia/lib64/libcuda.so.580.65.06"),
    "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06")``. Every write is confined to
    ``rootfs``. Idempotent: a second call reports every link as existing.

    ``rootfs`` must be a real directory, not a symlink. ``root_fd``: an O_PATH descriptor
    of it that the caller opened already (the injector, which refuses a symlink anywhere
    on ``root.path``; the caller keeps and closes it), used instead of opening ``rootfs``.

    Raises :class:`~substrate_gpu.exceptions.InjectionError` only for I/O failures in the
    rootfs (read-only, full); bad libraries and hostile paths are skipped and reported.
    """
    logger: StagingLog = log if log is not None else _log
    batch = _plan_memo.batch(libraries)
    plan = _plan_memo.plan(batch, cache.lookup_many(batch.wanted))
    planned, skipped, staged_links = plan.planned, list(plan.skipped), plan.staged
    written = _write_links(rootfs, planned, plan.groups, root_fd)

    created: list[StagedLink] = []
    replaced: list[StagedLink] = []
    existing: list[StagedLink] = []
    if written.count(_CREATED) == len(written):
        # A fresh rootfs (every later actor): each link is new; nothing to sort out.
        created = list(staged_links)
        written = []
    for link, staged, outcome in zip(planned, staged_links, written, strict=False):
        if outcome is confined.LinkOutcome.CREATED:
            created.append(staged)  # summarised below: one event per staging, not per link
        elif outcome is confined.LinkOutcome.REPLACED:
            replaced.append(staged)
            logger.info(
                "soname_link_replaced",
                library=str(link.library),
                link=link.link,
                target=link.target,
            )
        elif outcome is confined.LinkOutcome.EXISTS:
            existing.append(staged)
        elif outcome is confined.LinkOutcome.OCCUPIED:
            detail = f"{link.link} exists and is not a symlink; left alone"
            skipped.append(
                SkippedLibrary(link.library, link.destination, SkipReason.OCCUPIED, detail)
            )
        else:
            detail = f"{link.directory}: {outcome}"
            skipped.append(
                SkippedLibrary(
                    link.library, link.destination, SkipReason.UNSAFE_DESTINATION, detail
                )
            )

    # The plan's own skipped libraries, then those the writes added.
    for warning, fields in (*plan.skip_events, *map(_skip_event, skipped[len(plan.skipped) :])):
        (logger.warning if warning else logger.debug)("soname_link_skipped", **fields)
    logger.debug(
        "soname_links_staged",
        created=len(created),
        replaced=len(replaced),
        existing=len(existing),
        skipped=len(skipped),
    )
    return StagingReport(
        created=tuple(created),
        replaced=tuple(replaced),
        existing=tuple(existing),
        skipped=tuple(skipped),
    )
