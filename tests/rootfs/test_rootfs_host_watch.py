"""HostWatch: a set of host files is vouched for until anything that could change them happens."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from substrate_gpu.rootfs import host_watch
from substrate_gpu.rootfs.host_watch import HostWatch


@pytest.fixture
def watch() -> Iterator[HostWatch]:
    """A private watch (not the process's shared one), closed after the test."""
    private = HostWatch()
    yield private
    private.close()


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    """Two files in lib/ and one in lib/sub/ of a fresh tree."""
    (tmp_path / "lib" / "sub").mkdir(parents=True)
    made = [tmp_path / "lib/a.so.1", tmp_path / "lib/b.so.1", tmp_path / "lib/sub/c.so.1"]
    for path in made:
        path.write_bytes(b"library " + path.name.encode())
    return made


def armed(watch: HostWatch, paths: list[Path]) -> int:
    token = watch.arm([str(p) for p in paths])
    assert token is not None
    assert watch.unchanged(token)
    return token


def test_untouched_files_stay_vouched_for(watch: HostWatch, files: list[Path]) -> None:
    """Reads and other names coming and going next to the files are no change."""
    token = armed(watch, files)
    files[0].read_bytes()
    (files[0].parent / "unrelated.so.1").write_bytes(b"x")
    (files[0].parent.parent / "bundle-17").mkdir()
    assert watch.unchanged(token)


def _rewrite(path: Path) -> None:
    with path.open("r+b") as f:
        f.write(b"L")


def _chmod(path: Path) -> None:
    path.chmod(0o600)


def _replace(path: Path) -> None:
    other = path.with_name("new.tmp")
    other.write_bytes(b"another library")
    other.replace(path)


def _remove(path: Path) -> None:
    path.unlink()


def _rename_parent(path: Path) -> None:
    # The file's own inode is untouched: only the watch on its grandparent sees this.
    directory = path.parent
    directory.rename(directory.with_name(directory.name + ".old"))
    directory.mkdir()
    path.write_bytes(b"library " + path.name.encode())


def _write_through_hard_link(path: Path) -> None:
    _rewrite(path.parent.parent.parent / "alias")  # made before arming: see the test


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_rewrite, id="written-in-place"),
        pytest.param(_chmod, id="chmod"),
        pytest.param(_replace, id="replaced-by-rename"),
        pytest.param(_remove, id="removed"),
        pytest.param(_rename_parent, id="directory-renamed-and-recreated"),
        pytest.param(_write_through_hard_link, id="written-through-a-hard-link-elsewhere"),
    ],
)
def test_a_change_to_a_watched_file_is_noticed(
    watch: HostWatch, files: list[Path], change: Callable[[Path], None]
) -> None:
    """Every way of changing what a stat or a read of the file returns voids the token."""
    os.link(files[2], files[2].parent.parent.parent / "alias")  # a name outside the watch
    token = armed(watch, files)
    change(files[2])
    assert not watch.unchanged(token)


def test_after_a_change_arming_again_vouches_again(watch: HostWatch, files: list[Path]) -> None:
    """A caller that re-reads after a change gets a fresh token that holds."""
    token = armed(watch, files)
    _replace(files[0])
    assert not watch.unchanged(token)
    fresh = armed(watch, files)
    assert watch.unchanged(fresh)


def test_a_mount_over_a_watched_directory_is_noticed(
    require_root: None, watch: HostWatch, files: list[Path]
) -> None:
    """A mount raises no inotify event; the mount table's poll reports it."""
    token = armed(watch, files)
    target = files[2].parent
    subprocess.run(["mount", "-t", "tmpfs", "hidden", str(target)], check=True)
    try:
        assert not watch.unchanged(token)
    finally:
        subprocess.run(["umount", str(target)], check=True)


def test_paths_through_a_symlink_are_refused(
    watch: HostWatch, files: list[Path], tmp_path: Path
) -> None:
    """A symlink's target would need watching too: the caller must stat such paths."""
    (tmp_path / "link").symlink_to(tmp_path / "lib")
    assert watch.arm([str(tmp_path / "link" / "a.so.1")]) is None
    (tmp_path / "file-link.so.1").symlink_to(files[0])
    assert watch.arm([str(tmp_path / "file-link.so.1")]) is None


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("lib/a.so.1", id="relative"),
        pytest.param("/x/../lib/a.so.1", id="not-normalised"),
        pytest.param("/no/such/dir/a.so.1", id="missing"),
    ],
)
def test_paths_that_cannot_be_watched_are_refused(watch: HostWatch, path: str) -> None:
    """Only absolute, normalised, existing paths are vouched for."""
    assert watch.arm([path]) is None


def test_remote_file_systems_are_refused(
    watch: HostWatch, files: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system not known to pass every change through this kernel is not trusted."""
    monkeypatch.setattr(host_watch, "LOCAL_FILE_SYSTEMS", frozenset())
    assert watch.arm([str(files[0])]) is None


def test_without_inotify_nothing_is_vouched_for(
    watch: HostWatch, files: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No libc inotify (or no kernel support): arm refuses, for good."""

    def no_libc() -> None:
        raise AttributeError("inotify_init1")

    monkeypatch.setattr(host_watch, "_Libc", no_libc)
    assert watch.arm([str(files[0])]) is None
    assert watch.arm([str(files[0])]) is None


def test_a_dropped_watch_gives_its_inotify_instance_back(files: list[Path]) -> None:
    """Instances are few (128 per user, node-wide): a watch nobody holds closes its own."""
    dropped = HostWatch()
    armed(dropped, files)
    fd = dropped._fd
    assert os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    del dropped
    try:
        left = os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:
        left = None  # closed, and not reused yet
    assert left != "anon_inode:inotify"


def test_a_closed_watch_voids_its_tokens(watch: HostWatch, files: list[Path]) -> None:
    """After close, no earlier token holds (the watches are gone)."""
    token = armed(watch, files)
    watch.close()
    assert not watch.unchanged(token)


def test_tokens_of_one_watch_never_hold_for_another(files: list[Path]) -> None:
    """Generations are process-wide: a token means nothing to a watch that did not issue it."""
    first, second = HostWatch(), HostWatch()
    token = armed(first, files)
    assert not second.unchanged(token)
    first.close()


def test_a_forked_child_gets_its_own_shared_watch() -> None:
    """The child must not read (steal) the parent's events."""
    parent = host_watch.shared()
    pid = os.fork()
    if pid == 0:  # pragma: no cover  (the child)
        os._exit(0 if host_watch.shared() is not parent else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_forked_child_never_reads_the_parents_events(watch: HostWatch, files: list[Path]) -> None:
    """A watch inherited by a child vouches for nothing there and leaves the parent's queue
    alone: the parent still sees a change the child looked at."""
    token = armed(watch, files)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover  (the child)
        _rewrite(files[0])
        os.write(write, b"1" if not watch.unchanged(token) else b"0")
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not watch.unchanged(token)
