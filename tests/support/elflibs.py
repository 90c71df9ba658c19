"""Real ELF files for tests: shared libraries built with gcc, and hand-made ELF images.

gcc runs once per distinct library (keyed by SONAME, symbol, padding and class) per process;
later requests copy the built file, so suites stay fast on small machines. Builds of many
libraries run in parallel (:func:`build_shared_libraries`).

:func:`synthetic_elf` writes a minimal ELF image by hand (ELF header, a PT_LOAD and a
PT_DYNAMIC segment, a string table, no section headers) for the flavours gcc here cannot
produce: big-endian, or 32-bit where no 32-bit toolchain is installed.
"""

from __future__ import annotations

import functools
import shutil
import struct
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from support.real import missing

_lock = threading.Lock()
_built: dict[tuple[object, ...], Path] = {}


@dataclass(frozen=True)
class LibrarySpec:
    """One shared library to build."""

    filename: str
    soname: str | None
    symbol: str = "substrate_test_symbol"
    padding: int = 0
    """Bytes of initialised data (``.data``) to add, to make a large file."""
    elfclass: int = 64


def gcc_path() -> str:
    """gcc on PATH, or skip the test."""
    path = shutil.which("gcc")
    if path is None:
        missing("gcc")
    return path


@functools.cache
def _work_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="substrate-gpu-elflibs-"))


@functools.cache
def supports_m32() -> bool:
    """Whether gcc can build a 32-bit shared object here (without a 32-bit libc)."""
    if shutil.which("gcc") is None:
        return False
    source = _work_dir() / "m32-probe.c"
    source.write_text("int substrate_probe(void) { return 1; }\n")
    result = subprocess.run(
        [
            "gcc",
            "-m32",
            "-nostdlib",
            "-shared",
            "-fPIC",
            "-o",
            str(source.with_suffix(".so")),
            str(source),
        ],
        capture_output=True,
        check=False,
    )
    return result.returncode == 0


def _compile(spec: LibrarySpec) -> Path:
    key = (spec.soname, spec.symbol, spec.padding, spec.elfclass)
    with _lock:
        if key in _built:
            return _built[key]
    gcc = gcc_path()
    if spec.elfclass == 32 and not supports_m32():
        missing("gcc -m32", "cannot build 32-bit objects here")
    work = Path(tempfile.mkdtemp(dir=_work_dir()))
    source = work / "lib.c"
    code = f"int {spec.symbol}(void) {{ return 42; }}\n"
    if spec.padding:
        code += f"char {spec.symbol}_padding[{spec.padding}] = {{1}};\n"
    source.write_text(code)
    output = work / "lib.so"
    argv = [gcc, "-shared", "-fPIC", "-O0", "-o", str(output), str(source)]
    if spec.soname is not None:
        argv.append(f"-Wl,-soname,{spec.soname}")
    if spec.elfclass == 32:
        argv[1:1] = ["-m32", "-nostdlib"]
    subprocess.run(argv, check=True, capture_output=True)
    with _lock:
        return _built.setdefault(key, output)


def build_shared_library(
    directory: Path,
    filename: str,
    soname: str | None,
    *,
    symbol: str = "substrate_test_symbol",
    padding: int = 0,
    elfclass: int = 64,
) -> Path:
    """Build (or reuse) a real shared library and copy it to ``directory/filename``.

    ``soname=None`` links without ``-soname`` (no ``DT_SONAME``). ``elfclass=32`` skips the
    calling test when gcc cannot build 32-bit code here.
    """
    built = _compile(LibrarySpec(filename, soname, symbol, padding, elfclass))
    destination = directory / filename
    shutil.copyfile(built, destination)
    return destination


def build_shared_libraries(directory: Path, specs: Sequence[LibrarySpec]) -> list[Path]:
    """Build many libraries into ``directory``, compiling the missing ones in parallel."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(_compile, specs))
    return [
        build_shared_library(
            directory, s.filename, s.soname, symbol=s.symbol, padding=s.padding, elfclass=s.elfclass
        )
        for s in specs
    ]


def _build_from_source(directory: Path, filename: str, source: str, flags: Sequence[str]) -> Path:
    gcc = gcc_path()
    work = Path(tempfile.mkdtemp(dir=_work_dir()))
    (work / "src.c").write_text(source)
    output = directory / filename
    subprocess.run(
        [gcc, *flags, "-o", str(output), str(work / "src.c")], check=True, capture_output=True
    )
    return output


def build_object_file(directory: Path, filename: str) -> Path:
    """A relocatable object file (``gcc -c``): ELF, but no program headers."""
    return _build_from_source(
        directory, filename, "int substrate_obj(void) { return 1; }\n", ["-c", "-fPIC"]
    )


def build_static_executable(directory: Path, filename: str) -> Path:
    """A static executable without libc: ELF with program headers but no PT_DYNAMIC."""
    source = "void _start(void) { for (;;) {} }\n"
    return _build_from_source(directory, filename, source, ["-static", "-nostdlib", "-no-pie"])


def build_executable(directory: Path, filename: str) -> Path:
    """A dynamically linked executable: a PT_DYNAMIC segment without DT_SONAME."""
    return _build_from_source(directory, filename, "int main(void) { return 0; }\n", [])


def readelf_soname(path: Path) -> str | None:
    """The SONAME ``readelf -d`` reports (binutils: the reference reader), or ``None``."""
    readelf = shutil.which("readelf")
    if readelf is None:
        missing("readelf")
    output = subprocess.run(
        [readelf, "-d", "-W", str(path)], capture_output=True, text=True, check=False
    ).stdout
    for line in output.splitlines():
        if "(SONAME)" in line:
            return line.split("Library soname: [", 1)[1].rsplit("]", 1)[0]
    return None


def section_header_range(path: Path) -> tuple[int, int]:
    """Byte range ``[start, end)`` of the section header table of an ELF file."""
    data = path.read_bytes()[:64]
    little = data[5] == 1
    order = "<" if little else ">"
    if data[4] == 2:
        shoff = struct.unpack_from(order + "Q", data, 0x28)[0]
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A)
    else:
        shoff = struct.unpack_from(order + "I", data, 0x20)[0]
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x2E)
    return shoff, shoff + shentsize * shnum


def synthetic_elf(
    soname: bytes | None,
    *,
    little_endian: bool = True,
    elfclass: int = 64,
    base: int = 0x10000,
    strtab_address: int | None = None,
) -> bytes:
    """A minimal ELF shared object, by hand: header, PT_LOAD + PT_DYNAMIC, dynamic strings.

    No section headers at all (the loader never needs them). ``soname=None`` omits
    ``DT_SONAME``. Big-endian images use EM_PPC64/EM_PPC, little-endian EM_X86_64/EM_386.
    ``strtab_address`` overrides ``DT_STRTAB`` (to make it point outside every segment).
    """
    order = "<" if little_endian else ">"
    wide = elfclass == 64
    ehsize, phentsize, dynsize = (64, 56, 16) if wide else (52, 32, 8)
    machine = (62 if wide else 3) if little_endian else (21 if wide else 20)
    strtab = b"\0" + (soname + b"\0" if soname is not None else b"")
    phoff = ehsize
    dynoff = phoff + 2 * phentsize
    tags = [(5, base + 0), (10, len(strtab))]  # DT_STRTAB (patched below), DT_STRSZ
    if soname is not None:
        tags.append((14, 1))  # DT_SONAME: offset 1 in the string table
    tags.append((0, 0))  # DT_NULL
    stroff = dynoff + dynsize * len(tags)
    tags[0] = (5, base + stroff if strtab_address is None else strtab_address)
    total = stroff + len(strtab)

    ident = b"\x7fELF" + bytes([2 if wide else 1, 1 if little_endian else 2, 1, 0]) + bytes(8)
    if wide:
        header = ident + struct.pack(
            order + "HHIQQQIHHHHHH", 3, machine, 1, 0, phoff, 0, 0, ehsize, phentsize, 2, 64, 0, 0
        )
        load = struct.pack(order + "IIQQQQQQ", 1, 5, 0, base, base, total, total, 0x1000)
        dyn = struct.pack(
            order + "IIQQQQQQ",
            2,
            6,
            dynoff,
            base + dynoff,
            base + dynoff,
            dynsize * len(tags),
            dynsize * len(tags),
            8,
        )
        entries = b"".join(struct.pack(order + "qQ", tag, value) for tag, value in tags)
    else:
        header = ident + struct.pack(
            order + "HHIIIIIHHHHHH", 3, machine, 1, 0, phoff, 0, 0, ehsize, phentsize, 2, 40, 0, 0
        )
        load = struct.pack(order + "IIIIIIII", 1, 0, base, base, total, total, 5, 0x1000)
        dyn = struct.pack(
            order + "IIIIIIII",
            2,
            dynoff,
            base + dynoff,
            base + dynoff,
            dynsize * len(tags),
            dynsize * len(tags),
            6,
            4,
        )
        entries = b"".join(struct.pack(order + "iI", tag, value) for tag, value in tags)
    image = header + load + dyn + entries + strtab
    assert len(image) == total
    return image
