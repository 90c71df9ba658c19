"""Reading DT_SONAME through the program headers: agreement with readelf, and robustness.

The reference readers are binutils' ``readelf -d`` and pyelftools' section-based reader; the
inputs are real libraries built with gcc and hand-made images for the flavours gcc cannot
produce here (big-endian, 32-bit without a 32-bit libc).
"""

from __future__ import annotations

import functools
import io
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import elflibs
from support.real import missing

from substrate_gpu.rootfs import sonames
from substrate_gpu.rootfs.sonames import (
    SonameAbsent,
    SonameFound,
    SonameUnreadable,
    read_soname,
    read_soname_from_bytes,
)

RESULT_TYPES = (SonameFound, SonameAbsent, SonameUnreadable)


class CountingStream(io.RawIOBase):
    """A read-only file wrapper that records every byte range read and every seek."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._position = 0
        self.seeks = 0
        self.reads: list[tuple[int, int]] = []

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.seeks += 1
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self._data)}[whence]
        self._position = base + offset
        return self._position

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else self._position + size
        chunk = self._data[self._position : end]
        self.reads.append((self._position, self._position + len(chunk)))
        self._position += len(chunk)
        return chunk

    @property
    def bytes_read(self) -> int:
        return sum(end - start for start, end in self.reads)


def _section_soname(path: Path) -> str | None:
    """The naive reader: pyelftools' .dynamic section (parses every section header)."""
    with path.open("rb") as f:
        section = ELFFile(f).get_section_by_name(".dynamic")
        for tag in section.iter_tags() if section is not None else ():
            if tag.entry.d_tag == "DT_SONAME":
                return str(tag.soname)
    return None


@pytest.fixture(scope="module")
def libdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory for libraries shared by this module's tests."""
    return tmp_path_factory.mktemp("libs")


@pytest.mark.parametrize(
    ("filename", "soname"),
    [
        pytest.param("libcuda.so.580.65.06", "libcuda.so.1", id="driver-style"),
        pytest.param("libnvidia-ml.so.580.65.06", "libnvidia-ml.so.1", id="nvml"),
        pytest.param("libfoo.so.1.2.3", "libfoo.so.1.2.3", id="soname-is-basename"),
        pytest.param("libplus+x.so.2", "libplus+x.so.2.0~rc", id="odd-characters"),
        pytest.param("libdeep.so.1", "../../etc/passwd", id="hostile-soname"),
        pytest.param("liblong.so.1", "lib" + "x" * 200 + ".so.1", id="long-soname"),
    ],
)
def test_soname_matches_readelf(libdir: Path, filename: str, soname: str) -> None:
    """The SONAME read through PT_DYNAMIC equals what readelf -d prints for a gcc-built lib."""
    path = elflibs.build_shared_library(libdir, filename, soname)
    with path.open("rb") as f:
        result = read_soname(f)
    assert result == SonameFound(soname)
    assert elflibs.readelf_soname(path) == soname


def test_soname_matches_pyelftools_section_reader(libdir: Path) -> None:
    """The program-header reader and pyelftools' section reader agree on a real library."""
    path = elflibs.build_shared_library(libdir, "libagree.so.3.1", "libagree.so.3")
    with path.open("rb") as f:
        assert read_soname(f) == SonameFound(str(_section_soname(path)))


def test_system_libc_soname_matches_readelf() -> None:
    """The C library of this machine reads as readelf reports it."""
    libc = Path("/usr/lib/x86_64-linux-gnu/libc.so.6")
    if not libc.exists():
        missing("x86_64 glibc", f"has no {libc}")
    with libc.open("rb") as f:
        assert read_soname(f) == SonameFound(str(elflibs.readelf_soname(libc)))


def test_32_bit_library_built_by_gcc(libdir: Path) -> None:
    """A 32-bit shared object (gcc -m32) reads correctly."""
    path = elflibs.build_shared_library(libdir, "lib32.so.1.0", "lib32.so.1", elfclass=32)
    with path.open("rb") as f:
        assert read_soname(f) == SonameFound("lib32.so.1")
    assert elflibs.readelf_soname(path) == "lib32.so.1"


@pytest.mark.parametrize(
    ("little_endian", "elfclass"),
    [
        pytest.param(True, 64, id="le64"),
        pytest.param(True, 32, id="le32"),
        pytest.param(False, 64, id="be64"),
        pytest.param(False, 32, id="be32"),
    ],
)
def test_every_class_and_byte_order(tmp_path: Path, little_endian: bool, elfclass: int) -> None:
    """Hand-made images of each class and byte order read as readelf reads them."""
    path = tmp_path / "libsyn.so.7.0"
    path.write_bytes(
        elflibs.synthetic_elf(b"libsyn.so.7", little_endian=little_endian, elfclass=elfclass)
    )
    assert read_soname_from_bytes(path.read_bytes()) == SonameFound("libsyn.so.7")
    assert elflibs.readelf_soname(path) == "libsyn.so.7"


def test_non_utf8_soname_round_trips_as_a_file_name() -> None:
    """A SONAME with non-UTF-8 bytes decodes with surrogateescape, like os.fsdecode."""
    result = read_soname_from_bytes(elflibs.synthetic_elf(b"lib\xff.so.1"))
    assert isinstance(result, SonameFound)
    assert result.soname.encode("utf-8", "surrogateescape") == b"lib\xff.so.1"


# --- files without a SONAME -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        pytest.param(
            lambda d: elflibs.build_shared_library(d, "libnone.so.1", None),
            "no DT_SONAME",
            id="lib-without-soname",
        ),
        pytest.param(
            lambda d: elflibs.build_executable(d, "exe"), "no DT_SONAME", id="dynamic-executable"
        ),
        pytest.param(
            lambda d: elflibs.build_static_executable(d, "static"),
            "no dynamic segment",
            id="static-executable",
        ),
        pytest.param(
            lambda d: elflibs.build_object_file(d, "obj.o"), "no program headers", id="object-file"
        ),
    ],
)
def test_elf_without_soname_is_absent(
    tmp_path: Path, build: Callable[[Path], Path], reason: str
) -> None:
    """Well-formed ELF files that declare no SONAME give SonameAbsent with the reason."""
    path = build(tmp_path)
    with path.open("rb") as f:
        result = read_soname(f)
    assert isinstance(result, SonameAbsent)
    assert reason in result.reason
    assert elflibs.readelf_soname(path) is None


def test_synthetic_image_without_soname_is_absent() -> None:
    """A dynamic segment without DT_SONAME is absent, not unreadable."""
    assert isinstance(read_soname_from_bytes(elflibs.synthetic_elf(None)), SonameAbsent)


# --- corrupt and foreign input --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(b"", "not an ELF file", id="empty"),
        pytest.param(b"#!/bin/sh\necho hi\n", "not an ELF file", id="script"),
        pytest.param(b"\x7fEL", "not an ELF file", id="short-magic"),
        pytest.param(b"\x7fELF", "truncated", id="magic-only"),
        pytest.param(b"\x7fELF\x03\x01" + bytes(58), "unknown ELF class", id="bad-class"),
        pytest.param(b"\x7fELF\x02\x03" + bytes(58), "data encoding", id="bad-byte-order"),
    ],
)
def test_foreign_bytes_are_unreadable(data: bytes, reason: str) -> None:
    """Non-ELF and malformed identification bytes give SonameUnreadable with a reason."""
    result = read_soname_from_bytes(data)
    assert isinstance(result, SonameUnreadable)
    assert reason in result.reason


def test_truncation_at_every_offset_never_raises(libdir: Path) -> None:
    """A real library cut anywhere gives either its SONAME or SonameUnreadable."""
    data = elflibs.build_shared_library(libdir, "libcut.so.1.0", "libcut.so.1").read_bytes()
    for cut in range(len(data)):
        result = read_soname_from_bytes(data[:cut])
        assert result == SonameFound("libcut.so.1") or isinstance(result, SonameUnreadable), cut


def test_synthetic_truncation_below_the_string_is_unreadable() -> None:
    """A hand-made image cut inside the SONAME string is unreadable (no NUL terminator)."""
    data = elflibs.synthetic_elf(b"libsyn.so.7")
    assert isinstance(read_soname_from_bytes(data[:-1]), SonameUnreadable)


@pytest.mark.parametrize(
    ("offset", "value", "reason"),
    [
        pytest.param(0x36, b"\x00\x01", "program header size", id="bad-phentsize"),
        pytest.param(0x38, b"\xff\xff", "program header count", id="pn-xnum"),
        pytest.param(0x20, b"\xff" * 8, "plausible", id="huge-phoff"),
    ],
)
def test_corrupt_header_fields_are_unreadable(offset: int, value: bytes, reason: str) -> None:
    """Hostile header values are reported, not followed."""
    data = bytearray(elflibs.synthetic_elf(b"libsyn.so.7"))
    data[offset : offset + len(value)] = value
    result = read_soname_from_bytes(bytes(data))
    assert isinstance(result, SonameUnreadable)
    assert reason in result.reason


def test_string_table_outside_every_load_segment_is_unreadable() -> None:
    """A DT_STRTAB address that no PT_LOAD maps is corrupt."""
    data = elflibs.synthetic_elf(b"libsyn.so.7", strtab_address=0x90000000)
    result = read_soname_from_bytes(data)
    assert isinstance(result, SonameUnreadable)
    assert "no PT_LOAD" in result.reason


def test_string_table_at_the_load_segments_end_is_unreadable() -> None:
    """PT_LOAD maps [p_vaddr, p_vaddr + p_filesz): a DT_STRTAB right at its end lies outside
    it, even where the bytes after the segment in the file would read as a SONAME."""
    size = len(elflibs.synthetic_elf(b"libsyn.so.7"))
    end = 0x10000 + size  # synthetic_elf's one PT_LOAD maps the whole image from 0x10000
    tail = b"\0libevil.so\0"  # what a reader mapping the end address would find
    result = read_soname_from_bytes(
        elflibs.synthetic_elf(b"libsyn.so.7", strtab_address=end) + tail
    )
    assert isinstance(result, SonameUnreadable)
    assert "no PT_LOAD" in result.reason


def _with_strsz(path: Path, strsz: Callable[[int], int]) -> bytes:
    """A real library's bytes with DT_STRSZ rewritten to ``strsz(DT_SONAME's offset)``."""
    data = bytearray(path.read_bytes())
    with path.open("rb") as f:
        elf = ELFFile(f)
        (dynamic,) = (s for s in elf.iter_segments() if s["p_type"] == "PT_DYNAMIC")
        entry_size = 16 if elf.elfclass == 64 else 8
        entries = [
            (dynamic["p_offset"] + i * entry_size, tag.entry.d_tag, tag.entry.d_val)
            for i, tag in enumerate(dynamic.iter_tags())
        ]
    (soname_offset,) = (value for _, tag, value in entries if tag == "DT_SONAME")
    (field,) = (at + entry_size // 2 for at, tag, _ in entries if tag == "DT_STRSZ")
    data[field : field + entry_size // 2] = strsz(soname_offset).to_bytes(entry_size // 2, "little")
    return bytes(data)


@pytest.mark.parametrize(
    ("strsz", "reason"),
    [
        # The string table ends before the SONAME starts; the bytes read would be whatever
        # follows the table (here: the real SONAME, so only the bound can tell).
        pytest.param(lambda offset: offset, "past the end of the string table", id="ends-before"),
        # The table ends inside the SONAME: its NUL lies outside the table.
        pytest.param(
            lambda offset: offset + 3, "not terminated within the string table", id="ends-inside"
        ),
    ],
)
def test_soname_is_bounded_by_dt_strsz(
    libdir: Path, strsz: Callable[[int], int], reason: str
) -> None:
    """A SONAME not wholly inside DT_STRSZ bytes of string table is unreadable, not read on."""
    path = elflibs.build_shared_library(libdir, "libstrsz.so.1.0", "libstrsz.so.1")
    with path.open("rb") as f:
        assert read_soname(f) == SonameFound("libstrsz.so.1")
    result = read_soname_from_bytes(_with_strsz(path, strsz))
    assert isinstance(result, SonameUnreadable)
    assert reason in result.reason


def test_soname_ending_exactly_at_dt_strsz_is_read(libdir: Path) -> None:
    """The bound is inclusive of the SONAME's NUL: a table ending right after it still reads."""
    path = elflibs.build_shared_library(libdir, "libstrsz2.so.1.0", "libstrsz2.so.1")
    data = _with_strsz(path, lambda offset: offset + len(b"libstrsz2.so.1\0"))
    assert read_soname_from_bytes(data) == SonameFound("libstrsz2.so.1")


def test_io_error_is_unreadable() -> None:
    """An OSError while reading gives SonameUnreadable."""

    class Broken(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def seek(self, offset: int, whence: int = 0) -> int:
            raise OSError(5, "Input/output error")

    result = read_soname(Broken())  # type: ignore[arg-type]
    assert isinstance(result, SonameUnreadable)
    assert "Input/output error" in result.reason


@settings(max_examples=300, deadline=None, database=None)
@given(data=st.binary(max_size=512))
def test_random_bytes_never_raise(data: bytes) -> None:
    """Arbitrary bytes give one of the three results."""
    assert isinstance(read_soname_from_bytes(data), RESULT_TYPES)


@settings(max_examples=300, deadline=None, database=None)
@given(data=st.binary(min_size=64, max_size=512))
def test_random_bytes_behind_an_elf_identification_never_raise(data: bytes) -> None:
    """Random headers after a valid identification give one of the three results."""
    for ident in (b"\x7fELF\x02\x01", b"\x7fELF\x01\x02"):
        assert isinstance(read_soname_from_bytes(ident + data[6:]), RESULT_TYPES)


@functools.cache
def _real_library() -> bytes:
    directory = Path(tempfile.mkdtemp())
    return elflibs.build_shared_library(directory, "libfuzz.so.1.0", "libfuzz.so.1").read_bytes()


@settings(
    max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    mutations=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=1 << 16), st.integers(min_value=0, max_value=255)
        ),
        min_size=1,
        max_size=8,
    ),
    focus_on_headers=st.booleans(),
)
def test_mutated_real_library_never_raises(
    mutations: list[tuple[int, int]], focus_on_headers: bool
) -> None:
    """Random byte mutations of a real gcc-built library give one of the three results."""
    data = bytearray(_real_library())
    for position, value in mutations:
        # Half the examples hit the first 1 KiB, where headers and PT_DYNAMIC usually are.
        index = position % (1024 if focus_on_headers else len(data))
        data[index] = value
    assert isinstance(read_soname_from_bytes(bytes(data)), RESULT_TYPES)


# --- the cold path reads almost nothing -----------------------------------------------------------


def test_cold_read_of_a_large_library_touches_only_headers_and_dynamic(libdir: Path) -> None:
    """An 8 MiB library costs a few KiB of reads, a handful of seeks, no section headers."""
    path = elflibs.build_shared_library(libdir, "libbig.so.1.0", "libbig.so.1", padding=8 << 20)
    data = path.read_bytes()
    stream = CountingStream(data)
    assert read_soname(stream) == SonameFound("libbig.so.1")  # type: ignore[arg-type]
    assert len(data) > 8 << 20
    assert stream.bytes_read < 8 * 1024
    assert stream.seeks <= 6
    start, end = elflibs.section_header_range(path)
    assert all(read_end <= start or read_start >= end for read_start, read_end in stream.reads)


def test_naive_section_reader_reads_the_section_headers(libdir: Path) -> None:
    """The contrast: pyelftools' section lookup reads the section header table."""
    path = elflibs.build_shared_library(libdir, "libbig2.so.1.0", "libbig2.so.1", padding=1 << 20)
    stream = CountingStream(path.read_bytes())
    ELFFile(stream).get_section_by_name(".dynamic")
    start, end = elflibs.section_header_range(path)
    assert any(read_start < end and read_end > start for read_start, read_end in stream.reads)


def _pyelftools_layout(definition: Any, little_endian: bool) -> tuple[tuple[str, ...], str]:
    """A pyelftools record's field names and ``struct`` format (nested records skipped)."""
    from elftools.construct.core import FormatField, Value

    names: list[str] = []
    formats: list[str] = []
    for field in definition.subcons:
        size = field.sizeof() if not isinstance(field, Value) else 0
        leaf = field if isinstance(field, FormatField) else getattr(field, "subcon", None)
        if isinstance(leaf, FormatField) and leaf.sizeof() == size:
            names.append(str(field.name))
            formats.append(str(leaf.packer.format)[-1])
        elif size:
            formats.append(f"{size}x")  # e_ident: read on its own
    return tuple(names), ("<" if little_endian else ">") + "".join(formats)


@pytest.mark.parametrize("little_endian", [True, False], ids=["le", "be"])
@pytest.mark.parametrize("elfclass", [32, 64])
def test_the_record_layouts_are_pyelftools_own(little_endian: bool, elfclass: int) -> None:
    """Our ELF header, program header and dynamic entry layouts are exactly pyelftools'
    ``ELFStructs`` definitions (names, widths, order, byte order) for every class and order."""
    from elftools.elf.structs import ELFStructs

    structs = ELFStructs(little_endian=little_endian, elfclass=elfclass)
    structs.create_basic_structs()
    structs.create_advanced_structs()
    ours = sonames._layouts(little_endian, elfclass)
    for record, theirs in (
        (ours.ehdr, structs.Elf_Ehdr),
        (ours.phdr, structs.Elf_Phdr),
        (ours.dyn, structs.Elf_Dyn),
    ):
        assert (record.names, record.packer.format) == _pyelftools_layout(theirs, little_endian)
        assert record.packer.size == theirs.sizeof()


def test_the_first_read_imports_no_pyelftools_nor_the_debugger(libdir: Path) -> None:
    """A fresh interpreter's first SONAME read loads neither pyelftools nor what its
    ``construct.debug`` drags in (pdb, bdb, cmd, code): ~15 ms of a cold injection."""
    library = elflibs.build_shared_library(libdir, "libcold.so.580.65.06", "libcold.so.1")
    code = (
        "import sys, pathlib\n"
        "from substrate_gpu.rootfs.sonames import open_for_reading, read_soname\n"
        f"with open_for_reading(pathlib.Path({str(library)!r})) as f:\n"
        "    print(read_soname(f))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'elftools', 'pdb', 'bdb', 'cmd', 'code', 'codeop'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    found, loaded = done.stdout.splitlines()
    assert found == "SonameFound(soname='libcold.so.1')"
    assert loaded == "[]"
