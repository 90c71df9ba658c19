"""Reading ``DT_SONAME`` from host libraries, cheaply, and remembering it.

Why not ``ELFFile(f).get_section_by_name('.dynamic')``: that parses every section header,
a cost paid per library (tests/bench/bench_sonames.py times it), and section headers are
optional metadata the dynamic linker never reads (``strip --strip-section-headers`` removes
them). The loader's own view is the program headers, so the cold path reads exactly what
``ld.so`` reads:

1. the ELF header (52 or 64 bytes),
2. the program header table,
3. the ``PT_DYNAMIC`` segment,
4. the SONAME bytes in the dynamic string table, whose address (``DT_STRTAB``, a virtual
   address) is mapped to a file offset through the ``PT_LOAD`` segment that contains it.

The three records read (ELF header, program header, dynamic entry) are ``struct`` layouts
for both classes and byte orders, checked in the tests against pyelftools' own definitions
(:class:`ELFStructs`), so they cannot drift from them. pyelftools itself is not imported:
its ``construct`` package loads ``construct.debug`` and with it pdb, bdb, cmd and code, most
of a cold injection's time. Only ``struct`` and our own checks touch the bytes. Corrupt
input never raises: ``struct.error``, ``OverflowError``,
``ValueError`` and the like on hostile bytes (with ``OSError``) become a
:class:`SonameUnreadable` with a reason.

:class:`SonameCache` keys results by the file's identity and version (device, inode, size,
mtime, ctime), so a later lookup pays one ``stat`` per library and nothing else (~40 of them
for a later actor's whole driver; a host watch that saved them moved a warm injection next to
``runsc create`` by too little to matter, so it was removed: docs/gpu-injection.md).
"""

from __future__ import annotations

import functools
import io
import os
import stat
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeAlias

_ELF_MAGIC = b"\x7fELF"
_PT_LOAD = 1
_PT_DYNAMIC = 2
_DT_NULL = 0
_DT_STRTAB = 5
_DT_STRSZ = 10
_DT_SONAME = 14
_PN_XNUM = 0xFFFF  # the real count lives in section header 0: we do not read section headers

#: Upper bounds that keep a hostile file from making us read much: a real dynamic segment
#: is a few hundred bytes, a SONAME is a file name.
MAX_PROGRAM_HEADERS = 4096
MAX_DYNAMIC_BYTES = 1 << 20
MAX_SONAME_BYTES = 4096


@dataclass(frozen=True)
class SonameFound:
    """The library declares a SONAME."""

    soname: str
    """``DT_SONAME`` as the linker sees it (non-UTF-8 bytes kept via ``os.fsdecode``)."""


@dataclass(frozen=True)
class SonameAbsent:
    """A well-formed ELF file that declares no SONAME: there is nothing to link."""

    reason: str
    """Why: no program headers (object file), no dynamic segment (static executable), or
    a dynamic segment without ``DT_SONAME``."""


@dataclass(frozen=True)
class SonameUnreadable:
    """The file cannot be read as an ELF shared object: not ELF, truncated, corrupt, I/O."""

    reason: str
    """What went wrong, for the warning logged by the caller."""


SonameResult: TypeAlias = SonameFound | SonameAbsent | SonameUnreadable
"""The outcome of reading one file's SONAME; never an exception."""

#: What decoding raises on corrupt input (brief §8): struct and our own indexing. OSError is
#: handled apart: an I/O error says nothing about the file's content, so it is not cached.
_CORRUPT_INPUT_ERRORS: tuple[type[Exception], ...] = (
    OverflowError,
    AssertionError,
    struct.error,
    ValueError,
    IndexError,
    KeyError,
    EOFError,
)


class _Corrupt(Exception):
    """Internal: the bytes contradict the ELF format; the message is the reason."""


# ---------------------------------------------------------------------------------------------
# The cold path: header, program headers, PT_DYNAMIC, SONAME bytes


@dataclass(frozen=True)
class _Layout:
    """One fixed-size ELF record as a ``struct.Struct``, its fields named."""

    names: tuple[str, ...]
    packer: struct.Struct

    def unpack(self, data: bytes, offset: int = 0) -> dict[str, int]:
        return dict(zip(self.names, self.packer.unpack_from(data, offset), strict=True))


@dataclass(frozen=True)
class _Layouts:
    ehdr: _Layout
    phdr: _Layout
    dyn: _Layout


_EHDR_FIELDS = (
    "e_type", "e_machine", "e_version", "e_entry", "e_phoff", "e_shoff", "e_flags",
    "e_ehsize", "e_phentsize", "e_phnum", "e_shentsize", "e_shnum", "e_shstrndx",
)  # fmt: skip
_PHDR32_FIELDS = (
    "p_type", "p_offset", "p_vaddr", "p_paddr", "p_filesz", "p_memsz", "p_flags", "p_align",
)  # fmt: skip
_PHDR64_FIELDS = (
    "p_type", "p_flags", "p_offset", "p_vaddr", "p_paddr", "p_filesz", "p_memsz", "p_align",
)  # fmt: skip

#: The records we decode, per ELF class: field names and ``struct`` format (byte order
#: added), as the System V gABI lays them out (``Elf32_Ehdr``, ``Elf64_Phdr``, ...; ``e_ident``
#: skipped: read on its own). tests/rootfs/test_rootfs_sonames.py derives the same from
#: pyelftools' ``ELFStructs``, so the two cannot drift; importing pyelftools here instead
#: would pull in ``elftools.construct.debug`` and with it pdb, bdb, cmd and code (most of
#: a cold injection's time: tests/bench/bench_sonames.py).
_RECORDS: dict[int, dict[str, tuple[tuple[str, ...], str]]] = {
    32: {
        "ehdr": (_EHDR_FIELDS, "16xHHLLLLLHHHHHH"),
        "phdr": (_PHDR32_FIELDS, "LLLLLLLL"),
        "dyn": (("d_tag", "d_val"), "lL"),
    },
    64: {
        "ehdr": (_EHDR_FIELDS, "16xHHLQQQLHHHHHH"),
        "phdr": (_PHDR64_FIELDS, "LLQQQQQQ"),
        "dyn": (("d_tag", "d_val"), "qQ"),
    },
}


@functools.lru_cache(maxsize=4)
def _layouts(little_endian: bool, elfclass: int) -> _Layouts:
    """The records we decode, for one ELF class and byte order (built once each)."""
    order = "<" if little_endian else ">"
    records = _RECORDS[elfclass]

    def layout(kind: str) -> _Layout:
        names, fmt = records[kind]
        return _Layout(names, struct.Struct(order + fmt))

    return _Layouts(ehdr=layout("ehdr"), phdr=layout("phdr"), dyn=layout("dyn"))


#: No real file is this large; larger offsets are corrupt, not worth a failing seek.
_MAX_OFFSET = 1 << 48


def _read_exactly(stream: BinaryIO, offset: int, size: int, what: str) -> bytes:
    if not (0 <= offset < _MAX_OFFSET and 0 <= size < _MAX_OFFSET):
        raise _Corrupt(f"{what} lies outside any plausible file ({offset=}, {size=})")
    stream.seek(offset)
    data = stream.read(size)
    if len(data) != size:
        raise _Corrupt(f"truncated: {what} needs {size} bytes at offset {offset}")
    return data


@dataclass(frozen=True)
class _Segment:
    kind: int
    offset: int
    vaddr: int
    filesz: int


def _program_headers(stream: BinaryIO, layouts: _Layouts, header: dict[str, int]) -> list[_Segment]:
    phnum = header["e_phnum"]
    if phnum == _PN_XNUM or phnum > MAX_PROGRAM_HEADERS:
        raise _Corrupt(f"unsupported program header count {phnum}")
    entry_size = layouts.phdr.packer.size
    if phnum and header["e_phentsize"] != entry_size:
        raise _Corrupt(f"program header size {header['e_phentsize']}, expected {entry_size}")
    table = _read_exactly(stream, header["e_phoff"], phnum * entry_size, "program header table")
    segments = []
    for index in range(phnum):
        raw = layouts.phdr.unpack(table, index * entry_size)
        segments.append(_Segment(raw["p_type"], raw["p_offset"], raw["p_vaddr"], raw["p_filesz"]))
    return segments


def _dynamic_entries(data: bytes, layouts: _Layouts) -> Iterator[tuple[int, int]]:
    size = layouts.dyn.packer.size
    for start in range(0, len(data) - size + 1, size):
        raw = layouts.dyn.unpack(data, start)
        if raw["d_tag"] == _DT_NULL:
            return
        yield raw["d_tag"], raw["d_val"]


def _file_offset(segments: list[_Segment], vaddr: int) -> int:
    """Map a virtual address to a file offset through the PT_LOAD segment holding it."""
    for segment in segments:
        if segment.kind == _PT_LOAD and segment.vaddr <= vaddr < segment.vaddr + segment.filesz:
            return segment.offset + (vaddr - segment.vaddr)
    raise _Corrupt(f"DT_STRTAB address {vaddr:#x} lies in no PT_LOAD segment")


def _read_soname(stream: BinaryIO) -> SonameResult:
    ident = stream.read(16)
    if ident[:4] != _ELF_MAGIC:
        return SonameUnreadable("not an ELF file (bad magic)")
    if len(ident) < 16:
        raise _Corrupt("truncated ELF identification")
    elfclass = {1: 32, 2: 64}.get(ident[4])
    byte_order = {1: True, 2: False}.get(ident[5])
    if elfclass is None or byte_order is None:
        raise _Corrupt(f"unknown ELF class {ident[4]} or data encoding {ident[5]}")
    layouts = _layouts(byte_order, elfclass)
    header = layouts.ehdr.unpack(_read_exactly(stream, 0, layouts.ehdr.packer.size, "header"))
    segments = _program_headers(stream, layouts, header)
    if not segments:
        return SonameAbsent("no program headers (a relocatable object file?)")
    dynamic = next((s for s in segments if s.kind == _PT_DYNAMIC), None)
    if dynamic is None:
        return SonameAbsent("no dynamic segment (a static executable?)")
    if dynamic.filesz > MAX_DYNAMIC_BYTES:
        raise _Corrupt(f"dynamic segment of {dynamic.filesz} bytes is implausibly large")
    data = _read_exactly(stream, dynamic.offset, dynamic.filesz, "dynamic segment")

    # A repeated tag: the last one wins, as in ld.so's and ldconfig's own loops.
    tags = dict(_dynamic_entries(data, layouts))
    if _DT_SONAME not in tags:
        return SonameAbsent("the dynamic segment has no DT_SONAME")
    if _DT_STRTAB not in tags:
        raise _Corrupt("DT_SONAME without DT_STRTAB")
    name_offset = tags[_DT_SONAME]
    limit = MAX_SONAME_BYTES + 1
    if _DT_STRSZ in tags:
        if name_offset >= tags[_DT_STRSZ]:
            raise _Corrupt("DT_SONAME points past the end of the string table")
        limit = min(limit, tags[_DT_STRSZ] - name_offset)
    start = _file_offset(segments, tags[_DT_STRTAB]) + name_offset
    if not 0 <= start < _MAX_OFFSET:
        raise _Corrupt(f"SONAME offset {start} lies outside any plausible file")
    stream.seek(start)
    raw_name = stream.read(limit)
    end = raw_name.find(b"\0")
    if end < 0:
        raise _Corrupt("SONAME string is not terminated within the string table")
    return SonameFound(os.fsdecode(raw_name[:end]))


def _decode_soname(stream: BinaryIO) -> SonameResult:
    """Like :func:`read_soname`, but lets ``OSError`` through (the cache must not keep it)."""
    try:
        stream.seek(0)
        return _read_soname(stream)
    except _Corrupt as e:
        return SonameUnreadable(f"corrupt ELF file: {e}")
    except _CORRUPT_INPUT_ERRORS as e:
        return SonameUnreadable(f"corrupt ELF file: {type(e).__name__}: {e}")


def read_soname(stream: BinaryIO) -> SonameResult:
    """Read ``DT_SONAME`` from a seekable binary ``stream`` positioned anywhere.

    Reads only the ELF header, the program headers, ``PT_DYNAMIC`` and the SONAME bytes.
    Never raises for bad input: corrupt and non-ELF data and I/O errors give
    :class:`SonameUnreadable`.
    """
    try:
        return _decode_soname(stream)
    except OSError as e:
        return SonameUnreadable(f"read error: {e.strerror or e}")


def read_soname_from_bytes(data: bytes) -> SonameResult:
    """:func:`read_soname` over an in-memory copy of a file."""
    return read_soname(io.BytesIO(data))


# ---------------------------------------------------------------------------------------------
# The cache: one stat per lookup once a library was read


_FileKey: TypeAlias = tuple[int, int, int, int, int]


def file_key(st: os.stat_result) -> _FileKey:
    """Identity and version of a file: device, inode, size, mtime and ctime (ns).

    ctime is included because rewriting a file and restoring its mtime still moves ctime.
    """
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


def open_for_reading(path: Path) -> BinaryIO:
    """Open ``path`` unbuffered, never blocking (a FIFO swapped in after ``stat``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    return os.fdopen(fd, "rb", buffering=0)


@dataclass(frozen=True)
class CacheStats:
    """Counters of a :class:`SonameCache`."""

    hits: int
    """Lookups answered from the cache (one ``stat`` each)."""
    misses: int
    """Lookups that opened and read the file."""
    size: int
    """Entries held now."""


class SonameCache:
    """Thread-safe bounded LRU of SONAME results, keyed by :func:`file_key`.

    A hit costs one ``stat``. A miss opens the file, keys the result by ``fstat`` of the
    open file (so a file replaced between ``stat`` and ``open`` is cached under what was
    actually read) and reads it. Failures to stat or open are returned, never cached.
    """

    def __init__(
        self,
        maxsize: int = 4096,
        *,
        opener: Callable[[Path], BinaryIO] = open_for_reading,
    ) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self._maxsize = maxsize
        self._opener = opener
        self._entries: OrderedDict[_FileKey, SonameResult] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    @property
    def stats(self) -> CacheStats:
        """Hit and miss counters and the current size."""
        with self._lock:
            return CacheStats(self._hits, self._misses, len(self._entries))

    def lookup_many(self, paths: Sequence[Path]) -> list[SonameResult]:
        """:meth:`lookup` for each of ``paths``, in order: one ``stat`` per path and one
        pass under the lock for the hits (a later actor's whole driver at once).

        Each directory is opened once and its files stat-ed by name from it (the kernel
        walks the directory's path once, not once per library); the result is the same
        ``stat`` of the same file, symlinks followed.
        """
        keys: list[_FileKey | SonameResult] = []
        directories: dict[str, int | None] = {}
        try:
            for path in paths:
                directory, name = os.path.split(path)
                if directory not in directories:
                    try:
                        directories[directory] = os.open(directory or ".", _DIR_FLAGS)
                    except OSError:
                        directories[directory] = None  # stat the full path: same error
                dir_fd = directories[directory]
                try:
                    # No pathlib wrapper on the hot path.
                    st = os.stat(path) if dir_fd is None else os.stat(name, dir_fd=dir_fd)  # noqa: PTH116
                except OSError as e:
                    keys.append(SonameUnreadable(f"cannot stat: {e.strerror or e}"))
                    continue
                if not stat.S_ISREG(st.st_mode):
                    keys.append(SonameUnreadable("not a regular file"))
                    continue
                keys.append(file_key(st))
        finally:
            for dir_fd in directories.values():
                if dir_fd is not None:
                    os.close(dir_fd)
        results: list[SonameResult | None] = []
        entries = self._entries
        with self._lock:
            for key in keys:
                if not isinstance(key, tuple):
                    results.append(key)
                    continue
                cached = entries.get(key)
                if cached is not None:
                    entries.move_to_end(key)
                    self._hits += 1
                results.append(cached)
        # Misses (the first actor, a changed file) take the careful path, file by file.
        return [
            self.lookup(path) if cached is None else cached
            for path, cached in zip(paths, results, strict=True)
        ]

    def lookup(self, path: Path) -> SonameResult:
        """The SONAME result for the file at ``path`` (symlinks followed); never raises."""
        try:
            st = path.stat()
        except OSError as e:
            return SonameUnreadable(f"cannot stat: {e.strerror or e}")
        if not stat.S_ISREG(st.st_mode):
            return SonameUnreadable("not a regular file")
        key = file_key(st)
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
                self._hits += 1
                return cached
            self._misses += 1
        try:
            stream = self._opener(path)
        except OSError as e:
            return SonameUnreadable(f"cannot open: {e.strerror or e}")
        with stream:
            try:
                st = os.fstat(stream.fileno())
            except (OSError, io.UnsupportedOperation):
                pass  # a test double without a descriptor: keep the stat() key
            else:
                if not stat.S_ISREG(st.st_mode):
                    return SonameUnreadable("not a regular file")
                key = file_key(st)
            try:
                result = _decode_soname(stream)
            except OSError as e:
                return SonameUnreadable(f"read error: {e.strerror or e}")
        with self._lock:
            self._entries[key] = result
            self._entries.move_to_end(key)
            while len(self._entries) > self._maxsize:
                self._entries.popitem(last=False)
        return result
