"""SonameCache: one stat per known library version, a fresh read when the file changes."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pytest
from support import elflibs

from substrate_gpu.rootfs.sonames import (
    SonameCache,
    SonameFound,
    SonameUnreadable,
    open_for_reading,
)


class CountingOpener:
    """An opener that counts how often the cache opens a file."""

    def __init__(self) -> None:
        self.opened: list[Path] = []

    def __call__(self, path: Path) -> BinaryIO:
        self.opened.append(path)
        return open_for_reading(path)


@pytest.fixture
def opener() -> CountingOpener:
    """A counting opener."""
    return CountingOpener()


@pytest.fixture
def library(tmp_path: Path) -> Path:
    """A real library with SONAME libcached.so.1."""
    return elflibs.build_shared_library(tmp_path, "libcached.so.1.0", "libcached.so.1")


def test_second_lookup_only_stats(library: Path, opener: CountingOpener) -> None:
    """The second lookup of an unchanged file is answered without opening it."""
    cache = SonameCache(opener=opener)
    first = cache.lookup(library)
    second = cache.lookup(library)
    assert first == second == SonameFound("libcached.so.1")
    assert opener.opened == [library]
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)


def test_changed_mtime_invalidates(library: Path, opener: CountingOpener) -> None:
    """A new modification time makes the next lookup read the file again."""
    cache = SonameCache(opener=opener)
    cache.lookup(library)
    info = library.stat()
    os.utime(library, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))
    cache.lookup(library)
    assert len(opener.opened) == 2


def test_changed_size_invalidates(library: Path, opener: CountingOpener) -> None:
    """A grown file is read again."""
    cache = SonameCache(opener=opener)
    cache.lookup(library)
    with library.open("ab") as f:
        f.write(b"\0" * 16)
    cache.lookup(library)
    assert len(opener.opened) == 2


def test_replaced_file_gives_the_new_soname(tmp_path: Path, library: Path) -> None:
    """A file replaced by another library (new inode) reports the new SONAME."""
    cache = SonameCache()
    cache.lookup(library)
    other = elflibs.build_shared_library(tmp_path, "other.so.2.0", "libother.so.2")
    other.replace(library)
    assert cache.lookup(library) == SonameFound("libother.so.2")


def test_least_recently_used_entry_is_evicted(tmp_path: Path, opener: CountingOpener) -> None:
    """With room for two entries, the oldest of three is read again."""
    paths = [
        elflibs.build_shared_library(tmp_path, f"lib{i}.so.1.0", "libcached.so.1") for i in "abc"
    ]
    cache = SonameCache(maxsize=2, opener=opener)
    for path in paths:
        cache.lookup(path)
    cache.lookup(paths[2])
    cache.lookup(paths[0])
    assert opener.opened == [*paths, paths[0]]
    assert cache.stats.size == 2


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        pytest.param(lambda p: p.mkdir(), "not a regular file", id="directory"),
        pytest.param(os.mkfifo, "not a regular file", id="fifo"),
        pytest.param(
            lambda p: p.symlink_to(p.parent / "missing"), "cannot stat", id="dangling-symlink"
        ),
        pytest.param(lambda p: None, "cannot stat", id="missing"),
    ],
)
def test_non_files_are_unreadable_without_opening(
    tmp_path: Path, opener: CountingOpener, make: Callable[[Path], object], reason: str
) -> None:
    """Directories, FIFOs and missing paths are unreadable and never opened (no blocking)."""
    path = tmp_path / "libthing.so.1"
    make(path)
    result = SonameCache(opener=opener).lookup(path)
    assert isinstance(result, SonameUnreadable)
    assert reason in result.reason
    assert opener.opened == []


def test_open_failure_is_unreadable_and_not_cached(library: Path) -> None:
    """EACCES on open is reported, and the next lookup tries again."""
    calls: list[Path] = []

    def denied(path: Path) -> BinaryIO:
        calls.append(path)
        raise PermissionError(13, "Permission denied")

    cache = SonameCache(opener=denied)
    result = cache.lookup(library)
    cache.lookup(library)
    assert isinstance(result, SonameUnreadable)
    assert "Permission denied" in result.reason
    assert len(calls) == 2
    assert cache.stats.size == 0


def test_corrupt_file_result_is_cached(tmp_path: Path, opener: CountingOpener) -> None:
    """A corrupt file's verdict depends only on its content, so it is cached like any other."""
    path = tmp_path / "libjunk.so.1"
    path.write_bytes(b"\x7fELF" + b"\xff" * 60)
    cache = SonameCache(opener=opener)
    assert isinstance(cache.lookup(path), SonameUnreadable)
    cache.lookup(path)
    assert len(opener.opened) == 1


def test_maxsize_must_be_positive() -> None:
    """A cache that can hold nothing is a configuration error."""
    with pytest.raises(ValueError):
        SonameCache(maxsize=0)


def test_concurrent_lookups_agree(tmp_path: Path) -> None:
    """Eight threads looking up the same libraries all get the right SONAMEs."""
    paths = [
        elflibs.build_shared_library(tmp_path, f"libt{i}.so.1.0", f"libt{i % 3}.so.1")
        for i in range(12)
    ]
    cache = SonameCache(maxsize=8)
    failures: list[str] = []

    def worker() -> None:
        for _ in range(20):
            for i, path in enumerate(paths):
                if cache.lookup(path) != SonameFound(f"libt{i % 3}.so.1"):
                    failures.append(str(path))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert cache.stats.size <= 8


def test_lookup_many_answers_like_lookup_with_one_stat_per_known_file(
    library: Path, opener: CountingOpener, tmp_path: Path
) -> None:
    """Misses are read once; a second batch is all hits; a changed file is read again."""
    (tmp_path / "b").mkdir()
    other = elflibs.build_shared_library(tmp_path / "b", "libother.so.2.0", "libother.so.2")
    missing_file = tmp_path / "absent.so.1"
    cache = SonameCache(opener=opener)
    first = cache.lookup_many([library, other, missing_file])
    assert first[:2] == [SonameFound("libcached.so.1"), SonameFound("libother.so.2")]
    assert isinstance(first[2], SonameUnreadable)
    assert cache.lookup_many([library, other]) == first[:2]
    assert (cache.stats.hits, cache.stats.misses, opener.opened) == (2, 2, [library, other])
    info = other.stat()
    os.utime(other, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))
    assert cache.lookup_many([library, other]) == first[:2]
    assert opener.opened == [library, other, other]


class CountingStat:
    """Counts the stat calls made while it is installed in place of ``os.stat``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = os.stat

        def counting(*args: object, **kwargs: object) -> os.stat_result:
            self.calls += 1
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "stat", counting)


@pytest.fixture
def batch(tmp_path: Path) -> list[Path]:
    """Two real libraries in a driver-like directory."""
    (tmp_path / "lib64").mkdir()
    return [
        elflibs.build_shared_library(tmp_path / "lib64", "liba.so.1.0", "liba.so.1"),
        elflibs.build_shared_library(tmp_path / "lib64", "libb.so.1.0", "libb.so.1"),
    ]


def test_every_batch_is_stat_ed_once_a_library(
    batch: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch seen before costs one stat per library, and no read."""
    cache = SonameCache()
    first = cache.lookup_many(batch)
    cache.lookup_many(batch)
    stats = CountingStat(monkeypatch)
    assert cache.lookup_many(batch) == first == [SonameFound("liba.so.1"), SonameFound("libb.so.1")]
    assert (stats.calls, cache.stats.hits, cache.stats.misses) == (2, 4, 2)


def _replace(path: Path) -> None:
    elflibs.build_shared_library(path.parent, "new.so.1.0", "libz.so.1").replace(path)


def _swap_directory(path: Path) -> None:
    directory = path.parent
    directory.rename(directory.with_name("lib64.old"))
    directory.mkdir()
    elflibs.build_shared_library(directory, "liba.so.1.0", "liba.so.1")
    elflibs.build_shared_library(directory, path.name, "libz.so.1")


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_replace, id="replaced"),
        pytest.param(_swap_directory, id="directory-swapped"),
    ],
)
def test_a_library_changed_under_a_known_batch_is_read_again(
    batch: list[Path], change: Callable[[Path], None]
) -> None:
    """A library replaced or moved away after its batch was read gives its new SONAME."""
    cache = SonameCache()
    cache.lookup_many(batch)
    cache.lookup_many(batch)
    change(batch[1])
    assert cache.lookup_many(batch) == [SonameFound("liba.so.1"), SonameFound("libz.so.1")]


def test_a_removed_library_under_a_known_batch_is_noticed(batch: list[Path]) -> None:
    """A library deleted after its batch was read becomes unreadable."""
    cache = SonameCache()
    cache.lookup_many(batch)
    cache.lookup_many(batch)
    batch[1].unlink()
    result = cache.lookup_many(batch)[1]
    assert isinstance(result, SonameUnreadable)
    assert "cannot stat" in result.reason


def test_a_passing_failure_in_a_batch_is_retried(batch: list[Path]) -> None:
    """An open that failed is not remembered: the next batch reads the library."""
    failures = [PermissionError(13, "Permission denied")] * 2

    def flaky(path: Path) -> BinaryIO:
        if path == batch[0] and failures:
            raise failures.pop()
        return open_for_reading(path)

    cache = SonameCache(opener=flaky)
    assert isinstance(cache.lookup_many(batch)[0], SonameUnreadable)
    assert isinstance(cache.lookup_many(batch)[0], SonameUnreadable)
    assert cache.lookup_many(batch)[0] == SonameFound("liba.so.1")
