"""Benchmark: SONAME reads and link staging against pyelftools' naive reader and ldconfig.

Run: ``.venv/bin/python tests/bench/bench_sonames.py [--libraries 40] [--rounds 7] [--smoke]``.
Not collected by pytest. Builds ~40 real libraries with gcc (some padded to MiBs of .data),
then prints, side by side, the median over rounds of:

- our cold read (fresh cache: open, headers, PT_DYNAMIC, SONAME bytes) and warm read (stat);
- pyelftools' naive ``ELFFile(f).get_section_by_name('.dynamic')`` lookup;
- ``ldconfig -n`` on a copy of the directory (per directory, and divided per library),
  creating the links and again with the links in place;
- ``stage_soname_links`` into a fresh rootfs with a cold cache, and again with a warm cache;
- the first read in a fresh interpreter, against the same with pyelftools' ``ELFStructs``
  imported first (what the first read imported until issue 32: construct.debug, pdb, ...).

Creating a symlink or directory costs whatever the file system's metadata path costs
(~0.5 ms on a journalled ext4 in a VM), for ldconfig and for us alike; compare the rows
that create links with each other, and the rows that only read with each other.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for support.elflibs

from elftools.elf.elffile import ELFFile
from support import elflibs

from substrate_gpu.rootfs.sonames import SonameCache, open_for_reading, read_soname
from substrate_gpu.rootfs.staging import stage_soname_links

PADDINGS = (0, 64 << 10, 1 << 20, 4 << 20)


def _median_seconds(
    run: Callable[[], object], rounds: int, setup: Callable[[], object] | None = None
) -> float:
    times = []
    for _ in range(rounds):
        if setup is not None:
            setup()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _naive_soname(path: Path) -> str | None:
    with path.open("rb") as f:
        section = ELFFile(f).get_section_by_name(".dynamic")
        for tag in section.iter_tags() if section is not None else ():
            if tag.entry.d_tag == "DT_SONAME":
                return str(tag.soname)
    return None


def _ours_cold(libraries: list[Path]) -> None:
    for path in libraries:
        with open_for_reading(path) as stream:
            read_soname(stream)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--libraries", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, a few seconds, nothing judged (the test suite runs this)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.libraries, args.rounds = 4, 1
    count, rounds = args.libraries, args.rounds
    ldconfig = shutil.which("ldconfig") or shutil.which("ldconfig", path="/usr/sbin:/sbin")

    work = Path(tempfile.mkdtemp(prefix="bench-sonames-"))
    host = work / "lib64"
    host.mkdir()
    specs = [
        elflibs.LibrarySpec(
            f"libbench{i}.so.{i % 5 + 1}.{i}.0",
            f"libbench{i}.so.{i % 5 + 1}",
            symbol=f"bench_symbol_{i}",
            padding=PADDINGS[i % len(PADDINGS)],
        )
        for i in range(count)
    ]
    started = time.perf_counter()
    libraries = elflibs.build_shared_libraries(host, specs)
    build_s = time.perf_counter() - started
    total_bytes = sum(p.stat().st_size for p in libraries)

    # Sanity: every reader agrees before anything is timed.
    cache = SonameCache()
    for path in libraries:
        ours = cache.lookup(path)
        assert getattr(ours, "soname", None) == _naive_soname(path), path

    cold = _median_seconds(lambda: _ours_cold(libraries), rounds)
    cold_cache = _median_seconds(lambda: [SonameCache().lookup(p) for p in libraries], rounds)
    warm = _median_seconds(lambda: [cache.lookup(p) for p in libraries], rounds)
    naive = _median_seconds(lambda: [_naive_soname(p) for p in libraries], rounds)

    ld_dir = work / "ldconfig"
    ld_dir.mkdir()
    for path in libraries:
        shutil.copyfile(path, ld_dir / path.name)

    def clear_links() -> None:
        for entry in ld_dir.iterdir():
            if entry.is_symlink():
                entry.unlink()

    ld = (
        _median_seconds(
            lambda: subprocess.run([ldconfig, "-n", str(ld_dir)], check=True),
            rounds,
            setup=clear_links,
        )
        if ldconfig
        else float("nan")
    )

    ld_again = (
        _median_seconds(lambda: subprocess.run([ldconfig, "-n", str(ld_dir)], check=True), rounds)
        if ldconfig
        else float("nan")
    )

    pairs = [(p, f"/usr/lib/x86_64-linux-gnu/{p.name}") for p in libraries]
    rootfs_counter = iter(range(10**6))
    state: dict[str, Path] = {}

    def fresh_rootfs() -> None:
        state["root"] = work / f"rootfs{next(rootfs_counter)}"
        state["root"].mkdir()

    stage_cold = _median_seconds(
        lambda: stage_soname_links(state["root"], pairs, cache=SonameCache(), log=_Quiet()),
        rounds,
        setup=fresh_rootfs,
    )
    stage_warm_fresh = _median_seconds(
        lambda: stage_soname_links(state["root"], pairs, cache=cache, log=_Quiet()),
        rounds,
        setup=fresh_rootfs,
    )
    stage_again = _median_seconds(
        lambda: stage_soname_links(state["root"], pairs, cache=cache, log=_Quiet()), rounds
    )

    print(
        f"{count} libraries, {total_bytes / 2**20:.1f} MiB in all (largest {max(PADDINGS) >> 20} MiB), "
        f"built in {build_s:.1f} s; median of {rounds} rounds"
    )
    rows = [
        ("ours: cold read (open + headers + PT_DYNAMIC)", cold),
        ("ours: cold SonameCache.lookup (stat + open + read)", cold_cache),
        ("ours: warm SonameCache.lookup (stat only)", warm),
        ("pyelftools naive .dynamic section lookup", naive),
        ("ldconfig -n DIR: creating the links", ld),
        ("ldconfig -n DIR: links exist", ld_again),
        ("stage_soname_links: cold cache, fresh rootfs", stage_cold),
        ("stage_soname_links: warm cache, fresh rootfs", stage_warm_fresh),
        ("stage_soname_links: warm cache, links exist", stage_again),
    ]
    print(f"{'what':<52} {'per dir (ms)':>13} {'per lib (µs)':>13}")
    for label, seconds in rows:
        print(f"{label:<52} {seconds * 1e3:>13.3f} {seconds / count * 1e6:>13.1f}")
    ours_first, with_pyelftools = _first_read_in_a_fresh_interpreter(libraries[0], rounds)
    print(
        "first SONAME read in a fresh interpreter (the module's import + one read), median of "
        f"{max(3, rounds)} alternating: ours {ours_first * 1e3:.1f} ms; with pyelftools' "
        f"ELFStructs imported first, as the first read did before: {with_pyelftools * 1e3:.1f} ms"
    )
    shutil.rmtree(work)


def _first_read_in_a_fresh_interpreter(library: Path, rounds: int) -> tuple[float, float]:
    """Seconds (median) of a fresh interpreter's first read, without and with pyelftools'
    definitions imported first (which load construct.debug: pdb, bdb, cmd, code)."""

    def code(before: str) -> str:
        return (
            "import pathlib, time\n"
            "t = time.perf_counter()\n"
            f"{before}"
            "from substrate_gpu.rootfs.sonames import open_for_reading, read_soname\n"
            f"with open_for_reading(pathlib.Path({str(library)!r})) as f:\n"
            "    read_soname(f)\n"
            "print(time.perf_counter() - t)\n"
        )

    variants = (code(""), code("import elftools.elf.structs\n"))
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(max(3, rounds)):
        for variant, sink in zip(variants, times, strict=True):
            done = subprocess.run(
                [sys.executable, "-c", variant], capture_output=True, text=True, check=True
            )
            sink.append(float(done.stdout))
    return statistics.median(times[0]), statistics.median(times[1])


class _Quiet:
    """A logger that drops events, so logging cost does not blur the comparison."""

    def debug(self, event: str, /, **fields: object) -> None:
        """Drop."""

    def info(self, event: str, /, **fields: object) -> None:
        """Drop."""

    def warning(self, event: str, /, **fields: object) -> None:
        """Drop."""


if __name__ == "__main__":
    main()
